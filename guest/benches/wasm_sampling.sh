#!/usr/bin/env bash
# The per-token sampling passes compiled to wasm (as the component runs them:
# wasm32-wasip2, opt-level "s", LTO) and timed in Node's V8 and in Cranelift
# (wasmtime with the component's configuration, through
# `cargo bench -p waste-host --bench boundary -- --passes`), from
# guest/src/sampling.rs of the working tree, or of revision REV when given
# (built from a worktree of it, so two revisions can be run side by side:
# `wasm_sampling.sh; wasm_sampling.sh c174a99`). Also checks that the SIMD
# log_sum_exp equals the scalar definition bit for bit in wasm (`lse_check`
# prints 1).
#
#   guest/benches/wasm_sampling.sh [REV]
#
# Needs the wasm32-wasip2 target and rust-lld (shipped with rustup
# toolchains); node is optional (skipped with a line saying so). Links a core
# module (no component wrapper) so plain V8 and wasmtime can run it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
src="$root"
if [ $# -ge 1 ]; then
  src="$work/rev"
  git -C "$root" worktree add --detach --quiet "$src" "$1"
  trap 'git -C "$root" worktree remove --force "$src"; rm -rf "$work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/src"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "wasm-sampling-bench"
version = "0.0.0"
edition = "2021"
publish = false
[lib]
crate-type = ["cdylib"]
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
panic = "abort"
[workspace]
TOML
cat > "$work/src/lib.rs" <<RS
#[path = "$src/guest/src/sampling.rs"]
#[allow(dead_code, unused_imports)]
mod sampling;
// The f32 passes on their own, to check the vector paths against their
// scalar definitions inside wasm.
#[path = "$src/guest/src/sampling_mass.rs"]
#[allow(dead_code)]
mod mass;
fn combine_lanes(acc: &[f64; 8]) -> f64 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

static mut BUF: Vec<f32> = Vec::new();
fn buf() -> &'static [f32] {
    // SAFETY: single-threaded module; BUF is only written by setup().
    unsafe { &*core::ptr::addr_of!(BUF) }
}

/// 160k logits: uniform in [-15, 15), one -inf, one -0.0.
#[no_mangle]
pub extern "C" fn setup(n: usize) {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 30.0
        })
        .collect();
    v[5] = f32::NEG_INFINITY;
    v[77] = -0.0;
    // SAFETY: as in buf().
    unsafe { BUF = v; }
}

