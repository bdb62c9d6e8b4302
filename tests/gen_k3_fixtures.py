#!/usr/bin/env python3
"""Writes tests/fixtures/tiny-kimi_k3: a tiny Kimi K3 text model and its reference outputs.

transformers has no kimi_k3 class, so the reference is a pure-torch implementation written
from ../shared/design/K3.md (sections 2-7): AttnRes (bank of block snapshots, per-layer mixes
before attention and MLP, output mix), SiTU everywhere, latent routed experts with an RMSNorm
on the weighted sum, sigmoid router with a selection-only bias, KDA with the bounded decay gate
and the full-rank output gate (token-by-token recurrence), gated NoPE MLA with q-LoRA.

Shape (K3.md section 10): hidden 64, 5 layers KDA,KDA,MLA,KDA,MLA (1-based kda [1,2,4]),
AttnRes block 2, layer 0 dense (intermediate 96), 12 experts top-3 on a latent of 32,
moe_intermediate 24, 1 shared expert, KDA 3 heads x 16, MLA 4 heads q_lora 40 kv_lora 20
nope 16 rope 8 v 12, vocab 700, SiTU betas 2.0 / 3.0, routed_scaling_factor 1.7.
Tensors are stored as the release names them (`language_model.` prefix, conv kernels
[C,1,K], AttnRes projections [1,H]); A_log is stored padded with zeros to A_LOG_STORED
entries, as the release pads it ([128] for 96 heads). One vision tensor is included to show
that non-text tensors are ignored.

Files: config.json (kimi_k3 wrapper, text config under text_config), model.safetensors (f32),
reference_logits.f32 [T, 700] (every prompt position), reference.json (prompt, ids, 16-token
greedy continuation computed without a cache, checks), tokenizer files (the byte-level BPE of
tests/gen_fixtures.py trained to 700 tokens, so every id the model can emit decodes).
The stored logits and the greedy tokens come from the same code run in float64 (the exact
answer the engine's f32 is measured against); seeds are screened in float32 for router and
top-1 gaps far above the f32-vs-f64 difference.

Checks done here: the f32 reference against the same code in f64 (max abs logit diff in
reference.json), the AttnRes mix against the PyPI `attn-res` package's AttnResOperator (when
installed; its pseudo-query is gamma * w), causality, router top-k gaps.

Needs torch, tokenizers, safetensors, numpy; offline; deterministic on CPU.
"""
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
import gen_fixtures  # noqa: E402
from gen_fixtures import TOKENIZER_CONFIG, train_tokenizer  # noqa: E402

OUT = Path(__file__).parent / "fixtures" / "tiny-kimi_k3"
PROMPT = (
    "The keeper of the old lighthouse writes to his daughter every Sunday. He tells her "
    "about the weather, the boats, the birds that nest on the cliffs, and the books he reads "
    "by the light of the lamp. Il guardiano scrive una lettera a sua figlia ogni domenica."
)
GREEDY = 16
A_LOG_STORED = 8
PREFIX = "language_model."

TEXT = {
    "model_type": "kimi_linear",
    "vocab_size": 700,
    "hidden_size": 64,
    "num_hidden_layers": 5,
    "intermediate_size": 96,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "situ",
    "activation_situ_beta": 2.0,
    "activation_situ_linear_beta": 3.0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 40,
    "kv_lora_rank": 20,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "mla_use_nope": True,
    "mla_use_output_gate": True,
    "linear_attn_config": {
        "kda_layers": [1, 2, 4],
        "full_attn_layers": [3, 5],
        "num_heads": 3,
        "head_dim": 16,
        "short_conv_kernel_size": 4,
        "gate_lower_bound": -5.0,
        "use_full_rank_gate": True,
    },
    "num_experts": 12,
    "num_experts_per_token": 3,
    "num_shared_experts": 1,
    "moe_intermediate_size": 24,
    "routed_expert_hidden_size": 32,
    "latent_moe_use_norm": True,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 1.7,
    "num_expert_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "use_grouped_topk": True,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "attn_res_block_size": 2,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 0,
    "eos_token_id": 2,
}
CONFIG = {
    "architectures": ["KimiK3ForConditionalGeneration"],
    "model_type": "kimi_k3",
    "text_config": TEXT,
    "eos_token_id": 2,
}

H = TEXT["hidden_size"]
L = TEXT["num_hidden_layers"]
EPS = TEXT["rms_norm_eps"]
KDA_LAYERS = [i - 1 for i in TEXT["linear_attn_config"]["kda_layers"]]
NH, D, K = 3, 16, 4
C = NH * D
MH, QL, KL, DN, DR, DV = 4, 40, 20, 16, 8, 12
E, TOPK, LAT, MI = 12, 3, 32, 24
B = TEXT["attn_res_block_size"]
V = TEXT["vocab_size"]


