//! misaki's English lexicon logic (misaki 0.9.4 `en.py`, as hibari ports it).
//!
//! A word is looked up in the gold dictionary, then the silver one; entries
//! may depend on the part of speech ("read" as a past tense) or on whether a
//! vowel follows. Function words ("a", "the", "to", "in", "used") have their
//! own context rules, capitalised and upper-case words get extra stress, and
//! words not in the dictionaries are built from a known stem plus -s, -ed or
//! -ing. Numbers are read through [`crate::numbers`] with misaki's rules for
//! years, ordinals, decimals, currency amounts and digit strings.
//!
//! The British variant uses the gb dictionaries and differs in the suffix
//! rules: no flapped t, and ɪ instead of ᵻ in -es and -ed.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

use crate::G2pError;
use crate::assets::load_json;
use crate::pystr::{self, is_alpha};

pub(crate) const PRIMARY_STRESS: char = 'ˈ';
pub(crate) const SECONDARY_STRESS: char = 'ˌ';

/// Consonant phonemes (for the context rule: does a vowel come next?).
pub(crate) fn is_consonant(c: char) -> bool {
    "bdfhjklmnpstvwzðŋɡɹɾʃʒʤʧθ".contains(c)
}

/// Vowel phonemes.
pub(crate) fn is_vowel(c: char) -> bool {
    "AIOQWYaiuæɑɒɔəɛɜɪʊʌᵻ".contains(c)
}

fn is_diphthong(c: char) -> bool {
    "AIOQWYʤʧ".contains(c)
}

/// Vowels before which an American t between vowels is flapped.
fn is_us_tau(c: char) -> bool {
    "AIOWYiuæɑəɛɪɹʊʌ".contains(c)
}

fn is_stress(c: char) -> bool {
    c == PRIMARY_STRESS || c == SECONDARY_STRESS
}

/// The currencies the lexicon reads after a number: symbol -> (unit, hundredth).
pub(crate) fn currency_units(symbol: &str) -> Option<(&'static str, &'static str)> {
    match symbol {
        "$" => Some(("dollar", "cent")),
        "£" => Some(("pound", "pence")),
        "€" => Some(("euro", "cent")),
        _ => None,
    }
}

/// Symbols read as words wherever they stand.
fn symbol_word(word: &str) -> Option<&'static str> {
    match word {
        "%" => Some("percent"),
        "&" => Some("and"),
        "+" => Some("plus"),
        "@" => Some("at"),
        _ => None,
    }
}

fn is_ordinal_suffix(suffix: &str) -> bool {
    matches!(suffix, "st" | "nd" | "rd" | "th")
}

/// How heavy a phoneme string is (diphthongs count twice).
pub(crate) fn stress_weight(ps: &str) -> usize {
    ps.chars().map(|c| if is_diphthong(c) { 2 } else { 1 }).sum()
}

/// Puts a stress mark just before the first vowel that follows it.
fn restress(ps: &str) -> String {
    let chars: Vec<char> = ps.chars().collect();
    // Positions doubled, so a mark moved before vowel j sits at 2j - 1.
    let mut keyed: Vec<(usize, char)> = chars.iter().enumerate().map(|(i, &c)| (2 * i + 1, c)).collect();
    for (i, &c) in chars.iter().enumerate() {
        if is_stress(c)
            && let Some(j) = chars.iter().skip(i).position(|&v| is_vowel(v))
        {
            keyed[i] = (2 * (i + j), c);
        }
    }
    keyed.sort();
    keyed.into_iter().map(|(_, c)| c).collect()
}

/// misaki's `apply_stress`: lowers, removes or adds stress. `stress` is one
/// of misaki's levels (-2 none, -1 / -0.5 / 0 secondary, 0.5 / 1 / 2 primary).
pub(crate) fn apply_stress(ps: &str, stress: Option<f64>) -> String {
    let Some(stress) = stress else {
        return ps.to_owned();
    };
    let has_primary = ps.contains(PRIMARY_STRESS);
    let has_secondary = ps.contains(SECONDARY_STRESS);
    let has_vowel = ps.chars().any(is_vowel);
    if stress < -1.0 {
        ps.replace([PRIMARY_STRESS, SECONDARY_STRESS], "")
    } else if stress == -1.0 || ((stress == 0.0 || stress == -0.5) && has_primary) {
        ps.replace(SECONDARY_STRESS, "").replace(PRIMARY_STRESS, "ˌ")
    } else if (stress == 0.0 || stress == 0.5 || stress == 1.0) && !has_primary && !has_secondary {
        if has_vowel {
            restress(&format!("{SECONDARY_STRESS}{ps}"))
        } else {
            ps.to_owned()
        }
    } else if stress >= 1.0 && !has_primary && has_secondary {
        ps.replace(SECONDARY_STRESS, "ˈ")
    } else if stress > 1.0 && !has_primary && !has_secondary {
        if has_vowel {
            restress(&format!("{PRIMARY_STRESS}{ps}"))
        } else {
            ps.to_owned()
        }
    } else {
        ps.to_owned()
    }
}

