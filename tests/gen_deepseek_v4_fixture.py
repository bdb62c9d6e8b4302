#!/usr/bin/env python3
"""Generate the DeepSeek-V4 reference fixture: a tiny `deepseek_v4` model that WASTE's oracle
tests compare against (transformers 5.24, `modeling_deepseek_v4.py`).

Purpose
-------
DeepSeek-V4 departs from V3 everywhere below the embedding:

  * shared-KV multi-query attention (one K=V head of `head_dim`, q through a q-LoRA and an
    unweighted per-head RMSNorm), interleaved RoPE on the trailing `qk_rope_head_dim`
    channels, the output's rope slice rotated back by the query position, a learnable sink
    per head, and a grouped low-rank output projection (`o_a_proj` per group, `o_b_proj`);
  * three attention kinds by `layer_types`: sliding window only; compressed sparse
    attention (CSA: every `compress_rate` tokens a softmax-gated entry over two overlapping
    series, and a lightning indexer picking the top `index_topk` entries per query); heavily
    compressed attention (HCA: one entry per `compress_rate` tokens, all attended);
  * manifold-constrained hyper-connections: `hc_mult` residual streams mixed by a
    Sinkhorn-normalised matrix around every attention and MoE block;
  * a `sqrtsoftplus` router with a selection-only bias, hash routing (`tid2eid`) in the
    `hash_moe` layers, swiglu clamped at `swiglu_limit` in every expert.

The fixture is small and its windows short (sliding window 8, CSA rate 4 with index_topk 4,
HCA rate 16), so the 99-token prompt closes 24 CSA windows and 6 HCA windows and the indexer
selects at most positions. Layers: sliding, CSA, HCA, CSA; the first is hash-routed.

Recorded:

  * logits at every prompt position, raw little-endian f32 [T, V], from the CAUSAL path (the
    prompt one token at a time through the cache, which is what a decoder computes); the
    full-sequence forward must agree with it to 1e-5 of the largest logit;
  * 16 greedily generated tokens (cached decode);
  * the smallest gaps a correct f32 engine must not cross: router (k-th vs (k+1)-th biased
    score in the routed layers), indexer (index_topk-th vs next among the valid entries,
    wherever there are more), top-1 vs top-2 logit; all above 1e-4, seeds tried in order;
  * how far the logits move when each mechanism is dropped (indexer selection ignored,
    hyper-connection mixing replaced by stream 0, swiglu clamp lifted), so the oracle test
    is known to catch an engine that skips one.

How to run
----------
    python3 tests/gen_deepseek_v4_fixture.py          # by hand, never by CI; CPU, under a minute
    python3 tests/gen_deepseek_v4_fixture.py release  # then tiny-deepseek_v4-fp4 (see `release`)

Needs torch, transformers 5.24, tokenizers, safetensors, numpy; offline. Deterministic.
Writes tests/fixtures/tiny-deepseek_v4/ {config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, reference.json,
reference_logits.f32}. The tokenizer is tests/gen_fixtures.py's byte-level BPE.
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
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_fixtures import TOKENIZER_CONFIG, VOCAB_SIZE, SPECIAL_TOKENS, train_tokenizer  # noqa: E402
# The causal path and the greedy settings are the DSA fixtures' (one definition).
from gen_dsa_fixtures import MAX_NEW_TOKENS, causal_logits, gen_config  # noqa: E402

from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, GenerationConfig  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mv4  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OUT = FIXTURES / "tiny-deepseek_v4"
GAP_MIN = 1e-4
PATHS_AGREE = 1e-5
SEEDS = list(range(7000, 7400))

CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    qk_rope_head_dim=8,
    q_lora_rank=24,
    num_experts_per_tok=4,
    n_routed_experts=16,
    n_shared_experts=1,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    # YaRN on the compressed layers only, attention factor 1 as the release forces it.
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    # Small enough that the clamp binds on a share of the activations (reported).
    swiglu_limit=0.6,
    sliding_window=8,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=8,
    index_head_dim=16,
    index_topk=4,
    num_nextn_predict_layers=0,
    rms_norm_eps=1e-6,
    initializer_range=0.08,
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
    cfg = DeepseekV4Config(**CONFIG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 7919)
    rn = lambda shape, s: s * torch.randn(shape, generator=g)  # noqa: E731
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, mv4.DeepseekV4RMSNorm):
                mod.weight.copy_(1.0 + rn(mod.weight.shape, 0.2))
            if isinstance(mod, (mv4.DeepseekV4TopKRouter, mv4.DeepseekV4HashRouter)):
                mod.weight.copy_(rn(mod.weight.shape, 0.3))
            if isinstance(mod, mv4.DeepseekV4TopKRouter):
                mod.e_score_correction_bias.copy_(rn(mod.e_score_correction_bias.shape, 0.1))
            if isinstance(mod, mv4.DeepseekV4HashRouter):
                # Each token id's experts: distinct, as a real table's are.
                table = torch.stack([torch.randperm(mod.num_experts, generator=g)[:mod.top_k]
                                     for _ in range(mod.tid2eid.shape[0])])
                mod.tid2eid.copy_(table)
            if isinstance(mod, mv4.DeepseekV4Attention):
                mod.sinks.copy_(rn(mod.sinks.shape, 1.0))
            if isinstance(mod, (mv4.DeepseekV4HCACompressor, mv4.DeepseekV4CSACompressor, mv4.DeepseekV4Indexer)):
                mod.position_bias.copy_(rn(mod.position_bias.shape, 0.5))
                mod.gate_proj.weight.copy_(rn(mod.gate_proj.weight.shape, 0.3))
            if isinstance(mod, mv4.DeepseekV4Indexer):
                # Larger projections so the index scores spread well beyond the 1e-4 gap.
                mod.q_b_proj.weight.copy_(rn(mod.q_b_proj.weight.shape, 0.4))
                mod.kv_proj.weight.copy_(rn(mod.kv_proj.weight.shape, 0.4))
                mod.scorer.weights_proj.weight.copy_(rn(mod.scorer.weights_proj.weight.shape, 0.4))
            if isinstance(mod, mv4.DeepseekV4HyperConnection):
                mod.fn.copy_(rn(mod.fn.shape, 0.1))
                mod.base.copy_(rn(mod.base.shape, 0.5))
                mod.scale.copy_(1.0 + rn(mod.scale.shape, 0.3))
            if isinstance(mod, mv4.DeepseekV4HyperHead):
                mod.hc_fn.copy_(rn(mod.hc_fn.shape, 0.1))
                mod.hc_base.copy_(rn(mod.hc_base.shape, 0.5))
                mod.hc_scale.copy_(1.0 + rn(mod.hc_scale.shape, 0.3))
    return model


class Probe:
    """While installed: the smallest router and indexer gaps, and how often the swiglu
    clamp binds."""

    def __init__(self, model):
        self.router, self.index, self.clamped, self.clamp_total = [], [], 0, 0
        self.handles = [m.register_forward_hook(self.router_hook)
                        for m in model.modules() if isinstance(m, mv4.DeepseekV4TopKRouter)]
        self.indexers = [m for m in model.modules() if isinstance(m, mv4.DeepseekV4Indexer)]
        self.orig_topk = torch.Tensor.topk
        for m in self.indexers:
            m._orig_forward = m.forward
            m.forward = self.wrap(m._orig_forward)
        self.experts = [m for m in model.modules() if isinstance(m, mv4.DeepseekV4Experts)]
        for m in self.experts:
            m._orig_gate = m._apply_gate
            m._apply_gate = self.count_gate(m)

    def count_gate(self, m):
        def gate(gate_up):
            g, u = gate_up.chunk(2, dim=-1)
            self.clamped += int((g > m.limit).sum() + (u.abs() > m.limit).sum())
            self.clamp_total += g.numel() + u.numel()
            return m._orig_gate(gate_up)
        return gate

    def wrap(self, fwd):
        def run(*a, **k):
            probe = self
            torch.Tensor.topk = lambda scores, k, *a, **kw: probe.topk(scores, k, *a, **kw)
            try:
                return fwd(*a, **k)
            finally:
                torch.Tensor.topk = self.orig_topk
        return run

    def topk(self, scores, k, *a, **kw):
        # The indexer's top-k over [B, S, T] with future entries at -inf.
        if scores.numel() == 0:
            return self.orig_topk(scores, k, *a, **kw)
        for row in scores.reshape(-1, scores.shape[-1]):
            v = row[row > -1e30]
            if v.numel() > k:
                top = self.orig_topk(v, k + 1).values
                self.index.append((top[k - 1] - top[k]).item())
        return self.orig_topk(scores, k, *a, **kw)

    def router_hook(self, mod, inp, out):
        h = inp[0].reshape(-1, mod.hidden_dim).float()
        scores = torch.sqrt(torch.nn.functional.softplus(h @ mod.weight.float().t()))
        top = (scores + mod.e_score_correction_bias).topk(mod.top_k + 1, dim=-1).values
        self.router.append((top[:, mod.top_k - 1] - top[:, mod.top_k]).min().item())

    def remove(self):
        for h in self.handles:
            h.remove()
        for m in self.indexers:
            m.forward = m._orig_forward
        for m in self.experts:
            m._apply_gate = m._orig_gate


@torch.no_grad()
def ablated_logits(model, ids, what):
    """The full forward with one mechanism dropped, to show the oracle catches it."""
    saved = []
    if what == "indexer":
        for m in model.modules():
            if isinstance(m, mv4.DeepseekV4Indexer):
                saved.append((m, "index_topk", m.index_topk))
                m.index_topk = 1 << 20
    elif what == "clamp":
        for m in model.modules():
            if isinstance(m, (mv4.DeepseekV4Experts, mv4.DeepseekV4MLP)):
                saved.append((m, "limit", m.limit))
                m.limit = float("inf")
    elif what == "sinks":
        for m in model.modules():
            if isinstance(m, mv4.DeepseekV4Attention):
                saved.append((m.sinks, "data", m.sinks.data.clone()))
                m.sinks.data.fill_(-1e9)
    try:
        return model(input_ids=ids).logits[0].float()
    finally:
        for obj, attr, val in saved:
            setattr(obj, attr, val)


@torch.no_grad()
def evaluate(model, ids_list):
    probe = Probe(model)
    try:
        ids = torch.tensor([ids_list])
        T = ids.shape[1]
        full = model(input_ids=ids).logits[0].float()
        causal = causal_logits(model, ids)
        gen = model.generate(ids, generation_config=gen_config(), return_dict_in_generate=True,
                             output_logits=True)
        seq = gen.sequences[0]
        step_logits = torch.stack([l[0].float() for l in gen.logits])
        causal_seq = causal_logits(model, seq[None, :T - 1 + MAX_NEW_TOKENS])
    finally:
        probe.remove()
    scale = causal.abs().max().item()
    ablations = {w: (ablated_logits(model, ids, w) - causal).abs().max().item() / scale
                 for w in ["indexer", "clamp", "sinks"]}

    def top1_gap(x):
        t = torch.topk(x, 2, dim=-1).values
        return (t[..., 0] - t[..., 1]).min().item()

    return dict(
        T=T,
        prompt_logits=causal,
        full_vs_causal=(full - causal).abs().max().item() / scale,
        greedy=seq[T:].tolist(),
        greedy_from_causal=causal_seq[T - 1:].argmax(-1).tolist(),
        decode_vs_causal_max_abs=(step_logits - causal_seq[T - 1:]).abs().max().item(),
        ablations=ablations,
        min_router_gap=min(probe.router),
        min_index_gap=min(probe.index),
        index_rows=len(probe.index),
        clamp_share=probe.clamped / max(probe.clamp_total, 1),
        min_top1_gap=min(top1_gap(causal), top1_gap(step_logits), top1_gap(causal_seq)),
        logits_std=causal.std().item(),
    )


def acceptable(r):
    return (len(r["greedy"]) == MAX_NEW_TOKENS and r["greedy"] == r["greedy_from_causal"]
            and r["full_vs_causal"] <= PATHS_AGREE
            and r["min_router_gap"] > GAP_MIN and r["min_index_gap"] > GAP_MIN and r["min_top1_gap"] > GAP_MIN
            and all(v > 1e-2 for v in r["ablations"].values())
            and 0.01 < r["clamp_share"] < 0.5
            and not any(t < len(SPECIAL_TOKENS) for t in r["greedy"])
            and len(set(r["greedy"])) >= 3)


def summary(r):
    keys = ["full_vs_causal", "min_router_gap", "min_index_gap", "min_top1_gap", "clamp_share", "ablations"]
    return {k: r[k] for k in keys}


def main():
    tok = train_tokenizer()
    pids = tok.encode(PROMPT).ids
    tried, chosen = [], None
    for seed in SEEDS:
        model = build_model(seed)
        r = evaluate(model, pids)
        tried.append(dict(seed=seed, ok=acceptable(r), **summary(r)))
        print(tried[-1], flush=True)
        if acceptable(r):
            chosen = (seed, model, r)
            break
    assert chosen, f"no seed satisfied the criteria: {tried[-5:]}"
    seed, model, r = chosen
    print(f"[deepseek_v4] seed={seed} T={r['T']} {summary(r)} after {len(tried)} candidate(s)")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    model.save_pretrained(OUT)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")

    # The reference is what the saved files compute.
    reloaded = DeepseekV4ForCausalLM.from_pretrained(str(OUT), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    r2 = evaluate(reloaded, pids)
    moved = (r2["prompt_logits"] - r["prompt_logits"]).abs().max().item() / r["prompt_logits"].abs().max().item()
    assert moved <= PATHS_AGREE, f"reloaded logits moved by {moved}"
    assert r2["greedy"] == r["greedy"] and acceptable(r2)
    r = r2
    (OUT / "reference_logits.f32").write_bytes(r["prompt_logits"].contiguous().numpy().astype("<f4").tobytes())
    assert Tokenizer.from_file(str(OUT / "tokenizer.json")).encode(PROMPT).ids == pids

    tensors = {}
    with safe_open(str(OUT / "model.safetensors"), "pt") as fh:
        for k in fh.keys():
            sl = fh.get_slice(k)
            tensors[k] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
    ref = {
        "family": "deepseek_v4",
        "architecture": type(model).__name__,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "seed": seed,
        "weight_noise": "after init (torch.Generator seeded with seed+7919): RMSNorm weights 1 + 0.2*randn; "
                        "router weights 0.3*randn, e_score_correction_bias 0.1*randn; tid2eid rows of distinct "
                        "random experts; sinks randn; compressor and indexer position_bias 0.5*randn and "
                        "gate_proj 0.3*randn; indexer q_b_proj, kv_proj, weights_proj 0.4*randn; "
                        "hyper-connection fn 0.1*randn, base 0.5*randn, scale 1 + 0.3*randn (and the head's)",
        "attn_implementation": "eager",
        "dtype": "float32",
        "prompt_text": PROMPT,
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_source": "causal path: the prompt one token at a time through DynamicCache",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [r["T"], VOCAB_SIZE],
        "full_forward_vs_causal_max_rel_diff": r["full_vs_causal"],
        "greedy_ids": r["greedy"],
        "greedy_text": tok.decode(r["greedy"]),
        "greedy_max_new_tokens": MAX_NEW_TOKENS,
        "decode_vs_causal_max_abs_logit_diff": r["decode_vs_causal_max_abs"],
        "min_index_gap": r["min_index_gap"],
        "index_gap_rows": r["index_rows"],
        "min_router_gap": r["min_router_gap"],
        "min_top1_gap": r["min_top1_gap"],
        "gap_threshold": GAP_MIN,
        "swiglu_clamp_share": r["clamp_share"],
        "ablation_max_rel_diff": r["ablations"],
        "ablation_note": "max |logit(mechanism dropped) - logit| / max |logit| on the prompt (full forward): "
                         "indexer = every valid compressed entry attended; clamp = swiglu_limit lifted; "
                         "sinks = no sink term",
        "prompt_logits_std": r["logits_std"],
        "candidates_tried": tried,
        "config": json.loads((OUT / "config.json").read_text()),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "tensors": dict(sorted(tensors.items())),
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"[deepseek_v4] wrote {OUT}")




def release():
    """tests/fixtures/tiny-deepseek_v4-fp4: tiny-deepseek_v4 stored as the V4-Flash release
    is: DeepSeek's own names without `model.` (`embed.weight`, `layers.L.attn.wq_a.weight`,
    `layers.L.ffn.experts.E.w1.weight`, `hc_head_fn`, ...); the routed experts FP4 (E2M1
    pairs in int8 with an E8M0 `weight_scale_inv` per 32 values of a row, `expert_dtype`
    fp4); the other matrices of the layers FP8 e4m3 with E8M0 block scales (`scale_fmt`
    ue8m0; 16x16 blocks here, 128x128 in the release); the compressors' and the indexer's
    kv/gate projections and `weights_proj` bf16 (transformers' `_keep_in_fp32_modules`
    note: they ship without scales); routers, norms, sinks, position biases and
    hyper-connection mixes f32; embeddings and head bf16; the legacy config keys
    (`compress_ratios` with `compress_rate_hca`, `num_hash_layers`, `qk_rope_head_dim`, a
    flat `rope_scaling`); and an MTP module `mtp.0.*` that the engine must skip. Reference:
    DeepseekV4ForCausalLM on the weights transformers' `_dequantize_fp8_weight` (fp8) and
    `Fp8Dequantize._dequantize_one` (fp4) give, causal path. Requantisation moves the routing: fp8 block shapes are tried in a
    fixed order until every gap of the requantised model still exceeds 1e-4."""
    for block in ([16, 16], [16, 8], [8, 16], [8, 8], [32, 32], [32, 16], [64, 64]):
        if release_with(block):
            return
    raise AssertionError("no fp8 block shape kept the gaps above 1e-4")


def release_with(block):
    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight
    import gen_mxfp4_fixtures as gm

    src_dir, out = OUT, FIXTURES / "tiny-deepseek_v4-fp4"
    src = load_file(str(src_dir / "model.safetensors"))
    deq_one = Fp8Dequantize(None)._dequantize_one
    keep_bf16 = (".compressor.wkv.", ".compressor.wgate.", ".indexer.weights_proj.")
    stored, deq, kinds = {}, {}, {"fp4": 0, "fp8": 0, "bf16": 0, "f32": 0}
    for name in sorted(src):
        w = src[name]
        rel = name[len("model."):] if name.startswith("model.") else name
        rel = "embed.weight" if rel == "embed_tokens.weight" else rel
        if w.dtype == torch.int64:
            stored[rel], deq[name] = w, w
            continue
        w = w.float()
        if ".ffn.experts." in rel and rel.endswith(".weight"):
            packed, scale = gm.mxfp4_quantize(w)
            stored[rel], stored[rel + "_scale_inv"] = packed.view(torch.int8), scale.view(torch.float8_e8m0fnu)
            deq[name] = deq_one(packed.view(torch.int8), scale.view(torch.float8_e8m0fnu), output_dtype=torch.float32)
            kinds["fp4"] += 1
        elif rel.startswith("layers.") and w.dim() == 2 and rel.endswith(".weight") and not any(
                k in rel for k in keep_bf16) and ".ffn.gate." not in rel:
            gm.BLOCK = block
            q, s = gm.fp8_quantize(w)
            # E8M0: each block's scale rounded up to a power of two.
            e = torch.ceil(torch.log2(s)).clamp(-127, 127)
            s2 = torch.pow(2.0, e)
            q = (w / s2.repeat_interleave(block[0], 0)[:w.shape[0]].repeat_interleave(block[1], 1)[:, :w.shape[1]]
                 ).to(torch.float8_e4m3fn)
            scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
            stored[rel], stored[rel + "_scale_inv"] = q, scale
            # `_dequantize_fp8_weight` takes the block from the config, as the
            # release's loader does; `_dequantize_one` would infer it from the grid,
            # which differs where a block is partial (24 rows in blocks of 16).
            deq[name] = _dequantize_fp8_weight(q, scale.float(), block, torch.float32)
            kinds["fp8"] += 1
        elif rel in ("embed.weight", "head.weight") or any(k in rel for k in keep_bf16):
            stored[rel] = w.to(torch.bfloat16)
            deq[name] = stored[rel].float()
            kinds["bf16"] += 1
        else:
            stored[rel], deq[name] = w, w
            kinds["f32"] += 1
    # The MTP module: a few tensors under `mtp.0.` (the release's naming).
    g = torch.Generator().manual_seed(4)
    hidden = CONFIG["hidden_size"]
    stored["mtp.0.e_proj.weight"] = (0.05 * torch.randn(hidden, hidden, generator=g)).to(torch.bfloat16)
    stored["mtp.0.enorm.weight"] = torch.ones(hidden)
    stored["mtp.0.attn_norm.weight"] = torch.ones(hidden)

    cfg = json.loads((src_dir / "config.json").read_text())
    kinds_to_ratio = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    ratios = [kinds_to_ratio[k] for k in cfg.pop("layer_types")] + [0]
    rates = cfg.pop("compress_rates")
    n_hash = cfg.pop("mlp_layer_types").count("hash_moe")
    rope = cfg.pop("rope_parameters")["compress"]
    yarn = {"type": "yarn", "factor": rope["factor"], "original_max_position_embeddings":
            rope["original_max_position_embeddings"], "beta_fast": rope["beta_fast"], "beta_slow": rope["beta_slow"]}
    for k in ["partial_rotary_factor", "dtype", "transformers_version", "use_cache"]:
        cfg.pop(k, None)
    cfg.update(compress_ratios=ratios, compress_rate_hca=rates["heavily_compressed_attention"],
               num_hash_layers=n_hash, qk_rope_head_dim=CONFIG["qk_rope_head_dim"], rope_scaling=yarn,
               num_nextn_predict_layers=1, torch_dtype="bfloat16",
               quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": block, "scale_fmt": "ue8m0", "expert_dtype": "fp4"})
    # transformers reads the release's keys as the fixture's.
    a, b = DeepseekV4Config(**{k: v for k, v in cfg.items() if k != "quantization_config"}), reloaded_config()
    # (`rope_scaling`'s legacy `type` stays beside the `rope_type` it implies.)
    a.rope_parameters["compress"].pop("type", None)
    for key in ["layer_types", "compress_rates", "mlp_layer_types", "rope_parameters", "qk_rope_head_dim"]:
        assert getattr(a, key) == getattr(b, key), f"{key}: {getattr(a, key)} vs {getattr(b, key)}"

    # The dequantised weights under the saved names, loaded as transformers loads a
    # checkpoint (its conversion mapping renames them and fuses the experts).
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(src_dir / "config.json", Path(tmp) / "config.json")
        save_file({k: v.contiguous() for k, v in deq.items()}, str(Path(tmp) / "model.safetensors"))
        model = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
    moved = max((p.float() - q.float()).abs().max().item() for p, q in
                zip(model.state_dict().values(), reloaded_model().state_dict().values()))
    assert moved > 0, "the dequantised weights did not load"
    tok = Tokenizer.from_file(str(src_dir / "tokenizer.json"))
    pids = tok.encode(PROMPT).ids
    r = evaluate(model, pids)
    if not acceptable(r):
        print(f"[deepseek_v4 release] block {block}: {summary(r)}: gaps too small")
        return False
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(src_dir / f, out / f)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(stored, str(out / "model.safetensors"))
    (out / "reference_logits.f32").write_bytes(r["prompt_logits"].contiguous().numpy().astype("<f4").tobytes())
    ref = json.loads((src_dir / "reference.json").read_text())
    ref.update(
        family="deepseek_v4", layout="the V4-Flash release: FP4 experts, FP8 ue8m0 matrices, DeepSeek's names",
        kinds=kinds, fp8_block=block, greedy_ids=r["greedy"], greedy_text=tok.decode(r["greedy"]),
        full_forward_vs_causal_max_rel_diff=r["full_vs_causal"], min_router_gap=r["min_router_gap"],
        min_index_gap=r["min_index_gap"], min_top1_gap=r["min_top1_gap"],
        logits_source="causal path on the dequantised release weights", config=cfg,
        tensors={k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(stored.items())})
    for k in ["candidates_tried", "ablation_max_rel_diff", "ablation_note", "swiglu_clamp_share"]:
        ref.pop(k, None)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"[deepseek_v4 release] block {block} {kinds} {summary(r)}; wrote {out}")
    return True


def reloaded_model():
    return DeepseekV4ForCausalLM.from_pretrained(str(OUT), dtype=torch.float32, attn_implementation="eager")


def reloaded_config():
    return DeepseekV4Config.from_pretrained(str(OUT))


if __name__ == "__main__":
    release() if sys.argv[1:] == ["release"] else main()
