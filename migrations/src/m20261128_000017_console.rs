use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    PasswordHash,
    Role,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    LastUsedAt,
}

#[derive(DeriveIden)]
enum ConsoleSessions {
    Table,
    Id,
    UserId,
    CsrfToken,
    CreatedAt,
    ExpiresAt,
    EndedAt,
}

/// The web console: a user's password (argon2id, PHC string) and role, when
/// a key was last used, and the console's server-side sessions (the SHA-256
/// of the cookie's token is the id; the token itself is never stored).
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    .add_column(ColumnDef::new(Users::PasswordHash).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    .add_column(ColumnDef::new(Users::Role).string_len(16).not_null().default("user"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(ColumnDef::new(ApiKeys::LastUsedAt).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ConsoleSessions::Table)
                    .col(ColumnDef::new(ConsoleSessions::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(ConsoleSessions::UserId).string().not_null())
                    .col(ColumnDef::new(ConsoleSessions::CsrfToken).string().not_null())
                    .col(ColumnDef::new(ConsoleSessions::CreatedAt).big_integer().not_null())
                    .col(ColumnDef::new(ConsoleSessions::ExpiresAt).big_integer().not_null())
                    .col(ColumnDef::new(ConsoleSessions::EndedAt).big_integer().null())
                    .foreign_key(
                        ForeignKey::create()
                            .from(ConsoleSessions::Table, ConsoleSessions::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_console_sessions_user")
                    .table(ConsoleSessions::Table)
                    .col(ConsoleSessions::UserId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ConsoleSessions::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .drop_column(ApiKeys::LastUsedAt)
                    .to_owned(),
            )
            .await?;
        for column in [Users::Role, Users::PasswordHash] {
            manager
                .alter_table(Table::alter().table(Users::Table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
