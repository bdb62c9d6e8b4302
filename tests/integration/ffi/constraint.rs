//! Structured output through the C ABI: the same tokens as through the Rust
//! API under the same constraint, and a bad kind, schema or pointer refused.

use std::ptr::null;

use waste::waste_result::*;
use waste::*;

use super::harness::*;

#[test]
fn constraint_through_c_generates_as_the_rust_api_and_refuses_bad_ones() {
    let o = Open::new(&bible());
    let prompt = o.tokenize("And God said");
    let schema = r#"{"type": "object", "properties": {"verse": {"type": "integer", "minimum": 1, "maximum": 99},
        "word": {"enum": ["light", "day", "night"]}}, "required": ["verse", "word"], "additionalProperties": false}"#;
    let mut p = params(0.9, 3, 60);
    p.stop_at_eos = true;
    p.constraint_kind = waste_constraint_kind::WASTE_CONSTRAINT_JSON_SCHEMA as u32;
    p.constraint = s(schema);
    let (r, via_c) = o.generate(&prompt, &p);
    assert_eq!(r, WASTE_OK, "{}", last_error(o.ctx));

    let model = waste_host::Model::open(&bible(), &Default::default()).unwrap();
    let engine = waste_host::Engine::new().unwrap();
    let mut rs = engine.session(model).unwrap();
    let gp = waste_host::GenerateParams {
        temperature: 0.9,
        seed: 3,
        max_tokens: 60,
        constraint: Some(waste_host::Constraint::JsonSchema(schema.into())),
        ..Default::default()
    };
    let want = rs.generate(&prompt, &gp, |_| true).unwrap();
    assert_eq!(via_c.iter().map(|e| e.token).collect::<Vec<_>>(), want.tokens);
    let v: serde_json::Value = serde_json::from_str(&want.text).unwrap_or_else(|e| panic!("{e}: {:?}", want.text));
    assert!(["light", "day", "night"].contains(&v["word"].as_str().unwrap()), "{v}");

    let mut bad = p;
    bad.constraint_kind = 99;
    let (r, _) = o.generate(&prompt, &bad);
    expect(o.ctx, r, WASTE_ARG, "constraint_kind 99");
    let mut bad = p;
    bad.constraint = s(r#"{"type": "integer", "minimum": 5, "maximum": 1}"#);
    let (r, _) = o.generate(&prompt, &bad);
    expect(o.ctx, r, WASTE_ARG, "grammar");
    let mut bad = p;
    bad.constraint = waste_str { ptr: null(), len: 4 };
    let (r, _) = o.generate(&prompt, &bad);
    expect(o.ctx, r, WASTE_NULL_ARG, "constraint");
}
