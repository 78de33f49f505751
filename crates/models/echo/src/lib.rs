//! `gantry-echo`, Gantry's diagnostic model.
//!
//! It returns its input unchanged as its output. When the input is a JSON
//! object, these optional fields steer it (they are echoed back too):
//!
//! | field      | type            | effect                                                         |
//! |------------|-----------------|----------------------------------------------------------------|
//! | `fail`     | string or bool  | fail as bad input (never retried); a string becomes the error |
//! | `sleep_ms` | unsigned int    | report progress `{"sleeping_ms": n}`, then sleep; a cancel or deadline ends the sleep at once |
//! | `stream`   | unsigned int    | emit that many stream chunks `{"chunk": i}` before finishing   |
//! | `stream_interval_ms` | unsigned int | pause this long between two chunks (cancel-aware) |
//! | `timestamps` | bool          | each chunk also carries `sent_at_us`, the wall-clock time it was sent in microseconds since the Unix epoch (to measure delivery latency) |
//! | `file`     | object          | an output file of `text` repeated `repeat` times (default 1; at most 256 MiB) of type `media_type` (default `text/plain`); the output gets its URL as `file_url` |
//!
//! A wrong steering member fails the job as bad input, naming every wrong
//! member at once; other members are never read. The file is written first,
//! then `fail` is checked, then the sleep, then the chunks. Every successful
//! job bills exactly one unit of `"requests"`. The input schema is
//! [`input::schema`].
//!
//! In-process use:
//!
//! ```no_run
//! # async fn start(shutdown: impl std::future::Future<Output = ()> + Send) -> Result<(), gantry_worker_sdk::WorkerError> {
//! use gantry_worker_sdk::{Credentials, WorkerConfig};
//! let config = WorkerConfig::new("http://127.0.0.1:7070", "echo-1", Credentials::Secret(b"secret".to_vec()));
//! gantry_model_echo::runtime(config).run_until(shutdown).await
//! # }
//! ```

mod factory;
pub mod input;

use std::time::Duration;

pub use factory::EchoFactory;
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use input::Options;
use serde_json::{Value, json};

/// Model id of the echo model.
pub const MODEL_ID: &str = "gantry-echo";

/// Most chunks one job may ask for.
pub const MAX_STREAM_CHUNKS: u64 = 10_000;

/// The echo model. It holds no state, so loading it is free.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoModel;

impl EchoModel {
    /// Loads the model (nothing to load; here for symmetry with real models).
    pub async fn load() -> Result<Self, std::convert::Infallible> {
        Ok(Self)
    }
}

/// A [`WorkerRuntime`] serving [`EchoModel`] with `config`.
pub fn runtime(config: WorkerConfig) -> WorkerRuntime<EchoModel> {
    WorkerRuntime::new(EchoModel, config)
}

impl Model for EchoModel {
    fn id(&self) -> &str {
        MODEL_ID
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let options = Options::parse(&input)?;
        // A file goes first, so that `fail` after it shows a failed job's
        // files being discarded.
        if let Some(file) = &options.file {
            // Written as it is made: the worker holds a chunk of it at most.
            let mut out = ctx.create_file("/file_url", &file.media_type)?;
            // Whole copies of the text in blocks of about 64 KiB.
            let per_block = (64 * 1024 / file.text.len().max(1)).max(1) as u64;
            let block = file.text.repeat(per_block.min(file.repeat) as usize);
            let mut left = if file.text.is_empty() { 0 } else { file.repeat };
            while left > 0 {
                if ctx.is_cancelled() {
                    return Err(JobError::Cancelled);
                }
                let copies = per_block.min(left);
                out.write(&block.as_bytes()[..file.text.len() * copies as usize])
                    .await?;
                left -= copies;
            }
            out.finish().await?;
        }
        if let Some(message) = options.fail {
            return Err(JobError::BadInput(message));
        }
        if options.sleep_ms > 0 {
            ctx.progress(json!({ "sleeping_ms": options.sleep_ms })).await?;
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(options.sleep_ms)) => {}
                () = ctx.cancelled() => return Err(JobError::Cancelled),
            }
        }
        for i in 0..options.stream {
            if i > 0 && options.stream_interval_ms > 0 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(options.stream_interval_ms)) => {}
                    () = ctx.cancelled() => return Err(JobError::Cancelled),
                }
            }
            if ctx.is_cancelled() {
                return Err(JobError::Cancelled);
            }
            let chunk = if options.timestamps {
                let sent_at_us = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_micros());
                json!({ "chunk": i, "sent_at_us": sent_at_us })
            } else {
                json!({ "chunk": i })
            };
            ctx.chunk(chunk).await?;
        }
        Ok(Output::new(input, Usage::whole("requests", 1)))
    }
}
