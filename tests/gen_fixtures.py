#!/usr/bin/env python3
"""Generate the reference fixtures that WASTE's oracle tests compare against.

Purpose
-------
For each of three mixture-of-experts families -- qwen3_moe (Qwen3MoeForCausalLM),
olmoe (OlmoeForCausalLM) and mixtral (MixtralForCausalLM) -- build a tiny, randomly
initialised model with HuggingFace `transformers`, save it as a normal HF checkpoint
(config.json + safetensors) together with a tiny byte-level BPE tokenizer, and record
what the PyTorch reference computes on one prompt:

  * the logits at every prompt position (raw little-endian f32, row-major [T, V]),
  * the 16 greedily generated tokens,
  * the smallest router-probability gap (k-th vs (k+1)-th expert) and the smallest
    top-1 vs top-2 logit gap seen at any position / layer / greedy step.  Both are
    required to exceed GAP_MIN (1e-4); prompts and seeds are tried in a fixed order
    until they do, so a correct f32 engine can never legitimately pick a different
    expert or token than the reference.

How to run
----------
    python3 tests/gen_fixtures.py            # from the repository root (or anywhere)

Run by hand, never by CI.  It needs torch, transformers, tokenizers, safetensors and
numpy, no network (HF_HUB_OFFLINE=1 is forced), and runs on CPU in well under a minute.
It is deterministic: torch.manual_seed, torch.set_num_threads(1), float32, eager
attention.  Re-running with the same versions reproduces the files bit for bit (the
tokenizer training is deterministic too).

Checks it makes before writing reference.json: the saved directory reloads with
from_pretrained and reproduces the logits exactly (torch.equal) and the greedy ids; the
tokenizer reloads (tokenizers and AutoTokenizer) and re-encodes the prompt identically;
every saved per-expert tensor equals its slice of the in-memory fused expert parameter;
and an independent float64 numpy re-implementation of the math described in
tests/fixtures/README.md, reading only config.json + safetensors, matches the reference
logits (max |diff| ~1.5e-6, recorded) and the greedy ids.

Versions used to produce the committed fixtures
-----------------------------------------------
    torch 2.15.0+cu132 (run on CPU), transformers 5.24.0, tokenizers 0.23.3,
    safetensors 0.8.0, Python 3.11.7
(the exact versions are also written into every reference.json).

What it writes (and nothing else)
---------------------------------
    tests/fixtures/tiny-qwen3_moe/   model.safetensors (1 file)
    tests/fixtures/tiny-olmoe/       model.safetensors (1 file, tie_word_embeddings=True,
                                     so there is no lm_head.weight tensor)
    tests/fixtures/tiny-mixtral/     model-0000N-of-0000M.safetensors + model.safetensors.index.json
each directory also gets:
    config.json, generation_config.json   (written by save_pretrained)
    tokenizer.json, tokenizer_config.json (byte-level BPE, ChatML template, eos <|im_end|>)
    reference.json                        (prompt, ids, greedy ids, gaps, config, tensors...)
    reference_logits.f32                  (prompt logits, little-endian f32 [T, V])
The fixture directories are wiped and rewritten.  tests/fixtures/README.md is written by
hand (the section describing these fixtures), not by this script.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only: reproducible

import json
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

FIXTURES = Path(__file__).resolve().parent / "fixtures"

GAP_MIN = 1e-4          # required lower bound for both gaps
MAX_NEW_TOKENS = 16
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the tokenizer (English and Italian, written here so that no
# download is needed).
CORPUS = """
The old lighthouse stands at the end of the harbour, and every evening the keeper climbs
the spiral stairs to light the lamp. Ships that pass in the night see the beam sweep across
the water and know that the rocks are near. In winter the wind is cold and the sea is grey,
but in summer the children of the town swim in the bay and eat ice cream on the pier.
The keeper writes a letter to his daughter every Sunday. He tells her about the weather,
the boats, the birds that nest on the cliffs, and the books he reads by the light of the lamp.
She lives in the city now, where she works as an engineer and builds machines that think.
She writes back about trains, computers, long meetings and the small garden on her balcony.
A mixture of experts is a model in which a router sends every token to a few specialists.
Each expert is a small network; the router chooses the best two and mixes their answers.
Attention lets every token look back at the tokens before it, and the cache remembers them.
The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the field.
Numbers matter too: one, two, three, four, five, six, seven, eight, nine, ten, twenty, 2024.

