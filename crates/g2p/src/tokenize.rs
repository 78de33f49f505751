//! Word tokenizer with spaCy's English rules (as the reference ports them).
//!
//! Each whitespace-separated chunk is cut in four passes: a chunk that is a
//! special case (contractions, "Mr.", "10am") is taken from the exception
//! table whole; otherwise prefixes and suffixes (punctuation, quotes,
//! currency signs, units after digits) are peeled off the ends until nothing
//! changes; infixes (hyphens between letters, `...`, `:` and `/` between
//! words) then split what is left; finally neighbouring pieces that together
//! spell a special case are joined back ("Sept" "." -> "Sept.").

use std::collections::HashMap;
use std::path::Path;

use fancy_regex::Regex;

use crate::G2pError;
use crate::assets::load_json;
use crate::normalize::compile;
use crate::pystr::{ALNUM, LETTER, escape, is_space_char};

const LOWER: &str = "a-zß-öø-ÿ";
const UPPER: &str = "A-ZÀ-ÖØ-Þ";
const QUOTES: &str = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉";
const PUNCT: &str = "…,:;!?¿¡()[]{}<>_#*&。？！，、；：～·";
const ICONS: &str = "™®©°§¶†‡•";
const CURRENCY: &str = r"\$|£|€|¥|฿|US\$|C\$|A\$|₽|₹|₩|₪|₺|₴|₦|₫|₱|₲|₵|₸|₼|₾|₿";
const UNITS: &str = "km|km²|km³|m|m²|m³|dm|dm²|dm³|cm|cm²|cm³|mm|mm²|mm³|ha|µm|nm|yd|in|ft|kg|g|mg|µg|t|lb|oz|m/s|km/h\
                     |kmh|mph|hPa|Pa|mbar|mb|MB|kb|KB|gb|GB|tb|TB|T|G|M|K|%";

/// Every character of `chars` as its own escaped alternative.
fn each_char(chars: &str) -> Vec<String> {
    chars.chars().map(|c| escape(c.encode_utf8(&mut [0; 4]))).collect()
}

/// The prefix, suffix and infix patterns, in spaCy's order (the first
/// alternative that matches wins, so the order matters).
///
/// spaCy's prefixes also have `\+(?![0-9])` after "–"; no other prefix can
/// match a "+", so it is checked by hand ([`Tokenizer::prefix_len`]) and the
/// rest is a plain pattern (the regex crate's automata, not backtracking:
/// these patterns run on every chunk and dominate the tokenizer's time).
fn prefixes() -> Vec<String> {
    let mut out: Vec<String> = ["§", "%", "=", "—", "–", "…", "……"].map(String::from).to_vec();
    out.extend(each_char(PUNCT));
    out.extend([r"\.\.+".to_owned(), "…".to_owned()]);
    out.extend(each_char(QUOTES));
    out.push(CURRENCY.to_owned());
    out.push(format!("[{}]", escape(ICONS)));
    out
}

/// The suffixes without context conditions.
fn suffixes() -> Vec<String> {
    let mut out: Vec<String> = vec!["…".to_owned(), "……".to_owned()];
    out.extend(each_char(PUNCT));
    out.extend([r"\.\.+".to_owned(), "…".to_owned()]);
    out.extend(each_char(QUOTES));
    out.push(format!("[{}]", escape(ICONS)));
    out.extend(["'s", "'S", "’s", "’S", "—", "–"].map(String::from));
    out
}

/// The suffixes that depend on the characters before them (units and
/// currency after digits, a period after lowercase or two capitals). Their
/// matches are at most [`CONTEXT_SUFFIX_CHARS`] characters long.
fn context_suffixes() -> Vec<String> {
    vec![
        r"(?<=[0-9])\+".to_owned(),
        r"(?<=°[FfCcKk])\.".to_owned(),
        format!("(?<=[0-9])(?:{CURRENCY})"),
        format!("(?<=[0-9])(?:{UNITS})"),
        format!(r"(?<=[0-9{LOWER}%²\-\+{}{}])\.", escape(PUNCT), escape(QUOTES)),
        format!(r"(?<=[{UPPER}][{UPPER}])\."),
    ]
}

