#!/usr/bin/env python3
"""Writes tests/fixtures/tiny-kimi_k3-vision: a tiny Kimi K3 with a tiny vision tower, and references.

transformers has no kimi_k3 class, so, as for K3's text model (tests/gen_k3_fixtures.py), the
reference is pure torch written from ../shared/design/K3-VISION.md §2.2-2.3 and checked against
the public copy of the release's modeling_kimi_k3.py it paraphrases (MindSpeed-MM's
`MoonViT3dPretrainedModel`, `PatchMergerMLPV2`, `_merge_input_ids_with_image_features`):

  patch embedding   x_p = W . patch_p, W = proj.weight viewed [D, 3*14*14], flat (c, y, x);
  position grid     + the learned [H0, W0, D] grid, resized to the image's (gh, gw) by
                    F.interpolate(mode=pos_emb_interpolation_mode, align_corners=False) unless
                    the sizes agree (the release passes the config's mode: "bilinear");
  layer x N         h = x + wo . attn(rms(x; norm0)); x = h + fc1 . gelu_tanh(fc0 . rms(h; norm1)),
                    packed wqkv split [3][heads][head_dim], bidirectional attention within the
                    image, 2-D RoPE from the release's float32 table (complex pair 2i: the
                    column angle c*f_i, pair 2i+1: the row angle r*f_i, f_i = 10000^(-4i/hd));
  final norm        rms(x; final_layernorm);
  2x2 merge         token (a, b) = concat of patches (2a,2b), (2a,2b+1), (2a+1,2b), (2a+1,2b+1);
  projector         rms(proj.2 . gelu_erf(proj.0 . m); post_norm, projector_ln_eps).

The tower's RMSNorms are `nn.RMSNorm(D)` without eps: torch uses finfo(float32).eps for float32
and bfloat16 inputs, 1.1920928955078125e-07, which the config carries here as `vt_rms_eps`
(an f64 reference would otherwise use finfo(float64).eps).

Pieces shared with transformers' Kimi-K2.5 vision code are cross-checked against it: the
resized position grid against `get_vision_interpolation_indices_and_weights` (bilinear and
bicubic) and the merge order against `get_vision_temporal_merge_index`.

The text model is tests/gen_k3_fixtures.py's, re-screened with a tokenizer that also holds
K3's four media tokens (<|media_begin|>, <|media_content|>, <|media_end|>, <|media_pad|>).
The prompt holds two images in the release's markup,
`<|media_begin|>image WxH<|media_content|><|media_pad|><|media_end|>`; each pad is replaced
by its image's projected rows (one pad per image, expanded in the model), text rows come from
embed_tokens.

Shape: tower width 40, 3 heads of 16 (qkv 48), MLP 72, 3 layers, an 8x8 position grid,
patch 14, merge 2x2, projector 160 -> 160 -> 64 (the text width).

Files: config.json (kimi_k3 wrapper with vision_config and media_placeholder_token_id),
preprocessor_config.json (the release's media_proc_cfg), model.safetensors (f32),
image_a.png (150x100 RGB), image_b.png (40x130 RGB), features_{a,b}.f32 (projected rows
[N, 64]), features_{a,b}_bicubic.f32 (the same tower with the grid resized bicubically),
reference_logits.f32 (every position of the expanded prompt, [T, V]), reference.json.
Stored outputs come from the same code in float64; the float32 pass is checked against it.

How to run (by hand, never by CI; offline, about a minute):

    python3 tests/gen_k3_vision_tower.py

Needs torch, transformers 5.24, tokenizers, safetensors, numpy, Pillow.
"""
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
import gen_fixtures  # noqa: E402
import gen_k3_fixtures as k3  # noqa: E402
import gen_k3_vision_preprocess as pre  # noqa: E402

OUT = Path(__file__).parent / "fixtures" / "tiny-kimi_k3-vision"
MEDIA = ["<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>"]
SPECIAL = list(gen_fixtures.SPECIAL_TOKENS) + MEDIA
PAD_ID = SPECIAL.index("<|media_pad|>")
GREEDY = 8

