"""Gated DeltaNet families for tests/gen_family_fixtures.py: qwen3_next, qwen3_5_moe_text, qwen3_5_moe.

Used by tests/gen_family_fixtures.py (run that). `fla` and `causal_conv1d` are hidden there before
transformers is imported, so `torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`,
`causal_conv1d_fn` and `causal_conv1d_update` of the modeling files run (checked: the calls are counted
and each decorated function's resolved implementation is the pure-torch one).

Models (4 layers: Gated DeltaNet on 0-2, gated full attention on 3; all MoE):
  * tiny-qwen3_next: Qwen3NextForCausalLM, fused `in_proj_qkvz` / `in_proj_ba` (grouped per key head),
    plus random `mtp.*` tensors (release names) that transformers and the engine must skip, plus
    gdn_reference.safetensors (the two delta-rule kernels alone on random inputs, 2 key heads serving 4
    value heads, with an initial state);
  * tiny-qwen3_5_moe_text: Qwen3_5MoeForCausalLM as save_pretrained writes it (model_type
    qwen3_5_moe_text, `model.layers.*`, per-expert tensors), separate in_proj_qkv / z / b / a;
  * tiny-qwen3_5_moe: the same text weights inside Qwen3_5MoeForConditionalGeneration in the release
    layout: model_type qwen3_5_moe with text_config / vision_config, `model.language_model.*` with the
    experts FUSED (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I], as the
    Qwen3.5 releases store them; transformers itself would write per-expert names), a tiny
    `model.visual.*` tower and `mtp.*` tensors; its logits equal the text fixture's exactly.
The prompt is 99 tokens, so the chunked prefill (chunk 64) crosses a chunk boundary.
"""

import inspect

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m35
from transformers.models.qwen3_next import modeling_qwen3_next as mqn

import gen_family_fixtures as gff

TEXT = dict(gff.COMMON, num_hidden_layers=4, head_dim=32, moe_intermediate_size=24, shared_expert_intermediate_size=48,
            num_experts=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, attention_bias=False,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
QN_CONFIG = dict(TEXT, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], intermediate_size=96,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})
Q35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1], "mrope_interleaved": True}
Q35_TEXT_CONFIG = dict(TEXT, rope_parameters=dict(Q35_ROPE))
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, in_channels=3)
VL_TOKENS = dict(image_token_id=509, video_token_id=510, vision_start_token_id=507, vision_end_token_id=508)


def gdn_noise(model, g):
    for mod in model.modules():
        if type(mod).__name__.endswith("GatedDeltaNet"):
            mod.dt_bias.copy_(0.5 * torch.randn(mod.dt_bias.shape, generator=g))


def build_qwen3_next(seed):
    cfg = Qwen3NextConfig(**QN_CONFIG)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return gff.add_noise(Qwen3NextForCausalLM(cfg).float().eval(), seed, gdn_noise)


def build_q35_text(seed):
    cfg = Qwen3_5MoeTextConfig(**Q35_TEXT_CONFIG)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    return gff.add_noise(Qwen3_5MoeForCausalLM(cfg).float().eval(), seed, gdn_noise)


def build_q35_vl(seed):
    text = build_q35_text(seed)
    cfg = Qwen3_5MoeConfig(text_config=dict(Q35_TEXT_CONFIG), vision_config=dict(VISION), tie_word_embeddings=False,
                           **VL_TOKENS)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    cfg.text_config._experts_implementation = "eager"
    torch.manual_seed(seed + 1)
    vl = Qwen3_5MoeForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        vl.model.language_model.load_state_dict(text.model.state_dict())
        vl.lm_head.weight.copy_(text.lm_head.weight)
    return vl


# ------------------------------------------------------------------ checks shared by the three fixtures
KERNELS = ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
           "causal_conv1d_update"]


def kernel_report(module):
    rep = {}
    for name in KERNELS:
        fn = getattr(module, name)
        nl = inspect.getclosurevars(fn).nonlocals
        impl = nl.get("implementation")
        rep[name] = {"resolved": f"{impl.__module__}.{impl.__qualname__}",
                     "pure_torch": (not nl.get("is_new_implementation")) and impl is fn.__wrapped__}
        assert rep[name]["pure_torch"], rep
    return rep


