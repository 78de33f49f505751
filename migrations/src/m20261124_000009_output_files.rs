use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Output files of jobs.
///
/// `jobs.files`: the stored files of a completed job's result (a JSON array
/// of `{pointer, key, media_type, size, created_ms}`), written with the
/// completion, so a read of the job puts a fresh URL at each pointer without
/// another query. The column is last, after `trace_context`, as the SQLite
/// writer's column list expects.
///
/// `files`: one row per stored object that a committed result references,
/// inserted in the transaction of the completion and kept after the job's row
/// is purged, until the file's lifetime ends: the sweeper deletes the object,
/// then the row. An object without a row (a result that never committed) is
/// an orphan, deleted after a grace period.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE jobs ADD COLUMN files TEXT NULL")
            .await?;
        db.execute_unprepared(
            "CREATE TABLE files (\
               key TEXT NOT NULL PRIMARY KEY, \
               job_id TEXT NOT NULL, \
               user_id TEXT NOT NULL, \
               media_type TEXT NOT NULL, \
               size BIGINT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               expires_at_ms BIGINT NOT NULL)",
        )
        .await?;
        db.execute_unprepared("CREATE INDEX idx_files_expires ON files (expires_at_ms)")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP TABLE files").await?;
        db.execute_unprepared("ALTER TABLE jobs DROP COLUMN files").await?;
        Ok(())
    }
}
