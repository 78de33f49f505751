//! Claiming queued jobs and assigning them to workers: filling free slots per model,
//! placing claimed rows (ahead of free slots when configured), adopting jobs handed over by
//! the fast lane, writing them when they run too long unwritten, and putting back what could
//! not be assigned.

use std::collections::HashSet;

use gantry_dispatch::{AssignError, Assignment};
use sea_orm::DbErr;

use gantry_jobs::Handed;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::{Plan, Store};

use super::demand::Placed;
use super::held::Running;
use super::{Core, system_time};

impl Core {
    /// Claims and assigns queued jobs for every model marked for filling, as
    /// long as its workers have free slots.
    pub(super) async fn fill(&mut self) {
        if self.demand.has_ready() {
            self.assign_ready();
        }
        for model in self.demand.take_wanted() {
            if let Err(error) = self.fill_model(&model).await {
                tracing::warn!(%model, %error, "claiming jobs failed");
            }
        }
    }

    pub(super) async fn fill_model(&mut self, model: &str) -> Result<(), DbErr> {
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
    pub(super) fn want(&self, model: &str) -> u64 {
        let free = self
            .dispatcher
            .health()
            .models
            .get(model)
            .map_or(0, |health| health.free_slots)
            .saturating_sub(self.parts.lane.lane_taken(&self.instance, model));
        if free == 0 {
            return 0;
        }
        let batch = u64::from(self.store.config().claim_batch.max(1));
        let ahead = u64::from(self.store.config().claim_ahead);
        let ready = self.demand.ready_count(model);
        free.saturating_add(ahead)
            .saturating_sub(ready)
            .min(batch.saturating_mul(2))
    }

    /// Stops jobs cancelled in this process: dropped from `ready` (never
    /// handed out) or cancelled on their workers.
    pub(super) fn apply_cancels(&mut self, cancels: Vec<String>) {
        for job_id in cancels {
            if self.held.release(&job_id).is_some() {
                self.dispatcher.cancel(&job_id, "cancelled");
            }
        }
    }

    /// Assigns jobs kept claimed in `ready` to the slots that are free now.
    pub(super) fn assign_ready(&mut self) {
        // A cancel may not have woken the loop yet: a job cancelled while it
        // waited here must not reach a worker.
        let cancels = self.parts.wakeups.take_cancels();
        self.apply_cancels(cancels);
        let Core {
            demand,
            held,
            dispatcher,
            ..
        } = self;
        demand.assign_ready(|next| {
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
    pub(super) async fn place(&mut self, model: &str, want: u64, rows: Vec<job::Model>) -> Result<bool, DbErr> {
        let claimed = rows.len() as u64;
        let rows = rows.into_iter().map(|row| Handed { row, stored: true }).collect();
        if !self.assign(rows).await? {
            return Ok(false);
        }
        let empty = claimed < want;
        self.demand.claimed(model, empty);
        Ok(!empty)
    }

    /// Places jobs that submits handed to this instance (written claimed by
    /// it, or not written at all).
    pub(super) async fn adopt(&mut self, rows: Vec<Handed>) {
        let models: HashSet<String> = rows.iter().map(|job| job.row.model.clone()).collect();
        match self.assign(rows).await {
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
    pub(super) fn refresh_credits(&self) {
        let health = self.dispatcher.health();
        let free = health
            .models
            .into_iter()
            .filter(|(model, health)| health.free_slots > 0 && self.demand.lane_may_take(model))
            .map(|(model, health)| (model, health.free_slots));
        self.parts.lane.set_credits(&self.instance, free);
    }

    /// Assigns jobs claimed by this instance to workers, lowest priority last.
    /// Jobs no worker took go back to the queue; returns whether all were placed.
    pub(super) async fn assign(&mut self, mut rows: Vec<Handed>) -> Result<bool, DbErr> {
        rows.sort_by(|a, b| (a.row.low_priority, &a.row.id).cmp(&(b.row.low_priority, &b.row.id)));
        let mut put_back = Vec::new();
        // Unstored jobs no worker took: written to the queue instead.
        let mut queue = Vec::new();
        let store_after = self.store.config().sync_store_after_ms();
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
            let ahead = self.store.config().claim_ahead > 0;
            let retry = ahead.then(|| assignment.clone());
            let assigned = match self.dispatcher.assign(assignment) {
                Ok(worker_id) => {
                    self.held.assigned_to(row.id.clone(), worker_id);
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
            self.held.hold(
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
            let mut plan = Plan::new(now_ms(), self.store.config(), &self.instance);
            let mut written = Vec::new();
            for row in queue {
                written.push(row.id.clone());
                let row = plan.released(row, true);
                plan.stores.push(Store { row, charge: None });
            }
            match self.run_plan(plan).await {
                Ok(settled) => {
                    self.parts.lane.stored(&written);
                    self.publish(&settled.finals, |row| row.sync);
                }
                Err(error) => {
                    self.parts.outcomes.lose(&written);
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
    pub(super) async fn store_due(&mut self) -> Result<(), DbErr> {
        let now = now_ms();
        let mut plan = Plan::new(now, self.store.config(), &self.instance);
        let mut ids = Vec::new();
        for (job_id, running) in self.held.iter() {
            if let Some(row) = running.unstored.as_deref()
                && running.due_at() <= now
            {
                let worker = self.held.unwritten_worker(job_id);
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
            if let Some(running) = self.held.get_mut(job_id) {
                match &result {
                    Ok(_) => running.unstored = None,
                    // Try again shortly.
                    Err(_) => running.store_at = now.saturating_add(100),
                }
            }
        }
        result?;
        self.parts.lane.stored(&ids);
        Ok(())
    }

    /// Claims up to `limit` queued jobs of `model` for this instance, normal
    /// priority first, oldest first (see `plan.rs`).
    pub(super) async fn claim(&self, model: &str, limit: u64) -> Result<Vec<job::Model>, DbErr> {
        let mut plan = Plan::new(now_ms(), self.store.config(), &self.instance);
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
    pub(super) async fn put_back(&self, ids: &[String]) -> Result<(), DbErr> {
        self.parts.writer.put_back(ids, &self.instance).await
    }

    // ---- sweeps ----

    /// On shutdown: cancels this instance's jobs on their workers and puts them
    /// back in the queue, giving back the attempt they used. Jobs not written
    /// yet (running, or handed over and `left` unadopted) are written queued.
    pub(super) async fn release(&mut self, left: Vec<Handed>) -> Result<(), DbErr> {
        for (job_id, _) in self.held.iter() {
            self.dispatcher.cancel(job_id, "scheduler shutting down");
        }
        let mut plan = Plan::new(now_ms(), self.store.config(), &self.instance);
        let running = self.held.release_all();
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
            self.run_plan(plan).await?;
            self.parts.lane.stored(&written);
        }
        self.parts.writer.release(&self.instance, now_ms()).await?;
        // Back in the queue: the other processes' schedulers may take them now.
        for model in models {
            self.parts.outcomes.signal(Signal::Queued(model));
        }
        Ok(())
    }
}

impl Core {
    /// Writes the worker ids of running jobs (one statement per worker).
    pub(super) async fn flush_workers(&mut self) -> Result<(), DbErr> {
        let by_worker = self.held.take_workers_to_write();
        for (worker_id, jobs) in by_worker {
            self.parts.writer.set_worker(&jobs, &self.instance, &worker_id).await?;
        }
        Ok(())
    }
}