@torch.no_grad()
def recurrent_vs_chunk(model, module, pids):
    """Full-sequence forward (chunked delta rule over the whole prompt) vs the same prompt fed one token
    at a time through the cache (conv-state update + recurrent delta rule after the first token)."""
    counts = {k: 0 for k in KERNELS}
    orig = {k: getattr(module, k) for k in KERNELS}

    def counting(k):
        def f(*a, **kw):
            counts[k] += 1
            return orig[k](*a, **kw)
        return f

    for k in KERNELS:
        setattr(module, k, counting(k))
    try:
        ids = torch.tensor([pids])
        full = model(input_ids=ids).logits[0]
        c_full = dict(counts)
        for k in counts:
            counts[k] = 0
        cache, rows = None, []
        for t in range(ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0, -1])
        step = torch.stack(rows)
        c_step = dict(counts)
    finally:
        for k in KERNELS:
            setattr(module, k, orig[k])
    assert c_full["torch_chunk_gated_delta_rule"] == 3 and c_full["torch_recurrent_gated_delta_rule"] == 0, c_full
    assert c_step["torch_recurrent_gated_delta_rule"] == 3 * (ids.shape[1] - 1), c_step
    return {"chunked_full_forward_vs_token_by_token_recurrent_max_abs_logit_diff": (full - step).abs().max().item(),
            "kernel_calls_full_forward": c_full, "kernel_calls_token_by_token": c_step,
            "kernels": kernel_report(module),
            "reference_path": "reference_logits.f32 = full-sequence forward: causal_conv1d_fn (F.conv1d, padding K-1, "
                              "silu) + torch_chunk_gated_delta_rule (chunk 64) on layers 0-2; generate's decode steps "
                              "use causal_conv1d_update + torch_recurrent_gated_delta_rule"}


@torch.no_grad()
def gdn_kernel_reference(path):
    """The delta rule alone: random q, k (2 heads) and v (4 heads), log-decay g, beta and an initial state,
    through both pure-torch kernels (use_qk_l2norm_in_kernel=True, as the model calls them)."""
    g_ = torch.Generator().manual_seed(77)
    B, T, Hk, Hv, D = 1, 80, 2, 4, 16
    q = torch.randn(B, T, Hk, D, generator=g_)
    k = torch.randn(B, T, Hk, D, generator=g_)
    v = torch.randn(B, T, Hv, D, generator=g_)
    g = -torch.nn.functional.softplus(torch.randn(B, T, Hv, generator=g_))
    beta = torch.sigmoid(torch.randn(B, T, Hv, generator=g_))
    s0 = 0.3 * torch.randn(B, Hv, D, D, generator=g_)
    o_r, s_r = mqn.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=s0.clone(),
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_c, s_c = mqn.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=s0.clone(),
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)
    diff = max((o_r - o_c).abs().max().item(), (s_r - s_c).abs().max().item())
    assert diff < 1e-4, diff
    save_file({n: t[0].contiguous() for n, t in dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=s0,
                                                      out_recurrent=o_r, state_recurrent=s_r, out_chunk=o_c,
                                                      state_chunk=s_c).items()}, str(path),
              metadata={"layout": "q,k [T,Hk=2,D]; v [T,Hv=4,D]; g, beta [T,Hv]; states [Hv,Dk,Dv]; out [T,Hv,Dv]; "
                                  "value head h uses key head h // 2; use_qk_l2norm_in_kernel=True, chunk 64"})
    return diff


def mtp_tensors(saved, src_prefix, layer, fused):
    """Random stand-ins for the release's multi-token-prediction head (mtp.fc, mtp.pre_fc_norm_embedding,
    mtp.pre_fc_norm_hidden, mtp.norm, mtp.layers.0.* = one full-attention MoE decoder layer, its experts
    per-expert as in the Qwen3-Next / Qwen3.5 releases)."""
    g = torch.Generator().manual_seed(4242)
    H = gff.COMMON["hidden_size"]
    out = {"mtp.fc.weight": 0.05 * torch.randn(H, 2 * H, generator=g)}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = 0.2 * torch.randn(H, generator=g)
    pre = f"{src_prefix}.{layer}."
    for k, v in sorted(saved.items()):
        if not k.startswith(pre):
            continue
        rest = k[len(pre):]
        if fused and rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                if rest.endswith("gate_up_proj"):
                    I = v.shape[1] // 2
                    out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = 0.05 * torch.randn(I, v.shape[2], generator=g)
                    out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = 0.05 * torch.randn(I, v.shape[2], generator=g)
                else:
                    out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = 0.05 * torch.randn(v.shape[1:], generator=g)
            continue
        out["mtp.layers.0." + rest] = 0.05 * torch.randn(v.shape, generator=g)
    return out


