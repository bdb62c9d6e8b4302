//! Reading a JSON request body field by field, shared by every API's
//! parser: a missing or null field is absent, a wrong one a 400 naming it.
//! The checks live here once; a dialect whose errors read differently
//! (Ollama's) words a [`Refused`] its own way rather than checking again.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ApiError;

pub(crate) type Obj = Map<String, Value>;

pub(crate) fn bad(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("`{param}` must be {what}"), Some(param))
}

pub(crate) fn field<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

/// A top-level field's JSON text as the client wrote it: transformers
/// renders `tools | tojson` from the client's own JSON, and serde_json
/// re-serialising it could change its numbers' spelling; the template gets
/// this text so the prompt is the same.
pub(crate) fn raw_field(body: &[u8], key: &str) -> Option<String> {
    let fields: std::collections::HashMap<String, Box<RawValue>> = serde_json::from_slice(body).ok()?;
    fields.get(key).map(|v| v.get().to_string())
}

/// A top-level list's items as the client wrote them (empty when it is not
/// a list), so each message's fields keep the client's order.
pub(crate) fn raw_items(body: &[u8], key: &str) -> Vec<Box<RawValue>> {
    raw_field(body, key).and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

/// The body as a JSON object.
pub(crate) fn object(body: &[u8]) -> Result<Obj, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object", None)),
        Err(e) => Err(ApiError::bad_request(format!("the request body is not valid JSON: {e}"), None)),
    }
}

/// An optional string field (`model`).
pub(crate) fn string(o: &Obj, key: &str) -> Result<Option<String>, ApiError> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(key, "a string")),
    }
}

/// `messages`, required and not empty: a conversation needs a turn.
pub(crate) fn messages(o: &Obj) -> Result<&Vec<Value>, ApiError> {
    match field(o, "messages") {
        Some(Value::Array(list)) if !list.is_empty() => Ok(list),
        None => Err(ApiError::bad_request("`messages` is required", Some("messages"))),
        Some(_) => Err(bad("messages", "a non-empty list of messages")),
    }
}

/// Why a value was refused, for a dialect that tells a wrong type from a
/// value out of range in its own words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Refused {
    Type,
    Range,
}

/// A value read as `T` (None: not of that type) and held to `[lo, hi]`.
fn within<T: PartialOrd>(x: Option<T>, lo: T, hi: T) -> Result<T, Refused> {
    let x = x.ok_or(Refused::Type)?;
    if lo <= x && x <= hi {
        Ok(x)
    } else {
        Err(Refused::Range)
    }
}

/// A number in `[lo, hi]`.
pub(crate) fn number_in(v: &Value, lo: f64, hi: f64) -> Result<f64, Refused> {
    within(v.as_f64(), lo, hi)
}

/// A whole number in `[lo, hi]` (none is negative).
pub(crate) fn integer_in(v: &Value, lo: u64, hi: u64) -> Result<u64, Refused> {
    within(v.as_u64(), lo, hi)
}

/// An optional number field in `[lo, hi]`.
pub(crate) fn number(o: &Obj, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    field(o, key).map(|v| number_in(v, lo, hi).map_err(|_| bad(key, &format!("a number in [{lo}, {hi}]")))).transpose()
}

/// An optional integer field in `[lo, hi]`.
pub(crate) fn integer(o: &Obj, key: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
    field(o, key)
        .map(|v| integer_in(v, lo, hi).map_err(|_| bad(key, &format!("an integer in [{lo}, {hi}]"))))
        .transpose()
}

/// An optional boolean field, false when absent.
pub(crate) fn boolean(o: &Obj, key: &str) -> Result<bool, ApiError> {
    match field(o, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(key, "a boolean")),
    }
}

/// A JSON object from its text, for the parsers' tests.
#[cfg(test)]
pub(crate) fn obj(text: &str) -> Obj {
    serde_json::from_str(text).unwrap()
}

/// Stop strings: a list of strings or, where `one` allows it, a lone
/// string; None when the value is neither (each dialect says so its way).
pub(crate) fn strings(v: &Value, one: bool) -> Option<Vec<String>> {
    match v {
        Value::String(s) if one => Some(vec![s.clone()]),
        Value::Array(items) => items.iter().map(|v| v.as_str().map(str::to_string)).collect(),
        _ => None,
    }
}
