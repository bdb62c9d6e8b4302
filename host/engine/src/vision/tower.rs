//! Kimi K3's vision tower and projector (../shared/design/K3-VISION.md
//! §2.2): the patch embedding, the learned position grid resized to the
//! image, 27 pre-norm encoder layers (RMSNorm, packed QKV, 2-D RoPE,
//! bidirectional attention, tanh-GELU MLP), the final norm, the 2x2 merge
//! and `PatchMergerMLPV2`. Fields are named after the checkpoint's tensors;
//! the matrices are the trunk's (`QMatrix`: f32 from a checkpoint, q8 in a
//! container) and run through `QMatrix::matmul`, all patches of a layer at
//! once.
//!
//! One image is one attention sequence (the release's block-diagonal
//! `cu_seqlens`), so the tower runs image by image. The release computes in
//! bf16 with flash attention; this is f32 throughout, the softmax too.

use rayon::prelude::*;

use super::preprocess::Preprocessed;
use crate::config::layout::Tensor;
use crate::config::{GridResize, VisionConfig, MAX_GRID_SIDE};
use crate::error::{Error, Result};
use crate::quant::{matmul_block, QMatrix};
use crate::source::TensorSource;
use crate::transformer::check_finite;
use crate::transformer::ops::rms_norm_in_place;

/// Patches whose MLP runs at once: bounds the `[tokens, intermediate]`
/// buffer (65536 patches x 4096 would be 1 GiB) without changing a value.
const MLP_CHUNK: usize = 1024;

/// `vision_tower.encoder.blocks.N`.
struct EncoderBlock {
    norm0: Vec<f32>, // [D]
    /// `[3 * Q, D]`: rows of q, then k, then v; head h at `h * head_dim`
    /// within each.
    wqkv: QMatrix,
    wo: QMatrix,     // [D, Q]
    norm1: Vec<f32>, // [D]
    /// `mlp.fc0` `[I, D]`, `mlp.fc1` `[D, I]`.
    mlp_fc0: QMatrix,
    mlp_fc1: QMatrix,
}

/// `mm_projector` (`PatchMergerMLPV2`): `post_norm(proj.2(gelu(proj.0 m)))`.
struct Projector {
    proj_0: QMatrix,     // [4D, 4D]
    proj_2: QMatrix,     // [T, 4D]
    post_norm: Vec<f32>, // [T]
}

pub struct VisionTower {
    cfg: VisionConfig,
    /// `vision_tower.patch_embed.proj.weight` `[D, 3, p, p]` as `[D, 3 p p]`
    /// (flat `(c, y, x)`, the layout of a preprocessed patch).
    patch_embed_proj: QMatrix,
    /// `vision_tower.patch_embed.pos_emb.weight` `[H0, W0, D]`.
    pos_emb: Vec<f32>,
    blocks: Vec<EncoderBlock>,
    /// `vision_tower.encoder.final_layernorm.weight` `[D]`.
    final_layernorm: Vec<f32>,
    mm_projector: Projector,
}

/// Reads the tower's tensors at the shapes `VisionConfig::tensors` gives
/// them.
struct Loader<'a> {
    src: &'a dyn TensorSource,
}

impl Loader<'_> {
    fn shape<'t>(&self, t: &'t Tensor) -> Result<&'t [usize]> {
        if !self.src.has(&t.name) {
            return Err(Error::Runtime(format!("weight `{}` of the vision tower is missing from the model", t.name)));
        }
        Ok(&t.shape)
    }

    fn matrix(&self, t: &Tensor) -> Result<QMatrix> {
        let name = &t.name;
        match *self.shape(t)? {
            [rows, cols] => self.src.matrix_view(name, rows, cols),
            ref other => Err(Error::Runtime(format!("`{name}` is read as {other:?}, not a matrix"))),
        }
    }

    fn vector(&self, t: &Tensor) -> Result<Vec<f32>> {
        let name = &t.name;
        let want = self.shape(t)?.iter().product::<usize>();
        let v = self.src.vector(name)?;
        if v.len() != want {
            return Err(Error::Runtime(format!(
                "weight `{name}` has length {}, the vision config implies {want}",
                v.len()
            )));
        }
        Ok(v)
    }
}

