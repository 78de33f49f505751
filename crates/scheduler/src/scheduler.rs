//! The running half: claims queued jobs, assigns them to workers through the
//! dispatcher, settles what workers report, and sweeps (leases, timeouts,
//! expiry).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_billing::{Charge, record_charges};
use gantry_catalog::ModelCatalog;
use gantry_dispatch::{AssignError, Assignment, Dispatcher, Event, Usage};
use rand::RngExt;
use sea_orm::sea_query::{Expr, LockBehavior, LockType, OnConflict, Order, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QuerySelect, TransactionTrait,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::config::millis;
use crate::entity::{chunk, job};
use crate::store::{JobStore, now_ms, plus, retention_expr};
use crate::types::{JobStatus, JobView, SchedulerError};

use job::Column as J;

/// Most events settled in one transaction.
const EVENT_BATCH: usize = 256;
/// Ids per `IN (…)` list.
const ID_CHUNK: usize = 500;
/// The error a worker reports when the attempt's deadline passed.
const DEADLINE_EXCEEDED: &str = "deadline exceeded";

/// The scheduler's loops, running on a Tokio task. Stop it with
/// [`Scheduler::shutdown`]; dropping it instead behaves like a crash (its jobs
/// are requeued by whichever scheduler sweeps after its lease lapses).
pub struct Scheduler {
    instance_id: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
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
        let webhooks = reqwest::Client::builder()
            .timeout(store.config.webhook_timeout)
            .build()
            .map_err(|e| tracing::warn!(error = %e, "webhook client unavailable; webhooks are disabled"))
            .ok();
        let mut core = Core {
            db: store.db.clone(),
            store,
            catalog,
            dispatcher,
            instance: instance_id.clone(),
            running: HashMap::new(),
            pending_workers: HashMap::new(),
            to_fill: HashSet::new(),
            drained: HashSet::new(),
            webhooks,
        };
        core.sweep().await?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(core.run(events, stopped));
        Ok(Scheduler {
            instance_id,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// This instance's id, as stored in `jobs.owner`.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Stops the loops and hands the jobs this instance runs back to the queue
    /// at once (without using up an attempt); they are cancelled on their workers.
    pub async fn shutdown(mut self) {
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
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A job this instance has assigned and not yet settled.
struct Running {
    attempt: i32,
    model: String,
    deadline_ms: i64,
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
    webhooks: Option<reqwest::Client>,
}

/// What one settled batch produced, applied after its commit.
#[derive(Default)]
struct Outcome {
    finals: Vec<job::Model>,
    settled: Vec<String>,
    refill: HashSet<String>,
}

impl Core {
    async fn run(mut self, mut events: mpsc::Receiver<Event>, mut stopped: oneshot::Receiver<()>) {
        let hub = Arc::clone(&self.store.hub);
        let mut tick = tokio::time::interval(self.store.config.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events_open = true;
        loop {
            let next_deadline = self.running.values().map(|r| r.deadline_ms).min();
            let deadline_sleep = async {
                match next_deadline {
                    Some(at) => tokio::time::sleep(until(at)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Stop, sweeps and due deadlines are ready only now and then,
                // so listing them first cannot starve the event stream, and a
                // busy event stream cannot starve the sweeps (lease renewal).
                biased;
                _ = &mut stopped => break,
                _ = tick.tick() => {
                    if let Err(error) = self.sweep().await {
                        tracing::warn!(%error, "sweep failed");
                    }
                }
                () = deadline_sleep => {
                    if let Err(error) = self.time_out().await {
                        tracing::warn!(%error, "timeout sweep failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                () = hub.notify.notified() => {
                    let pending = hub.take_pending();
                    for model in pending.models {
                        self.drained.remove(&model);
                        self.to_fill.insert(model);
                    }
                    for job_id in pending.cancels {
                        if self.running.remove(&job_id).is_some() {
                            self.pending_workers.remove(&job_id);
                            self.dispatcher.cancel(&job_id, "cancelled");
                        }
                    }
                }
                event = events.recv(), if events_open => match event {
                    Some(first) => {
                        let mut batch = vec![first];
                        while batch.len() < EVENT_BATCH {
                            match events.try_recv() {
                                Ok(event) => batch.push(event),
                                Err(_) => break,
                            }
                        }
                        self.settle(batch).await;
                    }
                    None => events_open = false,
                },
            }
            self.fill().await;
        }
        if let Err(error) = self.release().await {
            tracing::warn!(%error, "could not hand running jobs back to the queue");
        }
    }

    // ---- settling worker events ----

    /// Applies a batch of events in one transaction (retried a few times on a
    /// database error). Completion and charge of a job commit together.
    async fn settle(&mut self, batch: Vec<Event>) {
        let mut outcome = None;
        for attempt in 0..3u32 {
            match self.settle_once(&batch).await {
                Ok(done) => {
                    outcome = Some(done);
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "settling worker events failed");
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
            }
        }
        let Some(outcome) = outcome else {
            // Left IN_PROGRESS in the database: forget them here so their lease
            // lapses and a sweep requeues them.
            for event in &batch {
                if let Some(job_id) = terminal_job(event) {
                    self.running.remove(job_id);
                    self.pending_workers.remove(job_id);
                }
            }
            return;
        };
        for job_id in &outcome.settled {
            self.running.remove(job_id);
            self.pending_workers.remove(job_id);
        }
        for model in outcome.refill {
            self.drained.remove(&model);
            self.to_fill.insert(model);
        }
        self.publish(&outcome.finals);
        for event in batch {
            if let Event::CapacityAvailable { model } = event
                && !self.drained.contains(&model)
            {
                self.to_fill.insert(model);
            }
        }
    }

    async fn settle_once(&self, batch: &[Event]) -> Result<Outcome, DbErr> {
        let now = now_ms();
        let config = &self.store.config;
        let txn = self.db.begin().await?;
        let mut outcome = Outcome::default();
        let mut chunks: Vec<(String, i64, String)> = Vec::new();
        let mut charges = Vec::new();
        // Jobs already settled earlier in this batch (duplicates are ignored).
        let mut done: HashSet<&str> = HashSet::new();
        for event in batch {
            let current = |job_id: &str, attempt: u32| {
                self.running
                    .get(job_id)
                    .filter(|r| i64::from(r.attempt) == i64::from(attempt) && !done.contains(job_id))
            };
            match event {
                Event::Chunk {
                    job_id,
                    attempt,
                    seq,
                    output,
                    ..
                } => {
                    if current(job_id, *attempt).is_some() {
                        let seq = i64::try_from(*seq).unwrap_or(i64::MAX);
                        chunks.push((job_id.clone(), seq, output.to_string()));
                    }
                    continue;
                }
                Event::Progress { .. } | Event::CapacityAvailable { .. } => continue,
                _ => {}
            }
            // Chunks of a job precede its terminal event: store them first.
            insert_chunks(&txn, &mut chunks).await?;
            match event {
                Event::Completed {
                    job_id,
                    attempt,
                    worker_id,
                    output,
                    usage,
                    ..
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        tracing::debug!(%job_id, attempt, "ignoring a result for an attempt not running here");
                        continue;
                    };
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    let priced = match self.catalog.get(&running.model) {
                        Some(spec) => gantry_billing::cost(usage.quantity_micros, &usage.unit, spec)
                            .map_err(|e| format!("cannot bill the result: {e}")),
                        None => Err(format!("model {:?} is not in the catalog", running.model)),
                    };
                    let amount = match priced {
                        Ok(amount) => amount,
                        Err(error) => {
                            let rows = finish(
                                job_id,
                                *attempt,
                                JobStatus::Failed,
                                Some(&error),
                                Some(worker_id),
                                now,
                                config,
                            )
                            .exec_with_returning(&txn)
                            .await?;
                            outcome.finals.extend(rows);
                            continue;
                        }
                    };
                    let rows = complete(job_id, *attempt, worker_id, output, usage, amount, now, config)
                        .exec_with_returning(&txn)
                        .await?;
                    for row in rows {
                        charges.push(Charge {
                            user_id: row.user_id.clone(),
                            job_id: row.id.clone(),
                            model: row.model.clone(),
                            unit: usage.unit.clone(),
                            quantity_micros: usage.quantity_micros,
                            amount_micro_usd: amount,
                        });
                        outcome.finals.push(row);
                    }
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
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    let rows = if *retryable {
                        outcome.refill.insert(running.model.clone());
                        requeue_or_fail(error, now, config)
                            .filter(J::Id.eq(job_id.as_str()))
                            .filter(J::Attempt.eq(running.attempt))
                            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                            .exec_with_returning(&txn)
                            .await?
                    } else {
                        let status = if error == DEADLINE_EXCEEDED {
                            JobStatus::TimedOut
                        } else {
                            JobStatus::Failed
                        };
                        finish(job_id, *attempt, status, Some(error), Some(worker_id), now, config)
                            .exec_with_returning(&txn)
                            .await?
                    };
                    outcome.finals.extend(rows.into_iter().filter(is_final));
                }
                Event::Cancelled { job_id, attempt, .. } => {
                    if current(job_id, *attempt).is_none() {
                        continue;
                    }
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    // Normally already CANCELLED (or TIMED_OUT) in the database.
                    let rows = finish(job_id, *attempt, JobStatus::Cancelled, None, None, now, config)
                        .exec_with_returning(&txn)
                        .await?;
                    outcome.finals.extend(rows);
                }
                Event::WorkerLost { running_job_ids, .. } => {
                    for job_id in running_job_ids {
                        let Some(running) = self.running.get(job_id).filter(|_| !done.contains(job_id.as_str())) else {
                            continue;
                        };
                        done.insert(job_id);
                        outcome.settled.push(job_id.clone());
                        outcome.refill.insert(running.model.clone());
                        let rows = requeue_or_fail("worker lost", now, config)
                            .filter(J::Id.eq(job_id.as_str()))
                            .filter(J::Attempt.eq(running.attempt))
                            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                            .exec_with_returning(&txn)
                            .await?;
                        outcome.finals.extend(rows.into_iter().filter(is_final));
                    }
                }
                Event::Chunk { .. } | Event::Progress { .. } | Event::CapacityAvailable { .. } => {}
            }
        }
        insert_chunks(&txn, &mut chunks).await?;
        record_charges(&txn, &charges, now).await?;
        txn.commit().await?;
        Ok(outcome)
    }

    /// Wakes in-process waiters and sends webhooks for jobs that just ended.
    fn publish(&self, finals: &[job::Model]) {
        if finals.is_empty() {
            return;
        }
        let now = now_ms();
        let views: Vec<JobView> = finals.iter().map(|row| JobView::of(row, now)).collect();
        self.store.hub.finished(&views);
        let Some(client) = &self.webhooks else {
            return;
        };
        for (row, view) in finals.iter().zip(views) {
            let Some(url) = row.webhook.clone() else {
                continue;
            };
            if view.status == JobStatus::Cancelled {
                continue;
            }
            let client = client.clone();
            let attempts = self.store.config.webhook_attempts.max(1);
            tokio::spawn(async move {
                for attempt in 1..=attempts {
                    match client.post(&url).json(&view).send().await {
                        Ok(response) if response.status().is_success() => return,
                        Ok(response) => {
                            tracing::warn!(job_id = %view.id, status = %response.status(), attempt, "webhook refused")
                        }
                        Err(error) => tracing::warn!(job_id = %view.id, %error, attempt, "webhook failed"),
                    }
                    if attempt < attempts {
                        tokio::time::sleep(Duration::from_millis(500) * 2u32.pow(attempt - 1)).await;
                    }
                }
            });
        }
    }

    // ---- claiming and assigning ----

    /// Claims and assigns queued jobs for every model marked for filling, as
    /// long as its workers have free slots.
    async fn fill(&mut self) {
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
            let free = self
                .dispatcher
                .health()
                .models
                .get(model)
                .map_or(0, |health| health.free_slots);
            let want = free.min(u64::from(self.store.config.claim_batch.max(1)));
            if want == 0 {
                return Ok(());
            }
            let mut rows = self.claim(model, want).await?;
            let claimed = rows.len() as u64;
            rows.sort_by(|a, b| (a.low_priority, &a.id).cmp(&(b.low_priority, &b.id)));
            let mut put_back = Vec::new();
            let mut failed = Vec::new();
            for row in rows {
                let input: Value = match serde_json::from_str(&row.input) {
                    Ok(input) => input,
                    Err(error) => {
                        failed.push((row.id, row.attempt, format!("stored input is not JSON: {error}")));
                        continue;
                    }
                };
                let deadline_ms = row.run_deadline_ms.unwrap_or(i64::MAX);
                let assignment = Assignment {
                    job_id: row.id.clone(),
                    attempt: u32::try_from(row.attempt).unwrap_or(0),
                    model: row.model.clone(),
                    input,
                    deadline: system_time(deadline_ms),
                };
                match self.dispatcher.assign(assignment) {
                    Ok(worker_id) => {
                        self.pending_workers.insert(row.id.clone(), worker_id);
                        self.running.insert(
                            row.id,
                            Running {
                                attempt: row.attempt,
                                model: row.model,
                                deadline_ms,
                            },
                        );
                    }
                    Err(AssignError::NoCapacity { .. }) => put_back.push(row.id),
                    Err(AssignError::AlreadyRunning { .. }) => {
                        // A stale attempt still runs there: stop it, try again later.
                        self.dispatcher.cancel(&row.id, "superseded by a newer attempt");
                        put_back.push(row.id);
                    }
                }
            }
            let now = now_ms();
            for (job_id, attempt, error) in &failed {
                let rows = finish(
                    job_id,
                    u32::try_from(*attempt).unwrap_or(0),
                    JobStatus::Failed,
                    Some(error),
                    None,
                    now,
                    &self.store.config,
                )
                .exec_with_returning(&self.db)
                .await?;
                self.publish(&rows);
            }
            if !put_back.is_empty() {
                self.put_back(&put_back).await?;
                return Ok(());
            }
            if claimed < want {
                self.drained.insert(model.to_string());
                return Ok(());
            }
            self.drained.remove(model);
        }
    }

    /// Claims up to `limit` queued jobs of `model` for this instance, normal
    /// priority first, oldest first. One statement: `UPDATE … WHERE id IN
    /// (SELECT … FOR UPDATE SKIP LOCKED) AND status = 'IN_QUEUE' RETURNING *`
    /// (SQLite ignores the lock clause; its writes are serialized anyway).
    async fn claim(&self, model: &str, limit: u64) -> Result<Vec<job::Model>, DbErr> {
        let now = now_ms();
        let lease_until = now.saturating_add(millis(self.store.config.lease));
        let candidates = Query::select()
            .column(J::Id)
            .from(job::Entity)
            .and_where(J::Model.eq(model))
            .and_where(J::Status.eq(JobStatus::InQueue.as_str()))
            .and_where(J::ExpiresAtMs.gt(now))
            .order_by(J::LowPriority, Order::Asc)
            .order_by(J::Id, Order::Asc)
            .limit(limit)
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .to_owned();
        job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::InProgress.as_str()))
            .col_expr(J::Attempt, plus(J::Attempt, 1))
            .col_expr(J::Owner, Expr::value(self.instance.as_str()))
            .col_expr(J::LeaseUntilMs, Expr::value(lease_until))
            .col_expr(J::StartedAtMs, Expr::value(now))
            .col_expr(J::WorkerId, Expr::value(Option::<String>::None))
            .col_expr(J::RunDeadlineMs, Expr::cust(format!("{now} + execution_timeout_ms")))
            .filter(J::Id.in_subquery(candidates))
            .filter(J::Status.eq(JobStatus::InQueue.as_str()))
            .exec_with_returning(&self.db)
            .await
    }

    /// Returns just-claimed jobs no worker took; the attempt was never sent,
    /// so it is not counted.
    async fn put_back(&self, ids: &[String]) -> Result<(), DbErr> {
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
        self.renew().await?;
        self.time_out().await?;
        self.requeue_orphans().await?;
        self.expire().await?;
        self.flush_workers().await?;
        // Claim anything left queued (submitted elsewhere, or a lost wake-up).
        for (model, health) in self.dispatcher.health().models {
            if health.free_slots > 0 {
                self.to_fill.insert(model);
            }
        }
        Ok(())
    }

    /// Renews this instance's lease on the jobs it runs, and learns which of
    /// them ended elsewhere (cancelled, timed out, expired, requeued): those
    /// are stopped on their workers.
    async fn renew(&mut self) -> Result<(), DbErr> {
        if self.running.is_empty() {
            return Ok(());
        }
        let lease_until = now_ms().saturating_add(millis(self.store.config.lease));
        let ids: Vec<String> = self.running.keys().cloned().collect();
        let mut alive: HashSet<(String, i32)> = HashSet::new();
        for part in ids.chunks(ID_CHUNK) {
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
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(id, r)| !alive.contains(&((*id).clone(), r.attempt)))
            .map(|(id, _)| id.clone())
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
        let now = now_ms();
        let rows = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::TimedOut.as_str()))
            .col_expr(J::Error, Expr::value("execution timeout exceeded"))
            .col_expr(J::CompletedAtMs, Expr::value(now))
            .col_expr(J::ExpiresAtMs, retention_expr(&self.store.config, now))
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
            .filter(J::RunDeadlineMs.lte(now))
            .exec_with_returning(&self.db)
            .await?;
        // Every job of ours that is due has now ended: timed out by this
        // statement, or already finished elsewhere. Stop them all.
        let due: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.deadline_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for job_id in due {
            self.running.remove(&job_id);
            self.pending_workers.remove(&job_id);
            self.dispatcher.cancel(&job_id, "execution timeout");
        }
        self.publish(&rows);
        Ok(())
    }

    /// Requeues running jobs whose scheduler's lease lapsed (it crashed or lost
    /// the database), or fails them once out of attempts.
    async fn requeue_orphans(&mut self) -> Result<(), DbErr> {
        let now = now_ms();
        let rows = requeue_or_fail("scheduler lost", now, &self.store.config)
            .filter(J::Status.eq(JobStatus::InProgress.as_str()))
            .filter(J::LeaseUntilMs.lt(now))
            .exec_with_returning(&self.db)
            .await?;
        for row in &rows {
            if self.running.remove(&row.id).is_some() {
                self.pending_workers.remove(&row.id);
                self.dispatcher.cancel(&row.id, "lease lapsed");
            }
            self.drained.remove(&row.model);
            self.to_fill.insert(row.model.clone());
        }
        let finals: Vec<job::Model> = rows.into_iter().filter(is_final).collect();
        self.publish(&finals);
        Ok(())
    }

    /// Deletes jobs past their TTL (queued or running) or their result
    /// retention (finished), with their chunks.
    async fn expire(&mut self) -> Result<(), DbErr> {
        let now = now_ms();
        let doomed: Vec<String> = job::Entity::find()
            .select_only()
            .column(J::Id)
            .filter(J::ExpiresAtMs.lte(now))
            .limit(1000)
            .into_tuple()
            .all(&self.db)
            .await?;
        for part in doomed.chunks(ID_CHUNK) {
            let txn = self.db.begin().await?;
            chunk::Entity::delete_many()
                .filter(chunk::Column::JobId.is_in(part.iter().map(String::as_str)))
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
        Ok(())
    }

    /// Writes the worker ids of running jobs (one statement per worker).
    async fn flush_workers(&mut self) -> Result<(), DbErr> {
        if self.pending_workers.is_empty() {
            return Ok(());
        }
        let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
        for (job_id, worker_id) in self.pending_workers.drain() {
            by_worker.entry(worker_id).or_default().push(job_id);
        }
        for (worker_id, jobs) in by_worker {
            for part in jobs.chunks(ID_CHUNK) {
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
    /// back in the queue, giving back the attempt they used.
    async fn release(&mut self) -> Result<(), DbErr> {
        for job_id in self.running.keys() {
            self.dispatcher.cancel(job_id, "scheduler shutting down");
        }
        self.running.clear();
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
        Ok(())
    }
}

// ---- statements ----

/// COMPLETED, guarded on (id, attempt, IN_PROGRESS).
#[allow(clippy::too_many_arguments)]
fn complete(
    job_id: &str,
    attempt: u32,
    worker_id: &str,
    output: &Value,
    usage: &Usage,
    amount: i64,
    now: i64,
    config: &crate::SchedulerConfig,
) -> sea_orm::UpdateMany<job::Entity> {
    let output = match output.clone() {
        Value::Object(mut map) => {
            let cost = serde_json::Number::from_f64(gantry_billing::usd(amount)).map_or(Value::Null, Value::Number);
            map.insert("cost".into(), cost);
            Value::Object(map)
        }
        // Not an object: stored as the model returned it (the cost is in the ledger).
        other => other,
    };
    job::Entity::update_many()
        .col_expr(J::Status, Expr::value(JobStatus::Completed.as_str()))
        .col_expr(J::Output, Expr::value(output.to_string()))
        .col_expr(J::Error, Expr::value(Option::<String>::None))
        .col_expr(J::WorkerId, Expr::value(worker_id))
        .col_expr(J::CostMicroUsd, Expr::value(amount))
        .col_expr(J::UsageUnit, Expr::value(usage.unit.as_str()))
        .col_expr(J::UsageQuantityMicros, Expr::value(usage.quantity_micros))
        .col_expr(J::CompletedAtMs, Expr::value(now))
        .col_expr(J::ExpiresAtMs, retention_expr(config, now))
        .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
        .filter(J::Id.eq(job_id))
        .filter(J::Attempt.eq(i64::from(attempt)))
        .filter(J::Status.eq(JobStatus::InProgress.as_str()))
}

/// A final status other than COMPLETED, guarded on (id, attempt, IN_PROGRESS).
fn finish(
    job_id: &str,
    attempt: u32,
    status: JobStatus,
    error: Option<&str>,
    worker_id: Option<&str>,
    now: i64,
    config: &crate::SchedulerConfig,
) -> sea_orm::UpdateMany<job::Entity> {
    let mut update = job::Entity::update_many()
        .col_expr(J::Status, Expr::value(status.as_str()))
        .col_expr(J::CompletedAtMs, Expr::value(now))
        .col_expr(J::ExpiresAtMs, retention_expr(config, now))
        .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None));
    if let Some(error) = error {
        update = update.col_expr(J::Error, Expr::value(error));
    }
    if let Some(worker_id) = worker_id {
        update = update.col_expr(J::WorkerId, Expr::value(worker_id));
    }
    update
        .filter(J::Id.eq(job_id))
        .filter(J::Attempt.eq(i64::from(attempt)))
        .filter(J::Status.eq(JobStatus::InProgress.as_str()))
}

/// Back to IN_QUEUE while attempts remain, else FAILED with `error`. The
/// caller adds the filters.
fn requeue_or_fail(error: &str, now: i64, config: &crate::SchedulerConfig) -> sea_orm::UpdateMany<job::Entity> {
    let more = "attempt < max_attempts";
    let sync_until = now.saturating_add(config.retention_ms(true));
    let async_until = now.saturating_add(config.retention_ms(false));
    job::Entity::update_many()
        .col_expr(
            J::Status,
            Expr::cust(format!("CASE WHEN {more} THEN 'IN_QUEUE' ELSE 'FAILED' END")),
        )
        .col_expr(J::Error, Expr::value(error))
        .col_expr(
            J::Retries,
            Expr::cust(format!("CASE WHEN {more} THEN retries + 1 ELSE retries END")),
        )
        .col_expr(
            J::QueuedAtMs,
            Expr::cust(format!("CASE WHEN {more} THEN {now} ELSE queued_at_ms END")),
        )
        .col_expr(
            J::CompletedAtMs,
            Expr::cust(format!("CASE WHEN {more} THEN NULL ELSE {now} END")),
        )
        .col_expr(
            J::ExpiresAtMs,
            Expr::cust(format!(
                "CASE WHEN {more} THEN expires_at_ms WHEN sync THEN {sync_until} ELSE {async_until} END"
            )),
        )
        .col_expr(J::Owner, Expr::value(Option::<String>::None))
        .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
        .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
}

/// Stores chunks (skipping sequence numbers already stored by an earlier
/// attempt) and empties `chunks`.
async fn insert_chunks<C: ConnectionTrait>(db: &C, chunks: &mut Vec<(String, i64, String)>) -> Result<(), DbErr> {
    if chunks.is_empty() {
        return Ok(());
    }
    let mut insert = Query::insert();
    insert
        .into_table(chunk::Entity)
        .columns([chunk::Column::JobId, chunk::Column::Seq, chunk::Column::Output]);
    for (job_id, seq, output) in chunks.drain(..) {
        insert
            .values([job_id.into(), seq.into(), output.into()])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    insert.on_conflict(
        OnConflict::columns([chunk::Column::JobId, chunk::Column::Seq])
            .do_nothing()
            .to_owned(),
    );
    db.execute(&insert).await?;
    Ok(())
}

fn is_final(row: &job::Model) -> bool {
    JobStatus::parse(&row.status).is_some_and(JobStatus::is_final)
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
