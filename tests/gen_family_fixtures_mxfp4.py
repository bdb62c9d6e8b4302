"""tiny-gpt_oss-mxfp4: tests/fixtures/tiny-gpt_oss stored as openai/gpt-oss-20b is released.

Used by tests/gen_family_fixtures.py (run that; this module has no entry point of its own).

Layout written (the gpt-oss-20b release's names, dtypes and shapes, scaled down):
  * routed experts: `model.layers.L.mlp.experts.gate_up_proj_blocks` uint8 [E, 2I, H/32, 16],
    `gate_up_proj_scales` uint8 [E, 2I, H/32], `down_proj_blocks` uint8 [E, H, I/32, 16],
    `down_proj_scales` uint8 [E, H, I/32]: row r of the blocks is output feature r (gate_up rows
    interleaved: even r = gate unit r/2, odd r = up unit r/2); each row holds its input features in
    groups of 32, 16 bytes a group, low nibble = even element, high nibble = odd element, E2M1 code
    -> FP4_VALUES; scale byte s multiplies the group by 2^(s - 127);
  * every other tensor (embeddings, LM head, norms, attention weights / biases / sinks, router weight /
    bias, expert biases `gate_up_proj_bias` [E, 2I], `down_proj_bias` [E, H]) in bf16;
  * config.json = tiny-gpt_oss's plus the release's `quantization_config`
    {"quant_method": "mxfp4", "modules_to_not_convert": [...]}.

The weights are tiny-gpt_oss's, requantised: experts with the OCP MX rule of tests/gen_mxfp4_fixtures.py
(shared exponent floor(log2(amax)) - 2 per 32 values, E2M1 round-to-nearest), the rest rounded to bf16.
The reference is GptOssForCausalLM.from_pretrained(this directory, dtype=float32,
quantization_config=Mxfp4Config(dequantize=True)) on CPU: transformers' own Mxfp4Dequantize ->
integrations.mxfp4.convert_moe_packed_tensors (f32, exact: every value is an FP4 value times a power of
two) turns the blocks into the f32 gate_up_proj / down_proj it then runs; the bf16 tensors are upcast.
reference.json records, per layer, sha256 / sum / sum of squares of those dequantised f32 tensors and a
slice; dequantized.safetensors holds layer 0's two dequantised tensors in transformers' in-memory layout.
"""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GptOssForCausalLM, Mxfp4Config
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

import gen_family_fixtures as gff
from gen_mxfp4_fixtures import mxfp4_quantize  # the OCP MX quantiser shared with the other MXFP4 fixtures

MODULES_TO_NOT_CONVERT = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def quantize_experts(w_in_major):
    """[E, in, out] (x @ W) -> blocks [E, out, in/32, 16], scales [E, out, in/32] (release layout)."""
    blocks, scales = [], []
    for e in range(w_in_major.shape[0]):
        wt = w_in_major[e].t().contiguous().float()  # [out, in]
        packed, scale = mxfp4_quantize(wt)            # [out, in/2], [out, in/32]
        blocks.append(packed.reshape(wt.shape[0], -1, 16))
        scales.append(scale)
    return torch.stack(blocks).contiguous(), torch.stack(scales).contiguous()


def numpy_decode(blocks, scales):
    """Independent decode of the release layout -> [E, in, out] f32 (what GptOssExperts multiplies by)."""
    b = blocks.numpy().astype(np.int64)
    s = scales.numpy().astype(np.int64) - 127
    lut = np.array(FP4_VALUES, dtype=np.float64)
    E, rows, G, _ = b.shape
    out = np.empty((E, rows, G, 32))
    out[..., 0::2] = lut[b & 15]
    out[..., 1::2] = lut[b >> 4]
    out = out * np.exp2(s)[..., None]
    return torch.from_numpy(out.reshape(E, rows, G * 32).transpose(0, 2, 1).astype(np.float32).copy())


