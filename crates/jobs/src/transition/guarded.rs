//! The transitions outside a settlement: one guarded statement each, built
//! with sea-query, which writes the SQLite and the PostgreSQL form alike.
//! Each states its guard (the rows it may change) first; a row that no
//! longer matches it is left alone, so a stale or repeated transition
//! changes nothing. None of them touches a job kept only in memory: those
//! change by the settlement's in-memory forms (`plan.rs`).

use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, Condition, DbBackend, DbErr, EntityTrait, QueryFilter, TransactionTrait};

use super::JobWriter;
use super::plan::{queued_jobs, requeue_or_fail, running_jobs};
use crate::config::SchedulerConfig;
use crate::entity::{chunk, job, progress};
use crate::types::JobStatus;

use job::Column as J;

/// Most ids bound in one statement.
const ID_CHUNK: usize = 500;

/// When a job finishing now stops being kept: its `expires_at_ms`, by mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub now: i64,
    pub sync_until: i64,
    pub async_until: i64,
}

impl Retention {
    pub fn of(config: &SchedulerConfig, now: i64) -> Self {
        Retention {
            now,
            sync_until: now.saturating_add(config.retention_ms(true)),
            async_until: now.saturating_add(config.retention_ms(false)),
        }
    }

    /// `expires_at_ms` of the row the statement changes.
    pub(super) fn expr(&self) -> Expr {
        Expr::cust(format!(
            "CASE WHEN sync THEN {} ELSE {} END",
            self.sync_until, self.async_until
        ))
    }
}

/// `column + n`.
fn plus(column: job::Column, n: i64) -> Expr {
    Expr::col(column).add(n)
}

/// The one visibility rule: the caller's own job of this model, still within
/// its TTL or retention. Anything else reads as not found.
fn callers_job(user: &str, model_id: &str, job_id: &str, now: i64) -> Condition {
    Condition::all()
        .add(J::Id.eq(job_id))
        .add(J::UserId.eq(user))
        .add(J::Model.eq(model_id))
        .add(J::ExpiresAtMs.gt(now))
}

/// A running attempt of `owner` (a scheduler instance).
fn owned_running(owner: &str) -> Condition {
    Condition::all()
        .add(J::Owner.eq(owner))
        .add(J::Status.eq(JobStatus::InProgress.as_str()))
}

impl JobWriter {
    // ---- submitted by the API half ----

