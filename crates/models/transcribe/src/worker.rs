//! The worker side: a job's audio is fetched, decoded and transcribed; each
//! segment is streamed as it is final, and the usage is the audio's length.
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::engine::{Segment, TranscribeOptions, Whisper};
use crate::{audio, input};

/// Largest audio file fetched or accepted inline.
pub const MAX_AUDIO_BYTES: usize = 100 << 20;
/// How long fetching an audio URL may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

/// How a transcription model runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Threads one job uses; 0 means one per core.
    pub threads: usize,
    /// Address ranges (CIDR) that `audio_url` may reach although they are
    /// loopback, private or reserved; public addresses are always allowed.
    pub fetch_allow_ranges: Vec<String>,
    /// The platform's own file URLs, read from its store.
    pub own_files: Option<std::sync::Arc<dyn gantry_net::OwnFiles>>,
    /// What runs Whisper: the kernels on the CPU, or candle on a GPU.
    pub backend: crate::engine::Backend,
}

/// Why a transcription model did not load.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(String);

/// A loaded speech-to-text model.
#[derive(Clone)]
pub struct TranscriptionModel {
    id: String,
    whisper: Arc<Whisper>,
    threads: usize,
    fetcher: gantry_net::Fetcher,
}

impl std::fmt::Debug for TranscriptionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TranscriptionModel").field("id", &self.id).finish()
    }
}

impl TranscriptionModel {
    /// Loads Whisper from `dir` (`model.bin`, `tokenizer.json`, `config.json`).
    pub fn load(id: &str, dir: &Path, options: &Options) -> Result<Self, LoadError> {
        let whisper = Whisper::load_on(dir, &options.backend).map_err(|e| LoadError(e.to_string()))?;
        tracing::info!(model = id, backend = %whisper.backend_name(), "Whisper loaded");
        let fetcher = gantry_net::Fetcher::new(&options.fetch_allow_ranges, FETCH_TIMEOUT)
            .map_err(|e| LoadError(format!("fetch_allow_ranges: {e}")))?
            .with_own_files(options.own_files.clone());
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        };
        Ok(Self {
            id: id.to_owned(),
            whisper: Arc::new(whisper),
            threads,
            fetcher,
        })
    }

    /// The loaded engine, for benchmarks and tests.
    pub fn whisper(&self) -> &Whisper {
        &self.whisper
    }
}

/// A worker runtime serving `model`.
pub fn runtime(model: TranscriptionModel, config: WorkerConfig) -> WorkerRuntime<TranscriptionModel> {
    WorkerRuntime::new(model, config)
}

/// A segment as callers see it: in the stream and in the output.
fn segment_json(index: usize, segment: &Segment) -> Value {
    json!({
        "id": index,
        "start": round3(segment.start),
        "end": round3(segment.end),
        "text": segment.text.trim(),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Model for TranscriptionModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input).map_err(JobError::BadInput)?;
        let started = Instant::now();
        let bytes = self
            .fetcher
            .bytes(&request.audio, MAX_AUDIO_BYTES)
            .await
            .map_err(|e| JobError::bad_input(format!("audio: {e}")))?;
        let max_seconds = f64::from(gantry_catalog::MAX_AUDIO_SECONDS);
        let audio = tokio::task::spawn_blocking(move || audio::decode(bytes, max_seconds))
            .await
            .map_err(|e| JobError::internal(format!("the audio decoder stopped: {e}")))?
            .map_err(|e| JobError::bad_input(format!("audio: {e}")))?;
        let duration = audio.duration();
        let decoded_ms = started.elapsed().as_millis() as u64;

        // The engine runs on a blocking thread; its segments come back over a
        // channel to be streamed, and a flag stops it when the job is cancelled.
        let (sender, mut segments) = mpsc::unbounded_channel::<Segment>();
        let stop = Arc::new(AtomicBool::new(false));
        let whisper = Arc::clone(&self.whisper);
        let options = TranscribeOptions {
            threads: self.threads,
            stop: Some(Arc::clone(&stop)),
            ..TranscribeOptions::default()
        };
        let stop_engine = Arc::clone(&stop);
        let mut engine = tokio::task::spawn_blocking(move || {
            let mut on_segment = |segment: &Segment| {
                let _ = sender.send(segment.clone());
                if stop_engine.load(Ordering::Relaxed) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            whisper.transcribe(&audio.samples, &options, &mut on_segment)
        });
        let mut streamed = 0usize;
        let transcript = loop {
            tokio::select! {
                biased;
                () = ctx.cancelled(), if !stop.load(Ordering::Relaxed) => {
                    stop.store(true, Ordering::Relaxed);
                }
                Some(segment) = segments.recv() => {
                    if !stop.load(Ordering::Relaxed) {
                        ctx.chunk(segment_json(streamed, &segment)).await?;
                        ctx.progress(json!({
                            "transcribed_seconds": round3(segment.end.min(duration)),
                            "duration": round3(duration),
                        }))
                        .await?;
                    }
                    streamed += 1;
                }
                finished = &mut engine => {
                    break finished
                        .map_err(|e| JobError::internal(format!("the transcription thread failed: {e}")))?
                        .map_err(|e| JobError::internal(format!("transcription failed: {e}")))?;
                }
            }
        };
        if stop.load(Ordering::Relaxed) || transcript.cancelled || ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        // Segments the engine sent after the last one streamed.
        while let Ok(segment) = segments.try_recv() {
            ctx.chunk(segment_json(streamed, &segment)).await?;
            streamed += 1;
        }
        tracing::debug!(
            model = %self.id,
            audio_s = duration,
            segments = transcript.segments.len(),
            decode_ms = decoded_ms,
            ms = started.elapsed().as_millis() as u64,
            "audio transcribed"
        );
        let segments: Vec<Value> = transcript
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| segment_json(i, s))
            .collect();
        let output = json!({
            "text": transcript.text.trim(),
            "segments": segments,
            "language": request.language,
            "duration": round3(duration),
        });
        // Billed per second heard, to the microsecond.
        let micros = (duration * 1e6).ceil() as i64;
        Ok(Output::new(output, Usage::micros("audio_seconds", micros)))
    }
}
