//! The rotary-embedding keys of a config: `rope_theta`, the rotating share
//! of a head and YaRN, at the top level (transformers 4 and the releases)
//! or folded into `rope_parameters` / `rope_scaling` (transformers 5).

use serde_json::{Map, Value};

use super::{Family, Reader, Yarn};
use crate::error::{Error, Result};

/// The rope objects among `keys`, in that order (a later one's values win),
/// each with a reader over it and its `rope_type` (or the older `type`).
fn rope_objects<'a>(
    r: &Reader<'a>,
    keys: [&'static str; 2],
) -> Result<Vec<(&'static str, Reader<'a>, Option<String>)>> {
    let mut out = Vec::new();
    for key in keys {
        let Some(v) = r.obj.get(key).filter(|v| !v.is_null()) else { continue };
        let Some(obj) = v.as_object() else {
            return Err(r.err(key, format!("expected an object, found {v}")));
        };
        let sub = Reader { obj, path: r.path };
        let kind = sub.rope_type()?.map(str::to_string);
        out.push((key, sub, kind));
    }
    Ok(out)
}

/// The rotary settings of a GQA layer: theta, the dims of each head that
/// rotate, and YaRN when the config asks for it.
pub(super) struct RopeSettings {
    pub theta: f64,
    pub rotary_dim: usize,
    pub yarn: Option<Yarn>,
}

/// Reads `rope_theta`, `partial_rotary_factor` / `rotary_dim` and YaRN from
/// the top level and from `rope_parameters` / `rope_scaling` (the later
/// ones win, as transformers folds them).
pub(super) fn rope_settings(
    r: &Reader<'_>,
    head_dim: usize,
    default_theta: f64,
    default_partial: f64,
) -> Result<RopeSettings> {
    let mut theta = r.f64_opt("rope_theta")?;
    let mut partial = r.f64_opt("partial_rotary_factor")?;
    let mut yarn = None;
    let mut factor_obj: Option<&Map<String, Value>> = None;
    for (key, sub, kind) in rope_objects(r, ["rope_scaling", "rope_parameters"])? {
        match kind.as_deref() {
            None | Some("default") => {}
            Some("yarn") => factor_obj = Some(sub.obj),
            Some(other) => return Err(r.unsupported(key, format!("rope_type `{other}` (default or yarn)"))),
        }
        if let Some(t) = sub.f64_opt("rope_theta")? {
            theta = Some(t);
        }
        if let Some(p) = sub.f64_opt("partial_rotary_factor")? {
            partial = Some(p);
        }
    }
    let theta = theta.unwrap_or(default_theta);
    if theta <= 1.0 {
        return Err(r.err("rope_theta", format!("{theta} must be > 1")));
    }
    // MiniMax's release key: `rotary_dim` of the head (configuration_minimax_m2.py:98-103).
    let rotary_dim = match r.usize_opt("rotary_dim")? {
        Some(d) => d,
        None => {
            let p = partial.unwrap_or(default_partial);
            if !(p > 0.0 && p <= 1.0) {
                return Err(r.err("partial_rotary_factor", format!("{p} is outside (0, 1]")));
            }
            // `int(head_dim * partial_rotary_factor)`.
            (head_dim as f64 * p) as usize
        }
    };
    if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
        return Err(r.err("rotary_dim", format!("{rotary_dim}: expected an even number in 2..={head_dim}")));
    }
    if let Some(obj) = factor_obj {
        let sub = Reader { obj, path: r.path };
        let factor = sub.f64_opt("factor")?.ok_or_else(|| r.err("rope_scaling.factor", "missing for yarn"))?;
        if factor.is_nan() || factor < 1.0 {
            return Err(r.err("rope_scaling.factor", format!("{factor} is below 1")));
        }
        if sub.get("mscale").is_some() || sub.get("mscale_all_dim").is_some() {
            return Err(r.unsupported("rope_scaling", "mscale / mscale_all_dim with a GQA YaRN"));
        }
        // modeling_rope_utils.py: `attention_factor` when given, else
        // `0.1 * ln(factor) + 1`.
        let attention_factor = match sub.f64_opt("attention_factor")? {
            Some(a) => a,
            None if factor > 1.0 => 0.1 * factor.ln() + 1.0,
            None => 1.0,
        };
        let original = match sub.usize_opt("original_max_position_embeddings")? {
            Some(o) => o,
            None => r.usize_req("max_position_embeddings")?,
        };
        yarn = Some(Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: sub.f64_opt("beta_fast")?.unwrap_or(32.0),
            beta_slow: sub.f64_opt("beta_slow")?.unwrap_or(1.0),
            attention_factor,
            truncate: sub.bool_opt("truncate")?.unwrap_or(true),
        });
    }
    Ok(RopeSettings { theta, rotary_dim, yarn })
}

pub(super) fn read_rope_theta(r: &Reader<'_>, family: Family) -> Result<f64> {
    // transformers 5.x writes `rope_parameters: {rope_type, rope_theta}`;
    // 4.x and released checkpoints write `rope_theta` (and `rope_scaling`).
    let default = match family {
        Family::Mixtral => 1e6,
        _ => 1e4,
    };
    let mut theta = r.f64_opt("rope_theta")?;
    for (key, sub, kind) in rope_objects(r, ["rope_parameters", "rope_scaling"])? {
        if let Some(kind) = kind {
            if kind != "default" {
                return Err(Error::Unsupported(format!(
                    "{}: key `{key}`: rope_type `{kind}` (only default RoPE)",
                    r.path.display()
                )));
            }
        }
        if let Some(f) = sub.f64_opt("partial_rotary_factor")? {
            if f != 1.0 {
                return Err(Error::Unsupported(format!(
                    "{}: key `{key}`: partial_rotary_factor {f}",
                    r.path.display()
                )));
            }
        }
        if let Some(t) = sub.f64_opt("rope_theta")? {
            theta = Some(t);
        }
    }
    let theta = theta.unwrap_or(default);
    if theta <= 1.0 {
        return Err(r.err("rope_theta", format!("{theta} must be > 1")));
    }
    Ok(theta)
}
