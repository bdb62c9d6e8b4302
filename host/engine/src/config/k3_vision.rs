//! Kimi K3's `vision_config` (../shared/design/K3-VISION.md §1): the tower
//! (a ViT of `vt_*` sizes with RMSNorm, packed QKV, 2-D RoPE and a tanh-GELU
//! MLP), the 2x2 merge and the RMS-normed projector to the text width.
//! Only the release's structure is accepted; any other `norm_type`,
//! projector, merge or bias setting is refused by name rather than run
//! wrongly.

use serde_json::Value;

use super::layout::Tensor;
use super::{Reader, MAX_HEADS, MAX_HIDDEN, MAX_INTER, MAX_LAYERS};
use crate::error::Result;

/// How the learned position grid is resized to an image's patch grid:
/// `F.interpolate(mode=pos_emb_interpolation_mode, align_corners=False)`,
/// no antialiasing. The release's config says bilinear and its modeling
/// code passes the field through (MindSpeed-MM's copy of
/// modeling_kimi_k3.py); one inference port hard-codes bicubic, so both
/// are implemented (K3-VISION.md §5 item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridResize {
    Bilinear,
    /// Keys' cubic with a = -0.75, border taps clamped (torch's
    /// `upsample_bicubic2d`).
    Bicubic,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisionConfig {
    /// `patch_size`: the conv's kernel and stride.
    pub patch_size: usize,
    /// `init_pos_emb_height`, `init_pos_emb_width`: the learned grid.
    pub pos_grid: (usize, usize),
    pub grid_resize: GridResize,
    /// `vt_hidden_size`.
    pub hidden: usize,
    /// `vt_num_attention_heads`.
    pub heads: usize,
    /// `qkv_hidden_size`: heads x head dim (1536 against a width of 1024).
    pub qkv_hidden: usize,
    /// `vt_intermediate_size`.
    pub intermediate: usize,
    /// `vt_num_hidden_layers`.
    pub layers: usize,
    /// The tower's RMSNorm epsilon. The release builds `nn.RMSNorm(1024)`
    /// without one, so torch uses `finfo(float32).eps` for float32 and
    /// bfloat16 inputs; `vt_rms_eps` (ours, absent from the release)
    /// overrides it (K3-VISION.md §5 item 2).
    pub rms_eps: f32,
    /// `merge_kernel_size` (`sd2_tpool`: 2x2).
    pub merge: (usize, usize),
    /// `text_hidden_size`: the projector's output, the text model's width.
    pub text_hidden: usize,
    /// `projector_ln_eps`: the projector's `post_norm`.
    pub projector_eps: f32,
    /// `media_placeholder_token_id` (outer config): the one token per image
    /// its rows replace (`<|media_pad|>`, 163605 in the release).
    pub placeholder: u32,
}

/// `torch.finfo(torch.float32).eps`.
pub const TORCH_F32_EPS: f32 = 1.192_092_9e-7;

