//! transformers' `strftime_now` for templates that print today's date,
//! with the strftime codes templates use.

use minijinja::{Error, ErrorKind};

/// transformers' `strftime_now`: the current local time (UTC here: the
/// guest has no time zone) formatted with the common strftime codes.
pub(super) fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(fmt, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats Unix time `secs` (UTC).
pub fn strftime(fmt: &str, secs: i64) -> Result<String, Error> {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let (hh, mm, ss) = (tod / 3600, tod / 60 % 60, tod % 60);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                other => return Err(bad_code(other)),
            },
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{:03}", doy_of(y, m, d))),
            Some('%') => out.push('%'),
            other => return Err(bad_code(other)),
        }
    }
    Ok(out)
}

fn doy_of(y: i64, m: i64, d: i64) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    CUM[(m - 1) as usize] + d + i64::from(leap && m > 2)
}

fn bad_code(c: Option<char>) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("strftime_now: unsupported format code %{}", c.map(String::from).unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0).unwrap(), "1970-01-01 00:00:00");
        // 2026-11-29 13:30:00 UTC, a Sunday.
        assert_eq!(strftime("%d %B %Y %A %b %a %j", 1_795_959_000).unwrap(), "29 November 2026 Sunday Nov Sun 333");
        assert_eq!(strftime("%-d %-m", 951_782_400).unwrap(), "29 2"); // 2000-02-29
        assert!(strftime("%Q", 0).is_err());
    }
}
