use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `job_progress`: the latest progress message of each running job's
/// attempt (a worker's `{"stage": …, "frames": n, "of": m}`), written by the
/// scheduler at most once per job per settlement batch and shown by the
/// status and stream routes while the job runs. Deleted with the job.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE job_progress (\
                   job_id TEXT NOT NULL PRIMARY KEY, \
                   attempt INTEGER NOT NULL, \
                   message TEXT NOT NULL, \
                   updated_at_ms BIGINT NOT NULL)",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE job_progress")
            .await?;
        Ok(())
    }
}