Il vecchio faro si trova alla fine del porto, e ogni sera il guardiano sale le scale a
chiocciola per accendere la lampada. Le navi che passano nella notte vedono la luce sul
mare e sanno che gli scogli sono vicini. D'inverno il vento e' freddo e il mare e' grigio,
ma d'estate i bambini del paese nuotano nella baia e mangiano il gelato sul molo.
Il guardiano scrive una lettera a sua figlia ogni domenica. Le racconta del tempo, delle
barche, degli uccelli che fanno il nido sulle scogliere e dei libri che legge la sera.
Lei vive in citta' adesso, dove lavora come ingegnera e costruisce macchine che pensano.
Gli risponde parlando di treni, di computer, di lunghe riunioni e del piccolo giardino sul
balcone. Una miscela di esperti e' un modello in cui un router manda ogni parola a pochi
specialisti. Ogni esperto e' una piccola rete; il router sceglie i due migliori e ne mescola
le risposte. L'attenzione permette a ogni parola di guardare le parole precedenti.
La volpe veloce salta sopra il cane pigro mentre il contadino conta le pecore nel campo.
Buongiorno, come stai? Sto bene, grazie. Oggi il cielo e' sereno e il caffe' e' buono.
Uno, due, tre, quattro, cinque, sei, sette, otto, nove, dieci, venti, cento, mille.
"""

# Candidate prompts, tried in this order (only those encoding to 20..32 tokens are used).
PROMPTS = [
    "The keeper of the old lighthouse writes to his daughter about boats and birds.",
    "Ogni domenica il guardiano del faro scrive una lettera alla figlia che vive in citta'.",
    "A router sends every token to two experts; attention looks back at the cache.",
    "In summer the children swim in the bay and eat ice cream on the pier.",
    "Buongiorno! The router picks two experts for every token, poi mescola le risposte.",
    "She builds machines that think; he reads books by the light of the lamp.",
]
SEEDS = list(range(1000, 1100))


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [l for l in CORPUS.strip().split("\n")]
    tok.train_from_iterator(lines, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i
    return tok


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 512,
    "chat_template": CHAT_TEMPLATE,
}


# --------------------------------------------------------------------------- families
COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    max_position_embeddings=512,
    num_experts_per_tok=2,
    initializer_range=0.08,
    pad_token_id=0,          # <|endoftext|>
    bos_token_id=None,
    eos_token_id=2,          # <|im_end|>
)

FAMILIES = {
    "qwen3_moe": dict(
        config_cls=Qwen3MoeConfig,
        model_cls=Qwen3MoeForCausalLM,
        config=dict(
            COMMON,
            num_hidden_layers=4,
            intermediate_size=96,          # dense MLP of layer 0
            moe_intermediate_size=32,
            num_experts=8,
            mlp_only_layers=[0],
            decoder_sparse_step=1,
            norm_topk_prob=True,
            attention_bias=True,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        ),
        max_shard_size=None,
    ),
    "olmoe": dict(
        config_cls=OlmoeConfig,
        model_cls=OlmoeForCausalLM,
        config=dict(
            COMMON,
            num_hidden_layers=3,
            intermediate_size=48,          # expert width
            num_experts=8,
            # norm_topk_prob left at its default (False), attention_bias default (False),
            # clip_qkv default (None)
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        ),
        max_shard_size=None,
    ),
    "mixtral": dict(
        config_cls=MixtralConfig,
        model_cls=MixtralForCausalLM,
        config=dict(
            COMMON,
            num_hidden_layers=4,
            intermediate_size=40,          # expert width
            num_local_experts=8,
            rms_norm_eps=1e-5,
            sliding_window=None,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
        ),
        max_shard_size="500KB",            # -> several shards + model.safetensors.index.json
    ),
}

# Where the saved (unfused, per-expert) tensors live, and which in-memory slice they are.
EXPERT_NAMES = {
    "qwen3_moe": dict(prefix="model.layers.{L}.mlp", router="gate.weight",
                      gate="experts.{E}.gate_proj.weight", up="experts.{E}.up_proj.weight",
                      down="experts.{E}.down_proj.weight"),
    "olmoe": dict(prefix="model.layers.{L}.mlp", router="gate.weight",
                  gate="experts.{E}.gate_proj.weight", up="experts.{E}.up_proj.weight",
                  down="experts.{E}.down_proj.weight"),
    "mixtral": dict(prefix="model.layers.{L}.block_sparse_moe", router="gate.weight",
                    gate="experts.{E}.w1.weight", up="experts.{E}.w3.weight",
                    down="experts.{E}.w2.weight"),
}


def build_model(fam: str, seed: int):
    spec = FAMILIES[fam]
    cfg = spec["config_cls"](**spec["config"])
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = spec["model_cls"](cfg)
    model = model.to(torch.float32).eval()
    # Seeded noise on every RMSNorm weight and every bias, so that an engine that
    # ignores them (or applies them to the wrong axis) fails the comparison.
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.weight.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def router_modules(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]


def gen_config():
    return GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, do_sample=False, num_beams=1,
        eos_token_id=None, pad_token_id=0, bos_token_id=None,
        temperature=None, top_p=None, top_k=None,
    )


@torch.no_grad()
def evaluate(model, prompt_ids, top_k):
    """Run prompt forward, greedy generation and a full forward over prompt+greedy,
    with hooks on every router.  Returns a dict of results (tensors) and gaps."""
    router_gaps = []  # (gap, module name)

    def make_hook(name):
        def hook(mod, inp, out):
            logits = out[0].float()
            probs = torch.softmax(logits, dim=-1)
            top = torch.topk(probs, top_k + 1, dim=-1).values
            gap = (top[:, top_k - 1] - top[:, top_k]).min().item()
            router_gaps.append((gap, name))
        return hook

    handles = [m.register_forward_hook(make_hook(n)) for n, m in router_modules(model)]
    try:
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        T = ids.shape[1]
        prompt_logits = model(input_ids=ids).logits[0].float()            # [T, V]
        gen = model.generate(ids, generation_config=gen_config(),
                             return_dict_in_generate=True, output_logits=True)
        seq = gen.sequences[0]
        new = seq[T:].tolist()
        step_logits = torch.stack([l[0].float() for l in gen.logits])      # [16, V]
        full_logits = model(input_ids=seq[None, :]).logits[0].float()      # [T+16, V]
    finally:
        for h in handles:
            h.remove()

    def top1_gap(x):
        t = torch.topk(x, 2, dim=-1).values
        return (t[..., 0] - t[..., 1]).min().item()

    greedy_from_full = full_logits[T - 1:T - 1 + MAX_NEW_TOKENS].argmax(-1).tolist()
    return dict(
        T=T,
        prompt_logits=prompt_logits,
        greedy=new,
        greedy_from_full=greedy_from_full,
        min_router_gap=min(g for g, _ in router_gaps),
        n_router_calls=len(router_gaps),
        min_top1_gap=min(top1_gap(prompt_logits), top1_gap(step_logits),
                         top1_gap(full_logits[:T - 1 + MAX_NEW_TOKENS])),
        decode_vs_full_max_abs=(step_logits - full_logits[T - 1:T - 1 + MAX_NEW_TOKENS]).abs().max().item(),
        prompt_vs_full_max_abs=(prompt_logits - full_logits[:T]).abs().max().item(),
        logits_std=prompt_logits.std().item(),
    )


def acceptable(r):
    return (
        len(r["greedy"]) == MAX_NEW_TOKENS
        and r["greedy"] == r["greedy_from_full"]
        and r["min_router_gap"] > GAP_MIN
        and r["min_top1_gap"] > GAP_MIN
        and not any(t < len(SPECIAL_TOKENS) for t in r["greedy"])   # no special token generated
        and len(set(r["greedy"])) >= 3                               # not a degenerate loop
    )


def tensor_listing(out_dir: Path):
    files = sorted(p.name for p in out_dir.glob("*.safetensors"))
    listing = {}
    for fn in files:
        with safe_open(str(out_dir / fn), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                listing[k] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype(), "file": fn}
    return dict(sorted(listing.items()))


def load_saved(out_dir: Path):
    tensors = {}
    for p in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(p), "pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
    return tensors


def expert_layout(fam, model, out_dir, cfg):
    """Check how the experts were saved against the in-memory (fused) parameters and
    describe the layout for the engine's converter."""
    saved = load_saved(out_dir)
    names = EXPERT_NAMES[fam]
    fused_saved = any("gate_up_proj" in k for k in saved)
    assert not fused_saved, "saved checkpoint uses fused expert tensors; update the layout code"
    n_exp = cfg.num_local_experts if fam == "mixtral" else cfg.num_experts
    moe_layers = []
    for L, layer in enumerate(model.model.layers):
        mlp = layer.block_sparse_moe if fam == "mixtral" and hasattr(layer, "block_sparse_moe") else layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        moe_layers.append(L)
        I = mlp.experts.intermediate_dim
        pre = names["prefix"].format(L=L)
        assert torch.equal(saved[f"{pre}.{names['router']}"], mlp.gate.weight)
        for E in range(n_exp):
            gu = mlp.experts.gate_up_proj[E]
            assert torch.equal(saved[f"{pre}.{names['gate'].format(E=E)}"], gu[:I])
            assert torch.equal(saved[f"{pre}.{names['up'].format(E=E)}"], gu[I:])
            assert torch.equal(saved[f"{pre}.{names['down'].format(E=E)}"], mlp.experts.down_proj[E])
    H = cfg.hidden_size
    I = FAMILIES[fam]["config"]["moe_intermediate_size" if fam == "qwen3_moe" else "intermediate_size"]
    pre = names["prefix"]
    return {
        "saved_format": "unfused: one 2-D tensor per expert and projection "
                        "(transformers 5 reverts its in-memory fusion on save_pretrained)",
        "moe_layers": moe_layers,
        "num_experts": n_exp,
        "router": {"name": f"{pre}.{names['router']}", "shape": [n_exp, H],
                   "math": "router_logits = h @ W^T"},
        "gate": {"name": f"{pre}.{names['gate']}", "shape": [I, H], "math": "g = h @ W^T"},
        "up": {"name": f"{pre}.{names['up']}", "shape": [I, H], "math": "u = h @ W^T"},
        "down": {"name": f"{pre}.{names['down']}", "shape": [H, I],
                 "math": "y = (silu(g) * u) @ W^T"},
        "in_memory_fused_transformers_5": {
            "gate_up_proj": [n_exp, 2 * I, H],
            "gate_up_proj_packing": "rows [0, I) = gate, rows [I, 2I) = up (chunk(2, dim=-1) of the "
                                    "linear output: first half gate, second half up)",
            "down_proj": [n_exp, H, I],
            "verified": "every saved per-expert tensor equals the corresponding slice (torch.equal)",
        },
    }