/// `^[0-9]+$`.
pub(crate) fn is_ascii_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn parent_tag(tag: Option<&str>) -> Option<&str> {
    let tag = tag?;
    Some(if tag.starts_with("VB") {
        "VERB"
    } else if tag.starts_with("NN") {
        "NOUN"
    } else if tag.starts_with("ADV") || tag.starts_with("RB") {
        "ADV"
    } else if tag.starts_with("ADJ") || tag.starts_with("JJ") {
        "ADJ"
    } else {
        tag
    })
}

/// A dictionary entry: one reading, or readings by part of speech ("DEFAULT",
/// "VBD", "NOUN", "None" for "no vowel follows", ...; a reading may be null).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Entry {
    Plain(String),
    Tagged(HashMap<String, Option<String>>),
}

/// A misaki dictionary, with its `grow_dictionary` done at lookup time: a
/// lowercase key also answers for its Capitalised form and the other way
/// round, unless that form has its own entry.
struct Dict(HashMap<String, Entry>);

impl Dict {
    fn get(&self, word: &str) -> Option<&Entry> {
        if let Some(entry) = self.0.get(word) {
            return Some(entry);
        }
        if pystr::len(word) < 2 {
            return None;
        }
        let lower = pystr::lower(word);
        if word == lower {
            let capitalized = pystr::capitalize(word);
            return if capitalized != word {
                self.0.get(&capitalized)
            } else {
                None
            };
        }
        if word == pystr::capitalize(&lower) {
            return self.0.get(&lower);
        }
        None
    }

    fn contains(&self, word: &str) -> bool {
        self.get(word).is_some()
    }

    /// A plain entry's reading (the letters, "to", "am" are plain).
    fn plain(&self, word: &str) -> Option<String> {
        match self.get(word)? {
            Entry::Plain(ps) => Some(ps.clone()),
            Entry::Tagged(_) => None,
        }
    }
}

/// What the words after this one say about it (misaki's `TokenContext`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Context {
    /// Whether the next sounded word starts with a vowel; `None` when a
    /// pause or nothing follows.
    pub(crate) future_vowel: Option<bool>,
    /// Whether the next word is "to".
    pub(crate) future_to: bool,
}

/// The word a token offers the lexicon.
pub(crate) struct Word<'a> {
    pub(crate) text: &'a str,
    pub(crate) tag: &'a str,
    pub(crate) is_head: bool,
    pub(crate) currency: Option<&'a str>,
}

/// The two dictionaries and the rules.
pub(crate) struct Lexicon {
    golds: Dict,
    silvers: Dict,
    british: bool,
}

impl Lexicon {
    pub(crate) fn load(dir: &Path, british: bool) -> Result<Lexicon, G2pError> {
        let accent = if british { "gb" } else { "us" };
        Ok(Lexicon {
            golds: Dict(load_json(dir, &format!("lexicon_{accent}_gold.json.gz"))?),
            silvers: Dict(load_json(dir, &format!("lexicon_{accent}_silver.json.gz"))?),
            british,
        })
    }

    /// A proper noun or acronym spelled letter by letter, the last letter stressed.
    fn nnp(&self, word: &str) -> Option<String> {
        let mut ps = String::new();
        for c in word.chars().filter(|&c| pystr::is_alpha_char(c)) {
            ps.push_str(&self.golds.plain(&c.to_uppercase().collect::<String>())?);
        }
        let ps = apply_stress(&ps, Some(0.0));
        Some(match ps.rfind(SECONDARY_STRESS) {
            Some(at) => format!(
                "{}{PRIMARY_STRESS}{}",
                &ps[..at],
                &ps[at + SECONDARY_STRESS.len_utf8()..]
            ),
            None => ps,
        })
    }

