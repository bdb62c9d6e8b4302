//! llama.cpp's GBNF grammars, rewritten into llguidance's Lark syntax so
//! one engine runs both (llguidance ships the same conversion only as a
//! Python script). GBNF as llama.cpp's `grammars/README.md` defines it:
//!
//! * `name ::= body`, the start rule named `root`; names are ASCII letters,
//!   digits and `-`; a body runs until the next `name ::=`;
//! * `"literal"` and `[class]` / `[^class]` with ranges, both with the
//!   escapes `\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`;
//! * `.` any character, `( )` groups, `|` alternatives, `* + ?` and
//!   `{m}`, `{m,}`, `{m,n}` repetitions, `#` comments.
//!
//! Rules become lowercase Lark rules (`g_` + the name, since Lark reads an
//! uppercase name as a terminal), literals JSON-escaped Lark strings and
//! classes regular expressions of `\x{..}` escapes, so no character of the
//! source can change the meaning of the output.

use std::fmt::Write;

/// The Lark grammar equivalent to `source`, or where `source` is malformed.
pub fn to_lark(source: &str) -> Result<String, String> {
    let mut parser = Parser { s: source.as_bytes(), src: source, pos: 0, used: Vec::new() };
    let rules = parser.rules()?;
    if !rules.iter().any(|(name, _)| name == "root") {
        return Err("GBNF: no `root` rule".into());
    }
    if let Some((name, line)) = parser.used.iter().find(|(u, _)| !rules.iter().any(|(n, _)| n == u)) {
        return Err(format!("GBNF line {line}: undefined rule `{name}`"));
    }
    let mut out = String::from("start: g_root\n");
    for (name, body) in &rules {
        let _ = writeln!(out, "{}: {}", rule_name(name), body);
    }
    Ok(out)
}

/// A GBNF name as a Lark rule name: lowercase letters, digits, `-` and `_`,
/// with an uppercase letter written `_` + its lowercase (names differing only
/// in case stay distinct).
fn mangle(name: &str) -> String {
    let mut m = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            m.push('_');
            m.push(c.to_ascii_lowercase());
        } else {
            m.push(c);
        }
    }
    m
}

fn rule_name(name: &str) -> String {
    format!("g_{}", mangle(name))
}

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
    /// Every rule name a body refers to, with its line.
    used: Vec<(String, usize)>,
}

