//! BERT's WordPiece tokenizer, read from a Hugging Face `tokenizer.json`.
//!
//! The steps, in the order the reference implementation takes them:
//! 1. special tokens (`added_tokens`) written literally in the text are cut
//!    out first and become their own ids;
//! 2. the rest is normalized: control characters dropped, every kind of
//!    white space made a plain space, CJK ideographs set apart by spaces,
//!    accents stripped (NFD, then combining marks dropped) and the text
//!    lowercased, as the `BertNormalizer` settings say;
//! 3. split into words at white space, each punctuation character a word of
//!    its own;
//! 4. each word split greedily into the longest vocabulary pieces from the
//!    left, pieces after the first carrying the `##` prefix; a word with no
//!    such split (or longer than `max_input_chars_per_word`) is `[UNK]`.
//!
//! A sequence is then `[CLS] pieces… [SEP]`, cut to the model's length.
use std::collections::HashMap;

use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

/// Why a `tokenizer.json` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer.json: {0}")]
pub struct TokenizerError(String);

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    normalizer: Option<NormalizerConfig>,
    model: ModelConfig,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
}

#[derive(Deserialize)]
struct NormalizerConfig {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default = "yes")]
    clean_text: bool,
    #[serde(default = "yes")]
    handle_chinese_chars: bool,
    strip_accents: Option<bool>,
    #[serde(default = "yes")]
    lowercase: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct ModelConfig {
    #[serde(rename = "type")]
    kind: String,
    unk_token: String,
    #[serde(default = "double_hash")]
    continuing_subword_prefix: String,
    #[serde(default = "hundred")]
    max_input_chars_per_word: usize,
    vocab: HashMap<String, u32>,
}

fn double_hash() -> String {
    "##".into()
}

fn hundred() -> usize {
    100
}

/// A WordPiece tokenizer with BERT's normalization.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: HashMap<String, u32>,
    /// One more than the largest id (read per job: kept, not recounted).
    size: usize,
    /// Special tokens matched literally in the raw text, longest first.
    specials: Vec<(String, u32)>,
    unk: u32,
    cls: u32,
    sep: u32,
    prefix: String,
    max_word_chars: usize,
    clean_text: bool,
    chinese_chars: bool,
    strip_accents: bool,
    lowercase: bool,
}

impl Tokenizer {
    /// Reads a `tokenizer.json` whose model is WordPiece (BERT's).
    pub fn from_json(text: &str) -> Result<Self, TokenizerError> {
        let file: File = serde_json::from_str(text).map_err(|e| TokenizerError(e.to_string()))?;
        if file.model.kind != "WordPiece" {
            return Err(TokenizerError(format!(
                "the model is {}, not WordPiece",
                file.model.kind
            )));
        }
        let normalizer = match file.normalizer {
            Some(n) if n.kind == "BertNormalizer" => n,
            Some(n) => return Err(TokenizerError(format!("unsupported normalizer {}", n.kind))),
            None => return Err(TokenizerError("no normalizer (expected BertNormalizer)".into())),
        };
        let vocab = file.model.vocab;
        let id_of = |token: &str| {
            vocab
                .get(token)
                .copied()
                .ok_or_else(|| TokenizerError(format!("{token} is not in the vocabulary")))
        };
        let unk = id_of(&file.model.unk_token)?;
        let cls = id_of("[CLS]")?;
        let sep = id_of("[SEP]")?;
        let mut specials: Vec<(String, u32)> = file
            .added_tokens
            .into_iter()
            .filter(|t| !t.content.is_empty())
            .map(|t| (t.content, t.id))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        let size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        Ok(Self {
            vocab,
            size,
            specials,
            unk,
            cls,
            sep,
            prefix: file.model.continuing_subword_prefix,
            max_word_chars: file.model.max_input_chars_per_word,
            clean_text: normalizer.clean_text,
            chinese_chars: normalizer.handle_chinese_chars,
            strip_accents: normalizer.strip_accents.unwrap_or(normalizer.lowercase),
            lowercase: normalizer.lowercase,
        })
    }

    /// Number of ids (the vocabulary's size, special tokens included).
    pub fn vocab_size(&self) -> usize {
        self.size
    }

    /// The id of `[CLS]`, which opens every sequence.
    pub fn cls(&self) -> u32 {
        self.cls
    }

    /// The id of `[SEP]`, which closes every sequence.
    pub fn sep(&self) -> u32 {
        self.sep
    }

