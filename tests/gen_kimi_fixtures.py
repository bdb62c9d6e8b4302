#!/usr/bin/env python3
"""Generate the Kimi-Linear reference fixture that WASTE's oracle tests compare against.

Purpose
-------
Build a tiny, randomly initialised `kimi_linear` model (KimiLinearForCausalLM from
transformers 5.24, `transformers/models/kimi_linear/modeling_kimi_linear.py`), save it as
a checkpoint with the tensor names of the *released* Kimi-Linear checkpoints, and record
what the PyTorch reference computes:

  * logits at every position of a prompt longer than 64 tokens (so the chunked KDA
    prefill of the reference crosses a 64-token chunk boundary), raw little-endian f32
    [T, V];
  * 16 greedily generated tokens (KV / recurrent-state cached decode);
  * the smallest router selection gap (k-th vs (k+1)-th of sigmoid(logits) + bias) and
    the smallest top-1 vs top-2 logit gap; both must exceed 1e-4 (seeds are tried in a
    fixed order until they do), so a correct f32 engine cannot pick another expert or
    token;
  * kda_reference.safetensors: the KDA recurrence alone on random inputs, through
    transformers' `recurrent_kimi_delta_attention` and `chunk_kimi_delta_attention`
    (the pure-torch versions), with a random initial state, including final states;
  * mla_reference.safetensors: the MLA layer of the fixture (layer 2) on random hidden
    states through the reference module (which expands K and V per head), plus the
    same computation written in the absorbed form (W_kb folded into q and the output),
    so the engine's absorbed path is checked against the expanded one.

`fla` and `causal_conv1d` are hidden (sys.modules entries set to None) before transformers
is imported: when installed, transformers calls their GPU-only kernels; hidden, it runs the
pure-torch functions quoted above.

transformers' conversion mapping renames on save: `mlp.` -> `block_sparse_moe.` for every
layer (so the dense layer 0 would be written as `block_sparse_moe.{gate,up,down}_proj`),
splits `conv1d.weight` into `q_conv1d/k_conv1d/v_conv1d` [C, 1, K] and moves
`forget_gate.{f_a_proj,f_b_proj,dt_bias,A_log}` up to `self_attn.`. Released checkpoints keep
the dense layer under `mlp.*`, so this script renames those three tensors back and checks
that the result reloads to identical logits.

How to run
----------
    python3 tests/gen_kimi_fixtures.py        # by hand, never by CI; CPU, ~30 s

Needs torch, transformers 5.24, tokenizers, safetensors, numpy; offline. Deterministic
(seeded, single thread, float32, eager attention).

Versions used for the committed fixture: torch 2.15.0+cu132 (CPU), transformers 5.24.0,
tokenizers 0.23.3, safetensors 0.8.0, Python 3.11.7 (also written into reference.json).

Writes (and nothing else): tests/fixtures/tiny-kimi_linear/ {config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
reference.json, reference_logits.f32, kda_reference.safetensors, mla_reference.safetensors}.
The tokenizer is the byte-level BPE of tests/gen_fixtures.py (same corpus, same training).
"""

import os
import sys

# Hide the optional kernel packages before anything imports transformers.
sys.modules["fla"] = None
sys.modules["causal_conv1d"] = None
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
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import TOKENIZER_CONFIG, VOCAB_SIZE, SPECIAL_TOKENS, train_tokenizer  # noqa: E402

from transformers import GenerationConfig, KimiLinearConfig, KimiLinearForCausalLM  # noqa: E402
from transformers.models.kimi_linear import modeling_kimi_linear as mk  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

OUT = Path(__file__).resolve().parent / "fixtures" / "tiny-kimi_linear"
GAP_MIN = 1e-4
MAX_NEW_TOKENS = 16
SEEDS = list(range(2000, 2200))

# Layer 0: KDA + dense MLP; 1: KDA + MoE; 2: MLA + MoE; 3: KDA + MoE; 4: MLA + MoE.
CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,            # dense MLP of layer 0
    moe_intermediate_size=32,        # one routed expert (and the shared expert per unit)
    num_hidden_layers=5,
    num_attention_heads=4,           # MLA heads
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    n_shared_experts=1,
    routed_scaling_factor=2.446,
    n_group=1,
    topk_group=1,
    num_local_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    hidden_act="silu",
    max_position_embeddings=512,
    initializer_range=0.08,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=2,
    layer_types=["linear_attention", "linear_attention", "full_attention",
                 "linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
    linear_head_dim=16,
    linear_num_heads=2,
    linear_conv_kernel_dim=4,
)

PROMPT = (
    "The keeper of the old lighthouse writes to his daughter every Sunday. He tells her "
    "about the weather, the boats, the birds that nest on the cliffs, and the books he reads "
    "by the light of the lamp. Il guardiano scrive una lettera a sua figlia ogni domenica."
)


