#!/usr/bin/env python3
"""Groups a `perf record --call-graph dwarf` profile of `waste bench` into
where decode time goes (docs/PERFORMANCE.md, "End-to-end decode, all experts
cached").

Usage: perf script -i perf.data -F tid,ip,sym,srcline | python3 host/runtime/benches/perf_groups.py

(with inlined frames and source lines: a mixer inlined into its caller is
only recognisable by its file, kda.rs or mla.rs.)

Each sample's stack (leaf first) is put in one group:

- open: anything under `Model::open` / `Model::load` (reading the trunk at
  start-up), reported apart and left out of the decode percentages;
- experts: routed-expert work (`forward_experts`, `expert_forward`, the RVQ
  table build and gathers);
- LM head: anything under `Model::head_row`;
- trunk matvec: a q4/q8/f32 matrix-vector kernel (`dot_q4`, `dot_q8`,
  `MatRef::matvec`, `QMatrix::matvec`, `row_into`) under a model frame, split
  by that frame: KDA projections (`Kda::forward` or a kda.rs line), MLA
  projections (mla.rs), MLP (`Mlp::forward`, or a matvec `forward_tokens`
  makes itself: the shared expert and the dense layer 0), router. A kernel
  whose caller was lost (a row chunk stolen by another pool thread starts its
  stack in rayon) is put by its kernel: `dot_q8` is the LM head (the only q8
  matrix a q4-trunk container multiplies; the q8 embedding is read one row at
  a time), `dot_q4` "trunk matvec, caller lost";
- KDA: the rest under `Kda::forward` (short conv, gates, delta rule, norms);
- MLA: the rest under `Mla::forward` (absorbed scores, softmax, values);
- router: `Router::route` and top-k;
- other: everything else on the decode path (norms, residuals, embedding
  row, allocator, kernel).
"""

import collections
import sys

MATVEC = ("dot_q4", "dot_q8", "dot_f32", "MatRef::matvec", "QMatrix::matvec", "par_rows", "row_into")
EXPERT = ("forward_experts", "expert_forward", "rvq_rows", "build_tables", "matvec_tables", "RvqRef", "rvq4p")


def learn_mixer_lines(stacks):
    """Maps each source line of `mixer_step` that calls a mixer to KDA or
    MLA, learnt from the samples whose kda.rs / mla.rs frame survived, so a
    sample that lost that frame (the mixer inlined, its frame not unwound) is
    still put by the call site."""
    lines = {}
    for stack in stacks:
        for (f, src), (g, gsrc) in zip(stack, stack[1:]):
            if "mixer_step" in g and gsrc:
                if "Kda::forward" in f or src.startswith("kda.rs"):
                    lines.setdefault(gsrc, "KDA")
                elif "Mla::forward" in f or src.startswith("mla.rs"):
                    lines.setdefault(gsrc, "MLA")
    return lines


MIXER_LINES = {}


def group(stack):
    """`stack`: (symbol, source line) pairs, leaf first."""
    if not stack:
        return "other"
    frames = [f for f, _ in stack]
    if any("Model::open" in f or "Model::load" in f or "open_with_progress" in f for f in frames):
        return "open"
    if any("head_row" in f for f in frames):
        return "LM head"
    if any(any(e in f for e in EXPERT) for f in frames):
        return "experts"
    leaf_matvec = any(m in frames[0] for m in MATVEC) or any(
        any(m in f for m in MATVEC) for f in frames[:3]
    )
    owner = None
    for f, src in stack:
        if "Kda::forward" in f or src.startswith("kda.rs"):
            owner = "KDA"
            break
        if "Mla::forward" in f or src.startswith("mla.rs"):
            owner = "MLA"
            break
        if "Mlp::forward" in f:
            owner = "MLP"
            break
        if "Router::" in f or "top_k" in f:
            owner = "router"
            break
        if "mixer_step" in f:
            owner = MIXER_LINES.get(src)
            break
        if "forward_tokens" in f:
            owner = "MLP" if leaf_matvec else None
            break
    if leaf_matvec:
        if owner in ("KDA", "MLA"):
            return f"trunk matvec: {owner} projections"
        if owner == "MLP":
            return "trunk matvec: shared expert + dense MLP"
        if owner == "router":
            return "router"
        if any("dot_q8" in f for f in frames[:3]):
            return "LM head"
        return "trunk matvec, caller lost"
    if owner == "KDA":
        return "KDA (conv, gates, delta rule, norms)"
    if owner == "MLA":
        return "MLA attention (scores, softmax, values)"
    if owner == "router":
        return "router"
    if owner == "MLP":
        return "trunk matvec: shared expert + dense MLP"
    return "other"


def read_stacks(lines):
    """Yields each sample's [(symbol, source line)], leaf first."""
    stack = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if stack:
                yield stack
            stack = []
        elif line.startswith("\t"):
            parts = line.strip().split(None, 1)
            stack.append([parts[1] if len(parts) > 1 else "?", ""])
        elif line.startswith("  ") and stack:
            stack[-1][1] = line.strip()
    if stack:
        yield stack


def main():
    counts = collections.Counter()
    leaves = collections.defaultdict(collections.Counter)
    stacks = list(read_stacks(sys.stdin))
    MIXER_LINES.update(learn_mixer_lines(stacks))
    print(f"mixer call sites: {MIXER_LINES}")
    for stack in stacks:
        g = group(stack)
        counts[g] += 1
        leaves[g][stack[0][0]] += 1
    total = sum(counts.values())
    decode = total - counts.get("open", 0)
    print(f"samples: {total}, open (start-up, excluded): {counts.get('open', 0)}, decode: {decode}")
    for g, n in counts.most_common():
        if g == "open":
            continue
        top = ", ".join(f"{s.split('::')[-1][:40]} {c}" for s, c in leaves[g].most_common(3))
        print(f"{100.0 * n / max(decode, 1):6.1f}%  {n:6d}  {g:45s} [{top}]")


if __name__ == "__main__":
    main()
