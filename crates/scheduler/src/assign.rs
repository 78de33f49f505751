//! Claiming queued jobs and assigning them to workers: filling free slots per model,
//! placing claimed rows (ahead of free slots when configured), adopting jobs handed over by
//! the fast lane, writing them when they run too long unwritten, and putting back what could
//! not be assigned.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_dispatch::{AssignError, Assignment, Health};
use sea_orm::DbErr;

use gantry_jobs::Handed;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::millis;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::{Plan, Store};

use super::Context;
use super::demand::{Demand, Placed};
use super::held::{Held, Running};
use super::publish::Publish;

/// The claim duty: claims queued jobs and assigns them to workers. It owns
/// its view of the queues ([`Demand`]) and whether this instance has the
/// process's fast lane. The loop calls it on wake-ups, between settlements
/// ([`Claim::fill`]) and at shutdown ([`Claim::close`]); settlement and the
/// sweep tell it what they saw through its methods (`queued`, `slot_freed`,
/// `all_with_free_slots`, …) and have it place jobs, write the due ones and
/// the worker ids.
#[derive(Default)]
pub(super) struct Claim {
    /// The claim duty's view of the queues (`demand.rs`): models to claim
    /// for, those found empty, jobs claimed ahead of free slots.
    demand: Demand,
    /// Whether this instance has the process's fast lane (see `store::Lane`).
    fast_lane: bool,
}

impl Claim {
    /// Opens the process's fast lane for this instance, once it has swept.
    pub(super) fn open_lane(&mut self, ctx: &Context) {
        // Every submit may take the lane, on both backends. (Until the
        // PostgreSQL claim was fixed, `/run` jobs did not on PostgreSQL: see
        // "Claims" in docs/scheduler.md and decision 0021 in docs/decisions/dispatch-path.md.)
        self.fast_lane = ctx.parts.lane.open(&ctx.instance, millis(ctx.store.config().lease));
    }

    /// A wake-up: places the jobs the fast lane handed over, marks the models
    /// signalled for filling (`settling`: a settlement is being committed)
    /// and stops jobs cancelled in this process. Returns the running jobs
    /// another process signalled cancelled, for the sweep to recheck.
    pub(super) async fn woken(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        publish: &mut Publish,
        settling: bool,
    ) -> HashSet<String> {
        let adopted = ctx.parts.lane.adopt(&ctx.instance);
        if !adopted.is_empty() {
            self.adopt(ctx, held, publish, adopted).await;
        }
        let pending = ctx.parts.wakeups.take();
        if pending.refill_all {
            self.demand.all_with_free_slots(&ctx.dispatcher.health(), settling);
        }
        for model in pending.models {
            self.demand.signalled(model, settling);
        }
        self.apply_cancels(ctx, held, pending.cancels);
        pending.rechecks
    }

    /// Jobs of `model` may be queued (see [`Demand::queued`]).
    pub(super) fn queued(&mut self, model: String) {
        self.demand.queued(model);
    }

    /// Every model with a free slot is to be claimed for (see [`Demand::all_with_free_slots`]).
    pub(super) fn all_with_free_slots(&mut self, health: &Health, settling: bool) {
        self.demand.all_with_free_slots(health, settling);
    }

    /// A slot of `model` was freed (see [`Demand::slot_freed`]).
    pub(super) fn slot_freed(&mut self, model: String) {
        self.demand.slot_freed(model);
    }

    /// A claim committed with a settlement was placed (see [`Demand::settled_claim`]).
    pub(super) fn settled_claim(&mut self, model: &str, more: bool) {
        self.demand.settled_claim(model, more);
    }

