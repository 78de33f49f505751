//! From tokens to phonemes (misaki's `G2P.__call__`).
//!
//! The tagged tokens are cut again into sub-tokens (the pieces of "O'Brien",
//! "3D", "well-known"); sub-tokens with no space between them form a group
//! that is read as one word when the lexicon knows the whole, else piece by
//! piece. Tokens are read right to left so that each knows whether a vowel
//! or "to" comes next ("the apple", "used to"); what the lexicon cannot read
//! goes to the OOV model. Finally the pieces of a group are stressed against
//! each other and everything is joined.

use fancy_regex::Regex;

use crate::G2pError;
use crate::lexicon::{self, Context, Lexicon, PRIMARY_STRESS, Word, apply_stress, stress_weight};
use crate::normalize::compile;
use crate::oov::Oov;
use crate::pystr::{self, LETTER, WORD_CLASS, is_alpha_char, is_digit_char};
use crate::tagger::Tagger;
use crate::tokenize::Tokenizer;

/// Sub-token characters that are read as nothing.
fn is_junk(c: char) -> bool {
    "',-._‘’/".contains(c)
}

/// Punctuation that stands as itself in the phoneme string.
fn is_punct(c: char) -> bool {
    ";:,.!?—…\"“”".contains(c)
}

/// Punctuation other than quotes (a pause: no vowel or consonant follows).
fn is_non_quote_punct(c: char) -> bool {
    ";:,.!?—…".contains(c)
}

/// The tags of punctuation tokens.
fn is_punct_tag(tag: &str) -> bool {
    matches!(
        tag,
        "." | "," | "-LRB-" | "-RRB-" | "``" | "\"\"" | "''" | ":" | "$" | "#" | "NFP"
    )
}

/// The phonemes of brackets and quotes by their tag.
fn punct_tag_phonemes(tag: &str) -> Option<&'static str> {
    match tag {
        "-LRB-" => Some("("),
        "-RRB-" => Some(")"),
        "``" => Some("\u{201c}"),
        "\"\"" | "''" => Some("\u{201d}"),
        _ => None,
    }
}

/// What espeak said for symbols in the reference pipeline.
fn symbol_phonemes(c: char) -> &'static str {
    match c {
        '/' => "slˈæʃ",
        '=' => "ˈikwᵊlz",
        '+' => "plˈʌs",
        '&' => "ænd",
        '@' => "æt",
        '%' => "pəɹsˈɛnt",
        '#' => "hˈæʃ",
        '*' => "ˈæstəɹˌɪsk",
        '~' => "tˈɪldə",
        '^' => "kˈɛɹət",
        '<' => "lˈɛs ðən",
        '>' => "ɡɹˈATəɹ ðən",
        '—' => "—",
        _ => "",
    }
}

/// A token on its way to phonemes (misaki's `MToken`, the fields that matter).
#[derive(Debug, Clone)]
pub(crate) struct Tok {
    pub(crate) text: String,
    pub(crate) tag: String,
    /// Whether whitespace followed it in the text.
    pub(crate) whitespace: bool,
    pub(crate) phonemes: Option<String>,
    /// Whether it starts a word (not a later piece of a group).
    pub(crate) is_head: bool,
    /// Read as this text instead ("2" between letters -> "to").
    pub(crate) alias: Option<String>,
    /// The currency symbol before this amount.
    pub(crate) currency: Option<String>,
    /// Whether its phonemes get a space before them when its group is joined.
    pub(crate) prespace: bool,
}

impl Tok {
    pub(crate) fn new(text: String, tag: String, whitespace: bool) -> Tok {
        Tok {
            text,
            tag,
            whitespace,
            phonemes: None,
            is_head: true,
            alias: None,
            currency: None,
            prespace: false,
        }
    }

    fn is_set(&self) -> bool {
        self.alias.is_some() || self.phonemes.is_some()
    }
}