def layout_note(prefix, fused, fused_qkvz):
    lin = (f"{prefix}.L.linear_attn.in_proj_qkvz.weight [192, 64] (per key head g: q_g [16], k_g [16], v [2 heads x 16], "
           f"z [2 heads x 16]), in_proj_ba.weight [8, 64] (per key head g: b [2], a [2])" if fused_qkvz else
           f"{prefix}.L.linear_attn.in_proj_qkv.weight [128, 64] (q [32] | k [32] | v [64]), in_proj_z.weight [64, 64], "
           f"in_proj_b.weight [4, 64], in_proj_a.weight [4, 64]")
    exp = (f"{prefix}.L.mlp.experts.gate_up_proj [8, 48, 64] (= [E, 2I, H]: rows 0..23 gate, 24..47 up), "
           f"{prefix}.L.mlp.experts.down_proj [8, 64, 24] (= [E, H, I]); y = W x" if fused else
           f"{prefix}.L.mlp.experts.E.{{gate_proj,up_proj}}.weight [24, 64], .down_proj.weight [64, 24]")
    return {"linear_attn": lin + "; conv1d.weight [128, 1, 4]; A_log [4]; dt_bias [4]; norm.weight [16]; "
                                 "out_proj.weight [64, 64]",
            "full_attn": f"{prefix}.3.self_attn.q_proj.weight [256, 64] (per head: 32 query then 32 gate), k_proj / "
                         f"v_proj [64, 64], o_proj [64, 128], q_norm / k_norm [32] (zero-centred)",
            "experts": exp,
            "router_and_shared": f"{prefix}.L.mlp.gate.weight [8, 64]; mlp.shared_expert.{{gate,up}}_proj.weight "
                                 f"[48, 64], down_proj [64, 48]; mlp.shared_expert_gate.weight [1, 64]"}


# ------------------------------------------------------------------ qwen3_next
def post_qwen3_next(model, out_dir):
    path = out_dir / "model.safetensors"
    saved = load_file(str(path))
    n = gff.check_per_expert(saved, model, "model.layers", dict(block="mlp", gate="gate_proj.weight",
                                                               up="up_proj.weight", down="down_proj.weight"), 4)
    mtp = mtp_tensors(saved, "model.layers", 3, fused=False)
    saved.update(mtp)
    gff.save_tensors(path, saved)
    return {"mtp_stand_in": f"{len(mtp)} random mtp.* tensors (release names); transformers ignores ^mtp.* "
                            "(_keys_to_ignore_on_load_unexpected), the engine must too",
            "expert_tensor_layout": dict(layout_note("model.layers", False, True), verified_slices=n)}


def extra_qwen3_next(model, out_dir, pids, r):
    d = recurrent_vs_chunk(model, mqn, pids)
    d["gdn_kernel_reference_recurrent_vs_chunk_max_abs"] = gdn_kernel_reference(out_dir / "gdn_reference.safetensors")
    d["gdn_reference_note"] = ("gdn_reference.safetensors: q, k [80, 2, 16], v [80, 4, 16], g, beta [80, 4], initial_state "
                               "[4, 16, 16] and out / final state of torch_recurrent_gated_delta_rule and "
                               "torch_chunk_gated_delta_rule (use_qk_l2norm_in_kernel=True)")
    return d


GAP_NOTE = ("min over every router call (prompt forward, generate prefill and decode steps, full forward over "
            "prompt+greedy) of p_(k) - p_(k+1), p = softmax(router_logits) sorted descending, k = top_k")
NOISE_NOTE = ("after init: every zero-centred RMSNorm weight (input, post-attention, q/k norm, final; applied as 1 + w) "
              "= 0.2*randn, every gated-norm weight (linear_attn.norm, applied as w) = 1 + 0.2*randn, then dt_bias "
              "= 0.5*randn (torch.Generator seeded with seed+7919); A_log as initialised (log U(0.01, 16)); no biases")

QWEN3_NEXT = dict(
    name="qwen3_next", family="qwen3_next", model_cls=Qwen3NextForCausalLM, build=build_qwen3_next,
    router_cls="Qwen3NextTopKRouter", gap=gff.softmax_gap, prompt=gff.PROMPT_LONG, seeds=range(8000, 8400),
    post_save=post_qwen3_next, extra=extra_qwen3_next, noise_note=NOISE_NOTE, gap_note=GAP_NOTE,
)


# ------------------------------------------------------------------ qwen3_5_moe
def post_q35_text(model, out_dir):
    saved = load_file(str(out_dir / "model.safetensors"))
    n = gff.check_per_expert(saved, model, "model.layers", dict(block="mlp", gate="gate_proj.weight",
                                                               up="up_proj.weight", down="down_proj.weight"), 4)
    return {"expert_tensor_layout": dict(layout_note("model.layers", False, False), verified_slices=n,
                                         saved_format="as Qwen3_5MoeForCausalLM.save_pretrained writes it: per-expert")}


