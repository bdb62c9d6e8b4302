//! Kimi K3's image preprocessing as the release's processor does it
//! (../shared/design/K3-VISION.md §2.1): the resize plan, Pillow's BICUBIC
//! resample (its fixed-point two-pass filter, and for RGBA its premultiplied
//! `RGBa` round trip), the chessboard under transparent pixels, zero padding
//! to whole merge cells, the normalisation with numpy's promotions, and the
//! patches in raster order. Bit for bit against Pillow and numpy
//! (tests/gen_k3_vision_preprocess.py).

use crate::container::Container;
use crate::error::{Error, Result};

/// The processor's settings (`media_proc_cfg` of preprocessor_config.json).
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    pub patch_size: usize,
    pub merge_kernel_size: usize,
    /// Most patches an image may keep before it is scaled down.
    pub in_patch_limit: usize,
    /// Most patches along either side.
    pub patch_limit_on_one_side: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub chessboard: Chessboard,
}

/// `transparent_bg_config`: squares of `square` pixels, `gray` where
/// `x / square + y / square` is odd and `white` elsewhere (`on_top_left`:
/// the top-left square is white).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chessboard {
    pub square: usize,
    pub white: u8,
    pub gray: u8,
}

/// The release's file of processor settings, copied into a container.
pub const PREPROCESSOR_FILE: &str = "preprocessor_config.json";

impl PreprocessConfig {
    /// Kimi K3's image processor settings for a container: `media_proc_cfg`
    /// of its copied preprocessor_config.json, the release's values without
    /// one.
    pub fn of_container(container: &Container) -> Result<PreprocessConfig> {
        let Some((_, bytes)) = container.tokenizer_files().iter().find(|(n, _)| n == PREPROCESSOR_FILE) else {
            return Ok(PreprocessConfig::default());
        };
        let path = container.dir().join(PREPROCESSOR_FILE);
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::format(&path, format!("malformed JSON: {e}")))?;
        PreprocessConfig::from_json(&v, &path)
    }

    /// `media_proc_cfg` of preprocessor_config.json (`path` names the file
    /// in errors). Keys it lacks keep the release's values; settings this
    /// pipeline does not implement (a fixed token count, a fill stage other
    /// than after the resize, a background other than the chessboard) are
    /// refused by name.
    pub fn from_json(v: &serde_json::Value, path: &std::path::Path) -> Result<PreprocessConfig> {
        let bad = |key: &str, msg: String| Error::format(path, format!("media_proc_cfg.{key}: {msg}"));
        let cfg = v.get("media_proc_cfg").unwrap_or(v);
        let mut out = PreprocessConfig::default();
        let size = |key: &str, max: usize| -> Result<Option<usize>> {
            match cfg.get(key).filter(|x| !x.is_null()) {
                None => Ok(None),
                Some(x) => match x.as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if (1..=max).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(key, format!("{x} is not an integer in 1..={max}"))),
                },
            }
        };
        if let Some(p) = size("patch_size", 64)? {
            out.patch_size = p;
        }
        if let Some(m) = size("merge_kernel_size", 8)? {
            out.merge_kernel_size = m;
        }
        if let Some(l) = size("in_patch_limit", 1 << 20)? {
            out.in_patch_limit = l;
        }
        if let Some(s) = size("patch_limit_on_one_side", 4096)? {
            out.patch_limit_on_one_side = s;
        }
        if cfg.get("fixed_output_tokens").is_some_and(|x| !x.is_null()) {
            return Err(bad(
                "fixed_output_tokens",
                "a fixed token count is not supported (the release has null)".into(),
            ));
        }
        for (key, dst) in [("image_mean", &mut out.image_mean), ("image_std", &mut out.image_std)] {
            if let Some(x) = cfg.get(key).filter(|x| !x.is_null()) {
                let vals: Option<Vec<f32>> =
                    x.as_array().map(|a| a.iter().filter_map(|v| v.as_f64()).map(|f| f as f32).collect());
                match vals.as_deref() {
                    Some(&[a, b, c]) if [a, b, c].iter().all(|v| v.is_finite()) => *dst = [a, b, c],
                    _ => return Err(bad(key, format!("{x} is not three numbers"))),
                }
            }
        }
        if out.image_std.contains(&0.0) {
            return Err(bad("image_std", "a zero standard deviation".into()));
        }
        if let Some(stage) = cfg.get("transparent_bg_fill_stage").and_then(|x| x.as_str()) {
            if stage != "after_resize" {
                return Err(bad("transparent_bg_fill_stage", format!("`{stage}` (after_resize only)")));
            }
        }
        if let Some(bg) = cfg.get("transparent_bg_config").filter(|x| !x.is_null()) {
            if bg.get("type").and_then(|t| t.as_str()).is_some_and(|t| t != "chessboard")
                || bg.get("on_top_left").and_then(|t| t.as_bool()) == Some(false)
            {
                return Err(bad(
                    "transparent_bg_config",
                    format!("{bg} (a chessboard with a white top-left square only)"),
                ));
            }
            let byte = |k: &str, d: u8| -> Result<u8> {
                match bg.get(k) {
                    None => Ok(d),
                    Some(x) => x
                        .as_u64()
                        .and_then(|n| u8::try_from(n).ok())
                        .ok_or_else(|| bad("transparent_bg_config", format!("{k}: {x} is not 0..=255"))),
                }
            };
            out.chessboard.white = byte("white", out.chessboard.white)?;
            out.chessboard.gray = byte("gray", out.chessboard.gray)?;
            if let Some(sq) = bg.get("square") {
                out.chessboard.square = sq
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| (1..=4096).contains(&n))
                    .ok_or_else(|| bad("transparent_bg_config", format!("square: {sq}")))?;
            }
        }
        Ok(out)
    }
}