/// Whether the sub-token pattern would find `text` whole, decided without
/// running it: ASCII letters, all lowercase after the first or all
/// uppercase. Such a word has no lowercase letter before a capital and no
/// "AAa" run, so only the plain-word alternative matches, and all of it.
/// (Most tokens are such words; the pattern needs the backtracking engine.)
fn single_subtoken(text: &str) -> bool {
    let bytes = text.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            first.is_ascii_alphabetic()
                && (rest.iter().all(u8::is_ascii_lowercase) || bytes.iter().all(u8::is_ascii_uppercase))
        }
        None => false,
    }
}

/// A word: one token, or a group of sub-tokens with no space between them.
enum Unit {
    One(Tok),
    Group(Vec<Tok>),
}

/// The text of a run of tokens as it stood.
fn joined_text(tokens: &[Tok]) -> String {
    let mut text = String::new();
    for (i, tk) in tokens.iter().enumerate() {
        text.push_str(&tk.text);
        if tk.whitespace && i + 1 < tokens.len() {
            text.push(' ');
        }
    }
    text
}

/// One token standing for a run of them (misaki's `merge_tokens`); the
/// phonemes are joined too when `join_phonemes` (with a space before a piece
/// marked `prespace`).
fn merge(tokens: &[Tok], join_phonemes: bool) -> Tok {
    let weight = |tk: &Tok| -> usize {
        tk.text
            .chars()
            .map(|c| if pystr::lower_char(c) == c.to_string() { 1 } else { 2 })
            .sum()
    };
    // The first token of the greatest weight gives the tag.
    let mut best: Option<&Tok> = None;
    for tk in tokens {
        if best.is_none_or(|b| weight(tk) > weight(b)) {
            best = Some(tk);
        }
    }
    let phonemes = join_phonemes.then(|| {
        let mut ps = String::new();
        for tk in tokens {
            let piece = tk.phonemes.as_deref().unwrap_or("");
            if tk.prespace && pystr::last_char(&ps).is_some_and(|c| !pystr::is_space_char(c)) && !piece.is_empty() {
                ps.push(' ');
            }
            ps.push_str(piece);
        }
        ps
    });
    Tok {
        text: joined_text(tokens),
        tag: best.map(|tk| tk.tag.clone()).unwrap_or_default(),
        whitespace: tokens.last().is_some_and(|tk| tk.whitespace),
        phonemes,
        is_head: tokens.first().is_none_or(|tk| tk.is_head),
        alias: None,
        currency: tokens.iter().filter_map(|tk| tk.currency.clone()).max(),
        prespace: tokens.first().is_some_and(|tk| tk.prespace),
    }
}

/// The pipeline's compiled parts.
pub(crate) struct Pipeline {
    pub(crate) tokenizer: Tokenizer,
    pub(crate) tagger: Tagger,
    pub(crate) lexicon: Lexicon,
    pub(crate) oov: Oov,
    subtoken: Regex,
    link: Regex,
    fallback_piece: Regex,
}

impl Pipeline {
    pub(crate) fn new(tokenizer: Tokenizer, tagger: Tagger, lexicon: Lexicon, oov: Oov) -> Result<Pipeline, G2pError> {
        let upper = "A-ZÀ-ÖØ-Þ";
        let lower = "a-zß-öø-ÿ";
        let q = "'‘’";
        let subtoken = format!(
            "^[{q}]+|[{upper}](?=[{upper}][{lower}])|(?:^-)?(?:\\d?[,.]?\\d)+|[-_]+|[{q}]{{2,}}\
             |{LETTER}*?(?:[{q}]{LETTER})*?[{lower}](?=[{upper}])|{LETTER}+(?:[{q}]{LETTER})*\
             |[^{WORD_CLASS}\\-{q}]|[{q}]+$"
        );
        Ok(Pipeline {
            tokenizer,
            tagger,
            lexicon,
            oov,
            subtoken: compile(&subtoken)?,
            link: compile(r"\[([^\]]+)\]\(([^\)]*)\)")?,
            fallback_piece: compile(&format!(
                "{LETTER}+(?:['’]{LETTER}+)*|\\d+(?:[,.]\\d+)*|[^{WORD_CLASS}{}]+",
                pystr::SPACE_CLASS
            ))?,
        })
    }

