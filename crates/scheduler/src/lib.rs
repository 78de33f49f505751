//! Gantry's scheduler: the running half of the job layer. It claims queued
//! jobs (a guarded batch `UPDATE … RETURNING`, `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL), assigns them to workers through a
//! [`gantry_dispatch::Dispatcher`], settles what they report (completion and
//! ledger charge in one transaction), retries crashed attempts, and sweeps
//! leases, timeouts and expired jobs, on the store of `gantry-jobs`.
//!
//! This file holds the loop (`Core::run`) and its state, the jobs it holds
//! being `held.rs`; each of its duties
//! is a file of its own: `assign.rs` (claim and assign, with its view of the
//! queues in `demand.rs`), `settle.rs` (settle
//! reported events), `sweep.rs` (leases, timeouts, requeues, expiry) and
//! `worker_presence.rs` (which workers and GPUs this instance has). Webhook
//! deliveries are `gantry-webhooks`' outbox, driven from the loop.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_catalog::ModelCatalog;
use gantry_dispatch::{Dispatcher, Event};
use rand::RngExt;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use gantry_jobs::Attached;
use gantry_jobs::FastLane;
use gantry_jobs::SchedulerError;
use gantry_jobs::entity::job;
use gantry_jobs::millis;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::Settled;
use gantry_jobs::{JobStore, Outcomes, SchedulerParts};
use gantry_webhooks as webhooks;
pub use gantry_webhooks::WebhookConfig;

mod assign;
mod demand;
mod file_sweep;
mod held;
mod settle;
mod sweep;
mod worker_presence;

/// Most events settled in one transaction.
const EVENT_BATCH: usize = 256;
/// How long a batch of only stream chunks and progress messages waits to be
/// stored together with later events: live readers already have them (see
/// `live.rs`), so a token stream costs one transaction per this period, not
/// one per token. A terminal event stores them at once, before itself.
const STREAM_COALESCE: Duration = Duration::from_millis(25);

