//! Open with progress, convert and synth through the C ABI.

use std::ffi::{c_char, c_void, CStr};
use std::ptr::{null, null_mut};

use waste::waste_result::*;
use waste::*;

use super::harness::*;

/// Opens `path` with `open_event` collecting the progress; checks that
/// the trunk's progress grows to the trunk the model holds. Returns the
/// model (the caller closes it) and the events.
unsafe fn open_reporting_the_whole_trunk(
    ctx: *mut waste_ctx,
    path: &str,
) -> (*mut waste_model, Vec<waste_open_progress>) {
    let mut seen: Vec<waste_open_progress> = Vec::new();
    let mut model = null_mut();
    let r = unsafe {
        waste_model_open_with_progress(
            ctx,
            path.as_ptr() as *const _,
            path.len(),
            null(),
            Some(open_event),
            &mut seen as *mut _ as *mut c_void,
            &mut model,
        )
    };
    assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
    let trunk: Vec<_> = seen.iter().filter(|e| e.stage == waste_open_stage::WASTE_OPEN_TRUNK).collect();
    assert!(!trunk.is_empty() && trunk.windows(2).all(|w| w[0].loaded <= w[1].loaded), "{seen:?}");
    let last = trunk.last().unwrap();
    let mut used = waste_memory_use::default();
    assert_eq!(unsafe { waste_model_memory_used(model, &mut used) }, WASTE_OK);
    assert_eq!((last.loaded, last.total), (used.trunk, used.trunk));
    (model, seen)
}

#[test]
fn open_with_progress_reports_the_whole_trunk() {
    let path = bible();
    let p = path.to_str().unwrap();
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(waste_ctx_open(&mut ctx), WASTE_OK);
        let (mut model, mut seen) = open_reporting_the_whole_trunk(ctx, p);
        let trunk = seen.iter().filter(|e| e.stage == waste_open_stage::WASTE_OPEN_TRUNK).count();
        assert!(trunk >= 2, "{seen:?}");
        waste_model_close(model);
        // Without a callback it opens as waste_model_open does; errors as there.
        let r =
            waste_model_open_with_progress(ctx, p.as_ptr() as *const _, p.len(), null(), None, null_mut(), &mut model);
        assert_eq!(r, WASTE_OK);
        waste_model_close(model);
        let missing = "/nonexistent/model.waste";
        let r = waste_model_open_with_progress(
            ctx,
            missing.as_ptr() as *const _,
            missing.len(),
            null(),
            Some(open_event),
            &mut seen as *mut _ as *mut c_void,
            &mut model,
        );
        expect(ctx, r, WASTE_FORMAT, missing);
        assert!(model.is_null());
        let r =
            waste_model_open_with_progress(ctx, p.as_ptr() as *const _, p.len(), null(), None, null_mut(), null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out");
        assert_eq!(
            waste_model_open_with_progress(null(), null(), 0, null(), None, null_mut(), null_mut()),
            WASTE_NULL_ARG
        );
        waste_ctx_close(ctx);
    }
}

/// The C ABI's open takes a GGUF file as the command line does: run in
/// place, its trunk reported whole as it loads, its memory as planned.
#[test]
fn open_through_c_runs_a_gguf_file_in_place() {
    let path = root().join("tests/fixtures/gguf/models/wide-qwen3moe-q4_k_m.gguf");
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(waste_ctx_open(&mut ctx), WASTE_OK);
        let (model, _) = open_reporting_the_whole_trunk(ctx, path.to_str().unwrap());
        waste_model_close(model);
        waste_ctx_close(ctx);
    }
}

