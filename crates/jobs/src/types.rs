use sea_orm::DbErr;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::entity::job;

/// Where a job is in its life. `IN_QUEUE -> IN_PROGRESS -> COMPLETED | FAILED
/// | CANCELLED | TIMED_OUT`; a failed or lost attempt may send it back to
/// `IN_QUEUE`, and so may a retry of a `FAILED` or `TIMED_OUT` job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    InQueue,
    InProgress,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
}

impl JobStatus {
    pub const ALL: [JobStatus; 6] = [
        JobStatus::InQueue,
        JobStatus::InProgress,
        JobStatus::Completed,
        JobStatus::Failed,
        JobStatus::Cancelled,
        JobStatus::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::InQueue => "IN_QUEUE",
            JobStatus::InProgress => "IN_PROGRESS",
            JobStatus::Completed => "COMPLETED",
            JobStatus::Failed => "FAILED",
            JobStatus::Cancelled => "CANCELLED",
            JobStatus::TimedOut => "TIMED_OUT",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Completed, failed, cancelled or timed out: nothing will change it any more
    /// (except a retry).
    pub fn is_final(self) -> bool {
        !matches!(self, JobStatus::InQueue | JobStatus::InProgress)
    }
}

/// `/run` (async) or `/runsync`: only changes how long the result is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Async,
    Sync,
}

/// Per-job policy; `None` takes the configured default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobPolicy {
    /// Longest a run may take, in ms.
    pub execution_timeout_ms: Option<u64>,
    /// Longest the job may live (queue plus run), in ms.
    pub ttl_ms: Option<u64>,
    /// Dispatched only when no normal-priority job of the model waits.
    pub low_priority: bool,
}

/// A job as submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// Must be a JSON object; passed to the model as is.
    pub input: Value,
    /// `http(s)` URL that gets the final job view.
    pub webhook: Option<String>,
    pub policy: JobPolicy,
}

impl NewJob {
    pub fn new(input: Value) -> Self {
        Self {
            input,
            webhook: None,
            policy: JobPolicy::default(),
        }
    }
}

/// What a worker reported of the attempt it completed, in milliseconds (to
/// the microsecond): time in the worker's own queue, loading the model,
/// running the job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerTimings {
    pub queue_ms: f64,
    pub load_ms: f64,
    pub run_ms: f64,
}

impl WorkerTimings {
    /// From the nanoseconds a worker sends; `None` when it sent none (all zero).
    pub fn from_nanos(queue: u64, load: u64, run: u64) -> Option<Self> {
        let ms = |ns: u64| (ns / 1_000) as f64 / 1_000.0;
        ((queue | load | run) != 0).then(|| WorkerTimings {
            queue_ms: ms(queue),
            load_ms: ms(load),
            run_ms: ms(run),
        })
    }

    /// As stored in `jobs.worker_timings`.
    pub fn stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A job as clients see it: `{"id","status","delayTime","executionTime","workerId","output"|"error"}`;
/// members that do not apply are left out, never `null`.
// The OpenAPI schema `Job` is derived from this struct.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Job)]
pub struct JobView {
    pub id: String,
    pub status: JobStatus,
    /// Time in the queue before the current (or last) attempt started, ms.
    #[serde(rename = "delayTime")]
    pub delay_time_ms: u64,
    /// Run time of the current (or last) attempt, ms.
    #[serde(rename = "executionTime")]
    pub execution_time_ms: u64,
    /// The worker that ran (or runs) the current attempt.
    #[serde(rename = "workerId", skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub worker_id: Option<String>,
    /// Set when `COMPLETED`: the model's output, with `cost` (USD) added by
    /// the platform.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, nullable = false)]
    pub output: Option<Value>,
    /// Set when `FAILED` or `TIMED_OUT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<String>,
    /// While `IN_PROGRESS`: the latest progress message its worker reported
    /// (for example `{"stage": "frames", "frames": 48, "of": 96}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, nullable = false)]
    pub progress: Option<Value>,
    /// Set when `COMPLETED`, if its worker reported them: how long the
    /// attempt waited on the worker, loaded the model and ran, ms.
    #[serde(rename = "workerTimings", skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub worker_timings: Option<WorkerTimings>,
    /// The stored output files whose URLs [`JobView::linked`] puts into
    /// `output` (empty once it has).
    #[serde(skip)]
    pub files: Vec<gantry_files::StoredFile>,
}

impl JobView {
    /// A running job not written yet (see `SchedulerConfig::sync_store_after`).
    pub fn unstored(job_id: &str) -> Self {
        Self {
            id: job_id.to_string(),
            status: JobStatus::InProgress,
            delay_time_ms: 0,
            execution_time_ms: 0,
            worker_id: None,
            output: None,
            error: None,
            progress: None,
            worker_timings: None,
            files: Vec::new(),
        }
    }

    /// The view with a URL, valid from now until the file's lifetime ends,
    /// at the place of each output file. Without a file store the places
    /// hold `null`.
    pub async fn linked(mut self, files: Option<&gantry_files::Files>) -> Self {
        if self.files.is_empty() {
            return self;
        }
        let stored = std::mem::take(&mut self.files);
        let output = self.output.get_or_insert(Value::Null);
        match files {
            Some(files) => files.resolve(output, &stored).await,
            None => {
                for file in &stored {
                    gantry_files::place(output, &file.pointer, Value::Null);
                }
            }
        }
        self
    }

