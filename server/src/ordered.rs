//! Message fields as the client wrote them. `serde_json::Value` sorts
//! object keys, but a chat template renders a message's fields and a tool
//! call's arguments in their order, as transformers (Python dicts) does;
//! these helpers keep the request's own order by working on the raw JSON.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object as (key, raw value) pairs in the order written.
pub struct Ordered(pub Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut pairs = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    pairs.push((k, v));
                }
                Ok(Ordered(pairs))
            }
        }
        d.deserialize_map(V)
    }
}

/// Writes `pairs` back as an object's JSON text.
fn object_text<'a>(pairs: impl Iterator<Item = (&'a str, String)>) -> String {
    let body: Vec<String> =
        pairs.map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap_or_default())).collect();
    format!("{{{}}}", body.join(","))
}

/// The fields of message `raw` other than `role` and `content` (and null
/// ones, which transformers drops), as an object's JSON text in the
/// client's order; None when there are none. `tool_calls[].function.
/// arguments` given as JSON text (OpenAI's wire form) become that JSON
/// object, as chat templates expect them (vLLM does the same): GLM's,
/// MiniMax's and Qwen3.5's iterate `arguments.items()`.
pub fn message_extra(raw: &RawValue) -> Option<String> {
    let Ordered(pairs) = serde_json::from_str(raw.get()).ok()?;
    let kept: Vec<(&str, String)> = pairs
        .iter()
        .filter(|(k, v)| k != "role" && k != "content" && v.get() != "null")
        .map(|(k, v)| (k.as_str(), if k == "tool_calls" { tool_calls(v) } else { v.get().to_string() }))
        .collect();
    (!kept.is_empty()).then(|| object_text(kept.into_iter()))
}

/// `tool_calls` with every `function.arguments` string that holds a JSON
/// object replaced by that object; anything else as written.
fn tool_calls(raw: &RawValue) -> String {
    let Ok(calls) = serde_json::from_str::<Vec<Box<RawValue>>>(raw.get()) else {
        return raw.get().to_string();
    };
    let calls: Vec<String> = calls
        .iter()
        .map(|call| {
            let Ok(Ordered(fields)) = serde_json::from_str(call.get()) else {
                return call.get().to_string();
            };
            object_text(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_str(), if k == "function" { function(v) } else { v.get().to_string() })),
            )
        })
        .collect();
    format!("[{}]", calls.join(","))
}

fn function(raw: &RawValue) -> String {
    let Ok(Ordered(fields)) = serde_json::from_str(raw.get()) else {
        return raw.get().to_string();
    };
    object_text(fields.iter().map(|(k, v)| {
        let text = match (k.as_str(), serde_json::from_str::<String>(v.get())) {
            ("arguments", Ok(s)) if serde_json::from_str::<Ordered>(&s).is_ok() => s.trim().to_string(),
            _ => v.get().to_string(),
        };
        (k.as_str(), text)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(json: &str) -> Option<String> {
        message_extra(&serde_json::from_str::<Box<RawValue>>(json).unwrap())
    }

    #[test]
    fn fields_keep_the_clients_order_and_nulls_are_dropped() {
        assert_eq!(
            extra(r#"{"role":"tool","zeta":1,"content":"x","tool_call_id":"c1","alpha":null}"#).as_deref(),
            Some(r#"{"zeta":1,"tool_call_id":"c1"}"#)
        );
        assert_eq!(extra(r#"{"role":"user","content":"hi"}"#), None);
    }

    #[test]
    fn string_arguments_become_objects_in_their_order() {
        let m = r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",
            "function":{"name":"f","arguments":"{\"unit\": \"celsius\", \"city\": \"Paris\"}"}}]}"#;
        assert_eq!(
            extra(m).as_deref(),
            Some(
                r#"{"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"unit": "celsius", "city": "Paris"}}}]}"#
            )
        );
        // Text that is not a JSON object stays a string.
        let m = r#"{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"not json"}}]}"#;
        assert!(extra(m).unwrap().contains(r#""arguments":"not json""#));
    }
}
