//! `kokoro-hibari`: a small English voice distilled from Kokoro (the
//! `hibari-tts` package, Apache-2.0), 24 kHz.
//!
//! Text goes through the package's own G2P ([`gantry_g2p`]: normalisation,
//! tokenisation, a part-of-speech tagger, lexicons, and a character model for
//! words no lexicon has) into phonemes in Kokoro's alphabet, at most 400 per
//! chunk; each chunk's ids (`0, p1, p2, …, 0`, from `vocab.json`) go through
//! the int8 ONNX graph once, which answers five spectra and an F0 curve per
//! 12.5 ms frame; [`crate::vocoder`] makes the waveform.
//!
//! The vocoder's noise is seeded from the chunk's phonemes, so the same text
//! always gives the same samples.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gantry_onnx::Tensor;
use serde_json::Value;

use crate::vocoder::{BINS, Frames, Vocoder};
use crate::{LoadError, Pool, Utterance};

/// The phoneme-to-id table, the voice registry and the G2P, loaded.
pub struct Frontend {
    g2p: gantry_g2p::G2p,
    vocab: HashMap<char, i64>,
    vocoder: Vocoder,
}

impl Frontend {
    /// Reads `dir`: the registry entry of `voice` in `voices.json` names the
    /// graph's file and whether the voice is British (which G2P variant
    /// reads for it). Returns the graph's path and the front end.
    pub fn load(dir: &Path, voice: &str) -> Result<(PathBuf, Self), LoadError> {
        let config = |path: &Path, reason: String| LoadError::Config {
            path: path.to_path_buf(),
            reason,
        };
        let read_json = |name: &str| -> Result<Value, LoadError> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| config(&path, e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| config(&path, e.to_string()))
        };
        let voices_path = dir.join("voices.json");
        let voices = read_json("voices.json")?;
        let entry = voices.get(voice).ok_or_else(|| {
            let known: Vec<&str> = voices
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            config(
                &voices_path,
                format!("no voice '{voice}' (the registry has: {})", known.join(", ")),
            )
        })?;
        let file = entry["file"]
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains(".."))
            .ok_or_else(|| config(&voices_path, format!("voice '{voice}' names no graph file")))?;
        let british = entry["british"].as_bool().unwrap_or(false);
        let graph = dir.join(file);
        if !graph.is_file() {
            return Err(config(
                &graph,
                format!("voice '{voice}' needs this graph file, which is not in the model directory"),
            ));
        }
        let vocab_path = dir.join("vocab.json");
        let vocab = read_json("vocab.json")?
            .as_object()
            .ok_or_else(|| config(&vocab_path, "not an object of phoneme → id".to_owned()))?
            .iter()
            .filter_map(|(phoneme, id)| {
                let mut chars = phoneme.chars();
                match (chars.next(), chars.next(), id.as_i64()) {
                    (Some(c), None, Some(id)) => Some((c, id)),
                    _ => None,
                }
            })
            .collect::<HashMap<char, i64>>();
        if vocab.len() < 40 {
            return Err(config(&vocab_path, format!("only {} phonemes", vocab.len())));
        }
        let g2p = gantry_g2p::G2p::load(dir, british).map_err(|e| config(dir, format!("G2P: {e}")))?;
        Ok((
            graph,
            Self {
                g2p,
                vocab,
                vocoder: Vocoder::new(),
            },
        ))
    }

    /// The phoneme chunks of `text` (each at most 400 phonemes). The G2P
    /// cannot read a few things (numbers of 36 digits or more, numerals such
    /// as `①` on its unknown-word path): such a sentence is read again
    /// without its non-ASCII numerals, and what still fails is bad input.
    pub(crate) fn phonemes(&self, text: &str) -> Result<Vec<String>, LoadError> {
        let unreadable = |e: gantry_g2p::G2pError| {
            let shown: String = text.chars().take(80).collect();
            let more = if text.chars().count() > 80 { "…" } else { "" };
            LoadError::Unreadable(format!("cannot read {shown:?}{more} aloud: {e}"))
        };
        match self.g2p.chunks(text) {
            Ok(chunks) => Ok(chunks),
            Err(first) => {
                let plain: String = text
                    .chars()
                    .map(|c| if c.is_numeric() && !c.is_ascii_digit() { ' ' } else { c })
                    .collect();
                if plain == text {
                    return Err(unreadable(first));
                }
                self.g2p.chunks(&plain).map_err(unreadable)
            }
        }
    }

    /// The graph's ids of every chunk, each framed by the pad id 0, and the
    /// phonemes the vocabulary lacks (left out).
    pub(crate) fn ids(&self, chunks: &[String]) -> (Vec<i64>, Vec<char>) {
        let mut ids = Vec::new();
        let mut missing = Vec::new();
        for chunk in chunks {
            let (chunk_ids, chunk_missing) = self.chunk_ids(chunk);
            ids.extend(chunk_ids);
            missing.extend(chunk_missing);
        }
        (ids, missing)
    }

    fn chunk_ids(&self, chunk: &str) -> (Vec<i64>, Vec<char>) {
        let mut ids = vec![0];
        let mut missing = Vec::new();
        for c in chunk.chars() {
            match self.vocab.get(&c) {
                Some(&id) => ids.push(id),
                None => missing.push(c),
            }
        }
        ids.push(0);
        (ids, missing)
    }

    /// Speaks `text` at `speed` (1 is the voice's own pace), blocking.
    pub(crate) fn synthesize(&self, text: &str, speed: f32, sessions: &Pool) -> Result<Utterance, LoadError> {
        let chunks = self.phonemes(text)?;
        let mut utterance = Utterance {
            phonemes: chunks.join(" "),
            ids: Vec::new(),
            missing: Vec::new(),
            audio: Vec::new(),
        };
        for chunk in &chunks {
            let (ids, missing) = self.chunk_ids(chunk);
            utterance.missing.extend(missing);
            if ids.len() >= 3 {
                let audio = self.render(&ids, speed, 1.0, seed_of(chunk), sessions)?;
                utterance.audio.extend_from_slice(&audio);
            }
            utterance.ids.extend(ids);
        }
        Ok(utterance)
    }

    /// The audio of one chunk's ids: the graph, then the vocoder with its
    /// noise scaled by `noise_scale` (1 as trained, 0 none) and drawn from `seed`.
    pub(crate) fn render(
        &self,
        ids: &[i64],
        speed: f32,
        noise_scale: f32,
        seed: u64,
        sessions: &Pool,
    ) -> Result<Vec<f32>, LoadError> {
        let spectra = sessions.with(|session| run(session, ids, speed))?;
        self.vocoder
            .synthesize(&spectra.frames(), seed, noise_scale)
            .map_err(LoadError::Graph)
    }
}