def build_model(seed):
    cfg = KimiLinearConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(cfg).to(torch.float32).eval()
    # Seeded noise on every norm weight (RMSNorm, gated o_norm, kv_a_layernorm), every
    # bias and the router score-correction bias, so an engine that drops or misplaces
    # them fails.
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for _, mod in model.named_modules():
            if "RMSNorm" in type(mod).__name__:
                mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.weight.shape, generator=g))
            if isinstance(mod, mk.KimiLinearTopkRouter):
                mod.e_score_correction_bias.copy_(0.1 * torch.randn(mod.e_score_correction_bias.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def gen_config():
    return GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, do_sample=False, num_beams=1,
        eos_token_id=None, pad_token_id=0, bos_token_id=None,
        temperature=None, top_p=None, top_k=None,
    )


@torch.no_grad()
def evaluate(model, ids_list):
    gaps = []

    def hook(mod, inp, out):
        logits = out[0].float()
        choice = logits.sigmoid() + mod.e_score_correction_bias
        top = torch.topk(choice, mod.top_k + 1, dim=-1).values
        gaps.append((top[:, mod.top_k - 1] - top[:, mod.top_k]).min().item())

    routers = [m for m in model.modules() if isinstance(m, mk.KimiLinearTopkRouter)]
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
        min_top1_gap=min(top1_gap(prompt_logits), top1_gap(step_logits),
                         top1_gap(full_logits[:T - 1 + MAX_NEW_TOKENS])),
        decode_vs_full_max_abs=(step_logits - full_logits[T - 1:T - 1 + MAX_NEW_TOKENS]).abs().max().item(),
        logits_std=prompt_logits.std().item(),
    )


def acceptable(r):
    return (len(r["greedy"]) == MAX_NEW_TOKENS and r["greedy"] == r["greedy_from_full"]
            and r["min_router_gap"] > GAP_MIN and r["min_top1_gap"] > GAP_MIN
            and not any(t < len(SPECIAL_TOKENS) for t in r["greedy"])
            and len(set(r["greedy"])) >= 3)


def rename_dense_to_released(out_dir):
    """transformers writes every `mlp.` as `block_sparse_moe.`; released checkpoints keep the
    dense layers under `mlp.`. Rename the dense-layer tensors back."""
    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    renamed = {}
    for k, v in tensors.items():
        for L, kind in enumerate(CONFIG["mlp_layer_types"]):
            pre = f"model.layers.{L}.block_sparse_moe."
            if kind == "dense" and k.startswith(pre):
                k = f"model.layers.{L}.mlp." + k[len(pre):]
        renamed[k] = v.contiguous()
    save_file(renamed, str(path), metadata={"format": "pt"})
    return sorted(renamed)