    /// CANCELLED. Guard: the caller's job, queued or running. Returns the
    /// changed row (none when the job was final already or is not theirs).
    pub async fn cancel(
        &self,
        user: &str,
        model_id: &str,
        job_id: &str,
        at: Retention,
    ) -> Result<Option<job::Model>, DbErr> {
        let _turn = self.turn().await;
        let rows = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::Cancelled.as_str()))
            .col_expr(J::CompletedAtMs, Expr::value(at.now))
            .col_expr(J::ExpiresAtMs, at.expr())
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
            .filter(callers_job(user, model_id, job_id, at.now))
            .filter(J::Status.is_in([JobStatus::InQueue.as_str(), JobStatus::InProgress.as_str()]))
            .exec_with_returning(&self.db)
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Back to IN_QUEUE with the same input, a fresh TTL from `now` and
    /// `attempts` more attempts; a new webhook delivery is due. Guard: the
    /// caller's job, FAILED or TIMED_OUT.
    pub async fn retry(
        &self,
        user: &str,
        model_id: &str,
        job_id: &str,
        now: i64,
        attempts: i64,
    ) -> Result<Option<job::Model>, DbErr> {
        let _turn = self.turn().await;
        let rows = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::InQueue.as_str()))
            .col_expr(J::Output, Expr::value(Option::<String>::None))
            .col_expr(J::Error, Expr::value(Option::<String>::None))
            .col_expr(J::WorkerTimings, Expr::value(Option::<String>::None))
            .col_expr(J::WorkerId, Expr::value(Option::<String>::None))
            .col_expr(J::Owner, Expr::value(Option::<String>::None))
            .col_expr(J::StartedAtMs, Expr::value(Option::<i64>::None))
            .col_expr(J::CompletedAtMs, Expr::value(Option::<i64>::None))
            .col_expr(J::QueuedAtMs, Expr::value(now))
            .col_expr(J::ExpiresAtMs, Expr::cust(format!("{now} + ttl_ms")))
            .col_expr(J::Retries, plus(J::Retries, 1))
            .col_expr(J::MaxAttempts, plus(J::Attempt, attempts))
            .col_expr(J::WebhookDueMs, crate::db::pending_if_any())
            .filter(callers_job(user, model_id, job_id, now))
            .filter(J::Status.is_in([JobStatus::Failed.as_str(), JobStatus::TimedOut.as_str()]))
            .exec_with_returning(&self.db)
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Moves the shared stream cursor from `from` to `to`. Guard: the cursor
    /// is still at `from` (another reader did not take these chunks first).
    pub async fn advance_cursor(&self, job_id: &str, from: i64, to: i64) -> Result<bool, DbErr> {
        let _turn = self.turn().await;
        let moved = job::Entity::update_many()
            .col_expr(J::ChunksRead, Expr::value(to))
            .filter(J::Id.eq(job_id))
            .filter(J::ChunksRead.eq(from))
            .exec(&self.db)
            .await?;
        Ok(moved.rows_affected == 1)
    }

    /// CANCELLED for every queued, unexpired job of `user` on `model_id`
    /// (running ones are not touched); returns how many.
    pub async fn purge_queue(&self, user: &str, model_id: &str, at: Retention) -> Result<u64, DbErr> {
        let _turn = self.turn().await;
        let result = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::Cancelled.as_str()))
            .col_expr(J::CompletedAtMs, Expr::value(at.now))
            .col_expr(J::ExpiresAtMs, at.expr())
            .filter(J::UserId.eq(user))
            .filter(J::Model.eq(model_id))
            .filter(queued_jobs())
            .filter(J::ExpiresAtMs.gt(at.now))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected)
    }

    // ---- submitted by the scheduler ----

    /// Renews the leases of these jobs to `lease_until`. Guard: running
    /// attempts of `owner`. Returns (id, attempt) of the rows renewed.
    pub async fn renew(&self, ids: &[String], owner: &str, lease_until: i64) -> Result<Vec<(String, i32)>, DbErr> {
        let mut alive = Vec::new();
        for part in ids.chunks(ID_CHUNK) {
            let _turn = self.turn().await;
            let rows = job::Entity::update_many()
                .col_expr(J::LeaseUntilMs, Expr::value(lease_until))
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(owned_running(owner))
                .exec_with_returning(&self.db)
                .await?;
            alive.extend(rows.into_iter().map(|row| (row.id, row.attempt)));
        }
        Ok(alive)
    }

    /// TIMED_OUT for every running job (of any scheduler) whose run deadline
    /// has passed. Guard: IN_PROGRESS, `run_deadline_ms <= now`.
    pub async fn time_out(&self, at: Retention) -> Result<Vec<job::Model>, DbErr> {
        let _turn = self.turn().await;
        let update = job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::TimedOut.as_str()))
            .col_expr(J::Error, Expr::value("execution timeout exceeded"))
            .col_expr(J::CompletedAtMs, Expr::value(at.now))
            .col_expr(J::ExpiresAtMs, at.expr())
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .filter(running_jobs())
            .filter(J::RunDeadlineMs.lte(at.now));
        if self.db.get_database_backend() != DbBackend::Postgres {
            return update.exec_with_returning(&self.db).await;
        }
        let txn = self.db.begin().await?;
        let owners = "status = 'IN_PROGRESS' AND run_deadline_ms <= $1";
        if crate::credit::lock_owners(&txn, owners, vec![at.now.into()], &[]).await? == 0 {
            return Ok(Vec::new());
        }
        let rows = update.exec_with_returning(&txn).await?;
        txn.commit().await?;
        Ok(rows)
    }

    /// Back to the queue while attempts remain, else FAILED ("scheduler
    /// lost"), for running jobs whose lease ended before `lapsed` (their
    /// scheduler crashed or lost the database; `i64::MAX`: every running
    /// job, as the database's sole owner does at its start). Guard:
    /// IN_PROGRESS, `lease_until_ms < lapsed`.
    pub async fn requeue_orphans(&self, at: Retention, lapsed: i64) -> Result<Vec<job::Model>, DbErr> {
        let _turn = self.turn().await;
        let update = requeue_or_fail("scheduler lost", at)
            .filter(running_jobs())
            .filter(J::LeaseUntilMs.lt(lapsed));
        if self.db.get_database_backend() != DbBackend::Postgres {
            return update.exec_with_returning(&self.db).await;
        }
        // Those out of attempts fail, which releases their holds: the
        // owners' accounts first, in order (see `credit::lock_owners`).
        let txn = self.db.begin().await?;
        let owners = "status = 'IN_PROGRESS' AND lease_until_ms < $1";
        if crate::credit::lock_owners(&txn, owners, vec![lapsed.into()], &[]).await? == 0 {
            return Ok(Vec::new());
        }
        let rows = update.exec_with_returning(&txn).await?;
        txn.commit().await?;
        Ok(rows)
    }

    /// Deletes these jobs with their chunks and progress, one transaction per
    /// part. Guard: `expires_at_ms <= now` (a job retried since it was
    /// listed stays, with its output). Returns the ids deleted.
    pub async fn expire(&self, ids: &[String], now: i64) -> Result<Vec<String>, DbErr> {
        let mut deleted = Vec::new();
        for part in ids.chunks(ID_CHUNK) {
            let _turn = self.turn().await;
            let txn = self.db.begin().await?;
            let gone: Vec<String> = job::Entity::delete_many()
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(J::ExpiresAtMs.lte(now))
                .exec_with_returning(&txn)
                .await?
                .into_iter()
                .map(|row| row.id)
                .collect();
            if !gone.is_empty() {
                chunk::Entity::delete_many()
                    .filter(chunk::Column::JobId.is_in(gone.iter().map(String::as_str)))
                    .exec(&txn)
                    .await?;
                progress::Entity::delete_many()
                    .filter(progress::Column::JobId.is_in(gone.iter().map(String::as_str)))
                    .exec(&txn)
                    .await?;
            }
            txn.commit().await?;
            deleted.extend(gone);
        }
        Ok(deleted)
    }

    /// Back to IN_QUEUE for just-claimed jobs no worker took: the attempt
    /// was never sent, so it is given back. Guard: running attempts of
    /// `owner`. In memory: `Plan::released(row, true)`.
    pub async fn put_back(&self, ids: &[String], owner: &str) -> Result<(), DbErr> {
        for part in ids.chunks(ID_CHUNK) {
            let _turn = self.turn().await;
            job::Entity::update_many()
                .col_expr(J::Status, Expr::value(JobStatus::InQueue.as_str()))
                .col_expr(J::Attempt, plus(J::Attempt, -1))
                .col_expr(J::Owner, Expr::value(Option::<String>::None))
                .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
                .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
                .col_expr(J::StartedAtMs, Expr::value(Option::<i64>::None))
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(owned_running(owner))
                .exec(&self.db)
                .await?;
        }
        Ok(())
    }

    /// Back to IN_QUEUE for every running job of `owner` (it is shutting
    /// down), with one more attempt allowed so that the interrupted one does
    /// not count. Guard: running attempts of `owner`. In memory:
    /// `Plan::released(row, false)`.
    pub async fn release(&self, owner: &str, now: i64) -> Result<(), DbErr> {
        let _turn = self.turn().await;
        job::Entity::update_many()
            .col_expr(J::Status, Expr::value(JobStatus::InQueue.as_str()))
            .col_expr(J::Owner, Expr::value(Option::<String>::None))
            .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
            .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
            .col_expr(J::WorkerId, Expr::value(Option::<String>::None))
            .col_expr(J::QueuedAtMs, Expr::value(now))
            .col_expr(J::MaxAttempts, plus(J::MaxAttempts, 1))
            .filter(owned_running(owner))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Records the worker running these jobs. Guard: running attempts of
    /// `owner`. In memory: `Plan::running`.
    pub async fn set_worker(&self, ids: &[String], owner: &str, worker_id: &str) -> Result<(), DbErr> {
        for part in ids.chunks(ID_CHUNK) {
            let _turn = self.turn().await;
            job::Entity::update_many()
                .col_expr(J::WorkerId, Expr::value(worker_id))
                .filter(J::Id.is_in(part.iter().map(String::as_str)))
                .filter(owned_running(owner))
                .exec(&self.db)
                .await?;
        }
        Ok(())
    }

    // ---- submitted by the webhook outbox ----

    /// Holds a pending delivery for its taker until `until`. Guard: the
    /// delivery is still due at `due` (no other sweep took it first).
    /// Returns whether this caller holds it.
    pub async fn hold_delivery(&self, job_id: &str, due: i64, until: i64) -> Result<bool, DbErr> {
        let _turn = self.turn().await;
        let result = job::Entity::update_many()
            .col_expr(J::WebhookDueMs, Expr::value(until))
            .filter(J::Id.eq(job_id))
            .filter(J::WebhookDueMs.eq(due))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected == 1)
    }

    /// Ends the job's delivery. Guard: the job still has the outcome that
    /// finished at `finished_at` (a retry since then has its own delivery).
    pub async fn delivered(&self, job_id: &str, finished_at: Option<i64>) -> Result<(), DbErr> {
        let _turn = self.turn().await;
        job::Entity::update_many()
            .col_expr(J::WebhookDueMs, Expr::value(Option::<i64>::None))
            .filter(J::Id.eq(job_id))
            .filter(J::CompletedAtMs.eq(finished_at))
            .exec(&self.db)
            .await?;
        Ok(())
    }
}