VISION = {
    "patch_size": 14,
    "init_pos_emb_height": 8,
    "init_pos_emb_width": 8,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "pos_emb_interpolation_mode": "bilinear",
    "vt_hidden_size": 40,
    "vt_num_attention_heads": 3,
    "qkv_hidden_size": 48,
    "vt_intermediate_size": 72,
    "vt_num_hidden_layers": 3,
    "vt_rms_eps": 1.1920928955078125e-07,
    "norm_type": "rmsnorm",
    "mlp_type": "mlp2",
    "activation_func": "gelu_pytorch_tanh",
    "attn_bias": False,
    "linear_bias": False,
    "patch_embed_proj_bias": False,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmergerv2",
    "mm_hidden_size": 40,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-05,
    "text_hidden_size": k3.H,
    "_attn_implementation": "flash_attention_2",
}
MEDIA_PROC = {
    "in_patch_limit": 65536,
    "patch_size": 14,
    "merge_kernel_size": 2,
    "patch_limit_on_one_side": 512,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "transparent_bg_config": {"type": "chessboard", "square": 8, "on_top_left": True, "white": 255, "gray": 180},
    "transparent_bg_fill_stage": "after_resize",
}
D = VISION["vt_hidden_size"]
HEADS = VISION["vt_num_attention_heads"]
Q = VISION["qkv_hidden_size"]
HD = Q // HEADS
MLP = VISION["vt_intermediate_size"]
LAYERS = VISION["vt_num_hidden_layers"]
G0 = VISION["init_pos_emb_height"]
P = VISION["patch_size"]
M = 4 * D
TEXT_H = VISION["text_hidden_size"]
EPS_VT = VISION["vt_rms_eps"]
EPS_PROJ = VISION["projector_ln_eps"]
IMAGES = {"a": (150, 100), "b": (40, 130)}


def build_tower(seed):
    g = torch.Generator().manual_seed(seed)

    def rn(*s, std):
        return torch.randn(*s, generator=g) * std

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=g)

    t = "vision_tower."
    w = {f"{t}patch_embed.proj.weight": rn(D, 3, P, P, std=0.05),
         f"{t}patch_embed.pos_emb.weight": rn(G0, G0, D, std=0.5),
         f"{t}encoder.final_layernorm.weight": norm(D),
         "mm_projector.proj.0.weight": rn(M, M, std=0.08),
         "mm_projector.proj.2.weight": rn(TEXT_H, M, std=0.08),
         "mm_projector.post_norm.weight": norm(TEXT_H)}
    for i in range(LAYERS):
        b = f"{t}encoder.blocks.{i}."
        w[b + "norm0.weight"] = norm(D)
        w[b + "wqkv.weight"] = rn(3 * Q, D, std=0.15)
        w[b + "wo.weight"] = rn(D, Q, std=0.15)
        w[b + "norm1.weight"] = norm(D)
        w[b + "mlp.fc0.weight"] = rn(MLP, D, std=0.15)
        w[b + "mlp.fc1.weight"] = rn(D, MLP, std=0.12)
    return w


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def pos_grid(weight, gh, gw, mode):
    """`get_rope_shape`: the [H0, W0, D] grid as [1, D, H0, W0], resized, back to [gh*gw, D]."""
    if (gh, gw) == tuple(weight.shape[:2]):
        return weight.flatten(end_dim=1)
    return F.interpolate(weight.permute(2, 0, 1).unsqueeze(0), size=(gh, gw), mode=mode) \
        .squeeze(0).permute(1, 2, 0).flatten(end_dim=1)