    /// The function words and symbols with rules of their own; `None` when
    /// the word has none (or its rule gave nothing).
    fn special_case(&self, word: &str, tag: &str, stress: Option<f64>, ctx: &Context) -> Option<String> {
        let add_symbol = match word {
            "." => Some("dot"),
            "/" => Some("slash"),
            _ => None,
        };
        if let (true, Some(name)) = (tag == "ADD", add_symbol) {
            return self.lookup(name, None, Some(-0.5), Some(ctx));
        }
        if let Some(name) = symbol_word(word) {
            return self.lookup(name, None, None, Some(ctx));
        }
        let undotted = word.replace('.', "");
        if word.trim_matches('.').contains('.')
            && is_alpha(&undotted)
            && word.split('.').map(pystr::len).max().unwrap_or(0) < 3
        {
            return self.nnp(word);
        }
        match word {
            "a" | "A" => return Some(if tag == "DT" { "ɐ" } else { "ˈA" }.to_owned()),
            "am" | "Am" | "AM" => {
                if tag.starts_with("NN") {
                    return self.nnp(word);
                }
                if ctx.future_vowel.is_none() || word != "am" || stress.is_some_and(|s| s > 0.0) {
                    return self.golds.plain("am");
                }
                return Some("ɐm".to_owned());
            }
            "an" | "An" | "AN" => {
                if word == "AN" && tag.starts_with("NN") {
                    return self.nnp(word);
                }
                return Some("ɐn".to_owned());
            }
            "I" if tag == "PRP" => return Some(format!("{SECONDARY_STRESS}I")),
            "by" | "By" | "BY" if parent_tag(Some(tag)) == Some("ADV") => return Some("bˈI".to_owned()),
            _ => {}
        }
        if matches!(word, "to" | "To") || (word == "TO" && matches!(tag, "TO" | "IN")) {
            return match ctx.future_vowel {
                None => self.golds.plain("to"),
                Some(false) => Some("tə".to_owned()),
                Some(true) => Some("tʊ".to_owned()),
            };
        }
        if matches!(word, "in" | "In") || (word == "IN" && tag != "NNP") {
            let stress = if ctx.future_vowel.is_none() || tag != "IN" {
                "ˈ"
            } else {
                ""
            };
            return Some(format!("{stress}ɪn"));
        }
        if matches!(word, "the" | "The") || (word == "THE" && tag == "DT") {
            return Some(if ctx.future_vowel == Some(true) { "ði" } else { "ðə" }.to_owned());
        }
        if tag == "IN" && matches!(pystr::lower(word).as_str(), "vs" | "vs.") {
            return self.lookup("versus", None, None, Some(ctx));
        }
        if matches!(word, "used" | "Used" | "USED") {
            let key = if matches!(tag, "VBD" | "JJ") && ctx.future_to {
                "VBD"
            } else {
                "DEFAULT"
            };
            return match self.golds.get("used") {
                Some(Entry::Tagged(readings)) => readings.get(key).cloned().flatten(),
                Some(Entry::Plain(ps)) => Some(ps.clone()),
                None => None,
            };
        }
        None
    }

    /// Whether the rules can read `word` without stemming.
    fn is_known(&self, word: &str) -> bool {
        if self.golds.contains(word) || symbol_word(word).is_some() || self.silvers.contains(word) {
            return true;
        }
        if !is_alpha(word) || !word.chars().all(|c| c == '\'' || c == '-' || c.is_ascii_alphabetic()) {
            return false;
        }
        if pystr::len(word) == 1 {
            return true;
        }
        if word == pystr::upper(word) && self.golds.contains(&pystr::lower(word)) {
            return true;
        }
        let rest = pystr::after_first(word);
        rest == pystr::upper(rest)
    }

