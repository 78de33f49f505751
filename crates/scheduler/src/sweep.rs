//! The periodic sweep: renewing this instance's leases, rechecking jobs other processes
//! cancelled, timing out runs past their deadline, requeueing jobs whose scheduler died,
//! deleting expired jobs, and refreshing PostgreSQL's statistics as the table grows.

use std::collections::HashSet;

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter, QuerySelect,
};

use gantry_jobs::JobStatus;
use gantry_jobs::Retention;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::millis;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::is_final;

use job::Column as J;

use super::Core;

/// Expired jobs deleted per round, and rounds per sweep.
const EXPIRE_BATCH: u64 = 1000;
const EXPIRE_ROUNDS: usize = 10;
/// The most finished jobs between two `ANALYZE jobs` (PostgreSQL).
const ANALYZE_AFTER_MAX: u64 = 1_000_000;
/// Jobs finished before the first `ANALYZE`; see [`Statistics`].
const ANALYZE_AFTER_FIRST: u64 = 1_000;

impl Core {
    pub(super) async fn sweep(&mut self) -> Result<(), DbErr> {
        let result = self.sweep_rows().await;
        // Claim anything left queued (submitted elsewhere, or a lost wake-up),
        // even when a step above failed (a slow or lost connection): the
        // claim is the fallback that keeps a queued job from waiting for
        // a wake-up that may never come.
        let health = self.dispatcher.health();
        self.demand.all_with_free_slots(&health, false);
        result
    }

    /// The sweep's row work: leases, timeouts, orphans, expiry, worker
    /// rows, webhook deliveries and presence, in that order; the first
    /// failure stops it until the next sweep.
    pub(super) async fn sweep_rows(&mut self) -> Result<(), DbErr> {
        self.statistics.refresh_if_grown(&self.db).await;
        self.renew().await?;
        self.time_out().await?;
        self.requeue_orphans(false).await?;
        self.expire().await?;
        self.flush_workers().await?;
        self.webhooks.take_over(now_ms()).await?;
        let health = self.dispatcher.health();
        self.presence.publish(&health, &self.dispatcher).await
    }

    /// Renews this instance's lease on the jobs it runs, and learns which of
    /// them ended elsewhere (cancelled, timed out, expired, requeued): those
    /// are stopped on their workers.
    pub(super) async fn renew(&mut self) -> Result<(), DbErr> {
        if self.held.is_empty() {
            return Ok(());
        }
        // Unstored jobs have no row to renew (nor can anything end them elsewhere).
        let ids = self.held.stored_where(|_| true);
        self.recheck(ids).await
    }

    /// Renews the leases of these running jobs, and stops those whose rows
    /// are no longer this instance's running attempt (cancelled, timed out or
    /// requeued elsewhere). The sweep does it for every running job; a
    /// cancel signalled by another process does it for that job at once.
    pub(super) async fn recheck(&mut self, ids: Vec<String>) -> Result<(), DbErr> {
        let lease_until = now_ms().saturating_add(millis(self.store.config().lease));
        let alive: HashSet<(String, i32)> = self
            .parts
            .writer
            .renew(&ids, &self.instance, lease_until)
            .await?
            .into_iter()
            .collect();
        let gone: Vec<String> = ids
            .into_iter()
            .filter(|id| {
                self.held
                    .get(id)
                    .is_some_and(|r| r.is_stored() && !alive.contains(&(id.clone(), r.attempt)))
            })
            .collect();
        for job_id in gone {
            self.held.release(&job_id);
            self.dispatcher.cancel(&job_id, "job ended");
        }
        Ok(())
    }

    /// Ends every running job (of any scheduler) past its execution timeout.
    pub(super) async fn time_out(&mut self) -> Result<(), DbErr> {
        let now = now_ms();
        let rows = self
            .parts
            .writer
            .time_out(Retention::of(self.store.config(), now))
            .await?;
        // Every job of ours that is due has now ended: timed out by this
        // statement, or already finished elsewhere. Stop them all (but those
        // not written yet: they are written first, see `store_due`).
        let due = self.held.stored_where(|r| r.deadline_ms <= now);
        for job_id in due {
            self.held.release(&job_id);
            self.dispatcher.cancel(&job_id, "execution timeout");
        }
        self.publish(&rows, |_| true);
        Ok(())
    }

