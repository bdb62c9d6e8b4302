//! transformers' `tojson` filter: Python's `json.dumps` output, byte for
//! byte (separators, indentation, key order, `ensure_ascii`, float repr).

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item(&Value::from(0))?;
            let b = v.get_item(&Value::from(1))?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        // Python's defaults: ", " and ": ", but "," when indenting.
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    // transformers' `tojson` returns json.dumps' plain str (not Jinja's Markup).
    Ok(Value::from(out))
}

/// Python's TypeError for what json.dumps cannot serialise.
fn not_serializable(what: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: Object of type {what} is not JSON serializable"))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ascii: bool,
}

fn json_string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round trip, always with a dot or an
/// exponent.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

fn write_json(out: &mut String, v: &Value, o: &JsonOpts, depth: usize) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    if super::is_python_none(v) {
        out.push_str("null");
        return Ok(());
    }
    match v.kind() {
        // Jinja's Undefined and the lazy results of `map`, `select`, ...
        // (Python generators) are not JSON.
        ValueKind::Undefined => return Err(not_serializable("Undefined")),
        ValueKind::Iterable => return Err(not_serializable("generator")),
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                if v.is_integer() {
                    out.push_str(&i.to_string());
                    return Ok(());
                }
            }
            out.push_str(&python_float(f64::try_from(v.clone())?));
        }
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default(), o.ascii),
        ValueKind::Seq => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, o, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => json_string(out, s, o.ascii),
                    None => json_string(out, &k.to_string(), o.ascii),
                }
                out.push_str(&o.key_sep);
                write_json(out, &v.get_item(k)?, o, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot serialize {}", v.kind()))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_floats() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.5), "0.5");
        assert_eq!(python_float(1e20), "1e+20");
        assert_eq!(python_float(1.5e-7), "1.5e-07");
    }
}
