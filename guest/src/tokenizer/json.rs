//! Small helpers to read a `serde_json::Value` tree while keeping the JSON
//! path of every value, so a malformed tokenizer.json yields an error that
//! points at the offending field instead of a generic serde message.

use serde_json::{Map, Value};

use super::TokenizerError;

/// A JSON value together with the path that led to it.
#[derive(Clone)]
pub(crate) struct Node<'a> {
    pub value: &'a Value,
    path: String,
}

pub(crate) fn err(path: &str, msg: impl std::fmt::Display) -> TokenizerError {
    TokenizerError(format!("tokenizer.json: {path}: {msg}"))
}

impl<'a> Node<'a> {
    pub fn root(value: &'a Value) -> Node<'a> {
        Node { value, path: "$".to_string() }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn error(&self, msg: impl std::fmt::Display) -> TokenizerError {
        err(&self.path, msg)
    }

    pub fn is_null(&self) -> bool {
        self.value.is_null()
    }

    fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }

    pub fn object(&self) -> Result<&'a Map<String, Value>, TokenizerError> {
        self.value.as_object().ok_or_else(|| self.error(format!("expected an object, found {}", self.kind())))
    }

    pub fn array(&self) -> Result<&'a Vec<Value>, TokenizerError> {
        self.value.as_array().ok_or_else(|| self.error(format!("expected an array, found {}", self.kind())))
    }

    pub fn str(&self) -> Result<&'a str, TokenizerError> {
        self.value.as_str().ok_or_else(|| self.error(format!("expected a string, found {}", self.kind())))
    }

    pub fn bool(&self) -> Result<bool, TokenizerError> {
        self.value.as_bool().ok_or_else(|| self.error(format!("expected a boolean, found {}", self.kind())))
    }

    pub fn u64(&self) -> Result<u64, TokenizerError> {
        self.value.as_u64().ok_or_else(|| self.error(format!("expected a non-negative integer, found {}", self.kind())))
    }

    pub fn get(&self, key: &str) -> Option<Node<'a>> {
        let v = self.value.as_object()?.get(key)?;
        Some(Node { value: v, path: format!("{}.{key}", self.path) })
    }

    /// A field that must be present (null allowed, callers check the type).
    pub fn req(&self, key: &str) -> Result<Node<'a>, TokenizerError> {
        self.object()?;
        self.get(key).ok_or_else(|| self.error(format!("missing field \"{key}\"")))
    }

    /// A field that may be absent or null.
    pub fn opt(&self, key: &str) -> Option<Node<'a>> {
        self.get(key).filter(|n| !n.is_null())
    }

    pub fn opt_bool(&self, key: &str, default: bool) -> Result<bool, TokenizerError> {
        match self.opt(key) {
            Some(n) => n.bool(),
            None => Ok(default),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        self.opt(key).map(|n| n.str()).transpose()
    }

    pub fn items(&self) -> Result<Vec<Node<'a>>, TokenizerError> {
        Ok(self
            .array()?
            .iter()
            .enumerate()
            .map(|(i, v)| Node { value: v, path: format!("{}[{i}]", self.path) })
            .collect())
    }

    /// The `type` tag of a component object.
    pub fn type_tag(&self) -> Result<&'a str, TokenizerError> {
        self.req("type")?.str()
    }
}
