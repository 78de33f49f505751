//! Text normalisation before tokenising: the readings the lexicon rules can't
//! produce on their own (times, dates, units, abbreviations, currencies other
//! than $ £ €, symbols, phone numbers, fractions, ranges, Roman numerals). Plain
//! numbers (cardinals, ordinals, years, decimals, $ £ € amounts) are left for
//! the lexicon, as in misaki. The word tables come from `normalize.json`.
//!
//! The steps run in the reference's order, each a regex substitution over the
//! whole text; the patterns are Python's, with `\w`, `\s` and `\b` spelled out
//! the way Python's `re` reads them (see [`crate::pystr`]).

use std::collections::HashMap;
use std::path::Path;

use fancy_regex::{Captures, Regex};
use serde::Deserialize;

use crate::G2pError;
use crate::assets::{OrderedMap, load_json};
use crate::numbers;
use crate::pystr::{self, WORD_CLASS, boundary, escape, non_space, space};

/// `normalize.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct Tables {
    /// "jan" -> "January", in calendar order.
    months: OrderedMap<String>,
    /// Titles expanded before a capitalised word ("St Paul" -> "Saint Paul");
    /// the sentence splitter also keeps a period after one of these keys.
    pub(crate) titles: OrderedMap<String>,
    /// "approx." -> "approximately".
    abbreviations: OrderedMap<String>,
    /// "km" -> ["kilometer", "kilometers"].
    units: OrderedMap<[String; 2]>,
    /// "=" -> "equals"; replaced in this order.
    symbols: OrderedMap<String>,
    /// "¥" -> ["yen", "yen"].
    currency: OrderedMap<[String; 2]>,
    /// Words after which a Roman numeral is a cardinal ("Chapter IV").
    roman_cardinal: Vec<String>,
    /// Words after which a Roman numeral is an ordinal ("Henry VIII").
    roman_ordinal: Vec<String>,
}

impl Tables {
    pub(crate) fn load(dir: &Path) -> Result<Tables, G2pError> {
        load_json(dir, "normalize.json")
    }
}

/// A substitution pattern with a plain relaxation of it: a pattern without
/// lookaround that matches somewhere in every text the full one matches in.
/// The relaxation runs on the regex crate's automata, the full pattern on
/// fancy-regex's backtracking engine, which is far slower; most sentences
/// have no time, date or unit in them, and the relaxation says so quickly.
pub(crate) struct Step {
    pattern: Regex,
    relaxed: Regex,
}

impl Step {
    fn new(pattern: &str, relaxed: &str) -> Result<Step, G2pError> {
        Ok(Step {
            pattern: compile(pattern)?,
            relaxed: compile(relaxed)?,
        })
    }

    /// `re.sub` with this step's pattern (see [`substitute`]).
    fn apply(
        &self,
        text: String,
        f: impl FnMut(&Captures<str>, &str) -> Result<String, G2pError>,
    ) -> Result<String, G2pError> {
        if !self
            .relaxed
            .is_match(&text)
            .map_err(|e| G2pError::Match(e.to_string()))?
        {
            return Ok(text);
        }
        substitute(&self.pattern, &text, f)
    }
}

/// One replacement of the symbol table: a literal one, or one that eats a
/// space on either side (`=`, `<`, `>`, `~` between two words).
enum SymbolRule {
    Literal {
        symbol: String,
        with: String,
    },
    Spaced {
        symbol: String,
        pattern: Regex,
        with: String,
    },
}

/// The compiled normaliser.
pub(crate) struct Normalizer {
    tables: Tables,
    month_names: Vec<String>,
    months: HashMap<String, String>,
    titles: HashMap<String, String>,
    abbreviations: HashMap<String, String>,
    units: HashMap<String, [String; 2]>,
    currency: HashMap<String, [String; 2]>,
    whitespace: Regex,
    time: Step,
    date_us: Step,
    date_iso: Step,
    month_day: Step,
    day_month: Step,
    unit: Step,
    degrees: Step,
    cents: Step,
    currency_amount: Step,
    big_money: Step,
    title: Step,
    abbreviation: Step,
    number_sign: Step,
    hash: Step,
    roman_cardinal: Step,
    roman_ordinal: Step,
    phone: Step,
    range: Step,
    fraction: Step,
    plus: Step,
    space_before_punct: Regex,
    symbols: Vec<SymbolRule>,
}

