//! A tiny RFC 8941 Structured Field *List* parser covering items with parameters
//! (strings, tokens, integers, booleans). Inner lists and decimals are rejected.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bare {
    Str(String),
    Token(String),
    Int(i64),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub value: Bare,
    pub params: Vec<(String, Bare)>,
}

impl Item {
    pub fn param_int(&self, key: &str) -> Option<i64> {
        self.params.iter().find_map(|(k, v)| match v {
            Bare::Int(i) if k == key => Some(*i),
            _ => None,
        })
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip(&mut self, pred: fn(u8) -> bool) {
        while self.peek().is_some_and(pred) {
            self.i += 1;
        }
    }

    fn bare(&mut self) -> Result<Bare, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    match self.peek() {
                        None => return Err("unterminated string".into()),
                        Some(b'"') => {
                            self.i += 1;
                            return Ok(Bare::Str(out));
                        }
                        Some(b'\\') => {
                            self.i += 1;
                            match self.peek() {
                                Some(c @ (b'"' | b'\\')) => out.push(c as char),
                                _ => return Err("bad escape".into()),
                            }
                            self.i += 1;
                        }
                        Some(c @ 0x20..=0x7e) => {
                            out.push(c as char);
                            self.i += 1;
                        }
                        Some(c) => return Err(format!("byte {c:#x} in string")),
                    }
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                if c == b'-' {
                    self.i += 1;
                }
                let digits = self.i;
                self.skip(|c| c.is_ascii_digit());
                let n = self.i - digits;
                if n == 0 || n > 15 {
                    return Err("integer needs 1..=15 digits".into());
                }
                if self.peek() == Some(b'.') {
                    return Err("decimals not supported".into());
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                text.parse().map(Bare::Int).map_err(|e| format!("{e}"))
            }
            Some(b'?') => {
                self.i += 1;
                let v = match self.peek() {
                    Some(b'0') => false,
                    Some(b'1') => true,
                    _ => return Err("bad boolean".into()),
                };
                self.i += 1;
                Ok(Bare::Bool(v))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                let start = self.i;
                self.skip(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c));
                Ok(Bare::Token(
                    String::from_utf8_lossy(&self.s[start..self.i]).into_owned(),
                ))
            }
            other => Err(format!("unexpected {:?} at {}", other.map(char::from), self.i)),
        }
    }

    fn key(&mut self) -> Result<String, String> {
        let start = self.i;
        match self.peek() {
            Some(c) if c.is_ascii_lowercase() || c == b'*' => self.i += 1,
            _ => return Err(format!("bad parameter key at {}", self.i)),
        }
        self.skip(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c));
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn item(&mut self) -> Result<Item, String> {
        let value = self.bare()?;
        let mut params = Vec::new();
        while self.peek() == Some(b';') {
            self.i += 1;
            self.skip(|c| c == b' ');
            let key = self.key()?;
            let v = if self.peek() == Some(b'=') {
                self.i += 1;
                self.bare()?
            } else {
                Bare::Bool(true)
            };
            // Later duplicates overwrite earlier ones (RFC 8941 §4.2.3.2).
            params.retain(|(k, _)| *k != key);
            params.push((key, v));
        }
        Ok(Item { value, params })
    }
}

/// Parses an sf-list of items.
pub fn parse_list(input: &str) -> Result<Vec<Item>, String> {
    let mut p = Parser {
        s: input.as_bytes(),
        i: 0,
    };
    p.skip(|c| c == b' ');
    let mut items = Vec::new();
    while p.peek().is_some() {
        if p.peek() == Some(b'(') {
            return Err("inner lists not supported".into());
        }
        items.push(p.item()?);
        p.skip(|c| c == b' ' || c == b'\t');
        match p.peek() {
            None => break,
            Some(b',') => {
                p.i += 1;
                p.skip(|c| c == b' ' || c == b'\t');
                if p.peek().is_none() {
                    return Err("trailing comma".into());
                }
            }
            Some(c) => return Err(format!("expected ',' got {:?}", c as char)),
        }
    }
    Ok(items)
}

/// Checks the two headers as Structured Fields and returns `(name, q, w, r, t)` per member.
pub fn parse_headers(policy: &str, ratelimit: &str) -> Vec<(String, i64, i64, i64, i64)> {
    let p = parse_list(policy).unwrap_or_else(|e| panic!("RateLimit-Policy {policy:?}: {e}"));
    let r = parse_list(ratelimit).unwrap_or_else(|e| panic!("RateLimit {ratelimit:?}: {e}"));
    assert_eq!(p.len(), 3, "{policy}");
    assert_eq!(r.len(), 3, "{ratelimit}");
    p.iter()
        .zip(&r)
        .map(|(p, r)| {
            let Bare::Str(name) = &p.value else {
                panic!("policy member is not a string: {p:?}")
            };
            assert_eq!(p.value, r.value, "members out of order");
            let get = |it: &Item, k| it.param_int(k).unwrap_or_else(|| panic!("no {k} in {it:?}"));
            (name.clone(), get(p, "q"), get(p, "w"), get(r, "r"), get(r, "t"))
        })
        .collect()
}

#[test]
fn parser_accepts_valid_and_rejects_invalid_lists() {
    let items = parse_list(r#""a";q=1;w=2, tok;x, "b\"c";n=-3"#).unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].param_int("w"), Some(2));
    assert_eq!(items[1].params, vec![("x".into(), Bare::Bool(true))]);
    assert_eq!(items[2].value, Bare::Str("b\"c".into()));
    for bad in [
        r#""a";q=1,"#,
        r#""a";Q=1"#,
        r#""a" "b""#,
        r#""a;q=1"#,
        r#""a";q=1234567890123456"#,
        r#""a";q=1.5"#,
        r#"minute;r=1,, hour;r=2"#,
    ] {
        assert!(parse_list(bad).is_err(), "accepted {bad:?}");
    }
}
