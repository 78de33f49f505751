//! The scheduler's gRPC edge for workers.
//!
//! Workers dial in and hold one `WorkerGateway.Connect` stream each. This
//! crate authenticates them (HS256 JWT), keeps a registry of who serves what
//! with how many free slots, sends them work, and turns what they report into
//! [`Event`]s. It knows nothing about the job store: the job layer calls
//! [`Dispatcher::assign`] / [`Dispatcher::cancel`] and consumes the events
//! (completion, failure, lost workers to requeue, capacity to fill).
//!
//! ```no_run
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! use gantry_dispatch::{Assignment, DispatchConfig, Dispatcher, Event};
//!
//! let (dispatcher, mut events) = Dispatcher::new(DispatchConfig::new("shared secret"));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7070").await?;
//! tokio::spawn(dispatcher.clone().serve(listener, std::future::pending()));
//!
//! while let Some(event) = events.recv().await {
//!     if let Event::CapacityAvailable { model } = event {
//!         let job = Assignment::new("job-1", 1, model, serde_json::json!({"hello": "world"}));
//!         let _ = dispatcher.assign(job);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod files;
mod polled;
mod registry;
mod service;
mod status;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::sync::mpsc;

pub use files::{FileLimits, FileSink, FileUpload, OCTET_STREAM, StoredFile, is_media_type};
pub use gantry_proto::DEADLINE_EXCEEDED;
pub use gantry_proto::v1::{Timings, Usage};
pub use polled::{PollError, PolledWorker, Report, TakenJob};
pub use service::GatewayService;
/// The attribute the [`FileSink`] and [`FileUpload`] implementations use.
pub use tonic::async_trait;

use gantry_proto::v1::worker_gateway_server::WorkerGatewayServer;
use registry::Inner;

/// Identity of a worker (its JWT `sub` and Hello `worker_id`).
pub type WorkerId = String;

/// Settings of a [`Dispatcher`].
#[derive(Clone)]
#[non_exhaustive]
pub struct DispatchConfig {
    /// HS256 secret worker tokens are signed with.
    pub secret: Vec<u8>,
    /// Sent to workers in HelloAck (informational). Default `"gantry"`.
    pub scheduler_id: String,
    /// How often workers must send a heartbeat. Default 5 s.
    pub heartbeat_interval: Duration,
    /// A worker not heard from for this long is dropped and reported lost.
    /// Default 3 × `heartbeat_interval` (15 s).
    pub lease: Duration,
    /// Time a new stream has to deliver its Hello. Default 10 s.
    pub hello_timeout: Duration,
    /// Events buffered before worker streams wait for the job layer.
    /// Default 1024.
    pub event_capacity: usize,
    /// Largest gRPC message accepted or sent (job inputs and outputs travel
    /// in one message each; output files travel in chunks). Default 64 MiB.
    pub max_message_bytes: usize,
    /// Where output files are stored. Without one, a job that sends a file
    /// fails (retryably, so a scheduler that has a store may run it).
    pub files: Option<Arc<dyn FileSink>>,
}

impl DispatchConfig {
    /// Defaults as listed on each field, with the given token secret.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        let heartbeat_interval = Duration::from_secs(5);
        Self {
            secret: secret.into(),
            scheduler_id: "gantry".into(),
            heartbeat_interval,
            lease: heartbeat_interval * 3,
            hello_timeout: Duration::from_secs(10),
            event_capacity: 1024,
            max_message_bytes: 64 << 20,
            files: None,
        }
    }

    /// Sets the heartbeat interval and a lease of three intervals.
    pub fn with_heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self.lease = interval * 3;
        self
    }
}

impl std::fmt::Debug for DispatchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchConfig")
            .field("secret", &"<redacted>")
            .field("scheduler_id", &self.scheduler_id)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("lease", &self.lease)
            .field("hello_timeout", &self.hello_timeout)
            .field("event_capacity", &self.event_capacity)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("files", &self.files.is_some())
            .finish()
    }
}

