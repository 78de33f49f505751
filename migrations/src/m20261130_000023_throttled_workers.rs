use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// What the fleet's leader publishes of an endpoint's workers that wait
/// for GPUs, its *throttled* workers (docs/serverless.md, "Throttled
/// workers"):
/// - `endpoints.throttled`: how many it wants and cannot start on Docker
///   because the machine's GPUs are taken (or too few), at its last look;
/// - `endpoints.throttled_reason`: why (the GPU pool's words);
/// - `endpoint_workers.unschedulable`: why Kubernetes has no node for the
///   worker's Pod yet (the scheduler's message), while it has none.
///
/// Every process answers `/v2/serverless/{id}/workers` from them, the
/// leader or not.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE endpoints ADD COLUMN throttled INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE endpoints ADD COLUMN throttled_reason TEXT",
            "ALTER TABLE endpoint_workers ADD COLUMN unschedulable TEXT",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE endpoint_workers DROP COLUMN unschedulable")
            .await?;
        for column in ["throttled_reason", "throttled"] {
            db.execute_unprepared(&format!("ALTER TABLE endpoints DROP COLUMN {column}"))
                .await?;
        }
        Ok(())
    }
}
