//! Whisper (CTranslate2 weights) in plain Rust: log-mel features, the
//! encoder and decoder, greedy decoding with Whisper's timestamp rules, and
//! the sequential long-form algorithm of faster-whisper 1.2.1
//! (`beam_size=1, temperature=0, condition_on_previous_text`).
//!
//! Not implemented: temperature fallback (so the compression ratio, which
//! only decides a fallback, is not computed), word timestamps, VAD, beam
//! search, language detection (the English-only models need none).
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod decode;
mod device;
mod format;
mod linear;
pub mod mel;
mod model;
mod tokenizer;

pub use linear::fast_exp;
pub use tokenizer::Specials;

use decode::Net;
use device::DeviceModel;
/// What runs the encoder and decoder: the kernels, or candle on its device.
/// One model definition either way: the same `model.bin`, read and checked
/// the same way, decoded by the same rules.
pub use gantry_kernels::backend::{Backend, BackendError, Device};
use model::{Model, N_FRAMES, N_TEXT_CTX};

/// Why the model did not load or run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file of the model is missing.
    #[error("{} is missing (fetch the model with `gantry models pull whisper-tiny-en`)", path.display())]
    Missing { path: PathBuf },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `model.bin` is not the format expected.
    #[error("{} is not a CTranslate2 model.bin: {message}", path.display())]
    Format { path: PathBuf, message: String },
    /// A tensor has the wrong shape.
    #[error("model.bin: {name} has shape {got:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// `tokenizer.json` is unusable.
    #[error("{}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    /// The model or its `config.json` is not a Whisper this engine runs.
    #[error("unsupported model: {0}")]
    Config(String),
    /// The device failed (out of memory, a lost GPU) or is not there.
    #[error("the model's device: {0}")]
    Device(String),
}

/// The loaded weights of one backend.
#[derive(Debug)]
enum Engine {
    Kernels(Box<Model>),
    Candle(Box<DeviceModel>),
}

impl Engine {
    fn vocab(&self) -> usize {
        match self {
            Self::Kernels(model) => model.vocab(),
            Self::Candle(model) => model.vocab(),
        }
    }
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, EngineError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            EngineError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            EngineError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// How to transcribe.
#[derive(Debug, Clone)]
pub struct TranscribeOptions {
    /// Threads to use; 0 means one per core.
    pub threads: usize,
    /// Give each window the text of the ones before as a prompt.
    pub condition_on_previous_text: bool,
    /// Token ids to prompt the first window with (faster-whisper's
    /// `initial_prompt` given as ids).
    pub initial_prompt_tokens: Option<Vec<u32>>,
    /// Set (from any thread) to stop at the next decoding step: the
    /// transcript ends `cancelled` with the segments already given.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            condition_on_previous_text: true,
            initial_prompt_tokens: None,
            stop: None,
        }
    }
}

/// A piece of the transcript with its time span.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Start, seconds from the beginning of the audio.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// The text (with its leading space, as Whisper writes it).
    pub text: String,
    /// The token ids, timestamps included.
    pub tokens: Vec<u32>,
    /// The mean log-probability of the window's tokens.
    pub avg_logprob: f64,
    /// The probability of `<|nocaptions|>` at the window's start.
    pub no_speech_prob: f64,
}

/// The result of [`Whisper::transcribe`].
#[derive(Debug, Clone)]
pub struct Transcript {
    pub segments: Vec<Segment>,
    /// The segments' text joined, trimmed.
    pub text: String,
    pub language: &'static str,
    /// Seconds of audio.
    pub duration: f64,
    /// Whether `on_segment` stopped the transcription early.
    pub cancelled: bool,
}

