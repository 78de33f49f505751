use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "ledger_entries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub user_id: String,
    /// One entry per job: `id` is derived from it (`crate::entry_id`).
    pub job_id: String,
    pub model: String,
    pub unit: String,
    pub quantity_micros: i64,
    pub amount_micro_usd: i64,
    /// Unix milliseconds.
    pub created_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
