//! A sampler plugin through the C ABI: draws as through the Rust API, and
//! its failures reported.

use std::ptr::{null, null_mut};

use waste::waste_result::*;
use waste::*;

use super::harness::*;
use crate::plugins::plugin;

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