    /// Tokens with tags; `[text](/phonemes/)` sets a token's phonemes directly.
    pub(crate) fn tokenize(&self, text: &str) -> Result<Vec<Tok>, G2pError> {
        let mut tokens = Vec::new();
        let mut pos = 0;
        for caps in self.link.captures_iter(text) {
            let caps = caps.map_err(|e| G2pError::Match(e.to_string()))?;
            let (Some(all), Some(shown), Some(target)) = (caps.get(0), caps.get(1), caps.get(2)) else {
                continue;
            };
            tokens.extend(self.tagged(&text[pos..all.start()])?);
            let target = target.as_str();
            let phonemes = (pystr::len(target) > 1 && target.starts_with('/') && target.ends_with('/'))
                .then(|| target[1..].trim_end_matches('/').to_owned());
            let whitespace = text[all.end()..].chars().next().is_some_and(pystr::is_space_char);
            let mut tok = Tok::new(shown.as_str().to_owned(), "NN".to_owned(), whitespace);
            tok.phonemes = phonemes;
            tokens.push(tok);
            pos = all.end();
        }
        tokens.extend(self.tagged(&text[pos..])?);
        Ok(tokens)
    }

    fn tagged(&self, text: &str) -> Result<Vec<Tok>, G2pError> {
        let pairs = self.tokenizer.tokenize(text)?;
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let words: Vec<String> = pairs.iter().map(|(t, _)| t.clone()).collect();
        let tags = self.tagger.tag(&words);
        Ok(pairs
            .into_iter()
            .zip(tags)
            .map(|((text, ws), tag)| Tok::new(text, tag, ws))
            .collect())
    }

    /// Cuts tokens into sub-tokens and groups those with no space between them;
    /// punctuation, currency signs and "2"-as-"to" get their readings here.
    fn retokenize(&self, tokens: Vec<Tok>) -> Result<Vec<Unit>, G2pError> {
        let mut units: Vec<Unit> = Vec::new();
        let mut currency: Option<String> = None;
        let next_tags: Vec<Option<String>> = tokens
            .iter()
            .skip(1)
            .map(|t| Some(t.tag.clone()))
            .chain([None])
            .collect();
        for (token, next_tag) in tokens.into_iter().zip(next_tags) {
            let mut pieces: Vec<Tok> = if token.is_set() || single_subtoken(&token.text) {
                vec![token.clone()]
            } else {
                let mut pieces = Vec::new();
                for m in self.subtoken.find_iter(&token.text) {
                    let m = m.map_err(|e| G2pError::Match(e.to_string()))?;
                    let mut piece = token.clone();
                    piece.text = m.as_str().to_owned();
                    piece.whitespace = false;
                    piece.is_head = true;
                    piece.prespace = false;
                    pieces.push(piece);
                }
                pieces
            };
            let Some(last) = pieces.last_mut() else {
                return Err(G2pError::Match(format!("no sub-tokens in {:?}", token.text)));
            };
            last.whitespace = token.whitespace;
            let count = pieces.len();
            for j in 0..count {
                let neighbours_alpha = j > 0 && j + 1 < count && {
                    let before = pystr::last_char(&pieces[j - 1].text);
                    let after = pieces[j + 1].text.chars().next();
                    before.is_some_and(is_alpha_char) && after.is_some_and(is_alpha_char)
                };
                let tk = &mut pieces[j];
                if tk.is_set() {
                } else if tk.tag == "$" && lexicon::currency_units(&tk.text).is_some() {
                    currency = Some(tk.text.clone());
                    tk.phonemes = Some(String::new());
                } else if tk.tag == ":" && (tk.text == "-" || tk.text == "–") {
                    tk.phonemes = Some("—".to_owned());
                } else if is_punct_tag(&tk.tag)
                    && !tk.text.chars().all(|c| {
                        let l = pystr::lower_char(c);
                        l.len() == 1 && l.as_bytes()[0].is_ascii_lowercase()
                    })
                {
                    let ps = match punct_tag_phonemes(&tk.tag) {
                        Some(ps) => ps.to_owned(),
                        None => tk.text.chars().filter(|&c| is_punct(c)).collect(),
                    };
                    tk.phonemes = Some(ps);
                } else if let Some(symbol) = &currency {
                    if tk.tag != "CD" {
                        currency = None;
                    } else if j + 1 == count && next_tag.as_deref() != Some("CD") {
                        tk.currency = Some(symbol.clone());
                    }
                } else if tk.text == "2" && neighbours_alpha {
                    tk.alias = Some("to".to_owned());
                }
            }
            for mut tk in pieces {
                if tk.is_set() {
                    units.push(Unit::One(tk));
                    continue;
                }
                if let Some(Unit::Group(group)) = units.last_mut()
                    && group.last().is_some_and(|last| !last.whitespace)
                {
                    tk.is_head = false;
                    group.push(tk);
                    continue;
                }
                units.push(if tk.whitespace {
                    Unit::One(tk)
                } else {
                    Unit::Group(vec![tk])
                });
            }
        }
        Ok(units
            .into_iter()
            .map(|unit| match unit {
                Unit::Group(mut group) if group.len() == 1 => match group.pop() {
                    Some(tk) => Unit::One(tk),
                    None => Unit::Group(group),
                },
                unit => unit,
            })
            .collect())
    }

