use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Jobs {
    Table,
    Id,
    UserId,
    Model,
    Status,
    Input,
    Output,
    Error,
    Webhook,
    LowPriority,
    Sync,
    ExecutionTimeoutMs,
    TtlMs,
    Attempt,
    MaxAttempts,
    Retries,
    WorkerId,
    Owner,
    LeaseUntilMs,
    RunDeadlineMs,
    CreatedAtMs,
    QueuedAtMs,
    StartedAtMs,
    CompletedAtMs,
    ExpiresAtMs,
    CostMicroUsd,
    UsageUnit,
    UsageQuantityMicros,
    ChunksRead,
}

#[derive(DeriveIden, Clone, Copy)]
enum JobChunks {
    Table,
    JobId,
    Seq,
    Output,
}

#[derive(DeriveIden, Clone, Copy)]
enum LedgerEntries {
    Table,
    Id,
    UserId,
    JobId,
    Model,
    Unit,
    QuantityMicros,
    AmountMicroUsd,
    CreatedAt,
}

/// Jobs (the scheduler's queue and results), their stream chunks, and the
/// billing ledger. Times are Unix milliseconds.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Jobs::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Jobs::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(Jobs::UserId).string().not_null())
                    .col(ColumnDef::new(Jobs::Model).string().not_null())
                    .col(ColumnDef::new(Jobs::Status).string().not_null())
                    .col(ColumnDef::new(Jobs::Input).text().not_null())
                    .col(ColumnDef::new(Jobs::Output).text().null())
                    .col(ColumnDef::new(Jobs::Error).text().null())
                    .col(ColumnDef::new(Jobs::Webhook).text().null())
                    .col(ColumnDef::new(Jobs::LowPriority).boolean().not_null())
                    .col(ColumnDef::new(Jobs::Sync).boolean().not_null())
                    .col(ColumnDef::new(Jobs::ExecutionTimeoutMs).big_integer().not_null())
                    .col(ColumnDef::new(Jobs::TtlMs).big_integer().not_null())
                    .col(ColumnDef::new(Jobs::Attempt).integer().not_null())
                    .col(ColumnDef::new(Jobs::MaxAttempts).integer().not_null())
                    .col(ColumnDef::new(Jobs::Retries).integer().not_null())
                    .col(ColumnDef::new(Jobs::WorkerId).string().null())
                    .col(ColumnDef::new(Jobs::Owner).string().null())
                    .col(ColumnDef::new(Jobs::LeaseUntilMs).big_integer().null())
                    .col(ColumnDef::new(Jobs::RunDeadlineMs).big_integer().null())
                    .col(ColumnDef::new(Jobs::CreatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(Jobs::QueuedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(Jobs::StartedAtMs).big_integer().null())
                    .col(ColumnDef::new(Jobs::CompletedAtMs).big_integer().null())
                    .col(ColumnDef::new(Jobs::ExpiresAtMs).big_integer().not_null())
                    .col(ColumnDef::new(Jobs::CostMicroUsd).big_integer().null())
                    .col(ColumnDef::new(Jobs::UsageUnit).string().null())
                    .col(ColumnDef::new(Jobs::UsageQuantityMicros).big_integer().null())
                    .col(ColumnDef::new(Jobs::ChunksRead).big_integer().not_null().default(0))
                    .to_owned(),
            )
            .await?;
        // The claim: queued jobs of one model, normal priority first, oldest
        // first (ids are time-ordered). Also serves health counts per model.
        index(
            manager,
            "idx_jobs_claim",
            Jobs::Table,
            &[Jobs::Model, Jobs::Status, Jobs::LowPriority, Jobs::Id],
        )
        .await?;
        // Execution timeouts and expired scheduler leases (both scan IN_PROGRESS).
        index(
            manager,
            "idx_jobs_running",
            Jobs::Table,
            &[Jobs::Status, Jobs::RunDeadlineMs],
        )
        .await?;
        // TTL and result retention.
        index(manager, "idx_jobs_expires", Jobs::Table, &[Jobs::ExpiresAtMs]).await?;
        // A user's queue (purge).
        index(
            manager,
            "idx_jobs_user",
            Jobs::Table,
            &[Jobs::UserId, Jobs::Model, Jobs::Status],
        )
        .await?;

        manager
            .create_table(
                Table::create()
                    .table(JobChunks::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(JobChunks::JobId).string().not_null())
                    .col(ColumnDef::new(JobChunks::Seq).big_integer().not_null())
                    .col(ColumnDef::new(JobChunks::Output).text().not_null())
                    .primary_key(Index::create().col(JobChunks::JobId).col(JobChunks::Seq))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(LedgerEntries::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(LedgerEntries::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(LedgerEntries::UserId).string().not_null())
                    .col(ColumnDef::new(LedgerEntries::JobId).string().not_null().unique_key())
                    .col(ColumnDef::new(LedgerEntries::Model).string().not_null())
                    .col(ColumnDef::new(LedgerEntries::Unit).string().not_null())
                    .col(ColumnDef::new(LedgerEntries::QuantityMicros).big_integer().not_null())
                    .col(ColumnDef::new(LedgerEntries::AmountMicroUsd).big_integer().not_null())
                    .col(ColumnDef::new(LedgerEntries::CreatedAt).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        index(
            manager,
            "idx_ledger_user_time",
            LedgerEntries::Table,
            &[LedgerEntries::UserId, LedgerEntries::CreatedAt],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(LedgerEntries::Table).if_exists().to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(JobChunks::Table).if_exists().to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Jobs::Table).if_exists().to_owned())
            .await
    }
}

async fn index<T, C>(manager: &SchemaManager<'_>, name: &str, table: T, columns: &[C]) -> Result<(), DbErr>
where
    T: IntoIden + 'static,
    C: IntoIden + Copy + 'static,
{
    let mut index = Index::create();
    index.name(name).table(table).if_not_exists();
    for column in columns {
        index.col(*column);
    }
    manager.create_index(index.to_owned()).await
}