    /// The reading of a known word, with the stress level applied.
    fn lookup(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let mut word = word.to_owned();
        let mut is_nnp = false;
        if word == pystr::upper(&word) && !self.golds.contains(&word) {
            word = pystr::lower(&word);
            is_nnp = tag == Some("NNP");
        }
        let mut entry = self.golds.get(&word);
        if entry.is_none() && !is_nnp {
            entry = self.silvers.get(&word);
        }
        let ps: Option<String> = match entry {
            None => None,
            Some(Entry::Plain(ps)) => Some(ps.clone()),
            Some(Entry::Tagged(readings)) => {
                let key = if ctx.is_some_and(|c| c.future_vowel.is_none()) && readings.contains_key("None") {
                    Some("None")
                } else if tag.is_some_and(|t| readings.contains_key(t)) {
                    tag
                } else {
                    parent_tag(tag)
                };
                match key.and_then(|k| readings.get(k)) {
                    Some(reading) => reading.clone(),
                    None => readings.get("DEFAULT").cloned().flatten(),
                }
            }
        };
        if ps.as_deref().is_none_or(|ps| is_nnp && !ps.contains(PRIMARY_STRESS))
            && let Some(spelled) = self.nnp(&word)
        {
            return Some(spelled);
        }
        // (The reference fails here when there is no reading but a stress
        // level; no word the rules let through gets that far.)
        ps.map(|ps| apply_stress(&ps, stress))
    }

    /// A plural or third person: the stem's reading plus s, z or ᵻz.
    fn suffix_s(&self, stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let last = pystr::last_char(&stem)?;
        Some(if "ptkfθ".contains(last) {
            format!("{stem}s")
        } else if "szʃʒʧʤ".contains(last) {
            format!("{stem}{}z", if self.british { "ɪ" } else { "ᵻ" })
        } else {
            format!("{stem}z")
        })
    }

    fn stem_s(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let n = pystr::len(word);
        if n < 3 || !word.ends_with('s') {
            return None;
        }
        let stem = if !word.ends_with("ss") && self.is_known(&word[..word.len() - 1]) {
            word[..word.len() - 1].to_owned()
        } else if (word.ends_with("'s") || (n > 4 && word.ends_with("es") && !word.ends_with("ies")))
            && self.is_known(&word[..word.len() - 2])
        {
            word[..word.len() - 2].to_owned()
        } else if n > 4 && word.ends_with("ies") && self.is_known(&format!("{}y", &word[..word.len() - 3])) {
            format!("{}y", &word[..word.len() - 3])
        } else {
            return None;
        };
        self.suffix_s(self.lookup(&stem, tag, stress, ctx))
    }

    /// A past tense: the stem's reading plus t, d or ᵻd (ɾᵻd after a flapped t).
    fn suffix_ed(&self, stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let last = pystr::last_char(&stem)?;
        let weak = if self.british { "ɪ" } else { "ᵻ" };
        Some(if "pkfθʃsʧ".contains(last) {
            format!("{stem}t")
        } else if last == 'd' {
            format!("{stem}{weak}d")
        } else if last != 't' {
            format!("{stem}d")
        } else if self.british || pystr::len(&stem) < 2 {
            format!("{stem}ɪd")
        } else if pystr::second_last_char(&stem).is_some_and(is_us_tau) {
            format!("{}ɾᵻd", pystr::before_last(&stem))
        } else {
            format!("{stem}ᵻd")
        })
    }

    fn stem_ed(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let n = pystr::len(word);
        if n < 4 || !word.ends_with('d') {
            return None;
        }
        let stem = if !word.ends_with("dd") && self.is_known(&word[..word.len() - 1]) {
            &word[..word.len() - 1]
        } else if n > 4 && word.ends_with("ed") && !word.ends_with("eed") && self.is_known(&word[..word.len() - 2]) {
            &word[..word.len() - 2]
        } else {
            return None;
        };
        self.suffix_ed(self.lookup(stem, tag, stress, ctx))
    }

    /// A present participle: the stem's reading plus ɪŋ (ɾɪŋ after a flapped t;
    /// the British rules give up on a stem ending in ə or ː).
    fn suffix_ing(&self, stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let last = pystr::last_char(&stem)?;
        if self.british {
            if "əː".contains(last) {
                return None;
            }
        } else if pystr::len(&stem) > 1 && last == 't' && pystr::second_last_char(&stem).is_some_and(is_us_tau) {
            return Some(format!("{}ɾɪŋ", pystr::before_last(&stem)));
        }
        Some(format!("{stem}ɪŋ"))
    }