/// The decoding settings of faster-whisper that this engine follows.
const NO_SPEECH_THRESHOLD: f64 = 0.6;
const LOG_PROB_THRESHOLD: f64 = -1.0;
const MAX_INITIAL_TIMESTAMP: f64 = 1.0;
/// Seconds per timestamp token.
const TIME_PRECISION: f64 = 0.02;
/// Seconds per mel frame.
const TIME_PER_FRAME: f64 = mel::HOP as f64 / mel::SAMPLE_RATE as f64;
/// Mel frames per encoder position.
const INPUT_STRIDE: usize = 2;

/// A loaded Whisper model; immutable, shared by concurrent jobs.
#[derive(Debug)]
pub struct Whisper {
    engine: Engine,
    tokenizer: tokenizer::Tokenizer,
    filters: Vec<f32>,
    suppress: Vec<u32>,
    suppress_begin: Vec<u32>,
}

fn ids(config: &serde_json::Value, key: &str) -> Result<Vec<u32>, EngineError> {
    let list = config
        .get(key)
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| EngineError::Config(format!("config.json has no {key} list")))?;
    list.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| EngineError::Config(format!("config.json: {key} holds {v}")))
        })
        .collect()
}

impl Whisper {
    /// Loads `model.bin`, `tokenizer.json` and `config.json` from `dir`,
    /// for the kernels on the CPU.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        Self::load_on(dir, &Backend::Kernels)
    }

    /// [`Whisper::load`] for `backend`.
    pub fn load_on(dir: &Path, backend: &Backend) -> Result<Self, EngineError> {
        let config_path = dir.join("config.json");
        let config: serde_json::Value = serde_json::from_slice(&read_file(&config_path)?)
            .map_err(|e| EngineError::Config(format!("{}: {e}", config_path.display())))?;
        let tokenizer = tokenizer::Tokenizer::load(&dir.join("tokenizer.json"))?;
        let file = format::ModelFile::open(&dir.join("model.bin"))?;
        if file.revision < 3 {
            return Err(EngineError::Config(format!(
                "WhisperSpec revision {} (3 or later expected)",
                file.revision
            )));
        }
        let engine = match backend {
            Backend::Kernels => Engine::Kernels(Box::new(Model::from_file(file)?)),
            Backend::Candle(device) => Engine::Candle(Box::new(DeviceModel::from_file(file, device)?)),
        };
        let sp = tokenizer.specials;
        let vocab = engine.vocab();
        if vocab as u32 <= sp.timestamp_begin + 1500 {
            return Err(EngineError::Config(format!(
                "the vocabulary has {vocab} tokens: too few for the timestamps from {}",
                sp.timestamp_begin
            )));
        }
        // faster-whisper's default suppress_tokens=[-1]: the non-speech
        // symbols (config.json's suppress_ids, the same list) and the
        // task tokens.
        let mut suppress = ids(&config, "suppress_ids")?;
        suppress.extend([
            sp.transcribe,
            sp.translate,
            sp.sot,
            sp.sot_prev,
            sp.sot_lm,
            sp.no_speech,
        ]);
        suppress.sort_unstable();
        suppress.dedup();
        let suppress_begin = ids(&config, "suppress_ids_begin")?;
        Ok(Self {
            engine,
            tokenizer,
            filters: mel::mel_filters(),
            suppress,
            suppress_begin,
        })
    }

    /// The special token ids.
    pub fn specials(&self) -> Specials {
        self.tokenizer.specials
    }

    /// The text of some token ids (special tokens left out).
    pub fn decode_tokens(&self, tokens: &[u32]) -> String {
        self.tokenizer.decode(tokens)
    }

    /// The log-mel features of 16 kHz mono samples (`N_MELS × frames`, mel-major).
    pub fn features(&self, samples: &[f32], threads: usize) -> mel::LogMel {
        mel::log_mel(samples, &self.filters, linear::resolve_threads(threads))
    }

    /// Which backend runs the model: `kernels`, or candle's device.
    pub fn backend_name(&self) -> String {
        gantry_kernels::backend::name(match &self.engine {
            Engine::Kernels(_) => None,
            Engine::Candle(model) => Some(model.device()),
        })
    }

    /// The encoder's output (`1500 × d_model`, row-major) for a window of
    /// features (`80 × 3000`, mel-major).
    pub fn encode(&self, window: &[f32], threads: usize) -> Result<Vec<f32>, EngineError> {
        match &self.engine {
            Engine::Kernels(model) => Ok(model.encode(window, linear::resolve_threads(threads))),
            Engine::Candle(model) => model
                .encode(window)?
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(device::device_error),
        }
    }

    /// Transcribes 16 kHz mono samples; `on_segment` sees each segment as it
    /// is final and may stop the transcription (`Break`).
    pub fn transcribe(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
        on_segment: &mut dyn FnMut(&Segment) -> ControlFlow<()>,
    ) -> Result<Transcript, EngineError> {
        let threads = linear::resolve_threads(opts.threads);
        let duration = samples.len() as f64 / mel::SAMPLE_RATE as f64;
        let mel = self.features(samples, threads);
        let content_frames = mel.frames.saturating_sub(1);
        let sp = self.tokenizer.specials;
        let max_initial = sp.timestamp_begin + (MAX_INITIAL_TIMESTAMP / TIME_PRECISION).round() as u32;
        let rules = decode::Rules {
            specials: sp,
            timestamp_end: self.engine.vocab() as u32 - 1,
            max_initial_timestamp: max_initial,
            suppress: &self.suppress,
            suppress_begin: &self.suppress_begin,
        };
        let mut all_tokens: Vec<u32> = opts.initial_prompt_tokens.clone().unwrap_or_default();
        let mut prompt_reset_since = 0usize;
        let mut segments = Vec::new();
        let mut cancelled = false;
        let mut seek = 0usize;
        let stop = opts.stop.as_deref();
        let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
        'windows: while seek < content_frames {
            if stopped() {
                cancelled = true;
                break;
            }
            let time_offset = seek as f64 * TIME_PER_FRAME;
            let segment_size = N_FRAMES.min(content_frames - seek);
            let segment_duration = segment_size as f64 * TIME_PER_FRAME;
            let window = mel.window(seek, segment_size, N_FRAMES);
            let previous = &all_tokens[prompt_reset_since..];
            let mut prompt = Vec::new();
            if !previous.is_empty() {
                prompt.push(sp.sot_prev);
                let keep = N_TEXT_CTX / 2 - 1;
                prompt.extend_from_slice(&previous[previous.len().saturating_sub(keep)..]);
            }
            prompt.push(sp.sot);
            let decoded = match &self.engine {
                Engine::Kernels(model) => {
                    let cross = model.cross_kv(&model.encode(&window, threads), threads);
                    decode::greedy(model.as_ref(), &cross, &prompt, &rules, threads, stop)
                }
                Engine::Candle(model) => {
                    let cross = model.cross(&window)?;
                    decode::greedy(model.as_ref(), &cross, &prompt, &rules, threads, stop)
                }
            };
            let Some(result) = decoded? else {
                cancelled = true;
                break;
            };
            let n = result.tokens.len() as f64;
            let avg_logprob = result.sum_logprob / (n + 1.0);
            if result.no_speech_prob > NO_SPEECH_THRESHOLD && avg_logprob <= LOG_PROB_THRESHOLD {
                seek += segment_size;
                continue;
            }
            let (pieces, next_seek) = split_by_timestamps(
                &result.tokens,
                sp.timestamp_begin,
                time_offset,
                segment_size,
                segment_duration,
                seek,
            );
            seek = next_seek;
            for (start, end, tokens) in pieces {
                let text = self.tokenizer.decode(&tokens);
                if start == end || text.trim().is_empty() {
                    continue;
                }
                all_tokens.extend_from_slice(&tokens);
                let segment = Segment {
                    start,
                    end,
                    text,
                    tokens,
                    avg_logprob,
                    no_speech_prob: result.no_speech_prob,
                };
                let flow = on_segment(&segment);
                segments.push(segment);
                if flow.is_break() {
                    cancelled = true;
                    break 'windows;
                }
            }
            if !opts.condition_on_previous_text {
                prompt_reset_since = all_tokens.len();
            }
        }
        let text = segments
            .iter()
            .map(|s| s.text.as_str())
            .collect::<String>()
            .trim()
            .to_string();
        Ok(Transcript {
            segments,
            text,
            language: "en",
            duration,
            cancelled,
        })
    }
}

