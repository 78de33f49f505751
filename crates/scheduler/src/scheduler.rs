//! The running half: claims queued jobs, assigns them to workers through the
//! dispatcher, settles what workers report, and sweeps (leases, timeouts,
//! expiry).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_catalog::ModelCatalog;
use gantry_dispatch::{AssignError, Assignment, DEADLINE_EXCEEDED, Dispatcher, Event, Health};
use rand::RngExt;
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter, QuerySelect,
    TransactionTrait,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::config::millis;
use crate::db::{now_ms, plus, serialize_writes};
use crate::engine::Engine;
use crate::entity::{chunk, job, presence, worker_gpu};
use crate::lane::Handed;
use crate::plan::{self, Plan, Settled, Step, Store, Usage, is_final, running_jobs};
use crate::signals::Signal;
use crate::store::{Hub, JobStore, retention_expr};
use crate::types::{JobStatus, JobView, SchedulerError};
use crate::wakeups::Attached;
use crate::webhooks;

use job::Column as J;

/// Most events settled in one transaction.
const EVENT_BATCH: usize = 256;
/// Ids per `IN (…)` list.
const ID_CHUNK: usize = 500;
/// How long a batch of only stream chunks and progress messages waits to be
/// stored together with later events: live readers already have them (see
/// `live.rs`), so a token stream costs one transaction per this period, not
/// one per token. A terminal event stores them at once, before itself.
const STREAM_COALESCE: Duration = Duration::from_millis(25);
/// Expired jobs deleted per round, and rounds per sweep.
const EXPIRE_BATCH: u64 = 1000;
const EXPIRE_ROUNDS: usize = 10;
/// Finished jobs before the first `ANALYZE jobs` (PostgreSQL), and the most
/// between two.
const ANALYZE_AFTER_FIRST: u64 = 1_000;
const ANALYZE_AFTER_MAX: u64 = 1_000_000;
/// `worker_presence` rows of any instance not refreshed for this long (and
/// at least the freshness window) are deleted, at most once per this period.
const PRESENCE_PRUNE_MS: i64 = 60_000;

/// The scheduler's loops, running on a Tokio task. Stop it with
/// [`Scheduler::shutdown`]; dropping it instead behaves like a crash (its jobs
/// are requeued by whichever scheduler sweeps after its lease lapses).
pub struct Scheduler {
    instance_id: String,
    hub: Arc<Hub>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// Tasks beside the loop: the sweeper of output files, the accrual of
    /// network volume storage.
    background: Vec<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts claiming jobs of `store` for the workers of `dispatcher`, whose
    /// events this scheduler consumes. Each call is a new scheduler instance
    /// with its own leases. Fails if the database cannot be reached.
    pub async fn start(
        store: JobStore,
        catalog: Arc<ModelCatalog>,
        dispatcher: Dispatcher,
        events: mpsc::Receiver<Event>,
    ) -> Result<Scheduler, SchedulerError> {
        let instance_id = format!("sched-{:016x}", rand::rng().random::<u64>());
        let webhooks = webhooks::Deliveries::new(&store.config, store.db.clone(), Arc::clone(&store.hub.writes.lock))?;
        let mut core = Core {
            _attached: Attached::new(&store.hub.wakeups),
            db: store.db.clone(),
            store,
            catalog,
            dispatcher,
            instance: instance_id.clone(),
            running: HashMap::new(),
            pending_workers: HashMap::new(),
            to_fill: HashSet::new(),
            drained: HashSet::new(),
            signalled_in_flight: HashSet::new(),
            gpus_published: false,
            webhooks,
            presence: HashSet::new(),
            presence_pruned_ms: 0,
            fast_lane: false,
            ready: HashMap::new(),
            finished_since_analyze: 0,
            analyze_after: ANALYZE_AFTER_FIRST,
            rechecks: HashSet::new(),
        };
        if core.store.config.sole_owner {
            // No other process can hold these jobs: a crashed predecessor did.
            core.requeue_orphans(true).await?;
        }
        core.sweep().await?;
        // Every submit may take the lane, on both backends. (Until the
        // PostgreSQL claim was fixed, `/run` jobs did not on PostgreSQL: see
        // "Claims" in docs/scheduler.md and docs/decisions/0021-fast-lane-run-on-postgres.md.)
        core.fast_lane = core
            .store
            .hub
            .lane
            .open(&core.instance, millis(core.store.config.lease));
        let hub = Arc::clone(&core.store.hub);
        // Chunks and progress reach live readers as they arrive, before they
        // are stored (see live.rs).
        let live = Arc::downgrade(&hub);
        core.dispatcher.observe_live(Some(Arc::new(move |event: &Event| {
            if let Some(hub) = live.upgrade() {
                hub.live_event(event);
            }
        })));
        let mut background = Vec::new();
        if let Some(files) = core.store.config.files.clone() {
            background.push(tokio::spawn(crate::files::sweep(
                files,
                core.db.clone(),
                Arc::clone(&core.store.hub.writes.lock),
            )));
        }
        background.push(tokio::spawn(accrue_storage(core.store.clone())));
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(core.run(events, stopped));
        Ok(Scheduler {
            instance_id,
            hub,
            stop: Some(stop),
            task: Some(task),
            background,
        })
    }

    /// This instance's id, as stored in `jobs.owner`.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Stops the loops and hands the jobs this instance runs back to the queue
    /// at once (without using up an attempt); they are cancelled on their workers.
    pub async fn shutdown(mut self) {
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(task) = self.task.take() {
            task.abort();
            // No more submits written as claimed by this instance; those
            // already written are requeued when its lease lapses, and those
            // it kept in memory are gone with it.
            if self.hub.lane.close(&self.instance_id).is_some() {
                self.hub.lose_all();
            }
        }
    }
}

/// A job this instance has assigned and not yet settled.
struct Running {
    attempt: i32,
    model: String,
    deadline_ms: i64,
    /// False while it waits in `Core::ready` for a free slot.
    assigned: bool,
    /// The whole row of a job not written yet (a `runsync` job of the fast
    /// lane, see `store::Lane`), and when it is to be written if still running.
    unstored: Option<Box<job::Model>>,
    store_at: i64,
    /// It sent a chunk or progress: readers may follow it from other
    /// processes, so its end is announced to them (see `publish`).
    streamed: bool,
}

impl Running {
    /// When the loop must look at this job: its deadline, or when to write it.
    fn due_at(&self) -> i64 {
        if self.unstored.is_some() {
            self.store_at.min(self.deadline_ms)
        } else {
            self.deadline_ms
        }
    }
}

struct Core {
    store: JobStore,
    db: DatabaseConnection,
    catalog: Arc<ModelCatalog>,
    dispatcher: Dispatcher,
    instance: String,
    running: HashMap<String, Running>,
    /// Worker ids not yet written to their job rows (written at the next sweep,
    /// unless the job settles first and writes it itself).
    pending_workers: HashMap<String, String>,
    to_fill: HashSet<String>,
    /// Models whose last claim found the queue empty: a freed slot alone does
    /// not trigger a claim for them (a submit, a requeue or a sweep does).
    drained: HashSet<String>,
    /// Models whose queue was signalled while a settlement (and its claims)
    /// was being committed: that claim may have missed the new jobs, so its
    /// finding an empty queue must not drop them (see `finish_settlement`).
    signalled_in_flight: HashSet<String>,
    /// Whether `worker_gpus` holds rows of this instance.
    gpus_published: bool,
    webhooks: webhooks::Deliveries,
    /// Models this instance has `worker_presence` rows for.
    presence: HashSet<String>,
    /// When this instance last pruned long-stale `worker_presence` rows.
    presence_pruned_ms: i64,
    /// Whether this instance has the process's fast lane (see `store::Lane`).
    fast_lane: bool,
    /// Jobs claimed ahead of free slots, per model, oldest first (see
    /// `SchedulerConfig::claim_ahead`). Also in `running`, not assigned.
    ready: HashMap<String, VecDeque<Assignment>>,
    /// Jobs finished since statistics were last refreshed, and how many more
    /// call for the next refresh (see `analyze_if_grown`).
    finished_since_analyze: u64,
    analyze_after: u64,
    /// Running jobs another process signalled cancelled: their rows are
    /// checked between settlements (see `recheck`).
    rechecks: HashSet<String>,
    /// Counts this scheduler on the hub while the loop lives.
    _attached: Attached,
}