/// One attempt of a job, to run on some worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The job layer's id of the job.
    pub job_id: String,
    /// Attempt number; events about this attempt carry it back.
    pub attempt: u32,
    /// Model id; only workers serving it are considered.
    pub model: String,
    /// The job's JSON input as text, passed to the worker as is (the worker
    /// parses it; text that is not JSON fails the job as bad input there).
    pub input_json: String,
    /// The worker abandons the attempt (non-retryable failure) past this.
    pub deadline: Option<SystemTime>,
    /// The W3C `traceparent` the worker's span of the run takes as parent.
    pub trace_parent: Option<String>,
}

impl Assignment {
    /// An assignment of `input` without deadline.
    pub fn new(job_id: impl Into<String>, attempt: u32, model: impl Into<String>, input: Value) -> Self {
        Self {
            job_id: job_id.into(),
            attempt,
            model: model.into(),
            input_json: input.to_string(),
            deadline: None,
            trace_parent: None,
        }
    }
}

/// Why [`Dispatcher::assign`] sent nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    /// No connected, non-draining worker serving the model has a free slot.
    /// Wait for [`Event::CapacityAvailable`].
    #[error("no free slot for model {model:?}")]
    NoCapacity { model: String },
    /// The job id is already running on a worker (cancel it first, or wait
    /// for its terminal event).
    #[error("job {job_id:?} is already running on worker {worker_id:?}")]
    AlreadyRunning { job_id: String, worker_id: WorkerId },
}

/// What the job layer hears from workers.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A progress message of a running attempt.
    Progress {
        job_id: String,
        attempt: u32,
        worker_id: WorkerId,
        message: Value,
    },
    /// A piece of streamed output; `seq` counts from 0 per attempt and
    /// chunks arrive in order, before the attempt's terminal event.
    Chunk {
        job_id: String,
        attempt: u32,
        worker_id: WorkerId,
        seq: u64,
        output: Value,
    },
    /// Terminal: the attempt succeeded.
    Completed {
        job_id: String,
        attempt: u32,
        worker_id: WorkerId,
        output: Value,
        usage: Usage,
        timings: Timings,
        /// Output files, stored; their URLs go at each file's pointer.
        files: Vec<StoredFile>,
    },
    /// Terminal: the attempt failed; retry only if `retryable`. An `error` of
    /// exactly [`DEADLINE_EXCEEDED`] means the attempt's deadline passed.
    Failed {
        job_id: String,
        attempt: u32,
        worker_id: WorkerId,
        error: String,
        retryable: bool,
    },
    /// Terminal: the attempt stopped after [`Dispatcher::cancel`].
    Cancelled {
        job_id: String,
        attempt: u32,
        worker_id: WorkerId,
    },
    /// The worker is gone (stream ended, failed, lease expired, or replaced
    /// by a reconnect). `running_job_ids` (sorted) were still running on it
    /// and will not report: requeue them. Empty after a clean drain.
    WorkerLost {
        worker_id: WorkerId,
        running_job_ids: Vec<String>,
    },
    /// A worker serving `model` gained free slots (it joined, or returned a
    /// slot): a good moment to call [`Dispatcher::assign`].
    CapacityAvailable { model: String },
}

/// Per-model view of the fleet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    pub models: BTreeMap<String, ModelHealth>,
}

/// Worker counts for one model. A worker serving several models counts for
/// each of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelHealth {
    /// Connected, not draining, no job running.
    pub idle_workers: usize,
    /// Connected, not draining, at least one job running.
    pub running_workers: usize,
    /// Finishing their jobs before leaving.
    pub draining_workers: usize,
    /// Free slots over the non-draining workers.
    pub free_slots: u64,
    /// Jobs running on workers serving the model.
    pub running_jobs: usize,
}

/// A connected worker, as the registry sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub worker_id: WorkerId,
    pub models: Vec<String>,
    /// Slots announced in Hello.
    pub slots: u32,
    /// Credits left: assignments the worker can take now.
    pub free_slots: u32,
    /// Sorted.
    pub running_job_ids: Vec<String>,
    pub draining: bool,
    /// Time since the worker's last message.
    pub last_seen: Duration,
    pub gpu_name: String,
    pub gpu_memory_bytes: u64,
    pub version: String,
}

