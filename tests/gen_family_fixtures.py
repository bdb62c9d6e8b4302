#!/usr/bin/env python3
"""Generate tiny transformers reference fixtures for five more MoE families.

Purpose
-------
For qwen2_moe, glm4_moe, minimax_m2, gpt_oss (and its MXFP4 release layout), qwen3_next,
qwen3_5_moe (vision-language wrapper, the release layout) and qwen3_5_moe_text, build a tiny,
randomly initialised model with transformers 5.24, save it as an HF checkpoint with the tiny
byte-level BPE tokenizer of tests/fixtures/tiny-qwen3_moe (copied), and record what the PyTorch
reference computes, exactly like tests/gen_fixtures.py does for qwen3_moe / olmoe / mixtral:

  * the logits at every prompt position (raw little-endian f32, row-major [T, V]),
  * 16 greedily generated tokens (`generate`, KV / recurrent-state cached decode), checked to equal
    the argmax of full forwards over prompt+greedy,
  * the smallest router gap (family-specific selection scores, see each spec) and the smallest
    top-1 vs top-2 logit gap; both must exceed 1e-4, seeds are tried in a fixed order until they do.

This file holds the shared machinery and the four softmax/sigmoid-attention families;
tests/gen_family_fixtures_gdn.py holds qwen3_next / qwen3_5_moe (Gated DeltaNet),
tests/gen_family_fixtures_mxfp4.py the gpt_oss MXFP4 release layout, and
tests/gen_family_fixtures_numpy.py an independent float64 numpy re-implementation of
tests/fixtures/FAMILIES_MATH.md that reads only config.json + safetensors and must reproduce every
fixture's logits (and, as a check of that file, must equal transformers' own modeling code re-executed
with its f32 casts turned into f64).

Other checks before reference.json is written: the saved directory reloads with from_pretrained to
identical tensors, identical logits (torch.equal, after re-copying the mmapped parameters to aligned
memory) and identical greedy ids; every saved per-expert tensor equals its slice of the fused
in-memory parameter.

How to run
----------
    python3 tests/gen_family_fixtures.py [name ...]     # by hand, never by CI; CPU, ~15 s

names: qwen2_moe glm4_moe minimax_m2 gpt_oss (also writes gpt_oss-mxfp4) qwen3_next qwen3_5_moe
(writes qwen3_5_moe_text and qwen3_5_moe). Needs torch, transformers 5.24, tokenizers, safetensors,
numpy; offline (HF_HUB_OFFLINE=1). Deterministic: seeded, one thread, float32, eager attention,
eager experts (`experts_implementation="eager"`, the loop in each modeling file; the default
`grouped_mm` path is run too and its difference recorded). `fla` and `causal_conv1d` are hidden
(sys.modules entries set to None) before transformers is imported, so the pure-torch Gated DeltaNet
and conv functions run.

Versions used for the committed fixtures: torch 2.15.0+cu132 (CPU), transformers 5.24.0,
tokenizers 0.23.3, safetensors 0.8.0, Python 3.11.7 (written into every reference.json).

Writes (and nothing else): tests/fixtures/tiny-{qwen2_moe,glm4_moe,minimax_m2,gpt_oss,
gpt_oss-mxfp4,qwen3_next,qwen3_5_moe_text,qwen3_5_moe}/ (wiped and rewritten). The README section
and FAMILIES_MATH.md are written by hand.
"""

import os
import sys

