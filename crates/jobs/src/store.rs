//! The database half of the job layer: what API processes call.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gantry_catalog::ModelSpec;
use gantry_dispatch::Event;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde_json::Value;

use crate::config::{SchedulerConfig, millis};
use crate::db::{new_job_id, now_ms};
use crate::entity::{chunk, job};
use crate::lane::FastLane;
use crate::live::{LiveJobs, LiveStream};
use crate::signals::{Listener, Signal, Signals};
use crate::transition::{JobWriter, Retention};
use crate::types::{JobCounts, JobError, JobStatus, JobView, Mode, NewJob, SchedulerError, StreamView};
use crate::waiters::{Waiters, Wake};
use crate::wakeups::Wakeups;

use job::Column as J;

/// Durable job storage and the client-facing operations on it. Needs only the
/// database: an API process without a scheduler uses it as is. Cheap to clone;
/// clones share the in-process notifications (waiters and scheduler wake-ups).
#[derive(Clone)]
pub struct JobStore {
    db: DatabaseConnection,
    config: Arc<SchedulerConfig>,
    /// What this store shares with the schedulers of its process; they get
    /// its parts by name ([`JobStore::scheduler_parts`]), never the hub.
    hub: Arc<Hub>,
    /// Every write of `jobs` goes through it (see `transition/mod.rs`).
    writer: JobWriter,
}

