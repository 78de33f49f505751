//! Python's string semantics, where the port depends on them.
//!
//! The reference decides a great deal with `str.isalpha`, `str.isdigit`,
//! `str.islower`, `str.capitalize`, `str.strip` and the `re` module's `\w`,
//! `\s` and `\b`. Rust's nearest equivalents draw the lines elsewhere (Rust's
//! `char::is_alphabetic` takes in combining marks and circled letters, its
//! regex `\w` leaves out `²` and `½`, its `trim` keeps `\x1c`..`\x1f`), so
//! this module spells out Python's definitions: letters are the general
//! category L, `\w` is L, N and `_`, whitespace is `str.isspace`'s list.

use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

use crate::pystr_tables::{DIGIT_RUNS, TITLECASE};

/// `\w` as Python's `re` reads it (letters, numbers and `_`), for regex patterns.
pub(crate) const WORD: &str = r"[\p{L}\p{N}_]";
/// The inside of [`WORD`], to put in a larger class.
pub(crate) const WORD_CLASS: &str = r"\p{L}\p{N}_";
/// Python's `[^\W\d_]`: a word character that is neither a decimal digit nor `_`.
pub(crate) const LETTER: &str = r"[\p{L}\p{Nl}\p{No}]";
/// Python's `[^\W_]`: a word character other than `_`.
pub(crate) const ALNUM: &str = r"[\p{L}\p{N}]";
/// The inside of a class of Python's `\s` (the characters `str.isspace` accepts).
pub(crate) const SPACE_CLASS: &str =
    r"\t-\r\x1C-\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}";

/// Python's `\s`.
pub(crate) fn space() -> String {
    format!("[{SPACE_CLASS}]")
}

/// Python's `\S`.
pub(crate) fn non_space() -> String {
    format!("[^{SPACE_CLASS}]")
}

/// Python's `\b`: a change between a `\w` and a non-`\w` (or an end).
pub(crate) fn boundary() -> String {
    format!("(?:(?<={WORD})(?!{WORD})|(?<!{WORD})(?={WORD}))")
}

/// A literal for a regex pattern, as `re.escape` makes one: every ASCII
/// punctuation character is escaped (but `<` and `>`, which the regex crate
/// reads as word boundaries when escaped and which need no escape).
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_punctuation() && c != '<' && c != '>' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `c.isalpha()`: the general category is a letter (Lu, Ll, Lt, Lm, Lo).
pub(crate) fn is_alpha_char(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_alphabetic()
    } else {
        c.general_category_group() == GeneralCategoryGroup::Letter
    }
}

/// `s.isalpha()`: not empty and every character a letter.
pub(crate) fn is_alpha(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_alpha_char)
}

/// The value of a character `str.isdigit` accepts (decimal digits, and
/// superscript, subscript and circled digits), or `None`.
pub(crate) fn digit_value(c: char) -> Option<u8> {
    if c.is_ascii_digit() {
        return Some(c as u8 - b'0');
    }
    let cp = u32::from(c);
    let at = DIGIT_RUNS.partition_point(|&(_, last, _)| last < cp);
    match DIGIT_RUNS.get(at) {
        Some(&(first, _, value)) if first <= cp => u8::try_from(cp - first).ok().map(|d| value + d),
        _ => None,
    }
}

/// `c.isdigit()`.
pub(crate) fn is_digit_char(c: char) -> bool {
    digit_value(c).is_some()
}

/// `s.isdigit()`.
pub(crate) fn is_digit(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_digit_char)
}

/// The value of a decimal digit (general category Nd), the only digits `int()` reads.
fn decimal_value(c: char) -> Option<u8> {
    if c.is_ascii_digit() {
        return Some(c as u8 - b'0');
    }
    if c.general_category() == GeneralCategory::DecimalNumber {
        digit_value(c)
    } else {
        None
    }
}

/// `int(s)` for a run of decimal digits (any script, as Python allows);
/// `None` for anything else, or a number past `u128`.
pub(crate) fn parse_int(s: &str) -> Option<u128> {
    if s.is_empty() {
        return None;
    }
    s.chars().try_fold(0u128, |n, c| {
        let d = decimal_value(c)?;
        n.checked_mul(10)?.checked_add(u128::from(d))
    })
}

