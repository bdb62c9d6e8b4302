//! How a KV cache row is stored: f32, bf16 or q8, packed into f32 *words*
//! so that every cache stays a `Vec<f32>` (the session file streams words,
//! whatever they hold) and the f32 form is read in place by the attention
//! kernels with no copy.
//!
//! A row of `width` values takes [`KvType::words`] words:
//! - `f32`: one value per word.
//! - `bf16`: two values per word, value `2i` in the low half of word `i`,
//!   `2i + 1` in the high half (a trailing odd value leaves the high half
//!   zero). Rounded to nearest, ties to even, as `half::bf16::from_f32`
//!   (and torch's `.to(torch.bfloat16)`); NaN stays a quiet NaN.
//! - `q8`: llama.cpp's `q8_0` cache with an f32 scale: blocks of
//!   [`Q8_BLOCK`] values (the last one shorter), first one scale word per
//!   block (`amax / 127`), then the codes, four per word, code `4i + j` in
//!   byte `j` (from the low end) of word `i`. A value is `scale * code`.
//!
//! The packing is defined on the words' bits, not on memory order, so a
//! row means the same on every CPU. Decoding is exact (a bf16 or a q8
//! value times its scale is the f32 the cache then holds), so attention on
//! a decoded row is attention on the stored value: everything the f32
//! cache computes, on keys and values rounded once when they are written.

use std::fmt;
use std::str::FromStr;

/// Values per q8 scale: llama.cpp's `QK8_0`.
pub const Q8_BLOCK: usize = 32;

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// Exactly what the model computed.
    F32,
    /// Half the bytes of f32, 8 bits of mantissa.
    #[default]
    Bf16,
    /// About a quarter of f32's bytes: 8-bit codes with one f32 scale per
    /// 32 values.
    Q8,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::Bf16, KvType::Q8];

    /// The name the CLI, the session file and the reports use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::Bf16 => "bf16",
            KvType::Q8 => "q8",
        }
    }

    /// Words (4 bytes each) one row of `width` values takes.
    pub fn words(self, width: usize) -> usize {
        match self {
            KvType::F32 => width,
            KvType::Bf16 => width.div_ceil(2),
            KvType::Q8 => width.div_ceil(Q8_BLOCK) + width.div_ceil(4),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<KvType, String> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown KV cache type '{s}' (expected f32, bf16 or q8)"))
    }
}

/// The bf16 bits of `x`, rounded to nearest, ties to even.
fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        // Keep sign and the top of the payload, force a quiet NaN: a plain
        // truncation could leave a zero mantissa, an infinity.
        return (b >> 16) | 0x0040;
    }
    (b + 0x7fff + ((b >> 16) & 1)) >> 16
}

/// Writes `row` (`width` values) into `words` (`ty.words(width)` of them).
pub fn encode_row(ty: KvType, row: &[f32], words: &mut [f32]) {
    assert_eq!(words.len(), ty.words(row.len()), "encode_row: row and words disagree");
    match ty {
        KvType::F32 => words.copy_from_slice(row),
        KvType::Bf16 => {
            for (w, pair) in words.iter_mut().zip(row.chunks(2)) {
                let lo = bf16_bits(pair[0]);
                let hi = pair.get(1).map_or(0, |&x| bf16_bits(x));
                *w = f32::from_bits(lo | hi << 16);
            }
        }
        KvType::Q8 => {
            let blocks = row.len().div_ceil(Q8_BLOCK);
            let (scales, codes) = words.split_at_mut(blocks);
            codes.fill(0.0);
            for (b, (scale, values)) in scales.iter_mut().zip(row.chunks(Q8_BLOCK)).enumerate() {
                let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                *scale = d;
                for (j, &v) in values.iter().enumerate() {
                    // `as` saturates and takes NaN to 0; |v * inv| <= 127
                    // up to rounding, so the clamp only guards that.
                    let q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                    let at = b * Q8_BLOCK + j;
                    let w = &mut codes[at / 4];
                    *w = f32::from_bits(w.to_bits() | u32::from(q as u8) << (8 * (at % 4)));
                }
            }
        }
    }
}

