use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `jobs.worker_timings`: what the worker reported with a completed attempt
/// (JSON: milliseconds in its queue, loading the model, running), shown in
/// the job's status as `workerTimings`. Existing rows have none.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE jobs ADD COLUMN worker_timings TEXT")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE jobs DROP COLUMN worker_timings")
            .await?;
        Ok(())
    }
}