impl Default for PreprocessConfig {
    /// The release's values.
    fn default() -> Self {
        PreprocessConfig {
            patch_size: 14,
            merge_kernel_size: 2,
            in_patch_limit: 65536,
            patch_limit_on_one_side: 512,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            chessboard: Chessboard { square: 8, white: 255, gray: 180 },
        }
    }
}

/// Decoded pixels, row-major, 3 (RGB) or 4 (RGBA) bytes a pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Vec<u8>,
}

impl Pixels {
    pub fn new(width: usize, height: usize, channels: usize, data: Vec<u8>) -> Result<Pixels> {
        if !(channels == 3 || channels == 4) {
            return Err(Error::Arg(format!("{channels} channels: an image is RGB or RGBA here")));
        }
        if width == 0
            || height == 0
            || width.checked_mul(height).and_then(|n| n.checked_mul(channels)) != Some(data.len())
        {
            return Err(Error::Arg(format!(
                "{} bytes for a {width}x{height} image of {channels} channels",
                data.len()
            )));
        }
        Ok(Pixels { width, height, channels, data })
    }
}

/// Where an image goes: its size after the resize, the padding, the patch
/// grid (rows, columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub width: usize,
    pub height: usize,
    pub pad_width: usize,
    pub pad_height: usize,
    pub grid: (usize, usize),
}

impl Plan {
    /// Tokens the image takes in the prompt: one per merge cell.
    pub fn tokens(&self, cfg: &PreprocessConfig) -> usize {
        let m = cfg.merge_kernel_size;
        (self.grid.0 / m) * (self.grid.1 / m)
    }
}

/// The processor's resize plan for a `w` x `h` image: never upscaled,
/// scaled down to the patch budget and the side limit, then padded to whole
/// merge cells (K3-VISION.md §2.1 step 2; the arithmetic in f64, as Python).
pub fn plan(w: usize, h: usize, cfg: &PreprocessConfig) -> Plan {
    let p = cfg.patch_size;
    let side = cfg.patch_limit_on_one_side * p;
    let patches = (w / p).max(1) as f64 * (h / p).max(1) as f64;
    let s = 1.0f64
        .min((cfg.in_patch_limit as f64 / patches).sqrt())
        .min(side as f64 / w as f64)
        .min(side as f64 / h as f64);
    let width = ((w as f64 * s) as usize).max(1).min(side);
    let height = ((h as f64 * s) as usize).max(1).min(side);
    let unit = p * cfg.merge_kernel_size;
    let (pad_width, pad_height) = ((unit - width % unit) % unit, (unit - height % unit) % unit);
    Plan { width, height, pad_width, pad_height, grid: ((height + pad_height) / p, (width + pad_width) / p) }
}

/// Pillow's `PRECISION_BITS`: 8 bits of result, 2 of headroom in an i32.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's bicubic kernel (a = -0.5), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// One pass's filter taps (`precompute_coeffs` then `normalize_coeffs_8bpc`):
/// per output index its first input index, tap count, and `ksize` fixed-point
/// taps.
struct Taps {
    bounds: Vec<(usize, usize)>,
    k: Vec<i32>,
    ksize: usize,
}

fn taps(in_size: usize, out_size: usize) -> Taps {
    // The box is Python floats passed to C as `float`: (0, in_size).
    let (in0, in1) = (0.0f32, in_size as f32);
    let scale = f64::from(in1 - in0) / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size);
    let mut k = vec![0i32; out_size * ksize];
    let mut w = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = f64::from(in0) + (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let mut ww = 0.0;
        for (x, wx) in w[..xmax].iter_mut().enumerate() {
            *wx = bicubic(((x + xmin) as f64 - center + 0.5) * ss);
            ww += *wx;
        }
        for (x, &wx) in w[..xmax].iter().enumerate() {
            let v = if ww != 0.0 { wx / ww } else { wx };
            let f = v * f64::from(1u32 << PRECISION_BITS);
            k[xx * ksize + x] = if v < 0.0 { (-0.5 + f) as i32 } else { (0.5 + f) as i32 };
        }
        bounds.push((xmin, xmax));
    }
    Taps { bounds, k, ksize }
}