impl VisionTower {
    pub fn load(cfg: &VisionConfig, src: &dyn TensorSource) -> Result<VisionTower> {
        let ld = Loader { src };
        let t = cfg.tensors();
        let blocks = t
            .blocks
            .iter()
            .map(|b| {
                Ok(EncoderBlock {
                    norm0: ld.vector(&b.norm0)?,
                    wqkv: ld.matrix(&b.wqkv)?,
                    wo: ld.matrix(&b.wo)?,
                    norm1: ld.vector(&b.norm1)?,
                    mlp_fc0: ld.matrix(&b.mlp_fc0)?,
                    mlp_fc1: ld.matrix(&b.mlp_fc1)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(VisionTower {
            cfg: *cfg,
            patch_embed_proj: ld.matrix(&t.patch_embed_proj)?,
            pos_emb: ld.matrix(&t.pos_emb)?.dequantize(),
            blocks,
            final_layernorm: ld.vector(&t.final_layernorm)?,
            mm_projector: Projector {
                proj_0: ld.matrix(&t.proj_0)?,
                proj_2: ld.matrix(&t.proj_2)?,
                post_norm: ld.vector(&t.post_norm)?,
            },
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// The projected rows of one preprocessed image, `[(gh/2) (gw/2),
    /// text_hidden]`: merged token `(a, b)` at row `a * gw/2 + b`.
    pub fn forward(&self, image: &Preprocessed) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (gh, gw) = image.plan.grid;
        let p = cfg.patch_size;
        if gh == 0 || gw == 0 || gh % cfg.merge.0 != 0 || gw % cfg.merge.1 != 0 {
            return Err(Error::Arg(format!("a {gh}x{gw} patch grid is not whole 2x2 merge cells")));
        }
        if gh > MAX_GRID_SIDE || gw > MAX_GRID_SIDE {
            return Err(Error::Arg(format!("a {gh}x{gw} patch grid exceeds the tower's {MAX_GRID_SIDE} a side")));
        }
        if image.pixel_values.len() != gh * gw * 3 * p * p {
            return Err(Error::Arg(format!(
                "{} pixel values for a {gh}x{gw} grid of {p}-pixel patches",
                image.pixel_values.len()
            )));
        }
        let (n, d, q) = (gh * gw, cfg.hidden, cfg.qkv_hidden);
        let mut x = vec![0f32; n * d];
        self.patch_embed_proj.matmul(&image.pixel_values, &mut x);
        {
            let grid = resize_grid(&self.pos_emb, cfg.pos_grid, (gh, gw), d, cfg.grid_resize);
            x.iter_mut().zip(&grid).for_each(|(a, b)| *a += b);
        }

        let rope = Rope2d::new(cfg.head_dim(), gh, gw);
        let mut xn = vec![0f32; n * d];
        let mut qkv = vec![0f32; n * 3 * q];
        let mut att = vec![0f32; n * q];
        let mut out = vec![0f32; n * d];
        let chunk = MLP_CHUNK.min(n);
        let mut hidden = vec![0f32; chunk * cfg.intermediate];
        for (l, b) in self.blocks.iter().enumerate() {
            // h = x + wo . attn(norm0(x))
            xn.copy_from_slice(&x);
            xn.chunks_exact_mut(d).for_each(|r| rms_norm_in_place(r, &b.norm0, cfg.rms_eps));
            b.wqkv.matmul(&xn, &mut qkv);
            qkv.par_chunks_exact_mut(3 * q).enumerate().for_each(|(t, row)| rope.apply(t, &mut row[..2 * q]));
            attention(&qkv, n, cfg.heads, cfg.head_dim(), &mut att);
            b.wo.matmul(&att, &mut out);
            x.iter_mut().zip(&out).for_each(|(a, o)| *a += o);
            // x = h + fc1 . gelu_tanh(fc0 . norm1(h)), a chunk of patches at a time
            xn.copy_from_slice(&x);
            xn.chunks_exact_mut(d).for_each(|r| rms_norm_in_place(r, &b.norm1, cfg.rms_eps));
            for (xc, (hc_in, oc)) in x.chunks_mut(chunk * d).zip(xn.chunks(chunk * d).zip(out.chunks_mut(chunk * d))) {
                let rows = hc_in.len() / d;
                let h = &mut hidden[..rows * cfg.intermediate];
                b.mlp_fc0.matmul(hc_in, h);
                h.iter_mut().for_each(|v| *v = gelu_tanh(*v));
                b.mlp_fc1.matmul(h, oc);
                xc.iter_mut().zip(oc.iter()).for_each(|(a, o)| *a += o);
            }
            check_finite(&x, || format!("vision tower layer {l}"), usize::MAX)?;
        }
        drop((xn, qkv, att, out, hidden));
        x.chunks_exact_mut(d).for_each(|r| rms_norm_in_place(r, &self.final_layernorm, cfg.rms_eps));

        let merged = merge_2x2(&x, gh, gw, d);
        drop(x);
        let tokens = n / 4;
        let m = cfg.merged_width();
        let mut mid = vec![0f32; tokens * m];
        let pr = &self.mm_projector;
        pr.proj_0.matmul(&merged, &mut mid);
        mid.iter_mut().for_each(|v| *v = gelu_erf(*v));
        let mut rows = vec![0f32; tokens * cfg.text_hidden];
        pr.proj_2.matmul(&mid, &mut rows);
        rows.chunks_exact_mut(cfg.text_hidden).for_each(|r| rms_norm_in_place(r, &pr.post_norm, cfg.projector_eps));
        check_finite(&rows, || "the vision projector".into(), usize::MAX)?;
        Ok(rows)
    }
}

/// `PytorchGELUTanh`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// `nn.GELU()`, the exact form: `0.5 x (1 + erf(x / sqrt 2))`.
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The tower's 2-D rotary table (`Rope2DPosEmbRepeated`, computed in f32
/// as the release does): for the patch at row r, column c and i < hd/4,
/// `f_i = 1 / 10000^(4i / hd)`; complex pair 2i turns by `c f_i`, pair
/// 2i+1 by `r f_i`, the same for every head and layer.
struct Rope2d {
    head_dim: usize,
    /// `[n][hd / 2]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope2d {
    fn new(head_dim: usize, gh: usize, gw: usize) -> Rope2d {
        let quarter = head_dim / 4;
        let freqs: Vec<f32> = (0..quarter).map(|i| 1.0 / 10000f32.powf((4 * i) as f32 / head_dim as f32)).collect();
        let half = head_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; gh * gw * half], vec![0f32; gh * gw * half]);
        for r in 0..gh {
            for c in 0..gw {
                let t = r * gw + c;
                for (i, &f) in freqs.iter().enumerate() {
                    for (j, pos) in [(2 * i, c), (2 * i + 1, r)] {
                        let angle = pos as f32 * f;
                        cos[t * half + j] = angle.cos();
                        sin[t * half + j] = angle.sin();
                    }
                }
            }
        }
        Rope2d { head_dim, cos, sin }
    }

    /// Rotates the q and k halves of patch `t`'s packed row (`[2][heads][hd]`)
    /// in place: `(a, b) -> (a cos - b sin, a sin + b cos)` on pairs
    /// `(2j, 2j + 1)`.
    fn apply(&self, t: usize, qk: &mut [f32]) {
        let half = self.head_dim / 2;
        let (cos, sin) = (&self.cos[t * half..(t + 1) * half], &self.sin[t * half..(t + 1) * half]);
        for head in qk.chunks_exact_mut(self.head_dim) {
            for (j, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos[j] - b * sin[j];
                pair[1] = a * sin[j] + b * cos[j];
            }
        }
    }
}

/// Queries per attention task, a whole number of `matmul_block`'s 3-input
/// tiles: their scores against 1024 keys are 96 KB, in L2.
const QUERY_BLOCK: usize = 24;

/// Full (non-causal) attention of every patch over every patch, head by
/// head, from packed rows `[n][3][heads][hd]` into `[n][heads][hd]`:
/// `softmax(q k^T / sqrt(hd)) v`, the scale applied to each score before
/// the softmax. A head's keys are copied out as `[n][hd]` rows and its
/// values transposed to `[hd][n]` (`2 n hd` floats, one head at a time), so
/// that both products run as register-tiled matmuls (`matmul_block`) over a
/// block of queries. Reading the keys in place, `3 q` floats apart, streamed
/// the whole QKV buffer (19 MB at 1024 patches) from L3 per query and head.
fn attention(qkv: &[f32], n: usize, heads: usize, hd: usize, out: &mut [f32]) {
    let q = heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut keys = vec![0f32; n * hd];
    let mut values_t = vec![0f32; hd * n];
    for h in 0..heads {
        keys.par_chunks_exact_mut(hd).enumerate().for_each(|(t, k)| {
            let at = t * 3 * q + q + h * hd;
            k.copy_from_slice(&qkv[at..at + hd]);
        });
        values_t.par_chunks_exact_mut(n).enumerate().for_each(|(j, vt)| {
            for (t, v) in vt.iter_mut().enumerate() {
                *v = qkv[t * 3 * q + 2 * q + h * hd + j];
            }
        });
        out.par_chunks_mut(QUERY_BLOCK * q).enumerate().for_each(|(b, rows)| {
            let t0 = b * QUERY_BLOCK;
            let nb = rows.len() / q;
            let mut queries = vec![0f32; nb * hd];
            for (i, qi) in queries.chunks_exact_mut(hd).enumerate() {
                let at = (t0 + i) * 3 * q + h * hd;
                qi.copy_from_slice(&qkv[at..at + hd]);
            }
            // scores[key][i] = k . q_i
            let mut scores = vec![0f32; n * nb];
            matmul_block(&keys, &queries, hd, &mut scores);
            let mut probs = vec![0f32; nb * n];
            for (i, p) in probs.chunks_exact_mut(n).enumerate() {
                for (key, pk) in p.iter_mut().enumerate() {
                    *pk = scores[key * nb + i] * scale;
                }
                crate::transformer::ops::softmax(p);
            }
            // o[j][i] = sum over keys of p_i[key] v[key][j]
            let mut o = vec![0f32; hd * nb];
            matmul_block(&values_t, &probs, n, &mut o);
            for (i, row) in rows.chunks_exact_mut(q).enumerate() {
                for (j, r) in row[h * hd..(h + 1) * hd].iter_mut().enumerate() {
                    *r = o[j * nb + i];
                }
            }
        });
    }
}

/// Bytes `VisionTower::forward` allocates at its peak for an image of
/// `patches` patches on `threads` threads: the residual, its normed copy,
/// the packed QKV, the attention output, the layer output, an MLP chunk, the
/// RoPE table, one head's keys and transposed values, and each thread's
/// query block, scores, probabilities and output (the merge and projector
/// buffers come after the layers' are freed and are smaller).
pub fn activation_bytes(cfg: &VisionConfig, patches: usize, threads: usize) -> u64 {
    let (d, q, hd) = (cfg.hidden, cfg.qkv_hidden, cfg.head_dim());
    let per_patch = 3 * d + 4 * q + 3 * hd;
    let per_thread = QUERY_BLOCK * (2 * hd + 2 * patches);
    let floats = patches * per_patch + MLP_CHUNK.min(patches) * cfg.intermediate + threads.max(1) * per_thread;
    4 * floats as u64
}

/// Token `(a, b)` of the `(gh/2) x (gw/2)` output is the concatenation of
/// patches `(2a, 2b)`, `(2a, 2b+1)`, `(2a+1, 2b)`, `(2a+1, 2b+1)`
/// (`tpool_patch_merger` at t = 1).
fn merge_2x2(x: &[f32], gh: usize, gw: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for a in 0..gh / 2 {
        for b in 0..gw / 2 {
            for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let t = (2 * a + dy) * gw + 2 * b + dx;
                out.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
        }
    }
    out
}

/// The learned `[h0, w0, d]` grid resized to `(gh, gw)` as
/// `F.interpolate([1, d, h0, w0], size=(gh, gw), mode, align_corners=False)`
/// does it (no antialiasing), flattened row-major to `[gh * gw, d]`; the
/// grid itself when the sizes agree (the release skips the call).
pub fn resize_grid(
    grid: &[f32],
    (h0, w0): (usize, usize),
    (gh, gw): (usize, usize),
    d: usize,
    mode: GridResize,
) -> Vec<f32> {
    if (h0, w0) == (gh, gw) {
        return grid.to_vec();
    }
    let ys = taps(h0, gh, mode);
    let xs = taps(w0, gw, mode);
    let mut out = vec![0f32; gh * gw * d];
    for (oy, ty) in ys.iter().enumerate() {
        for (ox, tx) in xs.iter().enumerate() {
            let o = &mut out[(oy * gw + ox) * d..(oy * gw + ox + 1) * d];
            for &(iy, wy) in ty {
                // torch sums each source row's taps first, then the rows.
                let mut acc = vec![0f32; d];
                for &(ix, wx) in tx {
                    let src = &grid[(iy * w0 + ix) * d..(iy * w0 + ix + 1) * d];
                    acc.iter_mut().zip(src).for_each(|(a, &s)| *a += wx * s);
                }
                o.iter_mut().zip(&acc).for_each(|(a, &s)| *a += wy * s);
            }
        }
    }
    out
}

/// The source taps and weights of each output index along one axis.
fn taps(input: usize, output: usize, mode: GridResize) -> Vec<Vec<(usize, f32)>> {
    let scale = input as f32 / output as f32;
    let last = input - 1;
    (0..output)
        .map(|o| {
            let src = (o as f32 + 0.5) * scale - 0.5;
            match mode {
                GridResize::Bilinear => {
                    // Negative source positions clamp to the first pixel.
                    let src = src.max(0.0);
                    let i0 = (src.floor() as usize).min(last);
                    let i1 = (i0 + 1).min(last);
                    let l1 = src - i0 as f32;
                    vec![(i0, 1.0 - l1), (i1, l1)]
                }
                GridResize::Bicubic => {
                    let i = src.floor();
                    let t = src - i;
                    let i = i as isize;
                    cubic_weights(t)
                        .into_iter()
                        .enumerate()
                        .map(|(k, w)| ((i - 1 + k as isize).clamp(0, last as isize) as usize, w))
                        .collect()
                }
            }
        })
        .collect()
}

/// Keys' cubic convolution with torch's a = -0.75, for taps at -1, 0, 1, 2.
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At equal sizes the grid is used as stored; a 1-pixel axis repeats.
    #[test]
    fn resize_grid_keeps_equal_sizes_and_clamps_edges() {
        let grid: Vec<f32> = (0..2 * 3 * 2).map(|v| v as f32).collect();
        for mode in [GridResize::Bilinear, GridResize::Bicubic] {
            assert_eq!(resize_grid(&grid, (2, 3), (2, 3), 2, mode), grid);
        }
        let one = vec![5.0f32, -1.0];
        for mode in [GridResize::Bilinear, GridResize::Bicubic] {
            let out = resize_grid(&one, (1, 1), (3, 2), 2, mode);
            for r in out.chunks_exact(2) {
                assert!((r[0] - 5.0).abs() < 1e-5 && (r[1] + 1.0).abs() < 1e-5, "{mode:?} {r:?}");
            }
        }
    }

    /// The cubic's weights sum to one at every offset (torch's kernel).
    #[test]
    fn cubic_weights_sum_to_one() {
        for k in 0..=16 {
            let w = cubic_weights(k as f32 / 16.0);
            assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{w:?}");
        }
    }

    #[test]
    fn merge_takes_two_by_two_cells_in_raster_order() {
        // 2 x 4 patches of width 1 valued by their index.
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(merge_2x2(&x, 2, 4, 1), vec![0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
    }
}
