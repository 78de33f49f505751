//! Gantry's scheduler: the running half of the job layer. It claims queued
//! jobs (a guarded batch `UPDATE … RETURNING`, `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL), assigns them to workers through a
//! [`gantry_dispatch::Dispatcher`], settles what they report (completion and
//! ledger charge in one transaction), retries crashed attempts, and sweeps
//! leases, timeouts and expired jobs, on the store of `gantry-jobs`.
//!
//! This file holds the loop (`Core::run`), a thin `select!` whose arms each
//! hand what arrived to one duty, and the state the duties share: what every
//! duty reads and none owns (`Context`: the store, its parts, the catalog,
//! the dispatcher, this instance's id) and the jobs this instance holds
//! (`held.rs`), passed `&mut` to the duties that change them. Each duty is a
//! struct in a file of its own that owns its state; the duties never touch
//! each other's fields, only call each other's methods:
//! - `Claim` (`assign.rs`): claim and assign, with its view of the queues
//!   (`demand.rs`) and the fast lane;
//! - `Settle` (`settle.rs`): settle reported events, owning the settlement
//!   being committed and the stream events waiting to be stored;
//! - `Sweep` (`sweep.rs`): leases, timeouts, requeues, expiry, and the
//!   presence duty (`worker_presence.rs`: which workers and GPUs this
//!   instance has);
//! - `Publish` (`publish.rs`): jobs that ended reach waiters, other
//!   processes and `gantry-webhooks`' outbox, which it owns.

use std::sync::Arc;
use std::time::Duration;

use gantry_catalog::ModelCatalog;
use gantry_dispatch::{Dispatcher, Event};
use rand::RngExt;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use gantry_jobs::Attached;
use gantry_jobs::FastLane;
use gantry_jobs::SchedulerError;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::{Plan, Settled};
use gantry_jobs::{JobStore, Outcomes, SchedulerParts};
use gantry_webhooks as webhooks;
pub use gantry_webhooks::WebhookConfig;

mod assign;
mod demand;
mod file_sweep;
mod held;
mod publish;
mod settle;
mod sweep;
mod worker_presence;

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
            ctx: Context {
                parts,
                db: store.db().clone(),
                store,
                catalog,
                dispatcher,
                instance: instance_id.clone(),
            },
            held: held::Held::default(),
            claim: assign::Claim::default(),
            settle: settle::Settle::default(),
            publish: publish::Publish::new(webhooks),
            sweep: sweep::Sweep::new(presence),
        };
        let Core {
            ctx,
            held,
            claim,
            publish,
            sweep,
            ..
        } = &mut core;
        if ctx.store.config().sole_owner {
            // No other process can hold these jobs: a crashed predecessor did.
            sweep.requeue_orphans(ctx, held, claim, publish, true).await?;
        }
        sweep.sweep(ctx, held, claim, publish).await?;
        claim.open_lane(ctx);
        // Chunks and progress reach live readers as they arrive, before they
        // are stored (see live.rs).
        ctx.dispatcher
            .observe_live(Some(Arc::new(ctx.parts.outcomes.live_observer())));
        let mut background = Vec::new();
        if let Some(files) = ctx.store.config().files.clone() {
            background.push(tokio::spawn(file_sweep::sweep(
                files,
                ctx.db.clone(),
                ctx.parts.writer.clone(),
            )));
        }
        background.push(tokio::spawn(accrue_storage(ctx.store.clone())));
        let (stop, stopped) = oneshot::channel();
        let (lane, outcomes) = (Arc::clone(&ctx.parts.lane), ctx.parts.outcomes.clone());
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

impl Scheduler {
    /// Ends this instance as a crash of its process would: its tasks die
    /// where they stand and release nothing. Unlike a plain drop, it returns
    /// only once they have stopped, so nothing this instance started can be
    /// written after it returns (a task being polled on another thread
    /// finishes that poll after `abort`). What it kept in memory is lost.
    pub async fn crash(mut self) {
        let mut tasks: Vec<_> = self.background.drain(..).collect();
        tasks.extend(self.task.take());
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        self.lose_unstored();
    }