/// `clip8`: the fixed-point sum back to a byte.
fn clip8(ss: i32) -> u8 {
    (ss >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `ImagingResampleHorizontal_8bpc` over rows `first..first + rows` of `src`.
fn horizontal(src: &Pixels, first: usize, rows: usize, t: &Taps, out_w: usize) -> Pixels {
    let c = src.channels;
    let mut out = vec![0u8; out_w * rows * c];
    for yy in 0..rows {
        let row = &src.data[(first + yy) * src.width * c..(first + yy + 1) * src.width * c];
        for (xx, &(xmin, n)) in t.bounds.iter().enumerate() {
            let k = &t.k[xx * t.ksize..xx * t.ksize + n];
            for ch in 0..c {
                let mut ss = 1i32 << (PRECISION_BITS - 1);
                for (x, &kx) in k.iter().enumerate() {
                    ss += i32::from(row[(xmin + x) * c + ch]) * kx;
                }
                out[(yy * out_w + xx) * c + ch] = clip8(ss);
            }
        }
    }
    Pixels { width: out_w, height: rows, channels: c, data: out }
}

/// `ImagingResampleVertical_8bpc`; `bounds` relative to `src`'s rows.
fn vertical(src: &Pixels, t: &Taps, shift: usize, out_h: usize) -> Pixels {
    let (w, c) = (src.width, src.channels);
    let mut out = vec![0u8; w * out_h * c];
    for (yy, &(ymin, n)) in t.bounds.iter().enumerate() {
        let k = &t.k[yy * t.ksize..yy * t.ksize + n];
        let ymin = ymin - shift;
        for i in 0..w * c {
            let mut ss = 1i32 << (PRECISION_BITS - 1);
            for (y, &ky) in k.iter().enumerate() {
                ss += i32::from(src.data[(ymin + y) * w * c + i]) * ky;
            }
            out[yy * w * c + i] = clip8(ss);
        }
    }
    Pixels { width: w, height: out_h, channels: c, data: out }
}

/// `MULDIV255`: `a * b / 255` rounded as Pillow rounds it.
fn muldiv255(a: u8, b: u8) -> u8 {
    let t = u32::from(a) * u32::from(b) + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// PIL's `Image.resize(size, BICUBIC)` (Pillow 13): the same size is a
/// copy; RGBA goes through premultiplied `RGBa` (`rgbA2rgba`, the
/// resample, `rgba2rgbA`), as `Image.resize` converts it; the two passes in
/// `ImagingResampleInner`'s order.
pub fn resize_bicubic(src: &Pixels, out_w: usize, out_h: usize) -> Pixels {
    if (out_w, out_h) == (src.width, src.height) {
        return src.clone();
    }
    let rgba = src.channels == 4;
    let mut im = src.clone();
    if rgba {
        for px in im.data.chunks_exact_mut(4) {
            let a = px[3];
            for v in &mut px[..3] {
                *v = muldiv255(*v, a);
            }
        }
    }
    let (need_horizontal, need_vertical) = (out_w != src.width, out_h != src.height);
    let tv = taps(im.height, out_h);
    let th = taps(im.width, out_w);
    // Pillow 13's order, which changes the bytes (each pass rounds to u8):
    // the vertical pass first when the height shrinks by more than twice
    // as many pixels as the width, else the horizontal pass first, over
    // only the rows the vertical pass reads. Measured against Pillow 13.0
    // on both sides of the boundary (40x60 and 40x61 to 30x40, upscales
    // of either side) by tests/gen_k3_vision_preprocess.py's corpus.
    let (dw, dh) = (src.width as i64 - out_w as i64, src.height as i64 - out_h as i64);
    let horizontal_first = dh <= 2 * dw;
    if horizontal_first {
        let first = tv.bounds.first().map_or(0, |b| b.0);
        let last = tv.bounds.last().map_or(0, |b| b.0 + b.1);
        if need_horizontal {
            im = horizontal(&im, first, last - first, &th, out_w);
        }
        if need_vertical {
            im = vertical(&im, &tv, if need_horizontal { first } else { 0 }, out_h);
        }
    } else {
        if need_vertical {
            im = vertical(&im, &tv, 0, out_h);
        }
        if need_horizontal {
            let rows = im.height;
            im = horizontal(&im, 0, rows, &th, out_w);
        }
    }
    if rgba {
        for px in im.data.chunks_exact_mut(4) {
            let a = u32::from(px[3]);
            if a != 0 && a != 255 {
                for v in &mut px[..3] {
                    *v = (255 * u32::from(*v) / a).min(255) as u8;
                }
            }
        }
    }
    im
}

/// An RGBA image over the chessboard, `trunc(a * rgb + (1 - a) * bg)` with
/// `a = A / 255` in f32 (numpy on uint8 and float32); RGB passes through.
pub fn over_chessboard(src: &Pixels, board: &Chessboard) -> Pixels {
    if src.channels == 3 {
        return src.clone();
    }
    let mut out = Vec::with_capacity(src.width * src.height * 3);
    for (i, px) in src.data.chunks_exact(4).enumerate() {
        let (x, y) = (i % src.width, i / src.width);
        let bg = f32::from(if (x / board.square + y / board.square) % 2 == 1 { board.gray } else { board.white });
        let a = f32::from(px[3]) / 255.0;
        for &v in &px[..3] {
            out.push((a * f32::from(v) + (1.0 - a) * bg) as u8);
        }
    }
    Pixels { width: src.width, height: src.height, channels: 3, data: out }
}

/// What the tower takes for one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessed {
    pub plan: Plan,
    /// The RGB pixels after the resize and compositing, before padding.
    pub resized: Pixels,
    /// `[rows * cols, 3, p, p]`: patch `r * cols + c`, channel-major.
    pub pixel_values: Vec<f32>,
}

/// The whole pipeline for one decoded image.
pub fn preprocess(src: &Pixels, cfg: &PreprocessConfig) -> Preprocessed {
    let plan = plan(src.width, src.height, cfg);
    let resized = over_chessboard(&resize_bicubic(src, plan.width, plan.height), &cfg.chessboard);
    // `(v / 255 in f32 - mean) / std` in f64 (the float64 mean and std
    // arrays promote), back to f32: a table of 256 per channel.
    let table: Vec<[f32; 256]> = (0..3)
        .map(|c| {
            let mut t = [0f32; 256];
            for (v, o) in t.iter_mut().enumerate() {
                let x = v as f32 / 255.0;
                *o = ((f64::from(x) - f64::from(cfg.image_mean[c])) / f64::from(cfg.image_std[c])) as f32;
            }
            t
        })
        .collect();
    let p = cfg.patch_size;
    let (rows, cols) = plan.grid;
    let mut pixel_values = vec![0f32; rows * cols * 3 * p * p];
    for (patch, out) in pixel_values.chunks_exact_mut(3 * p * p).enumerate() {
        let (pr, pc) = (patch / cols, patch % cols);
        for c in 0..3 {
            for y in 0..p {
                for x in 0..p {
                    let (iy, ix) = (pr * p + y, pc * p + x);
                    // Padding is zero bytes, normalised like any other.
                    let v = if iy < plan.height && ix < plan.width {
                        resized.data[(iy * plan.width + ix) * 3 + c]
                    } else {
                        0
                    };
                    out[(c * p + y) * p + x] = table[c][v as usize];
                }
            }
        }
    }
    Preprocessed { plan, resized, pixel_values }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K3-VISION.md §2.1's worked examples of the plan at the release's
    /// settings.
    #[test]
    fn plan_matches_the_release_examples() {
        let cfg = PreprocessConfig::default();
        assert_eq!(plan(896, 896, &cfg).tokens(&cfg), 1024);
        assert_eq!(plan(354, 354, &cfg).tokens(&cfg), 169);
        assert_eq!(plan(4000, 3000, &cfg).tokens(&cfg), 15_444);
        let p = plan(3597, 3597, &cfg);
        assert_eq!(p.grid, (258, 258));
        assert_eq!(plan(1, 1, &cfg).grid, (2, 2));
    }

    /// Pixels whose bytes do not make the stated image are refused, not
    /// read past.
    #[test]
    fn pixels_of_the_wrong_length_or_channels_are_refused() {
        assert!(Pixels::new(2, 2, 3, vec![0; 12]).is_ok());
        assert!(Pixels::new(2, 2, 3, vec![0; 11]).is_err());
        assert!(Pixels::new(2, 2, 2, vec![0; 8]).is_err());
        assert!(Pixels::new(0, 2, 3, vec![]).is_err());
        assert!(Pixels::new(usize::MAX, 2, 4, vec![]).is_err());
    }

    #[test]
    fn muldiv255_rounds_as_pillow() {
        for a in 0..=255u8 {
            assert_eq!(muldiv255(a, 255), a);
            assert_eq!(muldiv255(a, 0), 0);
        }
        assert_eq!(muldiv255(128, 128), 64);
    }
}
