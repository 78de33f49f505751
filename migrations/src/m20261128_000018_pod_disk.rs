use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// A stopped pod's disk is charged: `pods.disk_hourly_micro_usd` (the price
/// of what a stopped pod keeps, its container disk and volume, set with its
/// configuration) and `pod_runs.kind` (`run`: the container ran; `disk`: it
/// was stopped and its disk kept). Existing rows are runs.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE pods ADD COLUMN disk_hourly_micro_usd BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE pod_runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE pod_runs DROP COLUMN kind",
            "ALTER TABLE pods DROP COLUMN disk_hourly_micro_usd",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}
