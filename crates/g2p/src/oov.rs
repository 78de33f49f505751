//! Words no rule can read go to a small character transformer (`oov.onnx`,
//! `oov_gb.onnx`, about 0.65M parameters) trained on espeak-ng's readings, so
//! unknown words sound the way the reference pipeline read them. One run per
//! word; the output is CTC-style: repeats collapse and blanks (0) drop.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use gantry_onnx::{Session, Tensor};
use serde::Deserialize;

use crate::G2pError;
use crate::assets::load_json;

/// `oov.json`: the input and output alphabets (id = index + 1) and the
/// longest input the model takes.
#[derive(Deserialize)]
struct Meta {
    #[serde(rename = "in")]
    input: Vec<String>,
    #[serde(rename = "out")]
    output: Vec<String>,
    maxlen: usize,
}

/// The model and its alphabets. `Session::run` needs `&mut`, so the one
/// session is behind a lock; a word takes well under a millisecond.
pub(crate) struct Oov {
    input: HashMap<char, i64>,
    output: Vec<String>,
    maxlen: usize,
    session: Mutex<Session>,
}

impl Oov {
    /// Loads `<stem>.onnx` and `<stem>.json` from `dir` (ONNX Runtime must
    /// already be initialised in this process).
    pub(crate) fn load(dir: &Path, stem: &str) -> Result<Oov, G2pError> {
        let meta: Meta = load_json(dir, &format!("{stem}.json"))?;
        let mut input = HashMap::new();
        for (i, symbol) in meta.input.iter().enumerate() {
            let mut chars = symbol.chars();
            // Python keys the map by the string; only one-character strings
            // can ever equal a character of a word.
            if let (Some(c), None) = (chars.next(), chars.next()) {
                input.insert(c, i64::try_from(i + 1).unwrap_or(i64::MAX));
            }
        }
        let session = gantry_onnx::session(&dir.join(format!("{stem}.onnx")), 1)?;
        Ok(Oov {
            input,
            output: meta.output,
            maxlen: meta.maxlen,
            session: Mutex::new(session),
        })
    }

    /// The phonemes of `word`; `None` when none of its characters is in the
    /// model's alphabet.
    pub(crate) fn read(&self, word: &str) -> Result<Option<String>, G2pError> {
        let ids: Vec<i64> = word
            .chars()
            .filter_map(|c| self.input.get(&c).copied())
            .take(self.maxlen)
            .collect();
        if ids.is_empty() {
            return Ok(None);
        }
        let failed = |e: gantry_onnx::ort::Error| G2pError::Oov(e.to_string());
        let chars = Tensor::from_array(([1usize, ids.len()], ids)).map_err(failed)?;
        let out: Vec<i64> = {
            let mut session = self
                .session
                .lock()
                .map_err(|_| G2pError::Oov("a thread panicked while holding the OOV model".to_owned()))?;
            let outputs = session
                .run(gantry_onnx::ort::inputs!["chars" => chars])
                .map_err(failed)?;
            let (_, ids) = outputs[0].try_extract_tensor::<i64>().map_err(failed)?;
            ids.to_vec()
        };
        let mut phonemes = String::new();
        let mut prev = 0;
        for id in out {
            if id != prev && id != 0 {
                let symbol = usize::try_from(id - 1)
                    .ok()
                    .and_then(|i| self.output.get(i))
                    .ok_or_else(|| G2pError::Oov(format!("output id {id} is outside the alphabet")))?;
                phonemes.push_str(symbol);
            }
            prev = id;
        }
        Ok(Some(phonemes))
    }
}
