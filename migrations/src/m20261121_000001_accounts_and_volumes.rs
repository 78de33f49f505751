use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Email,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Id,
    UserId,
    Name,
    Prefix,
    LastFour,
    KeyHash,
    Scopes,
    ExpiresAt,
    RevokedAt,
    CreatedAt,
}

#[derive(DeriveIden)]
enum NetworkVolumes {
    Table,
    Id,
    UserId,
    Name,
    Size,
    DataCenter,
    VolumeType,
    CreatedAt,
    UpdatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Users::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(Users::Email).string().not_null().unique_key())
                    .col(ColumnDef::new(Users::CreatedAt).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ApiKeys::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(ApiKeys::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(ApiKeys::UserId).string().not_null())
                    .col(ColumnDef::new(ApiKeys::Name).string().null())
                    .col(ColumnDef::new(ApiKeys::Prefix).string().not_null())
                    .col(ColumnDef::new(ApiKeys::LastFour).string().not_null())
                    .col(ColumnDef::new(ApiKeys::KeyHash).string().not_null().unique_key())
                    .col(ColumnDef::new(ApiKeys::Scopes).string().not_null())
                    .col(ColumnDef::new(ApiKeys::ExpiresAt).big_integer().null())
                    .col(ColumnDef::new(ApiKeys::RevokedAt).big_integer().null())
                    .col(ColumnDef::new(ApiKeys::CreatedAt).big_integer().not_null())
                    .foreign_key(
                        ForeignKey::create()
                            .from(ApiKeys::Table, ApiKeys::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_api_keys_user")
                    .table(ApiKeys::Table)
                    .col(ApiKeys::UserId)
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(NetworkVolumes::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(NetworkVolumes::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(NetworkVolumes::UserId).string().not_null())
                    .col(ColumnDef::new(NetworkVolumes::Name).string().not_null())
                    .col(ColumnDef::new(NetworkVolumes::Size).integer().not_null())
                    .col(ColumnDef::new(NetworkVolumes::DataCenter).string().not_null())
                    .col(ColumnDef::new(NetworkVolumes::VolumeType).string().not_null())
                    .col(ColumnDef::new(NetworkVolumes::CreatedAt).big_integer().not_null())
                    .col(ColumnDef::new(NetworkVolumes::UpdatedAt).big_integer().not_null())
                    .foreign_key(
                        ForeignKey::create()
                            .from(NetworkVolumes::Table, NetworkVolumes::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_network_volumes_user")
                    .table(NetworkVolumes::Table)
                    .col(NetworkVolumes::UserId)
                    .col(NetworkVolumes::CreatedAt)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            NetworkVolumes::Table.into_iden(),
            ApiKeys::Table.into_iden(),
            Users::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