def build(seed):
    """Random weights; norms, AttnRes vectors, router bias, dt_bias and A_log carry noise."""
    g = torch.Generator().manual_seed(seed)

    def rn(*s, std=0.08):
        return torch.randn(*s, generator=g) * std

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": rn(V, H, std=1.0), "lm_head.weight": rn(V, H, std=0.15),
         "model.norm.weight": norm(H),
         "model.output_attn_res_proj.weight": rn(1, H, std=0.5),
         "model.output_attn_res_norm.weight": norm(H)}
    for i in range(L):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm(H)
        w[f"{p}.post_attention_layernorm.weight"] = norm(H)
        for t in ("self_attention_res", "mlp_res"):
            w[f"{p}.{t}_proj.weight"] = rn(1, H, std=0.5)
            w[f"{p}.{t}_norm.weight"] = norm(H)
        a = f"{p}.self_attn"
        if i in KDA_LAYERS:
            for x in "qkv":
                w[f"{a}.{x}_proj.weight"] = rn(C, H, std=0.15)
                w[f"{a}.{x}_conv1d.weight"] = rn(C, 1, K, std=0.4)
            a_log = torch.log(torch.empty(NH).uniform_(1, 16, generator=g))
            w[f"{a}.A_log"] = torch.cat([a_log, torch.zeros(A_LOG_STORED - NH)])
            w[f"{a}.dt_bias"] = rn(C, std=0.5)
            w[f"{a}.f_a_proj.weight"] = rn(D, H, std=0.15)
            w[f"{a}.f_b_proj.weight"] = rn(C, D, std=0.3)
            w[f"{a}.b_proj.weight"] = rn(NH, H, std=0.15)
            w[f"{a}.g_proj.weight"] = rn(C, H, std=0.15)
            w[f"{a}.o_norm.weight"] = norm(D)
            w[f"{a}.o_proj.weight"] = rn(H, C, std=0.15)
        else:
            w[f"{a}.q_a_proj.weight"] = rn(QL, H, std=0.15)
            w[f"{a}.q_a_layernorm.weight"] = norm(QL)
            w[f"{a}.q_b_proj.weight"] = rn(MH * (DN + DR), QL, std=0.2)
            w[f"{a}.kv_a_proj_with_mqa.weight"] = rn(KL + DR, H, std=0.15)
            w[f"{a}.kv_a_layernorm.weight"] = norm(KL)
            w[f"{a}.kv_b_proj.weight"] = rn(MH * (DN + DV), KL, std=0.2)
            w[f"{a}.g_proj.weight"] = rn(MH * DV, H, std=0.15)
            w[f"{a}.o_proj.weight"] = rn(H, MH * DV, std=0.15)
        if i == 0:
            for n, s in (("gate_proj", (96, H)), ("up_proj", (96, H)), ("down_proj", (H, 96))):
                w[f"{p}.mlp.{n}.weight"] = rn(*s, std=0.15)
        else:
            m = f"{p}.block_sparse_moe"
            w[f"{m}.gate.weight"] = rn(E, H, std=0.15)
            w[f"{m}.gate.e_score_correction_bias"] = rn(E, std=0.1)
            for n, s in (("gate_proj", (MI, H)), ("up_proj", (MI, H)), ("down_proj", (H, MI))):
                w[f"{m}.shared_experts.{n}.weight"] = rn(*s, std=0.15)
            w[f"{m}.routed_expert_down_proj.weight"] = rn(LAT, H, std=0.15)
            w[f"{m}.routed_expert_norm.weight"] = norm(LAT)
            w[f"{m}.routed_expert_up_proj.weight"] = rn(H, LAT, std=0.15)
            for e in range(E):
                w[f"{m}.experts.{e}.w1.weight"] = rn(MI, LAT, std=0.2)
                w[f"{m}.experts.{e}.w3.weight"] = rn(MI, LAT, std=0.2)
                w[f"{m}.experts.{e}.w2.weight"] = rn(LAT, MI, std=0.2)
    return w