def rope_cis(gh, gw):
    """The release's `_precompute_freqs_cis` (float32, complex64), cut to the image's grid."""
    dim_range = torch.arange(0, HD, 4)[: HD // 4].float()
    freqs = 1.0 / (10000 ** (dim_range / HD))
    ys, xs = torch.meshgrid(torch.arange(gh).float(), torch.arange(gw).float(), indexing="ij")
    x_cis = torch.polar(torch.ones(gh * gw, HD // 4), torch.outer(xs.flatten(), freqs).float())
    y_cis = torch.polar(torch.ones(gh * gw, HD // 4), torch.outer(ys.flatten(), freqs).float())
    return torch.cat([x_cis.unsqueeze(-1), y_cis.unsqueeze(-1)], dim=-1).reshape(gh * gw, HD // 2)


def apply_rope(x, cis):
    """(a, b) -> (a cos - b sin, a sin + b cos) on pairs (2j, 2j+1), in the working dtype."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cis.real.to(x.dtype).unsqueeze(1), cis.imag.to(x.dtype).unsqueeze(1)
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def tower(w, pixels, gh, gw, mode):
    """pixel_values [gh*gw, 3, 14, 14] -> projected rows [(gh/2)*(gw/2), TEXT_H]."""
    t = "vision_tower."
    n = gh * gw
    x = pixels.reshape(n, -1) @ w[f"{t}patch_embed.proj.weight"].reshape(D, -1).T
    x = x + pos_grid(w[f"{t}patch_embed.pos_emb.weight"], gh, gw, mode)
    cis = rope_cis(gh, gw)
    for i in range(LAYERS):
        b = f"{t}encoder.blocks.{i}."
        qkv = (rms(x, w[b + "norm0.weight"], EPS_VT) @ w[b + "wqkv.weight"].T).view(n, 3, HEADS, HD)
        q, k, v = apply_rope(qkv[:, 0], cis), apply_rope(qkv[:, 1], cis), qkv[:, 2]
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(HD)
        a = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v).reshape(n, Q)
        x = x + a @ w[b + "wo.weight"].T
        h = rms(x, w[b + "norm1.weight"], EPS_VT)
        x = x + gelu_tanh(h @ w[b + "mlp.fc0.weight"].T) @ w[b + "mlp.fc1.weight"].T
    x = rms(x, w[f"{t}encoder.final_layernorm.weight"], EPS_VT)
    merged = x.view(gh // 2, 2, gw // 2, 2, D).permute(0, 2, 1, 3, 4).reshape(-1, M)
    y = F.gelu(merged @ w["mm_projector.proj.0.weight"].T) @ w["mm_projector.proj.2.weight"].T
    return rms(y, w["mm_projector.post_norm.weight"], EPS_PROJ)


def check_against_transformers(w):
    """The grid resize and the merge order against transformers' K2.5 helpers."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights
    from transformers.models.kimi_k25.modeling_kimi_k25 import get_vision_temporal_merge_index

    grid = w["vision_tower.patch_embed.pos_emb.weight"].double()
    table = grid.flatten(0, 1)
    out = {}
    for mode in ("bilinear", "bicubic"):
        worst = 0.0
        for gh, gw in ((8, 12), (10, 4), (6, 6), (20, 14), (2, 2)):
            idx, wt = get_vision_interpolation_indices_and_weights(
                torch.tensor([[1, gh, gw]]), G0, mode=mode, align_corners=False)
            theirs = (table[idx] * wt.double().unsqueeze(-1)).sum(1)
            worst = max(worst, (pos_grid(grid, gh, gw, mode) - theirs).abs().max().item())
        assert worst < 1e-5, (mode, worst)  # the helper computes its weights in float32
        out[f"pos_grid_{mode}_max_abs_diff"] = worst
    gh, gw = 8, 12
    dest, _, count = get_vision_temporal_merge_index(torch.tensor([[1, gh, gw]]), 2, 2)
    ours = torch.arange(gh * gw).view(gh // 2, 2, gw // 2, 2).permute(0, 2, 1, 3).reshape(-1)
    theirs = torch.empty(gh * gw, dtype=torch.long)
    theirs[dest] = torch.arange(gh * gw)
    assert count == gh * gw // 4 and torch.equal(ours, theirs)
    out["merge_order"] = "equal to get_vision_temporal_merge_index"
    return out


def image(name, w, h):
    """A deterministic RGB picture: gradients, a disc and stripes, different per image."""
    y, x = np.mgrid[0:h, 0:w]
    k = 1 if name == "a" else 2
    r = (255 * x / (w - 1)).astype(np.int64)
    g = (255 * y / (h - 1)).astype(np.int64)
    disc = ((x - w / (2 + k)) ** 2 + (y - h / 3) ** 2) < (min(w, h) / 3) ** 2
    b = np.where(disc, 40 * k, ((x // (3 + k) + y // 7) % 2) * 230)
    return np.stack([r, (g * k) % 256, b], axis=-1).clip(0, 255).astype(np.uint8)


def expand(embed, ids, feats):
    """`_merge_input_ids_with_image_features`: pad i becomes image i's rows."""
    rows, it = [], iter(feats)
    for t in ids:
        rows.append(next(it) if t == PAD_ID else embed[t].unsqueeze(0))
    return torch.cat(rows)


def main():
    torch.set_grad_enabled(False)
    gen_fixtures.VOCAB_SIZE = k3.V
    gen_fixtures.SPECIAL_TOKENS = SPECIAL
    tok = gen_fixtures.train_tokenizer()
    for i, s in enumerate(SPECIAL):
        assert tok.token_to_id(s) == i, s

    arrays, pixels, grids = {}, {}, {}
    for name, (w_, h_) in IMAGES.items():
        arrays[name] = image(name, w_, h_)
        _, pv, (_, _, _, _, gh, gw) = pre.preprocess(arrays[name], "RGB", MEDIA_PROC["in_patch_limit"],
                                                     MEDIA_PROC["patch_limit_on_one_side"])
        pixels[name], grids[name] = torch.from_numpy(pv), (gh, gw)

    def markup(name):
        w_, h_ = IMAGES[name]
        return f"<|media_begin|>image {w_}x{h_}<|media_content|><|media_pad|><|media_end|>"

    text = (f"Look at the two pictures. {markup('a')} The first one is wide, {markup('b')} "
            "the second is tall. Which one has more stripes?")
    pids = tok.encode(text).ids
    assert pids.count(PAD_ID) == 2, pids

    tried = []
    for seed in range(11, 80):
        wt = k3.build(seed)
        wv = build_tower(1000 + seed)
        feats = [tower(wv, pixels[n], *grids[n], "bilinear") for n in IMAGES]
        gaps = []
        embeds = expand(wt["model.embed_tokens.weight"], pids, feats)
        logits = k3.forward_embeds(wt, embeds, gaps)
        tgap = k3.top1_gap(logits)
        rgap = min(gaps)
        tried.append({"seed": seed, "min_router_gap": rgap, "min_top1_gap": tgap})
        if rgap > 2.5e-4 and tgap > 2e-3:
            break
    else:
        raise SystemExit(f"no seed met the gap criteria: {tried}")
    print(f"[kimi_k3-vision] seed={seed} T={embeds.shape[0]} router gap {rgap:.2e} top1 gap {tgap:.2e}")

    # The answer in float64; the float32 pass above must agree with it.
    wt64 = {k: v.double() for k, v in wt.items()}
    wv64 = {k: v.double() for k, v in wv.items()}
    feats64 = {n: tower(wv64, pixels[n].double(), *grids[n], "bilinear") for n in IMAGES}
    bicubic64 = {n: tower(wv64, pixels[n].double(), *grids[n], "bicubic") for n in IMAGES}
    feat_diff = max((feats64[n].float() - f).abs().max().item() for n, f in zip(IMAGES, feats))
    mode_change = max((feats64[n] - bicubic64[n]).abs().max().item() for n in IMAGES)
    assert mode_change > 1e-3, mode_change
    embeds64 = expand(wt64["model.embed_tokens.weight"], pids, [feats64[n] for n in IMAGES])
    logits64 = k3.forward_embeds(wt64, embeds64)
    logit_diff = (logits64.float() - logits).abs().max().item()

    # Greedy continuation: each step the whole expanded prompt again (no cache).
    cont, cur = [], embeds64
    for _ in range(GREEDY):
        t = int(torch.argmax(k3.forward_embeds(wt64, cur)[-1]))
        cont.append(t)
        cur = torch.cat([cur, wt64["model.embed_tokens.weight"][t].unsqueeze(0)])
    tf_checks = check_against_transformers(wv)

    # The CLI's layout (`waste run --image A --image B -p TEXT`): every image
    # before the text, as the release's own CLI puts them.
    cli_text = "Which one is taller?"
    cli_ids = tok.encode(markup("a") + markup("b")).ids + tok.encode(cli_text).ids
    cli_cont, cur = [], expand(wt64["model.embed_tokens.weight"], cli_ids, [feats64[n] for n in IMAGES])
    for _ in range(GREEDY):
        t = int(torch.argmax(k3.forward_embeds(wt64, cur)[-1]))
        cli_cont.append(t)
        cur = torch.cat([cur, wt64["model.embed_tokens.weight"][t].unsqueeze(0)])
    cli_top1_gap = k3.top1_gap(k3.forward_embeds(wt64, cur)[:-1])

    # `waste chat` with `/image A`, `/image B`, then the text: the fixture's
    # ChatML template with the images' markup before the user's content.
    chat_text = "<|im_start|>user\n" + markup("a") + markup("b") + cli_text + "<|im_end|>\n<|im_start|>assistant\n"
    chat_ids = tok.encode(chat_text).ids
    chat_cont, cur = [], expand(wt64["model.embed_tokens.weight"], chat_ids, [feats64[n] for n in IMAGES])
    for _ in range(GREEDY):
        t = int(torch.argmax(k3.forward_embeds(wt64, cur)[-1]))
        chat_cont.append(t)
        cur = torch.cat([cur, wt64["model.embed_tokens.weight"][t].unsqueeze(0)])
    chat_top1_gap = k3.top1_gap(k3.forward_embeds(wt64, cur)[:-1])

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    stored = {k3.PREFIX + k: v.contiguous() for k, v in wt.items()}
    stored.update({k: v.contiguous() for k, v in wv.items()})
    save_file(stored, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    config = dict(k3.CONFIG)
    config["vision_config"] = VISION
    config["media_placeholder_token_id"] = PAD_ID
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (OUT / "preprocessor_config.json").write_text(json.dumps(
        {"processor_class": "KimiK3VisionProcessor", "media_proc_cfg": MEDIA_PROC}, indent=2) + "\n")
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(gen_fixtures.TOKENIZER_CONFIG, indent=2) + "\n")
    for n, arr in arrays.items():
        Image.fromarray(arr, "RGB").save(OUT / f"image_{n}.png")
        (OUT / f"features_{n}.f32").write_bytes(feats64[n].float().numpy().astype("<f4").tobytes())
        (OUT / f"features_{n}_bicubic.f32").write_bytes(bicubic64[n].float().numpy().astype("<f4").tobytes())
        assert np.array_equal(np.asarray(Image.open(OUT / f"image_{n}.png")), arr)
    (OUT / "reference_logits.f32").write_bytes(logits64.float().numpy().astype("<f4").tobytes())
    ref = {
        "family": "kimi_k3",
        "reference": "pure-torch K3 text model (tests/gen_k3_fixtures.py) and vision tower from "
                     "../shared/design/K3-VISION.md (tests/gen_k3_vision_tower.py)",
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
        "seed": seed,
        "tower_seed": 1000 + seed,
        "candidates_tried": tried,
        "prompt_text": text,
        "prompt_ids": pids,
        "media_placeholder_token_id": PAD_ID,
        "images": {n: {"file": f"image_{n}.png", "size": list(IMAGES[n]), "grid": list(grids[n]),
                       "features_file": f"features_{n}.f32", "features_bicubic_file": f"features_{n}_bicubic.f32",
                       "features_shape": [grids[n][0] * grids[n][1] // 4, TEXT_H],
                       "pixel_values_fnv1a64": pre.fnv1a64(pixels[n].numpy().astype("<f4").tobytes())}
                   for n in IMAGES},
        "expanded_length": int(embeds64.shape[0]),
        "logits_file": "reference_logits.f32",
        "logits_shape": [int(embeds64.shape[0]), k3.V],
        "logits_note": "every position of the prompt after each pad is replaced by its image's rows",
        "greedy_ids": cont,
        "greedy_note": "each step a full forward over the expanded prompt + tokens so far (no cache)",
        "cli": {"images": ["image_a.png", "image_b.png"], "text": cli_text, "prompt_ids": cli_ids,
                "greedy_ids": cli_cont, "greedy_text": tok.decode(cli_cont),
                "min_top1_gap": cli_top1_gap,
                "note": "both images' markup before the text; greedy from the float64 reference"},
        "chat": {"rendered": chat_text, "prompt_ids": chat_ids, "greedy_ids": chat_cont,
                 "greedy_text": tok.decode(chat_cont), "min_top1_gap": chat_top1_gap,
                 "note": "/image A, /image B, then the text through the fixture's ChatML template"},
        "min_router_gap": rgap,
        "min_top1_gap": tgap,
        "f32_vs_f64_max_abs_feature_diff": feat_diff,
        "f32_vs_f64_max_abs_logit_diff": logit_diff,
        "bilinear_vs_bicubic_max_abs_feature_diff": mode_change,
        "transformers_checks": tf_checks,
        "max_abs_feature": max(f.abs().max().item() for f in feats64.values()),
        "max_abs_logit": logits64.abs().max().item(),
        "dtype": "float32 weights; features and logits computed in float64, stored as float32",
        "deviations": ["float32/float64 rather than the release's bfloat16",
                       "eager attention rather than flash attention"],
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"features f32 vs f64 {feat_diff:.2e}, logits {logit_diff:.2e}, bilinear vs bicubic "
          f"{mode_change:.2e}; {tf_checks}")


if __name__ == "__main__":
    main()