def release_tensors(model):
    stored = {}
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            blocks, scales = quantize_experts(t)
            stored[name + "_blocks"], stored[name + "_scales"] = blocks, scales
        else:
            stored[name] = t.detach().to(torch.bfloat16)
    return stored


def write_release_dir(model, src_dir, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    gff.save_tensors(out_dir / "model.safetensors", release_tensors(model))
    cfg = json.loads((src_dir / "config.json").read_text()) if (src_dir / "config.json").exists() else \
        model.config.to_dict()
    cfg["dtype"] = "bfloat16"
    cfg["quantization_config"] = {"modules_to_not_convert": MODULES_TO_NOT_CONVERT, "quant_method": "mxfp4"}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_release(out_dir):
    return GptOssForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager",
                                             quantization_config=Mxfp4Config(dequantize=True)).eval()


def mxfp4_acceptable(model, pids, spec):
    """Seed acceptance for gpt_oss also requires the requantised model to keep both gaps > 1e-4."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        qdir = Path(tmp) / "q"
        write_release_dir(model, Path(tmp), qdir)
        r = gff.evaluate(load_release(qdir), pids, spec)
    return gff.acceptable(r), {"mxfp4_min_router_gap": r["min_router_gap"], "mxfp4_min_top1_gap": r["min_top1_gap"]}


@torch.no_grad()
def make_mxfp4_fixture(model, src_dir, src_ref, tok):
    spec = gff.GPT_OSS
    out_dir = gff.FIXTURES / "tiny-gpt_oss-mxfp4"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    write_release_dir(model, src_dir, out_dir)
    shutil.copy(src_dir / "generation_config.json", out_dir / "generation_config.json")
    gff.write_common_files(out_dir)
    stored = load_file(str(out_dir / "model.safetensors"))

    qmodel = load_release(out_dir)
    pids = src_ref["prompt_ids"]
    r = gff.evaluate(qmodel, pids, spec)
    assert gff.acceptable(r), r["gaps"]
    (out_dir / "reference_logits.f32").write_bytes(r["prompt_logits"].contiguous().numpy().astype("<f4").tobytes())

    # The dequantised experts transformers runs == its converter on the stored bytes == our own decode;
    # every other parameter == the stored bf16 tensor upcast.
    deq, dequant_summary = {}, {}
    sd = qmodel.state_dict()
    for name in sorted(stored):
        if name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            blocks, scales = stored[name], stored[base + "_scales"]
            ours = numpy_decode(blocks, scales)
            theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            assert torch.equal(sd[base], theirs) and torch.equal(sd[base], ours), base
            L = int(base.split(".")[2])
            if L == 0:
                deq[base] = sd[base].contiguous()
            t64 = sd[base].double()
            dequant_summary[base] = {
                "shape_in_memory": list(sd[base].shape), "sha256_f32_le": gff.sha256_f32(sd[base]),
                "sum": t64.sum().item(), "sum_of_squares": (t64 * t64).sum().item(),
                "expert0_out_feature0_first8": [float(x) for x in sd[base][0, :8, 0]],
                "expert0_out_feature1_first8": [float(x) for x in sd[base][0, :8, 1]],
            }
        elif not name.endswith("_scales"):
            assert torch.equal(sd[name], stored[name].float()), name
    gff.save_tensors(out_dir / "dequantized.safetensors", deq)

    # Bit-exact decode check data: the requantised model's own greedy decode, step logits vs full forward.
    ref = {
        "family": "gpt_oss",
        "architecture": "GptOssForCausalLM",
        "versions": gff.versions(),
        "seed": src_ref["seed"],
        "generator": "tests/gen_family_fixtures.py (gen_family_fixtures_mxfp4.py)",
        "source": "tests/fixtures/tiny-gpt_oss requantised: experts MXFP4 (OCP MX rule, tests/gen_mxfp4_fixtures.py "
                  "mxfp4_quantize), every other tensor bf16, as openai/gpt-oss-20b ships",
        "reference_model": "GptOssForCausalLM.from_pretrained(dir, dtype=float32, attn_implementation='eager', "
                           "experts_implementation='eager', quantization_config=Mxfp4Config(dequantize=True)) on CPU: "
                           "integrations.mxfp4.Mxfp4Dequantize -> convert_moe_packed_tensors(blocks, scales, float32)",
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "dtype": "float32 compute; weights as stored (bf16 upcast exactly, MXFP4 decoded exactly)",
        "prompt_text": src_ref["prompt_text"],
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [r["T"], gff.VOCAB_SIZE],
        "greedy_ids": r["greedy"],
        "greedy_text": tok.decode(r["greedy"]),
        "greedy_max_new_tokens": gff.MAX_NEW_TOKENS,
        "greedy_note": src_ref["greedy_note"],
        "min_router_gap": r["min_router_gap"],
        "min_router_gap_note": spec["gap_note"],
        "min_top1_gap": r["min_top1_gap"],
        "gap_threshold": gff.GAP_MIN,
        "decode_vs_full_forward_max_abs_logit_diff": r["decode_vs_full_max_abs"],
        "max_abs_logit_diff_vs_tiny_gpt_oss": (r["prompt_logits"] - torch.from_numpy(np.fromfile(
            src_dir / "reference_logits.f32", dtype="<f4").reshape(r["T"], -1))).abs().max().item(),
        "dequantized_experts": dequant_summary,
        "dequantized_experts_note": "per tensor, the f32 tensor transformers multiplies by, in its in-memory layout "
                                    "[E, in, out] (gate_up_proj [8, 64, 64] with interleaved gate/up columns, "
                                    "down_proj [8, 32, 64]): sha256 of its little-endian f32 bytes (C order), sum "
                                    "and sum of squares in f64, and a slice: [expert 0, inputs 0..7, output 0 / 1]. "
                                    "dequantized.safetensors holds layer 0's two tensors in full. Decode check: "
                                    "three independent decoders agree exactly (transformers' load, "
                                    "convert_moe_packed_tensors called directly, this script's numpy decode)",
        "mxfp4_layout": {
            "gate_up_proj_blocks": "uint8 [E=8, 2I=64, H/32=2, 16]; row r = output feature r (r even: gate unit "
                                   "r/2, r odd: up unit r/2); byte j of group g holds input features g*32+2j (low "
                                   "nibble) and g*32+2j+1 (high nibble)",
            "gate_up_proj_scales": "uint8 [8, 64, 2]: E8M0, value = FP4_VALUES[code] * 2^(scale - 127)",
            "down_proj_blocks": "uint8 [8, H=64, I/32=1, 16]; row r = output (hidden) feature r",
            "down_proj_scales": "uint8 [8, 64, 1]",
            "FP4_VALUES": FP4_VALUES,
        },
        "config": json.loads((out_dir / "config.json").read_text()),
        "safetensors_files": ["model.safetensors"],
        "tensors": gff.tensor_listing(out_dir),
    }
    from gen_family_fixtures_numpy import numpy_check, transformers_f64_check  # noqa: E402
    ref["independent_numpy_f64_max_abs_logit_diff"] = numpy_check(out_dir, ref)
    ref["transformers_modeling_in_f64_vs_numpy_f64_max_abs_logit_diff"] = transformers_f64_check(out_dir, ref)
    (out_dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"[gpt_oss-mxfp4] wrote {out_dir} ({size / 1e6:.2f} MB); gaps {r['min_router_gap']:.2e} / "
          f"{r['min_top1_gap']:.2e}; vs f32 fixture {ref['max_abs_logit_diff_vs_tiny_gpt_oss']:.2e}; numpy f64 "
          f"{ref['independent_numpy_f64_max_abs_logit_diff']:.1e}")
