//! English text to phonemes for the Kokoro-style voice `kokoro-hibari`: the
//! text front end of the `hibari-tts` 0.2.1 Python package (Apache-2.0),
//! ported to Rust so the speech worker needs no Python, spaCy or espeak-ng.
//!
//! The output is character for character what `hibari.g2p.G2P(british)(text)`
//! returns, in the model's phoneme alphabet (misaki's conventions):
//!
//! 1. [`normalize`] rewrites what the lexicon can't read on its own (times,
//!    dates, units, abbreviations, symbols, phone numbers, Roman numerals);
//! 2. [`tokenize`] cuts the text with spaCy's English rules;
//! 3. [`tagger`] tags each token with its part of speech (an averaged perceptron);
//! 4. [`lexicon`] reads each word with misaki's dictionaries and rules
//!    (homographs by tag, stress, -s / -ed / -ing stems, numbers);
//! 5. [`oov`] reads the words nothing else can with a small ONNX model;
//! 6. [`pipeline`] ties tokens, context and stress together.
//!
//! [`split_sentences`] and [`G2p::chunks`] are the package's `tts.py` layer:
//! text into sentences, and sentences into phoneme chunks of at most
//! [`MAX_PHONEMES`] characters (long sentences split at clause punctuation).
//!
//! ```no_run
//! # fn main() -> Result<(), gantry_g2p::G2pError> {
//! let dir = std::path::Path::new("models/kokoro-hibari");
//! gantry_onnx::init(&dir.join("libonnxruntime.so.1.32.0"))?;
//! let g2p = gantry_g2p::G2p::load(dir, false)?;
//! assert_eq!(g2p.phonemize("Hello there.")?, "həlˈO ðˈɛɹ.");
//! # Ok(())
//! # }
//! ```

mod assets;
mod lexicon;
mod normalize;
mod numbers;
mod oov;
mod pipeline;
mod pystr;
mod pystr_tables;
mod tagger;
mod tokenize;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The files [`G2p::load`] reads from a model directory, for both variants
/// (names as in the wheel's `assets/` folder). The phoneme-to-id table
/// (`vocab.json`) belongs to the acoustic model and is not among them.
pub const ASSET_FILES: &[&str] = &[
    "lexicon_us_gold.json.gz",
    "lexicon_us_silver.json.gz",
    "lexicon_gb_gold.json.gz",
    "lexicon_gb_silver.json.gz",
    "normalize.json",
    "tagger.json.gz",
    "tokenizer_exceptions.json",
    "oov.json",
    "oov.onnx",
    "oov_gb.json",
    "oov_gb.onnx",
];

/// The longest phoneme string the acoustic model is given at once; longer
/// sentences are split at clause punctuation.
pub const MAX_PHONEMES: usize = 400;

/// Why loading or phonemising failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum G2pError {
    /// An asset file is missing or malformed.
    #[error("cannot read {}: {reason}", path.display())]
    Asset { path: PathBuf, reason: String },
    /// A pattern built from the assets does not compile, or a table lacks an entry it needs.
    #[error("bad pattern or table: {0}")]
    Pattern(String),
    /// The regex engine gave up on a match (its backtracking limit).
    #[error("pattern matching failed: {0}")]
    Match(String),
    /// A number the reader cannot say (past the decillions, as in the reference).
    #[error("cannot read the number {0:?}")]
    Number(String),
    /// ONNX Runtime or the OOV model could not be loaded.
    #[error(transparent)]
    Onnx(#[from] gantry_onnx::OnnxError),
    /// A run of the OOV model failed.
    #[error("the out-of-vocabulary model failed: {0}")]
    Oov(String),
}

/// The grapheme-to-phoneme converter: dictionaries, tagger, tokenizer rules,
/// normaliser and the OOV model, loaded once and shared by threads.
pub struct G2p {
    normalizer: normalize::Normalizer,
    pipeline: pipeline::Pipeline,
    titles: HashSet<String>,
    british: bool,
}

