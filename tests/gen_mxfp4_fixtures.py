#!/usr/bin/env python3
"""Generate tests/fixtures/tiny-deepseek_v3-mxfp4: the tiny DeepSeek-V3 fixture stored the way
large releases ship (Kimi K3: MXFP4 routed experts; DeepSeek-V3: fp8 block-scaled trunk), plus
the f32 tensors transformers' own dequantisation code computes from it, and the logits
transformers computes on those dequantised weights.

Layout written (what `waste convert` accepts; host/engine/src/checkpoint/decode.rs):
  * routed experts `...experts.N.{gate,up,down}_proj.weight_packed` uint8 [rows, cols/2] (two
    E2M1 codes a byte, low nibble = even column) + `.weight_scale` uint8 [rows, cols/32] (E8M0,
    2^(s-127)): the compressed-tensors `mxfp4-pack-quantized` naming that K3.md section 5 lists;
  * attention projections and shared experts: fp8 e4m3 (`float8_e4m3fn`) with a float32
    `weight_scale_inv` [ceil(rows/16), ceil(cols/16)] (DeepSeek-V3 layout; the fixture uses
    16x16 blocks, named in `quantization_config.weight_block_size`, so its small matrices have
    several blocks and partial edge blocks; releases use 128x128);
  * embedding, LM head and the dense MLPs: bf16; norms, routers and biases: f32.
Four shards with an index (layer-ordered, the last holding layer 3's upper experts and the
LM head), so reclaim has something to do.

References, all from transformers 5.24 (CPU, f32):
  * MXFP4 -> f32: `integrations.finegrained_fp8.Fp8Dequantize._dequantize_one` (uint8 E8M0
    scales, [1, 32] blocks) and `integrations.mxfp4._convert_moe_packed_tensors` (GPT-OSS blocks
    layout, fed the same bytes reshaped to [1, rows, G, 16]); the two must agree exactly;
  * fp8 -> f32: `integrations.finegrained_fp8._dequantize_fp8_weight(w, s, [16, 16], float32)`;
  * logits: DeepseekV3ForCausalLM (eager, f32) loaded from the dequantised tensors, on the
    prompt of tests/fixtures/tiny-deepseek_v3/reference.json.

A second, smaller fixture, tests/fixtures/tiny-kimi_k3-mxfp4, is the K3 fixture
(tests/fixtures/tiny-kimi_k3, `language_model.` prefix, latent MoE) with the routed experts'
w1/w3 in MXFP4 and every other matrix but the routers in bf16; w2 stays f32 because its input
width (moe_intermediate_size 24) is not a multiple of the 32-value MXFP4 group (the released
K3 has 3072). It has `dequantized.safetensors` (same names, f32, from the same transformers
code) and no logits: the engine's K3 forward is checked on tiny-kimi_k3 itself.

Run by hand (never by CI): python3 tests/gen_mxfp4_fixtures.py   (CPU, ~10 s, deterministic)

`--big DIR [GB]` instead writes a synthetic release of about GB gigabytes (default 1) in the
same layout, random codes, no references, for measuring the converter's peak memory and
throughput (docs/PERFORMANCE.md): hidden 2048, 64 experts of width 768, as many MoE layers as
the size asks for, one layer per shard.
Writes: tests/fixtures/tiny-deepseek_v3-mxfp4/{config.json, generation_config.json,
tokenizer.json, tokenizer_config.json, model-0000K-of-00004.safetensors,
model.safetensors.index.json, dequantized.safetensors, reference_logits.f32, reference.json}.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3ForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight
from transformers.integrations.mxfp4 import FP4_VALUES, _convert_moe_packed_tensors

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

HERE = Path(__file__).resolve().parent
SRC = HERE / "fixtures" / "tiny-deepseek_v3"
OUT = HERE / "fixtures" / "tiny-deepseek_v3-mxfp4"
BLOCK = [16, 16]
GROUP = 32


def mxfp4_quantize(w):
    """OCP MX rule: shared exponent floor(log2(amax)) - 2 per 32 values, E2M1 round-to-nearest."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // GROUP, GROUP).double()
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-38))) - 2, torch.full_like(amax, -127))
    e = e.clamp(-127, 127)
    v = (g / torch.pow(2.0, e)[..., None]).clamp(-6, 6)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float64)
    idx = (v.abs()[..., None] - mags).abs().argmin(-1)
    codes = (idx + 8 * (v < 0)).to(torch.uint8).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    scale = (e + 127).to(torch.uint8).contiguous()
    return packed, scale


