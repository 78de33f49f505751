use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Fewer b-tree writes per job, second step (after migration 5).
///
/// * The claim index held every job kept, keyed on `status`, so each job
///   moved its entry at every change of status. Only queued jobs are ever
///   looked up through it (the claim and purge-queue), so it becomes
///   `idx_jobs_queued (model, low_priority, id) WHERE status = 'IN_QUEUE'`:
///   a job that a fast lane writes claimed, or inserts final, never enters
///   it. Queries that use it spell `status = 'IN_QUEUE'` literally.
/// * A ledger entry's id was random (`le_` and 20 random characters), so
///   each charge dirtied a random page of the id index, and a second unique
///   index on `job_id` enforced one charge per job. The id of a job's charge
///   is now derived from the job id (`le_<job id>`, see
///   `gantry_billing::entry_id`): the primary key alone enforces one charge
///   per job, ids grow with time like job ids, and the `job_id` index goes.
///   On SQLite the table is rebuilt `WITHOUT ROWID` (the key is the row's
///   place: one b-tree instead of three); existing entries get their new id.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// In one transaction on every backend: the ledger's rebuild is several
    /// statements that must all happen or none (sea-orm runs SQLite
    /// migrations outside a transaction by default, each statement on any
    /// pooled connection).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX IF EXISTS idx_jobs_claim").await?;
        db.execute_unprepared(
            "CREATE INDEX IF NOT EXISTS idx_jobs_queued ON jobs (model, low_priority, id) WHERE status = 'IN_QUEUE'",
        )
        .await?;
        match manager.get_database_backend() {
            DbBackend::Sqlite => rebuild_sqlite_ledger(db, Shape::KeyedByJob).await,
            _ => {
                db.execute_unprepared("ALTER TABLE ledger_entries DROP CONSTRAINT IF EXISTS ledger_entries_job_id_key")
                    .await?;
                db.execute_unprepared("UPDATE ledger_entries SET id = 'le_' || job_id WHERE id <> 'le_' || job_id")
                    .await?;
                Ok(())
            }
        }
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX IF EXISTS idx_jobs_queued").await?;
        db.execute_unprepared("CREATE INDEX IF NOT EXISTS idx_jobs_claim ON jobs (model, status, low_priority, id)")
            .await?;
        match manager.get_database_backend() {
            DbBackend::Sqlite => rebuild_sqlite_ledger(db, Shape::UniqueJobId).await,
            _ => {
                db.execute_unprepared(
                    "ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_job_id_key UNIQUE (job_id)",
                )
                .await?;
                Ok(())
            }
        }
    }
}

/// The two shapes of `ledger_entries` on SQLite.
enum Shape {
    /// Before this migration: a rowid table, `job_id` unique.
    UniqueJobId,
    /// After: keyed by `id` (derived from the job id), `WITHOUT ROWID`.
    KeyedByJob,
}

/// Recreates `ledger_entries` on SQLite in `shape` (SQLite cannot change a
/// table's key or drop an inline constraint in place), copying every entry.
/// Entries get their job-derived id on the way up and keep it on the way
/// down (unique either way).
async fn rebuild_sqlite_ledger(db: &SchemaManagerConnection<'_>, shape: Shape) -> Result<(), DbErr> {
    let (job_id, options, id_expr) = match shape {
        Shape::UniqueJobId => ("job_id text NOT NULL UNIQUE", "", "id"),
        Shape::KeyedByJob => ("job_id text NOT NULL", "WITHOUT ROWID", "'le_' || job_id"),
    };
    db.execute_unprepared(&format!(
        "CREATE TABLE ledger_entries_next (id text NOT NULL PRIMARY KEY, user_id text NOT NULL, {job_id}, model text NOT NULL, \
         unit text NOT NULL, quantity_micros bigint NOT NULL, amount_micro_usd bigint NOT NULL, \
         created_at bigint NOT NULL) {options}"
    ))
    .await?;
    db.execute_unprepared(&format!(
        "INSERT INTO ledger_entries_next (id, user_id, job_id, model, unit, quantity_micros, amount_micro_usd, \
         created_at) SELECT {id_expr}, user_id, job_id, model, unit, quantity_micros, amount_micro_usd, created_at \
         FROM ledger_entries"
    ))
    .await?;
    db.execute_unprepared("DROP TABLE ledger_entries").await?;
    db.execute_unprepared("ALTER TABLE ledger_entries_next RENAME TO ledger_entries")
        .await?;
    db.execute_unprepared("CREATE INDEX IF NOT EXISTS idx_ledger_user_time ON ledger_entries (user_id, created_at)")
        .await?;
    Ok(())
}