impl G2p {
    /// Loads the American (`british = false`) or British variant from `dir`,
    /// which holds the asset files named as in the wheel's `assets/` folder
    /// (see [`ASSET_FILES`]). ONNX Runtime must be initialised first
    /// ([`gantry_onnx::init`]); the OOV model gets one session with one thread.
    pub fn load(dir: &Path, british: bool) -> Result<G2p, G2pError> {
        let tables = normalize::Tables::load(dir)?;
        let normalizer = normalize::Normalizer::new(tables)?;
        let titles = normalizer.title_keys().map(str::to_owned).collect();
        let pipeline = pipeline::Pipeline::new(
            tokenize::Tokenizer::load(dir)?,
            tagger::Tagger::load(dir)?,
            lexicon::Lexicon::load(dir, british)?,
            oov::Oov::load(dir, if british { "oov_gb" } else { "oov" })?,
        )?;
        Ok(G2p {
            normalizer,
            pipeline,
            titles,
            british,
        })
    }

    /// Whether this is the British variant.
    pub fn british(&self) -> bool {
        self.british
    }

    /// One sentence to its phoneme string (`G2P(british)(sentence)` in the reference).
    pub fn phonemize(&self, sentence: &str) -> Result<String, G2pError> {
        let text = self.normalizer.normalize(sentence)?;
        self.pipeline.phonemize(&text)
    }

    /// The titles after which a period does not end a sentence ("Dr", "St").
    pub fn titles(&self) -> &HashSet<String> {
        &self.titles
    }

    /// [`split_sentences`] with this converter's titles.
    pub fn sentences(&self, text: &str) -> Vec<String> {
        split_sentences(text, &self.titles)
    }

    /// Every phoneme chunk of `text`, in order (`Hibari.phonemize` in the
    /// reference): sentence by sentence, sentences with no phonemes left out,
    /// a sentence longer than [`MAX_PHONEMES`] characters cut after commas,
    /// semicolons, colons and dashes into chunks that fit (a single clause
    /// longer than that stays whole).
    pub fn chunks(&self, text: &str) -> Result<Vec<String>, G2pError> {
        let mut chunks = Vec::new();
        for sentence in self.sentences(text) {
            let ps = self.phonemize(&sentence)?;
            if ps.is_empty() {
                continue;
            }
            if pystr::len(&ps) <= MAX_PHONEMES {
                chunks.push(ps);
                continue;
            }
            let mut current = String::new();
            for part in clauses(&ps) {
                if !current.is_empty() && pystr::len(&current) + pystr::len(part) + 1 > MAX_PHONEMES {
                    chunks.push(std::mem::replace(&mut current, part.to_owned()));
                } else if current.is_empty() {
                    current = part.to_owned();
                } else {
                    current.push(' ');
                    current.push_str(part);
                }
            }
            if !current.is_empty() {
                chunks.push(current);
            }
        }
        Ok(chunks)
    }
}

/// The pieces of a phoneme string between clause breaks: whitespace after
/// `,` `;` `:` or `—` (the reference's `(?<=[,;:—])\s+`).
fn clauses(ps: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut cut, mut at) = (0, 0);
    let mut prev: Option<char> = None;
    while let Some(c) = ps[at..].chars().next() {
        if pystr::is_space_char(c) && prev.is_some_and(|p| ",;:—".contains(p)) {
            let run = ps[at..]
                .find(|c: char| !pystr::is_space_char(c))
                .unwrap_or(ps.len() - at);
            parts.push(&ps[cut..at]);
            at += run;
            cut = at;
            prev = ps[..at].chars().next_back();
            continue;
        }
        prev = Some(c);
        at += c.len_utf8();
    }
    parts.push(&ps[cut..]);
    parts
}

/// The paragraphs of a text: pieces between line breaks, a run of blank
/// lines counting as one break (the reference's `re.split(r"\n\s*\n|\n")`).
fn paragraphs(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut cut, mut at) = (0, 0);
    while let Some(found) = text[at..].find('\n') {
        let start = at + found;
        // The whitespace after this newline; the break runs to its last newline.
        let after = start + 1;
        let run = text[after..]
            .find(|c: char| !pystr::is_space_char(c))
            .unwrap_or(text.len() - after);
        let end = match text[after..after + run].rfind('\n') {
            Some(last) => after + last + 1,
            None => after,
        };
        pieces.push(&text[cut..start]);
        cut = end;
        at = end;
    }
    pieces.push(&text[cut..]);
    pieces
}