/// What one run of the graph answers, copied out of the session.
struct Spectra {
    parts: [Vec<f32>; 5],
    f0: Vec<f32>,
}

impl Spectra {
    fn frames(&self) -> Frames<'_> {
        let [lh, theta, ln, lr, phi] = &self.parts;
        Frames {
            lh,
            theta,
            ln,
            lr,
            phi,
            f0: &self.f0,
        }
    }
}

/// One run: `ids` [1, n] int64 and `speed` [1] in; `lh`, `theta`, `ln`,
/// `lr`, `phi` [1, 601, F] and `f0` [1, F] out.
fn run(session: &mut gantry_onnx::Session, ids: &[i64], speed: f32) -> Result<Spectra, LoadError> {
    let graph = |e: gantry_onnx::ort::Error| LoadError::Graph(e.to_string());
    let input = Tensor::from_array(([1usize, ids.len()], ids.to_vec())).map_err(graph)?;
    let speed = Tensor::from_array(([1usize], vec![speed])).map_err(graph)?;
    let outputs = session
        .run(gantry_onnx::ort::inputs!["ids" => input, "speed" => speed])
        .map_err(graph)?;
    let take = |name: &str| -> Result<Vec<f32>, LoadError> {
        let value = outputs
            .get(name)
            .ok_or_else(|| LoadError::Graph(format!("the graph has no output '{name}'")))?;
        let (_, data) = value.try_extract_tensor::<f32>().map_err(graph)?;
        Ok(data.to_vec())
    };
    let parts = [take("lh")?, take("theta")?, take("ln")?, take("lr")?, take("phi")?];
    let f0 = take("f0")?;
    if parts[0].len() != BINS * f0.len() {
        return Err(LoadError::Graph(format!(
            "lh has {} values for {} frames of {BINS} bins",
            parts[0].len(),
            f0.len()
        )));
    }
    Ok(Spectra { parts, f0 })
}

/// A seed from a chunk's phonemes (FNV-1a), so the same text sounds the same.
fn seed_of(chunk: &str) -> u64 {
    chunk.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