@torch.no_grad()
def kda_reference(path):
    """The KDA recurrence alone: random q, k, v (before the in-kernel L2 norm), log-decay g
    (<= 0), beta in (0, 1) and an initial state, through both pure-torch reference forms."""
    g_ = torch.Generator().manual_seed(77)
    B, T, H, D = 1, 80, 2, 16
    q = torch.randn(B, T, H, D, generator=g_)
    k = torch.randn(B, T, H, D, generator=g_)
    v = torch.randn(B, T, H, D, generator=g_)
    g = -torch.nn.functional.softplus(torch.randn(B, T, H, D, generator=g_)) * 0.5
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g_))
    s0 = 0.3 * torch.randn(B, H, D, D, generator=g_)
    o_rec, s_rec = mk.recurrent_kimi_delta_attention(q, k, v, g=g, beta=beta, initial_state=s0.clone(),
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_chk, s_chk = mk.chunk_kimi_delta_attention(q, k, v, g=g, beta=beta, initial_state=s0.clone(),
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
    diff = max((o_rec - o_chk).abs().max().item(), (s_rec - s_chk).abs().max().item())
    assert diff < 1e-4, diff
    save_file({k_: t.contiguous() for k_, t in dict(
        q=q[0], k=k[0], v=v[0], g=g[0], beta=beta[0], initial_state=s0[0],
        out_recurrent=o_rec[0], state_recurrent=s_rec[0], out_chunk=o_chk[0], state_chunk=s_chk[0],
    ).items()}, str(path), metadata={
        # One key only: safetensors writes metadata in hash order, so several
        # keys would make the file differ between runs. Details: reference.json.
        "layout": "q,k,v,g [T,H,D]; beta [T,H]; states [H,Dk,Dv]; out [T,H,Dv]; "
                  "use_qk_l2norm_in_kernel=True, output_final_state=True, chunk_size=64",
    })
    return diff


@torch.no_grad()
def mla_reference(model, path, layer):
    """The reference MLA module (expanded K/V) on random hidden states, and the absorbed
    form computed here from the same weights; asserts they agree."""
    attn = model.model.layers[layer].self_attn
    assert isinstance(attn, mk.KimiLinearAttention)
    g_ = torch.Generator().manual_seed(99)
    T, Hd = 12, CONFIG["hidden_size"]
    x = torch.randn(1, T, Hd, generator=g_)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    expanded, _ = attn(x, attention_mask=mask)

    nh, dn, dr, dv, r = (CONFIG["num_attention_heads"], CONFIG["qk_nope_head_dim"],
                         CONFIG["qk_rope_head_dim"], CONFIG["v_head_dim"], CONFIG["kv_lora_rank"])
    q = attn.q_proj(x)[0].view(T, nh, dn + dr)
    ckv = attn.kv_a_proj_with_mqa(x)[0]
    c = attn.kv_a_layernorm(ckv[:, :r])          # [T, r]
    k_rope = ckv[:, r:]                          # [T, dr]
    wkb = attn.kv_b_proj.weight.view(nh, dn + dv, r)
    w_k, w_v = wkb[:, :dn], wkb[:, dn:]          # [nh, dn, r], [nh, dv, r]
    q_lat = torch.einsum("thd,hdr->thr", q[..., :dn], w_k)
    scores = (torch.einsum("thr,sr->hts", q_lat, c) + torch.einsum("thd,sd->hts", q[..., dn:], k_rope))
    scores = scores * attn.scaling + mask[0]
    a = scores.softmax(-1)
    lat = torch.einsum("hts,sr->thr", a, c)
    o = torch.einsum("thr,hvr->thv", lat, w_v).reshape(T, nh * dv)
    absorbed = attn.o_proj(o)
    diff = (absorbed - expanded[0]).abs().max().item()
    assert diff < 1e-5, diff
    save_file({"x": x[0].contiguous(), "expanded": expanded[0].contiguous(), "absorbed": absorbed.contiguous()},
              str(path), metadata={"layer": str(layer)})  # one key: see kda_reference
    return diff


def main():
    tok = train_tokenizer()
    pids = tok.encode(PROMPT).ids
    assert len(pids) > 64, len(pids)
    tried, chosen = [], None
    for seed in SEEDS:
        model = build_model(seed)
        r = evaluate(model, pids)
        tried.append({"seed": seed, "min_router_gap": r["min_router_gap"], "min_top1_gap": r["min_top1_gap"],
                      "ok": acceptable(r)})
        if acceptable(r):
            chosen = (seed, model, r)
            break
    assert chosen, f"no seed satisfied the gap criteria: {tried}"
    seed, model, r = chosen
    print(f"[kimi_linear] seed={seed} T={r['T']} min_router_gap={r['min_router_gap']:.3e} "
          f"min_top1_gap={r['min_top1_gap']:.3e} after {len(tried)} candidate(s)")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    model.save_pretrained(OUT)
    names = rename_dense_to_released(OUT)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    logits = r["prompt_logits"].contiguous().numpy().astype("<f4")
    (OUT / "reference_logits.f32").write_bytes(logits.tobytes(order="C"))

    # The renamed checkpoint reloads to identical logits and greedy tokens.
    reloaded = KimiLinearForCausalLM.from_pretrained(str(OUT), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    r2 = evaluate(reloaded, pids)
    assert torch.equal(r2["prompt_logits"], r["prompt_logits"]), "reloaded logits differ"
    assert r2["greedy"] == r["greedy"]
    assert Tokenizer.from_file(str(OUT / "tokenizer.json")).encode(PROMPT).ids == pids

    kda_diff = kda_reference(OUT / "kda_reference.safetensors")
    mla_diff = mla_reference(model, OUT / "mla_reference.safetensors", layer=2)

    tensors = {}
    with safe_open(str(OUT / "model.safetensors"), "pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            tensors[k] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
    ref = {
        "family": "kimi_linear",
        "architecture": "KimiLinearForCausalLM",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "seed": seed,
        "norm_and_bias_noise": "after init: every RMSNorm / RMSNormGated weight = 1 + 0.2*randn, every bias and "
                               "every e_score_correction_bias = 0.1*randn (torch.Generator seeded with seed+7919)",
        "hidden_modules": "sys.modules['fla'] = sys.modules['causal_conv1d'] = None (pure-torch paths)",
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
        "min_router_gap_note": "min over every router call (prompt forward, generate, full forward over "
                               "prompt+greedy) of the k-th minus (k+1)-th of sigmoid(logits) + "
                               "e_score_correction_bias",
        "min_top1_gap": r["min_top1_gap"],
        "gap_threshold": GAP_MIN,
        "decode_vs_full_forward_max_abs_logit_diff": r["decode_vs_full_max_abs"],
        "prompt_logits_std": r["logits_std"],
        "kda_recurrent_vs_chunk_max_abs": kda_diff,
        "mla_absorbed_vs_expanded_max_abs": mla_diff,
        "mla_reference_note": "mla_reference.safetensors: x [12, 64] is the input of layer 2's self_attn "
                              "(after input_layernorm); expanded = the reference module (causal, NoPE); "
                              "absorbed = W_kb folded into q and the output, from the same weights",
        "dense_layer_renamed": "model.layers.0.block_sparse_moe.{gate,up,down}_proj -> model.layers.0.mlp.*",
        "candidates_tried": tried,
        "config": json.loads((OUT / "config.json").read_text()),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "tensors": dict(sorted(tensors.items())),
    }
    assert sorted(tensors) == names
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"[kimi_linear] wrote {OUT}; kda recurrent vs chunk {kda_diff:.2e}; "
          f"mla absorbed vs expanded {mla_diff:.2e}")


if __name__ == "__main__":
    main()
