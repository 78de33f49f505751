use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Webhook deliveries that outlive the process that finished the job.
///
/// `jobs.webhook_due_ms` is set when a job with a webhook is submitted (or
/// retried) and cleared once its final view was delivered (or every attempt
/// failed). While set it is 0, or the time until which a scheduler holds the
/// delivery. The finishing process delivers at once; any scheduler's sweep
/// takes over a finished job whose delivery is still pending well after it
/// finished (its finisher crashed or stopped), so a delivery is sent at least
/// once. The partial index holds only the pending ones, by completion time.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE jobs ADD COLUMN webhook_due_ms BIGINT NULL")
            .await?;
        db.execute_unprepared(
            "CREATE INDEX IF NOT EXISTS idx_jobs_webhook_due ON jobs (completed_at_ms) \
             WHERE webhook_due_ms IS NOT NULL",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX IF EXISTS idx_jobs_webhook_due")
            .await?;
        db.execute_unprepared("ALTER TABLE jobs DROP COLUMN webhook_due_ms")
            .await?;
        Ok(())
    }
}
