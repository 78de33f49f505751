use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_proto::DEADLINE_EXCEEDED;
use gantry_proto::auth::{self, AUTHORIZATION, WorkerClaims};
use gantry_proto::v1::worker_gateway_client::WorkerGatewayClient;
use gantry_proto::v1::{
    Assign, Cancelled, Draining, Failure, Heartbeat, Hello, SchedulerMessage, SlotCredit, Timings, WorkerMessage,
    scheduler_message, worker_message::Kind,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tonic::{Code, Request, Status, Streaming};

use crate::{Credentials, JobContext, JobError, Model, Output, WorkerConfig};

/// Messages queued towards the scheduler before senders wait.
const OUTBOUND_CAPACITY: usize = 256;
/// File chunks (1 MiB each) queued towards the scheduler before a file
/// writer waits: a worker that makes a file faster than the stream carries
/// it holds at most this many of its chunks, however large the file.
const FILE_CHUNKS_IN_FLIGHT: usize = 4;

/// Why a [`WorkerRuntime`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The configuration cannot work (bad URL, zero slots, ...).
    #[error("invalid worker config: {0}")]
    Config(String),
    /// The scheduler refused the worker for a reason retrying cannot fix:
    /// `UNAUTHENTICATED` (missing, bad or expired token), `PERMISSION_DENIED`
    /// (token does not cover this worker or model), `INVALID_ARGUMENT` (bad
    /// Hello) or `UNIMPLEMENTED` (not a Gantry scheduler).
    #[error("scheduler refused the worker: {}: {}", .0.code(), .0.message())]
    Rejected(Status),
}

/// Runs one [`Model`] as a worker of a Gantry scheduler.
pub struct WorkerRuntime<M> {
    model: Arc<M>,
    config: WorkerConfig,
}

impl<M: Model> WorkerRuntime<M> {
    /// A runtime for an already loaded `model`.
    pub fn new(model: M, config: WorkerConfig) -> Self {
        Self {
            model: Arc::new(model),
            config,
        }
    }

    /// Runs until SIGTERM or Ctrl-C (then drains), a Drain from the
    /// scheduler, or a fatal error. See [`WorkerRuntime::run_until`].
    pub async fn run(self) -> Result<(), WorkerError> {
        self.run_until(termination_signal()).await
    }

