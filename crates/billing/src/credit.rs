//! Credit: each user's balance in micro-USD, and the entries that change it.
//!
//! A balance (`credit_accounts`) is kept equal to the user's credit entries
//! (`credit_entries`: top-ups) minus their charges (`ledger_entries`): a
//! top-up writes its entry and raises the balance in one transaction, and
//! [`record_charges`](crate::record_charges) lowers it by exactly the charges
//! it wrote, in the caller's transaction (the job's completion).

use rand::RngExt;
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, TransactionTrait};

use crate::MICROS;

pub mod account {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "credit_accounts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: String,
        pub balance_micro_usd: i64,
        pub updated_at_ms: i64,
        /// What the user's queued and running jobs may still cost (the sum
        /// of their holds), kept by triggers on `jobs` (migration
        /// `m20261130_000022_credit_holds`).
        pub held_micro_usd: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod entry {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "credit_entries")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub amount_micro_usd: i64,
        pub reason: String,
        pub created_at: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// Parses a USD amount written as a decimal (`10`, `0.25`, `12.345678`):
/// exact, at most 6 decimals (micro-dollars), greater than zero.
pub fn parse_usd(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (whole, fraction) = text.split_once('.').unwrap_or((text, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) {
        return Err(format!("{text:?} is not an amount in USD (for example 10 or 0.25)"));
    }
    if fraction.len() > 6 {
        return Err(format!(
            "{text:?} has more than 6 decimals (the smallest amount is 0.000001 USD)"
        ));
    }
    let whole: i64 = whole.parse().map_err(|_| format!("{text:?} is too large"))?;
    let fraction: i64 = format!("{fraction:0<6}").parse().unwrap_or(0);
    let amount = whole
        .checked_mul(MICROS)
        .and_then(|w| w.checked_add(fraction))
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if amount == 0 {
        return Err("the amount must be greater than zero".into());
    }
    Ok(amount)
}

/// Micro-USD as an exact decimal string with 6 decimals (`"-0.000120"`).
pub fn usd_string(micro_usd: i64) -> String {
    let sign = if micro_usd < 0 { "-" } else { "" };
    let abs = micro_usd.unsigned_abs();
    let micros = MICROS.unsigned_abs();
    format!("{sign}{}.{:06}", abs / micros, abs % micros)
}

/// Adds `amount_micro_usd` to the user's balance with a credit entry, in one
/// transaction; returns the new balance.
pub async fn add_credit(
    db: &sea_orm::DatabaseConnection,
    user_id: &str,
    amount_micro_usd: i64,
    reason: &str,
    now_ms: i64,
) -> Result<i64, DbErr> {
    let txn = db.begin().await?;
    let id = format!("cr_{:016x}{:016x}", now_ms, rand::rng().random::<u64>());
    let mut insert = Query::insert();
    insert
        .into_table(entry::Entity)
        .columns([
            entry::Column::Id,
            entry::Column::UserId,
            entry::Column::AmountMicroUsd,
            entry::Column::Reason,
            entry::Column::CreatedAt,
        ])
        .values_panic([
            id.into(),
            user_id.into(),
            amount_micro_usd.into(),
            reason.into(),
            now_ms.into(),
        ]);
    txn.execute(&insert).await?;
    adjust(&txn, &[(user_id.to_owned(), amount_micro_usd)], now_ms).await?;
    let balance = balance(&txn, user_id).await?;
    txn.commit().await?;
    Ok(balance)
}

/// The user's balance in micro-USD (0 without any entry).
pub async fn balance<C: ConnectionTrait>(db: &C, user_id: &str) -> Result<i64, DbErr> {
    Ok(account::Entity::find_by_id(user_id.to_owned())
        .one(db)
        .await?
        .map_or(0, |a| a.balance_micro_usd))
}

/// Adds each `(user, delta)` to its balance, creating accounts as needed
/// (a user charged without credit enforcement goes below zero), in one
/// statement.
pub async fn adjust<C: ConnectionTrait>(db: &C, deltas: &[(String, i64)], now_ms: i64) -> Result<(), DbErr> {
    if deltas.is_empty() {
        return Ok(());
    }
    // In user order: a transaction that changes several accounts locks them
    // in one order, as every other does (no two wait for each other).
    let mut sorted: Vec<&(String, i64)> = deltas.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut upsert = Query::insert();
    upsert.into_table(account::Entity).columns([
        account::Column::UserId,
        account::Column::BalanceMicroUsd,
        account::Column::UpdatedAtMs,
    ]);
    for (user, delta) in sorted {
        upsert
            .values([user.as_str().into(), (*delta).into(), now_ms.into()])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    upsert.on_conflict(
        OnConflict::column(account::Column::UserId)
            .value(
                account::Column::BalanceMicroUsd,
                Expr::cust("credit_accounts.balance_micro_usd + excluded.balance_micro_usd"),
            )
            .value(account::Column::UpdatedAtMs, Expr::cust("excluded.updated_at_ms"))
            .to_owned(),
    );
    db.execute(&upsert).await?;
    Ok(())
}

/// The statement [`adjust`] runs for one user, for writers outside sea-orm
/// (the SQLite engine): `?1` user, `?2` delta, `?3` now.
pub const ADJUST_ONE_SQL: &str = "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms) \
     VALUES (?1, ?2, ?3) ON CONFLICT (user_id) DO UPDATE SET \
     balance_micro_usd = credit_accounts.balance_micro_usd + excluded.balance_micro_usd, \
     updated_at_ms = excluded.updated_at_ms";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(parse_usd("10"), Ok(10_000_000));
        assert_eq!(parse_usd("0.25"), Ok(250_000));
        assert_eq!(parse_usd("12.345678"), Ok(12_345_678));
        assert_eq!(parse_usd(" 0.000001 "), Ok(1));
        for bad in [
            "",
            "-1",
            "1.2345678",
            "abc",
            "1.",
            ".5",
            "0",
            "0.000000",
            "1e3",
            "99999999999999999999",
        ] {
            assert!(parse_usd(bad).is_err(), "{bad}");
        }
        assert_eq!(usd_string(12_345_678), "12.345678");
        assert_eq!(usd_string(-120), "-0.000120");
        assert_eq!(usd_string(0), "0.000000");
    }
}