sys.modules["fla"] = None
sys.modules["causal_conv1d"] = None
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import hashlib
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
from transformers import (
    GenerationConfig,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
TOKENIZER_SRC = FIXTURES / "tiny-qwen3_moe"
GAP_MIN = 1e-4
MAX_NEW_TOKENS = 16
VOCAB_SIZE = 512
N_SPECIAL = 3  # <|endoftext|>, <|im_start|>, <|im_end|>

PROMPT_SHORT = "The keeper of the old lighthouse writes to his daughter about boats and birds."
PROMPT_ROUTER = "A router sends every token to two experts; attention looks back at the cache."
PROMPT_LONG = (
    "The keeper of the old lighthouse writes to his daughter every Sunday. He tells her "
    "about the weather, the boats, the birds that nest on the cliffs, and the books he reads "
    "by the light of the lamp. Il guardiano scrive una lettera a sua figlia ogni domenica."
)

COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    hidden_act="silu", max_position_embeddings=512, num_experts_per_tok=2, initializer_range=0.08,
    pad_token_id=0, bos_token_id=None, eos_token_id=2, tie_word_embeddings=False,
)

ZERO_CENTRED_NORMS = {"Qwen3NextRMSNorm", "Qwen3_5MoeRMSNorm"}


# --------------------------------------------------------------------------- helpers
def tokenizer():
    return Tokenizer.from_file(str(TOKENIZER_SRC / "tokenizer.json"))


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def gen_config():
    return GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, do_sample=False, num_beams=1,
                            eos_token_id=None, pad_token_id=0, bos_token_id=None,
                            temperature=None, top_p=None, top_k=None)


def add_noise(model, seed, extra=None):
    """Every RMSNorm / RMSNormGated weight 1 + 0.2*randn (zero-centred `(1 + w)` norms: 0.2*randn), every
    bias (`.bias` / `_bias` parameters, `e_score_correction_bias` buffers) 0.1*randn, from a generator
    seeded with seed + 7919, in module / parameter order. `extra(model, g)` adds family-specific noise."""
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for _, mod in model.named_modules():
            cls = type(mod).__name__
            if "RMSNorm" in cls:
                w = 0.2 * torch.randn(mod.weight.shape, generator=g)
                mod.weight.copy_(w if cls in ZERO_CENTRED_NORMS else 1.0 + w)
            if hasattr(mod, "e_score_correction_bias") and isinstance(mod.e_score_correction_bias, torch.Tensor):
                mod.e_score_correction_bias.copy_(0.1 * torch.randn(mod.e_score_correction_bias.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith(".bias") or (name.endswith("_bias") and not name.endswith("dt_bias")):
                if name.startswith("model.visual."):
                    continue
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        if extra is not None:
            extra(model, g)
    return model


def top1_gap(x):
    t = torch.topk(x, 2, dim=-1).values
    return (t[..., 0] - t[..., 1]).min().item()


def softmax_gap(mod, inp, out):
    p = torch.softmax(out[0].float(), dim=-1)
    k = mod.top_k
    t = torch.topk(p, k + 1, dim=-1).values
    return {"router": (t[:, k - 1] - t[:, k]).min().item()}


@torch.no_grad()
def evaluate(model, ids_list, spec):
    """Prompt forward, generate (prefill + cached decode) and a full forward over prompt+greedy, with a
    hook on every router collecting the family's selection gaps."""
    gaps = {}

    def hook(mod, inp, out):
        for k, v in spec["gap"](mod, inp, out).items():
            gaps[k] = min(gaps.get(k, float("inf")), v)

    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m).__name__ == spec["router_cls"]]
    assert handles, spec["router_cls"]
    try:
        ids = torch.tensor([ids_list])
        T = ids.shape[1]
        prompt_logits = model(input_ids=ids).logits[0].float()
        gen = model.generate(ids, generation_config=gen_config(), return_dict_in_generate=True, output_logits=True)
        seq = gen.sequences[0]
        step_logits = torch.stack([l[0].float() for l in gen.logits])
        full_logits = model(input_ids=seq[None, :]).logits[0].float()
    finally:
        for h in handles:
            h.remove()
    n = T - 1 + MAX_NEW_TOKENS
    return dict(
        T=T, prompt_logits=prompt_logits, greedy=seq[T:].tolist(),
        greedy_from_full=full_logits[T - 1:n].argmax(-1).tolist(),
        gaps=gaps, min_router_gap=min(gaps.values()),
        min_top1_gap=min(top1_gap(prompt_logits), top1_gap(step_logits), top1_gap(full_logits[:n])),
        decode_vs_full_max_abs=(step_logits - full_logits[T - 1:n]).abs().max().item(),
        prompt_vs_full_max_abs=(prompt_logits - full_logits[:T]).abs().max().item(),
        logits_std=prompt_logits.std().item(),
    )


