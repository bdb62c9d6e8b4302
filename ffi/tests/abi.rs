//! The C entry points called as C calls them: error paths (NULL arguments,
//! bad paths, a budget under the floor) and two models open at once.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

use waste::waste_result::{self, *};
use waste::*;

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/bible-moe.waste")
}

fn last_error(ctx: *const waste_ctx) -> String {
    let mut buf = vec![0u8; 1024];
    let n = unsafe { waste_ctx_last_error(ctx, buf.as_mut_ptr() as *mut _, buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8(buf).unwrap()
}

fn open_ctx() -> *mut waste_ctx {
    let mut ctx = null_mut();
    assert_eq!(unsafe { waste_ctx_open(&mut ctx) }, WASTE_OK);
    ctx
}

fn open_model(ctx: *mut waste_ctx, path: &str) -> (waste_result, *mut waste_model) {
    let mut m = null_mut();
    let r = unsafe { waste_model_open(ctx, path.as_ptr() as *const _, path.len(), null(), &mut m) };
    (r, m)
}

fn expect(ctx: *const waste_ctx, r: waste_result, want: waste_result, mentions: &str) {
    assert_eq!(r, want, "detail: {}", last_error(ctx));
    let e = last_error(ctx);
    assert!(e.contains(mentions), "error detail {e:?} should mention {mentions:?}");
    let s = unsafe { CStr::from_ptr(waste_strerror(r)) }.to_str().unwrap();
    assert!(!s.is_empty());
}

#[test]
fn every_entry_point_reports_null_arguments_bad_paths_and_budget_under_floor() {
    unsafe {
        // Handles that are NULL have no context to hold a detail.
        assert_eq!(waste_ctx_open(null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_plan(null(), null(), 0, 0, 0, null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_model_open(null(), null(), 0, null(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_model_get_info(null(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_model_memory_plan(null(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_model_store_stats(null(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_model_reset_store_stats(null()), WASTE_NULL_ARG);
        assert_eq!(waste_model_save_usage(null()), WASTE_NULL_ARG);
        assert_eq!(waste_session_open(null(), null(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_tokenize(null_mut(), null(), 0, null_mut(), 0, null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_tokenize_markup(null_mut(), null(), 0, null_mut(), 0, null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_detokenize(null_mut(), null(), 0, null_mut(), 0, null_mut()), WASTE_NULL_ARG);
        let no = waste_str { ptr: null(), len: 0 };
        assert_eq!(
            waste_session_apply_chat_template(null_mut(), null(), 0, no, true, null_mut(), 0, null_mut()),
            WASTE_NULL_ARG
        );
        assert_eq!(waste_session_generate(null_mut(), null(), 0, null(), None, null_mut(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_eval(null_mut(), null(), 0, false, null_mut(), 0, null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_perplexity(null_mut(), null(), 0, 0, null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_save_state(null_mut(), null(), 0), WASTE_NULL_ARG);
        assert_eq!(waste_session_load_state(null_mut(), null(), 0), WASTE_NULL_ARG);
        assert_eq!(waste_session_reset(null_mut()), WASTE_NULL_ARG);
        assert_eq!(
            waste_session_attach_image(null_mut(), null(), 0, null_mut(), null_mut(), 0, null_mut()),
            WASTE_NULL_ARG
        );
        assert_eq!(waste_session_detach_images(null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_session_position(null_mut(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_open_options_default(null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_generate_params_default(null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_component_bytes(null_mut(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_ctx_last_error(null(), null_mut(), 0), 0);
        waste_ctx_close(null_mut());
        waste_model_close(null_mut());
        waste_session_close(null_mut());

        let ctx = open_ctx();
        let path = model_path();
        let path = path.to_str().unwrap();
        // NULL outputs and inputs behind a live context carry a detail.
        let r = waste_plan(ctx, path.as_ptr() as *const _, path.len(), 0, 0, null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out");
        let r = waste_model_open(ctx, null(), 5, null(), &mut null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "path");
        let r = waste_session_open(ctx, null(), &mut null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "model");
        // Bad paths and bad text.
        let (r, m) = open_model(ctx, "/nonexistent/model.waste");
        // The library classifies a missing container as a format error.
        expect(ctx, r, WASTE_FORMAT, "/nonexistent/model.waste: does not exist");
        assert!(m.is_null());
        let mut plan = waste_memory_plan::default();
        let bad = "/nonexistent/x.waste";
        expect(ctx, waste_plan(ctx, bad.as_ptr() as *const _, bad.len(), 0, 0, &mut plan), WASTE_FORMAT, bad);
        let not_utf8 = [0xffu8, 0xfe];
        let r = waste_model_open(ctx, not_utf8.as_ptr() as *const _, 2, null(), &mut null_mut());
        expect(ctx, r, WASTE_UTF8, "UTF-8");
        // A budget under the floor, from plan and from open.
        assert_eq!(waste_plan(ctx, path.as_ptr() as *const _, path.len(), 0, 0, &mut plan), WASTE_OK);
        assert_eq!(last_error(ctx), "");
        let under = plan.floor - 1;
        let r = waste_plan(ctx, path.as_ptr() as *const _, path.len(), 0, under, &mut plan);
        expect(ctx, r, WASTE_RAM_BUDGET, "floor");
        let mut opts = std::mem::zeroed::<waste_open_options>();
        waste_open_options_default(&mut opts);
        opts.budget = under;
        let mut m = null_mut();
        let r = waste_model_open(ctx, path.as_ptr() as *const _, path.len(), &opts, &mut m);
        expect(ctx, r, WASTE_RAM_BUDGET, "floor");
        assert!(m.is_null());
        opts.budget = 0;
        opts.cache_policy = 7;
        let r = waste_model_open(ctx, path.as_ptr() as *const _, path.len(), &opts, &mut m);
        expect(ctx, r, WASTE_ARG, "cache_policy");

        // Session calls with NULL outputs, short buffers and bad values.
        let (r, model) = open_model(ctx, path);
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        let mut s = null_mut();
        assert_eq!(waste_session_open(ctx, model, &mut s), WASTE_OK);
        let text = "And God said";
        let r = waste_session_tokenize(s, text.as_ptr() as *const _, text.len(), null_mut(), 0, null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out_len");
        let mut n = 0usize;
        let r = waste_session_tokenize(s, text.as_ptr() as *const _, text.len(), null_mut(), 0, &mut n);
        expect(ctx, r, WASTE_BUFFER_TOO_SMALL, "buffer");
        assert!(n > 0);
        let r = waste_session_eval(s, null(), 0, false, null_mut(), 0, &mut n);
        expect(ctx, r, WASTE_ARG, "no tokens");
        let r = waste_session_detokenize(s, null(), 3, null_mut(), 0, &mut n);
        expect(ctx, r, WASTE_NULL_ARG, "tokens");
        let st = "/nonexistent/dir/state.bin";
        let dir = "/nonexistent/dir/";
        expect(ctx, waste_session_save_state(s, st.as_ptr() as *const _, st.len()), WASTE_IO, dir);
        expect(ctx, waste_session_load_state(s, st.as_ptr() as *const _, st.len()), WASTE_IO, st);
        let mut params = std::mem::zeroed::<waste_generate_params>();
        waste_generate_params_default(&mut params);
        params.top_p = 5.0;
        let r = waste_session_generate(s, null(), 0, &params, None, null_mut(), null_mut());
        expect(ctx, r, WASTE_ARG, "top");
        let r = waste_session_perplexity(s, text.as_ptr() as *const _, text.len(), 0, null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "perplexity");
        expect(ctx, waste_model_get_info(model, null_mut()), WASTE_NULL_ARG, "out");
        expect(ctx, waste_session_position(s, null_mut()), WASTE_NULL_ARG, "position");
        // Images: NULL outputs first, then a text-only model says so.
        let png = std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-kimi_k3-vision/image_a.png"),
        )
        .unwrap();
        let mut info = waste_image_info::default();
        let mut markup = [0 as std::ffi::c_char; WASTE_IMAGE_MARKUP_MAX];
        let r = waste_session_attach_image(s, png.as_ptr(), png.len(), null_mut(), markup.as_mut_ptr(), 128, &mut n);
        expect(ctx, r, WASTE_NULL_ARG, "info");
        let r = waste_session_attach_image(s, png.as_ptr(), png.len(), &mut info, markup.as_mut_ptr(), 128, null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out_len");
        let r = waste_session_attach_image(s, png.as_ptr(), png.len(), &mut info, markup.as_mut_ptr(), 128, &mut n);
        expect(ctx, r, WASTE_UNSUPPORTED, "no vision tower");
        waste_session_close(s);
        waste_model_close(model);
        waste_ctx_close(ctx);
    }
}

unsafe extern "C" fn collect(user: *mut c_void, ev: *const waste_token_event) -> bool {
    let v = unsafe { &mut *(user as *mut Vec<u32>) };
    v.push(unsafe { (*ev).token });
    true
}

unsafe extern "C" fn stop_after_two(user: *mut c_void, _ev: *const waste_token_event) -> bool {
    let n = unsafe { &mut *(user as *mut u32) };
    *n += 1;
    *n < 2
}

/// Greedy tokens and last logits of one session on `model`.
unsafe fn run(ctx: *mut waste_ctx, model: *mut waste_model) -> (Vec<u32>, Vec<f32>) {
    unsafe {
        let mut s = null_mut();
        assert_eq!(waste_session_open(ctx, model, &mut s), WASTE_OK);
        let text = "In the beginning";
        let mut prompt = vec![0u32; 64];
        let mut n = 0;
        assert_eq!(
            waste_session_tokenize(s, text.as_ptr() as *const _, text.len(), prompt.as_mut_ptr(), 64, &mut n),
            WASTE_OK
        );
        prompt.truncate(n);
        let mut params = std::mem::zeroed::<waste_generate_params>();
        waste_generate_params_default(&mut params);
        params.temperature = 0.0;
        params.max_tokens = 12;
        let mut tokens: Vec<u32> = Vec::new();
        let mut done = std::mem::zeroed::<waste_completion>();
        let r = waste_session_generate(
            s,
            prompt.as_ptr(),
            n,
            &params,
            Some(collect),
            &mut tokens as *mut _ as *mut c_void,
            &mut done,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        assert_eq!(done.n_tokens, tokens.len());
        let mut logits = vec![0f32; 1 << 16];
        let mut nl = 0;
        assert_eq!(
            waste_session_eval(s, prompt.as_ptr(), 1, false, logits.as_mut_ptr(), logits.len(), &mut nl),
            WASTE_OK
        );
        logits.truncate(nl);
        // Cancelling from the callback is WASTE_CANCELLED with the summary filled.
        let mut count = 0u32;
        let r = waste_session_generate(
            s,
            prompt.as_ptr(),
            n,
            &params,
            Some(stop_after_two),
            &mut count as *mut _ as *mut c_void,
            &mut done,
        );
        assert_eq!(r, WASTE_CANCELLED);
        assert_eq!(done.stop_reason, waste_stop_reason::WASTE_STOP_CANCELLED);
        assert_eq!(done.n_tokens, 2);
        waste_session_close(s);
        (tokens, logits)
    }
}

#[test]
fn two_models_open_at_once_give_the_results_of_one_at_a_time() {
    unsafe {
        let ctx = open_ctx();
        let path = model_path();
        let path = path.to_str().unwrap();
        let (r, alone) = open_model(ctx, path);
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        let solo = run(ctx, alone);
        waste_model_close(alone);

        let (r1, a) = open_model(ctx, path);
        let (r2, b) = open_model(ctx, path);
        assert_eq!((r1, r2), (WASTE_OK, WASTE_OK));
        let (ra, rb) = (run(ctx, a), run(ctx, b));
        assert_eq!(ra, solo);
        assert_eq!(rb, solo);
        assert_eq!(solo.0.len(), 12);
        waste_model_close(a);
        waste_model_close(b);
        waste_ctx_close(ctx);
    }
}

/// The KV cache's type through C: bf16 by default (also in a zeroed
/// struct), f32 or q8 on request, each planned as the Rust API plans it;
/// an unknown code is refused with a detail naming the field.
#[test]
fn kv_type_is_bf16_by_default_and_an_unknown_code_is_refused() {
    let ctx = open_ctx();
    let path = model_path();
    let path = path.to_str().unwrap();
    let mut opts = unsafe { std::mem::zeroed::<waste_open_options>() };
    assert_eq!(unsafe { waste_open_options_default(&mut opts) }, WASTE_OK);
    assert_eq!(opts.kv_type, WASTE_KV_BF16);
    let state = |kv_type: u32| -> u64 {
        let mut m = null_mut();
        let o = waste_open_options { kv_type, ..opts };
        let r = unsafe { waste_model_open(ctx, path.as_ptr() as *const _, path.len(), &o, &mut m) };
        assert_eq!(r, WASTE_OK, "kv_type {kv_type}: {}", last_error(ctx));
        let mut plan = waste_memory_plan::default();
        assert_eq!(unsafe { waste_model_memory_plan(m, &mut plan) }, WASTE_OK);
        unsafe { waste_model_close(m) };
        plan.state
    };
    let (bf16, f32, q8) = (state(WASTE_KV_BF16), state(WASTE_KV_F32), state(WASTE_KV_Q8));
    let rust = |kv_type| {
        waste_host::plan_path(&model_path(), &waste_host::PlanRequest { kv_type, ..Default::default() }).unwrap().state
    };
    assert_eq!(
        (bf16, f32, q8),
        (rust(waste_host::KvType::Bf16), rust(waste_host::KvType::F32), rust(waste_host::KvType::Q8))
    );
    assert_eq!(f32, 2 * bf16);
    let o = waste_open_options { kv_type: 7, ..opts };
    let r = unsafe { waste_model_open(ctx, path.as_ptr() as *const _, path.len(), &o, &mut null_mut()) };
    expect(ctx, r, WASTE_ARG, "kv_type 7");
    unsafe { waste_ctx_close(ctx) };
}