/// The longest match of a context suffix, in characters ("mbar", "km/h"), with room to spare.
const CONTEXT_SUFFIX_CHARS: usize = 6;

/// Characters one of which every infix contains.
const INFIX_CHARS: &str = ".…™®©°§¶†‡•+-*^,–—~:<>=/";

fn infixes() -> Vec<String> {
    vec![
        r"\.\.+".to_owned(),
        "…".to_owned(),
        format!("[{}]", escape(ICONS)),
        r"(?<=[0-9])[+\-\*^](?=[0-9-])".to_owned(),
        format!(r"(?<=[{LOWER}{q}])\.(?=[{UPPER}{q}])", q = escape(QUOTES)),
        format!(r"(?<={LETTER}),(?={LETTER})"),
        format!(r"(?<={ALNUM})(?:-|–|—|--|---|——|~)(?={LETTER})"),
        format!(r"(?<={ALNUM})[:<>=/](?={LETTER})"),
    ]
}

/// Web addresses and e-mail addresses, which are never split.
fn url() -> String {
    let tlds = "com|org|net|edu|gov|io|co|uk|de|fr|info|biz|us|ca|au|tv|me|ly|ai";
    let w = crate::pystr::WORD_CLASS;
    let ns = crate::pystr::non_space();
    format!(
        r"(?i)^(?:(?:https?|ftp)://|www\.){ns}+$|^[{w}.+-]+@[{w}-]+(?:\.[{w}-]+)+$|^(?:[{w}-]+\.)+(?:{tlds})(?:/{ns}*)?$"
    )
}

/// The tokenizer: the exception table and the three compiled pattern sets.
pub(crate) struct Tokenizer {
    special: HashMap<String, Vec<String>>,
    prefix: Regex,
    suffix: Regex,
    context_suffix: Regex,
    infix: Regex,
    url: Regex,
}

impl Tokenizer {
    pub(crate) fn load(dir: &Path) -> Result<Tokenizer, G2pError> {
        let special: HashMap<String, Vec<String>> = load_json(dir, "tokenizer_exceptions.json")?;
        let join = |parts: Vec<String>, wrap: &dyn Fn(&str) -> String| {
            parts.iter().map(|p| wrap(p)).collect::<Vec<_>>().join("|")
        };
        Ok(Tokenizer {
            special,
            prefix: compile(&join(prefixes(), &|p| format!("^(?:{p})")))?,
            suffix: compile(&join(suffixes(), &|p| format!("(?:{p})$")))?,
            context_suffix: compile(&join(context_suffixes(), &|p| format!("(?:{p})$")))?,
            infix: compile(&join(infixes(), &|p| format!("(?:{p})")))?,
            url: compile(&url())?,
        })
    }

    /// The tokens of `text` with whether whitespace followed each one.
    pub(crate) fn tokenize(&self, text: &str) -> Result<Vec<(String, bool)>, G2pError> {
        let mut out = Vec::new();
        for (start, chunk) in chunks(text) {
            let mut tokens = self.split(chunk)?;
            let followed = start + chunk.len() < text.len();
            if let Some(last) = tokens.pop() {
                out.extend(tokens.into_iter().map(|t| (t, false)));
                out.push((last, followed));
            }
        }
        Ok(out)
    }

    fn is_special(&self, s: &str) -> bool {
        self.special.contains_key(s)
    }

    /// The length of the prefix at the start of `s` (0 for none).
    fn prefix_len(&self, s: &str) -> Result<usize, G2pError> {
        if let Some(rest) = s.strip_prefix('+')
            && !rest.starts_with(|c: char| c.is_ascii_digit())
        {
            return Ok(1);
        }
        let m = self.prefix.find(s).map_err(|e| G2pError::Match(e.to_string()))?;
        Ok(m.map_or(0, |m| m.end()))
    }

    /// The length of the suffix at the end of `s` (0 for none). Every
    /// alternative ends at the end, so the leftmost start of either set wins.
    fn suffix_len(&self, s: &str) -> Result<usize, G2pError> {
        let failed = |e: fancy_regex::Error| G2pError::Match(e.to_string());
        let plain = self.suffix.find(s).map_err(failed)?.map(|m| m.start());
        let window = s
            .char_indices()
            .rev()
            .nth(CONTEXT_SUFFIX_CHARS - 1)
            .map_or(0, |(at, _)| at);
        let context = self
            .context_suffix
            .find_from_pos(s, window)
            .map_err(failed)?
            .map(|m| m.start());
        let start = match (plain, context) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(start.map_or(0, |start| s.len() - start))
    }

