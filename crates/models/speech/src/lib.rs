//! Text to speech with Piper voices (VITS graphs exported to ONNX), run on
//! ONNX Runtime through [`gantry_onnx`], with phonemes from espeak-ng.
//!
//! A [`SpeechModel`] holds the voice's phoneme table, its default scales and
//! a small pool of ONNX Runtime sessions of its graph. A job's text is split
//! into sentences ([`sentences::split`]); each is turned into phonemes
//! (espeak-ng, IPA), then into ids (`^ _ p1 _ p2 _ … _ $`, Piper's layout),
//! then into audio by one session run, on a blocking thread. Every sentence
//! is sent as a stream chunk as soon as it is done, and the whole WAV goes
//! out as the job's file at the end.
//!
//! # Input
//!
//! | field    | type   | default | meaning |
//! |----------|--------|---------|---------|
//! | `prompt` | string |         | the text to speak, 1 ..= 5000 characters, not all whitespace |
//! | `voice`  | string | the model's | only the model's own voice (for `piper-en-us-joe`: `"joe"`) |
//! | `speed`  | number 0.5 ..= 2 | 1 | speaking rate; the voice's `length_scale` is divided by it |
//! | `format` | string | `"wav"` | `"wav"` (16-bit PCM), `"flac"` (lossless) or `"ogg"` (Vorbis), mono |
//! | `reference_audio` | string | | a recording of a speaker to sound like: URL, data: URL or base64 ([`clone`]) |
//!
//! Other fields are rejected; `null` counts as absent. All problems are
//! reported together in one `BadInput` message, separated by `"; "`.
//!
//! # Output
//!
//! ```json
//! {"audio_url": "<expiring URL of the WAV>", "duration": 2.37, "sample_rate": 22050,
//!  "format": "wav", "characters": 32, "sentences": 2}
//! ```
//!
//! With `reference_audio`, also `"voice_match": {"similarity", "base_similarity",
//! "pitch_scale", "equalizer"}`: the speaker-embedding similarity to the
//! reference of the matched voice and of the plain voice (on the calibration
//! utterance), and the transform chosen.
//!
//! Stream chunks, one per sentence, in order:
//! `{"index": 0, "text": "Hello there.", "audio_base64": "<a file of that sentence>",
//! "format": "wav", "sample_rate": 22050, "duration": 0.93}`, each a complete file in
//! the job's format. The chunks' samples, concatenated, are the whole file's (exactly,
//! for WAV and FLAC). The job bills `characters` (of the prompt).

pub mod clone;
mod factory;
pub mod formats;
pub mod hibari;
pub mod input;
pub mod phonemes;
pub mod sentences;
pub mod speaker;
pub mod vocoder;
pub mod wav;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use base64::Engine as _;
use gantry_onnx::{Session, Tensor};
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};

pub use crate::factory::{SpeechFactory, SpeechSettings};
use crate::phonemes::PhonemeIds;

/// How the model uses the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeechOptions {
    /// Intra-op threads of each ONNX Runtime session; 0 = one per core.
    pub threads: usize,
    /// Sessions (copies of the graph) that synthesise at the same time; jobs
    /// beyond that take turns, sentence by sentence.
    pub sessions: usize,
    /// Where the voice's graph runs: the CPU, or ONNX Runtime's CUDA
    /// provider (a GPU build of the runtime, `onnx_library`).
    pub device: gantry_onnx::Device,
}

impl Default for SpeechOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            sessions: 1,
            device: gantry_onnx::Device::Cpu,
        }
    }
}

/// Why a voice could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The voice config (`.onnx.json`) is missing or not a Piper config.
    #[error("voice config {}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// ONNX Runtime or the graph could not be loaded.
    #[error(transparent)]
    Onnx(#[from] gantry_onnx::OnnxError),
    /// espeak-ng cannot phonemize in the voice's language.
    #[error(transparent)]
    Phonemes(#[from] phonemes::PhonemeError),
    /// The graph ran but its output is not audio.
    #[error("the voice graph does not produce audio: {0}")]
    Graph(String),
    /// The text has something the phonemizer cannot read (bad input).
    #[error("{0}")]
    Unreadable(String),
}

/// The defaults a Piper voice config gives for synthesis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scales {
    pub noise_scale: f32,
    pub length_scale: f32,
    pub noise_w: f32,
}

