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
//!
//! `fail` is checked first, then the sleep, then the chunks. Every successful
//! job bills exactly one unit of `"requests"`.
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

use std::time::Duration;

pub use factory::EchoFactory;
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
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

#[derive(Debug, Default, PartialEq)]
struct Options {
    fail: Option<String>,
    sleep_ms: u64,
    stream: u64,
    stream_interval_ms: u64,
    timestamps: bool,
    file: Option<FileOption>,
}

/// `file`: an output file of `text` repeated `repeat` times, whose URL the
/// output gets as `file_url`.
#[derive(Debug, PartialEq)]
struct FileOption {
    text: String,
    repeat: u64,
    media_type: String,
}

/// Largest echo file (text × repeat), in bytes. The file streams to the
/// scheduler as it is made, so this bounds the worker's time, not its
/// memory; the platform's own bounds on output files
/// (`files.max_file_bytes`, `files.max_job_bytes`) apply on top.
const MAX_FILE_BYTES: u64 = 256 << 20;

impl FileOption {
    fn parse(value: &Value) -> Result<Option<Self>, JobError> {
        let object = match value {
            Value::Null => return Ok(None),
            Value::Object(object) => object,
            _ => return Err(JobError::bad_input("`file` must be an object")),
        };
        let text = match object.get("text") {
            Some(Value::String(text)) => text.clone(),
            _ => return Err(JobError::bad_input("`file.text` must be a string")),
        };
        let repeat = match object.get("repeat") {
            None | Some(Value::Null) => 1,
            Some(value) => value
                .as_u64()
                .ok_or_else(|| JobError::bad_input("`file.repeat` must be a non-negative integer"))?,
        };
        if (text.len() as u64).saturating_mul(repeat) > MAX_FILE_BYTES {
            return Err(JobError::bad_input(format!(
                "`file` may be at most {MAX_FILE_BYTES} bytes"
            )));
        }
        let media_type = match object.get("media_type") {
            None | Some(Value::Null) => "text/plain".to_owned(),
            Some(Value::String(media_type)) => media_type.clone(),
            _ => return Err(JobError::bad_input("`file.media_type` must be a string")),
        };
        Ok(Some(Self {
            text,
            repeat,
            media_type,
        }))
    }
}

impl Options {
    fn parse(input: &Value) -> Result<Self, JobError> {
        let Some(object) = input.as_object() else {
            return Ok(Self::default());
        };
        let fail = match object.get("fail") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some("failure requested by the input".to_owned()),
            Some(Value::String(message)) => Some(message.clone()),
            Some(_) => return Err(JobError::bad_input("`fail` must be a string or a bool")),
        };
        let count = |field: &str| match object.get(field) {
            None | Some(Value::Null) => Ok(0),
            Some(value) => value
                .as_u64()
                .ok_or_else(|| JobError::bad_input(format!("`{field}` must be a non-negative integer"))),
        };
        let sleep_ms = count("sleep_ms")?;
        let stream = count("stream")?;
        if stream > MAX_STREAM_CHUNKS {
            return Err(JobError::bad_input(format!(
                "`stream` may ask for at most {MAX_STREAM_CHUNKS} chunks"
            )));
        }
        let stream_interval_ms = count("stream_interval_ms")?;
        let timestamps = match object.get("timestamps") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(on)) => *on,
            Some(_) => return Err(JobError::bad_input("`timestamps` must be a bool")),
        };
        let file = FileOption::parse(object.get("file").unwrap_or(&Value::Null))?;
        Ok(Self {
            fail,
            sleep_ms,
            stream,
            stream_interval_ms,
            timestamps,
            file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_optional_and_validated() {
        assert_eq!(Options::parse(&json!("text")).unwrap(), Options::default());
        assert_eq!(Options::parse(&json!({"a": 1})).unwrap(), Options::default());
        assert_eq!(
            Options::parse(
                &json!({"fail": true, "sleep_ms": 5, "stream": 2, "stream_interval_ms": 7, "timestamps": true})
            )
            .unwrap(),
            Options {
                fail: Some("failure requested by the input".into()),
                sleep_ms: 5,
                stream: 2,
                stream_interval_ms: 7,
                timestamps: true,
                file: None,
            }
        );
        assert_eq!(
            Options::parse(&json!({"fail": "boom"})).unwrap().fail.as_deref(),
            Some("boom")
        );
        assert_eq!(Options::parse(&json!({"fail": false})).unwrap().fail, None);
        for bad in [
            json!({"fail": 3}),
            json!({"sleep_ms": -1}),
            json!({"stream": "x"}),
            json!({"stream": MAX_STREAM_CHUNKS + 1}),
            json!({"stream_interval_ms": 1.5}),
            json!({"timestamps": "yes"}),
        ] {
            assert!(matches!(Options::parse(&bad), Err(JobError::BadInput(_))), "{bad}");
        }
    }
}
