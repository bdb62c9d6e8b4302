//! What the CLI does beyond open/generate, reached through the C entry
//! points: sampler plugins, top log-probabilities, chat rendering, the
//! transcript, model details, memory figures, routing replay, start-up
//! timings, convert and synth; each with its error paths.

use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::{null, null_mut};

use waste::waste_result::{self, *};
use waste::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bible() -> PathBuf {
    root().join("examples/bible-moe.waste")
}

fn last_error(ctx: *const waste_ctx) -> String {
    let mut buf = vec![0u8; 2048];
    let n = unsafe { waste_ctx_last_error(ctx, buf.as_mut_ptr() as *mut _, buf.len()) };
    buf.truncate(n.min(2047));
    String::from_utf8(buf).unwrap()
}

fn expect(ctx: *const waste_ctx, r: waste_result, want: waste_result, mentions: &str) {
    assert_eq!(r, want, "detail: {}", last_error(ctx));
    let e = last_error(ctx);
    assert!(e.contains(mentions), "error detail {e:?} should mention {mentions:?}");
}

fn s(text: &str) -> waste_str {
    waste_str { ptr: text.as_ptr() as *const c_char, len: text.len() }
}

const NONE: waste_str = waste_str { ptr: null(), len: 0 };

struct Open {
    ctx: *mut waste_ctx,
    model: *mut waste_model,
    session: *mut waste_session,
}

