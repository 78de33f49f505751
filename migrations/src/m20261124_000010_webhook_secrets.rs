use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `webhook_secrets`: each user's Standard Webhooks signing secret
/// (`whsec_…`), created on first use, shown and rotated by
/// `gantry users webhook-secret`.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE webhook_secrets (\
                   user_id TEXT NOT NULL PRIMARY KEY, \
                   secret TEXT NOT NULL, \
                   created_at_ms BIGINT NOT NULL)",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE webhook_secrets")
            .await?;
        Ok(())
    }
}
