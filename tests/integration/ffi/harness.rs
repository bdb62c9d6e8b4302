//! What the CLI does beyond open/generate, reached through the C entry
//! points: sampler plugins, top log-probabilities, chat rendering, the
//! transcript, model details, memory figures, routing replay, start-up
//! timings, convert and synth; each with its error paths. This module
//! holds their shared harness.

use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

use waste::waste_result::{self, *};
use waste::*;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn bible() -> PathBuf {
    root().join("examples/bible-moe.waste")
}

pub fn last_error(ctx: *const waste_ctx) -> String {
    let mut buf = vec![0u8; 2048];
    let n = unsafe { waste_ctx_last_error(ctx, buf.as_mut_ptr() as *mut _, buf.len()) };
    buf.truncate(n.min(2047));
    String::from_utf8(buf).unwrap()
}

pub fn expect(ctx: *const waste_ctx, r: waste_result, want: waste_result, mentions: &str) {
    assert_eq!(r, want, "detail: {}", last_error(ctx));
    let e = last_error(ctx);
    assert!(e.contains(mentions), "error detail {e:?} should mention {mentions:?}");
}

pub fn s(text: &str) -> waste_str {
    waste_str { ptr: text.as_ptr() as *const c_char, len: text.len() }
}

pub const NONE: waste_str = waste_str { ptr: null(), len: 0 };

pub struct Open {
    pub ctx: *mut waste_ctx,
    pub model: *mut waste_model,
    pub session: *mut waste_session,
}

impl Open {
    pub fn new(path: &std::path::Path) -> Open {
        unsafe {
            let mut ctx = null_mut();
            assert_eq!(waste_ctx_open(&mut ctx), WASTE_OK);
            let p = path.to_str().unwrap();
            let mut model = null_mut();
            let r = waste_model_open(ctx, p.as_ptr() as *const _, p.len(), null(), &mut model);
            assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
            let mut session = null_mut();
            assert_eq!(waste_session_open(ctx, model, &mut session), WASTE_OK);
            Open { ctx, model, session }
        }
    }

    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![0u32; 4096];
        let mut n = 0;
        let r = unsafe {
            waste_session_tokenize(
                self.session,
                text.as_ptr() as *const _,
                text.len(),
                ids.as_mut_ptr(),
                ids.len(),
                &mut n,
            )
        };
        assert_eq!(r, WASTE_OK, "{}", last_error(self.ctx));
        ids.truncate(n);
        ids
    }

    pub fn generate(&self, prompt: &[u32], params: &waste_generate_params) -> (waste_result, Vec<Event>) {
        let mut events: Vec<Event> = Vec::new();
        let r = unsafe {
            waste_session_generate(
                self.session,
                prompt.as_ptr(),
                prompt.len(),
                params,
                Some(record),
                &mut events as *mut _ as *mut c_void,
                null_mut(),
            )
        };
        (r, events)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        unsafe {
            waste_session_close(self.session);
            waste_model_close(self.model);
            waste_ctx_close(self.ctx);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

unsafe extern "C" fn record(user: *mut c_void, ev: *const waste_token_event) -> bool {
    let (v, e) = unsafe { (&mut *(user as *mut Vec<Event>), &*ev) };
    let top = if e.n_top == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(e.top, e.n_top) }.iter().map(|t| (t.token, t.logprob)).collect()
    };
    v.push(Event { token: e.token, logprob: e.logprob, top });
    true
}

pub fn params(temperature: f32, seed: u64, max_tokens: u32) -> waste_generate_params {
    let mut p = unsafe { std::mem::zeroed::<waste_generate_params>() };
    assert_eq!(unsafe { waste_generate_params_default(&mut p) }, WASTE_OK);
    p.temperature = temperature;
    p.seed = seed;
    p.max_tokens = max_tokens;
    p.stop_at_eos = false;
    p
}

pub unsafe fn set_sampler(
    o: &Open,
    path: &str,
    opts: &[(&str, f32)],
    limits: Option<waste_sampler_limits>,
) -> waste_result {
    let options: Vec<waste_sampler_option> =
        opts.iter().map(|&(n, v)| waste_sampler_option { name: s(n), value: v }).collect();
    let l = limits.as_ref().map_or(null(), |l| l as *const _);
    unsafe {
        waste_session_set_sampler(o.session, path.as_ptr() as *const _, path.len(), options.as_ptr(), options.len(), l)
    }
}

/// log-softmax of `row`, its `k` largest entries, most likely first.
pub fn top_k_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.iter().take(k).map(|&i| (i as u32, (row[i] as f64 - log_z) as f32)).collect()
}
