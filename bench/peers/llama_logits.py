#!/usr/bin/env python3
"""How far llama.cpp's own logits on a GGUF file are from the model the file
defines, beside WASTE's (issue 35 item 5).

For every GGUF fixture (tests/fixtures/gguf/models*.json: llama.cpp's
converter and quantisers on tiny models), three sets of logits at every
position of the fixture's prompt:

  * the reference: transformers run on gguf-py's dequantisation of the file
    (the fixture's reference_logits, made by tests/gen_gguf_fixtures.py);
  * WASTE: `waste eval FILE --tokens ... --logits OUT --all-positions`, the
    file run in place, with an f32 KV cache (`--kv-type f32`: the file's model
    as exactly as f32 allows) and with the default bf16 one;
  * llama.cpp: llama_logits.cpp against the pinned sdist's libllama (the
    tree `peer_bench.py` builds), with its default f16 KV cache and with an
    f32 one.

Each is reported as max |logit - reference| / max |reference| over the
positions, and the positions whose top-1 differs from the reference's.
With --peer FILE.gguf, also the greedy continuations of both engines on a
fixed prompt, and how many tokens they agree for.

    python3 bench/peers/llama_logits.py --llama /var/tmp/waste-peers/llama.cpp-0.3.36 \\
        --waste target/release/waste [--peer /work/m/qwen3moe-12l-16e.gguf] --out report.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "tests" / "fixtures" / "gguf"


def build(llama: Path, out: Path) -> Path:
    """llama_logits.cpp linked against the built libllama."""
    lib = llama / "build" / "bin"
    exe = out / "llama-logits"
    subprocess.run(
        ["g++", "-O2", "-std=c++17", str(Path(__file__).with_name("llama_logits.cpp")), "-o", str(exe),
         f"-I{llama / 'include'}", f"-I{llama / 'ggml' / 'include'}", f"-L{lib}", "-lllama", "-lggml",
         "-lggml-base", f"-Wl,-rpath,{lib}"],
        check=True,
    )
    return exe


def f32(path: Path, rows: int) -> np.ndarray:
    return np.fromfile(path, dtype="<f4").reshape(rows, -1)


def llama_logits(exe: Path, model: Path, ids, tmp: Path, kv_f32=False, greedy=0):
    out = tmp / "llama.f32"
    args = [str(exe), str(model), str(out)] + (["--kv-f32"] if kv_f32 else [])
    args += ["--greedy", str(greedy)] if greedy else []
    r = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-logits {model.name}: {r.stderr.strip().splitlines()[-1:]}")
    tokens = [int(t) for t in r.stdout.split()] if greedy else []
    return f32(out, len(ids)), tokens


def waste_logits(waste: Path, model: Path, ids, tmp: Path, kv_type: str = "bf16") -> np.ndarray:
    out = tmp / "waste.f32"
    subprocess.run(
        [str(waste), "eval", str(model), "--tokens", ",".join(map(str, ids)), "--logits", str(out),
         "--all-positions", "--kv-type", kv_type],
        check=True, capture_output=True,
    )
    return f32(out, len(ids))


def waste_greedy(waste: Path, model: Path, ids, n: int):
    """WASTE's greedy continuation, one `waste eval` per token."""
    ids, tokens = list(ids), []
    for _ in range(n):
        r = subprocess.run([str(waste), "eval", str(model), "--tokens", ",".join(map(str, ids)), "--json"],
                           check=True, capture_output=True, text=True)
        top = json.loads(r.stdout)["top"][0]["id"]
        tokens.append(top)
        ids.append(top)
    return tokens


def distance(ours: np.ndarray, ref: np.ndarray):
    worst = max(float(np.abs(o - r).max() / np.abs(r).max()) for o, r in zip(ours, ref))
    flips = [p for p in range(len(ref)) if int(ours[p].argmax()) != int(ref[p].argmax())]
    return worst, flips


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", type=Path, required=True, help="llama.cpp source tree with build/bin/libllama")
    ap.add_argument("--waste", type=Path, required=True)
    ap.add_argument("--peer", type=Path, help="a larger GGUF file for the greedy comparison")
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    report = {"fixtures": [], "peer": None}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        exe = build(args.llama, tmp)
        for listing in ["models.json", "models_iq.json"]:
            for m in json.loads((GGUF / listing).read_text())["models"]:
                model = GGUF / m["file"]
                ids = m["prompt_ids"]
                ref = f32(GGUF / m["reference_logits"], len(ids))
                row = {"file": m["file"]}
                for key, kv in [("waste", "f32"), ("waste_kv_bf16", "bf16")]:
                    row[key], row[key + "_flips"] = distance(waste_logits(args.waste, model, ids, tmp, kv), ref)
                for key, kv in [("llama", False), ("llama_kv_f32", True)]:
                    try:
                        logits, _ = llama_logits(exe, model, ids, tmp, kv_f32=kv)
                        row[key], row[key + "_flips"] = distance(logits, ref)
                    except RuntimeError as e:
                        row[key] = str(e)
                report["fixtures"].append(row)
                print(json.dumps(row), flush=True)
        if args.peer:
            rng = np.random.default_rng(7)
            ids = [int(i) for i in rng.integers(1000, 100000, 64)]
            ours = waste_logits(args.waste, args.peer, ids, tmp)
            theirs, llama_tokens = llama_logits(exe, args.peer, ids, tmp, greedy=args.greedy)
            waste_tokens = waste_greedy(args.waste, args.peer, ids, args.greedy)
            agree = next((i for i, (a, b) in enumerate(zip(waste_tokens, llama_tokens)) if a != b), args.greedy)
            worst, flips = distance(ours, theirs)
            report["peer"] = {"file": str(args.peer), "prompt_tokens": len(ids),
                              "waste_vs_llama": worst, "top1_differs_at": flips,
                              "greedy_agree": agree, "waste_greedy": waste_tokens, "llama_greedy": llama_tokens}
            print(json.dumps(report["peer"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