    /// Runs until `shutdown` resolves, then drains: running jobs finish and
    /// report, nothing new is taken, and the stream is closed. Also returns
    /// `Ok` after the scheduler asks the worker to drain.
    ///
    /// Lost connections are retried forever with capped, jittered exponential
    /// backoff; jobs running on a lost connection are dropped (the scheduler
    /// sees the worker as lost and requeues them). Returns an error only for
    /// an unusable config or a refusal that retrying cannot fix.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), WorkerError> {
        let endpoint = self.endpoint()?;
        let mut shutdown = pin!(shutdown);
        let mut state = State::default();
        let mut failures: u32 = 0;
        loop {
            let error = match self.session(&endpoint, shutdown.as_mut(), &mut state).await {
                Ok(()) => return Ok(()),
                Err(SessionError::Fatal(error)) => return Err(error),
                Err(SessionError::Lost { established, reason }) => {
                    if established {
                        failures = 0;
                    }
                    reason
                }
            };
            if state.draining {
                tracing::warn!(worker_id = %self.config.worker_id, %error, "connection lost while draining; stopping");
                return Ok(());
            }
            let delay = backoff_delay(self.config.backoff_initial, self.config.backoff_max, failures);
            failures = failures.saturating_add(1);
            tracing::warn!(worker_id = %self.config.worker_id, %error, ?delay, "not connected to the scheduler; retrying");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.as_mut(), if !state.shutdown_requested => return Ok(()),
            }
        }
    }

    fn endpoint(&self) -> Result<Endpoint, WorkerError> {
        let config = &self.config;
        if config.slots == 0 {
            return Err(WorkerError::Config("slots must be at least 1".into()));
        }
        if config.worker_id.is_empty() {
            return Err(WorkerError::Config("worker id must not be empty".into()));
        }
        let endpoint = Endpoint::from_shared(config.scheduler_url.clone())
            .map_err(|e| WorkerError::Config(format!("bad scheduler url {:?}: {e}", config.scheduler_url)))?;
        Ok(endpoint
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true))
    }

    fn bearer(&self) -> Result<String, WorkerError> {
        let token = match &self.config.credentials {
            Credentials::Token(token) => token.clone(),
            Credentials::Secret(secret) => {
                let claims = WorkerClaims::new(
                    self.config.worker_id.clone(),
                    vec![self.model.id().to_owned()],
                    self.config.token_ttl,
                );
                auth::mint(&claims, secret).map_err(|e| WorkerError::Config(format!("cannot mint token: {e}")))?
            }
        };
        Ok(format!("Bearer {token}"))
    }

    /// One connection: handshake, then serve until drained or lost.
    async fn session<F: Future<Output = ()>>(
        &self,
        endpoint: &Endpoint,
        shutdown: Pin<&mut F>,
        state: &mut State,
    ) -> Result<(), SessionError> {
        let (out, file_chunks, inbound, ack_interval) = self.handshake(endpoint).await?;
        let interval = match ack_interval {
            0 => self.config.heartbeat_interval,
            ms => Duration::from_millis(ms),
        };
        tracing::info!(worker_id = %self.config.worker_id, model = self.model.id(), slots = self.config.slots, "connected to the scheduler");
        let session = Session {
            model: &self.model,
            config: &self.config,
            out,
            file_chunks,
            jobs: HashMap::new(),
            tasks: JoinSet::new(),
            task_jobs: HashMap::new(),
        };
        session
            .serve(inbound, interval, shutdown, state)
            .await
            .map_err(|reason| SessionError::Lost {
                established: true,
                reason,
            })
    }

    async fn handshake(
        &self,
        endpoint: &Endpoint,
    ) -> Result<
        (
            mpsc::Sender<WorkerMessage>,
            Arc<Semaphore>,
            Streaming<SchedulerMessage>,
            u64,
        ),
        SessionError,
    > {
        let timeout = self.config.connect_timeout;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| SessionError::lost(format!("connect: {e}")))?;
        let mut client = WorkerGatewayClient::new(channel)
            .max_decoding_message_size(self.config.max_message_bytes)
            .max_encoding_message_size(self.config.max_message_bytes);

        let (out, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let hello = Hello {
            worker_id: self.config.worker_id.clone(),
            models: vec![self.model.id().to_owned()],
            slots: self.config.slots,
            gpu_name: self.config.gpu_name.clone(),
            gpu_memory_bytes: self.config.gpu_memory_bytes,
            version: self.config.version.clone(),
        };
        send(&out, Kind::Hello(hello)).await?;

        // A file chunk's place is free again once the stream has taken it.
        let file_chunks = Arc::new(Semaphore::new(FILE_CHUNKS_IN_FLIGHT));
        let taken = Arc::clone(&file_chunks);
        let outbound = ReceiverStream::new(rx).map(move |message| {
            if matches!(message.kind, Some(Kind::FileChunk(_))) {
                taken.add_permits(1);
            }
            message
        });
        let mut request = Request::new(outbound);
        let bearer = self.bearer().map_err(SessionError::Fatal)?;
        let bearer = bearer
            .parse()
            .map_err(|_| SessionError::Fatal(WorkerError::Config("token is not ASCII".into())))?;
        request.metadata_mut().insert(AUTHORIZATION, bearer);

        let mut inbound = tokio::time::timeout(timeout, client.connect(request))
            .await
            .map_err(|_| SessionError::lost("timed out opening the stream"))?
            .map_err(SessionError::from_status)?
            .into_inner();
        let first = tokio::time::timeout(timeout, inbound.message())
            .await
            .map_err(|_| SessionError::lost("timed out waiting for HelloAck"))?
            .map_err(SessionError::from_status)?;
        match first.and_then(|m| m.kind) {
            Some(scheduler_message::Kind::HelloAck(ack)) => Ok((out, file_chunks, inbound, ack.heartbeat_interval_ms)),
            other => Err(SessionError::lost(format!("expected HelloAck, got {other:?}"))),
        }
    }
}

#[derive(Default)]
struct State {
    /// No new work: finish running jobs, then close the stream and stop.
    draining: bool,
    /// The embedder's shutdown future resolved (it must not be polled again).
    shutdown_requested: bool,
}

enum SessionError {
    Fatal(WorkerError),
    Lost { established: bool, reason: String },
}

impl SessionError {
    fn lost(reason: impl Into<String>) -> Self {
        Self::Lost {
            established: false,
            reason: reason.into(),
        }
    }

