use std::fmt::Display;
use std::future::Future;

use gantry_proto::v1::Usage;
use serde_json::Value;

use crate::JobContext;

/// A model served by a worker.
///
/// Load weights and other expensive state when you construct the value (for
/// example in an `async fn load(..) -> Result<Self, _>` of your own) and hand
/// the loaded model to [`WorkerRuntime::new`](crate::WorkerRuntime::new): a
/// worker connects only once its model is ready. `run` is then called once per
/// job, up to `slots` times concurrently, through a shared reference.
pub trait Model: Send + Sync + 'static {
    /// Model id as used in `POST /v2/<model_id>/run`, e.g. `"gantry-echo"`.
    fn id(&self) -> &str;

    /// Runs one job.
    ///
    /// `input` is the job's JSON input. Use `ctx` to report progress, emit
    /// streamed output and notice cancellation. Return
    /// [`JobError::BadInput`] when the input is at fault (never retried) and
    /// [`JobError::Internal`] for anything else (retried elsewhere). A panic
    /// is reported as a retryable failure.
    fn run(&self, input: Value, ctx: JobContext) -> impl Future<Output = Result<Output, JobError>> + Send;
}

/// What a successful job returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The job's output JSON.
    pub output: Value,
    /// What the job consumed, for billing.
    pub usage: Usage,
}

impl Output {
    /// Output JSON together with its usage.
    pub fn new(output: Value, usage: Usage) -> Self {
        Self { output, usage }
    }
}

/// Why a job did not produce an output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The input is invalid. The job fails for good; it is never retried.
    #[error("bad input: {0}")]
    BadInput(String),
    /// Something went wrong in the model or the machine. The scheduler may run
    /// the job again, possibly on another worker.
    #[error("internal error: {0}")]
    Internal(String),
    /// The job stopped because it was cancelled (see
    /// [`JobContext::cancelled`]).
    #[error("cancelled")]
    Cancelled,
}

impl JobError {
    /// A [`JobError::BadInput`] with `message`.
    pub fn bad_input(message: impl Display) -> Self {
        Self::BadInput(message.to_string())
    }

    /// A [`JobError::Internal`] with `message`.
    pub fn internal(message: impl Display) -> Self {
        Self::Internal(message.to_string())
    }

    /// Whether running the job again could succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::BadInput(_))
    }
}