/// A window's tokens cut into segments at consecutive timestamps, as
/// faster-whisper's `_split_segments_by_timestamps`: the pieces (start, end,
/// tokens) and where the next window starts.
fn split_by_timestamps(
    tokens: &[u32],
    ts_begin: u32,
    time_offset: f64,
    segment_size: usize,
    segment_duration: f64,
    seek: usize,
) -> (Vec<(f64, f64, Vec<u32>)>, usize) {
    let is_ts = |t: u32| t >= ts_begin;
    let n = tokens.len();
    let single_timestamp_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
    let consecutive: Vec<usize> = (1..n).filter(|&i| is_ts(tokens[i]) && is_ts(tokens[i - 1])).collect();
    let mut pieces = Vec::new();
    if !consecutive.is_empty() {
        let mut slices = consecutive;
        if single_timestamp_ending {
            slices.push(n);
        }
        let mut last = 0;
        for &cut in &slices {
            let piece = &tokens[last..cut];
            let start = time_offset + f64::from(piece[0].saturating_sub(ts_begin)) * TIME_PRECISION;
            let end = time_offset + f64::from(piece[piece.len() - 1].saturating_sub(ts_begin)) * TIME_PRECISION;
            pieces.push((start, end, piece.to_vec()));
            last = cut;
        }
        let next = if single_timestamp_ending {
            seek + segment_size
        } else {
            seek + (tokens[last - 1] - ts_begin) as usize * INPUT_STRIDE
        };
        (pieces, next)
    } else {
        let mut duration = segment_duration;
        if let Some(&last) = tokens.iter().rev().find(|t| is_ts(**t))
            && last != ts_begin
        {
            duration = f64::from(last - ts_begin) * TIME_PRECISION;
        }
        pieces.push((time_offset, time_offset + duration, tokens.to_vec()));
        (pieces, seek + segment_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TS: u32 = 50363;

    #[test]
    fn the_model_is_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Whisper>();
    }

    #[test]
    fn segments_split_at_consecutive_timestamps() {
        // <|0.00|> a b <|1.00|><|1.00|> c <|2.00|> (no closing pair: seek to 1.00 s)
        let tokens = [TS, 1, 2, TS + 50, TS + 50, 3, TS + 100];
        let (pieces, seek) = split_by_timestamps(&tokens, TS, 10.0, 3000, 30.0, 1000);
        assert_eq!(pieces.len(), 2);
        assert_eq!((pieces[0].0, pieces[0].1), (10.0, 11.0));
        assert_eq!(pieces[0].2, vec![TS, 1, 2, TS + 50]);
        assert_eq!((pieces[1].0, pieces[1].1), (11.0, 12.0));
        // A single timestamp at the end: the whole window is done.
        assert_eq!(seek, 1000 + 3000);
        let tokens = [TS, 1, TS + 50, TS + 50, 3, TS + 75, TS + 75];
        let (pieces, seek) = split_by_timestamps(&tokens, TS, 0.0, 3000, 30.0, 0);
        assert_eq!(pieces.len(), 2);
        assert_eq!(seek, 150);
        // No consecutive timestamps: one segment to the last timestamp.
        let (pieces, seek) = split_by_timestamps(&[TS, 1, 2, TS + 40], TS, 5.0, 2000, 20.0, 500);
        assert_eq!(pieces, vec![(5.0, 5.0 + 0.8, vec![TS, 1, 2, TS + 40])]);
        assert_eq!(seek, 2500);
    }
}