    fn from_status(status: Status) -> Self {
        match status.code() {
            Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument | Code::Unimplemented => {
                Self::Fatal(WorkerError::Rejected(status))
            }
            _ => Self::lost(format!("{}: {}", status.code(), status.message())),
        }
    }
}

struct RunningJob {
    attempt: u32,
    cancel: CancellationToken,
    cancel_requested: bool,
}

struct JobReport {
    driven: Driven,
    /// Files the job sent, listed in its result.
    files: Vec<gantry_proto::v1::OutputFile>,
    queue: Duration,
    run: Duration,
}

struct Driven {
    /// `None` when the job ignored its cancellation past the grace period.
    result: Option<Result<Output, JobError>>,
    deadline_exceeded: bool,
}

struct Session<'a, M> {
    model: &'a Arc<M>,
    config: &'a WorkerConfig,
    out: mpsc::Sender<WorkerMessage>,
    /// Places for file chunks in the outbound queue ([`FILE_CHUNKS_IN_FLIGHT`]).
    file_chunks: Arc<Semaphore>,
    jobs: HashMap<String, RunningJob>,
    tasks: JoinSet<JobReport>,
    task_jobs: HashMap<tokio::task::Id, String>,
}

impl<M: Model> Session<'_, M> {
    async fn serve<F: Future<Output = ()>>(
        mut self,
        mut inbound: Streaming<SchedulerMessage>,
        interval: Duration,
        mut shutdown: Pin<&mut F>,
        state: &mut State,
    ) -> Result<(), String> {
        let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if state.draining && self.jobs.is_empty() {
                return self.close(inbound).await;
            }
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(message)) => self.on_message(message, state).await?,
                    Ok(None) => return Err("scheduler closed the stream".into()),
                    Err(status) => return Err(format!("stream failed: {}: {}", status.code(), status.message())),
                },
                Some(joined) = self.tasks.join_next_with_id() => {
                    // Report every job that has ended by now, then give all
                    // their slots back in one credit.
                    let mut freed = self.on_job_done(joined).await?;
                    while let Some(joined) = self.tasks.try_join_next_with_id() {
                        freed += self.on_job_done(joined).await?;
                    }
                    self.return_credits(freed, state).await?;
                }
                _ = heartbeat.tick() => {
                    let beat = Heartbeat {
                        timestamp_unix_ms: unix_ms(SystemTime::now()),
                        running_job_ids: self.jobs.keys().cloned().collect(),
                    };
                    self.send(Kind::Heartbeat(beat)).await?;
                }
                () = shutdown.as_mut(), if !state.shutdown_requested => {
                    state.shutdown_requested = true;
                    if !state.draining {
                        tracing::info!(worker_id = %self.config.worker_id, running = self.jobs.len(), "shutdown requested; draining");
                        state.draining = true;
                        self.send(Kind::Draining(Draining {})).await?;
                    }
                }
            }
        }
    }

    /// Closes our half of the stream and waits (bounded) for the scheduler to
    /// end its half, so everything queued is delivered before we go.
    async fn close(self, mut inbound: Streaming<SchedulerMessage>) -> Result<(), String> {
        drop(self.out);
        let wait = async { while let Ok(Some(_)) = inbound.message().await {} };
        if tokio::time::timeout(self.config.connect_timeout, wait).await.is_err() {
            tracing::warn!(worker_id = %self.config.worker_id, "scheduler did not close the stream after drain");
        }
        tracing::info!(worker_id = %self.config.worker_id, "drained; worker stopped");
        Ok(())
    }

    async fn on_message(&mut self, message: SchedulerMessage, state: &mut State) -> Result<(), String> {
        match message.kind {
            Some(scheduler_message::Kind::Assign(assign)) => self.on_assign(assign, state).await,
            Some(scheduler_message::Kind::Cancel(cancel)) => {
                if let Some(job) = self.jobs.get_mut(&cancel.job_id) {
                    tracing::info!(job_id = %cancel.job_id, reason = %cancel.reason, "job cancelled by the scheduler");
                    job.cancel_requested = true;
                    job.cancel.cancel();
                }
                Ok(())
            }
            Some(scheduler_message::Kind::Drain(_)) => {
                if !state.draining {
                    tracing::info!(worker_id = %self.config.worker_id, running = self.jobs.len(), "scheduler asked to drain");
                    state.draining = true;
                }
                Ok(())
            }
            Some(scheduler_message::Kind::HelloAck(_)) | None => Ok(()),
        }
    }

    async fn on_assign(&mut self, assign: Assign, state: &State) -> Result<(), String> {
        let Assign {
            job_id,
            attempt,
            model,
            input_json,
            deadline_unix_ms,
            trace_parent,
        } = assign;
        let refusal = if state.draining {
            Some((true, "worker is draining".to_owned()))
        } else if model != self.model.id() {
            Some((true, format!("worker does not serve model {model:?}")))
        } else if self.jobs.contains_key(&job_id) {
            Some((true, "job is already running on this worker".to_owned()))
        } else {
            None
        };
        let input = match refusal {
            Some(refusal) => Err(refusal),
            None => serde_json::from_str(&input_json).map_err(|e| (false, format!("input is not valid JSON: {e}"))),
        };
        let deadline =
            (deadline_unix_ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(deadline_unix_ms.unsigned_abs()));
        // None: no deadline; Some(None): already passed.
        let remaining = deadline.map(|d| d.duration_since(SystemTime::now()).ok());
        let input = match (input, remaining) {
            (Ok(_), Some(None)) => Err((false, DEADLINE_EXCEEDED.to_owned())),
            (input, _) => input,
        };
        let input = match input {
            Ok(input) => input,
            Err((retryable, error)) => {
                tracing::warn!(%job_id, attempt, %error, "assignment refused");
                let failure = Failure {
                    job_id,
                    attempt,
                    error,
                    retryable,
                };
                self.send(Kind::Failure(failure)).await?;
                return self.return_credits(1, state).await;
            }
        };

        let cancel = CancellationToken::new();
        let ctx = JobContext::new(
            job_id.clone(),
            attempt,
            deadline,
            cancel.clone(),
            self.out.downgrade(),
            Arc::clone(&self.file_chunks),
        );
        let expires = remaining.flatten().map(|left| Instant::now() + left);
        let model = Arc::clone(self.model);
        let grace = self.config.cancel_grace;
        let token = cancel.clone();
        let received = Instant::now();
        // The run joins the job's trace: its parent is the scheduler's assignment.
        let span = if gantry_telemetry::trace::enabled() {
            let span = tracing::info_span!("job.run", job_id = %job_id, attempt, model = %self.model.id());
            gantry_telemetry::trace::set_parent(&span, Some(trace_parent.as_str()));
            span
        } else {
            tracing::Span::none()
        };
        let run = async move {
            let queue = received.elapsed();
            let started = Instant::now();
            let driven = drive(model, input, ctx.clone(), token, expires, grace).await;
            JobReport {
                driven,
                files: ctx.take_files().await,
                queue,
                run: started.elapsed(),
            }
        };
        let handle = self.tasks.spawn(tracing::Instrument::instrument(run, span));
        tracing::debug!(%job_id, attempt, "job started");
        self.task_jobs.insert(handle.id(), job_id.clone());
        gantry_telemetry::metrics().worker_slots(
            self.model.id(),
            self.jobs.len() as u64 + 1,
            u64::from(self.config.slots),
        );
        self.jobs.insert(
            job_id,
            RunningJob {
                attempt,
                cancel,
                cancel_requested: false,
            },
        );
        Ok(())
    }

    /// Reports how a job's task ended; returns the slots it freed (0 or 1).
    async fn on_job_done(&mut self, joined: Result<(tokio::task::Id, JobReport), JoinError>) -> Result<u32, String> {
        let (task_id, report) = match joined {
            Ok((id, report)) => (id, Ok(report)),
            Err(error) => (error.id(), Err(error)),
        };
        let Some(job_id) = self.task_jobs.remove(&task_id) else {
            return Ok(0);
        };
        let Some(job) = self.jobs.remove(&job_id) else {
            return Ok(0);
        };
        let run = report.as_ref().ok().map(|r| r.run);
        let message = terminal_message(job_id, &job, report);
        let outcome = match &message {
            Kind::Result(_) => "completed",
            Kind::Cancelled(_) => "cancelled",
            _ => "failed",
        };
        let metrics = gantry_telemetry::metrics();
        metrics.worker_job_finished(self.model.id(), outcome, run);
        metrics.worker_slots(self.model.id(), self.jobs.len() as u64, u64::from(self.config.slots));
        self.send(message).await?;
        Ok(1)
    }

    /// Gives slots back to the scheduler, unless we are draining.
    async fn return_credits(&self, slots: u32, state: &State) -> Result<(), String> {
        if state.draining || slots == 0 {
            return Ok(());
        }
        self.send(Kind::SlotCredit(SlotCredit { slots })).await
    }

    async fn send(&self, kind: Kind) -> Result<(), String> {
        send(&self.out, kind)
            .await
            .map_err(|_| "outbound stream closed".to_owned())
    }
}

