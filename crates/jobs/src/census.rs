//! Reads of the platform's state that are not about one job: the counts the
//! metrics endpoint exports, the worker presence that `/health` and the GPU
//! catalog show, the ledger's totals and the stored files. A service of its
//! own beside [`crate::JobStore`] (which submits, reads and changes jobs): it
//! only reads, from any process sharing the database.
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect};

use crate::config::SchedulerConfig;
use crate::db::now_ms;
use crate::entity::{file, job, presence};
use crate::types::JobError;

use job::Column as J;

/// The platform's census (see the [module](self)).
#[derive(Clone)]
pub struct Census {
    db: DatabaseConnection,
    /// Presence rows older than this no longer count (a crashed scheduler's).
    presence_window_ms: i64,
}

impl Census {
    /// Reads `db`; presence rows count for [`SchedulerConfig::presence_window_ms`].
    pub fn new(db: DatabaseConnection, config: &SchedulerConfig) -> Self {
        Self {
            db,
            presence_window_ms: config.presence_window_ms(),
        }
    }

    /// Kept jobs by model and status, with the oldest `queued_at_ms` of each
    /// group: (model, status, count, oldest queued). For the metrics endpoint.
    pub async fn kept_jobs(&self) -> Result<Vec<(String, String, i64, i64)>, JobError> {
        Ok(job::Entity::find()
            .select_only()
            .column(J::Model)
            .column(J::Status)
            .expr_as(Expr::cust("CAST(COUNT(*) AS BIGINT)"), "jobs")
            .expr_as(Expr::cust("CAST(MIN(queued_at_ms) AS BIGINT)"), "oldest")
            .filter(J::ExpiresAtMs.gt(now_ms()))
            .group_by(J::Model)
            .group_by(J::Status)
            .into_tuple()
            .all(&self.db)
            .await?)
    }

    /// Per model, the idle and running workers and the free slots the live
    /// schedulers last recorded (see [`Census::workers`]).
    pub async fn worker_census(&self) -> Result<Vec<(String, i64, i64)>, JobError> {
        use presence::Column as P;
        let since = now_ms().saturating_sub(self.presence_window_ms);
        Ok(presence::Entity::find()
            .select_only()
            .column(P::Model)
            .expr_as(Expr::cust("CAST(COALESCE(SUM(idle), 0) AS BIGINT)"), "idle")
            .expr_as(Expr::cust("CAST(COALESCE(SUM(running), 0) AS BIGINT)"), "running")
            .filter(P::UpdatedAtMs.gte(since))
            .group_by(P::Model)
            .into_tuple()
            .all(&self.db)
            .await?)
    }

    /// The micro-units produced and micro-USD charged per model and unit,
    /// from the ledger (exact, and the same from every process).
    pub async fn charged_totals(&self) -> Result<Vec<(String, String, i64, i64)>, JobError> {
        Ok(gantry_billing::totals(&self.db).await?)
    }

    /// Idle and running workers of `model_id`, over every live scheduler: the
    /// sums of the `worker_presence` rows the schedulers refreshed within
    /// [`SchedulerConfig::presence_window_ms`] (a crashed scheduler's rows stop
    /// counting then). For an API process without an in-process dispatcher.
    pub async fn workers(&self, model_id: &str) -> Result<(u64, u64), JobError> {
        use presence::Column as P;
        let since = now_ms().saturating_sub(self.presence_window_ms);
        let row: Option<(i64, i64)> = presence::Entity::find()
            .select_only()
            .expr_as(Expr::cust("CAST(COALESCE(SUM(idle), 0) AS BIGINT)"), "idle")
            .expr_as(Expr::cust("CAST(COALESCE(SUM(running), 0) AS BIGINT)"), "running")
            .filter(P::Model.eq(model_id))
            .filter(P::UpdatedAtMs.gte(since))
            .into_tuple()
            .one(&self.db)
            .await?;
        let (idle, running) = row.unwrap_or((0, 0));
        Ok((u64::try_from(idle).unwrap_or(0), u64::try_from(running).unwrap_or(0)))
    }

    /// Output files kept (rows of `files`) and their bytes.
    pub async fn stored_files(&self) -> Result<(i64, i64), JobError> {
        let row: Option<(i64, i64)> = file::Entity::find()
            .select_only()
            .expr_as(Expr::cust("CAST(COUNT(*) AS BIGINT)"), "files")
            .expr_as(Expr::cust("CAST(COALESCE(SUM(size), 0) AS BIGINT)"), "bytes")
            .into_tuple()
            .one(&self.db)
            .await?;
        Ok(row.unwrap_or((0, 0)))
    }

    /// The GPUs connected workers report, over every scheduler sharing the
    /// database: (GPU name, workers, largest memory in bytes); workers
    /// without a GPU under the name `""`.
    pub async fn worker_gpus(&self) -> Result<Vec<(String, u64, u64)>, JobError> {
        use crate::entity::worker_gpu::{Column as G, Entity};
        let since = now_ms().saturating_sub(self.presence_window_ms);
        let rows: Vec<(String, i64, i64)> = Entity::find()
            .select_only()
            .column(G::GpuName)
            .expr_as(Expr::cust("CAST(SUM(workers) AS BIGINT)"), "workers")
            .expr_as(Expr::cust("CAST(MAX(memory_bytes) AS BIGINT)"), "memory")
            .filter(G::UpdatedAtMs.gte(since))
            .group_by(G::GpuName)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, workers, memory)| {
                (
                    name,
                    u64::try_from(workers).unwrap_or(0),
                    u64::try_from(memory).unwrap_or(0),
                )
            })
            .collect())
    }

    /// The user's balance and what their jobs in flight may still cost
    /// (micro-USD).
    pub async fn credit(&self, user: &str) -> Result<(i64, i64), JobError> {
        Ok(crate::credit::standing(&self.db, user).await?)
    }
}
