//! One codebook of 8-dim vectors (256 entries, or 64 for `rvq4p`):
//! nearest-entry search and a deterministic k-means fit (splitmix64 seeding, k-means++ init on a
//! subsample, Lloyd iterations with order-fixed parallel reductions).

use super::{CODEBOOK_ENTRIES as K, VDIM};

/// Entries of an `rvq4p` codebook: a 64-byte table fits one byte-shuffle
/// register set (LESSONS.md, "Kernels").
pub(crate) const K64: usize = 64;
use rayon::prelude::*;

pub(crate) type Vec8 = [f32; VDIM];

/// k-means++ init runs on at most this many points (it is sequential).
const INIT_SAMPLE: usize = 8192;
/// Lloyd partial sums are formed per fixed chunk and reduced in chunk order,
/// so the fit is identical for any thread count.
const CHUNK: usize = 4096;

/// splitmix64: tiny, seedable, good enough for sampling.
#[derive(Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0); the modulo bias is irrelevant here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A 256- or 64-entry codebook with the derived data the search needs.
#[derive(Debug, Clone)]
pub(crate) struct Book {
    /// `[c][d]`, the stored form.
    pub entries: Vec<f32>,
    /// `[d][c]`: lets table building and the search vectorise over entries.
    pub cbt: Vec<f32>,
    /// `|entry_c|^2`.
    norms: Vec<f32>,
}

impl Book {
    /// `entries.len()` is `256 * 8` or `64 * 8`.
    pub fn new(entries: Vec<f32>) -> Book {
        let k = entries.len() / VDIM;
        assert!(entries.len().is_multiple_of(VDIM) && (k == K || k == K64), "codebook size");
        let mut cbt = vec![0f32; k * VDIM];
        let mut norms = vec![0f32; k];
        for c in 0..k {
            for d in 0..VDIM {
                let v = entries[c * VDIM + d];
                cbt[d * k + c] = v;
                norms[c] += v * v;
            }
        }
        Book { entries, cbt, norms }
    }

    /// Number of entries (256 or 64).
    pub fn len(&self) -> usize {
        self.norms.len()
    }

    pub fn entry(&self, c: usize) -> &[f32] {
        &self.entries[c * VDIM..(c + 1) * VDIM]
    }

    /// Index of the entry nearest to `r` (first one on ties).
    #[inline]
    pub fn nearest(&self, r: &Vec8) -> usize {
        if self.len() == K64 {
            #[cfg(target_arch = "x86_64")]
            if super::simd::has_avx2() {
                // SAFETY: AVX2 and FMA were detected on this CPU.
                return unsafe { nearest_avx2::<K64>(&self.cbt, &self.norms, r) };
            }
            return nearest_generic::<K64>(&self.cbt, &self.norms, r);
        }
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2() {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            return unsafe { nearest_avx2::<K>(&self.cbt, &self.norms, r) };
        }
        nearest_generic::<K>(&self.cbt, &self.norms, r)
    }
}

