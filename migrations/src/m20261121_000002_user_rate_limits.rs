use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Users {
    Table,
    RateMinute,
    RateHour,
    RateDay,
    RateExempt,
}

/// Per-user rate limit overrides (NULL: the configured default) and exemption.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        for column in [Users::RateMinute, Users::RateHour, Users::RateDay] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Users::Table)
                        .add_column(ColumnDef::new(column).big_integer().null())
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    .add_column(ColumnDef::new(Users::RateExempt).boolean().not_null().default(false))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Users::RateExempt, Users::RateDay, Users::RateHour, Users::RateMinute] {
            manager
                .alter_table(Table::alter().table(Users::Table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