    fn stem_ing(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let n = pystr::len(word);
        if n < 5 || !word.ends_with("ing") {
            return None;
        }
        let base = &word[..word.len() - 3];
        // `([bcdgklmnprstvxz])\1ing$|cking$`: a doubled consonant before -ing.
        let doubled = {
            let mut rev = base.chars().rev();
            let (a, b) = (rev.next(), rev.next());
            a.is_some_and(|a| Some(a) == b && "bcdgklmnprstvxz".contains(a)) || word.ends_with("cking")
        };
        let stem = if n > 5 && self.is_known(base) {
            base.to_owned()
        } else if self.is_known(&format!("{base}e")) {
            format!("{base}e")
        } else if n > 5 && doubled && self.is_known(pystr::before_last(base)) {
            pystr::before_last(base).to_owned()
        } else {
            return None;
        };
        self.suffix_ing(self.lookup(&stem, tag, stress, ctx))
    }

    /// A word (not a number) by the dictionaries and rules.
    fn get_word(&self, word: &str, tag: &str, stress: Option<f64>, ctx: &Context) -> Option<String> {
        if let Some(ps) = self.special_case(word, tag, stress, ctx) {
            return Some(ps);
        }
        let lower = pystr::lower(word);
        let tag_ = Some(tag);
        let truthy = |ps: Option<String>| ps.is_some_and(|ps| !ps.is_empty());
        let mut word = word;
        if pystr::len(word) > 1
            && is_alpha(&word.replace('\'', ""))
            && word != lower
            && (tag != "NNP" || pystr::len(word) > 7)
            && !self.golds.contains(word)
            && !self.silvers.contains(word)
            && (word == pystr::upper(word) || pystr::after_first(word) == pystr::lower(pystr::after_first(word)))
            && (self.golds.contains(&lower)
                || self.silvers.contains(&lower)
                || truthy(self.stem_s(&lower, tag_, stress, Some(ctx)))
                || truthy(self.stem_ed(&lower, tag_, stress, Some(ctx)))
                || truthy(self.stem_ing(&lower, tag_, stress, Some(ctx))))
        {
            word = &lower;
        }
        if self.is_known(word) {
            return self.lookup(word, tag_, stress, Some(ctx));
        }
        if let Some(stem) = word.strip_suffix("s'") {
            let possessive = format!("{stem}'s");
            if self.is_known(&possessive) {
                return self.lookup(&possessive, tag_, stress, Some(ctx));
            }
        }
        if let Some(stem) = word.strip_suffix('\'')
            && self.is_known(stem)
        {
            return self.lookup(stem, tag_, stress, Some(ctx));
        }
        if let Some(ps) = self.stem_s(word, tag_, stress, Some(ctx)) {
            return Some(ps);
        }
        if let Some(ps) = self.stem_ed(word, tag_, stress, Some(ctx)) {
            return Some(ps);
        }
        self.stem_ing(word, tag_, Some(stress.unwrap_or(0.5)), Some(ctx))
    }

    /// A word of a number reading ("point" unstressed).
    fn number_word(&self, word: &str) -> Option<String> {
        self.lookup(word, None, if word == "point" { Some(-2.0) } else { None }, None)
    }

    /// The readings of the words of `text` (split on runs of anything but
    /// a-z, as `re.split(r"[^a-z]+")` does; "and" dropped).
    fn extend_words(&self, text: &str, out: &mut Vec<Option<String>>) {
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut in_separator = false;
        for (at, c) in text.char_indices() {
            let separator = !c.is_ascii_lowercase();
            if separator && !in_separator {
                pieces.push(&text[start..at]);
            } else if !separator && in_separator {
                start = at;
            }
            in_separator = separator;
        }
        pieces.push(if in_separator { "" } else { &text[start..] });
        for word in pieces {
            if word != "and" {
                out.push(self.number_word(word));
            }
        }
    }

    /// `extend_num` of the reference: a cardinal of `digits`.
    fn extend_cardinal(&self, digits: &str, out: &mut Vec<Option<String>>) -> Result<(), G2pError> {
        let n = pystr::parse_int(digits).ok_or_else(|| crate::numbers::unreadable(digits))?;
        self.extend_words(&crate::numbers::cardinal(n)?, out);
        Ok(())
    }

