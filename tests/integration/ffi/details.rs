//! Top log-probabilities, chat rendering, the transcript and the model's
//! details through the C ABI, against the Rust API.

use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};

use waste::waste_result::*;
use waste::*;

use super::harness::*;

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

        // More tokens than the context holds: a code of its own (it was
        // WASTE_RUNTIME, like a failed read), and the state is unchanged.
        let mut context_info = std::mem::zeroed::<waste_model_info>();
        assert_eq!(waste_model_get_info(o.model, &mut context_info), WASTE_OK);
        let long = vec![prompt[0]; context_info.context + 1];
        let r =
            waste_session_eval(o.session, long.as_ptr(), long.len(), false, logits.as_mut_ptr(), logits.len(), &mut n);
        expect(o.ctx, r, WASTE_CONTEXT_FULL, "context full");
        let mut position = usize::MAX;
        assert_eq!(waste_session_position(o.session, &mut position), WASTE_OK);
        assert_eq!(position, 0);

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
            waste_chat_message {
                role: s("system"),
                content: s("Be brief."),
                extra: NONE,
                media: std::ptr::null(),
                n_media: 0,
            },
            waste_chat_message {
                role: s("user"),
                content: s("And God said"),
                extra: NONE,
                media: std::ptr::null(),
                n_media: 0,
            },
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
        let roleless =
            [waste_chat_message { role: NONE, content: s("x"), extra: NONE, media: std::ptr::null(), n_media: 0 }];
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

        // Routing replay: one use per routed expert, counted as reused, prefetched or missed.
        let (layers, k) = (info.moe_layers, info.top_k);
        let routing: Vec<u32> = (0..layers * k).map(|i| (i % info.num_experts) as u32).collect();
        let mut st = waste_step_stats::default();
        let r = waste_model_replay_routing(o.model, routing.as_ptr(), layers, k, &mut st);
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        assert_eq!((st.experts_reused + st.experts_prefetched + st.experts_missed) as usize, layers * k);
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
        assert_eq!((st.experts_reused + st.experts_prefetched + st.experts_missed) as usize, 3 * layers * k);
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

/// The store's counters through the C ABI, the disk's idle time among them
/// (which the C ABI lacked): within the wall time since the reset, and the
/// expert picks of the generation counted.
#[test]
fn store_stats_through_c_give_the_picks_and_the_disk_idle_time() {
    let o = Open::new(&bible());
    let prompt = o.tokenize("In the beginning");
    unsafe {
        assert_eq!(waste_model_reset_store_stats(o.model), WASTE_OK);
        let since = std::time::Instant::now();
        let (r, _) = o.generate(&prompt, &params(0.0, 1, 8));
        assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));
        let wall_ms = since.elapsed().as_secs_f64() * 1e3;
        let mut s = std::mem::zeroed::<waste_store_stats>();
        assert_eq!(waste_model_store_stats(o.model, &mut s), WASTE_OK);
        assert!(s.reused + s.prefetched + s.missed > 0, "{s:?}");
        assert!(s.ms_disk_idle >= 0.0 && s.ms_disk_idle <= wall_ms + 1.0, "idle {} of {wall_ms} ms", s.ms_disk_idle);
    }
}