impl Open {
    fn new(path: &std::path::Path) -> Open {
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

    fn tokenize(&self, text: &str) -> Vec<u32> {
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

    fn generate(&self, prompt: &[u32], params: &waste_generate_params) -> (waste_result, Vec<Event>) {
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
struct Event {
    token: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
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

fn params(temperature: f32, seed: u64, max_tokens: u32) -> waste_generate_params {
    let mut p = unsafe { std::mem::zeroed::<waste_generate_params>() };
    assert_eq!(unsafe { waste_generate_params_default(&mut p) }, WASTE_OK);
    p.temperature = temperature;
    p.seed = seed;
    p.max_tokens = max_tokens;
    p.stop_at_eos = false;
    p
}

/// Builds a plugin crate under examples/ for wasm32-wasip2 into
/// target/plugins (where tests/integration/plugins.rs builds them too).
fn plugin(name: &str) -> PathBuf {
    let target = root().join("target/plugins");
    let crate_name = format!("waste-sampler-{name}");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root())
        .args(["build", "--release", "-p", &crate_name, "--target", "wasm32-wasip2", "--target-dir"])
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(status.success(), "building {crate_name} for wasm32-wasip2 failed");
    let wasm = target.join(format!("wasm32-wasip2/release/waste_sampler_{name}.wasm"));
    assert!(wasm.is_file(), "{} is missing", wasm.display());
    wasm
}

unsafe fn set_sampler(
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

#[test]
fn sampler_plugin_through_c_draws_as_the_rust_api_and_reports_its_failures() {
    let mirostat = plugin("mirostat");
    let misbehave = plugin("misbehave");
    let o = Open::new(&bible());
    let prompt = o.tokenize("And God said");
    let p = params(1.0, 5, 12);
    let tau = [("tau", 3.0), ("eta", 0.1)];
    unsafe {
        assert_eq!(set_sampler(&o, mirostat.to_str().unwrap(), &tau, None), WASTE_OK, "{}", last_error(o.ctx));
    }
    let (r, via_c) = o.generate(&prompt, &p);
    assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
    assert_eq!(via_c.len(), 12);

    // The same plugin, options and seed through the Rust API.
    use waste_host::plugin::{PluginLimits, SamplerPlugin};
    let model = waste_host::Model::open(&bible(), &Default::default()).unwrap();
    let engine = waste_host::Engine::new().unwrap();
    let mut rs = engine.session(model).unwrap();
    let gp = waste_host::GenerateParams {
        temperature: 1.0,
        seed: 5,
        max_tokens: 12,
        stop_at_eos: false,
        ..Default::default()
    };
    let opts: Vec<(String, f32)> = tau.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    rs.set_sampler(Some(SamplerPlugin::load(&mirostat, opts, PluginLimits::default()).unwrap()));
    let want = rs.generate(&prompt, &gp, |_| true).unwrap();
    let got: Vec<u32> = via_c.iter().map(|e| e.token).collect();
    assert_eq!(got, want.tokens);

    // Detached, the built-in sampler draws again, as the Rust API's does.
    unsafe {
        assert_eq!(waste_session_clear_sampler(o.session), WASTE_OK);
        assert_eq!(waste_session_reset(o.session), WASTE_OK);
    }
    rs.set_sampler(None);
    rs.reset();
    let (r, builtin) = o.generate(&prompt, &p);
    assert_eq!(r, WASTE_OK);
    let want = rs.generate(&prompt, &gp, |_| true).unwrap();
    assert_eq!(builtin.iter().map(|e| e.token).collect::<Vec<_>>(), want.tokens);

    unsafe {
        // Bad arguments.
        assert_eq!(waste_session_set_sampler(null_mut(), null(), 0, null(), 0, null()), WASTE_NULL_ARG);
        assert_eq!(waste_session_clear_sampler(null_mut()), WASTE_NULL_ARG);
        let r = waste_session_set_sampler(o.session, null(), 0, null(), 0, null());
        expect(o.ctx, r, WASTE_NULL_ARG, "path");
        let mp = mirostat.to_str().unwrap();
        let r = waste_session_set_sampler(o.session, mp.as_ptr() as *const _, mp.len(), null(), 2, null());
        expect(o.ctx, r, WASTE_NULL_ARG, "options");
        let nameless = [waste_sampler_option { name: NONE, value: 1.0 }];
        let r = waste_session_set_sampler(o.session, mp.as_ptr() as *const _, mp.len(), nameless.as_ptr(), 1, null());
        expect(o.ctx, r, WASTE_NULL_ARG, "option name");
        expect(o.ctx, set_sampler(&o, mp, &[("tau", f32::NAN)], None), WASTE_ARG, "tau");
        let missing = "/nonexistent/plugin.wasm";
        expect(o.ctx, set_sampler(&o, missing, &[], None), WASTE_IO, missing);
        let not_a_plugin = bible().join("manifest.json");
        let np = not_a_plugin.to_str().unwrap();
        expect(o.ctx, set_sampler(&o, np, &[], None), WASTE_FORMAT, "manifest.json");

        // A plugin that traps fails its generation only.
        let bp = misbehave.to_str().unwrap();
        assert_eq!(set_sampler(&o, bp, &[("mode", 1.0)], None), WASTE_OK);
        let (r, _) = o.generate(&prompt, &p);
        expect(o.ctx, r, WASTE_GUEST, "trapped");
        assert!(last_error(o.ctx).contains("waste_sampler_misbehave.wasm"), "{}", last_error(o.ctx));
        // One that loops runs out of the fuel the caller gave it.
        let tight = waste_sampler_limits { fuel_per_call: 1_000_000, memory_bytes: 0 };
        assert_eq!(set_sampler(&o, bp, &[("mode", 2.0)], Some(tight)), WASTE_OK);
        let (r, _) = o.generate(&prompt, &p);
        expect(o.ctx, r, WASTE_GUEST, "fuel limit of 1000000");
        // The session itself is unharmed.
        assert_eq!(waste_session_clear_sampler(o.session), WASTE_OK);
        let (r, ev) = o.generate(&prompt, &p);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!(ev.len(), 12);
    }
}

/// log-softmax of `row`, its `k` largest entries, most likely first.
fn top_k_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.iter().take(k).map(|&i| (i as u32, (row[i] as f64 - log_z) as f32)).collect()
}

#[test]
fn top_logprobs_chat_rendering_transcript_and_model_details_through_c() {
    let o = Open::new(&bible());
    let prompt = o.tokenize("In the beginning");
    unsafe {
        // The raw distribution after the prompt, from eval.
        let mut logits = vec![0f32; 1 << 14];
        let mut n = 0;
        let r = waste_session_eval(
            o.session,
            prompt.as_ptr(),
            prompt.len(),
            false,
            logits.as_mut_ptr(),
            logits.len(),
            &mut n,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        logits.truncate(n);
        let want_top = top_k_logprobs(&logits, 3);
        assert_eq!(waste_session_reset(o.session), WASTE_OK);

        let mut p = params(0.0, 0, 4);
        p.top_logprobs = 3;
        let (r, events) = o.generate(&prompt, &p);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!(events.len(), 4);
        assert!(events.iter().all(|e| e.top.len() == 3 && e.top[0].0 == e.token));
        let first = &events[0];
        for ((gt, gl), (wt, wl)) in first.top.iter().zip(&want_top) {
            assert_eq!(gt, wt);
            assert!((gl - wl).abs() < 1e-4, "{:?} vs {:?}", first.top, want_top);
        }
        assert!((first.logprob - want_top[0].1).abs() < 1e-4);
        p.top_logprobs = 21;
        let (r, _) = o.generate(&prompt, &p);
        expect(o.ctx, r, WASTE_ARG, "logprobs");

        // The transcript: prompt, then every generated token.
        let mut t = vec![0u32; 64];
        let mut n = 0;
        assert_eq!(waste_session_tokens(o.session, t.as_mut_ptr(), t.len(), &mut n), WASTE_OK);
        t.truncate(n);
        let want: Vec<u32> = prompt.iter().copied().chain(events.iter().map(|e| e.token)).collect();
        assert_eq!(t, want);
        expect(o.ctx, waste_session_tokens(o.session, null_mut(), 0, &mut n), WASTE_BUFFER_TOO_SMALL, "buffer");
        assert_eq!(n, want.len());
        expect(o.ctx, waste_session_tokens(o.session, null_mut(), 0, null_mut()), WASTE_NULL_ARG, "out_len");
        assert_eq!(waste_session_tokens(null_mut(), null_mut(), 0, &mut n), WASTE_NULL_ARG);

        // The chat template as text: bible-moe's ChatML template rendered
        // by hand; its tokens are that text as markup.
        let msgs = [
            waste_chat_message { role: s("system"), content: s("Be brief."), extra: NONE },
            waste_chat_message { role: s("user"), content: s("And God said"), extra: NONE },
        ];
        let mut text = vec![0u8; 512];
        let mut n = 0;
        let r = waste_session_render_chat_template(
            o.session,
            msgs.as_ptr(),
            2,
            NONE,
            true,
            text.as_mut_ptr() as *mut c_char,
            text.len(),
            &mut n,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        text.truncate(n);
        let rendered = String::from_utf8(text).unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAnd God said<|im_end|>\n<|im_start|>assistant\n"
        );
        let mut ids = vec![0u32; 256];
        let mut ni = 0;
        let r = waste_session_apply_chat_template(
            o.session,
            msgs.as_ptr(),
            2,
            NONE,
            true,
            ids.as_mut_ptr(),
            ids.len(),
            &mut ni,
        );
        assert_eq!(r, WASTE_OK);
        ids.truncate(ni);
        let mut markup = vec![0u32; 256];
        let mut nm = 0;
        let r = waste_session_tokenize_markup(
            o.session,
            rendered.as_ptr() as *const _,
            rendered.len(),
            markup.as_mut_ptr(),
            256,
            &mut nm,
        );
        assert_eq!(r, WASTE_OK);
        markup.truncate(nm);
        assert_eq!(ids, markup);
        let r = waste_session_render_chat_template(o.session, msgs.as_ptr(), 2, NONE, true, null_mut(), 4, &mut n);
        expect(o.ctx, r, WASTE_BUFFER_TOO_SMALL, "buffer");
        assert_eq!(n, rendered.len());
        let roleless = [waste_chat_message { role: NONE, content: s("x"), extra: NONE }];
        let r = waste_session_render_chat_template(o.session, roleless.as_ptr(), 1, NONE, true, null_mut(), 0, &mut n);
        expect(o.ctx, r, WASTE_NULL_ARG, "role");
        let r = waste_session_render_chat_template(o.session, null(), 1, NONE, true, null_mut(), 0, &mut n);
        expect(o.ctx, r, WASTE_NULL_ARG, "messages");
        let r = waste_session_render_chat_template(o.session, msgs.as_ptr(), 2, NONE, true, null_mut(), 0, null_mut());
        expect(o.ctx, r, WASTE_NULL_ARG, "out_len");
        assert_eq!(
            waste_session_render_chat_template(null_mut(), null(), 0, NONE, true, null_mut(), 0, null_mut()),
            WASTE_NULL_ARG
        );

        // Template variables: NULL is none; a variable the template does not
        // read leaves the rendering as it was; a bad one is WASTE_ARG.
        for vars in [NONE, s("{\"enable_thinking\": false}")] {
            let mut text = vec![0u8; 512];
            let r = waste_session_render_chat_template_vars(
                o.session,
                msgs.as_ptr(),
                2,
                NONE,
                true,
                vars,
                text.as_mut_ptr() as *mut c_char,
                text.len(),
                &mut n,
            );
            assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
            assert_eq!(&text[..n], rendered.as_bytes());
            let mut got = vec![0u32; 256];
            let r = waste_session_apply_chat_template_vars(
                o.session,
                msgs.as_ptr(),
                2,
                NONE,
                true,
                vars,
                got.as_mut_ptr(),
                got.len(),
                &mut ni,
            );
            assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
            assert_eq!(&got[..ni], &ids[..]);
        }
        for (vars, mentions) in
            [("[true]", "expected a JSON object"), ("{\"messages\": []}", "set by the renderer itself")]
        {
            let r = waste_session_render_chat_template_vars(
                o.session,
                msgs.as_ptr(),
                2,
                NONE,
                true,
                s(vars),
                null_mut(),
                0,
                &mut n,
            );
            expect(o.ctx, r, WASTE_ARG, mentions);
            let r = waste_session_apply_chat_template_vars(
                o.session,
                msgs.as_ptr(),
                2,
                NONE,
                true,
                s(vars),
                null_mut(),
                0,
                &mut n,
            );
            expect(o.ctx, r, WASTE_ARG, mentions);
        }

        // Model details as `waste info` prints them, against the Rust API.
        let rust = waste_host::Model::open(&bible(), &Default::default()).unwrap();
        let ri = rust.info();
        let mut info = std::mem::zeroed::<waste_model_info>();
        assert_eq!(waste_model_get_info(o.model, &mut info), WASTE_OK);
        assert_eq!(CStr::from_ptr(info.router).to_str().unwrap(), ri.router);
        assert_eq!(info.shared_expert_width, ri.shared_expert_width);
        assert_eq!(info.n_eos_tokens, ri.eos_tokens.len());
        let mut eos = vec![0u32; 8];
        let mut ne = 0;
        assert_eq!(waste_model_eos_tokens(o.model, eos.as_mut_ptr(), 8, &mut ne), WASTE_OK);
        eos.truncate(ne);
        assert_eq!(eos, ri.eos_tokens);
        let mut moe = 0;
        for (i, l) in ri.layers.iter().enumerate() {
            let mut li = std::mem::zeroed::<waste_layer_info>();
            assert_eq!(waste_model_get_layer(o.model, i, &mut li), WASTE_OK);
            assert_eq!(CStr::from_ptr(li.attention).to_str().unwrap(), l.attention);
            assert_eq!(
                (li.moe, li.state_bytes_fixed, li.state_bytes_per_token),
                (l.moe, l.state_bytes_fixed, l.state_bytes_per_token)
            );
            moe += li.moe as usize;
        }
        assert_eq!(moe, info.moe_layers);
        assert_eq!(info.state_bytes_per_token, ri.layers.iter().map(|l| l.state_bytes_per_token).sum::<u64>());
        let mut li = std::mem::zeroed::<waste_layer_info>();
        expect(o.ctx, waste_model_get_layer(o.model, ri.layers.len(), &mut li), WASTE_ARG, "layers");
        expect(o.ctx, waste_model_get_layer(o.model, 0, null_mut()), WASTE_NULL_ARG, "out");
        assert_eq!(waste_model_get_layer(null(), 0, &mut li), WASTE_NULL_ARG);
        expect(o.ctx, waste_model_eos_tokens(o.model, null_mut(), 0, null_mut()), WASTE_NULL_ARG, "out_len");
        assert_eq!(waste_model_eos_tokens(null(), null_mut(), 0, &mut ne), WASTE_NULL_ARG);

        // Memory as the bench reports it: what is held equals the plan.
        let mut used = waste_memory_use::default();
        assert_eq!(waste_model_memory_used(o.model, &mut used), WASTE_OK);
        let mut plan = waste_memory_plan::default();
        assert_eq!(waste_model_memory_plan(o.model, &mut plan), WASTE_OK);
        assert_eq!(used.total, plan.total);
        assert_eq!(used.trunk + used.state + used.scratch + used.cache, used.total);
        expect(o.ctx, waste_model_memory_used(o.model, null_mut()), WASTE_NULL_ARG, "out");
        assert_eq!(waste_model_memory_used(null(), &mut used), WASTE_NULL_ARG);
        let mut rss = 0u64;
        assert_eq!(waste_peak_rss(&mut rss), WASTE_OK);
        assert!(rss > used.trunk, "peak RSS {rss} under the trunk's {}", used.trunk);
        assert_eq!(waste_peak_rss(null_mut()), WASTE_NULL_ARG);

        // Routing replay: one use per routed expert, counted as hit or miss.
        let (layers, k) = (info.moe_layers, info.top_k);
        let routing: Vec<u32> = (0..layers * k).map(|i| (i % info.num_experts) as u32).collect();
        let mut st = waste_step_stats::default();
        let r = waste_model_replay_routing(o.model, routing.as_ptr(), layers, k, &mut st);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!((st.experts_hit + st.experts_missed) as usize, layers * k);
        let r = waste_model_replay_routing(o.model, routing.as_ptr(), layers - 1, k, &mut st);
        expect(o.ctx, r, WASTE_ARG, "MoE layers");
        let bad = vec![info.num_experts as u32; layers * k];
        let r = waste_model_replay_routing(o.model, bad.as_ptr(), layers, k, &mut st);
        expect(o.ctx, r, WASTE_ARG, "expert id");
        let r = waste_model_replay_routing(o.model, null(), layers, k, &mut st);
        expect(o.ctx, r, WASTE_NULL_ARG, "experts");
        assert_eq!(waste_model_replay_routing(null(), null(), 0, 0, null_mut()), WASTE_NULL_ARG);

        // A recorded trace, cycled; a malformed, missing or foreign one.
        let dir = std::env::temp_dir().join(format!("waste-ffi-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |e: usize| {
            format!("[{}]", (0..k).map(|j| ((e + j) % info.num_experts).to_string()).collect::<Vec<_>>().join(","))
        };
        let line =
            |e: usize| format!("{{\"layers\": [{}]}}\n", (0..layers).map(|_| row(e)).collect::<Vec<_>>().join(","));
        let trace = dir.join("trace.jsonl");
        std::fs::write(&trace, format!("{}{}", line(0), line(1))).unwrap();
        let tp = trace.to_str().unwrap();
        let r = waste_model_replay_trace(o.model, tp.as_ptr() as *const _, tp.len(), 3, &mut st);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!((st.experts_hit + st.experts_missed) as usize, 3 * layers * k);
        let r = waste_model_replay_trace(o.model, tp.as_ptr() as *const _, tp.len(), 0, &mut st);
        expect(o.ctx, r, WASTE_ARG, "steps 0");
        let foreign = dir.join("foreign.jsonl");
        let alien = format!("[{}]", vec![(info.num_experts + 5).to_string(); k].join(","));
        std::fs::write(&foreign, format!("{{\"layers\": [{}]}}\n", vec![alien; layers].join(","))).unwrap();
        let fp = foreign.to_str().unwrap();
        let r = waste_model_replay_trace(o.model, fp.as_ptr() as *const _, fp.len(), 1, &mut st);
        expect(o.ctx, r, WASTE_ARG, "experts per layer");
        let garbled = dir.join("garbled.jsonl");
        std::fs::write(&garbled, "{\"steps\": 1}\n").unwrap();
        let gp = garbled.to_str().unwrap();
        let r = waste_model_replay_trace(o.model, gp.as_ptr() as *const _, gp.len(), 1, &mut st);
        expect(o.ctx, r, WASTE_FORMAT, "layers");
        let missing = "/nonexistent/trace.jsonl";
        let r = waste_model_replay_trace(o.model, missing.as_ptr() as *const _, missing.len(), 1, &mut st);
        expect(o.ctx, r, WASTE_IO, missing);
        let r = waste_model_replay_trace(o.model, null(), 0, 1, &mut st);
        expect(o.ctx, r, WASTE_NULL_ARG, "path");
        assert_eq!(waste_model_replay_trace(null(), null(), 0, 0, null_mut()), WASTE_NULL_ARG);
        let _ = std::fs::remove_dir_all(&dir);

        // Raw record reads, as `waste bench --raw-reads` measures them.
        let (mut bytes, mut secs) = (0u64, 0f64);
        let r = waste_model_measure_random_reads(o.model, 8, 2, 42, &mut bytes, &mut secs);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!(bytes, 8 * info.expert_record_bytes);
        assert!(secs > 0.0);
        let r = waste_model_measure_random_reads(o.model, 0, 1, 42, &mut bytes, &mut secs);
        expect(o.ctx, r, WASTE_ARG, "reads 0");
        let r = waste_model_measure_random_reads(o.model, 1, 1, 42, null_mut(), &mut secs);
        expect(o.ctx, r, WASTE_NULL_ARG, "bytes");
        let r = waste_model_measure_random_reads(o.model, 1, 1, 42, &mut bytes, null_mut());
        expect(o.ctx, r, WASTE_NULL_ARG, "seconds");
        assert_eq!(waste_model_measure_random_reads(null(), 1, 1, 0, &mut bytes, &mut secs), WASTE_NULL_ARG);

        // Start-up costs, as `waste version --json` reports them.
        let (mut c, mut i) = (0f64, 0f64);
        assert_eq!(waste_ctx_timings(o.ctx, &mut c, &mut i), WASTE_OK);
        assert!(c > 0.0 && i > 0.0, "compile {c} ms, instantiate {i} ms");
        expect(o.ctx, waste_ctx_timings(o.ctx, null_mut(), &mut i), WASTE_NULL_ARG, "compile_ms");
        expect(o.ctx, waste_ctx_timings(o.ctx, &mut c, null_mut()), WASTE_NULL_ARG, "instantiate_ms");
        assert_eq!(waste_ctx_timings(null(), &mut c, &mut i), WASTE_NULL_ARG);
    }
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

#[test]
fn open_with_progress_reports_the_whole_trunk() {
    let path = bible();
    let p = path.to_str().unwrap();
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(waste_ctx_open(&mut ctx), WASTE_OK);
        let mut seen: Vec<waste_open_progress> = Vec::new();
        let mut model = null_mut();
        let r = waste_model_open_with_progress(
            ctx,
            p.as_ptr() as *const _,
            p.len(),
            null(),
            Some(open_event),
            &mut seen as *mut _ as *mut c_void,
            &mut model,
        );
        assert_eq!(r, WASTE_OK, "{}", last_error(ctx));
        let trunk: Vec<_> = seen.iter().filter(|e| e.stage == waste_open_stage::WASTE_OPEN_TRUNK).collect();
        assert!(trunk.len() >= 2, "{seen:?}");
        assert!(trunk.windows(2).all(|w| w[0].loaded <= w[1].loaded));
        let last = trunk.last().unwrap();
        let mut used = waste_memory_use::default();
        assert_eq!(waste_model_memory_used(model, &mut used), WASTE_OK);
        assert_eq!((last.loaded, last.total), (used.trunk, used.trunk));
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