/// The scheduler's loops, running on a Tokio task. Stop it with
/// [`Scheduler::shutdown`]; dropping it instead behaves like a crash (its jobs
/// are requeued by whichever scheduler sweeps after its lease lapses).
pub struct Scheduler {
    instance_id: String,
    lane: Arc<FastLane>,
    outcomes: Outcomes,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// Tasks beside the loop: the sweeper of output files, the accrual of
    /// network volume storage.
    background: Vec<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts claiming jobs of `store` for the workers of `dispatcher`, whose
    /// events this scheduler consumes, delivering their webhooks as
    /// `webhook_config` says. Each call is a new scheduler instance with its own
    /// leases. Fails if the database cannot be reached.
    pub async fn start(
        store: JobStore,
        catalog: Arc<ModelCatalog>,
        dispatcher: Dispatcher,
        events: mpsc::Receiver<Event>,
        webhook_config: &WebhookConfig,
    ) -> Result<Scheduler, SchedulerError> {
        let instance_id = format!("sched-{:016x}", rand::rng().random::<u64>());
        let parts = store.scheduler_parts();
        let webhooks = webhooks::Deliveries::new(
            webhook_config,
            store.config().files.clone(),
            store.db().clone(),
            parts.writer.clone(),
        )?;
        let presence = worker_presence::Presence::new(
            &instance_id,
            store.db().clone(),
            parts.writer.clone(),
            store.config().presence_window_ms(),
        );
        let mut core = Core {
            _attached: Attached::new(&parts.wakeups),
            parts,
            db: store.db().clone(),
            store,
            catalog,
            dispatcher,
            instance: instance_id.clone(),
            held: held::Held::default(),
            demand: demand::Demand::default(),
            webhooks,
            presence,
            fast_lane: false,
            statistics: sweep::Statistics::new(),
            rechecks: HashSet::new(),
        };
        if core.store.config().sole_owner {
            // No other process can hold these jobs: a crashed predecessor did.
            core.requeue_orphans(true).await?;
        }
        core.sweep().await?;
        // Every submit may take the lane, on both backends. (Until the
        // PostgreSQL claim was fixed, `/run` jobs did not on PostgreSQL: see
        // "Claims" in docs/scheduler.md and decision 0021 in docs/decisions/dispatch-path.md.)
        core.fast_lane = core.parts.lane.open(&core.instance, millis(core.store.config().lease));
        // Chunks and progress reach live readers as they arrive, before they
        // are stored (see live.rs).
        core.dispatcher
            .observe_live(Some(Arc::new(core.parts.outcomes.live_observer())));
        let mut background = Vec::new();
        if let Some(files) = core.store.config().files.clone() {
            background.push(tokio::spawn(file_sweep::sweep(
                files,
                core.db.clone(),
                core.parts.writer.clone(),
            )));
        }
        background.push(tokio::spawn(accrue_storage(core.store.clone())));
        let (stop, stopped) = oneshot::channel();
        let (lane, outcomes) = (Arc::clone(&core.parts.lane), core.parts.outcomes.clone());
        let task = tokio::spawn(core.run(events, stopped));
        Ok(Scheduler {
            instance_id,
            lane,
            outcomes,
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
            if self.lane.close(&self.instance_id).is_some() {
                self.outcomes.lose_all();
            }
        }
    }
}

struct Core {
    store: JobStore,
    /// What this scheduler shares with `store`'s other users in the process.
    parts: SchedulerParts,
    db: DatabaseConnection,
    catalog: Arc<ModelCatalog>,
    dispatcher: Dispatcher,
    instance: String,
    /// The jobs this instance holds (`held.rs`).
    held: held::Held,
    /// The claim duty's view of the queues (`demand.rs`): models to claim
    /// for, those found empty, jobs claimed ahead of free slots.
    demand: demand::Demand,
    webhooks: webhooks::Deliveries,
    /// The presence duty (`worker_presence.rs`), with its own state.
    presence: worker_presence::Presence,
    /// Whether this instance has the process's fast lane (see `store::Lane`).
    fast_lane: bool,
    /// When PostgreSQL's statistics of `jobs` are refreshed (`sweep.rs`).
    statistics: sweep::Statistics,
    /// Running jobs another process signalled cancelled: their rows are
    /// checked between settlements (see `recheck`).
    rechecks: HashSet<String>,
    /// Counts this scheduler on the store's wake-ups while the loop lives.
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
        let wakeups = Arc::clone(&self.parts.wakeups);
        let mut tick = tokio::time::interval(self.store.config().sweep_interval);
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
            let next_deadline = self.held.next_due();
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
                    let timed_out = self.held.any_overdue(now);
                    if timed_out && let Err(error) = self.time_out().await {
                        tracing::warn!(%error, "timeout sweep failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                () = wakeups.notify.notified() => {
                    let adopted = self.parts.lane.adopt(&self.instance);
                    if !adopted.is_empty() {
                        self.adopt(adopted).await;
                    }
                    let pending = wakeups.take();
                    if pending.refill_all {
                        self.demand.all_with_free_slots(&self.dispatcher.health(), flight.is_some());
                    }
                    for model in pending.models {
                        self.demand.signalled(model, flight.is_some());
                    }
                    self.apply_cancels(pending.cancels);
                    self.rechecks.extend(
                        pending
                            .rechecks
                            .into_iter()
                            .filter(|id| self.held.get(id).is_some_and(held::Running::is_stored)),
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
            self.parts.lane.close(&self.instance).unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Err(error) = self.release(left).await {
            tracing::warn!(%error, "could not hand running jobs back to the queue");
        }
        if self.fast_lane {
            // Any job still only in memory could not be written: gone.
            self.parts.outcomes.lose_all();
        }
        if let Err(error) = self.presence.withdraw().await {
            tracing::warn!(%error, "could not remove this scheduler's worker presence");
        }
    }

    // ---- settling worker events ----
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
