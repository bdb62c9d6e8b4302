//! Reading an untrusted config.json: typed lookups of its keys, each error
//! naming the file and the key.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

pub(super) struct Reader<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) path: &'a Path,
}

impl Reader<'_> {
    pub(super) fn err(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        Error::format(self.path, format!("key `{key}`: {msg}"))
    }

    /// A valid value of `key` this engine does not implement.
    pub(super) fn unsupported(&self, key: &str, what: impl std::fmt::Display) -> Error {
        Error::Unsupported(format!("{}: key `{key}`: {what}", self.path.display()))
    }

    /// A JSON null counts as absent: transformers writes `"head_dim": null`.
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub(super) fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    pub(super) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    pub(super) fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(super) fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// A rope object's kind: `rope_type`, or the older `type`; `None`
    /// when it names neither.
    pub(super) fn rope_type(&self) -> Result<Option<&str>> {
        match self.str_opt("rope_type")? {
            Some(t) => Ok(Some(t)),
            None => self.str_opt("type"),
        }
    }

    pub(super) fn token_id(&self, key: &str, v: &Value) -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.err(key, format!("expected a token id, found {v}")))
    }

    /// `eos_token_id` is an int, a list of ints, or null.
    pub(super) fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.token_id(key, v)).collect(),
            Some(v) => Ok(vec![self.token_id(key, v)?]),
        }
    }

    pub(super) fn usize_list(&self, key: &str) -> Result<Vec<usize>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| self.err(key, format!("expected a list of integers, found {v}")))
                })
                .collect(),
            Some(v) => Err(self.err(key, format!("expected a list of integers, found {v}"))),
        }
    }

    /// `(moe_intermediate_size, intermediate_size)`: the dense width is
    /// required only when some layer is dense (an all-MoE model may omit it).
    pub(super) fn ffn_widths(&self, moe_layers: &[bool], max: usize) -> Result<(usize, usize)> {
        let moe = self.bounded("moe_intermediate_size", self.usize_req("moe_intermediate_size")?, max)?;
        let dense = if moe_layers.iter().all(|&m| m) {
            self.usize_opt("intermediate_size")?.unwrap_or(0).min(max)
        } else {
            self.bounded("intermediate_size", self.usize_req("intermediate_size")?, max)?
        };
        Ok((moe, dense))
    }

    /// A per-layer list of labels (`mlp_layer_types`, `layer_types`) as
    /// the values `labels` gives them; `None` when absent. Exactly `n`
    /// entries, or with `longer_ok` at least `n` of which the first `n`
    /// count (DeepSeek-V4 lists its MTP layer too).
    pub(super) fn label_list<T: Copy>(
        &self,
        key: &str,
        n: usize,
        longer_ok: bool,
        labels: &[(&str, T)],
    ) -> Result<Option<Vec<T>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let Value::Array(items) = v else { return Err(self.err(key, "expected a list")) };
        if items.len() < n || (items.len() > n && !longer_ok) {
            return Err(self.err(key, format!("{} entries for {n} layers", items.len())));
        }
        let names: Vec<String> = labels.iter().map(|(l, _)| format!("\"{l}\"")).collect();
        items[..n]
            .iter()
            .map(|item| {
                labels
                    .iter()
                    .find(|(l, _)| item.as_str() == Some(l))
                    .map(|&(_, t)| t)
                    .ok_or_else(|| self.err(key, format!("{item} is not one of {}", names.join(", "))))
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }

    /// Every family but Kimi K3 gates its MLPs with SiLU.
    pub(super) fn require_silu(&self) -> Result<()> {
        match self.str_opt("hidden_act")? {
            Some(act) if act != "silu" => Err(self.unsupported("hidden_act", format!("`{act}` (only silu)"))),
            _ => Ok(()),
        }
    }

    /// `rms_norm_eps`, `default` when absent (each family's own), inside (0, 1).
    pub(super) fn rms_norm_eps(&self, default: f64) -> Result<f32> {
        let eps = self.f64_opt("rms_norm_eps")?.unwrap_or(default);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(self.err("rms_norm_eps", format!("{eps} is outside (0, 1)")));
        }
        Ok(eps as f32)
    }

    pub(super) fn bounded(&self, key: &str, v: usize, max: usize) -> Result<usize> {
        if v == 0 || v > max {
            return Err(self.err(key, format!("{v} is outside 1..={max}")));
        }
        Ok(v)
    }
}
