"""convert_survey.json: convert_hf_to_gguf.py (f32) on every tests/fixtures/tiny-* checkpoint,
for tests/gen_gguf_fixtures.py. Nothing but the JSON is kept.

For each family: whether the conversion ran (with the wrapper's patches: --pre gpt-2, the
qwen3moe dense-FFN tensors, GLM's vocab via the gpt2 path), the metadata keys it wrote (arrays
summarised), every tensor (name, type, ne), and the HF -> GGUF mapping, found from the data: each
HF tensor is located in the GGUF by its values (random weights have unique floats), then the
arrangement is identified among a fixed list of transforms (copy, reshape, transpose, stack of
experts, llama's rope permute, gpt-oss's interleaved gate/up split, DeepSeek's kv_b split, ...).
Rows are then folded over layer and expert indices ({L}, {E}).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as GQ
from gguf import GGUFReader

from gen_gguf_fixtures_models import FIX, convert, kv_summary, llama_permute, load_hf_dir


def _transforms(x: np.ndarray, g: np.ndarray, cfg: dict):
    """Yield (label, predicate) pairs; the first true one describes g in terms of x."""
    tc = cfg.get("text_config", cfg)
    nh, nkv = tc.get("num_attention_heads"), tc.get("num_key_value_heads")
    yield "copy", lambda: g.shape == x.shape and np.array_equal(g, x)
    yield "reshape", lambda: g.size == x.size and np.array_equal(g.ravel(), x.ravel())
    yield "x + 1", lambda: g.shape == x.shape and np.array_equal(g, (x + np.float32(1)).astype(np.float32))
    yield "-exp(x)", lambda: g.size == x.size and np.allclose(g.ravel(), -np.exp(x.ravel()), rtol=1e-6, atol=0)
    if x.ndim >= 2:
        yield "transpose(-1,-2)", lambda: g.shape == x.swapaxes(-1, -2).shape and np.array_equal(g, x.swapaxes(-1, -2))
    for hh, lab in ((nh, "rope permute (n_head)"), (nkv, "rope permute (n_head_kv)")):
        if hh and x.ndim >= 1 and x.shape[0] % (2 * hh) == 0:
            yield lab, lambda hh=hh: g.shape == x.shape and np.array_equal(g, llama_permute(x, hh))
    if g.ndim == 3:
        for e in range(g.shape[0]):
            yield f"stack[{e}]", lambda e=e: g[e].shape == x.shape and np.array_equal(g[e], x)
    if x.ndim == 3:   # gpt-oss gate_up_proj [E, H, 2I] (input-major, gate/up interleaved)
        xt = x.swapaxes(-1, -2)
        yield "transpose(-1,-2)[:, 0::2, :] (interleaved gate)", lambda: g.shape == xt[:, ::2].shape and np.array_equal(g, xt[:, ::2])
        yield "transpose(-1,-2)[:, 1::2, :] (interleaved up)", lambda: g.shape == xt[:, 1::2].shape and np.array_equal(g, xt[:, 1::2])
    if x.ndim == 3 and x.shape[1] % 2 == 0:   # fused [E, 2I, H]: gate rows first, then up
        h = x.shape[1] // 2
        yield "[:, :I, :] (first half of the fused rows: gate)", lambda: g.shape == x[:, :h].shape and np.array_equal(g, x[:, :h])
        yield "[:, I:, :] (second half of the fused rows: up)", lambda: g.shape == x[:, h:].shape and np.array_equal(g, x[:, h:])
    if x.ndim == 2:
        yield "[..., 0::2] (interleaved gate bias)", lambda: g.shape == x[..., ::2].shape and np.array_equal(g, x[..., ::2])
        yield "[..., 1::2] (interleaved up bias)", lambda: g.shape == x[..., 1::2].shape and np.array_equal(g, x[..., 1::2])
    nope, vd = tc.get("qk_nope_head_dim"), tc.get("v_head_dim")
    if nope and vd and x.ndim == 2 and x.shape[0] % (nope + vd) == 0:
        H = x.shape[0] // (nope + vd)
        kv = x.reshape(H, nope + vd, x.shape[1])
        yield (f"kv_b split: view(n_head_kv={H}, {nope}+{vd}, kv_lora)[:, :{nope}].transpose(1, 2) (k_b)",
               lambda: g.shape == kv[:, :nope].swapaxes(1, 2).shape and np.array_equal(g, kv[:, :nope].swapaxes(1, 2)))
        yield (f"kv_b split: view(n_head_kv={H}, {nope}+{vd}, kv_lora)[:, {nope}:] (v_b)",
               lambda: g.shape == kv[:, nope:].shape and np.array_equal(g, kv[:, nope:]))


def _fold(s: str) -> str:
    s = re.sub(r"(layers|blk)\.\d+\.", r"\1.{L}.", s)
    s = re.sub(r"experts\.\d+\.", "experts.{E}.", s)
    return re.sub(r"stack\[\d+\]", "stack[{E}]", s)


def map_family(hf: dict[str, np.ndarray], G: dict[str, np.ndarray], cfg: dict) -> list[dict]:
    index: dict[int, set[str]] = defaultdict(set)
    for n, a in G.items():
        if a.dtype.kind == "f":
            for v in np.unique(a.astype(np.float32).view(np.uint32)):
                index[int(v)].add(n)
    NOT_ID = "values found, arrangement not identified"
    rows = []
    for k, x in hf.items():
        if x.dtype.kind != "f":
            rows.append(dict(hf=k, gguf=None, transform=f"not float ({x.dtype}); not matched"))
            continue
        x = x.astype(np.float32)
        probe = [int(v) for v in np.unique(x.view(np.uint32)) if v not in (0, 0x80000000, 0x3F800000)]
        probe = sorted(probe, key=lambda v: len(index.get(v, ())))[:24]  # rarest values first
        hits = Counter(n for v in probe for n in index.get(v, ()))
        by_value = [n for n, c in hits.most_common() if c >= max(1, len(probe) // 2)]
        def size_ok(g):
            return g.dtype.kind == "f" and (g.size in (x.size, 2 * x.size, x.size // 2) or
                                            (g.ndim == 3 and g[0].size == x.size))
        by_size = [n for n, g in G.items() if n not in by_value and size_ok(g)]
        def how(n):
            g = G[n].astype(np.float32)
            lab = next((lab for lab, pred in _transforms(x, g, cfg) if _safe(pred)), None)
            if lab is None and g.ndim == 3:
                for e in range(g.shape[0]):
                    lab = next((f"stack[{e}] of {l2}" for l2, pred in _transforms(x, g[e], cfg)
                                if l2 != "copy" and _safe(pred)), None)
                    if lab:
                        break
            return lab
        found = [(n, lab) for n in by_value if (lab := how(n))]     # every GGUF tensor holding x's values
        if not found:
            found = next(([(n, lab)] for n in by_size if (lab := how(n))), [])
        if not found and by_value:
            found = [(by_value[0], NOT_ID)]
        if not found:
            found = [(None, "values not found in the GGUF (dropped or transformed)")]
        rows += [dict(hf=k, gguf=n, transform=lab) for n, lab in found]
    folded, seen = [], set()
    for r in rows:
        for pre in ("model.visual.", "vision_tower."):        # vision towers: one row
            if r["hf"].startswith(pre) and r["gguf"] is None:
                r = dict(r, hf=pre + "*")
        key = (_fold(r["hf"]), _fold(r["gguf"]) if r["gguf"] else None, _fold(r["transform"]))
        if key not in seen:
            seen.add(key)
            folded.append(dict(hf=key[0], gguf=key[1], transform=key[2]))
    return folded


def _safe(pred) -> bool:
    try:
        return bool(pred())
    except Exception:  # noqa: BLE001
        return False


def survey(llama_dir: Path, tmp: Path, info: dict) -> dict:
    fams = []
    for src in sorted(FIX.glob("tiny-*")):
        if not (src / "config.json").exists():
            continue
        out = tmp / f"survey-{src.name}.gguf"
        patches = ["--pre", "gpt-2", "--qwen3moe-dense-ffn", "--glm-vocab-as-gpt2"]
        ok, last, cmd = convert(llama_dir, src, "f32", out, patches)
        cfg = json.loads((src / "config.json").read_text())
        e = dict(fixture=f"tests/fixtures/{src.name}", hf_architecture=(cfg.get("architectures") or [None])[0],
                 command=" ".join(cmd), ok=ok)
        if not ok:
            e["error"] = last
            fams.append(e)
            continue
        r = GGUFReader(str(out))
        G = {}
        for t in r.tensors:
            a = np.asarray(t.data)
            if t.tensor_type not in (GQ.F32, GQ.I8, GQ.I16, GQ.I32, GQ.I64, GQ.F64):
                a = gguf.quants.dequantize(a, t.tensor_type)   # F16, MXFP4 (gpt-oss release experts)
            G[t.name] = a.reshape(list(reversed([int(x) for x in t.shape])))
        e["gguf_architecture"] = str(r.fields["general.architecture"].contents())
        kv = kv_summary(r)
        # the tokenizer keys are the same for every fixture (one tokenizer): listed in full in models.json
        e["kv"] = [f'{x["key"]}: {x["type"]}' + (f'[{x["sub_type"]}] x {x["len"]} {x["head"]}' if x["type"] == "ARRAY"
                   else f' = {x["value"]!r}') for x in kv if not x["key"].startswith("tokenizer.")]
        e["tokenizer_keys"] = [f'{x["key"]}: {x["type"]}' + (f'[{x["sub_type"]}] x {x["len"]}' if x["type"] == "ARRAY"
                               else f' = {x["value"]!r}'[:60]) for x in kv if x["key"].startswith("tokenizer.")]
        e["tensors"] = sorted({(_fold(t.name), t.tensor_type.name, tuple(int(x) for x in t.shape))
                               for t in r.tensors})
        e["tensors"] = [f"{n} {ty} {list(ne)}" for n, ty, ne in e["tensors"]]
        hf = load_hf_dir(src)
        if (src / "dequantized.safetensors").exists():   # transformers' own MXFP4 dequantisation
            from safetensors.numpy import load_file
            hf.update({f"dequantized.safetensors:{k}": v for k, v in load_file(str(src / "dequantized.safetensors")).items()})
        e["hf_to_gguf"] = [f'{r["hf"]} -> {r["gguf"]} : {r["transform"]}' for r in map_family(hf, G, cfg)]
        out.unlink()
        fams.append(e)
    return dict(generator="tests/gen_gguf_fixtures.py (gen_gguf_fixtures_survey.py)", converter=info,
                note="f32 conversions, not kept; kv: 'key: TYPE = value'; tensors: 'name TYPE ne'; hf_to_gguf: "
                     "'HF name -> GGUF name : transform'; tensors and mapping rows folded over layers {L} and experts {E} "
                     "(every distinct (name, type, ne) is listed); transforms: how the GGUF tensor (numpy order) is computed "
                     "from the HF tensor x, checked by exact equality",
                families=fams)