def acceptable(r):
    return (len(r["greedy"]) == MAX_NEW_TOKENS and r["greedy"] == r["greedy_from_full"]
            and min(r["gaps"].values()) > GAP_MIN and r["min_top1_gap"] > GAP_MIN
            and not any(t < N_SPECIAL for t in r["greedy"]) and len(set(r["greedy"])) >= 3)


def tensor_listing(out_dir):
    listing = {}
    for p in sorted(out_dir.glob("*.safetensors")):
        if p.name in ("gdn_reference.safetensors", "dequantized.safetensors"):
            continue
        with safe_open(str(p), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                listing[k] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype(), "file": p.name}
    return dict(sorted(listing.items()))


def save_tensors(path, tensors):
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def sha256_f32(t):
    return hashlib.sha256(t.detach().float().contiguous().numpy().astype("<f4").tobytes()).hexdigest()


def write_common_files(out_dir):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_SRC / f, out_dir / f)


def realign(model):
    """from_pretrained leaves parameters in the mmapped file (not 64-byte aligned), which changes the f32
    rounding of some CPU matmul paths at the 1e-7 level; fresh copies make the reload bit-comparable."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
        for _, b in model.named_buffers():
            b.data = b.data.clone()
    return model


def reload(spec, out_dir, model=None):
    m = spec["model_cls"].from_pretrained(str(out_dir), dtype=torch.float32, attn_implementation="eager",
                                          experts_implementation="eager").eval()
    if model is not None:
        sd, sd2 = model.state_dict(), m.state_dict()
        assert set(sd) == set(sd2), set(sd) ^ set(sd2)
        for k in sd:
            assert torch.equal(sd[k], sd2[k]), k
    return realign(m)


@torch.no_grad()
def grouped_mm_diff(model, ids_list):
    ids = torch.tensor([ids_list])
    a = model(input_ids=ids).logits
    try:
        model.set_experts_implementation("grouped_mm")
        b = model(input_ids=ids).logits
        return (a - b).abs().max().item()
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return f"grouped_mm unavailable: {type(e).__name__}: {e}"
    finally:
        model.set_experts_implementation("eager")


def choose(spec, tok):
    pids = tok.encode(spec["prompt"]).ids
    tried = []
    for seed in spec["seeds"]:
        model = spec["build"](seed)
        r = evaluate(model, pids, spec)
        ok = acceptable(r)
        extra_ok = True
        if ok and spec.get("also_acceptable"):
            extra_ok, info = spec["also_acceptable"](model, pids, seed)
            r["also"] = info
        tried.append({"seed": seed, **{f"min_{k}_gap": v for k, v in r["gaps"].items()},
                      "min_top1_gap": r["min_top1_gap"], "distinct_greedy": len(set(r["greedy"])),
                      "ok": ok and extra_ok})
        if ok and extra_ok:
            return seed, pids, model, r, tried
    raise SystemExit(f"{spec['name']}: no seed satisfied the gap criteria: {tried}")


def make_fixture(spec, tok):
    name = spec["name"]
    seed, pids, model, r, tried = choose(spec, tok)
    print(f"[{name}] seed={seed} T={r['T']} gaps={ {k: f'{v:.3e}' for k, v in r['gaps'].items()} } "
          f"min_top1_gap={r['min_top1_gap']:.3e} after {len(tried)} candidate(s)")
    out_dir = FIXTURES / f"tiny-{name}"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    write_common_files(out_dir)
    notes = spec["post_save"](model, out_dir) if spec.get("post_save") else {}
    logits = r["prompt_logits"].contiguous().numpy().astype("<f4")
    (out_dir / "reference_logits.f32").write_bytes(logits.tobytes(order="C"))

    # The saved directory reloads to identical logits and greedy tokens.
    reloaded = reload(spec, out_dir, model)
    r2 = evaluate(reloaded, pids, spec)
    assert torch.equal(r2["prompt_logits"], r["prompt_logits"]), f"{name}: reloaded logits differ"
    assert r2["greedy"] == r["greedy"], f"{name}: reloaded greedy differs"
    assert Tokenizer.from_file(str(out_dir / "tokenizer.json")).encode(spec["prompt"]).ids == pids
    extras = spec["extra"](model, out_dir, pids, r) if spec.get("extra") else {}

    ref = {
        "family": spec["family"],
        "architecture": spec["model_cls"].__name__,
        "versions": versions(),
        "seed": seed,
        "generator": "tests/gen_family_fixtures.py",
        "norm_and_bias_noise": spec["noise_note"],
        "hidden_modules": "sys.modules['fla'] = sys.modules['causal_conv1d'] = None (pure-torch paths)",
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "dtype": "float32",
        "prompt_text": spec["prompt"],
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [r["T"], VOCAB_SIZE],
        "greedy_ids": r["greedy"],
        "greedy_text": tok.decode(r["greedy"]),
        "greedy_max_new_tokens": MAX_NEW_TOKENS,
        "greedy_note": "model.generate(prompt_ids, do_sample=False, max_new_tokens=16, eos_token_id=None) with its "
                       "cache (KV / sliding-window KV / conv + recurrent state); new tokens only; equals the argmax "
                       "of a full (uncached) forward over prompt+greedy at every step",
        "min_router_gap": r["min_router_gap"],
        **{f"min_{k}_gap": v for k, v in r["gaps"].items() if k != "router"},
        "min_router_gap_note": spec["gap_note"],
        "min_top1_gap": r["min_top1_gap"],
        "min_top1_gap_note": "min over every prompt position and every greedy step of logit_(1) - logit_(2)",
        "gap_threshold": GAP_MIN,
        "decode_vs_full_forward_max_abs_logit_diff": r["decode_vs_full_max_abs"],
        "prompt_logits_std": r["logits_std"],
        "grouped_mm_vs_eager_experts_max_abs_logit_diff": grouped_mm_diff(model, pids),
        "eos_token_id": 2,
        "special_tokens": {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2},
        "tokenizer": "copied from tests/fixtures/tiny-qwen3_moe (byte-level BPE, vocab 512, ChatML template)",
        "tie_word_embeddings": False,
        **notes,
        **extras,
        "candidates_tried": tried,
        "config": json.loads((out_dir / "config.json").read_text()),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "safetensors_files": sorted(p.name for p in out_dir.glob("model*.safetensors")),
        "tensors": tensor_listing(out_dir),
    }
    from gen_family_fixtures_numpy import numpy_check, transformers_f64_check  # noqa: E402 - sibling module
    ref["independent_numpy_f64_max_abs_logit_diff"] = numpy_check(out_dir, ref)
    ref["transformers_modeling_in_f64_vs_numpy_f64_max_abs_logit_diff"] = transformers_f64_check(out_dir, ref)
    (out_dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"[{name}] wrote {out_dir} ({size / 1e6:.2f} MB, {ref['num_parameters']} params); reload identical; "
          f"decode vs full {r['decode_vs_full_max_abs']:.1e}; numpy f64 {ref['independent_numpy_f64_max_abs_logit_diff']:.1e}; "
          f"transformers-in-f64 vs numpy {ref['transformers_modeling_in_f64_vs_numpy_f64_max_abs_logit_diff']}")
    if spec.get("after"):
        spec["after"](model, out_dir, ref, tok)
    return model, ref


def check_per_expert(saved, model, prefix, names, n_layers_moe):
    """Every saved per-expert 2-D tensor equals its slice of the in-memory fused parameter."""
    checked = 0
    for L, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        I = mlp.experts.intermediate_dim
        for E in range(mlp.experts.num_experts):
            p = f"{prefix}.{L}.{names['block']}.experts.{E}."
            gu = mlp.experts.gate_up_proj[E]
            assert torch.equal(saved[p + names["gate"]], gu[:I])
            assert torch.equal(saved[p + names["up"]], gu[I:])
            assert torch.equal(saved[p + names["down"]], mlp.experts.down_proj[E])
            checked += 1
    assert checked == n_layers_moe * mlp.experts.num_experts, checked
    return checked


# --------------------------------------------------------------------------- qwen2_moe
def build_qwen2_moe(seed):
    cfg = Qwen2MoeConfig(**dict(COMMON, num_hidden_layers=4, moe_intermediate_size=32,
                                shared_expert_intermediate_size=48, intermediate_size=96, num_experts=8,
                                norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True,
                                use_sliding_window=False, rms_norm_eps=1e-6,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return add_noise(Qwen2MoeForCausalLM(cfg).float().eval(), seed)


def post_qwen2_moe(model, out_dir):
    saved = load_file(str(out_dir / "model.safetensors"))
    n = check_per_expert(saved, model, "model.layers", dict(block="mlp", gate="gate_proj.weight",
                                                           up="up_proj.weight", down="down_proj.weight"), 4)
    return {"expert_tensor_layout": {
        "saved_format": "unfused per-expert 2-D tensors (transformers' save mapping for qwen2_moe), as released",
        "router": "model.layers.L.mlp.gate.weight [8, 64]",
        "experts": "model.layers.L.mlp.experts.E.{gate_proj,up_proj}.weight [32, 64], .down_proj.weight [64, 32]",
        "shared_expert": "model.layers.L.mlp.shared_expert.{gate_proj,up_proj}.weight [48, 64], "
                         ".down_proj.weight [64, 48]; model.layers.L.mlp.shared_expert_gate.weight [1, 64]",
        "verified_slices": n}}


QWEN2_MOE = dict(
    name="qwen2_moe", family="qwen2_moe", model_cls=Qwen2MoeForCausalLM, build=build_qwen2_moe,
    router_cls="Qwen2MoeTopKRouter", gap=softmax_gap, prompt=PROMPT_ROUTER, seeds=range(4000, 4200),
    post_save=post_qwen2_moe,
    noise_note="after init: every RMSNorm weight = 1 + 0.2*randn, every bias (q/k/v) = 0.1*randn "
               "(torch.Generator seeded with seed+7919)",
    gap_note="min over every router call (prompt forward, generate prefill and decode steps, full forward over "
             "prompt+greedy) of p_(k) - p_(k+1), p = softmax(router_logits) sorted descending, k = top_k",
)


# --------------------------------------------------------------------------- glm4_moe
def glm_gap(mod, inp, out):
    scores = out[0].float().sigmoid()
    choice = scores + mod.e_score_correction_bias
    ng, tg, k, ne = mod.num_group, mod.topk_group, mod.top_k, mod.num_experts
    gs = choice.view(-1, ng, ne // ng).topk(2, dim=-1)[0].sum(-1)
    gtop = gs.topk(tg + 1, dim=-1).values
    keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1).bool()
    mask = keep.unsqueeze(-1).expand(-1, ng, ne // ng).reshape(-1, ne)
    top = choice.masked_fill(~mask, float("-inf")).topk(k + 1, dim=-1).values
    return {"router": (top[:, k - 1] - top[:, k]).min().item(), "group": (gtop[:, tg - 1] - gtop[:, tg]).min().item()}


def build_glm4_moe(seed):
    cfg = Glm4MoeConfig(**dict(COMMON, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32,
                               n_routed_experts=8, n_shared_experts=1, n_group=4, topk_group=2,
                               routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                               use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5, num_nextn_predict_layers=1,
                               partial_rotary_factor=0.5,
                               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                "partial_rotary_factor": 0.5}))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return add_noise(Glm4MoeForCausalLM(cfg).float().eval(), seed)


def post_glm4_moe(model, out_dir):
    """Add a stand-in MTP layer at index num_hidden_layers (GLM-4.5 releases ship one at model.layers.92 /
    model.layers.46: a full decoder layer plus eh_proj / enorm / hnorm / shared_head.norm) that the engine
    must skip. transformers only ignores layers 46 / 92 by name; here it is reported as unexpected and
    dropped, and the reload check below shows it has no effect."""
    path = out_dir / "model.safetensors"
    saved = load_file(str(path))
    n = check_per_expert(saved, model, "model.layers", dict(block="mlp", gate="gate_proj.weight",
                                                           up="up_proj.weight", down="down_proj.weight"), 3)
    L = model.config.num_hidden_layers
    g = torch.Generator().manual_seed(31337)
    H = model.config.hidden_size
    mtp = {}
    for k, v in saved.items():
        if k.startswith(f"model.layers.{L - 1}."):
            mtp[k.replace(f"model.layers.{L - 1}.", f"model.layers.{L}.")] = 0.05 * torch.randn(v.shape, generator=g)
    mtp[f"model.layers.{L}.eh_proj.weight"] = 0.05 * torch.randn(H, 2 * H, generator=g)
    for nm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"model.layers.{L}.{nm}.weight"] = torch.ones(H)
    saved.update(mtp)
    save_tensors(path, saved)
    return {"mtp_stand_in": f"model.layers.{L}.* ({len(mtp)} tensors, random): an MTP layer past num_hidden_layers "
                            "as in GLM-4.5 releases (num_nextn_predict_layers = 1); the engine must ignore it",
            "expert_tensor_layout": {
                "saved_format": "unfused per-expert 2-D tensors (qwen2_moe save mapping), as released",
                "router": "model.layers.L.mlp.gate.weight [8, 64] + model.layers.L.mlp.gate.e_score_correction_bias [8]",
                "experts": "model.layers.L.mlp.experts.E.{gate_proj,up_proj}.weight [32, 64], .down_proj.weight [64, 32]",
                "shared_experts": "model.layers.L.mlp.shared_experts.{gate,up}_proj.weight [32, 64], down_proj [64, 32]",
                "dense_layer_0": "model.layers.0.mlp.{gate,up}_proj.weight [96, 64], down_proj.weight [64, 96]",
                "verified_slices": n}}


GLM4_MOE = dict(
    name="glm4_moe", family="glm4_moe", model_cls=Glm4MoeForCausalLM, build=build_glm4_moe,
    router_cls="Glm4MoeTopkRouter", gap=glm_gap, prompt=PROMPT_SHORT, seeds=range(5000, 5400),
    post_save=post_glm4_moe,
    noise_note="after init: every RMSNorm weight (input, post-attention, q/k norm, final) = 1 + 0.2*randn, "
               "every e_score_correction_bias and q/k/v bias = 0.1*randn (torch.Generator seeded with seed+7919)",
    gap_note="min over every router call of the k-th minus (k+1)-th of sigmoid(logits) + e_score_correction_bias "
             "among the experts of the kept groups; min_group_gap: the topk_group-th minus the next group score "
             "(sum of a group's top-2 biased scores)",
)


# --------------------------------------------------------------------------- minimax_m2
def minimax_gap(mod, inp, out):
    choice = out[0].float().sigmoid() + inp[1]
    k = mod.top_k
    t = torch.topk(choice, k + 1, dim=-1).values
    return {"router": (t[:, k - 1] - t[:, k]).min().item()}


def build_minimax_m2(seed):
    # Release config key names (MiniMaxAI/MiniMax-M2 config.json) where the class keeps them: rotary_dim is
    # read by convert_rope_params_to_dict (-> partial_rotary_factor), the others are stored verbatim.
    cfg = MiniMaxM2Config(**dict(COMMON, num_hidden_layers=4, intermediate_size=32, num_local_experts=8,
                                 rms_norm_eps=1e-6, rotary_dim=8, rope_theta=5000000.0, scoring_func="sigmoid",
                                 use_routing_bias=True, use_qk_norm=True, qk_norm_type="per_layer",
                                 shared_intermediate_size=0, attn_type_list=[1, 1, 1, 1]))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return add_noise(MiniMaxM2ForCausalLM(cfg).float().eval(), seed)


def post_minimax_m2(model, out_dir):
    saved = load_file(str(out_dir / "model.safetensors"))
    n = check_per_expert(saved, model, "model.layers", dict(block="block_sparse_moe", gate="w1.weight",
                                                           up="w3.weight", down="w2.weight"), 4)
    cfg = model.config
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5
    return {"expert_tensor_layout": {
        "saved_format": "unfused per-expert tensors with the release names (mixtral save mapping)",
        "router": "model.layers.L.block_sparse_moe.gate.weight [8, 64] + "
                  "model.layers.L.block_sparse_moe.e_score_correction_bias [8]",
        "experts": "model.layers.L.block_sparse_moe.experts.E.w1.weight (gate) [32, 64], w3 (up) [32, 64], "
                   "w2 (down) [64, 32]",
        "verified_slices": n},
        "config_note": "rotary_dim 8 (release key) -> rope_parameters.partial_rotary_factor 0.5; rope_theta folded into "
                       "rope_parameters by transformers 5 (releases have it top-level)"}


MINIMAX_M2 = dict(
    name="minimax_m2", family="minimax_m2", model_cls=MiniMaxM2ForCausalLM, build=build_minimax_m2,
    router_cls="MiniMaxM2TopKRouter", gap=minimax_gap, prompt=PROMPT_SHORT, seeds=range(6000, 6400),
    post_save=post_minimax_m2,
    noise_note="after init: every RMSNorm weight (input, post-attention, q_norm [64], k_norm [32], final) = "
               "1 + 0.2*randn, every e_score_correction_bias = 0.1*randn (torch.Generator seeded with seed+7919)",
    gap_note="min over every router call of the k-th minus (k+1)-th of sigmoid(logits) + e_score_correction_bias",
)


# --------------------------------------------------------------------------- gpt_oss
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def gpt_oss_gap(mod, inp, out):
    k = mod.top_k
    t = torch.topk(out[0].float(), k + 1, dim=-1).values
    return {"router": (t[:, k - 1] - t[:, k]).min().item()}


def gpt_oss_extra_noise(model, g):
    for layer in model.model.layers:
        # Sinks N(0, 1) so they take a real share of the softmax; gate_up weights N(0, 0.5^2) so that
        # gate/up pre-activations (std ~4) cross the +-7 clamp for a few percent of the entries.
        layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=g))
        layer.mlp.experts.gate_up_proj.copy_(0.5 * torch.randn(layer.mlp.experts.gate_up_proj.shape, generator=g))


def build_gpt_oss(seed):
    cfg = GptOssConfig(**dict(COMMON, num_hidden_layers=4, intermediate_size=32, num_local_experts=8,
                              sliding_window=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                              attention_bias=True, swiglu_limit=7.0, rope_parameters=dict(GPT_OSS_ROPE)))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return add_noise(GptOssForCausalLM(cfg).float().eval(), seed, gpt_oss_extra_noise)


@torch.no_grad()
def gpt_oss_extra(model, out_dir, pids, r):
    """Clamp statistics of the SwiGLU and the rotary tables actually used."""
    stats = {"n": 0, "gate_above": 0, "up_outside": 0}
    cls = type(model.model.layers[0].mlp.experts)
    orig = cls._apply_gate

    def spy(self, gate_up):
        stats["n"] += gate_up[..., ::2].numel()
        stats["gate_above"] += (gate_up[..., ::2] > self.limit).sum().item()
        stats["up_outside"] += (gate_up[..., 1::2].abs() > self.limit).sum().item()
        return orig(self, gate_up)

    cls._apply_gate = spy
    try:
        model(input_ids=torch.tensor([pids]))
    finally:
        cls._apply_gate = orig
    rot = model.model.rotary_emb
    return {"swiglu_clamp_stats_prompt": {"gate_entries": stats["n"], "gate_above_limit": stats["gate_above"],
                                          "up_outside_limit": stats["up_outside"]},
            "rope_inv_freq": [float(x) for x in rot.inv_freq],
            "rope_attention_scaling": float(rot.attention_scaling),
            "layer_types": list(model.config.layer_types),
            "sliding_window_note": "sliding layers: query i sees keys j with i - 8 < j <= i (8 keys incl. itself); "
                                   "the prompt is longer than 8 so the window is crossed",
            "expert_tensor_layout": {
                "saved_format": "fused, as transformers holds them (the dequantised layout of the release): "
                                "gate_up_proj [E, H, 2I] multiplied as x @ W (input-major), columns interleaved "
                                "gate0, up0, gate1, up1, ...; down_proj [E, I, H] as x @ W; biases [E, 2I] / [E, H]",
                "router": "model.layers.L.mlp.router.weight [8, 64] + .bias [8]",
                "experts": "model.layers.L.mlp.experts.{gate_up_proj [8, 64, 64], gate_up_proj_bias [8, 64], "
                           "down_proj [8, 32, 64], down_proj_bias [8, 64]}",
                "sinks": "model.layers.L.self_attn.sinks [4] (one logit per query head)"}}


def gpt_oss_after(model, out_dir, ref, tok):
    from gen_family_fixtures_mxfp4 import make_mxfp4_fixture  # noqa: E402
    make_mxfp4_fixture(model, out_dir, ref, tok)


def gpt_oss_also(model, pids, seed):
    from gen_family_fixtures_mxfp4 import mxfp4_acceptable  # noqa: E402
    return mxfp4_acceptable(model, pids, GPT_OSS)


GPT_OSS = dict(
    name="gpt_oss", family="gpt_oss", model_cls=GptOssForCausalLM, build=build_gpt_oss,
    router_cls="GptOssTopKRouter", gap=gpt_oss_gap, prompt=PROMPT_SHORT, seeds=range(7000, 7400),
    extra=gpt_oss_extra, after=gpt_oss_after, also_acceptable=gpt_oss_also,
    noise_note="after init: every RMSNorm weight = 1 + 0.2*randn, every bias (q/k/v/o, router, expert "
               "gate_up_proj_bias / down_proj_bias) = 0.1*randn, then per layer sinks = randn and expert "
               "gate_up_proj = 0.5*randn (torch.Generator seeded with seed+7919)",
    gap_note="min over every router call of the k-th minus (k+1)-th router logit (x @ W^T + b; selection is top-k "
             "of the logits, the weights are softmax over the k selected logits); also required of the MXFP4 "
             "fixture's dequantised model",
)

SPECS = {"qwen2_moe": [QWEN2_MOE], "glm4_moe": [GLM4_MOE], "minimax_m2": [MINIMAX_M2], "gpt_oss": [GPT_OSS]}


def main():
    sys.path.insert(0, str(HERE))
    from gen_family_fixtures_gdn import GDN_SPECS  # noqa: E402
    specs = dict(SPECS, **GDN_SPECS)
    tok = tokenizer()
    names = sys.argv[1:] or list(specs)
    for n in names:
        for spec in specs[n]:
            make_fixture(spec, tok)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import gen_family_fixtures  # one module instance for this file and its siblings

    gen_family_fixtures.main()