/// `c.isspace()`.
pub(crate) fn is_space_char(c: char) -> bool {
    matches!(u32::from(c), 0x09..=0x0D | 0x1C..=0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

/// `s.strip()`.
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(is_space_char)
}

fn is_title_char(c: char) -> bool {
    !c.is_ascii() && c.general_category() == GeneralCategory::TitlecaseLetter
}

/// `s.islower()`: some character is cased, and none is upper- or titlecase.
pub(crate) fn is_lower(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_uppercase() || is_title_char(c) {
            return false;
        }
        cased |= c.is_lowercase();
    }
    cased
}

/// `s.isupper()`: some character is cased, and none is lower- or titlecase.
pub(crate) fn is_upper(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || is_title_char(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// `s.lower()` (full case mapping, final sigma included, as Python does).
pub(crate) fn lower(s: &str) -> String {
    if s.is_ascii() {
        s.to_ascii_lowercase()
    } else {
        s.to_lowercase()
    }
}

/// `s.upper()`.
pub(crate) fn upper(s: &str) -> String {
    if s.is_ascii() {
        s.to_ascii_uppercase()
    } else {
        s.to_uppercase()
    }
}

/// `c.lower()` of one character, which may be longer than one.
pub(crate) fn lower_char(c: char) -> String {
    c.to_lowercase().collect()
}

/// `s.capitalize()`: the first character in titlecase, the rest lowercase.
pub(crate) fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return String::new();
    };
    let mut out = match TITLECASE.binary_search_by(|&(c, _)| c.cmp(&first)) {
        Ok(at) => TITLECASE.get(at).map(|&(_, t)| t.to_owned()).unwrap_or_default(),
        Err(_) => first.to_uppercase().collect(),
    };
    out.push_str(&lower(chars.as_str()));
    out
}

/// `len(s)`: the number of code points.
pub(crate) fn len(s: &str) -> usize {
    s.chars().count()
}

/// `s[-n:]` in code points.
pub(crate) fn tail(s: &str, n: usize) -> &str {
    match s.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((at, _)) if n > 0 => &s[at..],
        _ if n == 0 => "",
        _ => s,
    }
}

/// `s[1:]` in code points.
pub(crate) fn after_first(s: &str) -> &str {
    let mut chars = s.chars();
    chars.next();
    chars.as_str()
}

/// `s[:-1]` in code points.
pub(crate) fn before_last(s: &str) -> &str {
    let mut chars = s.chars();
    chars.next_back();
    chars.as_str()
}

/// The last character, `s[-1]`.
pub(crate) fn last_char(s: &str) -> Option<char> {
    s.chars().next_back()
}

/// The one but last character, `s[-2]`.
pub(crate) fn second_last_char(s: &str) -> Option<char> {
    s.chars().nth_back(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn character_classes_follow_python() {
        assert!(is_alpha("café"));
        assert!(!is_alpha("e\u{301}"), "a combining mark is not a letter to Python");
        assert!(!is_alpha("Ⓐ"), "a circled letter is a symbol to Python");
        assert!(is_digit("²3"));
        assert_eq!(digit_value('٣'), Some(3));
        assert_eq!(digit_value('①'), Some(1));
        assert_eq!(digit_value('x'), None);
        assert_eq!(parse_int("٤٢"), Some(42));
        assert_eq!(parse_int("²"), None, "int() reads decimal digits only");
        assert!(is_space_char('\x1f') && is_space_char('\u{a0}') && !is_space_char('\u{200b}'));
        assert!(is_lower("abc1") && !is_lower("123") && !is_lower("aB"));
        assert!(is_upper("ABC1") && !is_upper("123") && !is_upper("Ab"));
        assert_eq!(capitalize("hELLO"), "Hello");
        assert_eq!(capitalize("ßa"), "Ssa");
        assert_eq!(capitalize("ǆemal"), "ǅemal");
        assert_eq!(tail("héllo", 3), "llo");
        assert_eq!(tail("hé", 3), "hé");
        assert_eq!(tail("hé", 0), "");
        assert_eq!(strip("\x1c a b \u{3000}"), "a b");
    }
}
