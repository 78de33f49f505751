//! Publishing jobs that ended: metrics, in-process waiters, other processes
//! and webhooks (`gantry-webhooks`' outbox). It also counts the jobs this
//! instance finished, for the refresh of PostgreSQL's statistics of `jobs`.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr};

use gantry_jobs::JobView;
use gantry_jobs::entity::job;
use gantry_jobs::now_ms;
use gantry_webhooks as webhooks;

use super::Context;

/// The most finished jobs between two `ANALYZE jobs` (PostgreSQL).
const ANALYZE_AFTER_MAX: u64 = 1_000_000;
/// Jobs finished before the first `ANALYZE`; see [`Statistics`].
const ANALYZE_AFTER_FIRST: u64 = 1_000;

/// What becomes of jobs that ended. It owns the webhook outbox and the count
/// of finished jobs ([`Statistics`]). Settlement, the sweep and the claim
/// duty call [`Publish::publish`] with the jobs they ended; the sweep has it
/// take over webhook deliveries and refresh the statistics.
pub(super) struct Publish {
    webhooks: webhooks::Deliveries,
    /// When PostgreSQL's statistics of `jobs` are refreshed.
    statistics: Statistics,
}

impl Publish {
    pub(super) fn new(webhooks: webhooks::Deliveries) -> Self {
        Self {
            webhooks,
            statistics: Statistics::new(),
        }
    }

    /// Wakes in-process waiters and sends webhooks for jobs that just ended.
    /// `announce` says which of them other processes are told about (when
    /// Redis signals are configured): those a caller or reader may follow
    /// there. The rare bulk endings (timeouts, orphans) announce all.
    pub(super) fn publish(&mut self, ctx: &Context, finals: &[job::Model], announce: impl Fn(&job::Model) -> bool) {
        self.statistics.finished(finals.len());
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
        ctx.parts.outcomes.finished(&views, |i| announce(&finals[i]));
        for (row, view) in finals.iter().zip(views) {
            if let Some(url) = row.webhook.clone() {
                self.webhooks.send(url, row.user_id.clone(), view, row.completed_at_ms);
            }
        }
    }

    /// Takes over the webhook deliveries due (see `Deliveries::take_over`).
    pub(super) async fn take_over(&mut self, now: i64) -> Result<(), DbErr> {
        self.webhooks.take_over(now).await
    }

    /// Refreshes PostgreSQL's statistics of `jobs` if enough jobs finished
    /// (see [`Statistics::refresh_if_grown`]).
    pub(super) async fn refresh_statistics(&mut self, db: &DatabaseConnection) {
        self.statistics.refresh_if_grown(db).await;
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