/// The RoPE table's side (`Rope2DPosEmbRepeated(head_dim, 512, 512)`): no
/// patch grid may be longer.
pub const MAX_GRID_SIDE: usize = 512;

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.qkv_hidden / self.heads
    }

    /// Width of a merged token (`mm_hidden_size` x the merge cell).
    pub fn merged_width(&self) -> usize {
        self.hidden * self.merge.0 * self.merge.1
    }

    /// Every tensor of the tower and the projector, in checkpoint order,
    /// with the shape the forward pass reads it as: 1-D vectors, and 2-D
    /// matrices `[out, in]`; the conv kernel `[D, 3, p, p]` as `[D, 3 p p]`
    /// and the position grid `[H0, W0, D]` as `[H0 W0, D]` (row-major views
    /// of the stored tensors, the form a container keeps them in).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.tensors().list().into_iter().map(|t| (t.name.clone(), t.shape.clone())).collect()
    }

    /// The tower's and the projector's tensors.
    pub fn tensors(&self) -> VisionTensors {
        let (d, q, i, m, p) = (self.hidden, self.qkv_hidden, self.intermediate, self.merged_width(), self.patch_size);
        let t = |prefix: &str, local: &str, shape: Vec<usize>| Tensor { name: format!("{prefix}.{local}"), shape };
        let blocks = (0..self.layers)
            .map(|l| {
                let b = format!("{VISION_TOWER}.encoder.blocks.{l}");
                VisionBlockTensors {
                    norm0: t(&b, "norm0.weight", vec![d]),
                    wqkv: t(&b, "wqkv.weight", vec![3 * q, d]),
                    wo: t(&b, "wo.weight", vec![d, q]),
                    norm1: t(&b, "norm1.weight", vec![d]),
                    mlp_fc0: t(&b, "mlp.fc0.weight", vec![i, d]),
                    mlp_fc1: t(&b, "mlp.fc1.weight", vec![d, i]),
                }
            })
            .collect();
        VisionTensors {
            patch_embed_proj: t(VISION_TOWER, "patch_embed.proj.weight", vec![d, 3 * p * p]),
            pos_emb: t(VISION_TOWER, "patch_embed.pos_emb.weight", vec![self.pos_grid.0 * self.pos_grid.1, d]),
            blocks,
            final_layernorm: t(VISION_TOWER, "encoder.final_layernorm.weight", vec![d]),
            proj_0: t(MM_PROJECTOR, "proj.0.weight", vec![m, m]),
            proj_2: t(MM_PROJECTOR, "proj.2.weight", vec![self.text_hidden, m]),
            post_norm: t(MM_PROJECTOR, "post_norm.weight", vec![self.text_hidden]),
        }
    }

    /// Parameters of the tower and the projector.
    pub fn parameters(&self) -> u64 {
        self.tensor_shapes().iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum()
    }
}

/// The prefixes of the tower's and the projector's tensors.
pub const VISION_TOWER: &str = "vision_tower";
pub const MM_PROJECTOR: &str = "mm_projector";

/// One encoder block of the tower (`vision_tower.encoder.blocks.L`).
#[derive(Debug, Clone)]
pub struct VisionBlockTensors {
    pub norm0: Tensor,   // [D]
    pub wqkv: Tensor,    // [3 Q, D]
    pub wo: Tensor,      // [D, Q]
    pub norm1: Tensor,   // [D]
    pub mlp_fc0: Tensor, // [I, D]
    pub mlp_fc1: Tensor, // [D, I]
}

/// K3's vision tower and projector, in the container's order.
#[derive(Debug, Clone)]
pub struct VisionTensors {
    pub patch_embed_proj: Tensor, // [D, 3 p p]
    pub pos_emb: Tensor,          // [grid_h grid_w, D]
    pub blocks: Vec<VisionBlockTensors>,
    pub final_layernorm: Tensor, // [D]
    pub proj_0: Tensor,          // `mm_projector.proj.0` [M, M]
    pub proj_2: Tensor,          // `mm_projector.proj.2` [text H, M]
    pub post_norm: Tensor,       // [text H]
}

impl VisionTensors {
    pub fn list(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.patch_embed_proj, &self.pos_emb];
        for b in &self.blocks {
            out.extend([&b.norm0, &b.wqkv, &b.wo, &b.norm1, &b.mlp_fc0, &b.mlp_fc1]);
        }
        out.extend([&self.final_layernorm, &self.proj_0, &self.proj_2, &self.post_norm]);
        out
    }
}

/// Whether `name` is a tensor of the tower or the projector.
pub fn is_vision_tensor(name: &str) -> bool {
    [VISION_TOWER, MM_PROJECTOR].iter().any(|p| name.strip_prefix(p).is_some_and(|r| r.starts_with('.')))
}