/// Compiles a pattern, naming it in the error.
pub(crate) fn compile(pattern: &str) -> Result<Regex, G2pError> {
    Regex::new(pattern).map_err(|e| G2pError::Pattern(format!("{pattern}: {e}")))
}

/// `re.sub(pattern, f, text)`: every match replaced by what `f` makes of it
/// (`f` also sees the whole text, as `m.string` in Python).
pub(crate) fn substitute(
    re: &Regex,
    text: &str,
    mut f: impl FnMut(&Captures<str>, &str) -> Result<String, G2pError>,
) -> Result<String, G2pError> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut last = 0;
    for caps in re.captures_iter(text) {
        let caps = caps.map_err(|e| G2pError::Match(e.to_string()))?;
        let Some(m) = caps.get(0) else { continue };
        out.push_str(&text[last..m.start()]);
        out.push_str(&f(&caps, text)?);
        last = m.end();
    }
    out.push_str(&text[last..]);
    Ok(out)
}

/// Capture group `i`, or "" when it did not take part.
fn group<'t>(caps: &Captures<'t, str>, i: usize) -> &'t str {
    caps.get(i).map_or("", |m| m.as_str())
}

/// An integer from a run of digits (the patterns guarantee one).
fn int(text: &str) -> Result<u128, G2pError> {
    pystr::parse_int(text).ok_or_else(|| crate::numbers::unreadable(text))
}

/// An alternation of literals, longest first (so "kHz" is tried before "Hz");
/// ties keep their given order, as Python's stable sort does.
fn alternation<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    let mut words: Vec<&str> = words.into_iter().collect();
    words.sort_by_key(|w| std::cmp::Reverse(pystr::len(w)));
    words.iter().map(|w| escape(w)).collect::<Vec<_>>().join("|")
}

/// The singular for 1 (and "1.0", "-1"), the plural otherwise.
fn plural<'a>(number: &str, words: &'a [String; 2]) -> &'a str {
    let bare = number.replace(',', "");
    if matches!(bare.as_str(), "1" | "1.0" | "-1") {
        &words[0]
    } else {
        &words[1]
    }
}

/// The value of a Roman numeral (a smaller digit before a larger one subtracts).
fn roman(numeral: &str) -> u128 {
    let value = |c: char| match c {
        'I' => 1,
        'V' => 5,
        'X' => 10,
        'L' => 50,
        'C' => 100,
        'D' => 500,
        'M' => 1000,
        _ => 0,
    };
    let digits: Vec<i64> = numeral.chars().map(value).collect();
    let total: i64 = digits
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if digits.get(i + 1).is_some_and(|&next| next > v) {
                -v
            } else {
                v
            }
        })
        .sum();
    u128::try_from(total).unwrap_or(0)
}

const FRACTIONS: [&str; 11] = [
    "", "", "half", "third", "quarter", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
];