    /// misaki's number reading.
    pub(crate) fn get_number(
        &self,
        word: &str,
        currency: Option<&str>,
        is_head: bool,
    ) -> Result<Option<String>, G2pError> {
        let suffix_len = word.len()
            - word
                .trim_end_matches(|c: char| c.is_ascii_lowercase() || c == '\'')
                .len();
        let (mut word, suffix) = word.split_at(word.len() - suffix_len);
        let mut result: Vec<Option<String>> = Vec::new();
        if let Some(rest) = word.strip_prefix('-') {
            result.push(self.lookup("minus", None, None, None));
            word = rest;
        }
        let units = currency.and_then(currency_units);
        if is_ascii_number(word) && is_ordinal_suffix(suffix) {
            let n = pystr::parse_int(word).ok_or_else(|| crate::numbers::unreadable(word))?;
            self.extend_words(&crate::numbers::ordinal(n)?, &mut result);
        } else if result.is_empty() && pystr::len(word) == 4 && units.is_none() && is_ascii_number(word) {
            let n = pystr::parse_int(word).ok_or_else(|| crate::numbers::unreadable(word))?;
            self.extend_words(&crate::numbers::year(n)?, &mut result);
        } else if !is_head && !word.contains('.') {
            // Digit by digit, or in pairs as in "three oh five".
            let num = word.replace(',', "");
            let digits: Vec<char> = num.chars().collect();
            let str_of = |cs: &[char]| cs.iter().collect::<String>();
            if digits.first() == Some(&'0') || digits.len() > 3 {
                for d in &digits {
                    self.extend_cardinal(&d.to_string(), &mut result)?;
                }
            } else if digits.len() == 3 && !num.ends_with("00") {
                self.extend_cardinal(&str_of(&digits[..1]), &mut result)?;
                if digits[1] == '0' {
                    result.push(self.lookup("O", None, Some(-2.0), None));
                    self.extend_cardinal(&str_of(&digits[2..]), &mut result)?;
                } else {
                    self.extend_cardinal(&str_of(&digits[1..]), &mut result)?;
                }
            } else if digits.is_empty() {
                return Err(crate::numbers::unreadable(word));
            } else {
                self.extend_cardinal(&num, &mut result)?;
            }
        } else if word.matches('.').count() > 1 || !is_head {
            for num in word.replace(',', "").split('.') {
                let digits: Vec<char> = num.chars().collect();
                if digits.is_empty() {
                    continue;
                }
                if digits[0] == '0' || (digits.len() != 2 && digits[1..].iter().any(|&d| d != '0')) {
                    for d in &digits {
                        self.extend_cardinal(&d.to_string(), &mut result)?;
                    }
                } else {
                    self.extend_cardinal(num, &mut result)?;
                }
            }
        } else if let (Some((unit, hundredth)), true) = (units, is_currency(word)) {
            let plain = word.replace(',', "");
            let mut pairs: Vec<(u128, &str)> = Vec::new();
            for (num, unit) in plain.split('.').zip([unit, hundredth]) {
                let n = if num.is_empty() {
                    0
                } else {
                    pystr::parse_int(num).ok_or_else(|| crate::numbers::unreadable(num))?
                };
                pairs.push((n, unit));
            }
            if pairs.len() > 1 {
                if pairs[1].0 == 0 {
                    pairs.truncate(1);
                } else if pairs[0].0 == 0 {
                    pairs.remove(0);
                }
            }
            for (i, (n, unit)) in pairs.into_iter().enumerate() {
                if i > 0 {
                    result.push(self.lookup("and", None, None, None));
                }
                self.extend_words(&crate::numbers::cardinal(n)?, &mut result);
                result.push(if n != 1 && unit != "pence" {
                    self.stem_s(&format!("{unit}s"), None, None, None)
                } else {
                    self.lookup(unit, None, None, None)
                });
            }
        } else {
            let words = if is_ascii_number(word) {
                let n = pystr::parse_int(word).ok_or_else(|| crate::numbers::unreadable(word))?;
                crate::numbers::cardinal(n)?
            } else if !word.contains('.') {
                let bare = word.replace(',', "");
                let n = pystr::parse_int(&bare).ok_or_else(|| crate::numbers::unreadable(word))?;
                if is_ordinal_suffix(suffix) {
                    crate::numbers::ordinal(n)?
                } else {
                    crate::numbers::cardinal(n)?
                }
            } else {
                let bare = word.replace(',', "");
                if let Some(fraction) = bare.strip_prefix('.') {
                    let mut words = "point".to_owned();
                    for d in fraction.chars() {
                        let n = pystr::parse_int(&d.to_string()).ok_or_else(|| crate::numbers::unreadable(word))?;
                        words.push(' ');
                        words.push_str(&crate::numbers::cardinal(n)?);
                    }
                    words
                } else {
                    crate::numbers::decimal(&bare)?
                }
            };
            self.extend_words(&words, &mut result);
        }
        if result.is_empty() {
            return Ok(None);
        }
        // A word without a reading here is a failure in the reference (a None
        // in the join); the number words all have readings.
        let Some(parts) = result.into_iter().collect::<Option<Vec<String>>>() else {
            return Err(crate::numbers::unreadable(word));
        };
        let joined = parts.join(" ");
        Ok(match suffix {
            "s" | "'s" => self.suffix_s(Some(joined)),
            "ed" | "'d" => self.suffix_ed(Some(joined)),
            "ing" => self.suffix_ing(Some(joined)),
            _ => Some(joined),
        })
    }

