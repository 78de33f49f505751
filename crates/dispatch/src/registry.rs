//! The registry of connected workers and what runs where.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::{Duration, UNIX_EPOCH};

use gantry_proto::v1::{
    Assign, Cancel, Drain, Hello, SchedulerMessage, WorkerMessage, scheduler_message, worker_message::Kind,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::LiveObserver;
use crate::files::{Refused, StoredFile};
use crate::status::StreamError;
use crate::{AssignError, Assignment, DispatchConfig, Event, Health, ModelHealth, WorkerId, WorkerInfo};

/// Messages to one worker. Unbounded: assignments are bounded by the
/// worker's credits and the rest (cancel, drain) are rare.
pub(crate) type Outbound = mpsc::UnboundedSender<Result<SchedulerMessage, Status>>;

pub(crate) struct Inner {
    pub(crate) config: DispatchConfig,
    state: Mutex<Registry>,
    events: mpsc::Sender<Event>,
    next_conn: AtomicU64,
    live: RwLock<Option<LiveObserver>>,
}

#[derive(Default)]
struct Registry {
    workers: HashMap<WorkerId, WorkerEntry>,
    /// job id -> worker running it.
    jobs: HashMap<String, WorkerId>,
}

struct WorkerEntry {
    /// Which stream of this worker id the entry belongs to.
    conn: u64,
    hello: Hello,
    credits: u32,
    draining: bool,
    /// job id -> attempt.
    running: HashMap<String, u32>,
    /// Running jobs the worker's last heartbeats did not list, and in how
    /// many of them in a row (see [`OMITTED_BEATS`]).
    omitted: HashMap<String, u8>,
    last_seen: Instant,
    /// This worker's own lease, when it is not the configured one (a
    /// polling worker's).
    lease: Option<Duration>,
    tx: Outbound,
    /// Stops the stream's reader task.
    kill: CancellationToken,
}

/// Heartbeats in a row that may leave out a job the worker was assigned
/// before it is taken for one the worker never got. One can: the worker may
/// have written it before it read the assignment; the next is sent a whole
/// interval later, by the loop that reads assignments in between.
const OMITTED_BEATS: u8 = 2;

/// A freshly registered stream.
pub(crate) struct Registration {
    pub(crate) conn: u64,
    pub(crate) kill: CancellationToken,
}

impl Inner {
    pub(crate) fn new(config: DispatchConfig) -> (Arc<Self>, mpsc::Receiver<Event>) {
        let (events, rx) = mpsc::channel(config.event_capacity.max(1));
        let inner = Arc::new(Self {
            config,
            state: Mutex::new(Registry::default()),
            events,
            next_conn: AtomicU64::new(1),
            live: RwLock::new(None),
        });
        (inner, rx)
    }

    fn state(&self) -> MutexGuard<'_, Registry> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn observe_live(&self, observer: Option<LiveObserver>) {
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = observer;
    }

    pub(crate) async fn emit(&self, event: Event) {
        if matches!(event, Event::Chunk { .. } | Event::Progress { .. }) {
            let observer = self.live.read().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(observer) = observer {
                observer(&event);
            }
        }
        if self.events.send(event).await.is_err() {
            tracing::debug!("event receiver dropped; event discarded");
        }
    }

    /// Adds a worker whose HelloAck is already queued on `tx`. A previous
    /// stream of the same worker id is ended and reported lost.
    pub(crate) async fn register(&self, hello: Hello, tx: Outbound) -> Registration {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let kill = CancellationToken::new();
        let worker_id = hello.worker_id.clone();
        let models = hello.models.clone();
        let entry = WorkerEntry {
            conn,
            credits: hello.slots,
            hello,
            draining: false,
            running: HashMap::new(),
            omitted: HashMap::new(),
            last_seen: Instant::now(),
            lease: None,
            tx,
            kill: kill.clone(),
        };
        let replaced = {
            let mut state = self.state();
            let old = state.remove_worker(&worker_id, None);
            state.workers.insert(worker_id.clone(), entry);
            old
        };
        if let Some(old) = replaced {
            tracing::info!(%worker_id, "worker reconnected; dropping its previous stream");
            self.report_lost(&worker_id, old, Some(StreamError::Replaced)).await;
        }
        tracing::info!(%worker_id, ?models, "worker connected");
        for model in models {
            self.emit(Event::CapacityAvailable { model }).await;
        }
        Registration { conn, kill }
    }

    /// Gives stream `conn` of `worker_id` a lease of its own.
    pub(crate) fn set_lease(&self, worker_id: &str, conn: u64, lease: Duration) {
        let mut state = self.state();
        if let Some(entry) = state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) {
            entry.lease = Some(lease);
        }
    }

    /// Renews the lease of stream `conn` of `worker_id`; false if it is gone.
    pub(crate) fn touch(&self, worker_id: &str, conn: u64) -> bool {
        let mut state = self.state();
        match state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) {
            Some(entry) => {
                entry.last_seen = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Takes back the unused credit of stream `conn` of `worker_id`.
    pub(crate) fn revoke_credits(&self, worker_id: &str, conn: u64) {
        let mut state = self.state();
        if let Some(entry) = state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) {
            entry.credits = 0;
        }
    }

    /// The unused credit of stream `conn` of `worker_id`.
    pub(crate) fn credits_of(&self, worker_id: &str, conn: u64) -> Option<u32> {
        let state = self.state();
        state
            .workers
            .get(worker_id)
            .filter(|entry| entry.conn == conn)
            .map(|entry| entry.credits)
    }

    /// Removes stream `conn` of `worker_id` (if still registered) and reports
    /// it lost; `reason` is sent to the worker as the stream's final status.
    pub(crate) async fn deregister(&self, worker_id: &str, conn: u64, reason: Option<StreamError>) {
        let removed = self.state().remove_worker(worker_id, Some(conn));
        if let Some(entry) = removed {
            self.report_lost(worker_id, entry, reason).await;
        }
    }

    async fn report_lost(&self, worker_id: &str, entry: WorkerEntry, reason: Option<StreamError>) {
        if let Some(reason) = reason {
            let _ = entry.tx.send(Err(reason.into()));
        }
        entry.kill.cancel();
        let mut running_job_ids: Vec<String> = entry.running.into_keys().collect();
        running_job_ids.sort();
        if running_job_ids.is_empty() {
            tracing::info!(%worker_id, "worker left");
        } else {
            tracing::warn!(%worker_id, ?running_job_ids, "worker lost with running jobs");
        }
        self.emit(Event::WorkerLost {
            worker_id: worker_id.to_owned(),
            running_job_ids,
        })
        .await;
    }

    /// Handles one message of stream `conn` of `worker_id`. `files` are the
    /// stored files of a `Result` (or why they are unusable); the files no
    /// event carries on are handed back, for the caller to discard.
    pub(crate) async fn on_message(
        &self,
        worker_id: &str,
        conn: u64,
        message: WorkerMessage,
        files: Result<Vec<StoredFile>, Refused>,
    ) -> Vec<StoredFile> {
        let outcome = {
            let mut state = self.state();
            let Some(entry) = state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) else {
                return files.unwrap_or_default();
            };
            entry.last_seen = Instant::now();
            let Some(kind) = message.kind else {
                return files.unwrap_or_default();
            };
            let effect = state.apply(worker_id, &kind);
            (effect, kind)
        };
        // Payloads are parsed outside the lock: outputs can be large.
        match outcome {
            (Effect::Ignore, _) => files.unwrap_or_default(),
            (Effect::Capacity(models), _) => {
                for model in models {
                    self.emit(Event::CapacityAvailable { model }).await;
                }
                files.unwrap_or_default()
            }
            (Effect::NotRunThere(jobs), _) => {
                for (job_id, attempt) in jobs {
                    tracing::error!(%worker_id, %job_id, attempt, "the worker's heartbeats leave out a job assigned to it; failing it for a retry");
                    self.emit(Event::Failed {
                        job_id,
                        attempt,
                        worker_id: worker_id.to_owned(),
                        error: "the worker does not run the job it was assigned (its heartbeats leave it out)"
                            .to_owned(),
                        retryable: true,
                    })
                    .await;
                }
                files.unwrap_or_default()
            }
            (Effect::Forward, kind) => {
                let (event, unused) = job_event(worker_id, kind, files);
                if let Some(event) = event {
                    self.emit(event).await;
                }
                unused
            }
        }
    }

    /// Whether `job_id`'s `attempt` runs on stream `conn` of `worker_id`; a
    /// message of the stream, so the worker's lease is renewed.
    pub(crate) fn runs_on(&self, worker_id: &str, conn: u64, job_id: &str, attempt: u32) -> bool {
        let mut state = self.state();
        let Some(entry) = state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) else {
            return false;
        };
        entry.last_seen = Instant::now();
        entry.runs(job_id, attempt)
    }

    pub(crate) fn assign(&self, job: Assignment) -> Result<WorkerId, AssignError> {
        let mut state = self.state();
        if let Some(worker_id) = state.jobs.get(&job.job_id) {
            return Err(AssignError::AlreadyRunning {
                job_id: job.job_id,
                worker_id: worker_id.clone(),
            });
        }
        let mut candidates: Vec<(&WorkerId, &WorkerEntry)> = state
            .workers
            .iter()
            .filter(|(_, w)| !w.draining && w.credits > 0 && w.hello.models.contains(&job.model))
            .collect();
        // Least loaded first: fewest running jobs per announced slot, then
        // most credits, then id (for a stable order).
        candidates.sort_by(|(a_id, a), (b_id, b)| {
            let a_load = a.running.len() as u128 * u128::from(b.hello.slots.max(1));
            let b_load = b.running.len() as u128 * u128::from(a.hello.slots.max(1));
            a_load.cmp(&b_load).then(b.credits.cmp(&a.credits)).then(a_id.cmp(b_id))
        });
        let mut message = Ok(SchedulerMessage {
            kind: Some(scheduler_message::Kind::Assign(Assign {
                job_id: job.job_id.clone(),
                attempt: job.attempt,
                model: job.model.clone(),
                input_json: job.input_json,
                deadline_unix_ms: job.deadline.map_or(0, |deadline| {
                    deadline
                        .duration_since(UNIX_EPOCH)
                        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                        // A deadline before 1970 has passed: 1 ms after epoch.
                        .unwrap_or(1)
                }),
                trace_parent: job.trace_parent.unwrap_or_default(),
            })),
        });
        // A send fails only when the stream is going away (and hands the
        // message back); try the next one.
        let mut chosen = None;
        for (id, worker) in candidates {
            match worker.tx.send(message) {
                Ok(()) => {
                    chosen = Some(id.clone());
                    break;
                }
                Err(returned) => message = returned.0,
            }
        }
        let Some(worker_id) = chosen else {
            return Err(AssignError::NoCapacity { model: job.model });
        };
        if let Some(entry) = state.workers.get_mut(&worker_id) {
            entry.credits -= 1;
            entry.running.insert(job.job_id.clone(), job.attempt);
        }
        tracing::debug!(job_id = %job.job_id, attempt = job.attempt, %worker_id, "job assigned");
        state.jobs.insert(job.job_id, worker_id.clone());
        Ok(worker_id)
    }

    pub(crate) fn cancel(&self, job_id: &str, reason: &str) -> Option<WorkerId> {
        let state = self.state();
        let worker_id = state.jobs.get(job_id)?;
        let entry = state.workers.get(worker_id)?;
        let message = scheduler_message::Kind::Cancel(Cancel {
            job_id: job_id.to_owned(),
            reason: reason.to_owned(),
        });
        let _ = entry.tx.send(Ok(SchedulerMessage { kind: Some(message) }));
        Some(worker_id.clone())
    }

    /// Those of `job_ids` that no worker runs now.
    pub(crate) fn not_running(&self, job_ids: impl IntoIterator<Item = String>) -> Vec<String> {
        let state = self.state();
        job_ids.into_iter().filter(|id| !state.jobs.contains_key(id)).collect()
    }

    /// How many jobs stream `conn` of `worker_id` holds (assigned and not
    /// finished), as the registry counts them the moment it assigns.
    pub(crate) fn held_by(&self, worker_id: &str, conn: u64) -> Option<usize> {
        let state = self.state();
        state
            .workers
            .get(worker_id)
            .filter(|entry| entry.conn == conn)
            .map(|entry| entry.running.len())
    }

    /// Drains stream `conn` of `worker_id` only if it holds no job, in one
    /// step under the registry's lock, so no assignment can slip in between
    /// the look and the drain. True when it is now draining and empty.
    pub(crate) fn retire(&self, worker_id: &str, conn: u64) -> bool {
        let mut state = self.state();
        let Some(entry) = state.workers.get_mut(worker_id).filter(|entry| entry.conn == conn) else {
            return false;
        };
        if !entry.running.is_empty() {
            return false;
        }
        entry.draining = true;
        entry.credits = 0;
        let message = scheduler_message::Kind::Drain(Drain {});
        let _ = entry.tx.send(Ok(SchedulerMessage { kind: Some(message) }));
        tracing::info!(%worker_id, "retiring an idle worker");
        true
    }

    pub(crate) fn drain(&self, worker_id: &str) -> bool {
        let mut state = self.state();
        let Some(entry) = state.workers.get_mut(worker_id) else {
            return false;
        };
        entry.draining = true;
        let message = scheduler_message::Kind::Drain(Drain {});
        let _ = entry.tx.send(Ok(SchedulerMessage { kind: Some(message) }));
        tracing::info!(%worker_id, "draining worker");
        true
    }

    pub(crate) fn health(&self) -> Health {
        let state = self.state();
        let mut models: BTreeMap<String, ModelHealth> = BTreeMap::new();
        for entry in state.workers.values() {
            for model in &entry.hello.models {
                let health = models.entry(model.clone()).or_default();
                health.running_jobs += entry.running.len();
                if entry.draining {
                    health.draining_workers += 1;
                    continue;
                }
                health.free_slots += u64::from(entry.credits);
                if entry.running.is_empty() {
                    health.idle_workers += 1;
                } else {
                    health.running_workers += 1;
                }
            }
        }
        Health { models }
    }

    /// `health().models[model].free_slots`, without building the whole
    /// summary (the claim asks for it on every fill).
    pub(crate) fn free_slots(&self, model: &str) -> u64 {
        let state = self.state();
        state
            .workers
            .values()
            .filter(|entry| !entry.draining && entry.hello.models.iter().any(|m| m == model))
            .map(|entry| u64::from(entry.credits))
            .sum()
    }

    pub(crate) fn workers(&self) -> Vec<WorkerInfo> {
        let state = self.state();
        let mut workers: Vec<WorkerInfo> = state
            .workers
            .iter()
            .map(|(worker_id, entry)| {
                let mut running_job_ids: Vec<String> = entry.running.keys().cloned().collect();
                running_job_ids.sort();
                WorkerInfo {
                    worker_id: worker_id.clone(),
                    models: entry.hello.models.clone(),
                    slots: entry.hello.slots,
                    free_slots: entry.credits,
                    running_job_ids,
                    draining: entry.draining,
                    last_seen: entry.last_seen.elapsed(),
                    gpu_name: entry.hello.gpu_name.clone(),
                    gpu_memory_bytes: entry.hello.gpu_memory_bytes,
                    version: entry.hello.version.clone(),
                }
            })
            .collect();
        workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        workers
    }

    /// Ends every worker stream with `UNAVAILABLE`.
    pub(crate) async fn disconnect_all(&self) {
        let removed: Vec<(WorkerId, WorkerEntry)> = self.state().workers.drain().collect();
        self.state().jobs.clear();
        for (worker_id, entry) in removed {
            self.report_lost(&worker_id, entry, Some(StreamError::ShuttingDown))
                .await;
        }
    }

    /// Drops the workers whose lease ran out.
    async fn expire_leases(&self) {
        let lease = self.config.lease;
        let expired: Vec<(WorkerId, WorkerEntry)> = {
            let mut state = self.state();
            let ids: Vec<WorkerId> = state
                .workers
                .iter()
                .filter(|(_, entry)| entry.last_seen.elapsed() > entry.lease.unwrap_or(lease))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| state.remove_worker(&id, None).map(|entry| (id, entry)))
                .collect()
        };
        for (worker_id, entry) in expired {
            tracing::warn!(%worker_id, ?lease, "worker missed its heartbeats");
            self.report_lost(&worker_id, entry, Some(StreamError::LeaseExpired(lease)))
                .await;
        }
    }
}

