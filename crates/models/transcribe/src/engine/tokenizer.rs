//! The GPT-2 byte-level BPE vocabulary of `tokenizer.json`, for decoding
//! token ids to text, and Whisper's special tokens.
use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::EngineError;

/// Whisper's special token ids, read from `tokenizer.json`.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    pub eot: u32,
    pub sot: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub sot_lm: u32,
    pub sot_prev: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// `<|0.00|>`; the timestamps follow it in 0.02 s steps.
    pub timestamp_begin: u32,
}

/// Token ids to text.
#[derive(Debug)]
pub struct Tokenizer {
    /// The bytes of each ordinary token, by id.
    pieces: Vec<Vec<u8>>,
    pub specials: Specials,
}

/// GPT-2's map from the printable characters of the vocabulary to bytes.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        if let Some(c) = char::from_u32(c) {
            map.insert(c, b as u8);
        }
    }
    map
}

impl Tokenizer {
    /// Reads `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        let bytes = super::read_file(path)?;
        let bad = |message: String| EngineError::Tokenizer {
            path: path.to_path_buf(),
            message,
        };
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let vocab = json
            .pointer("/model/vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no model.vocab object".into()))?;
        let to_byte = unicode_to_byte();
        let mut pieces: Vec<Vec<u8>> = vec![Vec::new(); vocab.len()];
        for (piece, id) in vocab {
            let id = id
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .filter(|i| *i < pieces.len())
                .ok_or_else(|| bad(format!("token {piece:?} has a bad id")))?;
            pieces[id] = piece
                .chars()
                .map(|c| {
                    to_byte
                        .get(&c)
                        .copied()
                        .ok_or_else(|| bad(format!("token {piece:?} is not byte-level")))
                })
                .collect::<Result<_, _>>()?;
        }
        let mut added = HashMap::new();
        if let Some(list) = json.get("added_tokens").and_then(Value::as_array) {
            for t in list {
                if let (Some(content), Some(id)) = (
                    t.get("content").and_then(Value::as_str),
                    t.get("id").and_then(Value::as_u64),
                ) {
                    added.insert(content.to_string(), id as u32);
                }
            }
        }
        let special = |name: &str| {
            added
                .get(name)
                .copied()
                .ok_or_else(|| bad(format!("the special token {name} is missing")))
        };
        let no_timestamps = special("<|notimestamps|>")?;
        let specials = Specials {
            eot: special("<|endoftext|>")?,
            sot: special("<|startoftranscript|>")?,
            translate: special("<|translate|>")?,
            transcribe: special("<|transcribe|>")?,
            sot_lm: special("<|startoflm|>")?,
            sot_prev: special("<|startofprev|>")?,
            no_speech: special("<|nocaptions|>").or_else(|_| special("<|nospeech|>"))?,
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
        };
        Ok(Self { pieces, specials })
    }

    /// The text of `tokens`, leaving out special and timestamp tokens (as
    /// faster-whisper's `Tokenizer.decode`).
    pub fn decode(&self, tokens: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &t in tokens {
            if t < self.specials.eot
                && let Some(p) = self.pieces.get(t as usize)
            {
                bytes.extend_from_slice(p);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
