//! CLIP's byte-level BPE tokenizer (the one of OpenAI CLIP and open_clip's
//! `SimpleTokenizer`): lower-cased, whitespace-collapsed text is split into
//! words, numbers and punctuation runs, each word's UTF-8 bytes are mapped to
//! printable characters and merged pair by pair in the order of the merges
//! list; the last symbol of a word carries `</w>`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Tokens a CLIP text encoder reads at once.
pub const CONTEXT_LENGTH: usize = 77;
pub const START_OF_TEXT: &str = "<|startoftext|>";
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A CLIP tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    encoder: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    byte_encoder: [char; 256],
    start: u32,
    end: u32,
}

/// The printable character that stands for byte `b` in the vocabulary.
pub fn byte_symbol(b: u8) -> char {
    bytes_to_unicode()[b as usize]
}

/// GPT-2's map of bytes to printable characters.
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u32 {
        let printable = (u32::from(b'!')..=u32::from(b'~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            let c = char::from_u32(256 + n).unwrap_or('?');
            n += 1;
            c
        };
    }
    table
}

impl Tokenizer {
    /// From open_clip's `bpe_simple_vocab_16e6.txt.gz` (gzip-compressed or
    /// not): a header line, then merges, of which CLIP uses the first
    /// 49152 - 256 - 2.
    pub fn from_bpe_file(path: &Path) -> Result<Self, String> {
        let raw = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = if raw.starts_with(&[0x1f, 0x8b]) {
            let mut s = String::new();
            flate2::read::GzDecoder::new(&raw[..])
                .read_to_string(&mut s)
                .map_err(|e| format!("cannot decompress {}: {e}", path.display()))?;
            s
        } else {
            String::from_utf8(raw).map_err(|e| format!("{} is not UTF-8: {e}", path.display()))?
        };
        Self::from_bpe_merges(&text)
    }

    /// From the text of open_clip's merges file.
    pub fn from_bpe_merges(text: &str) -> Result<Self, String> {
        let merges: Vec<(String, String)> = text
            .lines()
            .skip(1)
            .take(49152 - 256 - 2)
            .map(parse_merge)
            .collect::<Result<_, _>>()?;
        // GPT-2's order: the printable bytes first, then the rest.
        let byte_encoder = bytes_to_unicode();
        let mut symbols: Vec<char> = byte_encoder.to_vec();
        symbols.sort_by_key(|c| u32::from(*c) >= 256);
        let mut vocab: Vec<String> = symbols.iter().map(|c| c.to_string()).collect();
        vocab.extend(symbols.iter().map(|c| format!("{c}</w>")));
        vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        vocab.push(START_OF_TEXT.to_owned());
        vocab.push(END_OF_TEXT.to_owned());
        let encoder = vocab.into_iter().enumerate().map(|(i, t)| (t, i as u32)).collect();
        Self::build(encoder, merges)
    }

