//! Reading a JSON request body field by field, shared by every API's
//! parser: a missing or null field is absent, a wrong one a 400 naming it.

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
    let fields: std::collections::HashMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_slice(body).ok()?;
    fields.get(key).map(|v| v.get().to_string())
}