    pub fn of(row: &job::Model, now_ms: i64) -> Self {
        let status = JobStatus::parse(&row.status).unwrap_or(JobStatus::Failed);
        let queue_end = match status {
            JobStatus::InQueue => now_ms,
            _ => row.started_at_ms.or(row.completed_at_ms).unwrap_or(now_ms),
        };
        let delay = queue_end - row.queued_at_ms;
        let execution = match (status, row.started_at_ms) {
            (JobStatus::InProgress, Some(started)) => now_ms - started,
            (JobStatus::InQueue, _) | (_, None) => 0,
            (_, Some(started)) => row.completed_at_ms.unwrap_or(now_ms) - started,
        };
        let output = match status {
            JobStatus::Completed => row
                .output
                .as_deref()
                .map(|text| serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))),
            _ => None,
        };
        let error = match status {
            JobStatus::Failed | JobStatus::TimedOut => row.error.clone(),
            _ => None,
        };
        let worker_timings = match status {
            JobStatus::Completed => row.worker_timings.as_deref().and_then(|t| serde_json::from_str(t).ok()),
            _ => None,
        };
        let files = match (status, row.files.as_deref()) {
            (JobStatus::Completed, Some(files)) => serde_json::from_str(files).unwrap_or_default(),
            _ => Vec::new(),
        };
        Self {
            id: row.id.clone(),
            status,
            delay_time_ms: u64::try_from(delay).unwrap_or(0),
            execution_time_ms: u64::try_from(execution).unwrap_or(0),
            worker_id: row.worker_id.clone(),
            output,
            error,
            progress: None,
            worker_timings,
            files,
        }
    }
}

/// What `read_stream` returns: the job's status, then the chunks not read
/// before, in order. Status first: once it is final, `chunks` holds the rest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamView {
    pub status: JobStatus,
    pub chunks: Vec<Value>,
    /// While `IN_PROGRESS`: the latest progress message (see [`JobView::progress`]).
    pub progress: Option<Value>,
}

/// Jobs of one model currently kept (queued, running, or finished within their
/// retention), by status; `retried` counts those sent back to the queue at
/// least once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobCounts {
    pub completed: u64,
    pub failed: u64,
    pub in_progress: u64,
    pub in_queue: u64,
    pub retried: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// No such job for this user and model (or it expired).
    #[error("job not found")]
    NotFound,
    /// The request is invalid; nothing was written.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// Fields of the input are refused, one message each; nothing was written.
    #[error("invalid input: {}", .0.join("; "))]
    InvalidInput(Vec<String>),
    /// Only `FAILED` and `TIMED_OUT` jobs can be retried.
    #[error("a {} job cannot be retried; only FAILED or TIMED_OUT jobs can", .0.as_str())]
    NotRetryable(JobStatus),
    /// A `runsync` job kept in memory (see `SchedulerConfig::sync_store_after`)
    /// whose scheduler stopped before writing it: it is gone and uncharged.
    #[error("the scheduler running this job stopped before the job was stored; it was not charged, submit it again")]
    Lost,
    /// The account has no credit left for another job (balance minus what
    /// its queued and running jobs may cost); nothing was queued.
    #[error(
        "no credit left: the balance is {} USD and jobs in flight may cost up to {} USD; add credit to run more jobs",
        gantry_billing::credit::usd_string(*balance),
        gantry_billing::credit::usd_string(*held)
    )]
    PaymentRequired { balance: i64, held: i64 },
    #[error(transparent)]
    Database(#[from] DbErr),
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error(transparent)]
    Database(#[from] DbErr),
    /// Redis signals could not be set up (a malformed URL, or set up twice).
    #[error("job signals: {0}")]
    Signals(String),
    /// The webhook client could not be built (an unreadable or invalid
    /// `webhook_ca_file`).
    #[error("webhooks: {0}")]
    Webhooks(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn view_has_the_public_shape() {
        let view = JobView {
            id: "j".into(),
            status: JobStatus::Completed,
            delay_time_ms: 3,
            execution_time_ms: 7,
            worker_id: Some("w".into()),
            output: Some(json!({"a": 1})),
            error: None,
            progress: None,
            worker_timings: None,
            files: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(&view).unwrap(),
            json!({"id": "j", "status": "COMPLETED", "delayTime": 3, "executionTime": 7, "workerId": "w", "output": {"a": 1}})
        );
        let failed = JobView {
            status: JobStatus::TimedOut,
            worker_id: None,
            output: None,
            error: Some("boom".into()),
            ..view
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"id": "j", "status": "TIMED_OUT", "delayTime": 3, "executionTime": 7, "error": "boom"})
        );
        let running = JobView {
            status: JobStatus::InProgress,
            error: None,
            progress: Some(json!({"step": 3, "of": 20})),
            ..failed
        };
        assert_eq!(
            serde_json::to_value(&running).unwrap(),
            json!({"id": "j", "status": "IN_PROGRESS", "delayTime": 3, "executionTime": 7, "progress": {"step": 3, "of": 20}})
        );
        for status in JobStatus::ALL {
            assert_eq!(JobStatus::parse(status.as_str()), Some(status));
            assert_eq!(serde_json::to_value(status).unwrap(), json!(status.as_str()));
        }
    }
}