/// Sees every accepted stream chunk and progress message as it arrives,
/// before it is queued as an event (see [`Dispatcher::observe_live`]).
pub type LiveObserver = Arc<dyn Fn(&Event) + Send + Sync>;

/// Handle on the worker registry; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

impl Dispatcher {
    /// A dispatcher and the receiver of its events.
    ///
    /// Must be called inside a Tokio runtime: it starts the task that expires
    /// leases (it stops once every clone of the dispatcher is dropped).
    pub fn new(config: DispatchConfig) -> (Self, mpsc::Receiver<Event>) {
        let (inner, events) = Inner::new(config);
        registry::spawn_reaper(&inner);
        (Self { inner }, events)
    }

    /// The gRPC service, to mount in a tonic server of your own (e.g.
    /// `Server::builder().add_service(..)` with tonic's `router` feature) when
    /// [`Dispatcher::serve`] does not fit.
    pub fn service(&self) -> WorkerGatewayServer<GatewayService> {
        let limit = self.inner.config.max_message_bytes;
        WorkerGatewayServer::new(GatewayService::new(Arc::clone(&self.inner)))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit)
    }

    /// Serves the gRPC service on `listener` until `shutdown` resolves, then
    /// ends every worker stream with `UNAVAILABLE` (workers reconnect with
    /// backoff) and returns.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let inner = Arc::clone(&self.inner);
        let signal = async move {
            shutdown.await;
            inner.disconnect_all().await;
        };
        tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(
                self.service(),
                // Small frames (results, credits) must not wait for Nagle.
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                signal,
            )
            .await
    }

    /// Sends `job` to the least loaded connected worker that serves its model
    /// and has a free slot.
    pub fn assign(&self, job: Assignment) -> Result<WorkerId, AssignError> {
        self.inner.assign(job)
    }

    /// Asks the worker running `job_id` to stop it; it answers with
    /// [`Event::Cancelled`] (or another terminal event if the job ended
    /// first). Returns that worker, or `None` if the job is not running.
    pub fn cancel(&self, job_id: &str, reason: &str) -> Option<WorkerId> {
        self.inner.cancel(job_id, reason)
    }

    /// Those of `job_ids` that no connected worker runs now (as the registry
    /// counts them: from assignment until its terminal message or the loss
    /// of its worker, each of which is then reported as an [`Event`]).
    pub fn not_running(&self, job_ids: impl IntoIterator<Item = String>) -> Vec<String> {
        self.inner.not_running(job_ids)
    }

    /// Stops assigning to `worker_id` and asks it to finish its running jobs
    /// and leave. Returns false for an unknown worker.
    pub fn drain(&self, worker_id: &str) -> bool {
        self.inner.drain(worker_id)
    }

    /// Calls `observer` with every stream chunk and progress message of a
    /// running attempt the moment it arrives, before it is queued as an
    /// event: how live readers see output before it is stored. The observer
    /// runs on the worker stream's task, so it must not block. Replaces an
    /// earlier observer; `None` removes it.
    pub fn observe_live(&self, observer: Option<LiveObserver>) {
        self.inner.observe_live(observer);
    }

    /// Registers a worker that polls over HTTP (the RunPod worker protocol)
    /// and serves `model`, lost when it has not called for `lease`. A worker
    /// of the same id registered before is replaced and reported lost, as a
    /// reconnecting stream would be.
    pub async fn attach_polled(&self, worker_id: &str, model: &str, version: &str, lease: Duration) -> PolledWorker {
        PolledWorker::register(&self.inner, worker_id, model, version, lease).await
    }

    /// Idle and running worker counts per model.
    pub fn health(&self) -> Health {
        self.inner.health()
    }

    /// The free slots of `model`'s workers, as [`Dispatcher::health`] counts them.
    pub fn free_slots(&self, model: &str) -> u64 {
        self.inner.free_slots(model)
    }

    /// Every connected worker, sorted by id.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.inner.workers()
    }
}
