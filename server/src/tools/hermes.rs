//! The body of a Hermes `<tool_call>`: `{"name": .., "arguments": {..}}`
//! (Qwen2.5 and Qwen3's templates ask for it).

use serde_json::Value;

use super::{compact_json, Call};

/// A call from the JSON between the tags; None when it is not one.
pub(super) fn call(body: &str) -> Option<Call> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => compact_json(s),
        Some(a) => a.to_string(),
    };
    Some(Call { name, arguments })
}