def chat_example(hf_tok):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Ciao! What is a mixture of experts?"},
    ]
    rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf_tok(rendered, add_special_tokens=False)["input_ids"]
    return {"messages": messages, "add_generation_prompt": True, "rendered": rendered, "ids": ids}


def numpy_check(fam: str, out_dir: Path, ref: dict):
    """Independent float64 numpy re-implementation of the math documented in
    tests/fixtures/README.md, reading only the saved files (config.json + safetensors).
    Returns max |logits - reference| over the prompt; asserts greedy agreement."""
    from safetensors.numpy import load_file
    cfg = json.loads((out_dir / "config.json").read_text())
    W = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        W.update(load_file(str(f)))
    W = {k: v.astype(np.float64) for k, v in W.items()}
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, k = cfg["rms_norm_eps"], cfg["num_experts_per_tok"]
    theta = cfg["rope_parameters"]["rope_theta"]
    renorm = True if fam == "mixtral" else cfg["norm_topk_prob"]
    names = EXPERT_NAMES[fam]

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def lin(x, n):
        y = x @ W[n + ".weight"].T
        return y + W[n + ".bias"] if n + ".bias" in W else y

    def silu(z):
        return z / (1.0 + np.exp(-z))

    ids = ref["prompt_ids"] + ref["greedy_ids"]
    T = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None]
    ang = np.concatenate([ang, ang], -1)                       # rotate_half convention
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rope(q):
        rh = np.concatenate([-q[..., hd // 2:], q[..., :hd // 2]], -1)
        return q * cos + rh * sin

    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q, kk, v = (lin(h, p + f"self_attn.{n}_proj") for n in "qkv")
        if fam == "olmoe":                                     # norm over the whole projection
            q, kk = rms(q, W[p + "self_attn.q_norm.weight"]), rms(kk, W[p + "self_attn.k_norm.weight"])
        q, kk, v = q.reshape(T, nh, hd), kk.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if fam == "qwen3_moe":                                 # per-head norm
            q, kk = rms(q, W[p + "self_attn.q_norm.weight"]), rms(kk, W[p + "self_attn.k_norm.weight"])
        q, kk = rope(q), rope(kk)
        out = np.zeros((T, nh, hd))
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ kk[:, g].T / np.sqrt(hd) + mask
            a = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (a / a.sum(-1, keepdims=True)) @ v[:, g]
        x = x + lin(out.reshape(T, nh * hd), p + "self_attn.o_proj")
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        mp = names["prefix"].format(L=L)
        if f"{mp}.{names['router']}" not in W:                  # dense SwiGLU layer
            y = lin(silu(lin(h, mp + ".gate_proj")) * lin(h, mp + ".up_proj"), mp + ".down_proj")
        else:
            lg = h @ W[f"{mp}.{names['router']}"].T
            pr = np.exp(lg - lg.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            y = np.zeros_like(h)
            for t in range(T):
                sel = np.argsort(-pr[t], kind="stable")[:k]
                w = pr[t, sel] / (pr[t, sel].sum() if renorm else 1.0)
                for wj, e in zip(w, sel):
                    g_ = h[t] @ W[f"{mp}.{names['gate'].format(E=e)}"].T
                    u_ = h[t] @ W[f"{mp}.{names['up'].format(E=e)}"].T
                    y[t] += wj * ((silu(g_) * u_) @ W[f"{mp}.{names['down'].format(E=e)}"].T)
        x = x + y
    x = rms(x, W["model.norm.weight"])
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    logits = x @ head.T
    Tp = len(ref["prompt_ids"])
    refl = np.fromfile(out_dir / "reference_logits.f32", dtype="<f4").reshape(ref["logits_shape"])
    assert logits[Tp - 1:Tp - 1 + MAX_NEW_TOKENS].argmax(-1).tolist() == ref["greedy_ids"]
    diff = float(np.abs(logits[:Tp] - refl).max())
    assert diff < 1e-4, diff
    return diff


def make_fixture(fam: str, tok: Tokenizer):
    spec = FAMILIES[fam]
    out_dir = FIXTURES / f"tiny-{fam}"
    prompts = [(p, tok.encode(p).ids) for p in PROMPTS]
    prompts = [(p, ids) for p, ids in prompts if 20 <= len(ids) <= 32]
    assert prompts, "no prompt encodes to 20..32 tokens"

    chosen = None
    tried = []
    for seed in SEEDS:
        for ptext, pids in prompts:
            model = build_model(fam, seed)
            r = evaluate(model, pids, model.config.num_experts_per_tok)
            tried.append({"seed": seed, "prompt_index": PROMPTS.index(ptext),
                          "min_router_gap": r["min_router_gap"], "min_top1_gap": r["min_top1_gap"],
                          "distinct_greedy": len(set(r["greedy"])), "ok": acceptable(r)})
            if acceptable(r):
                chosen = (seed, ptext, pids, model, r)
                break
        if chosen:
            break
    assert chosen, f"{fam}: no seed/prompt satisfied the gap criteria: {tried}"
    seed, ptext, pids, model, r = chosen
    print(f"[{fam}] seed={seed} T={r['T']} min_router_gap={r['min_router_gap']:.3e} "
          f"min_top1_gap={r['min_top1_gap']:.3e} logits_std={r['logits_std']:.3f} "
          f"after {len(tried)} candidate(s)")

    # ---- save
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    kw = {}
    if spec["max_shard_size"]:
        kw["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(out_dir, **kw)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    logits = r["prompt_logits"].contiguous().numpy().astype("<f4")
    (out_dir / "reference_logits.f32").write_bytes(logits.tobytes(order="C"))

    # ---- reload checks
    hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
    assert hf_tok(ptext, add_special_tokens=False)["input_ids"] == pids
    assert Tokenizer.from_file(str(out_dir / "tokenizer.json")).encode(ptext).ids == pids
    assert hf_tok.eos_token_id == 2 and hf_tok.bos_token_id is None
    reloaded = spec["model_cls"].from_pretrained(str(out_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    r2 = evaluate(reloaded, pids, reloaded.config.num_experts_per_tok)
    assert torch.equal(r2["prompt_logits"], r["prompt_logits"]), "reloaded logits differ"
    assert r2["greedy"] == r["greedy"], "reloaded greedy differs"
    on_disk = np.fromfile(out_dir / "reference_logits.f32", dtype="<f4").reshape(r["T"], VOCAB_SIZE)
    assert np.array_equal(on_disk, r["prompt_logits"].numpy())

    cfg = model.config
    tensors = tensor_listing(out_dir)
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in tensors
    else:
        assert "lm_head.weight" in tensors
    layout = expert_layout(fam, model, out_dir, cfg)

    ref = {
        "family": fam,
        "architecture": spec["model_cls"].__name__,
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
        },
        "seed": seed,
        "norm_and_bias_noise": "after init: every RMSNorm weight = 1 + 0.2*randn, every bias = "
                               "0.1*randn (torch.Generator seeded with seed+7919)",
        "attn_implementation": "eager",
        "dtype": "float32",
        "prompt_text": ptext,
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [r["T"], VOCAB_SIZE],
        "greedy_ids": r["greedy"],
        "greedy_text": tok.decode(r["greedy"]),
        "greedy_max_new_tokens": MAX_NEW_TOKENS,
        "greedy_note": "model.generate(prompt_ids, do_sample=False, max_new_tokens=16, eos_token_id=None); "
                       "new tokens only; equals argmax of a full forward over prompt+greedy at every step",
        "min_router_gap": r["min_router_gap"],
        "min_router_gap_note": "min over every router call (prompt forward, generate prefill and decode "
                               "steps, full forward over prompt+greedy), every position and MoE layer, of "
                               "p_(k) - p_(k+1) where p = softmax(router_logits) sorted descending, k = top_k",
        "min_top1_gap": r["min_top1_gap"],
        "min_top1_gap_note": "min over every prompt position and every greedy step of logit_(1) - logit_(2)",
        "gap_threshold": GAP_MIN,
        "decode_vs_full_forward_max_abs_logit_diff": r["decode_vs_full_max_abs"],
        "prompt_logits_std": r["logits_std"],
        "eos_token_id": 2,
        "special_tokens": {s: i for i, s in enumerate(SPECIAL_TOKENS)},
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "chat_example": chat_example(hf_tok),
        "candidates_tried": tried,
        "config": json.loads((out_dir / "config.json").read_text()),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "safetensors_files": sorted(p.name for p in out_dir.glob("*.safetensors")),
        "expert_tensor_layout": layout,
        "tensors": tensors,
    }
    ref["independent_numpy_f64_max_abs_logit_diff"] = numpy_check(fam, out_dir, ref)
    (out_dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"[{fam}] wrote {out_dir} ({size / 1e6:.2f} MB, {ref['num_parameters']} params, "
          f"{len(ref['safetensors_files'])} safetensors file(s)); reload reproduces logits exactly; "
          f"numpy f64 re-implementation max |diff| {ref['independent_numpy_f64_max_abs_logit_diff']:.2e}")


def main():
    tok = train_tokenizer()
    tok2 = train_tokenizer()
    assert tok.to_str() == tok2.to_str(), "tokenizer training is not deterministic"
    fams = sys.argv[1:] or list(FAMILIES)
    for fam in fams:
        make_fixture(fam, tok)


if __name__ == "__main__":
    main()