/// A Piper voice, loaded.
#[derive(Clone)]
pub struct SpeechModel {
    id: String,
    inner: Arc<Voice>,
    matching: Option<Arc<Matching>>,
}

/// Longest reference recording fetched for voice matching.
pub const MAX_REFERENCE_BYTES: usize = 20 << 20;
/// Seconds of the reference recording that are used.
pub const REFERENCE_SECONDS: f64 = 20.0;
/// Shortest usable reference recording.
pub const MIN_REFERENCE_SECONDS: f64 = 1.0;
const REFERENCE_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// What the voice says to calibrate a match: varied vowels and consonants.
const CALIBRATION_TEXT: &str = "Would you like a cup of tea, or shall we go for a walk by the river before it rains?";
/// Fits kept per model, by the reference recording's bytes.
const FIT_CACHE: usize = 16;

/// Voice matching: the speaker encoder, the fetcher of reference URLs, the
/// voice's calibration utterance (made once) and the latest fits.
struct Matching {
    encoder: speaker::SpeakerEncoder,
    fetcher: gantry_net::Fetcher,
    calibration: std::sync::OnceLock<Vec<f32>>,
    fits: Mutex<Vec<(u64, usize, clone::Fit)>>,
}

struct Voice {
    /// The name users pass as `voice`.
    name: String,
    sample_rate: u32,
    sessions: Pool,
    engine: Engine,
}

/// How a voice turns text into the graph's input and the graph's output into audio.
enum Engine {
    /// A Piper (VITS) voice: espeak-ng phonemes, the graph outputs samples.
    Piper {
        /// The espeak-ng voice that phonemizes for it (e.g. `en-us`).
        espeak_voice: String,
        ids: PhonemeIds,
        scales: Scales,
    },
    /// `kokoro-hibari`: its own G2P, the graph outputs spectra that the
    /// vocoder turns into samples.
    Hibari(Box<hibari::Frontend>),
}

/// Sessions that callers borrow one at a time (`Session::run` needs `&mut`).
pub(crate) struct Pool {
    free: Mutex<Vec<Session>>,
    returned: Condvar,
}

impl Pool {
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Session) -> T) -> T {
        let mut free = self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut session = loop {
            if let Some(session) = free.pop() {
                break session;
            }
            free = self
                .returned
                .wait(free)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        };
        drop(free);
        // The session goes back even if `f` panics.
        struct Return<'a>(&'a Pool, Option<Session>);
        impl Drop for Return<'_> {
            fn drop(&mut self) {
                if let Some(session) = self.1.take() {
                    self.0
                        .free
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(session);
                    self.0.returned.notify_one();
                }
            }
        }
        let mut guard = Return(self, None);
        let result = f(&mut session);
        guard.1 = Some(session);
        result
    }
}

/// One synthesised piece of text.
#[derive(Debug, Clone, PartialEq)]
pub struct Utterance {
    /// The phonemes espeak-ng gave (with Piper's punctuation).
    pub phonemes: String,
    /// The ids the graph read.
    pub ids: Vec<i64>,
    /// Phonemes the voice has no id for (left out).
    pub missing: Vec<char>,
    /// The graph's float output.
    pub audio: Vec<f32>,
}