    /// The models a settlement claims for (see [`Demand::claim_models`]).
    pub(super) fn claim_models<'a>(&self, freed: impl Iterator<Item = &'a String>) -> Vec<String> {
        self.demand.claim_models(freed)
    }

    /// A settlement starts committing: wake-ups from now on are noted, and
    /// jobs kept ready take the slots free now.
    pub(super) fn settlement_started(&mut self, ctx: &Context, held: &mut Held) {
        self.demand.settlement_started();
        // Freed slots take jobs kept ready before anything is written.
        if self.demand.has_ready() {
            self.assign_ready(ctx, held);
        }
    }

    /// The settlement committed (see [`Demand::settlement_finished`]).
    pub(super) fn settlement_finished(&mut self) {
        self.demand.settlement_finished();
    }

    /// Claims and assigns queued jobs for every model marked for filling, as
    /// long as its workers have free slots.
    pub(super) async fn fill(&mut self, ctx: &Context, held: &mut Held, publish: &mut Publish) {
        if self.demand.has_ready() {
            self.assign_ready(ctx, held);
        }
        for model in self.demand.take_wanted() {
            if let Err(error) = self.fill_model(ctx, held, publish, &model).await {
                tracing::warn!(%model, %error, "claiming jobs failed");
            }
        }
    }

    pub(super) async fn fill_model(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        publish: &mut Publish,
        model: &str,
    ) -> Result<(), DbErr> {
        loop {
            let want = self.want(ctx, model);
            if want == 0 {
                return Ok(());
            }
            let rows = self.claim(ctx, model, want).await?;
            if !self.place(ctx, held, publish, model, want, rows).await? {
                return Ok(());
            }
        }
    }

    /// How many jobs of `model` to claim now: its workers' free slots, at most
    /// `claim_batch`. Slots whose fast-lane credits submits have taken are not
    /// free: a claim for them would find them filled by the lane's rows and
    /// put its jobs back (a job seen `IN_PROGRESS`, then `IN_QUEUE` again),
    /// or take them first and push the lane's older jobs back behind newer ones.
    pub(super) fn want(&self, ctx: &Context, model: &str) -> u64 {
        let free = ctx
            .dispatcher
            .free_slots(model)
            .saturating_sub(ctx.parts.lane.lane_taken(&ctx.instance, model));
        if free == 0 {
            return 0;
        }
        let batch = u64::from(ctx.store.config().claim_batch.max(1));
        let ahead = u64::from(ctx.store.config().claim_ahead);
        let ready = self.demand.ready_count(model);
        free.saturating_add(ahead)
            .saturating_sub(ready)
            .min(batch.saturating_mul(2))
    }

    /// Stops jobs cancelled in this process: dropped from `ready` (never
    /// handed out) or cancelled on their workers.
    pub(super) fn apply_cancels(&self, ctx: &Context, held: &mut Held, cancels: Vec<String>) {
        for job_id in cancels {
            if held.release(&job_id).is_some() {
                ctx.dispatcher.cancel(&job_id, "cancelled");
            }
        }
    }

    /// Assigns jobs kept claimed in `ready` to the slots that are free now.
    pub(super) fn assign_ready(&mut self, ctx: &Context, held: &mut Held) {
        // A cancel may not have woken the loop yet: a job cancelled while it
        // waited here must not reach a worker.
        let cancels = ctx.parts.wakeups.take_cancels();
        self.apply_cancels(ctx, held, cancels);
        let dispatcher = &ctx.dispatcher;
        self.demand.assign_ready(|next| {
            // Cancelled, expired or timed out meanwhile: drop it.
            let waiting = held
                .get(&next.job_id)
                .is_some_and(|r| !r.assigned && i64::from(r.attempt) == i64::from(next.attempt));
            if !waiting {
                return Placed::Gone;
            }
            match dispatcher.assign(next.clone()) {
                Ok(worker_id) => {
                    if let Some(r) = held.get_mut(&next.job_id) {
                        r.assigned = true;
                    }
                    held.assigned_to(next.job_id.clone(), worker_id);
                    Placed::Gone
                }
                Err(AssignError::NoCapacity { .. }) => Placed::NoRoom,
                Err(AssignError::AlreadyRunning { .. }) => {
                    // A stale attempt still runs there: stop it; this
                    // attempt's lease lapses and a sweep requeues it.
                    dispatcher.cancel(&next.job_id, "superseded by a newer attempt");
                    held.release(&next.job_id);
                    Placed::Gone
                }
            }
        });
    }

    /// Assigns just-claimed jobs of `model` (`want` were asked for) to workers.
    /// Returns whether the queue may hold more for free slots (claim again).
    pub(super) async fn place(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        publish: &mut Publish,
        model: &str,
        want: u64,
        rows: Vec<job::Model>,
    ) -> Result<bool, DbErr> {
        let claimed = rows.len() as u64;
        let rows = rows.into_iter().map(|row| Handed { row, stored: true }).collect();
        if !self.assign(ctx, held, publish, rows).await? {
            return Ok(false);
        }
        let empty = claimed < want;
        self.demand.claimed(model, empty);
        Ok(!empty)
    }

    /// Places jobs that submits handed to this instance (written claimed by
    /// it, or not written at all).
    pub(super) async fn adopt(&mut self, ctx: &Context, held: &mut Held, publish: &mut Publish, rows: Vec<Handed>) {
        let models: HashSet<String> = rows.iter().map(|job| job.row.model.clone()).collect();
        match self.assign(ctx, held, publish, rows).await {
            Ok(true) => {}
            // Some went back to the queue: claim them when a slot frees.
            Ok(false) => {
                for model in models {
                    self.demand.put_back(&model);
                }
            }
            Err(error) => tracing::warn!(%error, "assigning handed-over jobs failed"),
        }
    }

    /// Gives the fast lane a credit per free slot of each model whose queue
    /// was found empty.
    pub(super) fn refresh_credits(&self, ctx: &Context) {
        let health = ctx.dispatcher.health();
        let free = health
            .models
            .into_iter()
            .filter(|(model, health)| health.free_slots > 0 && self.demand.lane_may_take(model))
            .map(|(model, health)| (model, health.free_slots));
        ctx.parts.lane.set_credits(&ctx.instance, free);
    }

    /// After each turn of the loop: with the fast lane, refreshes its
    /// credits (see [`Claim::refresh_credits`]).
    pub(super) fn refresh_lane(&self, ctx: &Context) {
        if self.fast_lane {
            self.refresh_credits(ctx);
        }
    }

    /// Assigns jobs claimed by this instance to workers, lowest priority last.
    /// Jobs no worker took go back to the queue; returns whether all were placed.
    pub(super) async fn assign(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        publish: &mut Publish,
        mut rows: Vec<Handed>,
    ) -> Result<bool, DbErr> {
        rows.sort_by(|a, b| (a.row.low_priority, &a.row.id).cmp(&(b.row.low_priority, &b.row.id)));
        let mut put_back = Vec::new();
        // Unstored jobs no worker took: written to the queue instead.
        let mut queue = Vec::new();
        let store_after = ctx.store.config().sync_store_after_ms();
        for Handed { mut row, stored } in rows {
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
                // A written row's input is not needed here again: it moves.
                // An unwritten one is kept whole until it is written.
                input_json: if stored {
                    std::mem::take(&mut row.input)
                } else {
                    row.input.clone()
                },
                deadline: system_time(deadline_ms),
                trace_parent: gantry_telemetry::trace::traceparent_of(&span),
            };
            let ahead = ctx.store.config().claim_ahead > 0;
            let retry = ahead.then(|| assignment.clone());
            let assigned = match ctx.dispatcher.assign(assignment) {
                Ok(worker_id) => {
                    held.assigned_to(row.id.clone(), worker_id);
                    true
                }
                // Kept claimed for the next free slot (see `claim_ahead`).
                Err(AssignError::NoCapacity { model }) if let Some(retry) = retry => {
                    self.demand.keep_ready(model, retry);
                    false
                }
                Err(error) => {
                    if let AssignError::AlreadyRunning { .. } = error {
                        // A stale attempt still runs there: stop it, try again later.
                        ctx.dispatcher.cancel(&row.id, "superseded by a newer attempt");
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
            held.hold(
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
            let mut plan = Plan::new(now_ms(), ctx.store.config(), &ctx.instance);
            let mut written = Vec::new();
            for row in queue {
                written.push(row.id.clone());
                let row = plan.released(row, true);
                plan.stores.push(Store { row, charge: None });
            }
            match ctx.run_plan(plan).await {
                Ok(settled) => {
                    ctx.parts.lane.stored(&written);
                    publish.publish(ctx, &settled.finals, |row| row.sync);
                }
                Err(error) => {
                    ctx.parts.outcomes.lose(&written);
                    return Err(error);
                }
            }
        }
        if put_back.is_empty() {
            return Ok(!queued);
        }
        self.put_back(ctx, &put_back).await?;
        Ok(false)
    }

    /// Writes unstored jobs that are due (see `SchedulerConfig::sync_store_after`)
    /// as running; from then on they are like any other claimed job.
    pub(super) async fn store_due(&self, ctx: &Context, held: &mut Held) -> Result<(), DbErr> {
        let now = now_ms();
        let mut plan = Plan::new(now, ctx.store.config(), &ctx.instance);
        let mut ids = Vec::new();
        for (job_id, running) in held.iter() {
            if let Some(row) = running.unstored.as_deref()
                && running.due_at() <= now
            {
                let worker = held.unwritten_worker(job_id);
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
        let result = ctx.run_plan(plan).await;
        for job_id in &ids {
            if let Some(running) = held.get_mut(job_id) {
                match &result {
                    Ok(_) => running.unstored = None,
                    // Try again shortly.
                    Err(_) => running.store_at = now.saturating_add(100),
                }
            }
        }
        result?;
        ctx.parts.lane.stored(&ids);
        Ok(())
    }

    /// Claims up to `limit` queued jobs of `model` for this instance, normal
    /// priority first, oldest first (see `plan.rs`).
    pub(super) async fn claim(&self, ctx: &Context, model: &str, limit: u64) -> Result<Vec<job::Model>, DbErr> {
        let mut plan = Plan::new(now_ms(), ctx.store.config(), &ctx.instance);
        plan.claims.push((model.to_string(), limit));
        let settled = ctx.run_plan(plan).await?;
        Ok(settled
            .claims
            .into_iter()
            .next()
            .map(|(_, _, rows)| rows)
            .unwrap_or_default())
    }

    /// Returns just-claimed jobs no worker took; the attempt was never sent,
    /// so it is not counted.
    pub(super) async fn put_back(&self, ctx: &Context, ids: &[String]) -> Result<(), DbErr> {
        ctx.parts.writer.put_back(ids, &ctx.instance).await
    }

    // ---- shutdown ----

    /// On shutdown: closes the fast lane and hands every job of this
    /// instance back to the queue (see [`Claim::release`]).
    pub(super) async fn close(&mut self, ctx: &Context, held: &mut Held) {
        // Jobs handed over but not adopted are this instance's too: the
        // release below requeues them with the rest.
        let left = if self.fast_lane {
            ctx.parts.lane.close(&ctx.instance).unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Err(error) = self.release(ctx, held, left).await {
            tracing::warn!(%error, "could not hand running jobs back to the queue");
        }
        if self.fast_lane {
            // Any job still only in memory could not be written: gone.
            ctx.parts.outcomes.lose_all();
        }
    }

    /// On shutdown: cancels this instance's jobs on their workers and puts them
    /// back in the queue, giving back the attempt they used. Jobs not written
    /// yet (running, or handed over and `left` unadopted) are written queued.
    pub(super) async fn release(&mut self, ctx: &Context, held: &mut Held, left: Vec<Handed>) -> Result<(), DbErr> {
        for (job_id, _) in held.iter() {
            ctx.dispatcher.cancel(job_id, "scheduler shutting down");
        }
        let mut plan = Plan::new(now_ms(), ctx.store.config(), &ctx.instance);
        let running = held.release_all();
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
        self.demand.clear_ready();
        if !plan.is_empty() {
            ctx.run_plan(plan).await?;
            ctx.parts.lane.stored(&written);
        }
        ctx.parts.writer.release(&ctx.instance, now_ms()).await?;
        // Back in the queue: the other processes' schedulers may take them now.
        for model in models {
            ctx.parts.outcomes.signal(Signal::Queued(model));
        }
        Ok(())
    }

    /// Writes the worker ids of running jobs (one statement per worker).
    pub(super) async fn flush_workers(&self, ctx: &Context, held: &mut Held) -> Result<(), DbErr> {
        let by_worker = held.take_workers_to_write();
        for (worker_id, jobs) in by_worker {
            ctx.parts.writer.set_worker(&jobs, &ctx.instance, &worker_id).await?;
        }
        Ok(())
    }
}

fn system_time(ms: i64) -> Option<SystemTime> {
    let ms = u64::try_from(ms).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}