impl Parser<'_> {
    fn line(&self) -> usize {
        self.src[..self.pos.min(self.src.len())].matches('\n').count() + 1
    }

    fn error(&self, what: &str) -> String {
        format!("GBNF line {}: {what}", self.line())
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    /// Skips spaces, newlines and comments.
    fn space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' | b'\n' => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-') {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].to_string())
    }

    /// Whether a `name ::=` starts at the current position.
    fn at_definition(&self) -> bool {
        let mut p = self.pos;
        while self.s.get(p).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'-') {
            p += 1;
        }
        if p == self.pos {
            return false;
        }
        while self.s.get(p).is_some_and(|c| *c == b' ' || *c == b'\t') {
            p += 1;
        }
        self.s[p.min(self.s.len())..].starts_with(b"::=")
    }

    fn rules(&mut self) -> Result<Vec<(String, String)>, String> {
        let mut rules: Vec<(String, String)> = Vec::new();
        self.space();
        while self.pos < self.s.len() {
            let name = self.name().ok_or_else(|| self.error("expected a rule name"))?;
            self.space();
            if !self.s[self.pos..].starts_with(b"::=") {
                return Err(self.error(&format!("expected `::=` after `{name}`")));
            }
            self.pos += 3;
            let body = self.alternatives(0)?;
            if rules.iter().any(|(n, _)| *n == name) {
                return Err(self.error(&format!("rule `{name}` is defined twice")));
            }
            rules.push((name, body));
        }
        if rules.is_empty() {
            return Err("GBNF: the grammar is empty".into());
        }
        Ok(rules)
    }

    /// `seq | seq | ...` up to the closing `)` (depth > 0) or the next rule.
    fn alternatives(&mut self, depth: usize) -> Result<String, String> {
        let mut alts = vec![self.sequence(depth)?];
        loop {
            self.space();
            if self.peek() == Some(b'|') {
                self.pos += 1;
                alts.push(self.sequence(depth)?);
            } else {
                break;
            }
        }
        // An empty alternative (GBNF allows `a ::= "x" |`) is Lark's `""`.
        Ok(alts.into_iter().map(|a| if a.is_empty() { "\"\"".to_string() } else { a }).collect::<Vec<_>>().join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        loop {
            self.space();
            let Some(c) = self.peek() else { break };
            if c == b'|' || (c == b')' && depth > 0) || (depth == 0 && self.at_definition()) {
                break;
            }
            let atom = match c {
                b'"' => self.literal()?,
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    r"/(?s:.)/".to_string()
                }
                b'(' => {
                    self.pos += 1;
                    let inner = self.alternatives(depth + 1)?;
                    self.space();
                    if self.peek() != Some(b')') {
                        return Err(self.error("expected `)`"));
                    }
                    self.pos += 1;
                    format!("({inner})")
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let Some(last) = items.pop() else {
                        return Err(self.error("a repetition with nothing before it"));
                    };
                    let op = self.repetition()?;
                    items.push(format!("({last}){op}"));
                    continue;
                }
                _ if c.is_ascii_alphanumeric() || c == b'-' => {
                    let line = self.line();
                    let name = self.name().ok_or_else(|| self.error("expected a rule name"))?;
                    let lark = rule_name(&name);
                    self.used.push((name, line));
                    lark
                }
                b')' => return Err(self.error("unmatched `)`")),
                _ => return Err(self.error(&format!("unexpected `{}`", c as char))),
            };
            items.push(atom);
        }
        Ok(items.join(" "))
    }

    fn repetition(&mut self) -> Result<String, String> {
        let c = self.peek().ok_or_else(|| self.error("expected a repetition"))?;
        self.pos += 1;
        if c != b'{' {
            return Ok((c as char).to_string());
        }
        let number = |p: &mut Self| -> Result<Option<u32>, String> {
            p.space();
            let start = p.pos;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.pos += 1;
            }
            if p.pos == start {
                return Ok(None);
            }
            p.src[start..p.pos].parse().map(Some).map_err(|_| p.error("repetition count too large"))
        };
        let min = number(self)?.ok_or_else(|| self.error("expected a number after `{`"))?;
        self.space();
        let out = match self.peek() {
            Some(b'}') => format!("{{{min}}}"),
            Some(b',') => {
                self.pos += 1;
                match number(self)? {
                    Some(max) if max < min => return Err(self.error("repetition `{m,n}` with n < m")),
                    Some(max) => format!("{{{min},{max}}}"),
                    None => format!("{{{min},}}"),
                }
            }
            _ => return Err(self.error("expected `}` or `,` in a repetition")),
        };
        self.space();
        if self.peek() != Some(b'}') {
            return Err(self.error("expected `}`"));
        }
        self.pos += 1;
        Ok(out)
    }

    /// One character of a literal or class, its escapes resolved.
    fn char(&mut self) -> Result<char, String> {
        let rest = &self.src[self.pos..];
        let c = rest.chars().next().ok_or_else(|| self.error("unterminated literal or class"))?;
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let e = self.src[self.pos..].chars().next().ok_or_else(|| self.error("an escape at the end"))?;
        self.pos += e.len_utf8();
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let digits = p.src.get(p.pos..p.pos + n).ok_or_else(|| p.error("a short hex escape"))?;
            let v = u32::from_str_radix(digits, 16).map_err(|_| p.error("a malformed hex escape"))?;
            p.pos += n;
            char::from_u32(v).ok_or_else(|| p.error("a hex escape that is no character"))
        };
        Ok(match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            '\\' | '"' | '[' | ']' | '-' | '^' => e,
            _ => return Err(self.error(&format!("unknown escape `\\{e}`"))),
        })
    }

    fn literal(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            if self.peek() == Some(b'"') {
                self.pos += 1;
                break;
            }
            text.push(self.char()?);
        }
        if text.is_empty() {
            return Ok("\"\"".into());
        }
        // JSON string syntax is Lark's here; DEL must be escaped too.
        let json = serde_json::to_string(&text).map_err(|e| e.to_string())?;
        Ok(json.replace('\u{7f}', "\\u007f"))
    }

    fn class(&mut self) -> Result<String, String> {
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut regex = String::from(if negated { "/[^" } else { "/[" });
        let mut empty = true;
        loop {
            if self.peek() == Some(b']') {
                self.pos += 1;
                break;
            }
            let lo = self.char()?;
            let hi = if self.peek() == Some(b'-') && self.s.get(self.pos + 1) != Some(&b']') {
                self.pos += 1;
                let hi = self.char()?;
                if hi < lo {
                    return Err(self.error(&format!("class range {lo:?}-{hi:?} runs backwards")));
                }
                hi
            } else {
                lo
            };
            let _ = write!(regex, "\\x{{{:x}}}", lo as u32);
            if hi != lo {
                let _ = write!(regex, "-\\x{{{:x}}}", hi as u32);
            }
            empty = false;
        }
        if empty {
            return Err(self.error("an empty character class"));
        }
        regex.push_str("]/");
        Ok(regex)
    }
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn rules_literals_classes_and_repetitions_convert() {
        let lark = to_lark(
            "# a comment\nroot ::= greeting (\" \" Name){1,3} [.!]?\ngreeting ::= \"hi\" | \"hello\\n\"\nName ::= [A-Z] [a-z]*\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g_root: g_greeting ((\" \" g__name)){1,3} (/[\\x{2e}\\x{21}]/)?\n\
             g_greeting: \"hi\" | \"hello\\n\"\n\
             g__name: /[\\x{41}-\\x{5a}]/ (/[\\x{61}-\\x{7a}]/)*\n"
        );
    }

    #[test]
    fn bodies_continue_across_lines_until_the_next_rule() {
        let lark = to_lark("root ::= (\n  \"a\" |\n  \"b\"\n)\n  \"c\"\nother ::= \"d\"").unwrap();
        assert!(lark.contains("g_root: (\"a\" | \"b\") \"c\"\n"), "{lark}");
        assert!(lark.contains("g_other: \"d\"\n"), "{lark}");
    }

    #[test]
    fn malformed_grammars_are_refused_with_the_line() {
        for (source, want) in [
            ("root ::= \"a", "unterminated"),
            ("root ::= [b-a]", "runs backwards"),
            ("root ::= x", "undefined rule `x`"),
            ("start ::= \"a\"", "no `root` rule"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= ( \"a\"", "expected `)`"),
            ("root ::= \"a\"{3,1}", "n < m"),
            ("root \"a\"", "expected `::=`"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("", "empty"),
        ] {
            let err = to_lark(source).unwrap_err();
            assert!(err.contains(want), "{source:?}: {err}");
        }
    }
}
