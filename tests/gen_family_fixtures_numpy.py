"""Independent float64 numpy forward of every tests/gen_family_fixtures.py fixture.

Written from tests/fixtures/FAMILIES_MATH.md, reading only a fixture directory's config.json and
safetensors (no transformers, no torch modules; torch is used only to read bf16 tensors). It runs the
prompt + greedy continuation through one full (uncached) forward, token-by-token for the Gated DeltaNet
recurrence, and returns max |logits - reference_logits.f32| over the prompt after checking that its
argmax reproduces greedy_ids. Called by tests/gen_family_fixtures.py for each fixture it writes; it can
also be run alone: python3 tests/gen_family_fixtures_numpy.py tests/fixtures/tiny-<name> ...
"""

import json
import math
import sys
from pathlib import Path

import numpy as np

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def load_weights(out_dir):
    from safetensors.torch import load_file  # bf16-capable reader; values go straight to f64 numpy
    W = {}
    for p in sorted(out_dir.glob("model*.safetensors")):
        for k, t in load_file(str(p)).items():
            W[k] = t.numpy() if t.dtype.is_floating_point is False else t.double().numpy()
    return W


# ------------------------------------------------------------------ building blocks
def rms(x, w, eps, zero_centred=False):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * (1.0 + w) if zero_centred else y * w


def silu(z):
    return z / (1.0 + np.exp(-z))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def softplus(z):  # torch.nn.functional.softplus: beta 1, threshold 20
    return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def inv_freq_of(rp, head_dim):
    rd = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    base = rp["rope_theta"]
    pos = base ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    if rp.get("rope_type", "default") == "default":
        return 1.0 / pos, 1.0, rd
    assert rp["rope_type"] == "yarn"
    factor, orig = rp["factor"], rp["original_max_position_embeddings"]
    bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

    def corr(n_rot):
        return rd * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(bf), corr(bs)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra = 1 - ramp  # weight of the extrapolated (unscaled) frequency
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv, att, rd