def mxfp4_reference(packed, scale):
    rows, half = packed.shape
    a = Fp8Dequantize(None)._dequantize_one(packed.view(torch.int8), scale, output_dtype=torch.float32)
    g = scale.shape[1]
    b = _convert_moe_packed_tensors(packed.reshape(1, rows, g, 16), scale.reshape(1, rows, g), dtype=torch.float32)
    b = b[0].transpose(0, 1).contiguous()
    assert torch.equal(a, b), "the two transformers MXFP4 decoders disagree"
    return a


def fp8_quantize(w):
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK[0]), -(-cols // BLOCK[1])
    scale = torch.zeros(br, bc, dtype=torch.float32)
    q = torch.zeros(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK[0]:(i + 1) * BLOCK[0], j * BLOCK[1]:(j + 1) * BLOCK[1]]
            s = max(blk.abs().max().item() / 448.0, 1e-12)
            scale[i, j] = s
            q[i * BLOCK[0]:(i + 1) * BLOCK[0], j * BLOCK[1]:(j + 1) * BLOCK[1]] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def main():
    src = load_file(str(SRC / "model.safetensors"))
    stored, deq = {}, {}
    kinds = {"mxfp4": 0, "fp8": 0, "bf16": 0, "f32": 0}
    for name in sorted(src):
        w = src[name].float()
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if ".experts." in name and base:
            packed, scale = mxfp4_quantize(w)
            stored[base + ".weight_packed"], stored[base + ".weight_scale"] = packed, scale
            deq[name] = mxfp4_reference(packed, scale)
            kinds["mxfp4"] += 1
        elif base and w.dim() == 2 and (".self_attn." in name or ".shared_experts." in name):
            q, s = fp8_quantize(w)
            stored[name], stored[name + "_scale_inv"] = q, s
            deq[name] = _dequantize_fp8_weight(q, s, BLOCK, torch.float32)
            kinds["fp8"] += 1
        elif w.dim() == 2 and not name.endswith("mlp.gate.weight"):
            stored[name] = w.to(torch.bfloat16)
            deq[name] = stored[name].float()
            kinds["bf16"] += 1
        else:
            stored[name], deq[name] = w, w
            kinds["f32"] += 1

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(SRC / f, OUT / f)
    cfg = json.loads((SRC / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": BLOCK}
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    def shard_of(name):
        if name.startswith("model.layers."):
            layer = int(name.split(".")[2])
            if layer < 2:
                return 1
            if layer == 2:
                return 2
            if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) >= 8:
                return 4
            return 3
        return 1 if name.startswith("model.embed_tokens") else 4

    weight_map, shards = {}, {1: {}, 2: {}, 3: {}, 4: {}}
    for name, t in stored.items():
        shards[shard_of(name)][name] = t
    for k, tensors in shards.items():
        fname = f"model-{k:05d}-of-00004.safetensors"
        save_file(tensors, str(OUT / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    (OUT / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    save_file(deq, str(OUT / "dequantized.safetensors"))

    ref = json.loads((SRC / "reference.json").read_text())
    ids = torch.tensor([ref["prompt_ids"]])
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(SRC / "config.json", Path(tmp) / "config.json")
        save_file(deq, str(Path(tmp) / "model.safetensors"))
        model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
        for n, p in model.state_dict().items():  # transformers fuses the experts; the rest is 1:1
            assert n not in deq or torch.equal(p, deq[n]), n
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float().contiguous()
    (OUT / "reference_logits.f32").write_bytes(logits.numpy().astype("<f4").tobytes(order="C"))
    (OUT / "reference.json").write_text(json.dumps({
        "source": "tests/fixtures/tiny-deepseek_v3 requantised by tests/gen_mxfp4_fixtures.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "kinds": kinds, "fp8_block": BLOCK, "prompt_ids": ref["prompt_ids"],
        "logits_file": "reference_logits.f32", "logits_shape": list(logits.shape),
        "max_abs_logit": logits.abs().max().item(),
    }, indent=2) + "\n")
    print("wrote", OUT, kinds)


def k3():
    src_dir = HERE / "fixtures" / "tiny-kimi_k3"
    out = HERE / "fixtures" / "tiny-kimi_k3-mxfp4"
    src = load_file(str(src_dir / "model.safetensors"))
    stored, deq = {}, {}
    kinds = {"mxfp4": 0, "bf16": 0, "f32": 0}
    for name in sorted(src):
        w = src[name].float()
        if ".experts." in name and (".w1." in name or ".w3." in name):
            base = name[: -len(".weight")]
            packed, scale = mxfp4_quantize(w)
            stored[base + ".weight_packed"], stored[base + ".weight_scale"] = packed, scale
            deq[name] = mxfp4_reference(packed, scale)
            kinds["mxfp4"] += 1
        elif w.dim() == 2 and ".experts." not in name and not name.endswith(".gate.weight") and "res_proj" not in name:
            stored[name] = w.to(torch.bfloat16)
            deq[name] = stored[name].float()
            kinds["bf16"] += 1
        else:
            stored[name], deq[name] = src[name], src[name]
            kinds["f32"] += 1
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(src_dir / f, out / f)
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(deq, str(out / "dequantized.safetensors"))
    (out / "reference.json").write_text(json.dumps({
        "source": "tests/fixtures/tiny-kimi_k3 requantised by tests/gen_mxfp4_fixtures.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "kinds": kinds,
    }, indent=2) + "\n")
    print("wrote", out, kinds)


def big(out, gigabytes):
    """A synthetic release: MXFP4 experts with random codes and scales near 2^-7, bf16 trunk."""
    import sys
    h, inter, experts = 2048, 768, 64
    per_layer = experts * 3 * h * inter * 17 // 32  # packed + scale bytes
    moe_layers = max(1, int(gigabytes * 1e9 / per_layer))
    cfg = json.loads((SRC / "config.json").read_text())
    cfg.update(hidden_size=h, moe_intermediate_size=inter, intermediate_size=4096, n_routed_experts=experts,
               num_hidden_layers=moe_layers + 1, first_k_dense_replace=1, num_attention_heads=16,
               num_key_value_heads=16, q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=64,
               qk_rope_head_dim=32, v_head_dim=64, head_dim=32, qk_head_dim=96, n_group=8, topk_group=4)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    with torch.device("meta"):
        ccfg = transformers.DeepseekV3Config(**{k: v for k, v in cfg.items() if k != "quantization_config"})
        shapes = {n: tuple(p.shape) for n, p in DeepseekV3ForCausalLM(ccfg).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    weight_map = {}
    shards = [{} for _ in range(moe_layers + 1)]
    for name, shape in shapes.items():
        if ".experts." in name:
            continue
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else 0
        t_ = torch.randn(shape, generator=g) * 0.02
        if name.endswith("norm.weight"):
            t_ = torch.ones(shape)
        shards[layer][name] = t_.to(torch.bfloat16) if len(shape) == 2 and not name.endswith("mlp.gate.weight") else t_
    for layer in range(1, moe_layers + 1):
        for e in range(experts):
            for proj, (r, c) in [("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))]:
                base = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                shards[layer][base + ".weight_packed"] = torch.randint(0, 256, (r, c // 2), generator=g, dtype=torch.uint8)
                shards[layer][base + ".weight_scale"] = torch.randint(118, 122, (r, c // 32), generator=g, dtype=torch.uint8)
    n = len(shards)
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
        shards[i] = None
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}) + "\n")
    print("wrote", out, moe_layers, "MoE layers", file=sys.stderr)


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 2 and sys.argv[1] == "--big":
        big(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
    else:
        main()
        k3()