#[test]
fn convert_through_c_gives_the_transformers_greedy_tokens_and_synth_reports_bad_shapes() {
    let fixture = root().join("tests/fixtures/tiny-qwen3_moe");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).expect("fixture reference"))
            .unwrap();
    let ids =
        |k: &str| -> Vec<u32> { reference[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    let tmp = std::env::temp_dir().join(format!("waste-ffi-convert-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let out = tmp.join("tiny.waste");
    let (src, dst) = (fixture.to_str().unwrap(), out.to_str().unwrap());
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(waste_ctx_open(&mut ctx), WASTE_OK);
        let mut opts = std::mem::zeroed::<waste_convert_options>();
        assert_eq!(waste_convert_options_default(&mut opts), WASTE_OK);
        opts.experts = s("f32");
        opts.trunk = s("f32");
        // Banks in parallel: the output does not depend on it.
        opts.jobs = 2;
        let mut seen: Vec<(u64, u64)> = Vec::new();
        let mut report = waste_convert_report::default();
        let r = waste_convert(
            ctx,
            src.as_ptr() as *const _,
            src.len(),
            dst.as_ptr() as *const _,
            dst.len(),
            &opts,
            Some(progress),
            &mut seen as *mut _ as *mut c_void,
            &mut report,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        let &(done, total) = seen.last().expect("progress reported");
        assert_eq!(done, total);
        assert!(report.moe_layers > 0 && report.expert_bytes > 0);
        assert!(!report.trunk_reused && report.reused_banks == 0 && report.reclaimed_shards == 0);

        // f32 experts decode back exactly, every matrix of every expert.
        let mut rows: Vec<(usize, usize, String, f64)> = Vec::new();
        let mut nrows = 0usize;
        let r = waste_convert_verify(
            ctx,
            src.as_ptr() as *const _,
            src.len(),
            dst.as_ptr() as *const _,
            dst.len(),
            None,
            Some(matrix_row),
            &mut rows as *mut _ as *mut c_void,
            &mut nrows,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
        let experts =
            cfg.get("num_experts").or(cfg.get("num_local_experts")).and_then(|v| v.as_u64()).unwrap() as usize;
        assert_eq!(nrows, report.moe_layers * experts * 3);
        assert_eq!(rows.len(), nrows);
        assert!(
            rows.iter().all(|(_, _, m, max_abs)| ["gate", "up", "down"].contains(&m.as_str()) && *max_abs == 0.0),
            "{rows:?}"
        );
        let missing_out = "/nonexistent/out.waste";
        let r = waste_convert_verify(
            ctx,
            src.as_ptr() as *const _,
            src.len(),
            missing_out.as_ptr() as *const _,
            missing_out.len(),
            None,
            None,
            null_mut(),
            null_mut(),
        );
        assert_ne!(r, WASTE_OK);
        assert!(last_error(ctx).contains(missing_out), "{}", last_error(ctx));
        let r = waste_convert_verify(
            ctx,
            null(),
            0,
            dst.as_ptr() as *const _,
            dst.len(),
            None,
            None,
            null_mut(),
            null_mut(),
        );
        expect(ctx, r, WASTE_NULL_ARG, "src");
        let r = waste_convert_verify(
            ctx,
            src.as_ptr() as *const _,
            src.len(),
            null(),
            0,
            None,
            None,
            null_mut(),
            null_mut(),
        );
        expect(ctx, r, WASTE_NULL_ARG, "out");
        assert_eq!(
            waste_convert_verify(null(), null(), 0, null(), 0, None, None, null_mut(), null_mut()),
            WASTE_NULL_ARG
        );

        // Bad arguments, each with its code.
        let conv = |src: &str, o: &waste_convert_options| {
            waste_convert(
                ctx,
                src.as_ptr() as *const _,
                src.len(),
                dst.as_ptr() as *const _,
                dst.len(),
                o,
                None,
                null_mut(),
                null_mut(),
            )
        };
        let mut bad = opts;
        bad.experts = s("q7");
        expect(ctx, conv(src, &bad), WASTE_ARG, "q7");
        bad = opts;
        bad.trunk = s("rvq3");
        expect(ctx, conv(src, &bad), WASTE_ARG, "rvq3");
        let missing = "/nonexistent/checkpoint";
        let r = conv(missing, &opts);
        assert!(r == WASTE_IO || r == WASTE_FORMAT, "{r:?}: {}", last_error(ctx));
        assert!(last_error(ctx).contains(missing), "{}", last_error(ctx));
        let r =
            waste_convert(ctx, null(), 0, dst.as_ptr() as *const _, dst.len(), null(), None, null_mut(), null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "src");
        let r =
            waste_convert(ctx, src.as_ptr() as *const _, src.len(), null(), 0, null(), None, null_mut(), null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out");
        assert_eq!(waste_convert(null(), null(), 0, null(), 0, null(), None, null_mut(), null_mut()), WASTE_NULL_ARG);
        assert_eq!(waste_convert_options_default(null_mut()), WASTE_NULL_ARG);

        // Synth: a bad shape, a bad format and an existing destination.
        let synth = |shape: waste_str, experts: waste_str, out: &str| {
            waste_synth(ctx, out.as_ptr() as *const _, out.len(), shape, experts, 1, None, null_mut(), null_mut())
        };
        let fresh = tmp.join("synth.waste");
        let fresh = fresh.to_str().unwrap();
        expect(ctx, synth(s("huge"), NONE, fresh), WASTE_ARG, "expected one of");
        expect(ctx, synth(NONE, NONE, fresh), WASTE_NULL_ARG, "shape");
        expect(ctx, synth(s("small"), s("f32"), fresh), WASTE_ARG, "f32");
        expect(ctx, synth(s("small"), NONE, dst), WASTE_ARG, "already exists");
        let r = waste_synth(ctx, null(), 0, s("small"), NONE, 1, None, null_mut(), null_mut());
        expect(ctx, r, WASTE_NULL_ARG, "out");
        assert_eq!(waste_synth(null(), null(), 0, NONE, NONE, 0, None, null_mut(), null_mut()), WASTE_NULL_ARG);
        waste_ctx_close(ctx);
    }

    // The converted container generates transformers' greedy tokens.
    let o = Open::new(&out);
    let (r, events) = o.generate(&ids("prompt_ids"), &params(0.0, 0, 16));
    assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
    assert_eq!(events.iter().map(|e| e.token).collect::<Vec<_>>(), ids("greedy_ids"));
    drop(o);
    let _ = std::fs::remove_dir_all(&tmp);
}

unsafe extern "C" fn progress(user: *mut c_void, done: u64, total: u64, _what: *const c_char, _len: usize) {
    let v = unsafe { &mut *(user as *mut Vec<(u64, u64)>) };
    v.push((done, total));
}

unsafe extern "C" fn matrix_row(user: *mut c_void, row: *const waste_matrix_error) {
    let (v, r) = unsafe { (&mut *(user as *mut Vec<(usize, usize, String, f64)>), &*row) };
    let name = unsafe { CStr::from_ptr(r.matrix.as_ptr()) }.to_str().unwrap().to_string();
    v.push((r.layer, r.expert, name, r.max_abs));
}

unsafe extern "C" fn open_event(user: *mut c_void, p: *const waste_open_progress) {
    let v = unsafe { &mut *(user as *mut Vec<waste_open_progress>) };
    v.push(unsafe { *p });
}