    /// One whitespace-free chunk into tokens.
    fn split(&self, chunk: &str) -> Result<Vec<String>, G2pError> {
        if let Some(tokens) = self.special.get(chunk) {
            return Ok(tokens.clone());
        }
        let mut s = chunk;
        let (mut pre, mut suf): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
        let mut last = usize::MAX;
        while !s.is_empty() && s.len() != last && !self.is_special(s) {
            last = s.len();
            let pre_len = self.prefix_len(s)?;
            let (prefix, minus_pre) = s.split_at(pre_len);
            if pre_len > 0 && !minus_pre.is_empty() && self.is_special(minus_pre) {
                s = minus_pre;
                pre.push(prefix);
                break;
            }
            let suf_len = self.suffix_len(&s[pre_len..])?;
            let (minus_suf, suffix) = s.split_at(s.len() - suf_len);
            if suf_len > 0 && !minus_suf.is_empty() && self.is_special(minus_suf) {
                s = minus_suf;
                suf.push(suffix);
                break;
            }
            if pre_len > 0 && suf_len > 0 && pre_len + suf_len <= s.len() {
                s = &s[pre_len..s.len() - suf_len];
                pre.push(prefix);
                suf.push(suffix);
            } else if pre_len > 0 {
                s = minus_pre;
                pre.push(prefix);
            } else if suf_len > 0 {
                s = minus_suf;
                suf.push(suffix);
            }
        }
        let mut tokens: Vec<String> = pre.into_iter().map(str::to_owned).collect();
        if !s.is_empty() {
            if let Some(special) = self.special.get(s) {
                tokens.extend(special.iter().cloned());
            } else if !s.contains(|c: char| INFIX_CHARS.contains(c))
                || self.url.is_match(s).map_err(|e| G2pError::Match(e.to_string()))?
            {
                // An address stays whole; so does a word no infix can split.
                tokens.push(s.to_owned());
            } else {
                let mut start = 0;
                for m in self.infix.find_iter(s) {
                    let m = m.map_err(|e| G2pError::Match(e.to_string()))?;
                    if m.start() == 0 || m.start() == m.end() {
                        continue;
                    }
                    if m.start() > start {
                        tokens.push(s[start..m.start()].to_owned());
                    }
                    tokens.push(m.as_str().to_owned());
                    start = m.end();
                }
                if start < s.len() {
                    tokens.push(s[start..].to_owned());
                }
            }
        }
        tokens.extend(suf.into_iter().rev().map(str::to_owned));
        Ok(if tokens.len() > 1 { self.rejoin(tokens) } else { tokens })
    }

    /// spaCy's special-case pass over the pieces: three or two neighbours that
    /// together are a special case become that case's tokens.
    fn rejoin(&self, tokens: Vec<String>) -> Vec<String> {
        let mut out = Vec::with_capacity(tokens.len());
        let mut i = 0;
        'next: while i < tokens.len() {
            for k in [3, 2] {
                if let Some(window) = tokens.get(i..i + k)
                    && let Some(special) = self.special.get(&window.concat())
                {
                    out.extend(special.iter().cloned());
                    i += k;
                    continue 'next;
                }
            }
            out.push(tokens[i].clone());
            i += 1;
        }
        out
    }
}

/// The runs of non-whitespace in `text` (Python's `\S+`), with their byte offsets.
fn chunks(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = 0;
    std::iter::from_fn(move || {
        let tail = &text[rest..];
        let start = rest + tail.find(|c: char| !is_space_char(c))?;
        let len = text[start..].find(is_space_char).unwrap_or(text.len() - start);
        rest = start + len;
        Some((start, &text[start..start + len]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_on_python_whitespace() {
        let found: Vec<_> = chunks("  a bc\u{1f}d ").collect();
        assert_eq!(found, vec![(2, "a"), (4, "bc"), (7, "d")]);
        assert_eq!(chunks("").count(), 0);
    }
}
