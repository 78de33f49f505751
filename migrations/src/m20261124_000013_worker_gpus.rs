use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `worker_gpus`: the GPUs that each scheduler's connected workers reported
/// in their hello (name, how many workers, the largest memory), published on
/// every sweep like `worker_presence`, so the GPU catalog's availability is
/// the same from any API process.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE worker_gpus (\
                   scheduler_id TEXT NOT NULL, \
                   gpu_name TEXT NOT NULL, \
                   workers INTEGER NOT NULL, \
                   memory_bytes BIGINT NOT NULL, \
                   updated_at_ms BIGINT NOT NULL, \
                   PRIMARY KEY (scheduler_id, gpu_name))",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE worker_gpus")
            .await?;
        Ok(())
    }
}