impl JobStore {
    /// On SQLite the hot writes (submits, settlements, claims) go through a
    /// writer thread of this store's own (see `engine.rs`), which needs a
    /// database file: an in-memory SQLite database is refused.
    pub fn new(db: DatabaseConnection, config: SchedulerConfig) -> Result<Self, SchedulerError> {
        let writer = JobWriter::open(&db)?;
        Ok(Self {
            db,
            config: Arc::new(config),
            hub: Arc::new(Hub::default()),
            writer,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The database the store is on (the scheduler and the outbox read its
    /// tables directly; every write of `jobs` goes through the writer).
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The parts a scheduler of this process shares with this store.
    pub fn scheduler_parts(&self) -> SchedulerParts {
        SchedulerParts {
            writer: self.writer.clone(),
            lane: Arc::clone(&self.hub.lane),
            wakeups: Arc::clone(&self.hub.wakeups),
            live: Arc::clone(&self.hub.live),
            outcomes: Outcomes {
                hub: Arc::clone(&self.hub),
                writer: self.writer.clone(),
            },
        }
    }

    /// Sends and receives job wake-ups over Redis pub/sub on `channel`, so
    /// that processes sharing the database hear of queued, finished and
    /// cancelled jobs at once instead of at their next sweep or poll (see
    /// `docs/scheduler.md`, "Signals"). Only wake-ups travel this way: a lost
    /// one delays, never loses, a job. Needs a Tokio runtime; an unreachable
    /// server is retried in the background. Fails on a malformed URL, or if
    /// this store (or a clone) is connected already.
    pub fn connect_signals(&self, redis_url: &str, channel: &str) -> Result<(), SchedulerError> {
        self.hub
            .start_signals(redis_url, channel)
            .map_err(SchedulerError::Signals)
    }

    /// Calls `hook` with the model of each job that another process says it
    /// queued (over the signals of [`JobStore::connect_signals`]; never for
    /// this process's own). Once per store; a second hook is refused.
    pub fn on_queued_elsewhere(&self, hook: impl Fn(&str) + Send + Sync + 'static) -> Result<(), SchedulerError> {
        self.hub
            .queued_elsewhere
            .set(Box::new(hook))
            .map_err(|_| SchedulerError::Signals("a hook for jobs queued elsewhere is set already".into()))
    }

    /// Validates and stores a job (IN_QUEUE); it is durable when this returns.
    /// Bad input writes nothing.
    pub async fn submit(&self, user: &str, model: &ModelSpec, req: NewJob, mode: Mode) -> Result<JobView, JobError> {
        let span = if gantry_telemetry::trace::enabled() {
            tracing::info_span!("job.submit", model = %model.id, job_id = tracing::field::Empty)
        } else {
            tracing::Span::none()
        };
        tracing::Instrument::instrument(self.submit_in_span(user, model, req, mode), span).await
    }

    /// [`JobStore::submit`] inside its `job.submit` span (if traces are exported).
    async fn submit_in_span(
        &self,
        user: &str,
        model: &ModelSpec,
        req: NewJob,
        mode: Mode,
    ) -> Result<JobView, JobError> {
        if !req.input.is_object() {
            return Err(JobError::Invalid("`input` must be a JSON object".into()));
        }
        if let Some(url) = &req.webhook {
            let parsed = reqwest::Url::parse(url).map_err(|e| JobError::Invalid(format!("`webhook`: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(JobError::Invalid("`webhook` must be an http(s) URL".into()));
            }
            // An address literal can be judged now; a name is judged on the
            // addresses it resolves to when the webhook is delivered.
            self.config
                .webhook_destinations
                .check_url(&parsed)
                .map_err(|e| JobError::Invalid(format!("`webhook`: {e}")))?;
        }
        self.own_files_are_the_callers(user, &req.input).await?;
        let max = millis(self.config.max_timeout);
        let bounded = |name: &str, value: Option<u64>, default: Duration| -> Result<i64, JobError> {
            match value {
                None => Ok(millis(default)),
                Some(ms) => match i64::try_from(ms) {
                    Ok(ms) if (1..=max).contains(&ms) => Ok(ms),
                    _ => Err(JobError::Invalid(format!("`{name}` must be between 1 and {max} ms"))),
                },
            }
        };
        let execution_timeout_ms = bounded(
            "executionTimeout",
            req.policy.execution_timeout_ms,
            self.config.default_execution_timeout,
        )?;
        let ttl_ms = bounded("ttl", req.policy.ttl_ms, self.config.default_ttl)?;
        let input = serde_json::to_string(&req.input).map_err(|e| JobError::Invalid(e.to_string()))?;
        let now = now_ms();
        let webhook_due_ms = req.webhook.as_ref().map(|_| 0);
        let mut row = job::Model {
            id: new_job_id(now),
            user_id: user.to_string(),
            model: model.id.clone(),
            status: JobStatus::InQueue.as_str().to_string(),
            input,
            output: None,
            error: None,
            webhook: req.webhook,
            low_priority: req.policy.low_priority,
            sync: mode == Mode::Sync,
            execution_timeout_ms,
            ttl_ms,
            attempt: 0,
            max_attempts: i32::try_from(self.config.max_attempts).unwrap_or(i32::MAX),
            retries: 0,
            worker_id: None,
            owner: None,
            lease_until_ms: None,
            run_deadline_ms: None,
            created_at_ms: now,
            queued_at_ms: now,
            started_at_ms: None,
            completed_at_ms: None,
            expires_at_ms: now.saturating_add(ttl_ms),
            cost_micro_usd: None,
            usage_unit: None,
            usage_quantity_micros: None,
            chunks_read: 0,
            webhook_due_ms,
            // The `job.submit` span: what follows the job joins its trace.
            trace_context: gantry_telemetry::trace::current_traceparent(),
            files: None,
            hold_micro_usd: crate::credit::hold(model, &req.input),
            worker_timings: None,
        };
        tracing::Span::current().record("job_id", row.id.as_str());
        // What the caller is told: accepted into the queue.
        let view = JobView::of(&row, now);
        // A scheduler of this process has a free slot and nothing queued for
        // this model: write the job already claimed by it (one write instead of
        // an insert and a claim) and hand it over once committed.
        let claimed = self.hub.lane.take_credit(&row.model);
        // A sync job's caller waits for it right away: register that waiter now,
        // so `wait` needs no read to learn what it already knows.
        let parked = mode == Mode::Sync;
        // A sync job given to this process's scheduler is not written now at
        // all: the scheduler writes it when it ends, or once it has run for
        // `sync_store_after` (see `SchedulerConfig::sync_store_after`).
        // With credit enforced, a job is admitted either by its write or,
        // where this process admits every job of the database (the SQLite
        // file it owns alone), by a hold its writer thread reserves (see
        // `transition/reserved.rs`); elsewhere every job is written.
        let reserve = self.config.require_credit && self.config.sole_owner && self.writer.reserves();
        let unstored = parked
            && claimed.is_some()
            && self.config.sync_store_after_ms() > 0
            && (!self.config.require_credit || reserve);
        if parked {
            self.hub.waiters.park(&row, claimed.is_some());
        }
        if let Some(lane) = &claimed {
            row.status = JobStatus::InProgress.as_str().to_string();
            row.attempt = 1;
            row.owner = Some(lane.instance.clone());
            row.lease_until_ms = Some(now.saturating_add(lane.lease_ms));
            row.started_at_ms = Some(now);
            row.run_deadline_ms = Some(now.saturating_add(execution_timeout_ms));
        }
        if unstored {
            let id = row.id.clone();
            if self.config.require_credit
                && let Err(error) = self.writer.reserve(&row).await
            {
                self.hub.waiters.unpark(&id);
                self.hub.lane.return_credit(&row.model);
                return Err(error);
            }
            if !self.hub.hand_over(row, false) {
                // The lane closed: its scheduler is stopping.
                self.hub.waiters.unpark(&id);
                self.writer.unreserve(std::slice::from_ref(&id));
                return Err(JobError::Lost);
            }
            return Ok(view);
        }
        let inserted = if self.config.require_credit {
            self.writer.admit(&row).await
        } else {
            self.insert(&row).await.map_err(JobError::from)
        };
        if let Err(error) = inserted {
            if parked {
                self.hub.waiters.unpark(&row.id);
            }
            if claimed.is_some() {
                self.hub.lane.return_credit(&row.model);
            }
            return Err(error);
        }
        if claimed.is_some() {
            // If the lane closed meanwhile, the row stays IN_PROGRESS until its
            // lease lapses and a sweep requeues it.
            self.hub.hand_over(row, true);
        } else {
            self.hub.queued(&row.model);
        }
        Ok(view)
    }

    /// Inserts one job row, committed when this returns (see [`JobWriter::insert`]).
    async fn insert(&self, row: &job::Model) -> Result<(), DbErr> {
        self.writer.insert(row).await
    }

    /// The job, if it belongs to `user` and `model_id` and has not expired.
    /// A `runsync` job this process's scheduler runs before writing it (see
    /// `SchedulerConfig::sync_store_after`) reads as `IN_PROGRESS` here.
    pub async fn get(&self, user: &str, model_id: &str, job_id: &str) -> Result<JobView, JobError> {
        let now = now_ms();
        let row = match self.find(user, model_id, job_id, now).await {
            Ok(row) => row,
            Err(JobError::NotFound) if self.hub.lane.is_unstored(job_id, user, model_id) => {
                return Ok(JobView::unstored(job_id));
            }
            // The scheduler may have written it between the read and the
            // look at the lane (it leaves the lane once its row is
            // committed): read once more before saying it does not exist.
            Err(JobError::NotFound) => self.find(user, model_id, job_id, now).await?,
            Err(error) => return Err(error),
        };
        let mut view = self.linked(JobView::of(&row, now)).await;
        view.progress = self.progress_of(&row).await?;
        Ok(view)
    }

    /// The latest progress message of a running job's current attempt.
    async fn progress_of(&self, row: &job::Model) -> Result<Option<Value>, JobError> {
        if row.status != JobStatus::InProgress.as_str() {
            return Ok(None);
        }
        let found = crate::entity::progress::Entity::find_by_id(row.id.clone())
            .filter(crate::entity::progress::Column::Attempt.eq(row.attempt))
            .one(&self.db)
            .await?;
        Ok(found.map(|p| serde_json::from_str(&p.message).unwrap_or(Value::String(p.message))))
    }

    /// `view` with a URL at the place of each of its output files (computed
    /// now: URLs are never stored).
    async fn linked(&self, view: JobView) -> JobView {
        view.linked(self.config.files.as_ref()).await
    }

    /// Charges the started hours of network volumes not charged yet (of
    /// `volume` alone when given), as of `now_ms`; returns the hours charged.
    pub async fn accrue_storage(&self, now_ms: i64, volume: Option<&str>) -> Result<u64, JobError> {
        let _turn = self.writer.turn().await;
        Ok(gantry_billing::storage::accrue(&self.db, &self.config.storage_prices, now_ms, volume).await?)
    }

    /// Waits until the job is final or `timeout` passes, then returns its view.
    /// Woken at once by a scheduler in this process; otherwise polls the
    /// database with backoff (25 ms doubling to 500 ms; every second for a job
    /// the fast lane gave to this process's scheduler). Right after a sync
    /// `submit` in this process, the first read is skipped (see `Hub::park`).
    pub async fn wait(&self, user: &str, model_id: &str, job_id: &str, timeout: Duration) -> Result<JobView, JobError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // A sync job submitted by this process already has its waiter, registered
        // before the row was written: no read is needed to know it is not final.
        let (mut waiter, mut known_pending, local) = match self.hub.waiters.take_parked(job_id, user, model_id) {
            Some((waiter, local)) => (waiter, true, local),
            // Register before reading, so a result settled in between is not missed.
            None => (self.hub.waiters.register(job_id), false, false),
        };
        // A job this process's scheduler runs is announced in-process; polling
        // is then only a safety net (were that scheduler to die).
        let mut poll = Duration::from_millis(if local { 1000 } else { 25 });
        loop {
            let now = tokio::time::Instant::now();
            if !known_pending || now >= deadline {
                let view = match self.get(user, model_id, job_id).await {
                    // The waiter was dropped without a result: the job was
                    // kept in memory by a scheduler that stopped (`Hub::lose`).
                    Err(JobError::NotFound) if !waiter.is_open() => return Err(JobError::Lost),
                    other => other?,
                };
                let now = tokio::time::Instant::now();
                if view.status.is_final() || now >= deadline {
                    return Ok(view);
                }
            }
            known_pending = false;
            let now = tokio::time::Instant::now();
            let nap = poll.min(deadline.saturating_duration_since(now));
            tokio::select! {
                notified = waiter.receiver(), if waiter.is_open() => match notified {
                    Some(Wake::Final(view)) => return Ok(self.linked(*view).await),
                    // Changed elsewhere: read it now, registered again first
                    // so that a result settled in between is not missed.
                    Some(Wake::Reread) => {
                        waiter = self.hub.waiters.register(job_id);
                        continue;
                    }
                    None => continue,
                },
                () = tokio::time::sleep(nap) => {}
            }
            poll = (poll * 2).min(Duration::from_millis(if local { 1000 } else { 500 }));
        }
    }

    /// Cancels a queued or running job (a running one is also stopped on its
    /// worker). A job that is already final is returned unchanged.
    pub async fn cancel(&self, user: &str, model_id: &str, job_id: &str) -> Result<JobView, JobError> {
        let now = now_ms();
        let row = self
            .writer
            .cancel(user, model_id, job_id, Retention::of(&self.config, now))
            .await?;
        match row {
            Some(row) => {
                let view = JobView::of(&row, now);
                self.hub.wakeups.cancel(job_id);
                if row.owner.is_some() {
                    // It was running, perhaps under another process's scheduler.
                    self.hub.signal(Signal::Cancelled(job_id.to_string()));
                }
                self.hub.finished(std::slice::from_ref(&view), |_| true);
                Ok(view)
            }
            None => self.get(user, model_id, job_id).await,
        }
    }

    /// Sends a `FAILED` or `TIMED_OUT` job back to the queue: same id, same
    /// input, a fresh TTL and a fresh budget of attempts.
    pub async fn retry(&self, user: &str, model_id: &str, job_id: &str) -> Result<JobView, JobError> {
        if self.config.require_credit {
            crate::credit::has_credit(&self.db, user).await?;
        }
        let now = now_ms();
        let attempts = i64::from(self.config.max_attempts);
        let row = self.writer.retry(user, model_id, job_id, now, attempts).await?;
        match row {
            Some(row) => {
                self.hub.queued(&row.model);
                Ok(JobView::of(&row, now))
            }
            None => {
                let view = self.get(user, model_id, job_id).await?;
                Err(JobError::NotRetryable(view.status))
            }
        }
    }

    /// The job's status and the stream chunks not returned before, in order;
    /// advances the read cursor past them.
    pub async fn read_stream(&self, user: &str, model_id: &str, job_id: &str) -> Result<StreamView, JobError> {
        loop {
            let now = now_ms();
            // Status first: if it is final, every chunk is already stored.
            let row = self.find(user, model_id, job_id, now).await?;
            let status = JobStatus::parse(&row.status).unwrap_or(JobStatus::Failed);
            let stored = chunk::Entity::find()
                .filter(chunk::Column::JobId.eq(job_id))
                .filter(chunk::Column::Seq.gte(row.chunks_read))
                .order_by_asc(chunk::Column::Seq)
                .all(&self.db)
                .await?;
            // Only the contiguous run after the cursor, so order is never broken.
            let mut chunks = Vec::with_capacity(stored.len());
            for (expected, piece) in (row.chunks_read..).zip(&stored) {
                if piece.seq != expected {
                    break;
                }
                chunks.push(serde_json::from_str(&piece.output).unwrap_or(Value::Null));
            }
            if chunks.is_empty() {
                let progress = self.progress_of(&row).await?;
                return Ok(StreamView {
                    status,
                    chunks,
                    progress,
                });
            }
            let cursor = row.chunks_read + chunks.len() as i64;
            let moved = self.writer.advance_cursor(job_id, row.chunks_read, cursor).await?;
            if moved {
                let progress = self.progress_of(&row).await?;
                return Ok(StreamView {
                    status,
                    chunks,
                    progress,
                });
            }
            // Another reader took these chunks first: read again after them.
        }
    }

    /// The job's view and its stored chunks from sequence number `from` on,
    /// in order and contiguous (a gap ends the list until it is filled).
    /// Unlike [`JobStore::read_stream`] this moves no shared cursor: each live
    /// reader keeps its own position (the SSE `Last-Event-ID`). The view is
    /// read first, so when it is final every chunk is in the list.
    pub async fn chunks_from(
        &self,
        user: &str,
        model_id: &str,
        job_id: &str,
        from: i64,
    ) -> Result<(JobView, Vec<(i64, Value)>), JobError> {
        let now = now_ms();
        let row = self.find(user, model_id, job_id, now).await?;
        // Linked like `get`: a final view's output files are URLs here too
        // (the SSE stream's last event), not the worker's placeholders.
        let mut view = self.linked(JobView::of(&row, now)).await;
        view.progress = self.progress_of(&row).await?;
        let stored = chunk::Entity::find()
            .filter(chunk::Column::JobId.eq(job_id))
            .filter(chunk::Column::Seq.gte(from))
            .order_by_asc(chunk::Column::Seq)
            .all(&self.db)
            .await?;
        let mut chunks = Vec::with_capacity(stored.len());
        for (expected, piece) in (from..).zip(stored) {
            if piece.seq != expected {
                break;
            }
            chunks.push((piece.seq, serde_json::from_str(&piece.output).unwrap_or(Value::Null)));
        }
        Ok((view, chunks))
    }

    /// Subscribes to `job_id`'s live output: chunks and progress as workers
    /// send them (in the process whose scheduler runs the job, or over Redis
    /// signals from it), and wake-ups when chunks are stored or the job may
    /// have ended. See `live.rs` for how a reader combines it with
    /// [`JobStore::chunks_from`].
    pub fn watch_stream(&self, job_id: &str) -> LiveStream {
        self.hub.live.watch(job_id)
    }

    /// Whether live output reaches this process's readers without reading
    /// the database: a scheduler runs here, or Redis signals are configured.
    pub fn live_delivery(&self) -> bool {
        self.hub.wakeups.has_scheduler() || self.hub.signals.get().is_some()
    }

    /// Cancels every queued job of `user` on `model_id`; returns how many.
    /// Running jobs are not touched.
    pub async fn purge_queue(&self, user: &str, model_id: &str) -> Result<u64, JobError> {
        Ok(self
            .writer
            .purge_queue(user, model_id, Retention::of(&self.config, now_ms()))
            .await?)
    }

    /// Counts of the jobs of `model_id` currently kept, over all users.
    /// `user`'s jobs of `model_id` by status: a caller sees its own jobs,
    /// never other users' (the worker counts are the model's, shared by all).
    pub async fn health(&self, user: &str, model_id: &str) -> Result<JobCounts, JobError> {
        let rows: Vec<(String, i64, i64)> = job::Entity::find()
            .select_only()
            .column(J::Status)
            .expr_as(Expr::cust("CAST(COUNT(*) AS BIGINT)"), "jobs")
            .expr_as(
                Expr::cust("CAST(SUM(CASE WHEN retries > 0 THEN 1 ELSE 0 END) AS BIGINT)"),
                "retried",
            )
            .filter(J::UserId.eq(user))
            .filter(J::Model.eq(model_id))
            .filter(J::ExpiresAtMs.gt(now_ms()))
            .group_by(J::Status)
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut counts = JobCounts::default();
        for (status, jobs, retried) in rows {
            let jobs = u64::try_from(jobs).unwrap_or(0);
            counts.retried += u64::try_from(retried).unwrap_or(0);
            match JobStatus::parse(&status) {
                Some(JobStatus::Completed) => counts.completed += jobs,
                Some(JobStatus::Failed | JobStatus::TimedOut) => counts.failed += jobs,
                Some(JobStatus::InProgress) => counts.in_progress += jobs,
                Some(JobStatus::InQueue) => counts.in_queue += jobs,
                Some(JobStatus::Cancelled) | None => {}
            }
        }
        counts.in_progress += self.hub.lane.unstored_count(user, model_id);
        Ok(counts)
    }

    /// `user`'s latest kept jobs, newest first (job ids grow with time), at
    /// most `limit`; only those queued or running with `active_only`.
    pub async fn recent(&self, user: &str, limit: u64, active_only: bool) -> Result<Vec<job::Model>, JobError> {
        let mut query = job::Entity::find().filter(J::UserId.eq(user));
        if active_only {
            query = query.filter(J::Status.is_in([JobStatus::InQueue.as_str(), JobStatus::InProgress.as_str()]));
        }
        Ok(query.order_by_desc(J::Id).limit(limit).all(&self.db).await?)
    }

    /// The stored row of one of `user`'s jobs (its input, times and cost);
    /// `None` for another user's job, or one not written (yet, or any more).
    pub async fn row(&self, user: &str, job_id: &str) -> Result<Option<job::Model>, JobError> {
        Ok(job::Entity::find_by_id(job_id.to_owned())
            .filter(J::UserId.eq(user))
            .one(&self.db)
            .await?)
    }

    /// An input may name a file another job made by its URL (the models read
    /// it from the store, not over HTTP): only a file of `user`'s own jobs,
    /// whose URL has not expired. Every string of the input that is one of
    /// the platform's file URLs is checked, each refusal named by its field;
    /// other URLs are the model's to fetch.
    async fn own_files_are_the_callers(&self, user: &str, input: &Value) -> Result<(), JobError> {
        /// A step from the input down to a member: an array index or an object member.
        enum Step<'v> {
            Index(usize),
            Member(&'v str),
        }
        /// Where `steps` leads, as the error names it (`input.images[0]`).
        fn place(steps: &[Step<'_>]) -> String {
            let mut place = String::from("input");
            for step in steps {
                match step {
                    Step::Index(i) => place.push_str(&format!("[{i}]")),
                    Step::Member(name) => {
                        place.push('.');
                        place.push_str(name);
                    }
                }
            }
            place
        }
        /// Every string that is this platform's file URL, with its place (made
        /// only for those: most inputs hold none).
        fn urls<'v>(
            files: &gantry_files::Files,
            value: &'v Value,
            steps: &mut Vec<Step<'v>>,
            found: &mut Vec<(String, Result<String, gantry_files::Denied>)>,
        ) {
            match value {
                Value::String(text) => {
                    if let Some(key) = files.own_key_of(text) {
                        found.push((place(steps), key));
                    }
                }
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        steps.push(Step::Index(i));
                        urls(files, item, steps, found);
                        steps.pop();
                    }
                }
                Value::Object(members) => {
                    for (name, member) in members {
                        steps.push(Step::Member(name));
                        urls(files, member, steps, found);
                        steps.pop();
                    }
                }
                _ => {}
            }
        }
        let Some(files) = self.config.files.as_ref() else {
            return Ok(());
        };
        let mut found = Vec::new();
        urls(files, input, &mut Vec::new(), &mut found);
        let mut errors = Vec::new();
        for (path, key) in found {
            match key {
                Err(denied) => errors.push(format!("{path}: this platform's file URL cannot be used: {denied}")),
                Ok(key) => {
                    let stored = crate::entity::file::Entity::find_by_id(key).one(&self.db).await?;
                    if stored.is_none_or(|file| file.user_id != user) {
                        errors.push(format!(
                            "{path}: the file is not one of your jobs' files, or its lifetime has ended"
                        ));
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(JobError::InvalidInput(errors))
        }
    }

    /// Reads by primary key only and applies the rest of the visibility rule here (`callers_job` in
    /// `transition/guarded.rs`):
    /// given the caller's other columns too, PostgreSQL without fresh statistics
    /// may pick the `(user_id, model, status)` index and walk all of the user's jobs.
    async fn find(&self, user: &str, model_id: &str, job_id: &str, now: i64) -> Result<job::Model, JobError> {
        job::Entity::find_by_id(job_id)
            .one(&self.db)
            .await?
            .filter(|row| row.user_id == user && row.model == model_id && row.expires_at_ms > now)
            .ok_or(JobError::NotFound)
    }
}

/// What a scheduler shares with the job store of its process, part by part
/// (decision 0031 in docs/decisions/crate-structure.md): the scheduler holds these, not the store's hub.
#[derive(Clone)]
pub struct SchedulerParts {
    /// The executor of job transitions this process's writers share.
    pub writer: JobWriter,
    /// Submits written already claimed for this process's scheduler, and
    /// the `runsync` jobs it runs unwritten.
    pub lane: Arc<FastLane>,
    /// What this process's scheduler is woken for.
    pub wakeups: Arc<Wakeups>,
    /// Live output of the jobs this process's stream readers follow.
    pub live: Arc<LiveJobs>,
    /// Where finished, lost and live jobs are announced.
    pub outcomes: Outcomes,
}

/// The rules that span the store's parts, as a scheduler uses them: a final
/// result ends the live feed, wakes the waiters and is signalled to other
/// processes; a job lost with its scheduler drops its waiters; a chunk
/// reaches live readers here and elsewhere.
#[derive(Clone)]
pub struct Outcomes {
    hub: Arc<Hub>,
    /// Where the holds of jobs admitted unwritten are reserved.
    writer: JobWriter,
}

impl Outcomes {
    /// Sends a signal to the other processes, if Redis is configured.
    pub fn signal(&self, signal: Signal) {
        self.hub.signal(signal);
    }

    /// Unstored jobs that will never be written: their waiters are dropped
    /// and their credit holds released.
    pub fn lose(&self, job_ids: &[String]) {
        self.hub.lose(job_ids, &self.writer);
    }

    /// Every unstored job is lost (its scheduler died).
    pub fn lose_all(&self) {
        self.hub.lose_all(&self.writer);
    }

    /// Hands final views to whoever waits on them in this process, and
    /// signals to other processes those for which `announce` holds and
    /// that nobody here waited for.
    pub fn finished(&self, views: &[JobView], announce: impl Fn(usize) -> bool) {
        self.hub.finished(views, announce);
    }

    /// What to call with each worker event as it arrives, to feed live
    /// readers before the event is stored. It holds the store weakly: the
    /// dispatcher that keeps it does not keep the store alive.
    pub fn live_observer(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let hub = Arc::downgrade(&self.hub);
        move |event: &Event| {
            if let Some(hub) = hub.upgrade() {
                hub.live_event(event);
            }
        }
    }
}

/// What a store and the schedulers of its process share: named parts, each
/// in its own module, and the few rules that span several of them. Private
/// to this crate: a scheduler gets [`SchedulerParts`].
#[derive(Default)]
pub(crate) struct Hub {
    /// The `wait`s of this process, woken with final results.
    pub waiters: Arc<Waiters>,
    /// What this process's scheduler is woken for.
    pub wakeups: Arc<Wakeups>,
    /// Submits written already claimed for this process's scheduler, and
    /// the `runsync` jobs it runs unwritten.
    pub lane: Arc<FastLane>,
    /// Wake-ups to and from other processes over Redis, when configured.
    signals: OnceLock<Signals>,
    /// Live output of the jobs this process's stream readers follow.
    pub live: Arc<LiveJobs>,
    /// Told of the jobs another process queued (its `Queued` signals), by
    /// model, beside this process's scheduler: the serverless fleet's leader
    /// starts workers for them at once.
    queued_elsewhere: OnceLock<QueuedHook>,
}

/// See [`Hub::queued_elsewhere`].
type QueuedHook = Box<dyn Fn(&str) + Send + Sync>;

impl Hub {
    /// Sends a signal to the other processes, if Redis is configured.
    pub fn signal(&self, signal: Signal) {
        if let Some(signals) = self.signals.get() {
            signals.send(signal);
        }
    }

    /// A job of `model` was queued: tell this process's scheduler and the others'.
    pub fn queued(&self, model: &str) {
        self.wakeups.queued(model);
        self.signal(Signal::Queued(model.to_string()));
    }

    /// Unstored jobs that will never be written (their scheduler stopped, or
    /// could not write them): their waiters are dropped, which `wait` reports
    /// as `JobError::Lost`. Their credit holds, if `writer` reserved any,
    /// are released first: an admission after a waiter hears of the loss
    /// finds them gone.
    pub fn lose(&self, job_ids: &[String], writer: &JobWriter) {
        let lost: Vec<String> = self.lane.forget(job_ids).into_iter().cloned().collect();
        if !lost.is_empty() {
            writer.unreserve(&lost);
            self.waiters.abandon(lost.iter());
        }
    }

    /// Every unstored job is lost (its scheduler died).
    pub fn lose_all(&self, writer: &JobWriter) {
        let ids = self.lane.unstored_ids();
        self.lose(&ids, writer);
    }

    /// Gives a job to the lane's scheduler and wakes it; false (and the job
    /// dropped) if the lane closed.
    fn hand_over(&self, row: job::Model, stored: bool) -> bool {
        let handed = self.lane.hand_over(row, stored);
        if handed {
            self.wakeups.notify.notify_one();
        }
        handed
    }

    /// Hands final views to whoever waits on them in this process. A view
    /// for which `announce` holds and that nobody here waited for is
    /// signalled to the other processes (a `runsync` caller may wait there).
    pub fn finished(&self, views: &[JobView], announce: impl Fn(usize) -> bool) {
        self.live.ended(views.iter().map(|view| view.id.as_str()));
        let signals = self.signals.get();
        for i in self.waiters.finish(views, signals.is_some()) {
            if let Some(signals) = signals
                && announce(i)
            {
                signals.send(Signal::Final(views[i].id.clone()));
            }
        }
    }

    /// A worker's chunk or progress message, as it arrives (before it is
    /// stored): to this process's readers, and to other processes' over Redis.
    pub fn live_event(&self, event: &Event) {
        let signals = self.signals.get();
        match event {
            Event::Chunk {
                job_id, seq, output, ..
            } => {
                let seq = i64::try_from(*seq).unwrap_or(i64::MAX);
                self.live.chunk(job_id, seq, Some(output));
                if let Some(signals) = signals {
                    signals.send(Signal::chunk(job_id, seq, output));
                }
            }
            Event::Progress { job_id, message, .. } => {
                self.live.progress(job_id, message);
                if let Some(signals) = signals {
                    signals.send(Signal::Progress(job_id.clone(), message.to_string()));
                }
            }
            _ => {}
        }
    }

    /// Starts the Redis signals (see `signals.rs`); an error if already started.
    fn start_signals(self: &Arc<Self>, url: &str, channel: &str) -> Result<(), String> {
        let hub: std::sync::Weak<Hub> = Arc::downgrade(self);
        let listener: std::sync::Weak<dyn Listener> = hub;
        let signals = Signals::start(url, channel, listener)?;
        self.signals
            .set(signals)
            .map_err(|_| "job signals are already connected".to_string())
    }
}

impl Listener for Hub {
    /// Acts on a signal from another process.
    fn apply(&self, signal: Signal) {
        match signal {
            Signal::Queued(model) => {
                self.wakeups.queued(&model);
                if let Some(hook) = self.queued_elsewhere.get() {
                    hook(&model);
                }
            }
            Signal::Final(job_id) => {
                self.live.ended(std::iter::once(job_id.as_str()));
                self.waiters.reread(Some(&job_id));
            }
            Signal::Chunk { job_id, seq, output } => {
                // Unreadable content counts as not carried: read from the database.
                let output = output.and_then(|text| serde_json::from_str::<Value>(&text).ok());
                self.live.chunk(&job_id, seq, output.as_ref());
            }
            Signal::Progress(job_id, message) => {
                if let Ok(message) = serde_json::from_str::<Value>(&message) {
                    self.live.progress(&job_id, &message);
                }
            }
            Signal::Cancelled(job_id) => self.wakeups.recheck(job_id),
            Signal::Resync => self.resync(),
        }
    }

    /// Signals may have been missed: every waiter reads its row once now, and
    /// this process's scheduler claims as its sweep would.
    fn resync(&self) {
        self.waiters.reread(None);
        self.live.ended_all();
        self.wakeups.refill_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str) -> job::Model {
        job::sample(&new_job_id(now_ms()), model)
    }

    fn free(model: &str, slots: u64) -> impl Iterator<Item = (String, u64)> {
        std::iter::once((model.to_string(), slots))
    }

    #[tokio::test]
    async fn an_sqlite_database_without_a_file_is_refused() {
        let db = sea_orm::Database::connect("sqlite::memory:")
            .await
            .expect("in-memory SQLite");
        let error = JobStore::new(db, SchedulerConfig::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("needs an SQLite database file"), "{error}");
    }

    #[tokio::test]
    async fn a_waiter_dropped_before_its_wake_unregisters_itself() {
        let hub = Arc::new(Hub::default());
        let dropped = hub.waiters.register("job-1");
        let kept = hub.waiters.register("job-1");
        drop(dropped);
        assert_eq!(
            hub.waiters.lock().get("job-1").map(Vec::len),
            Some(1),
            "only the dropped one leaves"
        );
        drop(kept);
        assert!(hub.waiters.lock().is_empty(), "the last one takes the entry with it");
    }

    #[tokio::test]
    async fn signals_from_elsewhere_wake_waiters_to_read_and_only_a_scheduler_collects_work() {
        let hub = Arc::new(Hub::default());
        let mut first = hub.waiters.register("job-1");
        let mut second = hub.waiters.register("job-1");
        let mut other = hub.waiters.register("job-2");
        hub.apply(Signal::Final("job-1".into()));
        for waiter in [&mut first, &mut second] {
            assert!(
                matches!(waiter.receiver().await, Some(Wake::Reread)),
                "told to read the row"
            );
        }
        assert!(hub.waiters.lock().get("job-1").is_none(), "woken waiters are gone");
        assert!(hub.waiters.lock().contains_key("job-2"), "another job's waiter stays");

        // Without a scheduler on this hub, nothing would ever take these.
        hub.apply(Signal::Queued("m".into()));
        hub.apply(Signal::Cancelled("job-3".into()));
        hub.wakeups.cancel("job-4");
        hub.apply(Signal::Resync);
        assert!(
            matches!(other.receiver().await, Some(Wake::Reread)),
            "a resync wakes every waiter"
        );
        let pending = hub.wakeups.take();
        assert!(pending.models.is_empty() && pending.cancels.is_empty() && pending.rechecks.is_empty());
        assert!(!pending.refill_all);

        let attached = crate::wakeups::Attached::new(&hub.wakeups);
        hub.apply(Signal::Queued("m".into()));
        hub.apply(Signal::Cancelled("job-3".into()));
        hub.wakeups.cancel("job-4");
        hub.apply(Signal::Resync);
        let pending = hub.wakeups.take();
        assert_eq!(pending.models, std::collections::HashSet::from(["m".to_string()]));
        assert_eq!(pending.rechecks, std::collections::HashSet::from(["job-3".to_string()]));
        assert_eq!(pending.cancels, vec!["job-4".to_string()]);
        assert!(pending.refill_all);

        // The scheduler is gone, however it ended: collecting stops again.
        drop(attached);
        hub.apply(Signal::Queued("m".into()));
        hub.wakeups.cancel("job-5");
        let pending = hub.wakeups.take();
        assert!(pending.models.is_empty() && pending.cancels.is_empty());
    }

    #[test]
    fn the_lane_never_hands_out_more_credits_than_free_slots() {
        let hub = Hub::default();
        assert!(hub.lane.take_credit("m").is_none(), "no lane, no credit");
        assert!(hub.lane.open("a", 500));
        assert!(!hub.lane.open("b", 500), "one lane per process");
        assert!(
            hub.lane.take_credit("m").is_none(),
            "no credits until the scheduler sets them"
        );

        hub.lane.set_credits("a", free("m", 2));
        let credit = hub.lane.take_credit("m").unwrap();
        assert_eq!((credit.instance.as_str(), credit.lease_ms), ("a", 500));
        assert!(hub.lane.take_credit("m").is_some());
        assert!(hub.lane.take_credit("m").is_none(), "two slots, two credits");
        assert!(hub.lane.take_credit("other").is_none());
        // The scheduler's claims leave the slots of taken credits alone.
        assert_eq!(
            (hub.lane.lane_taken("a", "m"), hub.lane.lane_taken("a", "other")),
            (2, 0)
        );
        assert_eq!(hub.lane.lane_taken("b", "m"), 0, "only the lane's own scheduler");

        // Still two free slots (nothing placed yet), but both are spoken for.
        hub.lane.set_credits("a", free("m", 2));
        assert!(hub.lane.take_credit("m").is_none());
        // One insert failed and gave its credit back; one row was handed over.
        hub.lane.return_credit("m");
        assert!(hub.hand_over(row("m"), true));
        assert!(hub.lane.adopt("b").is_empty(), "only the lane's scheduler adopts");
        assert_eq!(hub.lane.adopt("a").len(), 1);
        assert_eq!(hub.lane.lane_taken("a", "m"), 0, "returned and adopted");
        hub.lane.set_credits("a", free("m", 1));
        assert!(hub.lane.take_credit("m").is_some());
        assert!(hub.lane.take_credit("m").is_none());

        // Another instance cannot set credits, nor close the lane.
        hub.lane.set_credits("b", free("m", 5));
        assert!(hub.lane.take_credit("m").is_none());
        assert!(hub.hand_over(row("m"), true));
        assert!(hub.lane.close("b").is_none());
        assert_eq!(
            hub.lane.close("a").map(|rows| rows.len()),
            Some(1),
            "unadopted rows are returned"
        );
        assert!(hub.lane.take_credit("m").is_none(), "closed");
        assert!(!hub.hand_over(row("m"), false), "closed");
        assert!(hub.lane.open("b", 500));
    }
}