async fn send(out: &mpsc::Sender<WorkerMessage>, kind: Kind) -> Result<(), SessionError> {
    out.send(WorkerMessage { kind: Some(kind) })
        .await
        .map_err(|_| SessionError::lost("outbound stream closed"))
}

/// Runs the model, honouring cancellation (with a grace period) and the
/// deadline.
async fn drive<M: Model>(
    model: Arc<M>,
    input: serde_json::Value,
    ctx: JobContext,
    cancel: CancellationToken,
    expires: Option<Instant>,
    grace: Duration,
) -> Driven {
    let mut run = pin!(model.run(input, ctx));
    let expired = async move {
        match expires {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let mut deadline_exceeded = false;
    tokio::select! {
        biased;
        result = &mut run => return Driven { result: Some(result), deadline_exceeded },
        () = cancel.cancelled() => {}
        () = expired => {
            deadline_exceeded = true;
            cancel.cancel();
        }
    }
    let result = tokio::time::timeout(grace, run).await.ok();
    Driven {
        result,
        deadline_exceeded,
    }
}

/// The message that ends one attempt.
fn terminal_message(job_id: String, job: &RunningJob, report: Result<JobReport, JoinError>) -> Kind {
    let attempt = job.attempt;
    let failure = |error: String, retryable: bool| {
        Kind::Failure(Failure {
            job_id: job_id.clone(),
            attempt,
            error,
            retryable,
        })
    };
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            let error = if error.is_panic() {
                format!("model panicked: {}", panic_message(error))
            } else {
                "job task was aborted".to_owned()
            };
            tracing::error!(%job_id, attempt, %error, "job crashed");
            return failure(error, true);
        }
    };
    match report.driven.result {
        Some(Ok(output)) => Kind::Result(gantry_proto::v1::Result {
            job_id,
            attempt,
            output_json: output.output.to_string(),
            usage: Some(output.usage),
            timings: Some(Timings {
                queue_ns: nanos(report.queue),
                load_ns: 0,
                run_ns: nanos(report.run),
            }),
            files: report.files,
        }),
        _ if report.driven.deadline_exceeded => failure(DEADLINE_EXCEEDED.into(), false),
        _ if job.cancel_requested => Kind::Cancelled(Cancelled { job_id, attempt }),
        Some(Err(error)) => failure(error.to_string(), error.is_retryable()),
        None => failure("job stopped without a result".into(), true),
    }
}