/// What one settled batch produced, applied after its commit.
#[derive(Default)]
struct Outcome {
    finals: Vec<job::Model>,
    settled: Vec<String>,
    refill: HashSet<String>,
    /// Jobs claimed in the same transaction: (model, how many were asked for, rows).
    claims: Vec<(String, u64, Vec<job::Model>)>,
    /// Unstored jobs the plan writes.
    stored: Vec<String>,
}

impl Core {
    async fn run(mut self, mut events: mpsc::Receiver<Event>, mut stopped: oneshot::Receiver<()>) {
        let hub = Arc::clone(&self.store.hub);
        let mut tick = tokio::time::interval(self.store.config.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events_open = true;
        // The settlement being committed. The loop does not wait for it: it
        // goes on placing handed-over jobs, cancelling and sweeping meanwhile.
        let mut flight: Option<InFlight> = None;
        // Chunks and progress waiting to be stored with what comes next (see
        // `STREAM_COALESCE`), and when they are stored at the latest.
        let mut deferred: Vec<Event> = Vec::new();
        let mut deferred_until: Option<tokio::time::Instant> = None;
        loop {
            let next_deadline = self.running.values().map(Running::due_at).min();
            let deadline_sleep = sleep_until_some(next_deadline.map(|at| tokio::time::Instant::now() + until(at)));
            tokio::select! {
                // Stop, sweeps and due deadlines are ready only now and then,
                // so listing them first cannot starve the event stream, and a
                // busy event stream cannot starve the sweeps (lease renewal).
                biased;
                _ = &mut stopped => break,
                // Sweeps and timeouts update job rows the settlement may hold
                // (leases of the jobs it completes): run them between
                // settlements, never beside one, or on PostgreSQL the two
                // transactions can lock the same rows in opposite orders.
                _ = tick.tick(), if flight.is_none() => {
                    if let Err(error) = self.sweep().await {
                        tracing::warn!(%error, "sweep failed");
                    }
                }
                () = deadline_sleep, if flight.is_none() => {
                    if let Err(error) = self.store_due().await {
                        tracing::warn!(%error, "writing running jobs failed");
                    }
                    let now = now_ms();
                    let timed_out = self.running.values().any(|r| r.unstored.is_none() && r.deadline_ms <= now);
                    if timed_out && let Err(error) = self.time_out().await {
                        tracing::warn!(%error, "timeout sweep failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                () = hub.wakeups.notify.notified() => {
                    let adopted = hub.lane.adopt(&self.instance);
                    if !adopted.is_empty() {
                        self.adopt(adopted).await;
                    }
                    let pending = hub.wakeups.take();
                    if pending.refill_all {
                        self.fill_all_with_free_slots(&self.dispatcher.health());
                        if flight.is_some() {
                            self.signalled_in_flight.extend(self.to_fill.iter().cloned());
                        }
                    }
                    for model in pending.models {
                        self.drained.remove(&model);
                        if flight.is_some() {
                            self.signalled_in_flight.insert(model.clone());
                        }
                        self.to_fill.insert(model);
                    }
                    for job_id in pending.cancels {
                        if self.running.remove(&job_id).is_some() {
                            self.pending_workers.remove(&job_id);
                            self.dispatcher.cancel(&job_id, "cancelled");
                        }
                    }
                    self.rechecks.extend(
                        pending
                            .rechecks
                            .into_iter()
                            .filter(|id| self.running.get(id).is_some_and(|r| r.unstored.is_none())),
                    );
                }
                done = settling(&mut flight), if flight.is_some() => {
                    if let Some(InFlight { batch, outcome, .. }) = flight.take() {
                        self.finish_settlement(batch, outcome, done).await;
                    }
                }
                // One settlement at a time: events that arrive while it
                // commits make up the next batch.
                event = events.recv(), if events_open && flight.is_none() => match event {
                    Some(first) => {
                        let mut batch = std::mem::take(&mut deferred);
                        batch.push(first);
                        while batch.len() < EVENT_BATCH {
                            match events.try_recv() {
                                Ok(event) => batch.push(event),
                                Err(_) => break,
                            }
                        }
                        if batch.len() < EVENT_BATCH && batch.iter().all(|event| stream_job(event).is_some()) {
                            // Readers have these live already: store them
                            // with whatever arrives in the next few ms.
                            deferred = batch;
                            deferred_until.get_or_insert_with(|| tokio::time::Instant::now() + STREAM_COALESCE);
                        } else {
                            deferred_until = None;
                            flight = Some(self.start_settlement(batch));
                        }
                    }
                    None => events_open = false,
                },
                () = sleep_until_some(deferred_until), if flight.is_none() => {
                    deferred_until = None;
                    flight = Some(self.start_settlement(std::mem::take(&mut deferred)));
                }
            }
            if flight.is_none() {
                if !self.rechecks.is_empty() {
                    let ids: Vec<String> = self.rechecks.drain().collect();
                    if let Err(error) = self.recheck(ids).await {
                        tracing::warn!(%error, "checking cancelled jobs failed");
                    }
                }
                self.fill().await;
            }
            if self.fast_lane {
                self.refresh_credits();
            }
        }
        if let Some(InFlight { batch, outcome, work }) = flight.take() {
            let done = work.await;
            self.finish_settlement(batch, outcome, done).await;
        }
        if !deferred.is_empty() {
            let InFlight { batch, outcome, work } = self.start_settlement(deferred);
            let done = work.await;
            self.finish_settlement(batch, outcome, done).await;
        }
        // Jobs handed over but not adopted are this instance's too: the
        // release below requeues them with the rest.
        let left = if self.fast_lane {
            hub.lane.close(&self.instance).unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Err(error) = self.release(left).await {
            tracing::warn!(%error, "could not hand running jobs back to the queue");
        }
        if self.fast_lane {
            // Any job still only in memory could not be written: gone.
            hub.lose_all();
        }
        if let Err(error) = self.withdraw_presence().await {
            tracing::warn!(%error, "could not remove this scheduler's worker presence");
        }
    }

    // ---- settling worker events ----

    /// Applies a batch of events in one transaction (retried a few times on a
    /// database error). Completion and charge of a job commit together.
    fn start_settlement(&mut self, batch: Vec<Event>) -> InFlight {
        self.signalled_in_flight.clear();
        // Freed slots take jobs kept ready before anything is written.
        if !self.ready.is_empty() {
            self.assign_ready();
        }
        let (outcome, plan) = self.plan_settlement(&batch);
        let work: Settling = if plan.is_empty() {
            Box::pin(std::future::ready(Ok(Settled::default())))
        } else {
            let (engine, db, lock) = (
                self.store.hub.writes.engine.clone(),
                self.db.clone(),
                Arc::clone(&self.store.hub.writes.lock),
            );
            // Its own task, so it makes progress while the loop is busy elsewhere.
            let task = tokio::spawn(async move {
                let mut attempt = 0u32;
                loop {
                    match execute(engine.as_ref(), &db, &lock, plan.clone()).await {
                        Ok(settled) => return Ok(settled),
                        Err(error) if attempt < 2 => {
                            tracing::warn!(%error, attempt, "settling worker events failed");
                            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                            attempt += 1;
                        }
                        Err(error) => return Err(error),
                    }
                }
            });
            Box::pin(async move { task.await.unwrap_or_else(|e| Err(DbErr::Custom(e.to_string()))) })
        };
        InFlight { batch, outcome, work }
    }

    /// Applies a committed settlement: forgets the settled jobs, wakes their
    /// waiters, and places what it claimed.
    async fn finish_settlement(&mut self, batch: Vec<Event>, mut outcome: Outcome, done: Result<Settled, DbErr>) {
        match done {
            Ok(settled) => {
                // One span per job whose final status committed, in its
                // trace, and one for the batch (a trace of its own) linking
                // the jobs it settled in one transaction.
                if gantry_telemetry::trace::enabled() && !settled.finals.is_empty() {
                    let batch = tracing::info_span!(parent: None, "settlement", jobs = settled.finals.len());
                    for row in &settled.finals {
                        let span = tracing::info_span!("job.settle", job_id = %row.id, status = %row.status);
                        gantry_telemetry::trace::set_parent(&span, row.trace_context.as_deref());
                        gantry_telemetry::trace::add_link(&batch, row.trace_context.as_deref());
                    }
                }
                outcome.finals = settled.finals;
                outcome.claims = settled.claims;
                // Chunks and progress are stored: readers of this process
                // that were missing one (a gap) can read it now.
                self.store.hub.live.stored(batch.iter().filter_map(stream_job));
            }
            Err(error) => {
                tracing::warn!(%error, "giving up on settling worker events");
                // Jobs that ended only in memory (never written) are lost.
                let lost: Vec<String> = outcome
                    .settled
                    .iter()
                    .filter(|id| self.running.get(*id).is_some_and(|r| r.unstored.is_some()))
                    .cloned()
                    .collect();
                for job_id in &lost {
                    self.running.remove(job_id);
                    self.pending_workers.remove(job_id);
                }
                self.store.hub.lose(&lost);
                // Left IN_PROGRESS in the database: forget them here so their
                // lease lapses and a sweep requeues them.
                for event in &batch {
                    if let Some(job_id) = terminal_job(event) {
                        self.running.remove(job_id);
                        self.pending_workers.remove(job_id);
                    }
                }
                return;
            }
        }
        for job_id in &outcome.stored {
            if let Some(running) = self.running.get_mut(job_id) {
                running.unstored = None;
            }
        }
        self.store.hub.lane.stored(&outcome.stored);
        for job_id in batch.iter().filter_map(stream_job) {
            if let Some(running) = self.running.get_mut(job_id) {
                running.streamed = true;
            }
        }
        // Announced to other processes: the end of a `runsync` job (its
        // caller may wait there) and of a job that streamed (a reader may
        // follow it there).
        let mut streamed = HashSet::new();
        for job_id in &outcome.settled {
            if self.running.remove(job_id).is_some_and(|running| running.streamed) {
                streamed.insert(job_id.clone());
            }
            self.pending_workers.remove(job_id);
        }
        for model in outcome.refill {
            // Requeued: another process's scheduler may have a free slot first.
            self.store.hub.signal(Signal::Queued(model.clone()));
            self.drained.remove(&model);
            self.to_fill.insert(model);
        }
        self.publish(&outcome.finals, |row| row.sync || streamed.contains(&row.id));
        for event in batch {
            if let Event::CapacityAvailable { model } = event
                && !self.drained.contains(&model)
            {
                self.to_fill.insert(model);
            }
        }
        // Place what the transaction claimed; a model whose queue may hold
        // more stays marked for filling.
        for (model, want, rows) in outcome.claims {
            match self.place(&model, want, rows).await {
                Ok(true) => {}
                Ok(false) => {
                    self.to_fill.remove(&model);
                }
                Err(error) => tracing::warn!(%model, %error, "assigning claimed jobs failed"),
            }
        }
        // Jobs queued while the claim was being committed may not have been
        // seen by it: claim again rather than wait for a sweep.
        for model in std::mem::take(&mut self.signalled_in_flight) {
            self.drained.remove(&model);
            self.to_fill.insert(model);
        }
    }

    /// Models to claim for in the settlement transaction of `batch`: those
    /// marked for filling, those whose slots it freed (unless their queue was
    /// found empty), and those it requeues jobs of.
    fn claim_models(&self, batch: &[Event], refill: &HashSet<String>) -> Vec<String> {
        let mut models: Vec<String> = self.to_fill.iter().cloned().collect();
        for event in batch {
            if let Event::CapacityAvailable { model } = event
                && !self.drained.contains(model)
                && !models.contains(model)
            {
                models.push(model.clone());
            }
        }
        for model in refill {
            if !models.contains(model) {
                models.push(model.clone());
            }
        }
        models
    }

    /// What settling `batch` writes (see `plan.rs`), and the bookkeeping to
    /// apply once it is committed.
    fn plan_settlement(&self, batch: &[Event]) -> (Outcome, Plan) {
        let mut plan = Plan::new(now_ms(), &self.store.config, &self.instance);
        let mut outcome = Outcome::default();
        // Jobs already settled earlier in this batch (duplicates are ignored).
        let mut done: HashSet<&str> = HashSet::new();
        // Unstored jobs this plan writes as running (they streamed a chunk):
        // later events of the batch update that row like any other.
        let mut written: HashSet<&str> = HashSet::new();
        // Where each job's progress message is in `plan.progress` (the
        // batch's latest one wins: one write per job per batch).
        let mut progress_at: HashMap<&str, usize> = HashMap::new();
        for event in batch {
            let current = |job_id: &str, attempt: u32| {
                self.running
                    .get(job_id)
                    .filter(|r| i64::from(r.attempt) == i64::from(attempt) && !done.contains(job_id))
            };
            // The in-memory row of an unstored job, if it still is.
            let unstored = |running: &Running, job_id: &str| {
                running
                    .unstored
                    .as_deref()
                    .filter(|_| !written.contains(job_id))
                    .cloned()
            };
            match event {
                Event::Chunk {
                    job_id,
                    attempt,
                    seq,
                    output,
                    ..
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    // Chunks are read by job id: write the job first.
                    if let Some(row) = unstored(running, job_id) {
                        let worker = self.pending_workers.get(job_id.as_str()).cloned();
                        plan.stores.push(Store {
                            row: plan.running(row, worker),
                            charge: None,
                        });
                        outcome.stored.push(job_id.clone());
                        written.insert(job_id);
                    }
                    let seq = i64::try_from(*seq).unwrap_or(i64::MAX);
                    plan.chunks.push((job_id.clone(), seq, output.to_string()));
                }
                Event::Completed {
                    job_id,
                    attempt,
                    worker_id,
                    output,
                    usage,
                    files,
                    ..
                } => {
                    let files = (!files.is_empty()).then(|| serde_json::to_string(files).unwrap_or_default());
                    let Some(running) = current(job_id, *attempt) else {
                        tracing::debug!(%job_id, attempt, "ignoring a result for an attempt not running here");
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    let priced = match self.catalog.get(&running.model) {
                        Some(spec) => gantry_billing::cost(usage.quantity_micros, &usage.unit, spec)
                            .map_err(|e| format!("cannot bill the result: {e}")),
                        None => Err(format!("model {:?} is not in the catalog", running.model)),
                    };
                    let priced = priced.map(|amount| Usage {
                        unit: usage.unit.clone(),
                        quantity_micros: usage.quantity_micros,
                        amount,
                    });
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        plan.stores.push(match priced {
                            Ok(usage) => Store {
                                row: plan.completed(
                                    row,
                                    worker_id,
                                    output_with_cost(output, usage.amount),
                                    &usage,
                                    files,
                                ),
                                charge: Some(usage),
                            },
                            Err(error) => Store {
                                row: plan.finished(row, JobStatus::Failed, Some(error), Some(worker_id.clone())),
                                charge: None,
                            },
                        });
                        continue;
                    }
                    plan.steps.push(match priced {
                        Ok(usage) => Step::Complete {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            worker_id: worker_id.clone(),
                            output: output_with_cost(output, usage.amount),
                            usage,
                            files,
                        },
                        Err(error) => Step::Finish {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            status: JobStatus::Failed,
                            error: Some(error),
                            worker_id: Some(worker_id.clone()),
                        },
                    });
                }
                Event::Failed {
                    job_id,
                    attempt,
                    worker_id,
                    error,
                    retryable,
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    let status = if error == DEADLINE_EXCEEDED {
                        JobStatus::TimedOut
                    } else {
                        JobStatus::Failed
                    };
                    if *retryable {
                        outcome.refill.insert(running.model.clone());
                    }
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        let row = if *retryable {
                            plan.requeued(row, error)
                        } else {
                            plan.finished(row, status, Some(error.clone()), Some(worker_id.clone()))
                        };
                        plan.stores.push(Store { row, charge: None });
                    } else if *retryable {
                        plan.steps.push(Step::Requeue {
                            job_id: job_id.clone(),
                            attempt: i64::from(running.attempt),
                            error: error.clone(),
                        });
                    } else {
                        plan.steps.push(Step::Finish {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            status,
                            error: Some(error.clone()),
                            worker_id: Some(worker_id.clone()),
                        });
                    }
                }
                Event::Cancelled { job_id, attempt, .. } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        plan.stores.push(Store {
                            row: plan.finished(row, JobStatus::Cancelled, None, None),
                            charge: None,
                        });
                        continue;
                    }
                    // Normally already CANCELLED (or TIMED_OUT) in the database.
                    plan.steps.push(Step::Finish {
                        job_id: job_id.clone(),
                        attempt: i64::from(*attempt),
                        status: JobStatus::Cancelled,
                        error: None,
                        worker_id: None,
                    });
                }
                Event::WorkerLost { running_job_ids, .. } => {
                    for job_id in running_job_ids {
                        let Some(running) = self.running.get(job_id).filter(|_| !done.contains(job_id.as_str())) else {
                            continue;
                        };
                        let row = unstored(running, job_id);
                        done.insert(job_id);
                        outcome.settled.push(job_id.clone());
                        outcome.refill.insert(running.model.clone());
                        if let Some(row) = row {
                            outcome.stored.push(job_id.clone());
                            plan.stores.push(Store {
                                row: plan.requeued(row, "worker lost"),
                                charge: None,
                            });
                            continue;
                        }
                        plan.steps.push(Step::Requeue {
                            job_id: job_id.clone(),
                            attempt: i64::from(running.attempt),
                            error: "worker lost".into(),
                        });
                    }
                }
                Event::Progress {
                    job_id,
                    attempt,
                    message,
                    ..
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    // A job not written yet has no row to show progress on.
                    if unstored(running, job_id).is_some() {
                        continue;
                    }
                    let text = message.to_string();
                    match progress_at.get(job_id.as_str()) {
                        Some(&i) => plan.progress[i].2 = text,
                        None => {
                            progress_at.insert(job_id.as_str(), plan.progress.len());
                            plan.progress
                                .push((job_id.clone(), i32::try_from(*attempt).unwrap_or(i32::MAX), text));
                        }
                    }
                }
                Event::CapacityAvailable { .. } => {}
            }
        }
        // The slots these results freed: claim their next jobs in the same
        // commit (one write lock and one commit fewer per round). They are
        // assigned after the commit.
        for model in self.claim_models(batch, &outcome.refill) {
            let want = self.want(&model);
            if want > 0 {
                plan.claims.push((model, want));
            }
        }
        (outcome, plan)
    }

    /// PostgreSQL: refreshes the planner's statistics of `jobs` after this
    /// instance has finished 1 000 jobs, then 2 000 more, 4 000… (up to every
    /// million). A connection keeps the generic plan it makes of a statement
    /// after five runs until the table's statistics change; made while `jobs`
    /// was nearly empty (a new database; autovacuum analyzes only about once a
    /// minute), the settlement's plan scanned the table for every job and took
    /// seconds once it held tens of thousands of rows. `ANALYZE` samples a
    /// bounded number of rows and makes connections plan again.
    async fn analyze_if_grown(&mut self) {
        if self.finished_since_analyze < self.analyze_after || self.db.get_database_backend() != DbBackend::Postgres {
            return;
        }
        match self.db.execute_unprepared("ANALYZE jobs").await {
            Ok(_) => {
                self.finished_since_analyze = 0;
                self.analyze_after = (self.analyze_after * 2).min(ANALYZE_AFTER_MAX);
            }
            Err(error) => tracing::warn!(%error, "could not analyze the jobs table"),
        }
    }

    /// Wakes in-process waiters and sends webhooks for jobs that just ended.
    /// `announce` says which of them other processes are told about (when
    /// Redis signals are configured): those a caller or reader may follow
    /// there. The rare bulk endings (timeouts, orphans) announce all.
    fn publish(&mut self, finals: &[job::Model], announce: impl Fn(&job::Model) -> bool) {
        self.finished_since_analyze += finals.len() as u64;
        if finals.is_empty() {
            return;
        }
        let now = now_ms();
        let observed = gantry_telemetry::metrics();
        for row in finals {
            let ms = |from: i64, to: Option<i64>| {
                to.map(|to| std::time::Duration::from_millis(u64::try_from(to - from).unwrap_or(0)))
            };
            let delay = row
                .started_at_ms
                .and_then(|started| ms(row.queued_at_ms, Some(started)));
            let execution = row.started_at_ms.and_then(|started| ms(started, row.completed_at_ms));
            observed.job_finished(&row.model, delay, execution);
        }
        let views: Vec<JobView> = finals.iter().map(|row| JobView::of(row, now)).collect();
        self.store.hub.finished(&views, |i| announce(&finals[i]));
        for (row, view) in finals.iter().zip(views) {
            if let Some(url) = row.webhook.clone() {
                self.webhooks.send(url, row.user_id.clone(), view, row.completed_at_ms);
            }
        }
    }

    // ---- claiming and assigning ----

    /// Claims and assigns queued jobs for every model marked for filling, as
    /// long as its workers have free slots.
    async fn fill(&mut self) {
        if !self.ready.is_empty() {
            self.assign_ready();
        }
        if self.to_fill.is_empty() {
            return;
        }
        let models: Vec<String> = self.to_fill.drain().collect();
        for model in models {
            if let Err(error) = self.fill_model(&model).await {
                tracing::warn!(%model, %error, "claiming jobs failed");
            }
        }
    }

    async fn fill_model(&mut self, model: &str) -> Result<(), DbErr> {
        loop {
            let want = self.want(model);
            if want == 0 {
                return Ok(());
            }
            let rows = self.claim(model, want).await?;
            if !self.place(model, want, rows).await? {
                return Ok(());
            }
        }
    }

    /// How many jobs of `model` to claim now: its workers' free slots, at most
    /// `claim_batch`. Slots whose fast-lane credits submits have taken are not
    /// free: a claim for them would find them filled by the lane's rows and
    /// put its jobs back (a job seen `IN_PROGRESS`, then `IN_QUEUE` again),
    /// or take them first and push the lane's older jobs back behind newer ones.
    fn want(&self, model: &str) -> u64 {
        let free = self
            .dispatcher
            .health()
            .models
            .get(model)
            .map_or(0, |health| health.free_slots)
            .saturating_sub(self.store.hub.lane.lane_taken(&self.instance, model));
        if free == 0 {
            return 0;
        }
        let batch = u64::from(self.store.config.claim_batch.max(1));
        let ahead = u64::from(self.store.config.claim_ahead);
        let ready = self.ready.get(model).map_or(0, |queue| queue.len() as u64);
        free.saturating_add(ahead)
            .saturating_sub(ready)
            .min(batch.saturating_mul(2))
    }

    /// Assigns jobs kept claimed in `ready` to the slots that are free now.
    fn assign_ready(&mut self) {
        let Core {
            ready,
            running,
            dispatcher,
            pending_workers,
            ..
        } = self;
        for queue in ready.values_mut() {
            while let Some(next) = queue.front() {
                // Cancelled, expired or timed out meanwhile: drop it.
                let waiting = running
                    .get(&next.job_id)
                    .is_some_and(|r| !r.assigned && i64::from(r.attempt) == i64::from(next.attempt));
                if !waiting {
                    queue.pop_front();
                    continue;
                }
                match dispatcher.assign(next.clone()) {
                    Ok(worker_id) => {
                        if let Some(r) = running.get_mut(&next.job_id) {
                            r.assigned = true;
                        }
                        pending_workers.insert(next.job_id.clone(), worker_id);
                        queue.pop_front();
                    }
                    Err(AssignError::NoCapacity { .. }) => break,
                    Err(AssignError::AlreadyRunning { .. }) => {
                        // A stale attempt still runs there: stop it; this
                        // attempt's lease lapses and a sweep requeues it.
                        dispatcher.cancel(&next.job_id, "superseded by a newer attempt");
                        running.remove(&next.job_id);
                        queue.pop_front();
                    }
                }
            }
        }
        ready.retain(|_, queue| !queue.is_empty());
    }

    /// Assigns just-claimed jobs of `model` (`want` were asked for) to workers.
    /// Returns whether the queue may hold more for free slots (claim again).
    async fn place(&mut self, model: &str, want: u64, rows: Vec<job::Model>) -> Result<bool, DbErr> {
        let claimed = rows.len() as u64;
        let rows = rows.into_iter().map(|row| Handed { row, stored: true }).collect();
        if !self.assign(rows).await? {
            return Ok(false);
        }
        if claimed < want {
            self.drained.insert(model.to_string());
            return Ok(false);
        }
        self.drained.remove(model);
        Ok(true)
    }

    /// Places jobs that submits handed to this instance (written claimed by
    /// it, or not written at all).
    async fn adopt(&mut self, rows: Vec<Handed>) {
        let models: HashSet<String> = rows.iter().map(|job| job.row.model.clone()).collect();
        match self.assign(rows).await {
            Ok(true) => {}
            // Some went back to the queue: claim them when a slot frees.
            Ok(false) => {
                for model in models {
                    self.drained.remove(&model);
                }
            }
            Err(error) => tracing::warn!(%error, "assigning handed-over jobs failed"),
        }
    }

    /// Gives the fast lane a credit per free slot of each model whose queue
    /// was found empty.
    fn refresh_credits(&self) {
        let health = self.dispatcher.health();
        let free = health
            .models
            .into_iter()
            .filter(|(model, health)| {
                health.free_slots > 0 && self.drained.contains(model) && !self.ready.contains_key(model)
            })
            .map(|(model, health)| (model, health.free_slots));
        self.store.hub.lane.set_credits(&self.instance, free);
    }

    /// Assigns jobs claimed by this instance to workers, lowest priority last.
    /// Jobs no worker took go back to the queue; returns whether all were placed.
    async fn assign(&mut self, mut rows: Vec<Handed>) -> Result<bool, DbErr> {
        rows.sort_by(|a, b| (a.row.low_priority, &a.row.id).cmp(&(b.row.low_priority, &b.row.id)));
        let mut put_back = Vec::new();
        // Unstored jobs no worker took: written to the queue instead.
        let mut queue = Vec::new();
        let store_after = self.store.config.sync_store_after_ms();
        for Handed { row, stored } in rows {
            let deadline_ms = row.run_deadline_ms.unwrap_or(i64::MAX);
            // The assignment joins the job's trace; the worker's run is its child.
            let span = if gantry_telemetry::trace::enabled() {
                let span =
                    tracing::info_span!("job.assign", job_id = %row.id, attempt = row.attempt, model = %row.model);
                gantry_telemetry::trace::set_parent(&span, row.trace_context.as_deref());
                span
            } else {
                tracing::Span::none()
            };
            let _entered = span.enter();
            let assignment = Assignment {
                job_id: row.id.clone(),
                attempt: u32::try_from(row.attempt).unwrap_or(0),
                model: row.model.clone(),
                // Stored as the JSON text it was submitted as; the worker
                // parses it (and fails the job as bad input if it cannot).
                input_json: row.input.clone(),
                deadline: system_time(deadline_ms),
                trace_parent: gantry_telemetry::trace::traceparent_of(&span),
            };
            let ahead = self.store.config.claim_ahead > 0;
            let retry = ahead.then(|| assignment.clone());
            let assigned = match self.dispatcher.assign(assignment) {
                Ok(worker_id) => {
                    self.pending_workers.insert(row.id.clone(), worker_id);
                    true
                }
                // Kept claimed for the next free slot (see `claim_ahead`).
                Err(AssignError::NoCapacity { model }) if let Some(retry) = retry => {
                    self.ready.entry(model).or_default().push_back(retry);
                    false
                }
                Err(error) => {
                    if let AssignError::AlreadyRunning { .. } = error {
                        // A stale attempt still runs there: stop it, try again later.
                        self.dispatcher.cancel(&row.id, "superseded by a newer attempt");
                    }
                    if stored {
                        put_back.push(row.id);
                    } else {
                        queue.push(row);
                    }
                    continue;
                }
            };
            // Written once it has run `sync_store_after`, or before its
            // deadline or expiry, whichever is first, if still running then.
            let store_at = row
                .started_at_ms
                .unwrap_or(row.created_at_ms)
                .saturating_add(store_after)
                .min(deadline_ms)
                .min(row.expires_at_ms);
            self.running.insert(
                row.id.clone(),
                Running {
                    attempt: row.attempt,
                    model: row.model.clone(),
                    deadline_ms,
                    assigned,
                    store_at,
                    unstored: (!stored).then(|| Box::new(row)),
                    streamed: false,
                },
            );
        }
        let queued = !queue.is_empty();
        if queued {
            let mut plan = Plan::new(now_ms(), &self.store.config, &self.instance);
            let mut written = Vec::new();
            for row in queue {
                written.push(row.id.clone());
                let row = plan.released(row, true);
                plan.stores.push(Store { row, charge: None });
            }
            match self.run_plan(plan).await {
                Ok(settled) => {
                    self.store.hub.lane.stored(&written);
                    self.publish(&settled.finals, |row| row.sync);
                }
                Err(error) => {
                    self.store.hub.lose(&written);
                    return Err(error);
                }
            }
        }
        if put_back.is_empty() {
            return Ok(!queued);
        }
        self.put_back(&put_back).await?;
        Ok(false)
    }

    /// Writes unstored jobs that are due (see `SchedulerConfig::sync_store_after`)
    /// as running; from then on they are like any other claimed job.
    async fn store_due(&mut self) -> Result<(), DbErr> {
        let now = now_ms();
        let mut plan = Plan::new(now, &self.store.config, &self.instance);
        let mut ids = Vec::new();
        for (job_id, running) in &self.running {
            if let Some(row) = running.unstored.as_deref()
                && running.due_at() <= now
            {
                let worker = self.pending_workers.get(job_id).cloned();
                plan.stores.push(Store {
                    row: plan.running(row.clone(), worker),
                    charge: None,
                });
                ids.push(job_id.clone());
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        let result = self.run_plan(plan).await;
        for job_id in &ids {
            if let Some(running) = self.running.get_mut(job_id) {
                match &result {
                    Ok(_) => running.unstored = None,
                    // Try again shortly.
                    Err(_) => running.store_at = now.saturating_add(100),
                }
            }
        }
        result?;
        self.store.hub.lane.stored(&ids);
        Ok(())
    }

    /// Runs `plan` now, waiting for its commit (see [`execute`]).
    async fn run_plan(&self, plan: Plan) -> Result<Settled, DbErr> {
        execute(
            self.store.hub.writes.engine.as_ref(),
            &self.db,
            &self.store.hub.writes.lock,
            plan,
        )
        .await
    }

    /// Claims up to `limit` queued jobs of `model` for this instance, normal
    /// priority first, oldest first (see `plan.rs`).
    async fn claim(&self, model: &str, limit: u64) -> Result<Vec<job::Model>, DbErr> {
        let mut plan = Plan::new(now_ms(), &self.store.config, &self.instance);
        plan.claims.push((model.to_string(), limit));
        let settled = self.run_plan(plan).await?;
        Ok(settled
            .claims
            .into_iter()
            .next()
            .map(|(_, _, rows)| rows)
            .unwrap_or_default())
    }

    /// Returns just-claimed jobs no worker took; the attempt was never sent,
    /// so it is not counted.
    async fn put_back(&self, ids: &[String]) -> Result<(), DbErr> {
        let _guard = serialize_writes(&self.store.hub.writes.lock, &self.db).await;
        job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::InQueue.as_str()))
            .col_expr(J::Attempt, plus(J::Attempt, -1))
            .col_expr(J::Owner, Expr::value(Option::<String>::None))
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
            .col_expr(J::StartedAtMs, Expr::value(Option::<i64>::None))
            .filter(J::Id.is_in(ids.iter().map(String::as_str)))
            .filter(J::Owner.eq(self.instance.as_str()))
            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    // ---- sweeps ----

    async fn sweep(&mut self) -> Result<(), DbErr> {
        let result = self.sweep_rows().await;
        // Claim anything left queued (submitted elsewhere, or a lost wake-up),
        // even when a step above failed (a slow or lost connection): the
        // claim is the fallback that keeps a queued job from waiting for
        // a wake-up that may never come.
        let health = self.dispatcher.health();
        self.fill_all_with_free_slots(&health);
        result
    }

    /// The sweep's row work: leases, timeouts, orphans, expiry, worker
    /// rows, webhook deliveries and presence, in that order; the first
    /// failure stops it until the next sweep.
    async fn sweep_rows(&mut self) -> Result<(), DbErr> {
        self.analyze_if_grown().await;
        self.renew().await?;
        self.time_out().await?;
        self.requeue_orphans(false).await?;
        self.expire().await?;
        self.flush_workers().await?;
        self.webhooks.take_over(now_ms()).await?;
        let health = self.dispatcher.health();
        self.publish_presence(&health).await
    }

    /// Marks every model with free slots for a claim.
    fn fill_all_with_free_slots(&mut self, health: &Health) {
        for (model, health) in &health.models {
            if health.free_slots > 0 {
                self.to_fill.insert(model.clone());
            }
        }
    }

    /// Publishes this instance's worker counts to `worker_presence`: one row
    /// per model it has workers for (one upsert statement), its rows of models
    /// without workers any more deleted. API processes without a dispatcher
    /// read them ([`JobStore::workers`]). Once a minute it also deletes rows
    /// long stale (of crashed instances).
    async fn publish_presence(&mut self, health: &Health) -> Result<(), DbErr> {
        use presence::Column as P;
        let now = now_ms();
        let clamp = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let counts: Vec<(&String, i32, i32)> = health
            .models
            .iter()
            .filter(|(_, h)| h.idle_workers + h.running_workers + h.draining_workers > 0)
            .map(|(model, h)| (model, clamp(h.idle_workers), clamp(h.running_workers)))
            .collect();
        let gone: Vec<&str> = self
            .presence
            .iter()
            .filter(|model| !counts.iter().any(|(m, ..)| m == model))
            .map(String::as_str)
            .collect();
        let prune_before = now.saturating_sub(self.store.config.presence_window_ms().max(PRESENCE_PRUNE_MS));
        let prune = now.saturating_sub(self.presence_pruned_ms) >= PRESENCE_PRUNE_MS;
        let lock = Arc::clone(&self.store.hub.writes.lock);
        let guard = serialize_writes(&lock, &self.db).await;
        if !counts.is_empty() {
            let mut upsert = Query::insert();
            upsert.into_table(presence::Entity).columns([
                P::SchedulerId,
                P::Model,
                P::Idle,
                P::Running,
                P::UpdatedAtMs,
            ]);
            for (model, idle, running) in &counts {
                upsert
                    .values([
                        self.instance.as_str().into(),
                        model.as_str().into(),
                        (*idle).into(),
                        (*running).into(),
                        now.into(),
                    ])
                    .map_err(|e| DbErr::Custom(e.to_string()))?;
            }
            upsert.on_conflict(
                OnConflict::columns([P::SchedulerId, P::Model])
                    .update_columns([P::Idle, P::Running, P::UpdatedAtMs])
                    .to_owned(),
            );
            self.db.execute(&upsert).await?;
        }
        if !gone.is_empty() {
            presence::Entity::delete_many()
                .filter(P::SchedulerId.eq(self.instance.as_str()))
                .filter(P::Model.is_in(gone))
                .exec(&self.db)
                .await?;
        }
        if prune {
            presence::Entity::delete_many()
                .filter(P::UpdatedAtMs.lt(prune_before))
                .exec(&self.db)
                .await?;
            worker_gpu::Entity::delete_many()
                .filter(worker_gpu::Column::UpdatedAtMs.lt(prune_before))
                .exec(&self.db)
                .await?;
        }
        self.publish_gpus(now).await?;
        drop(guard);
        if prune {
            self.presence_pruned_ms = now;
        }
        self.presence = counts.into_iter().map(|(model, ..)| model.clone()).collect();
        Ok(())
    }

    /// Publishes the GPUs this instance's workers reported in their hello
    /// (`worker_gpus`: one row per GPU name, `""` for workers without a GPU;
    /// rows of names gone deleted). The caller holds the write lock.
    async fn publish_gpus(&mut self, now: i64) -> Result<(), DbErr> {
        use worker_gpu::Column as G;
        let mut gpus: std::collections::BTreeMap<String, (i32, i64)> = std::collections::BTreeMap::new();
        for worker in self.dispatcher.workers() {
            // Workers without a GPU are counted under the empty name (CPU capacity).
            if worker.draining {
                continue;
            }
            let entry = gpus.entry(worker.gpu_name.trim().to_owned()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(i64::try_from(worker.gpu_memory_bytes).unwrap_or(i64::MAX));
        }
        if gpus.is_empty() && !self.gpus_published {
            return Ok(());
        }
        if !gpus.is_empty() {
            let mut upsert = Query::insert();
            upsert.into_table(worker_gpu::Entity).columns([
                G::SchedulerId,
                G::GpuName,
                G::Workers,
                G::MemoryBytes,
                G::UpdatedAtMs,
            ]);
            for (name, (workers, memory)) in &gpus {
                upsert
                    .values([
                        self.instance.as_str().into(),
                        name.as_str().into(),
                        (*workers).into(),
                        (*memory).into(),
                        now.into(),
                    ])
                    .map_err(|e| DbErr::Custom(e.to_string()))?;
            }
            upsert.on_conflict(
                OnConflict::columns([G::SchedulerId, G::GpuName])
                    .update_columns([G::Workers, G::MemoryBytes, G::UpdatedAtMs])
                    .to_owned(),
            );
            self.db.execute(&upsert).await?;
        }
        worker_gpu::Entity::delete_many()
            .filter(G::SchedulerId.eq(self.instance.as_str()))
            .filter(G::GpuName.is_not_in(gpus.keys().map(String::as_str)))
            .exec(&self.db)
            .await?;
        self.gpus_published = !gpus.is_empty();
        Ok(())
    }

    /// On shutdown: deletes this instance's `worker_presence` rows, so its
    /// workers stop counting at once.
    async fn withdraw_presence(&mut self) -> Result<(), DbErr> {
        let _guard = serialize_writes(&self.store.hub.writes.lock, &self.db).await;
        worker_gpu::Entity::delete_many()
            .filter(worker_gpu::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        presence::Entity::delete_many()
            .filter(presence::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        self.presence.clear();
        Ok(())
    }

    /// Renews this instance's lease on the jobs it runs, and learns which of
    /// them ended elsewhere (cancelled, timed out, expired, requeued): those
    /// are stopped on their workers.
    async fn renew(&mut self) -> Result<(), DbErr> {
        if self.running.is_empty() {
            return Ok(());
        }
        // Unstored jobs have no row to renew (nor can anything end them elsewhere).
        let ids: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.unstored.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        self.recheck(ids).await
    }

    /// Renews the leases of these running jobs, and stops those whose rows
    /// are no longer this instance's running attempt (cancelled, timed out or
    /// requeued elsewhere). The sweep does it for every running job; a
    /// cancel signalled by another process does it for that job at once.
    async fn recheck(&mut self, ids: Vec<String>) -> Result<(), DbErr> {
        let lease_until = now_ms().saturating_add(millis(self.store.config.lease));
        let mut alive: HashSet<(String, i32)> = HashSet::new();
        let lock = Arc::clone(&self.store.hub.writes.lock);
        for part in ids.chunks(ID_CHUNK) {
            let _guard = serialize_writes(&lock, &self.db).await;
            let rows: Vec<(String, i32)> = job::Entity::update_many()
                .col_expr(J::LeaseUntilMs, Expr::value(lease_until))
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(J::Owner.eq(self.instance.as_str()))
                .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                .exec_with_returning(&self.db)
                .await?
                .into_iter()
                .map(|row| (row.id, row.attempt))
                .collect();
            alive.extend(rows);
        }
        let gone: Vec<String> = ids
            .into_iter()
            .filter(|id| {
                self.running
                    .get(id)
                    .is_some_and(|r| r.unstored.is_none() && !alive.contains(&(id.clone(), r.attempt)))
            })
            .collect();
        for job_id in gone {
            self.running.remove(&job_id);
            self.pending_workers.remove(&job_id);
            self.dispatcher.cancel(&job_id, "job ended");
        }
        Ok(())
    }

    /// Ends every running job (of any scheduler) past its execution timeout.
    async fn time_out(&mut self) -> Result<(), DbErr> {
        let lock = Arc::clone(&self.store.hub.writes.lock);
        let guard = serialize_writes(&lock, &self.db).await;
        let now = now_ms();
        let rows = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::TimedOut.as_str()))
            .col_expr(J::Error, Expr::value("execution timeout exceeded"))
            .col_expr(J::CompletedAtMs, Expr::value(now))
            .col_expr(J::ExpiresAtMs, retention_expr(&self.store.config, now))
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .filter(running_jobs())
            .filter(J::RunDeadlineMs.lte(now))
            .exec_with_returning(&self.db)
            .await?;
        drop(guard);
        // Every job of ours that is due has now ended: timed out by this
        // statement, or already finished elsewhere. Stop them all (but those
        // not written yet: they are written first, see `store_due`).
        let due: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.unstored.is_none() && r.deadline_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for job_id in due {
            self.running.remove(&job_id);
            self.pending_workers.remove(&job_id);
            self.dispatcher.cancel(&job_id, "execution timeout");
        }
        self.publish(&rows, |_| true);
        Ok(())
    }

    /// Requeues running jobs whose scheduler's lease lapsed (it crashed or lost
    /// the database), or fails them once out of attempts; with `all`, every
    /// running job, leased or not (at the start of the database's sole owner).
    async fn requeue_orphans(&mut self, all: bool) -> Result<(), DbErr> {
        let lock = Arc::clone(&self.store.hub.writes.lock);
        let guard = serialize_writes(&lock, &self.db).await;
        let now = now_ms();
        let until = Plan::new(now, &self.store.config, &self.instance);
        let lapsed = if all { i64::MAX } else { now };
        let rows = plan::requeue_or_fail("scheduler lost", now, until.sync_until, until.async_until)
            .filter(running_jobs())
            .filter(J::LeaseUntilMs.lt(lapsed))
            .exec_with_returning(&self.db)
            .await?;
        if all && !rows.is_empty() {
            tracing::info!(jobs = rows.len(), "requeued the jobs a previous process left running");
        }
        drop(guard);
        let mut requeued = HashSet::new();
        for row in &rows {
            if self.running.remove(&row.id).is_some() {
                self.pending_workers.remove(&row.id);
                self.dispatcher.cancel(&row.id, "lease lapsed");
            }
            self.drained.remove(&row.model);
            self.to_fill.insert(row.model.clone());
            if row.status == JobStatus::InQueue.as_str() && requeued.insert(row.model.as_str()) {
                self.store.hub.signal(Signal::Queued(row.model.clone()));
            }
        }
        let finals: Vec<job::Model> = rows.into_iter().filter(is_final).collect();
        self.publish(&finals, |_| true);
        Ok(())
    }

    /// Deletes jobs past their TTL (queued or running) or their result
    /// retention (finished), with their chunks.
    async fn expire(&mut self) -> Result<(), DbErr> {
        // A few rounds per sweep, so a backlog shrinks at high throughput.
        for _ in 0..EXPIRE_ROUNDS {
            if self.expire_some().await? < EXPIRE_BATCH {
                break;
            }
        }
        Ok(())
    }

    /// Deletes up to `EXPIRE_BATCH` expired jobs; returns how many were found.
    async fn expire_some(&mut self) -> Result<u64, DbErr> {
        let now = now_ms();
        let doomed: Vec<String> = job::Entity::find()
            .select_only()
            .column(J::Id)
            .filter(J::ExpiresAtMs.lte(now))
            .limit(EXPIRE_BATCH)
            .into_tuple()
            .all(&self.db)
            .await?;
        let found = doomed.len() as u64;
        let lock = Arc::clone(&self.store.hub.writes.lock);
        for part in doomed.chunks(ID_CHUNK) {
            let _guard = serialize_writes(&lock, &self.db).await;
            let txn = self.db.begin().await?;
            chunk::Entity::delete_many()
                .filter(chunk::Column::JobId.is_in(part.iter().map(String::as_str)))
                .exec(&txn)
                .await?;
            crate::entity::progress::Entity::delete_many()
                .filter(crate::entity::progress::Column::JobId.is_in(part.iter().map(String::as_str)))
                .exec(&txn)
                .await?;
            job::Entity::delete_many()
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(J::ExpiresAtMs.lte(now))
                .exec(&txn)
                .await?;
            txn.commit().await?;
        }
        for job_id in doomed {
            if self.running.remove(&job_id).is_some() {
                self.pending_workers.remove(&job_id);
                self.dispatcher.cancel(&job_id, "ttl expired");
            }
        }
        Ok(found)
    }

    /// Writes the worker ids of running jobs (one statement per worker).
    async fn flush_workers(&mut self) -> Result<(), DbErr> {
        if self.pending_workers.is_empty() {
            return Ok(());
        }
        let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
        let running = &self.running;
        // Unstored jobs keep theirs until they are written.
        let unstored = |job_id: &str| running.get(job_id).is_some_and(|r| r.unstored.is_some());
        let flush: Vec<String> = self
            .pending_workers
            .keys()
            .filter(|id| !unstored(id))
            .cloned()
            .collect();
        for job_id in flush {
            if let Some(worker_id) = self.pending_workers.remove(&job_id) {
                by_worker.entry(worker_id).or_default().push(job_id);
            }
        }
        let lock = Arc::clone(&self.store.hub.writes.lock);
        for (worker_id, jobs) in by_worker {
            for part in jobs.chunks(ID_CHUNK) {
                let _guard = serialize_writes(&lock, &self.db).await;
                job::Entity::update_many()
                    .col_expr(J::WorkerId, Expr::value(worker_id.as_str()))
                    .filter(J::Id.is_in(part.iter().map(String::as_str)))
                    .filter(J::Owner.eq(self.instance.as_str()))
                    .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                    .exec(&self.db)
                    .await?;
            }
        }
        Ok(())
    }

    /// On shutdown: cancels this instance's jobs on their workers and puts them
    /// back in the queue, giving back the attempt they used. Jobs not written
    /// yet (running, or handed over and `left` unadopted) are written queued.
    async fn release(&mut self, left: Vec<Handed>) -> Result<(), DbErr> {
        for job_id in self.running.keys() {
            self.dispatcher.cancel(job_id, "scheduler shutting down");
        }
        let mut plan = Plan::new(now_ms(), &self.store.config, &self.instance);
        let running = std::mem::take(&mut self.running);
        let mut models: HashSet<String> = running.values().map(|r| r.model.clone()).collect();
        models.extend(left.iter().map(|job| job.row.model.clone()));
        let unstored = running.into_values().filter_map(|r| r.unstored.map(|row| *row));
        let left = left.into_iter().filter(|job| !job.stored).map(|job| job.row);
        let mut written = Vec::new();
        for row in unstored.chain(left) {
            written.push(row.id.clone());
            let row = plan.released(row, false);
            plan.stores.push(Store { row, charge: None });
        }
        self.ready.clear();
        if !plan.is_empty() {
            self.run_plan(plan).await?;
            self.store.hub.lane.stored(&written);
        }
        let _guard = serialize_writes(&self.store.hub.writes.lock, &self.db).await;
        job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::InQueue.as_str()))
            .col_expr(J::Owner, Expr::value(Option::<String>::None))
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
            .col_expr(J::WorkerId, Expr::value(Option::<String>::None))
            .col_expr(J::QueuedAtMs, Expr::value(now_ms()))
            .col_expr(J::MaxAttempts, plus(J::MaxAttempts, 1))
            .filter(J::Owner.eq(self.instance.as_str()))
            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
            .exec(&self.db)
            .await?;
        // Back in the queue: the other processes' schedulers may take them now.
        for model in models {
            self.store.hub.signal(Signal::Queued(model));
        }
        Ok(())
    }
}

/// Charges network volume storage every minute (each started hour once,
/// whichever scheduler gets there first).
async fn accrue_storage(store: JobStore) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.accrue_storage(now_ms(), None).await {
            Ok(0) => {}
            Ok(hours) => tracing::debug!(hours, "network volume storage charged"),
            Err(error) => tracing::warn!(%error, "charging network volume storage failed"),
        }
    }
}