impl Normalizer {
    pub(crate) fn new(tables: Tables) -> Result<Normalizer, G2pError> {
        let b = boundary();
        let s = space();
        let w = WORD_CLASS;
        let month_names: Vec<String> = tables.months.0.iter().map(|(_, v)| v.clone()).collect();
        let capitalized: Vec<String> = tables.months.keys().map(pystr::capitalize).collect();
        let months = alternation(
            month_names
                .iter()
                .map(String::as_str)
                .chain(capitalized.iter().map(String::as_str))
                .chain(["Sept"]),
        );
        let num = r"\d+(?:,\d{3})*(?:\.\d+)?";
        let roman_numeral = r"((?=[IVXLC])M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3}))";
        let roman_cardinal = alternation(tables.roman_cardinal.iter().map(String::as_str));
        let roman_ordinal = alternation(tables.roman_ordinal.iter().map(String::as_str));
        let mut symbols = Vec::new();
        for (symbol, word) in &tables.symbols.0 {
            let with = if word.is_empty() {
                " ".to_owned()
            } else {
                format!(" {word} ")
            };
            if !symbol.is_empty() && "=<>~".contains(symbol.as_str()) {
                let pattern = compile(&format!(
                    "(?<={ns}) ?{sym} ?(?={ns})",
                    ns = non_space(),
                    sym = escape(symbol)
                ))?;
                symbols.push(SymbolRule::Spaced {
                    symbol: symbol.clone(),
                    pattern,
                    with,
                });
            } else {
                symbols.push(SymbolRule::Literal {
                    symbol: symbol.clone(),
                    with,
                });
            }
        }
        let units = alternation(tables.units.keys());
        let titles = alternation(tables.titles.keys());
        let abbreviations = alternation(tables.abbreviations.keys());
        // Each step: the reference's pattern, then its relaxation (see [`Step`]).
        Ok(Normalizer {
            whitespace: compile(&format!("{s}+"))?,
            time: Step::new(
                &format!(r"{b}(\d{{1,2}}):(\d{{2}})(?::(\d{{2}}))?(?:{s}?([AaPp])\.?[Mm]\.?(?![A-Za-z]))?(?!\d)"),
                r"\d:\d\d",
            )?,
            date_us: Step::new(
                &format!(r"{b}(\d{{1,2}})/(\d{{1,2}})/(\d{{4}}|\d{{2}}){b}"),
                r"\d/\d{1,2}/\d\d",
            )?,
            date_iso: Step::new(&format!(r"{b}(\d{{4}})-(\d{{2}})-(\d{{2}}){b}"), r"\d{4}-\d{2}-\d{2}")?,
            month_day: Step::new(
                &format!(r"{b}({months})\.? (\d{{1,2}})(?:st|nd|rd|th)?{b}(?![\d:%])(,? \d{{4}}{b})?"),
                &format!(r"(?:{months})\.? \d"),
            )?,
            day_month: Step::new(
                &format!(r"{b}(the )?(\d{{1,2}}) (?:of )?({months}){b}\.?"),
                &format!(r"\d (?:of )?(?:{months})"),
            )?,
            unit: Step::new(
                &format!(r"(?<![{w}.])(-?{num}){s}?({units})(?![{w}])"),
                &format!(r"\d{s}?(?:{units})"),
            )?,
            degrees: Step::new(
                &format!(r"(?<![{w}.])(-?{num}){s}?°{s}?([CF])?(?![{w}])"),
                &format!(r"\d{s}?°"),
            )?,
            cents: Step::new(&format!(r"(?<![{w}.])({num}){s}?¢"), &format!(r"\d{s}?¢"))?,
            currency_amount: Step::new(
                &format!(
                    r"(?<![{w}])([¥₹₩]|Rs\.?|USD|EUR|GBP){s}?({num})(?:{s}?(hundred|thousand|million|billion|trillion|[kKmMbB]{b}))?"
                ),
                &format!(r"(?:[¥₹₩]|Rs\.?|USD|EUR|GBP){s}?\d"),
            )?,
            big_money: Step::new(
                &format!(r"([$£€])({num}){s}?(hundred|thousand|million|billion|trillion|[kKmMbB]{b})"),
                r"[$£€]\d",
            )?,
            title: Step::new(
                &format!(r"{b}({titles})\.? (?=[A-Z])"),
                &format!(r"(?:{titles})\.? [A-Z]"),
            )?,
            abbreviation: Step::new(&format!(r"(?<![{w}.])({abbreviations})(?![{w}])"), &abbreviations)?,
            number_sign: Step::new(&format!(r"{b}(No|Nos)\. ?(?=\d)"), r"Nos?\. ?\d")?,
            hash: Step::new(&format!(r"(?<![{w}&])#(?=\d)"), r"#\d")?,
            roman_cardinal: Step::new(
                &format!(r"{b}({roman_cardinal}) {roman_numeral}{b}(?![.'’][{w}])"),
                &format!(r"(?:{roman_cardinal}) [IVXLC]"),
            )?,
            roman_ordinal: Step::new(
                &format!(r"{b}({roman_ordinal}) {roman_numeral}{b}(?![.'’][{w}])"),
                &format!(r"(?:{roman_ordinal}) [IVXLC]"),
            )?,
            phone: Step::new(
                &format!(r"(?<![{w}.\-])(?:\d{{3}}-)?\d{{3}}-\d{{4}}(?![{w}.\-])"),
                r"\d{3}-\d{4}",
            )?,
            range: Step::new(
                &format!(r"(?<![{w}.\-])(\d{{1,4}}){s}?[-–]{s}?(\d{{1,4}})(?![{w}.\-%])"),
                &format!(r"\d{s}?[-–]{s}?\d"),
            )?,
            fraction: Step::new(&format!(r"(?<![{w}./])(\d{{1,2}})/(\d{{1,2}})(?![{w}./])"), r"\d/\d")?,
            plus: Step::new(&format!(r"(?<![{w}+])\+(?=\d)"), r"\+\d")?,
            space_before_punct: compile(r" +([,.;:!?])")?,
            symbols,
            month_names,
            months: tables.months.0.iter().cloned().collect(),
            titles: tables.titles.0.iter().cloned().collect(),
            abbreviations: tables.abbreviations.0.iter().cloned().collect(),
            units: tables.units.0.iter().cloned().collect(),
            currency: tables.currency.0.iter().cloned().collect(),
            tables,
        })
    }

