#!/usr/bin/env python3
"""Generate the DeepSeek-V3 reference fixture that WASTE's oracle tests compare against.

Purpose
-------
Build a tiny, randomly initialised `deepseek_v3` model (DeepseekV3ForCausalLM from
transformers 5.24, `transformers/models/deepseek_v3/modeling_deepseek_v3.py`), save it with
`save_pretrained` (per-expert `mlp.experts.N.{gate,up,down}_proj` names, as released
DeepSeek-V3 / Kimi-K2 checkpoints) and record what the PyTorch reference computes:

  * logits at every position of the prompt, raw little-endian f32 [T, V];
  * 16 greedily generated tokens (latent-cached decode);
  * the smallest router gaps: the k-th vs (k+1)-th biased score among the experts of the
    kept groups, and the topk_group-th vs (topk_group+1)-th group score (sum of the top-2
    biased scores of a group); and the smallest top-1 vs top-2 logit gap. All must exceed
    1e-4 (seeds are tried in a fixed order until they do), so a correct f32 engine cannot
    pick another group, expert or token;
  * mla_reference.safetensors: layer 2's self_attn on random hidden states at positions
    0..T-1 through the reference module (q-LoRA, interleaved RoPE with YaRN, expanded K/V),
    plus the YaRN tables (`inv_freq`, `attention_scaling`) and the softmax scale.

The model exercises what the family has beyond Kimi-Linear: q-LoRA (q_a_proj ->
q_a_layernorm -> q_b_proj), interleaved RoPE (`rope_interleave: true`) on the rope parts
with YaRN (`factor` 4, `mscale` == `mscale_all_dim` == 1, so the cos/sin attention factor is
1 and the softmax scale is multiplied by mscale(4, 1)^2), group-limited routing (n_group 4,
topk_group 2, top-4 of 16 experts), renormalisation, routed_scaling_factor 2.5,
`first_k_dense_replace` 2 (layers 0 and 1 dense) and one shared expert. Every RMSNorm
weight is 1 + 0.2*randn and every e_score_correction_bias 0.1*randn (seeded) so an engine
that drops or misplaces them fails.

How to run
----------
    python3 tests/gen_deepseek_fixtures.py     # by hand, never by CI; CPU, ~20 s

Needs torch, transformers 5.24, tokenizers, safetensors, numpy; offline. Deterministic
(seeded, single thread, float32, eager attention).

Versions used for the committed fixture: torch 2.15.0+cu132 (CPU), transformers 5.24.0,
Python 3.11.7 (all written into reference.json).

Writes (and nothing else): tests/fixtures/tiny-deepseek_v3/ {config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
reference.json, reference_logits.f32, mla_reference.safetensors}. The tokenizer is the
byte-level BPE of tests/gen_fixtures.py (same corpus, same training).
"""

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import json
import platform
import shutil
from pathlib import Path

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import TOKENIZER_CONFIG, VOCAB_SIZE, SPECIAL_TOKENS, train_tokenizer  # noqa: E402

from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as md  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

OUT = Path(__file__).resolve().parent / "fixtures" / "tiny-deepseek_v3"
GAP_MIN = 1e-4
MAX_NEW_TOKENS = 16
SEEDS = list(range(3000, 3400))

# Layers 0, 1: MLA + dense MLP; 2, 3: MLA + MoE (grouped routing, one shared expert).
CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    n_shared_experts=1,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=2,
    hidden_act="silu",
    max_position_embeddings=2048,
    rope_interleave=True,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 512, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0},
    initializer_range=0.08,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=2,
)

PROMPT = (
    "The keeper of the old lighthouse writes to his daughter every Sunday. He tells her "
    "about the weather, the boats, the birds that nest on the cliffs, and the books he reads "
    "by the light of the lamp. Il guardiano scrive una lettera a sua figlia ogni domenica."
)


def build_model(seed):
    cfg = DeepseekV3Config(**CONFIG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for _, mod in model.named_modules():
            if "RMSNorm" in type(mod).__name__:
                mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.weight.shape, generator=g))
            if isinstance(mod, md.DeepseekV3TopkRouter):
                mod.weight.copy_(0.08 * torch.randn(mod.weight.shape, generator=g))
                mod.e_score_correction_bias.copy_(0.1 * torch.randn(mod.e_score_correction_bias.shape, generator=g))
    return model