    /// The reading of a token: a word by the rules, else a number; `None`
    /// when neither applies (the caller falls back to the OOV model).
    pub(crate) fn read(&self, token: &Word<'_>, ctx: &Context) -> Result<Option<String>, G2pError> {
        let text = token.text.replace(['‘', '’'], "'");
        let text: String = text.nfkc().collect();
        let word: String = text
            .chars()
            .map(|c| match pystr::digit_value(c) {
                Some(d) => char::from(b'0' + d),
                None => c,
            })
            .collect();
        let stress = if word == pystr::lower(&word) {
            None
        } else if word == pystr::upper(&word) {
            Some(2.0)
        } else {
            Some(0.5)
        };
        if let Some(ps) = self.get_word(&word, token.tag, stress, ctx) {
            return Ok(Some(self.append_currency(ps, token.currency)));
        }
        if is_number(&word, token.is_head) {
            return self.get_number(&word, token.currency, token.is_head);
        }
        Ok(None)
    }

    fn append_currency(&self, ps: String, currency: Option<&str>) -> String {
        let Some(symbol) = currency.filter(|c| !c.is_empty()) else {
            return ps;
        };
        let plural = currency_units(symbol).and_then(|(unit, _)| self.stem_s(&format!("{unit}s"), None, None, None));
        match plural {
            Some(plural) if !plural.is_empty() => format!("{ps} {plural}"),
            _ => ps,
        }
    }
}

/// Whether an amount reads as currency: no point, or one point and at most
/// two digits after it.
fn is_currency(word: &str) -> bool {
    match word.split_once('.') {
        None => true,
        Some((_, cents)) => !cents.contains('.') && pystr::len(cents) < 3,
    }
}

/// Whether `word` is a number (digits, `,` and `.`, a leading minus at the
/// head of a word, and one of the suffixes -s, -'s, -ed, -'d, -ing or an ordinal).
pub(crate) fn is_number(word: &str, is_head: bool) -> bool {
    if !word.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let mut word = word;
    for suffix in ["ing", "'d", "ed", "'s", "st", "nd", "rd", "th", "s"] {
        if let Some(stem) = word.strip_suffix(suffix) {
            word = stem;
            break;
        }
    }
    word.chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_digit() || c == ',' || c == '.' || (is_head && i == 0 && c == '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stress_rules() {
        assert_eq!(apply_stress("hˈɛloʊ", Some(-2.0)), "hɛloʊ");
        assert_eq!(apply_stress("hˈɛlˌO", Some(-1.0)), "hˌɛlO");
        assert_eq!(apply_stress("hˈɛlO", Some(-0.5)), "hˌɛlO");
        assert_eq!(apply_stress("hɛlO", Some(0.5)), "hˌɛlO");
        assert_eq!(apply_stress("hˌɛlO", Some(2.0)), "hˈɛlO");
        assert_eq!(apply_stress("hɛlO", Some(2.0)), "hˈɛlO");
        assert_eq!(apply_stress("st", Some(2.0)), "st");
        assert_eq!(apply_stress("hɛlO", None), "hɛlO");
        assert_eq!(stress_weight("hˈOm"), 5);
    }

    #[test]
    fn numbers_and_currency_shapes() {
        assert!(is_number("1,234", false));
        assert!(is_number("-5", true) && !is_number("-5", false));
        assert!(is_number("1990s", false) && is_number("21st", false) && is_number("5's", false));
        assert!(!is_number("abc", true) && !is_number("5x", true));
        assert!(is_currency("3.50") && !is_currency("3.505") && !is_currency("1.2.3") && is_currency("12"));
    }
}