// ---- statements ----

/// Runs `plan` as one transaction: on the SQLite writer thread, or (on
/// PostgreSQL) through sea-orm.
async fn execute(
    engine: Option<&Engine>,
    db: &DatabaseConnection,
    write_lock: &tokio::sync::Mutex<()>,
    plan: Plan,
) -> Result<Settled, DbErr> {
    if let Some(engine) = engine {
        return engine.settle(plan).await;
    }
    let _guard = serialize_writes(write_lock, db).await;
    let txn = db.begin().await?;
    let settled = plan::execute(&txn, &plan).await?;
    txn.commit().await?;
    Ok(settled)
}

/// A settlement being committed.
type Settling = Pin<Box<dyn Future<Output = Result<Settled, DbErr>> + Send>>;

struct InFlight {
    batch: Vec<Event>,
    outcome: Outcome,
    work: Settling,
}

/// The in-flight settlement's result (pending for ever if there is none).
async fn settling(flight: &mut Option<InFlight>) -> Result<Settled, DbErr> {
    match flight {
        Some(flight) => (&mut flight.work).await,
        None => std::future::pending().await,
    }
}

/// The stored output: an object gets `"cost"` (USD); anything else is stored
/// as the model returned it (the cost is in the ledger).
fn output_with_cost(output: &Value, amount: i64) -> String {
    match output {
        Value::Object(map) => {
            let cost = serde_json::Number::from_f64(gantry_billing::usd(amount)).map_or(Value::Null, Value::Number);
            let mut map = map.clone();
            map.insert("cost".into(), cost);
            Value::Object(map).to_string()
        }
        other => other.to_string(),
    }
}

/// The job of a chunk or progress message: output that live readers get
/// before it is stored, so storing it can wait a little for company.
fn stream_job(event: &Event) -> Option<&str> {
    match event {
        Event::Chunk { job_id, .. } | Event::Progress { job_id, .. } => Some(job_id),
        _ => None,
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn terminal_job(event: &Event) -> Option<&str> {
    match event {
        Event::Completed { job_id, .. } | Event::Failed { job_id, .. } | Event::Cancelled { job_id, .. } => {
            Some(job_id)
        }
        _ => None,
    }
}

fn system_time(ms: i64) -> Option<SystemTime> {
    let ms = u64::try_from(ms).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// Time from now until Unix ms `at` (zero if past).
fn until(at: i64) -> Duration {
    Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0))
}
