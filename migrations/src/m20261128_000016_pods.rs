use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Pods: `pods` (a user's long-running container: its configuration, the
/// state the user asked for and the one the engine reports, and the network
/// volume it mounts), `pod_runs` (each
/// stretch a pod's container ran, and the seconds of it charged so far),
/// `pod_events` (the system lines of a pod's log) and `ssh_keys` (an
/// account's public keys, put into pods started with SSH).
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "CREATE TABLE pods (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               name TEXT NOT NULL, \
               body TEXT NOT NULL, \
               desired TEXT NOT NULL, \
               status TEXT NOT NULL, \
               reason TEXT, \
               locked BOOLEAN NOT NULL, \
               volume_id TEXT, \
               version INTEGER NOT NULL, \
               restart_at_ms BIGINT NOT NULL, \
               hourly_micro_usd BIGINT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               updated_at_ms BIGINT NOT NULL, \
               started_at_ms BIGINT, \
               deleted_at_ms BIGINT)",
            "CREATE INDEX pods_user ON pods (user_id, created_at_ms)",
            "CREATE INDEX pods_open ON pods (deleted_at_ms, status)",
            "CREATE INDEX pods_volume ON pods (volume_id)",
            "CREATE TABLE pod_runs (\
               id TEXT NOT NULL PRIMARY KEY, \
               pod_id TEXT NOT NULL, \
               user_id TEXT NOT NULL, \
               gpu_count INTEGER NOT NULL, \
               hourly_micro_usd BIGINT NOT NULL, \
               created_at_ms BIGINT NOT NULL, \
               billed_until_ms BIGINT NOT NULL, \
               ended_at_ms BIGINT)",
            "CREATE INDEX pod_runs_pod ON pod_runs (pod_id, created_at_ms)",
            "CREATE INDEX pod_runs_open ON pod_runs (ended_at_ms)",
            "CREATE TABLE pod_events (\
               pod_id TEXT NOT NULL, \
               at_ms BIGINT NOT NULL, \
               seq BIGINT NOT NULL, \
               line TEXT NOT NULL, \
               PRIMARY KEY (pod_id, at_ms, seq))",
            "CREATE TABLE ssh_keys (\
               user_id TEXT NOT NULL PRIMARY KEY, \
               keys TEXT NOT NULL, \
               updated_at_ms BIGINT NOT NULL)",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in ["ssh_keys", "pod_events", "pod_runs", "pods"] {
            db.execute_unprepared(&format!("DROP TABLE {table}")).await?;
        }
        Ok(())
    }
}