    /// The ids of `text`, without `[CLS]` and `[SEP]`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match self.next_special(rest) {
                Some((at, token, id)) => {
                    self.encode_plain(&rest[..at], &mut ids);
                    ids.push(id);
                    rest = &rest[at + token.len()..];
                }
                None => {
                    self.encode_plain(rest, &mut ids);
                    break;
                }
            }
        }
        ids
    }

    /// The earliest special token in `text` (the longest at that place).
    fn next_special<'a>(&'a self, text: &str) -> Option<(usize, &'a str, u32)> {
        let mut best: Option<(usize, &str, u32)> = None;
        for (token, id) in &self.specials {
            if let Some(at) = text.find(token.as_str())
                && best.is_none_or(|(b, t, _)| at < b || (at == b && token.len() > t.len()))
            {
                best = Some((at, token, *id));
            }
        }
        best
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let normalized = self.normalize(text);
        for word in split_words(&normalized) {
            self.word_pieces(word, ids);
        }
    }

    /// BERT's normalization of `text` (see the module's documentation).
    pub fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if self.clean_text {
                if c == '\0' || c == '\u{fffd}' || is_control(c) {
                    continue;
                }
                if is_whitespace(c) {
                    out.push(' ');
                    continue;
                }
            }
            if self.chinese_chars && is_cjk(c) {
                out.push(' ');
                out.push(c);
                out.push(' ');
            } else {
                out.push(c);
            }
        }
        if self.strip_accents {
            out = out
                .nfd()
                .filter(|&c| c.general_category() != GeneralCategory::NonspacingMark)
                .collect();
        }
        if self.lowercase {
            out = out.to_lowercase();
        }
        out
    }

    fn word_pieces(&self, word: &str, ids: &mut Vec<u32>) {
        if word.chars().count() > self.max_word_chars {
            ids.push(self.unk);
            return;
        }
        let start_len = ids.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while start < end {
                piece.clear();
                if start > 0 {
                    piece.push_str(&self.prefix);
                }
                piece.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(&piece) {
                    found = Some(id);
                    break;
                }
                // One character shorter (on a character boundary).
                end = word[..end].char_indices().next_back().map_or(start, |(i, _)| i);
            }
            match found {
                Some(id) => {
                    ids.push(id);
                    start = end;
                }
                None => {
                    ids.truncate(start_len);
                    ids.push(self.unk);
                    return;
                }
            }
        }
    }
}

/// Words at white space, each punctuation character a word of its own.
fn split_words(text: &str) -> impl Iterator<Item = &str> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                words.push(&text[s..i]);
            }
        } else if is_punctuation(c) {
            if let Some(s) = start.take() {
                words.push(&text[s..i]);
            }
            words.push(&text[i..i + c.len_utf8()]);
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(&text[s..]);
    }
    words.into_iter()
}

fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// Control and other invisible characters (Unicode's `C` categories), but
/// not the white space ones.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.general_category_group() == GeneralCategoryGroup::Other
}

/// ASCII punctuation (symbols such as `$` and `^` included) and Unicode's `P` categories.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || c.general_category_group() == GeneralCategoryGroup::Punctuation
}

/// CJK Unified Ideographs and their extensions and compatibility blocks.
fn is_cjk(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        let vocab: Vec<&str> = vec![
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",", "!", "un", "##aff", "##able", "cafe",
            "中", "the", "a", "##b",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| ((*t).to_owned(), serde_json::json!(i)))
            .collect();
        let json = serde_json::json!({
            "added_tokens": [{"id": 0, "content": "[PAD]"}, {"id": 1, "content": "[UNK]"}, {"id": 2, "content": "[CLS]"},
                             {"id": 3, "content": "[SEP]"}, {"id": 4, "content": "[MASK]"}],
            "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                           "strip_accents": null, "lowercase": true},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 10, "vocab": vocab},
        });
        Tokenizer::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn words_split_into_the_longest_pieces() {
        let t = tiny();
        assert_eq!(t.encode("Hello, WORLD!"), [5, 7, 6, 8]);
        assert_eq!(t.encode("unaffable"), [9, 10, 11]);
        // No split of the whole word: the word is one [UNK].
        assert_eq!(t.encode("unaffablex hello"), [1, 5]);
        // Too long a word.
        assert_eq!(t.encode("ababababababab"), [1]);
        assert_eq!(t.encode("ab"), [15, 16]);
    }

    #[test]
    fn text_is_normalized_like_bert() {
        let t = tiny();
        // Accents stripped, lowercased, ideographs set apart, controls dropped.
        assert_eq!(t.normalize("Café\u{7}\tX中Y"), "cafe x 中 y");
        assert_eq!(t.encode("CAFÉ中"), [12, 13]);
        assert_eq!(t.encode("  \n "), Vec::<u32>::new());
    }

    #[test]
    fn special_tokens_in_the_text_keep_their_ids() {
        let t = tiny();
        assert_eq!(t.encode("the [MASK] world"), [14, 4, 6]);
        assert_eq!(t.encode("[mask]"), [1, 1, 1]);
        assert_eq!((t.cls(), t.sep(), t.vocab_size()), (2, 3, 17));
    }

    #[test]
    fn other_tokenizers_are_refused() {
        let err = Tokenizer::from_json(r#"{"model": {"type": "BPE", "unk_token": "x", "vocab": {}}}"#).unwrap_err();
        assert!(err.to_string().contains("not WordPiece"), "{err}");
    }
}
