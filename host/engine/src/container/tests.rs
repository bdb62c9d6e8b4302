use super::ChatTemplates;

fn config(json: &str) -> ChatTemplates {
    ChatTemplates::from_tokenizer_config(&serde_json::from_str(json).unwrap())
}

/// transformers' `get_chat_template`: one template serves everything; of
/// named ones `tool_use` serves a conversation with tools when there is
/// one, `default` the rest.
#[test]
fn chat_template_choice_follows_transformers() {
    let one = config(r#"{"chat_template": "T"}"#);
    assert_eq!(one.choose(false), Ok(Some("T")));
    assert_eq!(one.choose(true), Ok(Some("T")));
    let named =
        config(r#"{"chat_template": [{"name": "tool_use", "template": "U"}, {"name": "default", "template": "D"}]}"#);
    assert_eq!(named.choose(false), Ok(Some("D")));
    assert_eq!(named.choose(true), Ok(Some("U")));
    let default_only = config(r#"{"chat_template": [{"name": "default", "template": "D"}]}"#);
    assert_eq!(default_only.choose(true), Ok(Some("D")));
    assert_eq!(config(r#"{"eos_token": "</s>"}"#).choose(false), Ok(None));
    assert_eq!(config(r#"{"chat_template": null}"#).choose(true), Ok(None));
    assert!(config(r#"{"chat_template": 3}"#).choose(false).unwrap_err().contains("expected a string or a list"));
}

/// Regression (the host fell back to the first named template while the
/// guest refused, so `has_chat_template` said yes to a model that could
/// not render): named templates without a `default` are an error for a
/// plain conversation, however many there are.
#[test]
fn named_templates_without_default_have_no_template_for_a_plain_chat() {
    let t = config(r#"{"chat_template": [{"name": "rag", "template": "R"}, {"name": "tool_use", "template": "U"}]}"#);
    let err = t.choose(false).unwrap_err();
    assert!(err.contains("without a \"default\" template"), "{err}");
    assert_eq!(t.choose(true), Ok(Some("U")));
}

/// A record header keeps its payload checksum through bytes; one written
/// before checksums reads as having none; a flag this version does not
/// know is refused rather than ignored.
#[test]
fn record_headers_carry_the_payload_checksum_and_refuse_unknown_flags() {
    use super::manifest::record::Header;
    let h = Header {
        layer: 3,
        expert: 17,
        format: 2,
        hidden: 256,
        inter: 128,
        payload_offset: 64,
        payload_bytes: 40_000,
        payload_crc32: Some(0xdead_beef),
    };
    let bytes = h.to_bytes();
    assert_eq!(Header::parse(&bytes), Some(h));
    let old = Header { payload_crc32: None, ..h };
    assert_eq!(Header::parse(&old.to_bytes()), Some(old));
    assert!(old.same_place(&h) && !old.same_place(&Header { expert: 18, ..h }));
    let mut unknown = bytes;
    unknown[28] |= 2;
    assert_eq!(Header::parse(&unknown), None);
}
