use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum WorkerPresence {
    Table,
    SchedulerId,
    Model,
    Idle,
    Running,
    UpdatedAtMs,
}

/// Worker counts per scheduler instance and model, published by each
/// scheduler on its sweeps so API processes without a dispatcher can report
/// them. Times are Unix milliseconds.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(WorkerPresence::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(WorkerPresence::SchedulerId).string().not_null())
                    .col(ColumnDef::new(WorkerPresence::Model).string().not_null())
                    .col(ColumnDef::new(WorkerPresence::Idle).integer().not_null())
                    .col(ColumnDef::new(WorkerPresence::Running).integer().not_null())
                    .col(ColumnDef::new(WorkerPresence::UpdatedAtMs).big_integer().not_null())
                    .primary_key(
                        Index::create()
                            .col(WorkerPresence::SchedulerId)
                            .col(WorkerPresence::Model),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(WorkerPresence::Table).if_exists().to_owned())
            .await
    }
}