impl Registry {
    /// Removes a worker (only stream `conn`, if given) and its jobs' index
    /// entries.
    fn remove_worker(&mut self, worker_id: &str, conn: Option<u64>) -> Option<WorkerEntry> {
        let current = self.workers.get(worker_id)?.conn;
        if conn.is_some_and(|conn| conn != current) {
            return None;
        }
        let entry = self.workers.remove(worker_id)?;
        for job_id in entry.running.keys() {
            self.jobs.remove(job_id);
        }
        Some(entry)
    }

    /// Applies one worker message to the registry. Returns whether the job
    /// layer should hear about it, and the models that gained capacity.
    fn apply(&mut self, worker_id: &str, kind: &Kind) -> Effect {
        let Some(entry) = self.workers.get_mut(worker_id) else {
            return Effect::Ignore;
        };
        match kind {
            Kind::Hello(_) => {
                tracing::warn!(%worker_id, "ignoring a second hello");
                Effect::Ignore
            }
            Kind::Heartbeat(beat) => {
                let gone = entry.not_listed(&beat.running_job_ids);
                if gone.is_empty() {
                    return Effect::Ignore;
                }
                for (job_id, _) in &gone {
                    entry.running.remove(job_id);
                    entry.omitted.remove(job_id);
                    // Its slot was never taken on the worker: it never
                    // gives it back.
                    entry.credits = entry.credits.saturating_add(1).min(entry.hello.slots);
                    // Should the assignment turn up after all, it stops there.
                    let cancel = scheduler_message::Kind::Cancel(Cancel {
                        job_id: job_id.clone(),
                        reason: "not run in time".to_owned(),
                    });
                    let _ = entry.tx.send(Ok(SchedulerMessage { kind: Some(cancel) }));
                }
                for (job_id, _) in &gone {
                    self.jobs.remove(job_id);
                }
                Effect::NotRunThere(gone)
            }
            Kind::FileChunk(_) => Effect::Ignore,
            Kind::Draining(_) => {
                tracing::info!(%worker_id, "worker is draining");
                entry.draining = true;
                Effect::Ignore
            }
            Kind::SlotCredit(credit) => {
                entry.credits = entry.credits.saturating_add(credit.slots);
                if entry.draining || credit.slots == 0 {
                    Effect::Ignore
                } else {
                    Effect::Capacity(entry.hello.models.clone())
                }
            }
            Kind::Progress(progress) => Effect::forward(entry.runs(&progress.job_id, progress.attempt)),
            Kind::StreamChunk(chunk) => Effect::forward(entry.runs(&chunk.job_id, chunk.attempt)),
            Kind::Result(result) => Effect::forward(self.finish(worker_id, &result.job_id, result.attempt)),
            Kind::Failure(failure) => Effect::forward(self.finish(worker_id, &failure.job_id, failure.attempt)),
            Kind::Cancelled(cancelled) => Effect::forward(self.finish(worker_id, &cancelled.job_id, cancelled.attempt)),
        }
    }