impl SpeechModel {
    /// Loads the voice in `model` (the `.onnx` graph) with its Piper config
    /// `config` (the `.onnx.json`), on ONNX Runtime from `runtime_library`
    /// (loaded once per process), and checks it by speaking one word.
    pub fn load(
        id: impl Into<String>,
        runtime_library: &Path,
        model: &Path,
        config: &Path,
        options: SpeechOptions,
    ) -> Result<Self, LoadError> {
        let config_error = |reason: String| LoadError::Config {
            path: config.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(config).map_err(|e| config_error(e.to_string()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| config_error(e.to_string()))?;
        let ids = PhonemeIds::from_config(&json).map_err(config_error)?;
        if json["phoneme_type"].as_str().is_some_and(|t| t != "espeak") {
            return Err(config_error(format!(
                "phoneme_type {} is not supported (only espeak)",
                json["phoneme_type"]
            )));
        }
        if json["num_speakers"].as_u64().unwrap_or(1) > 1 {
            return Err(config_error("multi-speaker voices are not supported".to_owned()));
        }
        let sample_rate = json["audio"]["sample_rate"]
            .as_u64()
            .and_then(|r| u32::try_from(r).ok())
            .filter(|r| (8000..=96000).contains(r))
            .ok_or_else(|| config_error("audio.sample_rate is missing or out of range".to_owned()))?;
        let espeak_voice = json["espeak"]["voice"]
            .as_str()
            .ok_or_else(|| config_error("espeak.voice is missing".to_owned()))?
            .to_owned();
        let scale = |key: &str, default: f32| json["inference"][key].as_f64().map_or(default, |v| v as f32);
        let scales = Scales {
            noise_scale: scale("noise_scale", 0.667),
            length_scale: scale("length_scale", 1.0),
            noise_w: scale("noise_w", 0.8),
        };
        let name = json["dataset"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map_or_else(|| voice_name_from_file(model), str::to_owned);

        let engine = Engine::Piper {
            espeak_voice,
            ids,
            scales,
        };
        Self::start(id.into(), name, sample_rate, engine, runtime_library, model, options)
    }

    /// Loads `kokoro-hibari`'s voice `voice` from `dir`, which holds its
    /// graph (named in `voices.json`), `vocab.json`, `voices.json` and the
    /// G2P's files ([`gantry_g2p::ASSET_FILES`]), on ONNX Runtime from
    /// `runtime_library`, and checks it by speaking one word.
    pub fn load_hibari(
        id: impl Into<String>,
        runtime_library: &Path,
        dir: &Path,
        voice: &str,
        options: SpeechOptions,
    ) -> Result<Self, LoadError> {
        gantry_onnx::init(runtime_library)?;
        let (graph, frontend) = hibari::Frontend::load(dir, voice)?;
        let engine = Engine::Hibari(Box::new(frontend));
        Self::start(
            id.into(),
            voice.to_owned(),
            vocoder::SAMPLE_RATE,
            engine,
            runtime_library,
            &graph,
            options,
        )
    }

    /// Opens the sessions of `graph` and checks the voice by speaking one word.
    fn start(
        id: String,
        name: String,
        sample_rate: u32,
        engine: Engine,
        runtime_library: &Path,
        graph: &Path,
        options: SpeechOptions,
    ) -> Result<Self, LoadError> {
        gantry_onnx::init(runtime_library)?;
        let sessions = (0..options.sessions.max(1))
            .map(|_| gantry_onnx::session_on(graph, options.threads, options.device))
            .collect::<Result<Vec<_>, _>>()?;
        let voice = Voice {
            name,
            sample_rate,
            sessions: Pool {
                free: Mutex::new(sessions),
                returned: Condvar::new(),
            },
            engine,
        };
        // A first run: the phonemizer answers, the graph speaks.
        let check = voice.synthesize("Ready.", 1.0)?;
        if check.audio.len() < (sample_rate / 20) as usize {
            return Err(LoadError::Graph(format!("{} samples for one word", check.audio.len())));
        }
        Ok(Self {
            id,
            inner: Arc::new(voice),
            matching: None,
        })
    }

    /// Enables voice matching (`reference_audio`) with the speaker encoder's
    /// converted weights at `encoder`; reference URLs may reach the ranges
    /// in `fetch_allow_ranges` besides public addresses, and the platform's
    /// own file URLs are read from `own_files`.
    pub fn with_voice_matching(
        mut self,
        encoder: &Path,
        fetch_allow_ranges: &[String],
        own_files: Option<Arc<dyn gantry_net::OwnFiles>>,
    ) -> Result<Self, LoadError> {
        let config_error = |reason: String| LoadError::Config {
            path: encoder.to_path_buf(),
            reason,
        };
        let encoder = speaker::SpeakerEncoder::load(encoder)
            .map_err(config_error)?
            .with_threads(0);
        let fetcher = gantry_net::Fetcher::new(fetch_allow_ranges, REFERENCE_FETCH_TIMEOUT)
            .map_err(|e| config_error(format!("fetch_allow_ranges: {e}")))?
            .with_own_files(own_files);
        self.matching = Some(Arc::new(Matching {
            encoder,
            fetcher,
            calibration: std::sync::OnceLock::new(),
            fits: Mutex::new(Vec::new()),
        }));
        Ok(self)
    }

    /// Whether `reference_audio` is served.
    pub fn matches_voices(&self) -> bool {
        self.matching.is_some()
    }

    /// The transform that moves this voice toward the speaker of `reference`
    /// (16 kHz mono), blocking; fitted once per recording (`key`). `None`
    /// when `stop` answered true during the fit (nothing is cached then).
    pub fn fit_reference(
        &self,
        reference: &[f32],
        key: (u64, usize),
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<clone::Fit>, String> {
        let matching = self
            .matching
            .as_ref()
            .ok_or("this model has no speaker encoder: voice matching is not available")?;
        let cached = |fits: &Vec<(u64, usize, clone::Fit)>| {
            fits.iter()
                .find(|(hash, len, _)| (*hash, *len) == key)
                .map(|(_, _, fit)| fit.clone())
        };
        if let Some(fit) = cached(&matching.fits.lock().unwrap_or_else(std::sync::PoisonError::into_inner)) {
            return Ok(Some(fit));
        }
        let calibration = match matching.calibration.get() {
            Some(audio) => audio,
            None => {
                let audio = self
                    .inner
                    .synthesize(CALIBRATION_TEXT, 1.0)
                    .map_err(|e| e.to_string())?
                    .audio;
                matching.calibration.get_or_init(|| audio)
            }
        };
        let Some(fit) = (clone::Matcher {
            encoder: &matching.encoder,
        })
        .fit(calibration, self.inner.sample_rate, reference, stop) else {
            return Ok(None);
        };
        let mut fits = matching.fits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if fits.len() >= FIT_CACHE {
            fits.remove(0);
        }
        fits.push((key.0, key.1, fit.clone()));
        Ok(Some(fit))
    }

    /// The voice's name, the only accepted `voice`.
    pub fn voice(&self) -> &str {
        &self.inner.name
    }

    /// Samples per second of the audio.
    pub fn sample_rate(&self) -> u32 {
        self.inner.sample_rate
    }

    /// A Piper voice config's scales (`None` for other engines).
    pub fn scales(&self) -> Option<Scales> {
        match &self.inner.engine {
            Engine::Piper { scales, .. } => Some(*scales),
            Engine::Hibari(_) => None,
        }
    }

    /// Speaks `text` as one utterance (no sentence splitting), blocking.
    pub fn synthesize(&self, text: &str, speed: f32) -> Result<Utterance, String> {
        self.inner.synthesize(text, speed).map_err(|e| e.to_string())
    }

    /// The phoneme ids of `text`, as [`synthesize`](Self::synthesize) feeds
    /// them to the graph, with the phonemes the voice does not know.
    pub fn phoneme_ids(&self, text: &str) -> Result<(Vec<i64>, Vec<char>), String> {
        let utterance = self.inner.phonemes(text).map_err(|e| e.to_string())?;
        Ok((utterance.ids, utterance.missing))
    }

    /// One run of the graph on `ids` with the given scales, blocking. Piper:
    /// with `noise_scale` and `noise_w` at 0 the output is deterministic.
    /// hibari (`ids` of one chunk): `length_scale` is 1 / speed,
    /// `noise_scale` scales the vocoder's noise (seeded, so always
    /// deterministic; 0 leaves it out), `noise_w` is unused.
    pub fn run_ids(&self, ids: &[i64], scales: Scales) -> Result<Vec<f32>, String> {
        match &self.inner.engine {
            Engine::Piper { .. } => self.inner.run_piper(ids, scales).map_err(|e| e.to_string()),
            Engine::Hibari(frontend) => frontend
                .render(
                    ids,
                    1.0 / scales.length_scale,
                    scales.noise_scale,
                    0,
                    &self.inner.sessions,
                )
                .map_err(|e| e.to_string()),
        }
    }
}

impl Voice {
    /// The phonemes and ids of `text` (no audio yet).
    fn phonemes(&self, text: &str) -> Result<Utterance, LoadError> {
        let (phonemes, ids, missing) = match &self.engine {
            Engine::Piper { espeak_voice, ids, .. } => {
                let phonemes = phonemes::phonemize(text, espeak_voice)?;
                let (ids, missing) = ids.ids(&phonemes);
                (phonemes, ids, missing)
            }
            Engine::Hibari(frontend) => {
                let phonemes = frontend.phonemes(text)?;
                let (ids, missing) = frontend.ids(&phonemes);
                (phonemes.join(" "), ids, missing)
            }
        };
        if !missing.is_empty() {
            tracing::debug!(?missing, "phonemes the voice does not know were left out");
        }
        Ok(Utterance {
            phonemes,
            ids,
            missing,
            audio: Vec::new(),
        })
    }

    /// A sentence's samples as 16-bit PCM: Piper voices scaled to full
    /// scale (Piper's default), hibari at its own level.
    fn pcm(&self, audio: &[f32]) -> Vec<i16> {
        match &self.engine {
            Engine::Piper { .. } => wav::to_pcm16(audio),
            Engine::Hibari(_) => wav::clip_pcm16(audio),
        }
    }

    fn synthesize(&self, text: &str, speed: f32) -> Result<Utterance, LoadError> {
        match &self.engine {
            Engine::Piper { scales, .. } => {
                let mut utterance = self.phonemes(text)?;
                if utterance.ids.len() < 4 {
                    // Nothing to say (only punctuation the voice drops): no audio.
                    return Ok(utterance);
                }
                let scales = Scales {
                    length_scale: scales.length_scale / speed,
                    ..*scales
                };
                utterance.audio = self.run_piper(&utterance.ids, scales)?;
                Ok(utterance)
            }
            Engine::Hibari(frontend) => frontend.synthesize(text, speed, &self.sessions),
        }
    }

    /// One run of the graph: `input` [1, n] ids, `input_lengths` [1],
    /// `scales` [noise_scale, length_scale, noise_w]; the output is
    /// [1, 1, 1, samples] (any shape is flattened).
    fn run_piper(&self, ids: &[i64], scales: Scales) -> Result<Vec<f32>, LoadError> {
        let graph = |e: gantry_onnx::ort::Error| LoadError::Graph(e.to_string());
        let n = ids.len();
        let input = Tensor::from_array(([1usize, n], ids.to_vec())).map_err(graph)?;
        let lengths = Tensor::from_array(([1usize], vec![n as i64])).map_err(graph)?;
        let scales = Tensor::from_array(([3usize], vec![scales.noise_scale, scales.length_scale, scales.noise_w]))
            .map_err(graph)?;
        self.sessions.with(|session| {
            let outputs = session
                .run(gantry_onnx::ort::inputs![
                    "input" => input,
                    "input_lengths" => lengths,
                    "scales" => scales,
                ])
                .map_err(graph)?;
            let (_, audio) = outputs[0].try_extract_tensor::<f32>().map_err(graph)?;
            Ok(audio.to_vec())
        })
    }
}

/// `en_US-joe-medium.onnx` → `joe`; the stem when the name has another shape.
pub(crate) fn voice_name_from_file(model: &Path) -> String {
    let stem = model.file_stem().and_then(|s| s.to_str()).unwrap_or("voice");
    stem.split('-').nth(1).unwrap_or(stem).to_owned()
}

/// A worker runtime serving `model`.
pub fn runtime(model: SpeechModel, config: WorkerConfig) -> WorkerRuntime<SpeechModel> {
    WorkerRuntime::new(model, config)
}

impl Model for SpeechModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input, self.voice()).map_err(JobError::BadInput)?;
        let pieces = sentences::split(&request.prompt);
        if pieces.is_empty() {
            return Err(JobError::bad_input("'prompt' has nothing to speak"));
        }
        let rate = self.sample_rate();
        let started = Instant::now();
        let fit = match &request.reference_audio {
            Some(source) => Some(self.match_reference(source, &ctx).await?),
            None => None,
        };
        let transform = fit.as_ref().map(|f| Arc::new(f.transform.clone()));
        let mut all: Vec<i16> = Vec::new();
        for (index, text) in pieces.iter().enumerate() {
            if ctx.is_cancelled() {
                return Err(JobError::Cancelled);
            }
            let voice = Arc::clone(&self.inner);
            let sentence = text.clone();
            let speed = request.speed;
            let transform = transform.clone();
            let utterance = tokio::task::spawn_blocking(move || {
                let mut utterance = voice.synthesize(&sentence, speed)?;
                if let Some(transform) = transform {
                    utterance.audio = transform.apply(&utterance.audio, voice.sample_rate);
                }
                Ok::<_, LoadError>(utterance)
            })
            .await
            .map_err(|e| JobError::internal(format!("synthesis thread failed: {e}")))?
            .map_err(|e| match e {
                LoadError::Unreadable(reason) => JobError::BadInput(format!("'prompt': {reason}")),
                e => JobError::internal(format!("synthesis failed: {e}")),
            })?;
            let pcm = self.inner.pcm(&utterance.audio);
            let file = encode(request.format, pcm.clone(), rate).await?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(file);
            ctx.chunk(json!({
                "index": index,
                "text": text,
                "audio_base64": encoded,
                "format": request.format.name(),
                "sample_rate": rate,
                "duration": pcm.len() as f64 / f64::from(rate),
            }))
            .await?;
            all.extend_from_slice(&pcm);
        }
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let duration = all.len() as f64 / f64::from(rate);
        let file = encode(request.format, all, rate).await?;
        ctx.put_file("/audio_url", request.format.media_type(), &file).await?;
        tracing::debug!(
            model = %self.id,
            sentences = pieces.len(),
            audio_s = duration,
            ms = started.elapsed().as_millis() as u64,
            "speech synthesised"
        );
        let mut output = json!({
            "audio_url": "",
            "duration": (duration * 1000.0).round() / 1000.0,
            "sample_rate": rate,
            "format": request.format.name(),
            "characters": request.characters,
            "sentences": pieces.len(),
        });
        if let Some(fit) = fit {
            let round = |v: f32| (f64::from(v) * 1e4).round() / 1e4;
            output["voice_match"] = json!({
                "similarity": round(fit.similarity),
                "base_similarity": round(fit.base_similarity),
                "pitch_scale": round(fit.transform.scale),
                "equalizer": round(fit.transform.eq_strength),
            });
        }
        Ok(Output::new(output, Usage::whole("characters", request.characters)))
    }
}

impl SpeechModel {
    /// Fetches and decodes the reference recording and fits the voice to it
    /// (a bad recording is bad input).
    async fn match_reference(&self, source: &gantry_net::Source, ctx: &JobContext) -> Result<clone::Fit, JobError> {
        let Some(matching) = &self.matching else {
            return Err(JobError::bad_input(
                "'reference_audio': voice matching is not available on this worker (no speaker encoder)",
            ));
        };
        let bytes = matching
            .fetcher
            .bytes(source, MAX_REFERENCE_BYTES)
            .await
            .map_err(|e| JobError::bad_input(format!("'reference_audio': {e}")))?;
        let key = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut hasher);
            (hasher.finish(), bytes.len())
        };
        let decoded = tokio::task::spawn_blocking(move || gantry_media::audio::decode(bytes, 600.0))
            .await
            .map_err(|e| JobError::internal(format!("the audio decoder stopped: {e}")))?
            .map_err(|e| JobError::bad_input(format!("'reference_audio': {e}")))?;
        if decoded.duration() < MIN_REFERENCE_SECONDS {
            return Err(JobError::bad_input(format!(
                "'reference_audio' is {:.2} s long; at least {MIN_REFERENCE_SECONDS} s of speech is needed",
                decoded.duration()
            )));
        }
        let mut samples = decoded.samples;
        samples.truncate((REFERENCE_SECONDS * f64::from(speaker::SAMPLE_RATE)) as usize);
        ctx.progress(json!({"stage": "matching voice"})).await?;
        let model = self.clone();
        let started = Instant::now();
        // A cancel stops the fit at its next encoder run.
        let token = ctx.cancellation_token();
        let fit = tokio::task::spawn_blocking(move || model.fit_reference(&samples, key, &|| token.is_cancelled()))
            .await
            .map_err(|e| JobError::internal(format!("voice matching stopped: {e}")))?
            .map_err(JobError::internal)?
            .ok_or(JobError::Cancelled)?;
        tracing::info!(
            model = %self.id,
            ms = started.elapsed().as_millis() as u64,
            candidates = fit.candidates,
            similarity = fit.similarity,
            base_similarity = fit.base_similarity,
            "voice matched"
        );
        Ok(fit)
    }
}

/// `pcm` as a file in `format`, encoded on a blocking thread (Vorbis takes
/// a while for a long reading).
async fn encode(format: formats::Format, pcm: Vec<i16>, rate: u32) -> Result<Vec<u8>, JobError> {
    tokio::task::spawn_blocking(move || format.encode(&pcm, rate))
        .await
        .map_err(|e| JobError::internal(format!("the audio encoder stopped: {e}")))?
        .map_err(JobError::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voice_names_come_from_piper_file_names() {
        assert_eq!(voice_name_from_file(Path::new("/m/en_US-joe-medium.onnx")), "joe");
        assert_eq!(voice_name_from_file(Path::new("voice.onnx")), "voice");
    }
}