def rms(x, weight, eps):
    """K3.md section 2: normalise in float32 (here: the working dtype), then the weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def mix(cands, proj, norm_w):
    """K3.md section 3: softmax over candidates of RMS(V_j) . (gamma * w); sum of the raw V_j."""
    vs = torch.stack(cands)  # [n, T, H]
    k = vs * torch.rsqrt(vs.pow(2).mean(-1, keepdim=True) + EPS)
    s = (k * (norm_w * proj.reshape(-1))).sum(-1)  # [n, T]
    a = torch.softmax(s, dim=0)
    return (a.unsqueeze(-1) * vs).sum(0)


NO_LINEAR_CAP = []  # ablation switch: non-empty drops SiTU's cap on the up branch


def situ(gate, up):
    """K3.md section 4."""
    b, bl = TEXT["activation_situ_beta"], TEXT["activation_situ_linear_beta"]
    u = up if NO_LINEAR_CAP else bl * torch.tanh(up / bl)
    return b * torch.tanh(gate / b) * torch.sigmoid(gate) * u


def mlp(x, w, p):
    return situ(x @ w[f"{p}.gate_proj.weight"].T, x @ w[f"{p}.up_proj.weight"].T) @ w[f"{p}.down_proj.weight"].T


def kda(x, w, a):
    """K3.md section 6, token by token."""
    T = x.shape[0]
    outs = []
    qkv = []
    for n in "qkv":
        y = x @ w[f"{a}.{n}_proj.weight"].T  # [T, C]
        k = w[f"{a}.{n}_conv1d.weight"].reshape(C, K)
        pad = torch.cat([torch.zeros(K - 1, C, dtype=x.dtype), y])
        conv = sum(pad[j:j + T] * k[:, j] for j in range(K))
        qkv.append(torch.nn.functional.silu(conv))
    q, k, v = (t.reshape(T, NH, D) for t in qkv)
    f = (x @ w[f"{a}.f_a_proj.weight"].T) @ w[f"{a}.f_b_proj.weight"].T
    a_log = w[f"{a}.A_log"][:NH]
    lb = TEXT["linear_attn_config"]["gate_lower_bound"]
    gdec = lb * torch.sigmoid(torch.exp(a_log).repeat_interleave(D) * (f + w[f"{a}.dt_bias"]))
    gdec = gdec.reshape(T, NH, D)
    beta = torch.sigmoid(x @ w[f"{a}.b_proj.weight"].T)  # [T, NH]
    q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
    k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    S = torch.zeros(NH, D, D, dtype=x.dtype)
    for t in range(T):
        S = S * torch.exp(gdec[t]).unsqueeze(-1)
        u = torch.einsum("hk,hkv->hv", k[t], S)
        S = S + beta[t].reshape(NH, 1, 1) * k[t].unsqueeze(-1) * (v[t] - u).unsqueeze(1)
        outs.append(torch.einsum("hk,hkv->hv", q[t], S))
    o = torch.stack(outs)  # [T, NH, D]
    o = rms(o, w[f"{a}.o_norm.weight"], EPS)
    o = o * torch.sigmoid(x @ w[f"{a}.g_proj.weight"].T).reshape(T, NH, D)
    return o.reshape(T, C) @ w[f"{a}.o_proj.weight"].T


def mla(x, w, a):
    """K3.md section 7: q-LoRA, NoPE, sigmoid output gate before o_proj; eps 1e-6 on the two norms."""
    T = x.shape[0]
    q = rms(x @ w[f"{a}.q_a_proj.weight"].T, w[f"{a}.q_a_layernorm.weight"], 1e-6) @ w[f"{a}.q_b_proj.weight"].T
    q = q.reshape(T, MH, DN + DR)
    ckv = x @ w[f"{a}.kv_a_proj_with_mqa.weight"].T
    c, k_rope = ckv[:, :KL], ckv[:, KL:]
    kv = (rms(c, w[f"{a}.kv_a_layernorm.weight"], 1e-6) @ w[f"{a}.kv_b_proj.weight"].T).reshape(T, MH, DN + DV)
    k = torch.cat([kv[..., :DN], k_rope.unsqueeze(1).expand(T, MH, DR)], -1)
    v = kv[..., DN:]
    s = torch.einsum("thd,shd->hts", q, k) * (DN + DR) ** -0.5
    s = s + torch.triu(torch.full((T, T), float("-inf"), dtype=x.dtype), 1)
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, MH * DV)
    o = o * torch.sigmoid(x @ w[f"{a}.g_proj.weight"].T)
    return o @ w[f"{a}.o_proj.weight"].T


def moe(x, w, m, gaps):
    """K3.md section 5."""
    scores = torch.sigmoid(x @ w[f"{m}.gate.weight"].T)
    choice = scores + w[f"{m}.gate.e_score_correction_bias"]
    top = torch.topk(choice, TOPK + 1, dim=-1).values
    gaps.append((top[:, TOPK - 1] - top[:, TOPK]).min().item())
    idx = torch.topk(choice, TOPK, dim=-1).indices
    wt = scores.gather(-1, idx)
    wt = wt / (wt.sum(-1, keepdim=True) + 1e-20) * TEXT["routed_scaling_factor"]
    z = x @ w[f"{m}.routed_expert_down_proj.weight"].T
    y = torch.zeros(x.shape[0], LAT, dtype=x.dtype)
    for e in range(E):
        sel = (idx == e)
        we = (wt * sel).sum(-1, keepdim=True)
        if sel.any():
            p = f"{m}.experts.{e}"
            ye = situ(z @ w[f"{p}.w1.weight"].T, z @ w[f"{p}.w3.weight"].T) @ w[f"{p}.w2.weight"].T
            y = y + we * ye
    y = rms(y, w[f"{m}.routed_expert_norm.weight"], EPS)
    return y @ w[f"{m}.routed_expert_up_proj.weight"].T + mlp(x, w, f"{m}.shared_experts")


def forward(w, ids, gaps=None):
    return forward_embeds(w, w["model.embed_tokens.weight"][ids], gaps)


def forward_embeds(w, P, gaps=None):
    """The text model over input rows [T, H] (embedding rows, or spliced image rows)."""
    gaps = [] if gaps is None else gaps
    bank = []
    for i in range(L):
        p = f"model.layers.{i}"
        xa = mix(bank + [P], w[f"{p}.self_attention_res_proj.weight"],
                 w[f"{p}.self_attention_res_norm.weight"]) if bank else P
        if i % B == 0:
            bank.append(P)
            P = None
        xn = rms(xa, w[f"{p}.input_layernorm.weight"], EPS)
        a = kda(xn, w, f"{p}.self_attn") if i in KDA_LAYERS else mla(xn, w, f"{p}.self_attn")
        P = a if P is None else P + a
        xm = mix(bank + [P], w[f"{p}.mlp_res_proj.weight"], w[f"{p}.mlp_res_norm.weight"])
        xn = rms(xm, w[f"{p}.post_attention_layernorm.weight"], EPS)
        P = P + (mlp(xn, w, f"{p}.mlp") if i == 0 else moe(xn, w, f"{p}.block_sparse_moe", gaps))
    h = mix(bank + [P], w["model.output_attn_res_proj.weight"], w["model.output_attn_res_norm.weight"])
    return rms(h, w["model.norm.weight"], EPS) @ w["lm_head.weight"].T


def greedy(w, ids, n, gaps):
    ids = list(ids)
    out = []
    for _ in range(n):
        t = int(torch.argmax(forward(w, torch.tensor(ids), gaps)[-1]))
        out.append(t)
        ids.append(t)
    return out


def top1_gap(logits):
    t = torch.topk(logits, 2, dim=-1).values
    return (t[:, 0] - t[:, 1]).min().item()


def attn_res_package_check(w):
    """The AttnRes mix against the PyPI `attn-res` AttnResOperator (pseudo-query gamma * w)."""
    try:
        from attn_res.main import AttnResOperator
    except ImportError:
        return "not checked: the PyPI package attn-res is not installed"
    g = torch.Generator().manual_seed(5)
    cands = [torch.randn(7, H, generator=g) * (1 + j) for j in range(3)]
    proj, nw = w["model.layers.3.mlp_res_proj.weight"], w["model.layers.3.mlp_res_norm.weight"]
    op = AttnResOperator(H, eps=EPS)
    with torch.no_grad():
        op.pseudo_query.copy_(nw * proj.reshape(-1))
        theirs = op(torch.stack(cands).unsqueeze(1)).squeeze(0)
    diff = (mix(cands, proj, nw) - theirs).abs().max().item()
    assert diff < 1e-5, diff
    return f"attn-res 0.1.0 AttnResOperator(pseudo_query = gamma * w, eps = rms_norm_eps) max abs diff {diff:.2e}"


def ablations(w, ids, logits):
    """Max |logit change| when one K3 piece is removed: each must matter."""
    def changed(edit):
        return {k: edit(k, v) for k, v in w.items()}

    def delta(w2):
        return (forward(w2, ids) - logits).abs().max().item()

    out = {
        "attn_res_proj_zero": delta(changed(lambda k, v: v * 0 if "_res_proj" in k else v)),
        "norms_one": delta(changed(lambda k, v: torch.ones_like(v) if "norm.weight" in k else v)),
        "router_bias_zero": delta(changed(lambda k, v: v * 0 if "e_score_correction_bias" in k else v)),
        "mla_gate_zero": delta(changed(lambda k, v: v * 0 if k.endswith("g_proj.weight") and "layers.2." in k
                                       or k.endswith("g_proj.weight") and "layers.4." in k else v)),
        "kda_gate_zero": delta(changed(lambda k, v: v * 0 if k.endswith("g_proj.weight") and k.split(".")[2] in
                                       ("0", "1", "3") else v)),
        "latent_norm_one": delta(changed(lambda k, v: torch.ones_like(v) if "routed_expert_norm" in k else v)),
        "dt_bias_zero": delta(changed(lambda k, v: v * 0 if k.endswith("dt_bias") else v)),
    }
    NO_LINEAR_CAP.append(True)
    out["situ_linear_cap_dropped"] = delta(w)
    NO_LINEAR_CAP.clear()
    return out


def main():
    torch.set_grad_enabled(False)
    gen_fixtures.VOCAB_SIZE = V
    tok = train_tokenizer()
    pids = tok.encode(PROMPT).ids
    ids = torch.tensor(pids)
    tried = []
    for seed in range(11, 80):
        w = build(seed)
        gaps = []
        logits = forward(w, ids, gaps)
        cont = greedy(w, pids, GREEDY, gaps)
        full = forward(w, torch.tensor(pids + cont), gaps)
        rgap, tgap = min(gaps), min(top1_gap(logits), top1_gap(full))
        tried.append({"seed": seed, "min_router_gap": rgap, "min_top1_gap": tgap})
        if rgap > 2.5e-4 and tgap > 2e-3:
            break
    else:
        raise SystemExit(f"no seed met the gap criteria: {tried}")
    print(f"[kimi_k3] seed={seed} T={len(pids)} router gap {rgap:.2e} top1 gap {tgap:.2e}")

    w64 = {k: v.double() for k, v in w.items()}
    logits32 = logits
    logits = forward(w64, ids).float()
    f64_diff = (logits - logits32).abs().max().item()
    cont32 = cont
    cont = greedy(w64, pids, GREEDY, [])
    assert cont == cont32, (cont, cont32)
    causal = forward(w, torch.tensor(pids[:-1] + [(pids[-1] + 1) % V]))
    causal_diff = (causal[:-1] - logits32[:-1]).abs().max().item()
    assert causal_diff < 1e-5, causal_diff
    package = attn_res_package_check(w)
    ablate = ablations(w, ids, logits32)
    assert min(ablate.values()) > 0.05, ablate

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    stored = {PREFIX + k: v.contiguous() for k, v in w.items()}
    stored["vision_tower.patch_embed.proj.weight"] = torch.zeros(4, 3)
    save_file(stored, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    (OUT / "reference_logits.f32").write_bytes(logits.contiguous().numpy().astype("<f4").tobytes())
    text_params = sum(v.numel() for v in w.values())
    ref = {
        "family": "kimi_k3",
        "reference": "pure-torch implementation of ../shared/design/K3.md (tests/gen_k3_fixtures.py)",
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
        "seed": seed,
        "candidates_tried": tried,
        "init": "weights N(0, std) per tensor (see build()); every norm weight 1 + 0.2 randn; "
                "AttnRes projections N(0, 0.5); router bias N(0, 0.1); dt_bias N(0, 0.5); "
                "A_log log U(1, 16), stored padded with zeros",
        "a_log_stored": A_LOG_STORED,
        "dtype": "float32 weights; logits and greedy tokens computed in float64, stored as float32",
        "prompt_text": PROMPT,
        "prompt_ids": pids,
        "logits_file": "reference_logits.f32",
        "logits_dtype": "float32 little-endian, row-major",
        "logits_shape": [len(pids), V],
        "greedy_ids": cont,
        "greedy_max_new_tokens": GREEDY,
        "greedy_note": "each step a full forward over prompt + tokens so far (no cache)",
        "min_router_gap": rgap,
        "min_top1_gap": tgap,
        "f32_vs_f64_max_abs_logit_diff": f64_diff,
        "f32_greedy_equals_f64_greedy": True,
        "causality_max_abs_diff_of_earlier_rows": causal_diff,
        "max_abs_logit": logits.abs().max().item(),
        "attn_res_package_check": package,
        "ablation_max_abs_logit_change": ablate,
        "num_parameters": text_params,
        "num_parameters_note": "text tensors as stored (A_log at its padded length)",
        "deviations": ["text path only", "token-by-token KDA recurrence (no chunked kernel)",
                       "experts in f32 rather than MXFP4", "no cache path in the reference"],
        "config": CONFIG,
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"f32 vs f64 {f64_diff:.2e}; {package}; {text_params} parameters; ablations {ablate}")


if __name__ == "__main__":
    main()