/// Values `cols` of one stored row (`words`, a row of `width` values) into
/// `out` (`cols.len()` floats).
pub fn decode_row(ty: KvType, width: usize, words: &[f32], cols: std::ops::Range<usize>, out: &mut [f32]) {
    assert!(cols.end <= width && out.len() == cols.len(), "decode_row: columns outside the row");
    assert_eq!(words.len(), ty.words(width), "decode_row: row and words disagree");
    match ty {
        KvType::F32 => out.copy_from_slice(&words[cols]),
        KvType::Bf16 => {
            let (mut out, mut c) = (out, cols.start);
            if c % 2 == 1 && !out.is_empty() {
                out[0] = bf16_high(words[c / 2]);
                (out, c) = (&mut out[1..], c + 1);
            }
            // Whole words: two values each (a loop the compiler vectorises).
            let pairs = out.len() / 2;
            for (pair, &w) in out.chunks_exact_mut(2).zip(&words[c / 2..c / 2 + pairs]) {
                pair[0] = bf16_low(w);
                pair[1] = bf16_high(w);
            }
            if out.len() % 2 == 1 {
                out[2 * pairs] = bf16_low(words[c / 2 + pairs]);
            }
        }
        KvType::Q8 => {
            let (scales, codes) = words.split_at(width.div_ceil(Q8_BLOCK));
            let code = |c: usize| (codes[c / 4].to_bits() >> (8 * (c % 4))) as u8 as i8;
            let (mut out, mut c) = (out, cols.start);
            while c % 4 != 0 && !out.is_empty() {
                out[0] = scales[c / Q8_BLOCK] * f32::from(code(c));
                (out, c) = (&mut out[1..], c + 1);
            }
            // Whole words: four codes of one block each (Q8_BLOCK is a
            // multiple of 4).
            let quads = out.len() / 4;
            for (i, (four, &w)) in out.chunks_exact_mut(4).zip(&codes[c / 4..c / 4 + quads]).enumerate() {
                let (scale, w) = (scales[(c + 4 * i) / Q8_BLOCK], w.to_bits());
                for (j, o) in four.iter_mut().enumerate() {
                    *o = scale * f32::from((w >> (8 * j)) as u8 as i8);
                }
            }
            for (j, o) in out[4 * quads..].iter_mut().enumerate() {
                let at = c + 4 * quads + j;
                *o = scales[at / Q8_BLOCK] * f32::from(code(at));
            }
        }
    }
}

/// The bf16 value in the low half of `w`, as f32 (exact).
fn bf16_low(w: f32) -> f32 {
    f32::from_bits(w.to_bits() << 16)
}

/// The bf16 value in the high half of `w`, as f32 (exact).
fn bf16_high(w: f32) -> f32 {
    f32::from_bits(w.to_bits() & 0xffff_0000)
}

/// Rows of one KV cache: `rows` rows of `width` values of type `ty`.
#[derive(Clone, Debug)]
pub struct KvRows {
    ty: KvType,
    width: usize,
    words: Vec<f32>,
}

/// Keys read per [`KvRows::tile`]: small enough that a decoded tile stays
/// in L2 beside its queries, large enough that the kernels see long runs.
pub const KEY_TILE: usize = 256;