    /// Ends an attempt running on `worker_id`; false if it was not running.
    fn finish(&mut self, worker_id: &str, job_id: &str, attempt: u32) -> bool {
        let Some(entry) = self.workers.get_mut(worker_id) else {
            return false;
        };
        if !entry.runs(job_id, attempt) {
            tracing::warn!(%worker_id, %job_id, attempt, "terminal message for an attempt not running there");
            return false;
        }
        entry.running.remove(job_id);
        entry.omitted.remove(job_id);
        self.jobs.remove(job_id);
        true
    }
}

impl WorkerEntry {
    fn runs(&self, job_id: &str, attempt: u32) -> bool {
        self.running.get(job_id) == Some(&attempt)
    }

    /// Counts the running jobs a heartbeat does not list; returns those
    /// that [`OMITTED_BEATS`] heartbeats in a row left out, with their attempts.
    fn not_listed(&mut self, listed: &[String]) -> Vec<(String, u32)> {
        let listed: std::collections::HashSet<&str> = listed.iter().map(String::as_str).collect();
        self.omitted.retain(|job_id, _| !listed.contains(job_id.as_str()));
        let mut gone = Vec::new();
        for (job_id, attempt) in &self.running {
            if listed.contains(job_id.as_str()) {
                continue;
            }
            let count = self.omitted.entry(job_id.clone()).or_insert(0);
            *count += 1;
            if *count >= OMITTED_BEATS {
                gone.push((job_id.clone(), *attempt));
            }
        }
        gone.sort();
        gone
    }
}