#[no_mangle] pub extern "C" fn lse() -> f64 { sampling::log_sum_exp(buf()) }
#[no_mangle] pub extern "C" fn argmax() -> f64 { sampling::argmax(buf()) as f64 }
#[no_mangle] pub extern "C" fn mass_each() -> f64 {
    let l = buf();
    let mut out = vec![0.0f32; l.len()];
    mass::mass_each(l, 15.0, 1.25, &mut out)
}
/// 1 when every f32 vector pass equals its scalar definition bit for bit on
/// the logits, on a copy with NaNs, ties and both zeros, and on short tails.
#[no_mangle] pub extern "C" fn mass_check() -> f64 {
    let mut ok = true;
    let mut odd = buf().to_vec();
    odd[3] = f32::NAN;
    odd[1000] = f32::NAN;
    odd[2000] = 20.0;
    odd[2001] = 20.0;
    odd[31] = -0.0;
    odd[30] = 0.0;
    for l in [buf(), &odd[..], &odd[..37], &odd[5..22], &[][..]] {
        let max = mass::scalar::argmax(l);
        let max = l.get(max).copied().unwrap_or(0.0);
        for inv_t in [1.0f32, 1.25, 3.5] {
            let (mut a, mut b) = (vec![0.0f32; l.len()], vec![0.0f32; l.len()]);
            let sa = mass::mass_each(l, max, inv_t, &mut a);
            let sb = mass::scalar::mass_each(l, max, inv_t, &mut b);
            ok &= sa.to_bits() == sb.to_bits();
            ok &= a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        }
        ok &= mass::argmax(l) == mass::scalar::argmax(l);
        let mut rel = vec![0.0f32; l.len()];
        mass::scalar::mass_each(l, 20.0, 1.0, &mut rel);
        for floor in [f32::from_bits(1), 1e-3] {
            let (mut a, mut b) = ([0.0f64; 4096], [0.0f64; 4096]);
            mass::bucket_mass(l, &rel, floor, &mut a);
            mass::scalar::bucket_mass(l, &rel, floor, &mut b);
            ok &= a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        }
        for floor in [f32::from_bits(1), 1e-3] {
            for cut in [None, Some((mass::total_key(14.0), 900)), Some((mass::total_key(20.0), 2000)), Some((mass::total_key(-0.0), 40))] {
                let kept = mass::Kept { floor, cut };
                let (a, b) = (mass::block_sums(l, &rel, kept), mass::scalar::block_sums(l, &rel, kept));
                ok &= a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            }
        }
        for from in [0, 1, 17, l.len() / 2, l.len()] {
            for floor in [f32::NEG_INFINITY, 0.0, 14.9, 20.0, 30.0] {
                ok &= mass::next_at_least(l, from, floor) == mass::scalar::next_at_least(l, from, floor);
            }
            for v in [-0.0f32, 0.0, 14.0, 20.0, -3.0] {
                let bucket = mass::total_key(v) >> 20;
                ok &= mass::next_in_bucket(l, from, bucket) == mass::scalar::next_in_bucket(l, from, bucket);
            }
        }
    }
    ok as u32 as f64
}
#[no_mangle] pub extern "C" fn lse_check() -> f64 {
    let l = buf();
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut acc = [0.0f64; 8];
    for (i, &x) in l.iter().enumerate() {
        acc[i % 8] += sampling::exp_nonpos(x as f64 - max);
    }
    let want = max + (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))).ln();
    (sampling::log_sum_exp(l).to_bits() == want.to_bits()) as u32 as f64
}
macro_rules! draw {
    (\$name:ident, \$m:ident, \$t:expr, \$k:expr, \$p:expr) => {
        #[no_mangle]
        pub extern "C" fn \$name() -> f64 {
            let p = \$m::SamplingParams { temperature: \$t, top_k: \$k, top_p: \$p, ..Default::default() };
            \$m::sample(buf(), &p, &mut \$m::Rng::new(7)) as f64
        }
    };
}
draw!(k40_p95, sampling, 0.8, 40, 0.95);
draw!(p95, sampling, 0.8, 0, 0.95);
draw!(full, sampling, 1.0, 0, 1.0);
#[no_mangle] pub extern "C" fn minp05() -> f64 {
    let p = sampling::SamplingParams { temperature: 0.8, min_p: 0.05, ..Default::default() };
    sampling::sample(buf(), &p, &mut sampling::Rng::new(7)) as f64
}
#[no_mangle] pub extern "C" fn top5() -> f64 { sampling::top_logprobs(buf(), 0.0, 5)[0].0 as f64 }
RS
cat > "$work/run.js" <<'JS'
const fs = require('fs');
const mod = new WebAssembly.Module(fs.readFileSync(process.argv[2]));
const imports = {};
for (const imp of WebAssembly.Module.imports(mod)) {
  imports[imp.module] = imports[imp.module] || {};
  if (imp.kind === 'function') imports[imp.module][imp.name] = () => { throw new Error(`unexpected import ${imp.module}.${imp.name}`); };
}
const e = new WebAssembly.Instance(mod, imports).exports;
e.setup(160000);
console.log('vocabulary 160000; best of 30 calls, ms (value returned)');
for (const pass of ['lse', 'argmax', 'k40_p95', 'p95', 'full', 'minp05', 'top5']) {
  const f = e[`${pass}`];
  let t = 1e9, v;
  for (let r = 0; r < 30; r++) { const s = process.hrtime.bigint(); v = f(); t = Math.min(t, Number(process.hrtime.bigint() - s) / 1e6); }
  console.log(`${pass.padEnd(8)}  ${t.toFixed(3)} (${v})`);
}
console.log(`lse_check ${e.lse_check()}`);
console.log(`mass_check ${e.mass_check()}`);
JS
cargo build --release --quiet --target wasm32-wasip2 --manifest-path "$work/Cargo.toml" --target-dir "$work/target" \
  --config 'target.wasm32-wasip2.linker="rust-lld"' \
  --config 'target.wasm32-wasip2.rustflags=["-C","linker-flavor=wasm-ld","-C","link-arg=--export-dynamic"]'
module="$work/target/wasm32-wasip2/release/wasm_sampling_bench.wasm"
if command -v node >/dev/null; then
  node "$work/run.js" "$module"
else
  echo "SKIP V8 timings: node is not installed"
fi
(cd "$root" && cargo bench --quiet -p waste-host --bench boundary -- --passes "$module")