impl KvRows {
    pub fn new(ty: KvType, rows: usize, width: usize) -> KvRows {
        KvRows { ty, width, words: vec![0.0; rows.saturating_mul(ty.words(width))] }
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn rows(&self) -> usize {
        self.words.len().checked_div(self.row_words()).unwrap_or(0)
    }

    /// Words per stored row.
    pub fn row_words(&self) -> usize {
        self.ty.words(self.width)
    }

    /// The stored words, `[rows][row_words]`.
    pub fn words(&self) -> &[f32] {
        &self.words
    }

    pub fn words_mut(&mut self) -> &mut [f32] {
        &mut self.words
    }

    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.words.as_slice())
    }

    /// Stores `values` (`width` floats) as row `row`.
    pub fn write_row(&mut self, row: usize, values: &[f32]) {
        let w = self.row_words();
        encode_row(self.ty, values, &mut self.words[row * w..(row + 1) * w]);
    }

    /// Columns `cols` of row `row`, decoded into `out`.
    pub fn read_row(&self, row: usize, cols: std::ops::Range<usize>, out: &mut [f32]) {
        let w = self.row_words();
        decode_row(self.ty, self.width, &self.words[row * w..(row + 1) * w], cols, out);
    }

    /// Columns `cols` of rows `first..first + n` as f32 rows `stride`
    /// floats apart, for the attention kernels: the cache itself when it
    /// is f32, else those values decoded into `tile` (at least `n *
    /// cols.len()` floats; the engine asks [`KEY_TILE`] rows at a time).
    pub fn view<'a>(
        &'a self,
        first: usize,
        n: usize,
        cols: std::ops::Range<usize>,
        tile: &'a mut [f32],
    ) -> (&'a [f32], usize) {
        if self.ty == KvType::F32 {
            return (&self.words[first * self.width + cols.start..], self.width);
        }
        let d = cols.len();
        let w = self.row_words();
        for (r, out) in tile[..n * d].chunks_exact_mut(d).enumerate() {
            let at = (first + r) * w;
            decode_row(self.ty, self.width, &self.words[at..at + w], cols.clone(), out);
        }
        (&tile[..n * d], d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(width: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761) | 1;
        (0..width)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn bf16_rounds_as_the_half_crate_does() {
        let mut edge = vec![0.0, -0.0, 1.0, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-45];
        // Halfway cases on both sides of even, and just past them.
        edge.extend([f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::from_bits(0x3f80_8001)]);
        edge.extend(row(509, 7));
        let width = edge.len();
        let mut words = vec![0.0; KvType::Bf16.words(width)];
        encode_row(KvType::Bf16, &edge, &mut words);
        let mut back = vec![0.0; width];
        decode_row(KvType::Bf16, width, &words, 0..width, &mut back);
        for (x, y) in edge.iter().zip(&back) {
            assert_eq!(y.to_bits(), half::bf16::from_f32(*x).to_f32().to_bits(), "{x:e}");
        }
        let mut nan = vec![0.0; 1];
        encode_row(KvType::Bf16, &[f32::from_bits(0x7f80_0001)], &mut nan);
        decode_row(KvType::Bf16, 1, &nan, 0..1, &mut back[..1]);
        assert!(back[0].is_nan(), "a NaN whose payload is below bf16's stays a NaN");
    }

    #[test]
    fn q8_is_within_half_a_step_of_every_value_and_decodes_columns_alone() {
        for width in [1, 5, 31, 32, 33, 64, 100, 576] {
            let values = row(width, width as u32);
            let mut rows = KvRows::new(KvType::Q8, 3, width);
            rows.write_row(1, &values);
            let mut tile = vec![0.0; width];
            let (got, _) = rows.view(1, 1, 0..width, &mut tile);
            for (b, (g, v)) in got.chunks(Q8_BLOCK).zip(values.chunks(Q8_BLOCK)).enumerate() {
                let step = v.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
                for (x, y) in g.iter().zip(v) {
                    assert!((x - y).abs() <= step * 0.5001, "width {width} block {b}: {x} vs {y}");
                }
            }
            let whole = got.to_vec();
            for start in [0, width / 3, width - 1] {
                let mut part = vec![0.0; width - start];
                let (p, stride) = rows.view(1, 1, start..width, &mut part);
                assert_eq!((p, stride), (&whole[start..], width - start), "width {width} from {start}");
            }
        }
        let mut zeros = KvRows::new(KvType::Q8, 1, 40);
        zeros.write_row(0, &[0.0; 40]);
        let mut tile = [1.0; 40];
        assert!(zeros.view(0, 1, 0..40, &mut tile).0.iter().all(|&v| v == 0.0));
    }

    /// Value `c` of a stored row by the layout's definition alone.
    fn value_at(ty: KvType, width: usize, words: &[f32], c: usize) -> f32 {
        let w = |i: usize| words[i].to_bits();
        match ty {
            KvType::F32 => words[c],
            KvType::Bf16 => f32::from_bits(((w(c / 2) >> (16 * (c % 2))) & 0xffff) << 16),
            KvType::Q8 => {
                let blocks = width.div_ceil(Q8_BLOCK);
                words[c / Q8_BLOCK] * f32::from((w(blocks + c / 4) >> (8 * (c % 4))) as u8 as i8)
            }
        }
    }

    #[test]
    fn every_column_range_decodes_to_the_layouts_values() {
        for ty in KvType::ALL {
            for width in [1, 2, 3, 7, 33, 70] {
                let values = row(width, 3 + width as u32);
                let mut words = vec![0.0; ty.words(width)];
                encode_row(ty, &values, &mut words);
                for start in 0..width {
                    for end in start..=width {
                        let mut out = vec![f32::NAN; end - start];
                        decode_row(ty, width, &words, start..end, &mut out);
                        for (c, o) in (start..end).zip(&out) {
                            let want = value_at(ty, width, &words, c);
                            assert_eq!(o.to_bits(), want.to_bits(), "{ty} width {width} {start}..{end} col {c}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_f32_view_is_the_cache_itself_and_other_types_their_decoded_rows() {
        let (rows, width) = (7, 24);
        for ty in KvType::ALL {
            let mut kv = KvRows::new(ty, rows, width);
            let data: Vec<Vec<f32>> = (0..rows).map(|r| row(width, r as u32 + 1)).collect();
            for (r, v) in data.iter().enumerate() {
                kv.write_row(r, v);
            }
            assert_eq!(kv.rows(), rows);
            assert_eq!(kv.bytes(), 4 * rows * ty.words(width));
            let mut tile = vec![0.0; 3 * 8];
            let (view, stride) = kv.view(2, 3, 8..16, &mut tile);
            for r in 0..3 {
                let mut want = vec![0.0; 8];
                let at = (2 + r) * kv.row_words();
                decode_row(ty, width, &kv.words()[at..at + kv.row_words()], 8..16, &mut want);
                assert_eq!(&view[r * stride..r * stride + 8], want.as_slice(), "{ty} row {r}");
                if ty == KvType::F32 {
                    assert_eq!(want, data[2 + r][8..16]);
                }
            }
        }
        assert_eq!("q8".parse::<KvType>(), Ok(KvType::Q8));
        assert!("f16".parse::<KvType>().unwrap_err().contains("f32, bf16 or q8"));
    }
}