    /// Requeues running jobs whose scheduler's lease lapsed (it crashed or lost
    /// the database), or fails them once out of attempts; with `all`, every
    /// running job, leased or not (at the start of the database's sole owner).
    pub(super) async fn requeue_orphans(&mut self, all: bool) -> Result<(), DbErr> {
        let now = now_ms();
        let lapsed = if all { i64::MAX } else { now };
        let rows = self
            .parts
            .writer
            .requeue_orphans(Retention::of(self.store.config(), now), lapsed)
            .await?;
        if all && !rows.is_empty() {
            tracing::info!(jobs = rows.len(), "requeued the jobs a previous process left running");
        }
        let mut requeued = HashSet::new();
        for row in &rows {
            if self.held.release(&row.id).is_some() {
                self.dispatcher.cancel(&row.id, "lease lapsed");
            }
            self.demand.queued(row.model.clone());
            if row.status == JobStatus::InQueue.as_str() && requeued.insert(row.model.as_str()) {
                self.parts.outcomes.signal(Signal::Queued(row.model.clone()));
            }
        }
        let finals: Vec<job::Model> = rows.into_iter().filter(is_final).collect();
        self.publish(&finals, |_| true);
        Ok(())
    }

    /// Deletes jobs past their TTL (queued or running) or their result
    /// retention (finished), with their chunks.
    pub(super) async fn expire(&mut self) -> Result<(), DbErr> {
        // A few rounds per sweep, so a backlog shrinks at high throughput.
        for _ in 0..EXPIRE_ROUNDS {
            if self.expire_some().await? < EXPIRE_BATCH {
                break;
            }
        }
        Ok(())
    }

    /// Deletes up to `EXPIRE_BATCH` expired jobs; returns how many were found.
    pub(super) async fn expire_some(&mut self) -> Result<u64, DbErr> {
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
        // A job retried since it was listed is kept (the writer's guard).
        for job_id in self.parts.writer.expire(&doomed, now).await? {
            if self.held.release(&job_id).is_some() {
                self.dispatcher.cancel(&job_id, "ttl expired");
            }
        }
        Ok(found)
    }
}

/// PostgreSQL: refreshes the planner's statistics of `jobs` after this
/// instance has finished 1 000 jobs, then 2 000 more, 4 000… (up to every
/// million). A connection keeps the generic plan it makes of a statement
/// after five runs until the table's statistics change; made while `jobs`
/// was nearly empty (a new database; autovacuum analyzes only about once a
/// minute), the settlement's plan scanned the table for every job and took
/// seconds once it held tens of thousands of rows. `ANALYZE` samples a
/// bounded number of rows and makes connections plan again.
pub(super) struct Statistics {
    /// Jobs finished since the last refresh.
    finished: u64,
    /// How many call for the next.
    after: u64,
}

impl Statistics {
    pub(super) fn new() -> Self {
        Self {
            finished: 0,
            after: ANALYZE_AFTER_FIRST,
        }
    }

    /// Counts jobs this instance finished.
    pub(super) fn finished(&mut self, jobs: usize) {
        self.finished = self.finished.saturating_add(jobs as u64);
    }

    /// Runs `ANALYZE jobs` once enough jobs finished (PostgreSQL only).
    pub(super) async fn refresh_if_grown(&mut self, db: &DatabaseConnection) {
        if self.finished < self.after || db.get_database_backend() != DbBackend::Postgres {
            return;
        }
        match db.execute_unprepared("ANALYZE jobs").await {
            Ok(_) => {
                self.finished = 0;
                self.after = (self.after * 2).min(ANALYZE_AFTER_MAX);
            }
            Err(error) => tracing::warn!(%error, "could not analyze the jobs table"),
        }
    }
}