/// Where a sentence may end in `para`: (start, end) of each match of the
/// reference's `(?<=[.!?…])["”’)\]]*\s+(?=\S)`, the closing quotes and the
/// whitespace after end punctuation, when more text follows.
fn sentence_breaks(para: &str) -> Vec<(usize, usize)> {
    let mut breaks = Vec::new();
    let mut at = 0;
    let mut prev: Option<char> = None;
    while at < para.len() {
        if prev.is_some_and(|p| ".!?…".contains(p)) {
            let rest = &para[at..];
            let quotes = rest.find(|c: char| !"\"”’)]".contains(c)).unwrap_or(rest.len());
            let after_quotes = &rest[quotes..];
            let spaces = after_quotes
                .find(|c: char| !pystr::is_space_char(c))
                .unwrap_or(after_quotes.len());
            if spaces > 0 && spaces < after_quotes.len() {
                let end = at + quotes + spaces;
                breaks.push((at, end));
                prev = para[..end].chars().next_back();
                at = end;
                continue;
            }
        }
        let Some(c) = para[at..].chars().next() else { break };
        prev = Some(c);
        at += c.len_utf8();
    }
    breaks
}

/// Whether the break at `end` (just after the end punctuation) ends a
/// sentence: not before a lowercase word, and not after a title or an
/// initial ("Dr. Smith", "J. K. Rowling").
fn ends_sentence(para: &str, end: usize, next: char, titles: &HashSet<String>) -> bool {
    if pystr::is_lower(next.encode_utf8(&mut [0; 4])) {
        return false;
    }
    if !para[..end].ends_with('.') {
        return true;
    }
    let from = para[..end].rfind(' ').map_or(0, |i| i + 1);
    let word = para.get(from..end - 1).unwrap_or("");
    let word = word.trim_start_matches(['(', '"', '“', '\'', '‘']);
    !(titles.contains(word) || (pystr::len(word) == 1 && pystr::is_upper(word)))
}

/// The sentences of `text` (the reference's `Hibari.split_sentences`):
/// paragraphs split at line breaks, then at end punctuation followed by
/// whitespace, except after a title from `titles` (see [`G2p::titles`]) or a
/// single capital ("J. K."), or before a lowercase word. Blank pieces are dropped.
pub fn split_sentences(text: &str, titles: &HashSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for para in paragraphs(pystr::strip(text)) {
        let para = pystr::strip(para);
        let mut cut = 0;
        for (start, end) in sentence_breaks(para) {
            let Some(next) = para[end..].chars().next() else {
                continue;
            };
            if ends_sentence(para, start, next, titles) {
                out.push(para[cut..start].to_owned());
                cut = end;
            }
        }
        out.push(para[cut..].to_owned());
    }
    out.retain(|s| !pystr::strip(s).is_empty());
    out
}

/// The titles `split_sentences` keeps a period after, read from the
/// `normalize.json` in `dir` (what [`G2p::titles`] holds).
pub fn load_titles(dir: &Path) -> Result<HashSet<String>, G2pError> {
    let tables = normalize::Tables::load(dir)?;
    Ok(tables.titles.keys().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn titles() -> HashSet<String> {
        ["Dr", "Mr", "St"].map(String::from).into_iter().collect()
    }

    #[test]
    fn paragraphs_split_at_line_breaks() {
        assert_eq!(paragraphs("a\n\n  \nb\nc"), vec!["a", "b", "c"]);
        assert_eq!(paragraphs("a\n \tb"), vec!["a", " \tb"]);
        assert_eq!(paragraphs("a\n"), vec!["a", ""]);
        assert_eq!(paragraphs("abc"), vec!["abc"]);
    }

    #[test]
    fn sentences_split_but_not_after_titles_and_initials() {
        // As in the reference, the closing bracket or quote after the end
        // punctuation goes with the break, not the sentence.
        let split = |t: &str| split_sentences(t, &titles());
        assert_eq!(split("Dr. Smith came. He sat."), vec!["Dr. Smith came.", "He sat."]);
        assert_eq!(
            split("J. K. Rowling wrote. (Yes.) \"Done!\" he said."),
            vec!["J. K. Rowling wrote.", "(Yes.", "\"Done!\" he said."]
        );
        assert_eq!(split("Wait... what? no."), vec!["Wait... what? no."]);
        assert_eq!(split("One.\n\nTwo.  \n"), vec!["One.", "Two."]);
        assert!(split("  \n ").is_empty());
    }

    #[test]
    fn clauses_split_after_clause_punctuation() {
        assert_eq!(clauses("a, b;  c d: e—\tf"), vec!["a,", "b;", "c d:", "e—", "f"]);
        assert_eq!(clauses("a b"), vec!["a b"]);
    }
}