    /// From a Hugging Face `vocab.json` and `merges.txt` (the `tokenizer/`
    /// folder of a diffusers repository).
    pub fn from_vocab_and_merges(vocab_json: &Path, merges_txt: &Path) -> Result<Self, String> {
        let vocab =
            std::fs::read_to_string(vocab_json).map_err(|e| format!("cannot read {}: {e}", vocab_json.display()))?;
        let encoder: HashMap<String, u32> =
            serde_json::from_str(&vocab).map_err(|e| format!("{} is not a vocabulary: {e}", vocab_json.display()))?;
        let merges =
            std::fs::read_to_string(merges_txt).map_err(|e| format!("cannot read {}: {e}", merges_txt.display()))?;
        let merges = merges
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.trim().is_empty())
            .map(parse_merge)
            .collect::<Result<Vec<_>, _>>()?;
        Self::build(encoder, merges)
    }

    fn build(encoder: HashMap<String, u32>, merges: Vec<(String, String)>) -> Result<Self, String> {
        let start = *encoder
            .get(START_OF_TEXT)
            .ok_or("the vocabulary has no <|startoftext|>")?;
        let end = *encoder.get(END_OF_TEXT).ok_or("the vocabulary has no <|endoftext|>")?;
        let ranks = merges.into_iter().enumerate().map(|(i, m)| (m, i)).collect();
        Ok(Self {
            encoder,
            ranks,
            byte_encoder: bytes_to_unicode(),
            start,
            end,
        })
    }

    /// The vocabulary (token → id), as a `vocab.json` holds it.
    pub fn vocab(&self) -> &HashMap<String, u32> {
        &self.encoder
    }

    /// The merges in priority order, as a `merges.txt` lists them.
    pub fn merges(&self) -> Vec<(String, String)> {
        let mut merges: Vec<_> = self.ranks.iter().map(|(m, r)| (*r, m.clone())).collect();
        merges.sort();
        merges.into_iter().map(|(_, m)| m).collect()
    }

    /// Id of `<|endoftext|>`.
    pub fn end_token(&self) -> u32 {
        self.end
    }

    /// Id of a token of the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.encoder.get(token).copied()
    }

    /// The BPE ids of `text`, without start and end tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let text = clean(text);
        let mut ids = Vec::new();
        for word in split(&text) {
            if word == START_OF_TEXT {
                ids.push(self.start);
                continue;
            }
            if word == END_OF_TEXT {
                ids.push(self.end);
                continue;
            }
            let mapped: Vec<String> = word
                .bytes()
                .map(|b| self.byte_encoder[b as usize].to_string())
                .collect();
            for piece in self.bpe(mapped) {
                if let Some(id) = self.encoder.get(&piece) {
                    ids.push(*id);
                }
            }
        }
        ids
    }

    /// `<|startoftext|>`, the ids of `text` (cut to fit) and
    /// `<|endoftext|>`, padded with `pad` to [`CONTEXT_LENGTH`].
    pub fn encode_padded(&self, text: &str, pad: u32) -> Vec<u32> {
        let mut ids = vec![self.start];
        let body = self.encode(text);
        ids.extend(body.iter().take(CONTEXT_LENGTH - 2));
        ids.push(self.end);
        ids.resize(CONTEXT_LENGTH, pad);
        ids
    }

    fn bpe(&self, mut word: Vec<String>) -> Vec<String> {
        if let Some(last) = word.last_mut() {
            last.push_str("</w>");
        }
        loop {
            let mut best: Option<(usize, usize)> = None;
            for i in 0..word.len().saturating_sub(1) {
                if let Some(&rank) = self.ranks.get(&(word[i].clone(), word[i + 1].clone()))
                    && best.is_none_or(|(r, _)| rank < r)
                {
                    best = Some((rank, i));
                }
            }
            let Some((_, at)) = best else { break };
            let (a, b) = (word[at].clone(), word[at + 1].clone());
            let mut merged = Vec::with_capacity(word.len());
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && word[i] == a && word[i + 1] == b {
                    merged.push(format!("{a}{b}"));
                    i += 2;
                } else {
                    merged.push(word[i].clone());
                    i += 1;
                }
            }
            word = merged;
            if word.len() == 1 {
                break;
            }
        }
        word
    }
}

fn parse_merge(line: &str) -> Result<(String, String), String> {
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!("bad merge line {line:?}")),
    }
}

/// HTML entities of the commonest kinds are unescaped, whitespace runs
/// become one space, the text is trimmed and lower-cased (ftfy's repairs
/// of mojibake are not reproduced).
fn clean(text: &str) -> String {
    let text = text
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'");
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// CLIP's pattern, `<|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|
/// [\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+`, as a scan.
fn split(text: &str) -> Vec<&str> {
    let is_letter = |c: char| c.is_alphabetic();
    let is_number = |c: char| c.is_numeric();
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let Some(c) = rest.chars().next() else { break };
        let take = if rest.starts_with(START_OF_TEXT) {
            START_OF_TEXT.len()
        } else if rest.starts_with(END_OF_TEXT) {
            END_OF_TEXT.len()
        } else if let Some(n) = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
            .iter()
            .find(|p| rest.starts_with(**p))
            .map(|p| p.len())
        {
            n
        } else if is_letter(c) {
            rest.find(|c: char| !is_letter(c)).unwrap_or(rest.len())
        } else if is_number(c) {
            c.len_utf8()
        } else if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        } else {
            rest.find(|c: char| c.is_whitespace() || is_letter(c) || is_number(c))
                .unwrap_or(rest.len())
        };
        out.push(&rest[..take]);
        i += take;
    }
    out
}
