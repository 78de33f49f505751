use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `storage_charges`: what network volumes cost, one row per volume per
/// started hour (`id` = `st_<volume>_<hour start ms>`, so an hour is charged
/// once whoever accrues it), with the tier and size it was charged at. Each
/// row's amount is debited from its owner's balance in the transaction that
/// writes it; the rows outlive their volume, for billing history.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE TABLE storage_charges (\
               id TEXT NOT NULL PRIMARY KEY, \
               user_id TEXT NOT NULL, \
               volume_id TEXT NOT NULL, \
               volume_type TEXT NOT NULL, \
               size_gb INTEGER NOT NULL, \
               hour_start_ms BIGINT NOT NULL, \
               amount_micro_usd BIGINT NOT NULL, \
               created_at BIGINT NOT NULL)",
        )
        .await?;
        db.execute_unprepared("CREATE INDEX idx_storage_charges_user ON storage_charges (user_id, hour_start_ms)")
            .await?;
        db.execute_unprepared("CREATE INDEX idx_storage_charges_volume ON storage_charges (volume_id, hour_start_ms)")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP TABLE storage_charges")
            .await?;
        Ok(())
    }
}