/// `|r - c|^2 - |r|^2 = |c|^2 - 2 r.c`, vectorised over c. No FMA
/// contraction happens in Rust, so every build picks the same entry.
#[inline(always)]
fn nearest_generic<const N: usize>(cbt: &[f32], norms: &[f32], r: &Vec8) -> usize {
    let mut dot = [0f32; N];
    // One row of N entries per dimension; `cbt` holds VDIM rows.
    let (dims, _) = cbt.as_chunks::<N>();
    let c0 = &dims[0];
    for c in 0..N {
        dot[c] = r[0] * c0[c];
    }
    for d in 1..VDIM {
        let cd = &dims[d];
        for c in 0..N {
            dot[c] += r[d] * cd[c];
        }
    }
    let mut best = (f32::INFINITY, 0usize);
    for c in 0..N {
        let s = norms[c] - 2.0 * dot[c];
        if s < best.0 {
            best = (s, c);
        }
    }
    best.1
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn nearest_avx2<const N: usize>(cbt: &[f32], norms: &[f32], r: &Vec8) -> usize {
    nearest_generic::<N>(cbt, norms, r)
}

fn dist2(a: &Vec8, b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Fit `k` (256 or 64) entries to `points` (any count, including fewer
/// than `k`).
pub(crate) fn kmeans(points: &[Vec8], k: usize, iters: usize, seed: u64) -> Book {
    let n = points.len();
    let mut rng = Rng::new(seed);
    let mut entries = vec![0f32; k * VDIM];
    if n <= k {
        // Every point gets its own entry; the rest stay zero (never nearer
        // than an exact match, and harmless as spare entries).
        for (i, p) in points.iter().enumerate() {
            entries[i * VDIM..(i + 1) * VDIM].copy_from_slice(p);
        }
        return Book::new(entries);
    }
    init_plus_plus(points, &mut rng, &mut entries);
    let mut book = Book::new(entries);
    let mut assign = vec![k; n];
    for _ in 0..iters {
        let parts: Vec<(Vec<f64>, Vec<u32>, usize)> = points
            .par_chunks(CHUNK)
            .zip(assign.par_chunks_mut(CHUNK))
            .map(|(pc, ac)| {
                let mut sums = vec![0f64; k * VDIM];
                let mut counts = vec![0u32; k];
                let mut changed = 0usize;
                for (p, a) in pc.iter().zip(ac.iter_mut()) {
                    let c = book.nearest(p);
                    changed += usize::from(*a != c);
                    *a = c;
                    counts[c] += 1;
                    for d in 0..VDIM {
                        sums[c * VDIM + d] += p[d] as f64;
                    }
                }
                (sums, counts, changed)
            })
            .collect();
        let mut sums = vec![0f64; k * VDIM];
        let mut counts = vec![0u64; k];
        let mut changed = 0;
        for (s, c, ch) in parts {
            for (a, b) in sums.iter_mut().zip(&s) {
                *a += b;
            }
            for (a, b) in counts.iter_mut().zip(&c) {
                *a += *b as u64;
            }
            changed += ch;
        }
        if changed == 0 {
            break;
        }
        let mut entries = book.entries.clone();
        for c in 0..k {
            if counts[c] > 0 {
                for d in 0..VDIM {
                    entries[c * VDIM + d] = (sums[c * VDIM + d] / counts[c] as f64) as f32;
                }
            } else {
                // Empty cluster: restart it on a random point.
                let p = &points[rng.below(n)];
                entries[c * VDIM..(c + 1) * VDIM].copy_from_slice(p);
            }
        }
        book = Book::new(entries);
    }
    book
}

/// k-means++ seeding on a random subsample.
fn init_plus_plus(points: &[Vec8], rng: &mut Rng, entries: &mut [f32]) {
    let m = points.len().min(INIT_SAMPLE);
    let sub: Vec<&Vec8> = if m == points.len() {
        points.iter().collect()
    } else {
        (0..m).map(|_| &points[rng.below(points.len())]).collect()
    };
    let first = sub[rng.below(m)];
    entries[..VDIM].copy_from_slice(first);
    let mut dmin: Vec<f32> = sub.iter().map(|p| dist2(p, first)).collect();
    for c in 1..entries.len() / VDIM {
        let total: f64 = dmin.iter().map(|&d| d as f64).sum();
        let pick = if total > 0.0 {
            let mut t = rng.unit() * total;
            let mut idx = m - 1;
            for (i, &d) in dmin.iter().enumerate() {
                t -= d as f64;
                if t < 0.0 {
                    idx = i;
                    break;
                }
            }
            idx
        } else {
            rng.below(m)
        };
        let e = sub[pick];
        entries[c * VDIM..(c + 1) * VDIM].copy_from_slice(e);
        for (d, p) in dmin.iter_mut().zip(&sub) {
            *d = d.min(dist2(p, e));
        }
    }
}
