use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `jobs.trace_context`: the W3C `traceparent` of the span that submitted
/// the job (NULL when traces are not exported), so the scheduler's and the
/// worker's spans of the job join the submitter's trace. The column is last,
/// after `webhook_due_ms`, as the SQLite writer's column list expects.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE jobs ADD COLUMN trace_context TEXT NULL")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE jobs DROP COLUMN trace_context")
            .await?;
        Ok(())
    }
}