/// `vision_config` of a kimi_k3 config, with the outer
/// `media_placeholder_token_id`; None when the config has no tower.
pub(super) fn parse(outer: &Reader<'_>, text_hidden: usize) -> Result<Option<VisionConfig>> {
    let obj = match outer.get("vision_config") {
        None => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(v) => return Err(outer.err("vision_config", format!("expected an object, found {v}"))),
    };
    let r = Reader { obj, path: outer.path };
    let key = |k: &str| format!("vision_config.{k}");
    let need = |k: &str, want: &str| -> Result<()> {
        match r.str_opt(k)? {
            Some(v) if v == want => Ok(()),
            Some(v) => Err(r.unsupported(&key(k), format!("`{v}` (the K3 release's `{want}` only)"))),
            None => Err(r.err(&key(k), format!("missing (the K3 release has `{want}`)"))),
        }
    };
    need("norm_type", "rmsnorm")?;
    need("mlp_type", "mlp2")?;
    need("merge_type", "sd2_tpool")?;
    need("mm_projector_type", "patchmergerv2")?;
    need("pos_emb_type", "divided_fixed")?;
    if let Some(act) = r.str_opt("activation_func")? {
        if act != "gelu_pytorch_tanh" {
            return Err(r.unsupported(&key("activation_func"), format!("`{act}` (gelu_pytorch_tanh only)")));
        }
    }
    if let Some(act) = r.str_opt("projector_hidden_act")? {
        if act != "gelu" {
            return Err(r.unsupported(&key("projector_hidden_act"), format!("`{act}` (gelu only)")));
        }
    }
    for b in ["attn_bias", "linear_bias", "patch_embed_proj_bias"] {
        // The release's modeling code defaults each to true when absent.
        if r.bool_opt(b)? != Some(false) {
            return Err(r.unsupported(&key(b), "biases in the tower (the K3 release has none: false)"));
        }
    }
    let sized = |k: &str, max: usize| -> Result<usize> {
        let v = r.usize_opt(k)?.ok_or_else(|| r.err(&key(k), "missing"))?;
        r.bounded(&key(k), v, max)
    };
    let patch_size = sized("patch_size", 64)?;
    let pos_grid = (sized("init_pos_emb_height", MAX_GRID_SIDE)?, sized("init_pos_emb_width", MAX_GRID_SIDE)?);
    let hidden = sized("vt_hidden_size", MAX_HIDDEN)?;
    let heads = sized("vt_num_attention_heads", MAX_HEADS)?;
    let qkv_hidden = match r.usize_opt("qkv_hidden_size")? {
        Some(q) => r.bounded(&key("qkv_hidden_size"), q, MAX_HIDDEN)?,
        None => hidden,
    };
    if qkv_hidden % heads != 0 || (qkv_hidden / heads) % 4 != 0 {
        return Err(r.err(
            &key("qkv_hidden_size"),
            format!("{qkv_hidden} over {heads} heads: the 2-D RoPE needs a head dimension divisible by 4"),
        ));
    }
    let intermediate = sized("vt_intermediate_size", MAX_INTER)?;
    let layers = sized("vt_num_hidden_layers", MAX_LAYERS)?;
    let merge = match r.usize_list("merge_kernel_size")?[..] {
        [2, 2] => (2, 2),
        ref other => return Err(r.unsupported(&key("merge_kernel_size"), format!("{other:?} (sd2_tpool merges 2x2)"))),
    };
    if let Some(mm) = r.usize_opt("mm_hidden_size")? {
        if mm != hidden {
            return Err(r.err(&key("mm_hidden_size"), format!("{mm}, but the tower's width is {hidden}")));
        }
    }
    let text = sized("text_hidden_size", MAX_HIDDEN)?;
    if text != text_hidden {
        return Err(r.err(&key("text_hidden_size"), format!("{text}, but the text model's width is {text_hidden}")));
    }
    let grid_resize = match r.str_opt("pos_emb_interpolation_mode")? {
        None | Some("bilinear") => GridResize::Bilinear,
        Some("bicubic") => GridResize::Bicubic,
        Some(other) => {
            return Err(r.unsupported(&key("pos_emb_interpolation_mode"), format!("`{other}` (bilinear or bicubic)")))
        }
    };
    let positive_eps = |k: &str, default: f32| -> Result<f32> {
        match r.f64_opt(k)? {
            None => Ok(default),
            Some(e) if e > 0.0 && e < 1.0 => Ok(e as f32),
            Some(e) => Err(r.err(&key(k), format!("{e} is outside (0, 1)"))),
        }
    };
    let placeholder = match outer.get("media_placeholder_token_id") {
        Some(v) => outer.token_id("media_placeholder_token_id", v)?,
        None => return Err(outer.err("media_placeholder_token_id", "missing (a vision_config needs the image token)")),
    };
    Ok(Some(VisionConfig {
        patch_size,
        pos_grid,
        grid_resize,
        hidden,
        heads,
        qkv_hidden,
        intermediate,
        layers,
        rms_eps: positive_eps("vt_rms_eps", TORCH_F32_EPS)?,
        merge,
        text_hidden,
        projector_eps: positive_eps("projector_ln_eps", 1e-5)?,
        placeholder,
    }))
}
