use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Users' own containers: `templates`, `registries` (credentials sealed),
/// `endpoints` (serverless endpoints; a delete marks `deleted_at_ms` so the
/// reconciler can drain the workers), `endpoint_releases` (one row per
/// configuration version, with its diff) and `endpoint_workers` (each worker
/// container, and the seconds of it charged so far), and `leases` (which
/// process reconciles the containers).
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "CREATE TABLE templates (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               name TEXT NOT NULL, \
               public BOOLEAN NOT NULL, \
               serverless BOOLEAN NOT NULL, \
               body TEXT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               updated_at_ms BIGINT NOT NULL)",
            "CREATE INDEX templates_user ON templates (user_id, created_at_ms)",
            "CREATE INDEX templates_public ON templates (public, created_at_ms)",
            "CREATE TABLE registries (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               name TEXT NOT NULL, \
               credential TEXT NOT NULL, \
               created_at_ms BIGINT NOT NULL)",
            "CREATE INDEX registries_user ON registries (user_id, created_at_ms)",
            "CREATE TABLE endpoints (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               body TEXT NOT NULL, \
               template_id TEXT, \
               version INTEGER NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               updated_at_ms BIGINT NOT NULL, \
               deleted_at_ms BIGINT)",
            "CREATE INDEX endpoints_user ON endpoints (user_id, created_at_ms)",
            "CREATE INDEX endpoints_template ON endpoints (template_id)",
            "CREATE TABLE endpoint_releases (\
               endpoint_id TEXT NOT NULL, \
               version INTEGER NOT NULL, \
               diff TEXT NOT NULL, \
               created_by TEXT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               PRIMARY KEY (endpoint_id, version))",
            "CREATE TABLE endpoint_workers (\
               id TEXT NOT NULL PRIMARY KEY, \
               endpoint_id TEXT NOT NULL, \
               user_id TEXT NOT NULL, \
               version INTEGER NOT NULL, \
               image TEXT NOT NULL, \
               gpu_count INTEGER NOT NULL, \
               hourly_micro_usd BIGINT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               billed_until_ms BIGINT NOT NULL, \
               ended_at_ms BIGINT, \
               reason TEXT)",
            // Named leases between processes (the fleet's reconciler).
            "CREATE TABLE leases (\
               name TEXT NOT NULL PRIMARY KEY, \
               holder TEXT NOT NULL, \
               until_ms BIGINT NOT NULL)",
            "CREATE INDEX endpoint_workers_endpoint ON endpoint_workers (endpoint_id, ended_at_ms)",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in [
            "leases",
            "endpoint_workers",
            "endpoint_releases",
            "endpoints",
            "registries",
            "templates",
        ] {
            db.execute_unprepared(&format!("DROP TABLE {table}")).await?;
        }
        Ok(())
    }
}
