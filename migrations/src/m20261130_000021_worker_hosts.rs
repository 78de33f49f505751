use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// What the processes of one database share about each serverless worker, so
/// that the fleet's leader can judge workers whose calls reach another
/// process (docs/serverless.md, "With more than one scheduler"):
/// - `host`: the instance whose public listener the worker calls, where its
///   protocol session lives (set on its first call);
/// - `seen_at_ms`: that first call;
/// - `held_jobs` and `idle_since_ms`: what the host last published of its
///   load (jobs it holds; since when it has held none);
/// - `stop_request`: the leader's request to the host (`retire`: end it if
///   it holds nothing now; `drain`: no new jobs, end it once idle).
///
/// Each process's liveness is a row `host:<instance>` of `leases`. Existing
/// workers have no host: the next leader treats them as not yet seen.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE endpoint_workers ADD COLUMN host TEXT",
            "ALTER TABLE endpoint_workers ADD COLUMN seen_at_ms BIGINT",
            "ALTER TABLE endpoint_workers ADD COLUMN held_jobs INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE endpoint_workers ADD COLUMN idle_since_ms BIGINT",
            "ALTER TABLE endpoint_workers ADD COLUMN stop_request TEXT",
            // Each process's look for the requests to it, every tick.
            "CREATE INDEX endpoint_workers_open_by_host ON endpoint_workers (host) WHERE ended_at_ms IS NULL",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX endpoint_workers_open_by_host")
            .await?;
        for column in ["stop_request", "idle_since_ms", "held_jobs", "seen_at_ms", "host"] {
            db.execute_unprepared(&format!("ALTER TABLE endpoint_workers DROP COLUMN {column}"))
                .await?;
        }
        Ok(())
    }
}