/// What a worker message means for the job layer.
enum Effect {
    Ignore,
    /// Models whose capacity grew.
    Capacity(Vec<String>),
    /// Jobs (with their attempts) the worker does not run, though assigned.
    NotRunThere(Vec<(String, u32)>),
    /// A message about a job running there: turn it into an event.
    Forward,
}

impl Effect {
    fn forward(accepted: bool) -> Self {
        if accepted { Self::Forward } else { Self::Ignore }
    }
}

/// Text a worker sent, made storable in every database: PostgreSQL's text
/// type cannot hold a NUL character, which is written as the escape `\u0000`
/// instead. (JSON payloads are parsed and re-serialized, which escapes it.)
fn storable(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\\u0000")
    } else {
        text
    }
}

/// The event for a job message accepted by [`Registry::apply`], and the files
/// it does not carry.
fn job_event(worker_id: &str, kind: Kind, files: Result<Vec<StoredFile>, Refused>) -> (Option<Event>, Vec<StoredFile>) {
    let worker_id = worker_id.to_owned();
    let event = match kind {
        Kind::Progress(progress) => Event::Progress {
            message: parse_lenient(progress.message_json),
            job_id: progress.job_id,
            attempt: progress.attempt,
            worker_id,
        },
        Kind::StreamChunk(chunk) => Event::Chunk {
            output: parse_lenient(chunk.output_json),
            seq: chunk.seq,
            job_id: chunk.job_id,
            attempt: chunk.attempt,
            worker_id,
        },
        Kind::Result(result) => {
            let (event, unused) = match (serde_json::from_str(&result.output_json), files) {
                (Ok(output), Ok(files)) => (
                    Event::Completed {
                        job_id: result.job_id,
                        attempt: result.attempt,
                        worker_id,
                        output,
                        usage: result.usage.unwrap_or_default(),
                        timings: result.timings.unwrap_or_default(),
                        files,
                    },
                    Vec::new(),
                ),
                (Err(error), files) => (
                    Event::Failed {
                        job_id: result.job_id,
                        attempt: result.attempt,
                        worker_id,
                        error: format!("worker sent output that is not JSON: {error}"),
                        retryable: true,
                    },
                    files.unwrap_or_default(),
                ),
                (Ok(_), Err(refused)) => (
                    Event::Failed {
                        job_id: result.job_id,
                        attempt: result.attempt,
                        worker_id,
                        error: storable(refused.error),
                        retryable: refused.retryable,
                    },
                    Vec::new(),
                ),
            };
            return (Some(event), unused);
        }
        Kind::Failure(failure) => Event::Failed {
            job_id: failure.job_id,
            attempt: failure.attempt,
            worker_id,
            error: storable(failure.error),
            retryable: failure.retryable,
        },
        Kind::Cancelled(cancelled) => Event::Cancelled {
            job_id: cancelled.job_id,
            attempt: cancelled.attempt,
            worker_id,
        },
        Kind::Hello(_) | Kind::Heartbeat(_) | Kind::Draining(_) | Kind::SlotCredit(_) | Kind::FileChunk(_) => {
            return (None, files.unwrap_or_default());
        }
    };
    (Some(event), files.unwrap_or_default())
}

/// Parses a worker's JSON; keeps malformed text as a JSON string.
fn parse_lenient(text: String) -> Value {
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// Starts the task that expires leases. It holds only a weak reference and
/// stops when the registry is dropped.
pub(crate) fn spawn_reaper(inner: &Arc<Inner>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let period = (inner.config.lease / 4).max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            inner.expire_leases().await;
        }
    });
}