    /// The lexicon's reading of a token.
    fn read(&self, tk: &Tok, ctx: &Context) -> Result<Option<String>, G2pError> {
        let word = Word {
            text: tk.alias.as_deref().unwrap_or(&tk.text),
            tag: &tk.tag,
            is_head: tk.is_head,
            currency: tk.currency.as_deref(),
        };
        self.lexicon.read(&word, ctx)
    }

    /// An unknown word: letters go to the OOV model, digit runs to the number
    /// reader, symbols to a small table.
    fn fallback(&self, tk: &Tok) -> Result<String, G2pError> {
        let mut out = Vec::new();
        for m in self.fallback_piece.find_iter(&tk.text) {
            let piece = m.map_err(|e| G2pError::Match(e.to_string()))?.as_str();
            let Some(first) = piece.chars().next() else { continue };
            let ps = if is_digit_char(first) {
                self.lexicon.get_number(piece, None, false)?
            } else if is_alpha_char(first) {
                self.oov.read(piece)?
            } else {
                Some(piece.chars().map(symbol_phonemes).collect())
            };
            if let Some(ps) = ps.filter(|ps| !ps.is_empty()) {
                out.push(ps);
            }
        }
        Ok(out.join(" "))
    }

    /// The phonemes of one normalised line of text.
    pub(crate) fn phonemize(&self, text: &str) -> Result<String, G2pError> {
        let mut units = self.retokenize(self.tokenize(text)?)?;
        let mut ctx = Context::default();
        for unit in units.iter_mut().rev() {
            match unit {
                Unit::One(tk) => {
                    if tk.phonemes.is_none() {
                        tk.phonemes = self.read(tk, &ctx)?;
                    }
                    if tk.phonemes.is_none() {
                        tk.phonemes = Some(self.fallback(tk)?);
                    }
                    ctx = token_context(&ctx, tk.phonemes.as_deref(), tk);
                }
                Unit::Group(group) => ctx = self.read_group(group, ctx)?,
            }
        }
        let mut out = String::new();
        for unit in &units {
            let tk = match unit {
                Unit::One(tk) => tk.clone(),
                Unit::Group(group) => merge(group, true),
            };
            let ps = tk.phonemes.unwrap_or_default().replace('ɾ', "T").replace('ʔ', "t");
            out.push_str(&ps);
            if tk.whitespace {
                out.push(' ');
            }
        }
        Ok(pystr::strip(&out).to_owned())
    }