fn panic_message(error: JoinError) -> String {
    let payload = error.into_panic();
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `initial * 2^failures`, capped at `max`, then jittered into
/// `[delay / 2, delay]` so a fleet of workers does not reconnect in lockstep.
fn backoff_delay(initial: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.min(31));
    let delay = initial.saturating_mul(factor).min(max);
    let half = delay / 2;
    half + half.mul_f64(random_unit())
}

/// A random number in `[0, 1)` from the standard library's randomly keyed
/// hasher (no RNG dependency needed for jitter).
fn random_unit() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    () = ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C will stop the worker");
                ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c().await;
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let initial = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for failures in 0..40 {
            let delay = backoff_delay(initial, max, failures);
            let ceiling = initial.saturating_mul(2u32.saturating_pow(failures.min(31))).min(max);
            assert!(delay <= ceiling, "{delay:?} > {ceiling:?}");
            assert!(delay >= ceiling / 2, "{delay:?} < half of {ceiling:?}");
        }
        assert!(backoff_delay(initial, max, 30) <= max);
        let samples: std::collections::HashSet<_> = (0..20).map(|_| backoff_delay(initial, max, 5)).collect();
        assert!(samples.len() > 1, "no jitter");
    }

    #[test]
    fn refusals_that_retrying_cannot_fix_are_fatal() {
        for code in [Code::Unauthenticated, Code::PermissionDenied, Code::InvalidArgument] {
            assert!(matches!(
                SessionError::from_status(Status::new(code, "x")),
                SessionError::Fatal(WorkerError::Rejected(_))
            ));
        }
        assert!(matches!(
            SessionError::from_status(Status::unavailable("x")),
            SessionError::Lost { .. }
        ));
    }
}
