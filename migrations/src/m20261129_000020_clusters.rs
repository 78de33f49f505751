use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Clusters: N pods of one GPU shape started together on a private network
/// of their own. A member is an ordinary pod whose configuration names its
/// cluster and rank; this table holds the cluster itself.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "CREATE TABLE clusters (
                id TEXT NOT NULL PRIMARY KEY,
                user_id TEXT NOT NULL,
                name TEXT NOT NULL,
                kind TEXT NOT NULL,
                gpu_type_id TEXT NOT NULL,
                gpu_count_per_pod INTEGER NOT NULL,
                pod_count INTEGER NOT NULL,
                template_id TEXT,
                created_at_ms BIGINT NOT NULL,
                deleted_at_ms BIGINT,
                network_removed BOOLEAN NOT NULL DEFAULT FALSE
            )",
            "CREATE INDEX clusters_by_user ON clusters (user_id, created_at_ms)",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE clusters")
            .await?;
        Ok(())
    }
}