    /// Reads a group: the longest run from the right end that the lexicon
    /// knows as a whole, then what is left of it the same way; junk pieces
    /// read as nothing; a piece nothing can read sends the whole group to
    /// the fallback.
    fn read_group(&self, group: &mut [Tok], mut ctx: Context) -> Result<Context, G2pError> {
        let (mut left, mut right) = (0, group.len());
        let mut should_fallback = false;
        while left < right {
            let run = &group[left..right];
            let merged = (!run.iter().any(Tok::is_set)).then(|| merge(run, false));
            let ps = match &merged {
                Some(tk) => self.read(tk, &ctx)?,
                None => None,
            };
            if let (Some(ps), Some(tk)) = (ps, &merged) {
                ctx = token_context(&ctx, Some(&ps), tk);
                group[left].phonemes = Some(ps);
                for x in &mut group[left + 1..right] {
                    x.phonemes = Some(String::new());
                }
                right = left;
                left = 0;
            } else if left + 1 < right {
                left += 1;
            } else {
                right -= 1;
                let tk = &mut group[right];
                if tk.phonemes.is_none() {
                    if tk.text.chars().all(is_junk) {
                        tk.phonemes = Some(String::new());
                    } else {
                        should_fallback = true;
                        break;
                    }
                }
                left = 0;
            }
        }
        if should_fallback {
            let merged = merge(group, false);
            let ps = self.fallback(&merged)?;
            if let Some((first, rest)) = group.split_first_mut() {
                first.phonemes = Some(ps);
                for x in rest {
                    x.phonemes = Some(String::new());
                }
            }
        } else {
            resolve_group(group);
        }
        Ok(ctx)
    }
}

/// What a token tells the words before it: whether its first sound is a
/// vowel (`None` at a pause), and whether it is "to".
fn token_context(ctx: &Context, ps: Option<&str>, tk: &Tok) -> Context {
    let mut vowel = ctx.future_vowel;
    if let Some(ps) = ps.filter(|ps| !ps.is_empty()) {
        let first = ps
            .chars()
            .find(|&c| lexicon::is_vowel(c) || lexicon::is_consonant(c) || is_non_quote_punct(c));
        if let Some(c) = first {
            vowel = if is_non_quote_punct(c) {
                None
            } else {
                Some(lexicon::is_vowel(c))
            };
        }
    }
    let future_to =
        matches!(tk.text.as_str(), "to" | "To") || (tk.text == "TO" && matches!(tk.tag.as_str(), "TO" | "IN"));
    Context {
        future_vowel: vowel,
        future_to,
    }
}

/// After a group is read piece by piece: pieces of mixed kinds (letters and
/// digits, or with a space or slash) get spaces between them; otherwise, when
/// too many pieces carry primary stress, the lighter half is demoted.
fn resolve_group(tokens: &mut [Tok]) {
    let text = joined_text(tokens);
    let kinds: std::collections::BTreeSet<u8> = text
        .chars()
        .filter(|&c| !is_junk(c))
        .map(|c| {
            if pystr::is_alpha_char(c) {
                0
            } else if c.is_ascii_digit() {
                1
            } else {
                2
            }
        })
        .collect();
    let prespace = text.contains(' ') || text.contains('/') || kinds.len() > 1;
    let count = tokens.len();
    for (i, tk) in tokens.iter_mut().enumerate() {
        if tk.phonemes.is_none() {
            let mut chars = tk.text.chars();
            let single_punct = matches!((chars.next(), chars.next()), (Some(c), None) if is_non_quote_punct(c));
            if i + 1 == count && single_punct {
                tk.phonemes = Some(tk.text.clone());
            } else if tk.text.chars().all(is_junk) {
                tk.phonemes = Some(String::new());
            }
        } else if i > 0 {
            tk.prespace = prespace;
        }
    }
    if prespace {
        return;
    }
    let mut indices: Vec<(bool, usize, usize)> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, tk)| {
            let ps = tk.phonemes.as_deref().filter(|ps| !ps.is_empty())?;
            Some((ps.contains(PRIMARY_STRESS), stress_weight(ps), i))
        })
        .collect();
    let demote = |tk: &mut Tok| {
        if let Some(ps) = &tk.phonemes {
            tk.phonemes = Some(apply_stress(ps, Some(-0.5)));
        }
    };
    if indices.len() == 2 && pystr::len(&tokens[indices[0].2].text) == 1 {
        demote(&mut tokens[indices[1].2]);
        return;
    }
    let primaries = indices.iter().filter(|(p, _, _)| *p).count();
    if indices.len() < 2 || primaries <= indices.len().div_ceil(2) {
        return;
    }
    indices.sort();
    let half = indices.len() / 2;
    for &(_, _, i) in &indices[..half] {
        demote(&mut tokens[i]);
    }
}