    /// The title keys (`normalize.json`'s "titles"), for the sentence splitter.
    pub(crate) fn title_keys(&self) -> impl Iterator<Item = &str> {
        self.tables.titles.keys()
    }

    fn month(&self, name: &str) -> Result<&str, G2pError> {
        let key: String = pystr::lower(name).chars().take(3).collect();
        self.months
            .get(&key)
            .map(String::as_str)
            .ok_or_else(|| G2pError::Pattern(format!("no month {name}")))
    }

    /// "March third, 2020" for a valid month and day; `None` otherwise.
    fn date(&self, year: &str, month: u128, day: u128) -> Result<Option<String>, G2pError> {
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
            return Ok(None);
        }
        let name = usize::try_from(month - 1).ok().and_then(|m| self.month_names.get(m));
        let Some(name) = name else { return Ok(None) };
        let mut out = format!("{name} {}", numbers::ordinal(day)?);
        if !year.is_empty() {
            out.push_str(", ");
            out.push_str(year);
        }
        Ok(Some(out))
    }

    fn time(caps: &Captures<str>, text: &str) -> Result<String, G2pError> {
        let whole = group(caps, 0);
        let (hour, minute, second, meridiem) = (group(caps, 1), group(caps, 2), group(caps, 3), group(caps, 4));
        let (h, m) = (int(hour)?, int(minute)?);
        let s = if second.is_empty() { None } else { Some(int(second)?) };
        if h > 24 || m > 59 || s.is_some_and(|s| s > 59) {
            return Ok(whole.to_owned());
        }
        let mut words = numbers::cardinal(h)?;
        if m == 0 {
            if meridiem.is_empty() && second.is_empty() {
                words.push_str(" o'clock");
            }
        } else if m < 10 {
            words.push_str(" oh ");
            words.push_str(&numbers::cardinal(m)?);
        } else {
            words.push(' ');
            words.push_str(&numbers::cardinal(m)?);
        }
        if let Some(s) = s {
            words.push_str(" and ");
            words.push_str(&numbers::cardinal(s)?);
            words.push_str(if s == 1 { " second" } else { " seconds" });
        }
        if !meridiem.is_empty() {
            // Dotted, so that the lexicon spells the letters out (misaki's get_NNP).
            let end = caps.get(0).map_or(0, |m| m.end());
            words.push(' ');
            words.push_str(&pystr::upper(meridiem));
            words.push_str(".M");
            if !text[end..].starts_with('.') {
                words.push('.');
            }
        }
        Ok(words)
    }

    fn fraction(&self, caps: &Captures<str>) -> Result<String, G2pError> {
        let (a, b) = (int(group(caps, 1))?, int(group(caps, 2))?);
        if 0 < a && a < b && b <= 10 {
            let unit = usize::try_from(b)
                .ok()
                .and_then(|b| FRACTIONS.get(b))
                .copied()
                .unwrap_or("");
            if unit == "half" {
                return Ok(if a == 1 {
                    "one half".to_owned()
                } else {
                    format!("{a} halves")
                });
            }
            return Ok(format!("{a} {unit}{}", if a == 1 { "" } else { "s" }));
        }
        if (1..=12).contains(&a) && (1..=31).contains(&b) {
            return Ok(self.date("", a, b)?.unwrap_or_default());
        }
        Ok(format!("{a} slash {b}"))
    }

    /// The normalised text (the reference's `normalize`).
    pub(crate) fn normalize(&self, text: &str) -> Result<String, G2pError> {
        let text = substitute(&self.whitespace, text, |_, _| Ok(" ".to_owned()))?;
        let text = pystr::strip(&text);
        if text.is_empty() {
            return Ok(String::new());
        }
        let text = text
            .replace('\u{a0}', " ")
            .replace('’', "'")
            .replace('‒', "-")
            .replace('―', "—");
        let text = self.time.apply(text, Self::time)?;
        let text = self.date_iso.apply(text, |caps, _| {
            let date = self.date(group(caps, 1), int(group(caps, 2))?, int(group(caps, 3))?)?;
            Ok(date.unwrap_or_else(|| group(caps, 0).to_owned()))
        })?;
        let text = self.date_us.apply(text, |caps, _| {
            let (a, b) = (int(group(caps, 1))?, int(group(caps, 2))?);
            let mut year = group(caps, 3).to_owned();
            if pystr::len(&year) == 2 {
                year = format!("{}{year}", if int(&year)? > 30 { "19" } else { "20" });
            }
            let (month, day) = if a <= 12 { (a, b) } else { (b, a) };
            Ok(self
                .date(&year, month, day)?
                .unwrap_or_else(|| group(caps, 0).to_owned()))
        })?;
        let text = self.big_money.apply(text, |caps, _| {
            let (symbol, n, big) = (group(caps, 1), group(caps, 2), group(caps, 3));
            let big = big_word(big);
            let words = self.currency_words(symbol)?;
            Ok(format!("{n} {big} {}", words[1]))
        })?;
        let text = self.cents.apply(text, |caps, _| {
            let n = group(caps, 1);
            Ok(format!("{n} {}", plural(n, self.currency_words("¢")?)))
        })?;
        let text = self.currency_amount.apply(text, |caps, _| {
            let (symbol, n, big) = (group(caps, 1), group(caps, 2), group(caps, 3));
            let words = self.currency_words(symbol.trim_end_matches('.'))?;
            if big.is_empty() {
                Ok(format!("{n} {}", plural(n, words)))
            } else {
                Ok(format!("{n} {} {}", big_word(big), words[1]))
            }
        })?;
        let text = self.degrees.apply(text, |caps, _| {
            let (n, scale) = (group(caps, 1), group(caps, 2));
            let degrees = if matches!(n.replace(',', "").as_str(), "1" | "1.0" | "-1") {
                "degree"
            } else {
                "degrees"
            };
            let scale = match scale {
                "C" => " Celsius",
                "F" => " Fahrenheit",
                _ => "",
            };
            Ok(format!("{n} {degrees}{scale}"))
        })?;
        let text = self.unit.apply(text, |caps, _| {
            let (n, unit) = (group(caps, 1), group(caps, 2));
            let words = self
                .units
                .get(unit)
                .ok_or_else(|| G2pError::Pattern(format!("no unit {unit}")))?;
            Ok(format!("{n} {}", plural(n, words)))
        })?;
        let text = self.month_day.apply(text, |caps, _| {
            let day = int(group(caps, 2))?;
            if !(1..=31).contains(&day) {
                return Ok(group(caps, 0).to_owned());
            }
            Ok(format!(
                "{} {}{}",
                self.month(group(caps, 1))?,
                numbers::ordinal(day)?,
                group(caps, 3)
            ))
        })?;
        let text = self.day_month.apply(text, |caps, _| {
            let day = int(group(caps, 2))?;
            if !(1..=31).contains(&day) {
                return Ok(group(caps, 0).to_owned());
            }
            Ok(format!(
                "the {} of {}",
                numbers::ordinal(day)?,
                self.month(group(caps, 3))?
            ))
        })?;
        let text = self.title.apply(text, |caps, _| {
            let title = self.titles.get(group(caps, 1)).map_or("", String::as_str);
            Ok(format!("{title} "))
        })?;
        let text = self.abbreviation.apply(text, |caps, text| {
            let key = group(caps, 1);
            let mut out = self.abbreviations.get(key).cloned().unwrap_or_default();
            if caps.get(0).is_some_and(|m| m.end() == text.len()) && key.ends_with('.') {
                out.push('.');
            }
            Ok(out)
        })?;
        let text = self.number_sign.apply(text, |caps, _| {
            Ok(if group(caps, 1) == "No" { "Number " } else { "Numbers " }.to_owned())
        })?;
        let text = self.hash.apply(text, |_, _| Ok("number ".to_owned()))?;
        let text = self.roman_cardinal.apply(text, |caps, _| {
            Ok(format!("{} {}", group(caps, 1), roman(group(caps, 2))))
        })?;
        let text = self.roman_ordinal.apply(text, |caps, _| {
            Ok(format!(
                "{} the {}",
                group(caps, 1),
                numbers::ordinal(roman(group(caps, 2)))?
            ))
        })?;
        // Each character of a phone number on its own, the dashes as pauses.
        let text = self.phone.apply(text, |caps, _| {
            let spaced = group(caps, 0).replace('-', ", ");
            Ok(spaced.chars().map(String::from).collect::<Vec<_>>().join(" "))
        })?;
        let text = self.fraction.apply(text, |caps, _| self.fraction(caps))?;
        let text = self
            .range
            .apply(text, |caps, _| Ok(format!("{} to {}", group(caps, 1), group(caps, 2))))?;
        let mut text = self.plus.apply(text, |_, _| Ok("plus ".to_owned()))?;
        for rule in &self.symbols {
            match rule {
                SymbolRule::Literal { symbol, with } => {
                    if text.contains(symbol.as_str()) {
                        text = text.replace(symbol.as_str(), with);
                    }
                }
                SymbolRule::Spaced { symbol, pattern, with } => {
                    if text.contains(symbol.as_str()) {
                        text = substitute(pattern, &text, |_, _| Ok(with.clone()))?;
                    }
                }
            }
        }
        let text = substitute(&self.whitespace, &text, |_, _| Ok(" ".to_owned()))?;
        let text = substitute(&self.space_before_punct, &text, |caps, _| Ok(group(caps, 1).to_owned()))?;
        Ok(pystr::strip(&text).to_owned())
    }

    fn currency_words(&self, symbol: &str) -> Result<&[String; 2], G2pError> {
        self.currency
            .get(symbol)
            .ok_or_else(|| G2pError::Pattern(format!("no currency {symbol}")))
    }
}

/// "k" -> "thousand", "m" -> "million", "b" -> "billion"; words stay.
fn big_word(big: &str) -> &str {
    match big {
        "k" | "K" => "thousand",
        "m" | "M" => "million",
        "b" | "B" => "billion",
        _ => big,
    }
}
