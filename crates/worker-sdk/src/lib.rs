//! Gantry worker SDK.
//!
//! A model crate implements [`Model`]; [`WorkerRuntime`] does everything
//! else: it dials the scheduler, authenticates, announces its slots, keeps the
//! session alive with heartbeats, runs up to `slots` jobs at once, relays
//! progress and stream chunks, honours cancellation and deadlines, reconnects
//! with capped, jittered exponential backoff, and drains gracefully on
//! SIGTERM, on the scheduler's request or when an embedding process asks.
//!
//! ```no_run
//! use gantry_worker_sdk::{Credentials, JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
//! use serde_json::Value;
//!
//! struct Upper;
//!
//! impl Model for Upper {
//!     fn id(&self) -> &str {
//!         "upper"
//!     }
//!
//!     async fn run(&self, input: Value, _ctx: JobContext) -> Result<Output, JobError> {
//!         let text = input["text"].as_str().ok_or_else(|| JobError::bad_input("`text` must be a string"))?;
//!         let chars = text.chars().count() as u64;
//!         Ok(Output::new(text.to_uppercase().into(), Usage::whole("characters", chars)))
//!     }
//! }
//!
//! # async fn start() -> Result<(), gantry_worker_sdk::WorkerError> {
//! let config = WorkerConfig::new(
//!     "http://127.0.0.1:7070",
//!     "worker-1",
//!     Credentials::Secret(b"shared secret".to_vec()),
//! );
//! WorkerRuntime::new(Upper, config).run().await
//! # }
//! ```

mod config;
mod context;
pub mod factory;
mod model;
mod runtime;

pub use config::{Credentials, WorkerConfig};
pub use context::{FILE_CHUNK_BYTES, FileWriter, JobContext};
pub use factory::{Family, ModelFactory, ModelFiles, family};
pub use gantry_proto::v1::Usage;
pub use model::{JobError, Model, Output};
pub use runtime::{WorkerError, WorkerRuntime};
pub use tokio_util::sync::CancellationToken;
