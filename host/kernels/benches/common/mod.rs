//! What the prefill and attention benches share: timing two forms
//! alternately, and the machine's FMA peak they are reported against.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use waste_kernels::pool::Pool;

/// Rounds of each form; the best is reported.
pub const REPEATS: usize = 3;

/// Values in [-1, 1) from a linear congruential generator: the same
/// stream for a seed in every bench.
pub fn noise(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Best seconds of `a` and of `b`, run alternately `REPEATS` times in the pool.
pub fn side_by_side(pool: &Pool, mut a: impl FnMut() + Send, mut b: impl FnMut() + Send) -> (f64, f64) {
    let (mut ta, mut tb) = (f64::MAX, f64::MAX);
    for _ in 0..REPEATS {
        let t = Instant::now();
        pool.install(&mut a).expect("pool");
        ta = ta.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        pool.install(&mut b).expect("pool");
        tb = tb.min(t.elapsed().as_secs_f64());
    }
    (ta, tb)
}

/// Multiply-accumulates per second of `threads` threads each running
/// twelve independent FMA chains (f32) as wide as the kernels in force
/// use: sixteen lanes where the CPU has AVX-512 F and no lower level was
/// forced (`matmul_block`'s paired tiles and attention's weighted rows run
/// there), else eight. The kernels' ceiling.
pub fn peak_gmacs(threads: usize) -> f64 {
    const ITERS: usize = 20_000_000;
    let lanes = fma_lanes();
    let t = Instant::now();
    let sums: Vec<f32> = (0..threads).into_par_iter().map(|_| fma_loop(ITERS, lanes)).collect();
    black_box(sums);
    (threads * ITERS * 12 * lanes) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The f32 lanes of `peak_gmacs`' loop on this CPU at the level in force.
pub fn fma_lanes() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use waste_kernels::quant::{isa, Isa};
        let forced_lower = isa() < Isa::Avx512 && Isa::supported().contains(&Isa::Avx512);
        if isa() >= Isa::Avx2 && !forced_lower && std::is_x86_feature_detected!("avx512f") {
            return 16;
        }
    }
    8
}

fn fma_loop(iters: usize, lanes: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if lanes == 16 {
        // SAFETY: `fma_lanes` says 16 only where AVX-512 F was detected.
        return unsafe { fma_loop_avx512(iters) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { fma_loop_avx2(iters) };
    }
    let _ = lanes;
    let mut acc = [[0f32; 8]; 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for v in a.iter_mut() {
                *v = v.mul_add(0.999_999, 1e-7);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_setzero_ps(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, m, c);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_setzero_ps(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, m, c);
        }
    }
    let mut out = [0f32; 8];
    let mut s = _mm256_setzero_ps();
    for a in acc {
        s = _mm256_add_ps(s, a);
    }
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

/// The integer products' ceiling, as multiply-accumulates per second of
/// `threads` threads each running twelve independent chains of the
/// instruction the q4 kernel at `level` uses: `vpdpbusd` on 512-bit
/// vectors (64 byte products) where the CPU has AVX-512 VNNI and the
/// level is `avx512`, else AVX2's `maddubs` + `madd` + add (32 products
/// in three instructions). `None` without AVX2.
#[allow(dead_code)] // the prefill bench's; `attention` shares the module
pub fn int8_peak_gmacs(threads: usize, level: &str) -> Option<(f64, &'static str)> {
    const ITERS: usize = 20_000_000;
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = level == "avx512"
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni");
        let avx2 = std::is_x86_feature_detected!("avx2");
        if !vnni && !avx2 {
            return None;
        }
        let t = Instant::now();
        let sums: Vec<i32> = (0..threads)
            .into_par_iter()
            // SAFETY: the features each loop needs were detected just above.
            .map(|_| unsafe {
                if vnni {
                    vnni_loop(ITERS)
                } else {
                    maddubs_loop(ITERS)
                }
            })
            .collect();
        black_box(sums);
        let per = if vnni { 64 } else { 32 };
        let name = if vnni { "vpdpbusd" } else { "maddubs" };
        Some(((threads * ITERS * 12 * per) as f64 / t.elapsed().as_secs_f64() / 1e9, name))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, level);
        None
    }
}

/// As `int8_peak_gmacs` for the int16 products of GGUF's Q4_K
/// (`quant::ggml::int16`): `vpdpwssd` (32 products, issued as that one
/// instruction, as the kernel does) with AVX-512 VNNI at level `avx512`,
/// else AVX2's `pmaddwd` + add (16 in two).
#[allow(dead_code)] // the prefill bench's
pub fn int16_peak_gmacs(threads: usize, level: &str) -> Option<(f64, &'static str)> {
    const ITERS: usize = 20_000_000;
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = level == "avx512"
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vnni");
        if !vnni && !std::is_x86_feature_detected!("avx2") {
            return None;
        }
        let t = Instant::now();
        let sums: Vec<i32> = (0..threads)
            .into_par_iter()
            // SAFETY: the features each loop needs were detected just above.
            .map(|_| unsafe {
                if vnni {
                    wssd_loop(ITERS)
                } else {
                    maddwd_loop(ITERS)
                }
            })
            .collect();
        black_box(sums);
        let (per, name) = if vnni { (32, "vpdpwssd") } else { (16, "pmaddwd") };
        Some(((threads * ITERS * 12 * per) as f64 / t.elapsed().as_secs_f64() / 1e9, name))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, level);
        None
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn wssd_loop(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (u, c) = (_mm512_set1_epi16(3), _mm512_set1_epi16(-1));
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            // SAFETY: AVX-512 VNNI (this function's); registers only.
            unsafe {
                std::arch::asm!("vpdpwssd {a}, {u}, {c}", a = inout(zmm_reg) *a, u = in(zmm_reg) u, c = in(zmm_reg) c,
                    options(pure, nomem, nostack, preserves_flags));
            }
        }
    }
    acc.iter().map(|a| _mm512_reduce_add_epi32(*a)).sum()
}

#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
#[target_feature(enable = "avx2")]
unsafe fn maddwd_loop(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let c = _mm256_set1_epi16(-1);
    let mut acc = [_mm256_setzero_si256(); 12];
    for _ in 0..iters {
        // Each product reads its own chain, so none is hoisted.
        for a in acc.iter_mut() {
            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(*a, c));
        }
    }
    let mut out = [0i32; 8];
    let s = acc.iter().fold(_mm256_setzero_si256(), |s, a| _mm256_add_epi32(s, *a));
    // SAFETY: `out` holds 8 ints.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s) };
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_loop(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (u, c) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-1));
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_dpbusd_epi32(*a, u, c);
        }
    }
    acc.iter().map(|a| _mm512_reduce_add_epi32(*a)).sum()
}

#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_loop(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (c, ones) = (_mm256_set1_epi8(-1), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_si256(); 12];
    for _ in 0..iters {
        // Each product reads its own chain, so none is hoisted.
        for a in acc.iter_mut() {
            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(_mm256_maddubs_epi16(*a, c), ones));
        }
    }
    let mut out = [0i32; 8];
    let s = acc.iter().fold(_mm256_setzero_si256(), |s, a| _mm256_add_epi32(s, *a));
    // SAFETY: `out` holds 8 ints.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s) };
    out.iter().sum()
}