    /// No more submits written as claimed by this instance; those already
    /// written are requeued when its lease lapses, and those it kept in
    /// memory are gone with it.
    fn lose_unstored(&self) {
        if self.lane.close(&self.instance_id).is_some() {
            self.outcomes.lose_all();
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
            self.lose_unstored();
        }
    }
}

/// What every duty reads and none owns: the store and what this scheduler
/// shares with its other users, the catalog, the dispatcher and this
/// instance's id. The duties get it as `&Context`.
struct Context {
    store: JobStore,
    /// What this scheduler shares with `store`'s other users in the process.
    parts: SchedulerParts,
    db: DatabaseConnection,
    catalog: Arc<ModelCatalog>,
    dispatcher: Dispatcher,
    instance: String,
}

impl Context {
    /// Runs `plan` now, waiting for its commit (see `JobWriter::settle`).
    async fn run_plan(&self, plan: Plan) -> Result<Settled, DbErr> {
        self.parts.writer.settle(plan).await
    }
}

/// The loop and the state its duties share. Each duty owns its own state;
/// `held` is passed `&mut` to those that change it.
struct Core {
    ctx: Context,
    /// The jobs this instance holds (`held.rs`).
    held: held::Held,
    /// The claim duty (`assign.rs`), with its view of the queues and the fast lane.
    claim: assign::Claim,
    /// The settlement duty (`settle.rs`), with the settlement in flight and
    /// the stream events waiting to be stored.
    settle: settle::Settle,
    /// What happens to jobs that ended (`publish.rs`), with the webhook outbox.
    publish: publish::Publish,
    /// The sweep duty (`sweep.rs`), with the presence duty and the jobs to recheck.
    sweep: sweep::Sweep,
    /// Counts this scheduler on the store's wake-ups while the loop lives.
    _attached: Attached,
}

impl Core {
    async fn run(mut self, mut events: mpsc::Receiver<Event>, mut stopped: oneshot::Receiver<()>) {
        let Core {
            ctx,
            held,
            claim,
            settle,
            publish,
            sweep,
            ..
        } = &mut self;
        let ctx = &*ctx;
        let wakeups = Arc::clone(&ctx.parts.wakeups);
        let mut tick = tokio::time::interval(ctx.store.config().sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events_open = true;
        loop {
            let next_deadline = held.next_due();
            let deadline_sleep = sleep_until_some(next_deadline.map(|at| tokio::time::Instant::now() + until(at)));
            // Whether a settlement is being committed (see `Settle`), and
            // when the stream events waiting for company are stored at the latest.
            let settling = settle.in_flight();
            let stream_due = settle.stream_due();
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
                _ = tick.tick(), if !settling => {
                    if let Err(error) = sweep.sweep(ctx, held, claim, publish).await {
                        tracing::warn!(%error, "sweep failed");
                    }
                    if let Some(lost) = sweep.unrun(ctx, held, !events.is_empty()) {
                        settle.offer(ctx, held, claim, lost, &mut events);
                    }
                }
                () = deadline_sleep, if !settling => sweep.deadlines(ctx, held, claim, publish).await,
                () = wakeups.notify.notified() => {
                    let rechecks = claim.woken(ctx, held, publish, settling).await;
                    sweep.recheck_soon(rechecks, held);
                }
                done = settle.settling(), if settling => settle.finish(ctx, held, claim, publish, done).await,
                // One settlement at a time: events that arrive while it
                // commits make up the next batch.
                event = events.recv(), if events_open && !settling => match event {
                    Some(first) => settle.offer(ctx, held, claim, first, &mut events),
                    None => events_open = false,
                },
                () = sleep_until_some(stream_due), if !settling => settle.store_deferred(ctx, held, claim),
            }
            if !settle.in_flight() {
                sweep.recheck_signalled(ctx, held).await;
                claim.fill(ctx, held, publish).await;
            }
            claim.refresh_lane(ctx);
        }
        settle.drain(ctx, held, claim, publish).await;
        claim.close(ctx, held).await;
        if let Err(error) = sweep.withdraw().await {
            tracing::warn!(%error, "could not remove this scheduler's worker presence");
        }
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

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Time from now until Unix ms `at` (zero if past).
fn until(at: i64) -> Duration {
    Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0))
}
