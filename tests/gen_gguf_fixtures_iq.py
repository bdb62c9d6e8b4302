"""tests/fixtures/gguf/models/wide-qwen3moe-<type>.gguf: the files a user downloads, made the way
they are made. The wide model of models.json (WIDE_CONFIG at its recorded seed) is converted to
f32 by llama.cpp's convert_hf_to_gguf.py, given an importance matrix by llama-imatrix on a
calibration text (this repository's README.md), and quantised by llama-quantize to each type
below (the IQ types, and Q2_K, whose file also holds Q3_K matrices). Each file gets the logits of
transformers run on the weights `gguf.quants.dequantize` gives for it (the exact model the file
defines), and a line in models_iq.json.

Run: python3 tests/gen_gguf_fixtures_iq.py [--sdist SDIST] [--bin DIR] [--types T,...]
  --bin: where llama-quantize and llama-imatrix of the same sdist are built
  (cmake --build build --target llama-quantize llama-imatrix in bench/peers' llama.cpp tree).
  --types: make only these file types (e.g. Q2_K), keeping the other entries of models_iq.json
  as they are (each entry records the importance matrix it was made with).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_gguf_fixtures_models as gm  # noqa: E402
import gen_gguf_fixtures_quant as gq  # noqa: E402
from gguf import GGUFReader  # noqa: E402

ROOT = gm.ROOT
OUT = ROOT / "tests" / "fixtures" / "gguf"
# (llama-quantize's file type, the type it gives the gate/up experts): every IQ type in a file
# as llama-quantize makes it. The 1- and 2-bit types need the importance matrix; all take it.
TYPES = [("IQ1_S", "IQ1_S"), ("IQ1_M", "IQ1_M"), ("IQ2_XXS", "IQ2_XXS"), ("IQ2_XS", "IQ2_XS"),
         ("IQ2_M", "IQ2_S"), ("IQ3_XXS", "IQ3_XXS"), ("IQ3_S", "IQ3_S"), ("IQ4_XS", "IQ4_XS"),
         ("IQ4_NL", "IQ4_NL"), ("Q2_K", "Q2_K")]
CTX = 128


def run(cmd: list, cwd: Path | None = None) -> str:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed:\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=Path.home() / ".cache/waste-peers/llama_cpp_python-0.3.36.tar.gz")
    ap.add_argument("--bin", type=Path, default=Path.home() / ".cache/waste-peers/llama.cpp-0.3.36/build/bin")
    ap.add_argument("--types", help="comma-separated file types to make (default: all)")
    args = ap.parse_args()
    wanted = [t for t, _ in TYPES] if args.types is None else args.types.split(",")
    unknown = set(wanted) - {t for t, _ in TYPES}
    if unknown:
        raise SystemExit(f"--types: not made here: {sorted(unknown)}")
    models = json.loads((OUT / "models.json").read_text())
    wide = next(m for m in models["models"] if m["file"].endswith("wide-qwen3moe-q4_k_m.gguf"))
    prompt = wide["prompt_ids"]
    entries = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        llama_dir = gm.extract_sdist(args.sdist, tmp)
        info = gm.sdist_info(args.sdist, llama_dir)
        f32, convert_cmd = gm.wide_f32(wide["seed"], tmp, llama_dir)
        imatrix = tmp / "imatrix.gguf"
        calib = ROOT / "README.md"
        run([args.bin / "llama-imatrix", "-m", f32, "-f", calib, "-o", imatrix, "-c", CTX, "-t", 2,
             "--no-ppl"])
        for ty, experts in TYPES:
            if ty not in wanted:
                continue
            out = OUT / "models" / f"wide-qwen3moe-{ty.lower()}.gguf"
            run([args.bin / "llama-quantize", "--imatrix", imatrix, f32, out, ty, 2])
            r, G = gm.read_gguf(out)
            types = {t.name: t.tensor_type.name for t in r.tensors}
            assert types["blk.0.ffn_gate_exps.weight"] == experts, (ty, types)
            hf, rows = gm.gguf_to_hf("qwen3moe", G, gm.WIDE_CONFIG)
            res = gm.hf_logits(gm.WIDE_CONFIG, hf, prompt, tmp, ty)
            lp = out.with_suffix(".logits.f32")
            lp.write_bytes(res["logits"].astype("<f4").tobytes())
            rel = lambda p: str(p.relative_to(OUT))  # noqa: E731
            entry = gm.describe_model(out, rel)
            entry.update(
                source="the wide model of models.json (seed %d)" % wide["seed"], arch="qwen3moe",
                hf_config=gm.WIDE_CONFIG, converter=info,
                commands=[" ".join(convert_cmd),
                          f"llama-imatrix -m <out>/wide-f32.gguf -f README.md -o <out>/imatrix.gguf -c {CTX} "
                          "-t 2 --no-ppl",
                          f"llama-quantize --imatrix <out>/imatrix.gguf <out>/wide-f32.gguf {rel(out)} {ty} 2"],
                imatrix_sha256=hashlib.sha256(imatrix.read_bytes()).hexdigest(),
                calibration_sha256=hashlib.sha256(calib.read_bytes()).hexdigest(),
                tensor_types=types, gguf_to_hf=rows, prompt_ids=prompt, greedy_ids=res["greedy"],
                min_router_gap=res["min_router_gap"], min_top1_gap=res["min_top1_gap"],
                reference_logits=rel(lp), logits_shape=[len(prompt), 512],
                reference_logits_note="transformers Qwen3MoeForCausalLM (hf_config; f32, eager, 1 thread) "
                                      "on the dequantised weights of this file")
            print(ty, "router gap", res["min_router_gap"], "top-1 gap", res["min_top1_gap"],
                  sorted(set(types.values())))
            entries.append(entry)
    # Entries of the types not made keep their place; new ones go last.
    old = json.loads((OUT / "models_iq.json").read_text())["models"] if args.types else []
    made = {e["file"]: e for e in entries}
    kept = [made.pop(e["file"], e) for e in old]
    doc = dict(generator="tests/gen_gguf_fixtures_iq.py", converter=info,
               versions=models["versions"], models=kept + list(made.values()))
    (OUT / "models_iq.json").write_text(gq.dump_json(doc))


if __name__ == "__main__":
    main()
