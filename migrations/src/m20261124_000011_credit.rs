use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Credit.
///
/// `credit_entries`: every top-up (and every other change of a balance that
/// is not a job's charge, which stays in `ledger_entries`), in micro-USD.
/// `credit_accounts`: each user's balance, kept equal to their entries minus
/// their charges by the statements that write those (a charge debits it in
/// the completion's transaction). `jobs.hold_micro_usd`: what a queued or
/// running job may cost at most, counted against the balance when jobs are
/// admitted (last column, as the SQLite writer's column list expects); the
/// partial index finds a user's jobs in flight.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE TABLE credit_accounts (\
               user_id TEXT NOT NULL PRIMARY KEY, \
               balance_micro_usd BIGINT NOT NULL, \
               updated_at_ms BIGINT NOT NULL)",
        )
        .await?;
        db.execute_unprepared(
            "CREATE TABLE credit_entries (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               amount_micro_usd BIGINT NOT NULL, \
               reason TEXT NOT NULL, \
               created_at BIGINT NOT NULL)",
        )
        .await?;
        db.execute_unprepared("CREATE INDEX idx_credit_entries_user ON credit_entries (user_id, created_at)")
            .await?;
        db.execute_unprepared("ALTER TABLE jobs ADD COLUMN hold_micro_usd BIGINT NOT NULL DEFAULT 0")
            .await?;
        db.execute_unprepared(
            "CREATE INDEX idx_jobs_user_in_flight ON jobs (user_id) WHERE status IN ('IN_QUEUE', 'IN_PROGRESS')",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX idx_jobs_user_in_flight").await?;
        db.execute_unprepared("ALTER TABLE jobs DROP COLUMN hold_micro_usd")
            .await?;
        db.execute_unprepared("DROP TABLE credit_entries").await?;
        db.execute_unprepared("DROP TABLE credit_accounts").await?;
        Ok(())
    }
}