def gen_config():
    return GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, do_sample=False, num_beams=1,
        eos_token_id=None, pad_token_id=0, bos_token_id=None,
        temperature=None, top_p=None, top_k=None,
    )


@torch.no_grad()
def evaluate(model, ids_list):
    gaps, group_gaps = [], []

    def hook(mod, inp, out):
        h = inp[0].reshape(-1, mod.hidden_dim).float()
        scores = (h @ mod.weight.float().t()).sigmoid()
        choice = scores + mod.e_score_correction_bias
        ng, tg, k = mod.num_group, mod.topk_group, mod.top_k
        gs = choice.view(-1, ng, mod.num_experts // ng).topk(2, dim=-1)[0].sum(-1)
        gtop = gs.topk(tg + 1, dim=-1).values
        group_gaps.append((gtop[:, tg - 1] - gtop[:, tg]).min().item())
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1).bool()
        mask = keep.unsqueeze(-1).expand(-1, ng, mod.num_experts // ng).reshape(-1, mod.num_experts)
        top = choice.masked_fill(~mask, float("-inf")).topk(k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    routers = [m for m in model.modules() if isinstance(m, md.DeepseekV3TopkRouter)]
    handles = [m.register_forward_hook(hook) for m in routers]
    try:
        ids = torch.tensor([ids_list])
        T = ids.shape[1]
        prompt_logits = model(input_ids=ids).logits[0].float()
        gen = model.generate(ids, generation_config=gen_config(), return_dict_in_generate=True,
                             output_logits=True)
        seq = gen.sequences[0]
        step_logits = torch.stack([l[0].float() for l in gen.logits])
        full_logits = model(input_ids=seq[None, :]).logits[0].float()
    finally:
        for h in handles:
            h.remove()

    def top1_gap(x):
        t = torch.topk(x, 2, dim=-1).values
        return (t[..., 0] - t[..., 1]).min().item()

    return dict(
        T=T,
        prompt_logits=prompt_logits,
        greedy=seq[T:].tolist(),
        greedy_from_full=full_logits[T - 1:T - 1 + MAX_NEW_TOKENS].argmax(-1).tolist(),
        min_router_gap=min(gaps),
        min_group_gap=min(group_gaps),
        min_top1_gap=min(top1_gap(prompt_logits), top1_gap(step_logits),
                         top1_gap(full_logits[:T - 1 + MAX_NEW_TOKENS])),
        decode_vs_full_max_abs=(step_logits - full_logits[T - 1:T - 1 + MAX_NEW_TOKENS]).abs().max().item(),
        logits_std=prompt_logits.std().item(),
    )


def acceptable(r):
    return (len(r["greedy"]) == MAX_NEW_TOKENS and r["greedy"] == r["greedy_from_full"]
            and r["min_router_gap"] > GAP_MIN and r["min_group_gap"] > GAP_MIN
            and r["min_top1_gap"] > GAP_MIN
            and not any(t < len(SPECIAL_TOKENS) for t in r["greedy"])
            and len(set(r["greedy"])) >= 3)


@torch.no_grad()
def mla_reference(model, path, layer):
    """Layer `layer`'s reference self_attn (q-LoRA, interleaved YaRN RoPE, expanded K/V) on
    random hidden states at positions 0..T-1, with the rotary tables it used."""
    attn = model.model.layers[layer].self_attn
    assert isinstance(attn, md.DeepseekV3Attention)
    g_ = torch.Generator().manual_seed(99)
    T, Hd = 12, CONFIG["hidden_size"]
    x = torch.randn(1, T, Hd, generator=g_)
    pos = torch.arange(T)[None]
    cos, sin = model.model.rotary_emb(x, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    expanded, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
    rot = model.model.rotary_emb
    save_file({"x": x[0].contiguous(), "expanded": expanded[0].contiguous(),
               "inv_freq": rot.inv_freq.float().contiguous(),
               "cos": cos[0].float().contiguous(), "sin": sin[0].float().contiguous(),
               "softmax_scale": torch.tensor([attn.scaling], dtype=torch.float32),
               "attention_scaling": torch.tensor([rot.attention_scaling], dtype=torch.float32)},
              str(path), metadata={"layer": str(layer)})  # one key: hash-ordered metadata
    return float(attn.scaling), float(rot.attention_scaling)


def main():
    tok = train_tokenizer()
    pids = tok.encode(PROMPT).ids
    tried, chosen = [], None
    for seed in SEEDS:
        model = build_model(seed)
        r = evaluate(model, pids)
        tried.append({"seed": seed, "min_router_gap": r["min_router_gap"],
                      "min_group_gap": r["min_group_gap"], "min_top1_gap": r["min_top1_gap"],
                      "ok": acceptable(r)})
        if acceptable(r):
            chosen = (seed, model, r)
            break
    assert chosen, f"no seed satisfied the gap criteria: {tried}"
    seed, model, r = chosen
    print(f"[deepseek_v3] seed={seed} T={r['T']} min_router_gap={r['min_router_gap']:.3e} "
          f"min_group_gap={r['min_group_gap']:.3e} min_top1_gap={r['min_top1_gap']:.3e} "
          f"after {len(tried)} candidate(s)")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    model.save_pretrained(OUT)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    logits = r["prompt_logits"].contiguous().numpy().astype("<f4")
    (OUT / "reference_logits.f32").write_bytes(logits.tobytes(order="C"))

    reloaded = DeepseekV3ForCausalLM.from_pretrained(str(OUT), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    r2 = evaluate(reloaded, pids)
    assert torch.equal(r2["prompt_logits"], r["prompt_logits"]), "reloaded logits differ"
    assert r2["greedy"] == r["greedy"]
    assert Tokenizer.from_file(str(OUT / "tokenizer.json")).encode(PROMPT).ids == pids

    softmax_scale, attention_scaling = mla_reference(model, OUT / "mla_reference.safetensors", layer=2)

    tensors = {}
    with safe_open(str(OUT / "model.safetensors"), "pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            tensors[k] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
    ref = {
        "family": "deepseek_v3",
        "architecture": "DeepseekV3ForCausalLM",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "seed": seed,
        "norm_and_bias_noise": "after init: every RMSNorm weight = 1 + 0.2*randn, every router weight = "
                               "0.08*randn, every e_score_correction_bias = 0.1*randn (torch.Generator "
                               "seeded with seed+7919)",
        "attn_implementation": "eager",
        "dtype": "float32",
        "prompt_text": PROMPT,
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [r["T"], VOCAB_SIZE],
        "greedy_ids": r["greedy"],
        "greedy_text": tok.decode(r["greedy"]),
        "greedy_max_new_tokens": MAX_NEW_TOKENS,
        "min_router_gap": r["min_router_gap"],
        "min_group_gap": r["min_group_gap"],
        "min_router_gap_note": "min over every router call (prompt forward, generate, full forward over "
                               "prompt+greedy) of the k-th minus (k+1)-th of sigmoid(logits) + "
                               "e_score_correction_bias among the kept groups; min_group_gap: the "
                               "topk_group-th minus the next group score (sum of a group's top-2)",
        "min_top1_gap": r["min_top1_gap"],
        "gap_threshold": GAP_MIN,
        "decode_vs_full_forward_max_abs_logit_diff": r["decode_vs_full_max_abs"],
        "prompt_logits_std": r["logits_std"],
        "softmax_scale": softmax_scale,
        "rope_attention_scaling": attention_scaling,
        "mla_reference_note": "mla_reference.safetensors: x [12, 64] is the input of layer 2's self_attn "
                              "(after input_layernorm) at positions 0..11; expanded = the reference module "
                              "(causal, q-LoRA, interleaved YaRN RoPE); inv_freq, cos, sin [12, rope] and "
                              "the softmax scale it used",
        "candidates_tried": tried,
        "config": json.loads((OUT / "config.json").read_text()),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "tensors": dict(sorted(tensors.items())),
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"[deepseek_v3] wrote {OUT}; softmax scale {softmax_scale:.6f}, "
          f"rope attention scaling {attention_scaling:.6f}")


if __name__ == "__main__":
    main()
