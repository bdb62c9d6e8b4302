//! Byte sizes as people write and read them: `1.5G`, `800M`, `2GiB` in,
//! `1.50 GB` out (the budget options, the plan, every report).

/// `1.50 GB` style, decimal units.
pub fn fmt_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// Two sizes shown side by side, with as many digits as it takes for them
/// to differ when they do ("4.8 MB is under the floor of 4.8 MB" said nothing).
pub fn fmt_bytes_apart(a: u64, b: u64) -> (String, String) {
    let (x, y) = (fmt_bytes(a), fmt_bytes(b));
    if x != y || a == b {
        return (x, y);
    }
    (format!("{a} bytes"), format!("{b} bytes"))
}

/// Parses `1.5G`, `512M`, `800MB`, `2GiB`, `123456` (bytes). G/M/K are
/// decimal; GiB/MiB/KiB binary.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = v * mult;
    (bytes.is_finite() && (0.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "a budget of 4.8 MB is under this model's floor of 4.8 MB" said nothing.
    #[test]
    fn sizes_side_by_side_show_the_digits_that_differ() {
        let (a, b) = fmt_bytes_apart(4_800_000, 4_830_000);
        assert_ne!(a, b);
        assert_eq!((a.as_str(), b.as_str()), ("4800000 bytes", "4830000 bytes"));
        assert_eq!(fmt_bytes_apart(2_000_000_000, 1_000_000), ("2.00 GB".into(), "1.0 MB".into()));
        assert_eq!(fmt_bytes_apart(5, 5), ("5 B".into(), "5 B".into()));
    }
}