def extra_q35(model, out_dir, pids, r):
    return recurrent_vs_chunk(model, m35, pids)


def after_q35_text(model, out_dir, ref, tok):
    Q35_VL["seeds"] = [ref["seed"]]
    # The VL wrapper's image / video / vision start / end ids: the four highest ids that occur neither in
    # the prompt nor in the greedy continuation (the tiny vocabulary has no spare special ids).
    free = sorted(set(range(gff.N_SPECIAL, gff.VOCAB_SIZE)) - set(ref["prompt_ids"]) - set(ref["greedy_ids"]))
    VL_TOKENS.update(vision_start_token_id=free[-4], vision_end_token_id=free[-3], image_token_id=free[-2],
                     video_token_id=free[-1])
    Q35_VL["text_reference"] = out_dir / "reference_logits.f32"


def post_q35_vl(model, out_dir):
    """Rewrite transformers' per-expert names into the release's fused expert tensors, add mtp.*."""
    path = out_dir / "model.safetensors"
    saved = load_file(str(path))
    pre = "model.language_model.layers"
    fused = {}
    for L, layer in enumerate(model.model.language_model.layers):
        ex = layer.mlp.experts
        gate = [saved.pop(f"{pre}.{L}.mlp.experts.{e}.gate_proj.weight") for e in range(ex.num_experts)]
        up = [saved.pop(f"{pre}.{L}.mlp.experts.{e}.up_proj.weight") for e in range(ex.num_experts)]
        down = [saved.pop(f"{pre}.{L}.mlp.experts.{e}.down_proj.weight") for e in range(ex.num_experts)]
        gu = torch.stack([torch.cat([g_, u_], 0) for g_, u_ in zip(gate, up)])
        dn = torch.stack(down)
        assert torch.equal(gu, ex.gate_up_proj) and torch.equal(dn, ex.down_proj)
        fused[f"{pre}.{L}.mlp.experts.gate_up_proj"], fused[f"{pre}.{L}.mlp.experts.down_proj"] = gu, dn
    saved.update(fused)
    mtp = mtp_tensors(saved, pre, 3, fused=True)
    saved.update(mtp)
    gff.save_tensors(path, saved)
    n_vis = sum(1 for k in saved if k.startswith("model.visual."))
    return {"mtp_stand_in": f"{len(mtp)} random mtp.* tensors (release names, experts per-expert); ignored by "
                            "transformers (^mtp.*) and to be skipped by the engine",
            "visual_tower": f"{n_vis} model.visual.* tensors (a 1-block Qwen3_5MoeVisionModel, random); the engine "
                            "must skip them for text",
            "expert_tensor_layout": dict(layout_note(pre, True, False),
                                         saved_format="release layout: fused 3-D experts (no .weight suffix); "
                                                      "transformers' own save_pretrained would write per-expert "
                                                      "names; both load to identical logits")}


def extra_q35_vl(model, out_dir, pids, r):
    assert not set(VL_TOKENS.values()) & set(pids + r["greedy"])
    d = extra_q35(model, out_dir, pids, r)
    import numpy as np
    text = np.fromfile(Q35_VL["text_reference"], dtype="<f4")
    ours = r["prompt_logits"].numpy().reshape(-1)
    d["max_abs_logit_diff_vs_tiny_qwen3_5_moe_text"] = float(np.abs(text - ours).max())
    d["same_text_weights_as"] = "tests/fixtures/tiny-qwen3_5_moe_text (copied into model.language_model + lm_head)"
    return d


Q35_TEXT = dict(
    name="qwen3_5_moe_text", family="qwen3_5_moe_text", model_cls=Qwen3_5MoeForCausalLM, build=build_q35_text,
    router_cls="Qwen3_5MoeTopKRouter", gap=gff.softmax_gap, prompt=gff.PROMPT_LONG, seeds=range(9000, 9400),
    post_save=post_q35_text, extra=extra_q35, after=after_q35_text, noise_note=NOISE_NOTE, gap_note=GAP_NOTE,
)
Q35_VL = dict(
    name="qwen3_5_moe", family="qwen3_5_moe", model_cls=Qwen3_5MoeForConditionalGeneration, build=build_q35_vl,
    router_cls="Qwen3_5MoeTopKRouter", gap=gff.softmax_gap, prompt=gff.PROMPT_LONG, seeds=None,
    post_save=post_q35_vl, extra=extra_q35_vl, noise_note=NOISE_NOTE + "; the vision tower as initialised (seed+1)",
    gap_note=GAP_NOTE,
)

GDN_SPECS = {"qwen3_next": [QWEN3_NEXT], "qwen3_5_moe": [Q35_TEXT, Q35_VL]}