def rope(x, pos, inv, att, rd):
    """rotate_half convention on the first rd features of each head; x [T, heads, hd]."""
    ang = pos[:, None] * inv[None]
    ang = np.concatenate([ang, ang], -1)
    cos, sin = (np.cos(ang) * att)[:, None], (np.sin(ang) * att)[:, None]
    xr, xp = x[..., :rd], x[..., rd:]
    rh = np.concatenate([-xr[..., rd // 2:], xr[..., :rd // 2]], -1)
    return np.concatenate([xr * cos + rh * sin, xp], -1)


def attention(q, k, v, window=None, sinks=None):
    """q [T, nh, hd], k / v [T, nkv, hd]; causal (and i - window < j when window); sinks [nh] logits."""
    T, nh, hd = q.shape
    rep = nh // k.shape[1]
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    out = np.zeros((T, nh, v.shape[-1]))
    for h in range(nh):
        s = q[:, h] @ k[:, h // rep].T / math.sqrt(hd)
        s = np.where(allowed, s, -np.inf)
        if sinks is not None:
            s = np.concatenate([s, np.full((T, 1), sinks[h])], -1)
        p = softmax(s)[:, :T]
        out[:, h] = p @ v[:, h // rep]
    return out


def lin(W, x, name, bias=True):
    y = x @ W[name + ".weight"].T
    if bias and name + ".bias" in W:
        y = y + W[name + ".bias"]
    return y


def swiglu(x, g, u, d):
    return (silu(x @ g.T) * (x @ u.T)) @ d.T


# ------------------------------------------------------------------ gated deltanet
def gdn(W, p, x, c, fused_qkvz):
    nk, nv, dk, dv, K = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                         c["linear_value_head_dim"], c["linear_conv_kernel_dim"])
    T, r = x.shape[0], nv // nk
    if fused_qkvz:
        qkvz = (x @ W[p + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
        q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
        v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(T, nv, dv)
        z = qkvz[..., 2 * dk + r * dv:].reshape(T, nv, dv)
        ba = (x @ W[p + "in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
    else:
        mixed = x @ W[p + "in_proj_qkv.weight"].T
        z = (x @ W[p + "in_proj_z.weight"].T).reshape(T, nv, dv)
        b, a = x @ W[p + "in_proj_b.weight"].T, x @ W[p + "in_proj_a.weight"].T
    w = W[p + "conv1d.weight"][:, 0, :]                     # [C, K]
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], 0)
    conv = sum(padded[j:j + T] * w[:, j] for j in range(K))  # y_t = sum_j w[:, j] x_{t-K+1+j}
    conv = silu(conv)
    q = conv[:, :nk * dk].reshape(T, nk, dk)
    k = conv[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
    v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
    beta = sigmoid(b)
    g = -np.exp(W[p + "A_log"]) * softplus(a + W[p + "dt_bias"])
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    o = np.zeros((T, nv, dv))
    for h in range(nv):
        S = np.zeros((dk, dv))
        for t in range(T):
            kt, qt = k[t, h // r], q[t, h // r]
            S = S * math.exp(g[t, h])
            S = S + np.outer(kt, (v[t, h] - kt @ S) * beta[t, h])
            o[t, h] = qt @ S
    o = rms(o, W[p + "norm.weight"], c["rms_norm_eps"]) * silu(z)
    return o.reshape(T, nv * dv) @ W[p + "out_proj.weight"].T


# ------------------------------------------------------------------ mixture of experts
def expert_weights(W, mp, e, layout):
    if layout == "per_expert":
        return (W[f"{mp}.experts.{e}.gate_proj.weight"], W[f"{mp}.experts.{e}.up_proj.weight"],
                W[f"{mp}.experts.{e}.down_proj.weight"])
    if layout == "w13":
        return W[f"{mp}.experts.{e}.w1.weight"], W[f"{mp}.experts.{e}.w3.weight"], W[f"{mp}.experts.{e}.w2.weight"]
    gu = W[f"{mp}.experts.gate_up_proj"][e]                 # fused [2I, H]
    I = gu.shape[0] // 2
    return gu[:I], gu[I:], W[f"{mp}.experts.down_proj"][e]


def route(fam, c, W, mp, h):
    """Returns (indices [T, k], weights [T, k])."""
    k = c["num_experts_per_tok"]
    gate = mp + (".router" if fam == "gpt_oss" else ".gate")
    logits = h @ W[gate + ".weight"].T
    if fam == "gpt_oss":
        logits = logits + W[gate + ".bias"]
        idx = np.argsort(-logits, -1, kind="stable")[:, :k]
        return idx, softmax(np.take_along_axis(logits, idx, -1))
    if fam in ("glm4_moe", "minimax_m2"):
        s = sigmoid(logits)
        bias = W[mp + (".gate.e_score_correction_bias" if fam == "glm4_moe" else ".e_score_correction_bias")]
        choice = s + bias
        if fam == "glm4_moe" and c["n_group"] > 1:
            ng, tg = c["n_group"], c["topk_group"]
            grp = np.sort(choice.reshape(len(h), ng, -1), -1)[..., -2:].sum(-1)
            keep = np.argsort(-grp, -1, kind="stable")[:, :tg]
            mask = np.zeros_like(grp, dtype=bool)
            np.put_along_axis(mask, keep, True, -1)
            choice = np.where(np.repeat(mask, choice.shape[1] // ng, -1), choice, -np.inf)
        idx = np.argsort(-choice, -1, kind="stable")[:, :k]
        wts = np.take_along_axis(s, idx, -1)
        if fam == "minimax_m2" or c.get("norm_topk_prob", True):
            wts = wts / (wts.sum(-1, keepdims=True) + (1e-20 if fam == "glm4_moe" else 0.0))
        return idx, wts * c.get("routed_scaling_factor", 1.0) if fam == "glm4_moe" else wts
    p = softmax(logits)
    idx = np.argsort(-p, -1, kind="stable")[:, :k]
    wts = np.take_along_axis(p, idx, -1)
    renorm = True if fam in ("qwen3_5_moe", "qwen3_5_moe_text") else c.get("norm_topk_prob", False)
    return idx, wts / wts.sum(-1, keepdims=True) if renorm else wts


def gpt_oss_expert(W, mp, e, c, x):
    if mp + ".experts.gate_up_proj_blocks" in W:
        gu_w = mxfp4_decode(W[mp + ".experts.gate_up_proj_blocks"][e], W[mp + ".experts.gate_up_proj_scales"][e])
        dn_w = mxfp4_decode(W[mp + ".experts.down_proj_blocks"][e], W[mp + ".experts.down_proj_scales"][e])
    else:
        gu_w, dn_w = W[mp + ".experts.gate_up_proj"][e].T, W[mp + ".experts.down_proj"][e].T  # -> [out, in]
    gu = x @ gu_w.T + W[mp + ".experts.gate_up_proj_bias"][e]
    lim, alpha = c.get("swiglu_limit", 7.0), c.get("swiglu_alpha", 1.702)
    gate, up = np.minimum(gu[..., 0::2], lim), np.clip(gu[..., 1::2], -lim, lim)
    return ((up + 1) * (gate * sigmoid(alpha * gate))) @ dn_w.T + W[mp + ".experts.down_proj_bias"][e]


def mxfp4_decode(blocks, scales):
    """[rows, G, 16] u8 + [rows, G] u8 -> [rows, G*32] f64 (row = output feature)."""
    b = blocks.astype(np.int64)
    lut = np.array(FP4_VALUES)
    out = np.empty(b.shape[:-1] + (32,))
    out[..., 0::2], out[..., 1::2] = lut[b & 15], lut[b >> 4]
    return (out * np.exp2(scales.astype(np.int64) - 127)[..., None]).reshape(b.shape[0], -1)


def moe(fam, c, W, mp, h):
    idx, wts = route(fam, c, W, mp, h)
    layout = {"minimax_m2": "w13", "qwen3_5_moe": "fused"}.get(fam, "per_expert")
    y = np.zeros_like(h)
    for t in range(len(h)):
        for e, wt in zip(idx[t], wts[t]):
            if fam == "gpt_oss":
                y[t] += wt * gpt_oss_expert(W, mp, e, c, h[t])
            else:
                y[t] += wt * swiglu(h[t], *expert_weights(W, mp, e, layout))
    if fam in ("qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"):
        s = mp + ".shared_expert"
        y += sigmoid(h @ W[mp + ".shared_expert_gate.weight"].T) * swiglu(
            h, W[s + ".gate_proj.weight"], W[s + ".up_proj.weight"], W[s + ".down_proj.weight"])
    if fam == "glm4_moe":
        s = mp + ".shared_experts"
        y += swiglu(h, W[s + ".gate_proj.weight"], W[s + ".up_proj.weight"], W[s + ".down_proj.weight"])
    return y


# ------------------------------------------------------------------ the model
def forward(cfg, W, ids):
    fam = cfg["model_type"]
    c, pre = (cfg["text_config"], "model.language_model.") if fam == "qwen3_5_moe" else (cfg, "model.")
    gdn_fam = fam in ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv, att, rd = inv_freq_of(c["rope_parameters"], hd)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = W[pre + "embed_tokens.weight"][ids]
    layer_types = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    for L in range(c["num_hidden_layers"]):
        p = f"{pre}layers.{L}."
        h = rms(x, W[p + "input_layernorm.weight"], eps, gdn_fam)
        if layer_types[L] == "linear_attention":
            x = x + gdn(W, p + "linear_attn.", h, c, fam == "qwen3_next")
        else:
            a = p + "self_attn."
            qp = lin(W, h, a + "q_proj")
            gate = None
            if gdn_fam:  # per head: [query | gate]
                qp = qp.reshape(T, nh, 2 * hd)
                qp, gate = qp[..., :hd], qp[..., hd:].reshape(T, nh * hd)
            kp, vp = lin(W, h, a + "k_proj"), lin(W, h, a + "v_proj")
            if fam == "minimax_m2":  # RMSNorm over the whole projection, before the head split
                qp, kp = rms(qp, W[a + "q_norm.weight"], eps), rms(kp, W[a + "k_norm.weight"], eps)
            q, k, v = qp.reshape(T, nh, hd), kp.reshape(T, nkv, hd), vp.reshape(T, nkv, hd)
            if a + "q_norm.weight" in W and fam != "minimax_m2":  # per head
                q, k = rms(q, W[a + "q_norm.weight"], eps, gdn_fam), rms(k, W[a + "k_norm.weight"], eps, gdn_fam)
            q, k = rope(q, pos, inv, att, rd), rope(k, pos, inv, att, rd)
            window = c["sliding_window"] if layer_types[L] == "sliding_attention" else None
            o = attention(q, k, v, window, W.get(a + "sinks")).reshape(T, nh * hd)
            if gate is not None:
                o = o * sigmoid(gate)
            x = x + lin(W, o, a + "o_proj")
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps, gdn_fam)
        mp = p + ("block_sparse_moe" if fam == "minimax_m2" else "mlp")
        if fam == "glm4_moe" and L < c["first_k_dense_replace"]:
            y = swiglu(h, W[mp + ".gate_proj.weight"], W[mp + ".up_proj.weight"], W[mp + ".down_proj.weight"])
        else:
            y = moe(fam, c, W, mp, h)
        x = x + y
    x = rms(x, W[pre + "norm.weight"], eps, gdn_fam)
    return x @ W["lm_head.weight"].T


def numpy_check(out_dir, ref=None):
    out_dir = Path(out_dir)
    ref = ref or json.loads((out_dir / "reference.json").read_text())
    cfg = json.loads((out_dir / "config.json").read_text())
    W = load_weights(out_dir)
    logits = forward(cfg, W, ref["prompt_ids"] + ref["greedy_ids"])
    Tp = len(ref["prompt_ids"])
    refl = np.fromfile(out_dir / "reference_logits.f32", dtype="<f4").reshape(ref["logits_shape"])
    got = logits[Tp - 1:Tp - 1 + len(ref["greedy_ids"])].argmax(-1).tolist()
    assert got == ref["greedy_ids"], (out_dir.name, got, ref["greedy_ids"])
    diff = float(np.abs(logits[:Tp] - refl).max())
    assert diff < 1e-4, (out_dir.name, diff)
    return diff


MODELING = {"qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM"), "glm4_moe": ("glm4_moe", "Glm4MoeForCausalLM"),
             "minimax_m2": ("minimax_m2", "MiniMaxM2ForCausalLM"), "gpt_oss": ("gpt_oss", "GptOssForCausalLM"),
             "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM"),
             "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM")}


def transformers_f64_check(out_dir, ref):
    """Validates this file against transformers itself: re-executes the family's modeling_*.py with every
    float32 cast turned into float64 (`torch.float32`/`torch.float` -> float64, `.float()` -> `.double()`),
    loads the fixture in float64 and returns max |its prompt logits - this file's|. The rotary tables stay
    f32 (modeling_rope_utils is not rewritten), which bounds gpt_oss's agreement at ~1e-7. Not for the VL
    wrapper (its text model is built through AutoModel from the unpatched module)."""
    import importlib
    import inspect
    import types

    import torch
    cfg = json.loads((Path(out_dir) / "config.json").read_text())
    if cfg["model_type"] not in MODELING:
        return None
    pkg, cls_name = MODELING[cfg["model_type"]]
    modname = f"transformers.models.{pkg}.modeling_{pkg}"
    mod = importlib.import_module(modname)
    src = inspect.getsource(mod)
    for a, b in (("torch.float32", "torch.float64"), ("dtype=torch.float)", "dtype=torch.float64)"),
                 ("dtype=torch.float,", "dtype=torch.float64,"), (".float()", ".double()"),
                 ("from ... import", "from transformers import"), ("from ...", "from transformers."),
                 ("from .configuration", f"from transformers.models.{pkg}.configuration")):
        src = src.replace(a, b)
    new = types.ModuleType(modname + "_f64")
    new.__file__ = mod.__file__
    sys.modules[new.__name__] = new
    exec(compile(src, mod.__file__, "exec"), new.__dict__)
    kw = {}
    if "quantization_config" in cfg:
        from transformers import Mxfp4Config
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    m = getattr(new, cls_name).from_pretrained(str(out_dir), dtype=torch.float64, attn_implementation="eager",
                                               experts_implementation="eager", **kw).eval()
    with torch.no_grad():
        got = m(input_ids=torch.tensor([ref["prompt_ids"]])).logits[0].numpy()
    ours = forward(cfg, load_weights(Path(out_dir)), ref["prompt_ids"])
    return float(np.abs(got - ours).max())


if __name__ == "__main__":
    for d in sys.argv[1:]:
        r = json.loads((Path(d) / "reference.json").read_text())
        print(d, numpy_check(d), transformers_f64_check(d, r))
