//! Billing: usage to cost, and the ledger.
//!
//! Money is exact: amounts are integer micro-dollars (`i64`, 1 USD =
//! 1 000 000), quantities are integer millionths of a unit (as workers report
//! them), and prices are integer micro-dollars per integer number of units
//! ([`Price`]). The only float is [`usd`], for rendering.
//!
//! A charge is a row of `ledger_entries` whose id is derived from the job id
//! ([`entry_id`]), so charging a job twice is impossible (the primary key).
//! [`record_charges`] takes any connection, so the scheduler writes the
//! charge in the same transaction as the job's completion.
pub mod credit;
mod entity;
pub mod history;
pub mod storage;

use gantry_catalog::{ModelSpec, Price};
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use serde::Serialize;

use entity::{Column, Entity};

/// Micro-units in one whole unit (of money or of usage).
pub const MICROS: i64 = 1_000_000;

/// Why a usage has no cost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    #[error("usage reported in {got:?}, but model {model:?} bills in {expected:?}")]
    UnitMismatch {
        model: String,
        expected: String,
        got: String,
    },
    #[error("usage quantity must not be negative (got {0} micro-units)")]
    NegativeQuantity(i64),
    #[error("cost does not fit in 64 bits")]
    Overflow,
}

/// The cost in micro-USD of `quantity_micros` millionths of `unit` on `model`.
///
/// Exactly `quantity_micros × price.micro_usd / (price.per × 10⁶)`, rounded
/// half up to a whole micro-dollar (0.5 µUSD and above round up, below round
/// down). Computed in 128 bits, so only a result beyond `i64::MAX` overflows.
pub fn cost(quantity_micros: i64, unit: &str, model: &ModelSpec) -> Result<i64, CostError> {
    if unit != model.unit {
        return Err(CostError::UnitMismatch {
            model: model.id.clone(),
            expected: model.unit.clone(),
            got: unit.to_string(),
        });
    }
    if quantity_micros < 0 {
        return Err(CostError::NegativeQuantity(quantity_micros));
    }
    price_of(quantity_micros, model.price)
}

fn price_of(quantity_micros: i64, price: Price) -> Result<i64, CostError> {
    let numerator = i128::from(quantity_micros) * i128::from(price.micro_usd());
    // `per` ≥ 1, so the denominator is a positive even number.
    let denominator = i128::from(price.per()) * i128::from(MICROS);
    let rounded = (numerator + denominator / 2) / denominator;
    i64::try_from(rounded).map_err(|_| CostError::Overflow)
}

/// Micro-USD as a USD float, for display only (e.g. `output.cost`).
pub fn usd(micro_usd: i64) -> f64 {
    micro_usd as f64 / MICROS as f64
}

/// One job's charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub user_id: String,
    pub job_id: String,
    pub model: String,
    pub unit: String,
    pub quantity_micros: i64,
    pub amount_micro_usd: i64,
}

/// Writes `charges` at `at_ms` (Unix ms) in one statement; a job already
/// charged is skipped. Returns how many were written. Pass a transaction to
/// commit the charges together with whatever else it holds.
pub async fn record_charges<C: ConnectionTrait>(db: &C, charges: &[Charge], at_ms: i64) -> Result<u64, DbErr> {
    if charges.is_empty() {
        return Ok(0);
    }
    let mut insert = Query::insert();
    insert.into_table(Entity).columns([
        Column::Id,
        Column::UserId,
        Column::JobId,
        Column::Model,
        Column::Unit,
        Column::QuantityMicros,
        Column::AmountMicroUsd,
        Column::CreatedAt,
    ]);
    for charge in charges {
        insert
            .values([
                entry_id(&charge.job_id).into(),
                charge.user_id.clone().into(),
                charge.job_id.clone().into(),
                charge.model.clone().into(),
                charge.unit.clone().into(),
                charge.quantity_micros.into(),
                charge.amount_micro_usd.into(),
                at_ms.into(),
            ])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    insert.on_conflict(OnConflict::column(Column::Id).do_nothing().to_owned());
    // Only the charges written now lower balances: a job charged before is
    // neither charged nor debited again.
    insert.returning_col(Column::Id);
    let written = db.query_all(&insert).await?;
    let mut debits: Vec<(String, i64)> = Vec::new();
    for row in &written {
        let id: String = row.try_get_by_index(0)?;
        if let Some(charge) = charges.iter().find(|c| entry_id(&c.job_id) == id) {
            match debits.iter_mut().find(|(user, _)| *user == charge.user_id) {
                Some((_, total)) => *total -= charge.amount_micro_usd,
                None => debits.push((charge.user_id.clone(), -charge.amount_micro_usd)),
            }
        }
    }
    credit::adjust(db, &debits, at_ms).await?;
    Ok(written.len() as u64)
}

/// [`record_charges`] for one charge, for a writer outside sea-orm (the
/// SQLite writer thread, which must write the charge in its own
/// transaction): `?1` entry id ([`entry_id`]), `?2` user, `?3` job, `?4`
/// model, `?5` unit, `?6` quantity in micro-units, `?7` micro-USD, `?8` now.
/// When it writes a row (a job charged before writes none), the writer then
/// debits the owner with [`credit::ADJUST_ONE_SQL`] and `-amount`, exactly as
/// `record_charges` does: the ledger's statements all live in this crate.
pub const RECORD_ONE_SQL: &str = "INSERT INTO ledger_entries (id, user_id, job_id, model, unit, quantity_micros, \
     amount_micro_usd, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
     ON CONFLICT (id) DO NOTHING";

/// Totals of the whole ledger per model and unit: (model, unit, quantity in
/// micro-units, micro-USD). For the metrics endpoint.
pub async fn totals<C: ConnectionTrait>(db: &C) -> Result<Vec<(String, String, i64, i64)>, DbErr> {
    Entity::find()
        .select_only()
        .column(Column::Model)
        .column(Column::Unit)
        .expr_as(
            Expr::cust("CAST(COALESCE(SUM(quantity_micros), 0) AS BIGINT)"),
            "quantity",
        )
        .expr_as(
            Expr::cust("CAST(COALESCE(SUM(amount_micro_usd), 0) AS BIGINT)"),
            "amount",
        )
        .group_by(Column::Model)
        .group_by(Column::Unit)
        .into_tuple()
        .all(db)
        .await
}

/// A ledger entry, as the billing history shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    pub id: String,
    pub job_id: String,
    pub model: String,
    pub unit: String,
    pub quantity_micros: i64,
    pub amount_micro_usd: i64,
    /// Unix milliseconds.
    pub created_at: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// Read side of the ledger, scoped to one user.
#[derive(Clone)]
pub struct Ledger {
    db: DatabaseConnection,
}

impl Ledger {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// `user`'s charges with `from_ms ≤ created_at < to_ms`, oldest first.
    pub async fn charges(&self, user: &str, from_ms: i64, to_ms: i64) -> Result<Vec<LedgerEntry>, BillingError> {
        let rows = Entity::find()
            .filter(Column::UserId.eq(user))
            .filter(Column::CreatedAt.gte(from_ms))
            .filter(Column::CreatedAt.lt(to_ms))
            .order_by_asc(Column::CreatedAt)
            .order_by_asc(Column::JobId)
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| LedgerEntry {
                id: row.id,
                job_id: row.job_id,
                model: row.model,
                unit: row.unit,
                quantity_micros: row.quantity_micros,
                amount_micro_usd: row.amount_micro_usd,
                created_at: row.created_at,
            })
            .collect())
    }

    /// Sum in micro-USD of `user`'s charges with `from_ms ≤ created_at < to_ms`.
    pub async fn total(&self, user: &str, from_ms: i64, to_ms: i64) -> Result<i64, BillingError> {
        let total: Option<i64> = Entity::find()
            .select_only()
            .expr_as(
                Expr::cust("CAST(COALESCE(SUM(amount_micro_usd), 0) AS BIGINT)"),
                "total",
            )
            .filter(Column::UserId.eq(user))
            .filter(Column::CreatedAt.gte(from_ms))
            .filter(Column::CreatedAt.lt(to_ms))
            .into_tuple()
            .one(&self.db)
            .await?;
        Ok(total.unwrap_or(0))
    }
}

/// The id of the ledger entry that charges `job_id`: `le_` and the job id.
/// One id per job is what makes a second charge of a job impossible (the
/// primary key), and since job ids grow with time so do entry ids, which
/// keeps the ledger's inserts at the end of its b-tree.
pub fn entry_id(job_id: &str) -> String {
    format!("le_{job_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_catalog::{ModelCatalog, ModelKind};

    fn model(id: &str) -> ModelSpec {
        ModelCatalog::default().get(id).unwrap().clone()
    }

    #[test]
    fn prices_are_exact() {
        // 1 MP on flux-dev (0.02 USD/MP) and flux-schnell (0.0024 USD/MP).
        assert_eq!(cost(1_000_000, "megapixels", &model("flux-dev")), Ok(20_000));
        assert_eq!(cost(1_000_000, "megapixels", &model("flux-schnell")), Ok(2_400));
        // 1024×1024 = 1.048576 MP × 0.02 = 0.02097152 USD -> 20971.52 µUSD -> 20972.
        assert_eq!(cost(1_048_576, "megapixels", &model("flux-dev")), Ok(20_972));
        // 5 s of video = 0.50 USD; 1 s = 0.10 USD.
        assert_eq!(cost(5_000_000, "seconds", &model("wan-video")), Ok(500_000));
        assert_eq!(cost(1_000_000, "seconds", &model("wan-video")), Ok(100_000));
        // 1000 characters = 0.05 USD; 1 character = 50 µUSD.
        assert_eq!(cost(1_000_000_000, "characters", &model("kokoro-tts")), Ok(50_000));
        assert_eq!(cost(1_000_000, "characters", &model("kokoro-tts")), Ok(50));
        // 1M tokens = 10 USD; 1 token = 10 µUSD.
        assert_eq!(cost(1_000_000_000_000, "tokens", &model("qwen-text")), Ok(10_000_000));
        assert_eq!(cost(1_000_000, "tokens", &model("qwen-text")), Ok(10));
        // Echo: 0.00001 USD per request.
        assert_eq!(cost(1_000_000, "requests", &model("gantry-echo")), Ok(10));
        assert_eq!(cost(0, "requests", &model("gantry-echo")), Ok(0));
    }

    #[test]
    fn rounds_half_up() {
        let spec = ModelSpec::new("m", ModelKind::Text, "tokens", Price::new(1, 1).unwrap());
        // 1 µUSD per unit: 0.5 unit -> 0.5 µUSD -> 1; 0.499999 -> 0.
        assert_eq!(cost(500_000, "tokens", &spec), Ok(1));
        assert_eq!(cost(499_999, "tokens", &spec), Ok(0));
        assert_eq!(cost(1_500_000, "tokens", &spec), Ok(2));
        assert_eq!(cost(2_499_999, "tokens", &spec), Ok(2));
    }

    #[test]
    fn rejects_mismatch_negative_and_overflow() {
        let echo = model("gantry-echo");
        assert!(matches!(cost(1, "tokens", &echo), Err(CostError::UnitMismatch { .. })));
        assert_eq!(cost(-1, "requests", &echo), Err(CostError::NegativeQuantity(-1)));
        let dear = ModelSpec::new("m", ModelKind::Text, "tokens", Price::new(i64::MAX, 1).unwrap());
        assert_eq!(cost(i64::MAX, "tokens", &dear), Err(CostError::Overflow));
        assert_eq!(cost(1_000_000, "tokens", &dear), Ok(i64::MAX));
    }

    #[test]
    fn renders_usd() {
        assert_eq!(usd(10), 0.00001);
        assert_eq!(usd(20_972), 0.020972);
        assert_eq!(usd(10_000_000), 10.0);
    }

    /// A fresh, migrated in-memory database.
    async fn memory_db() -> sea_orm::DatabaseConnection {
        use gantry_migrations::MigratorTrait;
        let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
        gantry_migrations::Migrator::up(&db, None).await.unwrap();
        db
    }

    /// One echo request of user `u1` for job `job`, costing `amount` micro-USD.
    fn charge(job: &str, amount: i64) -> Charge {
        Charge {
            user_id: "u1".into(),
            job_id: job.into(),
            model: "gantry-echo".into(),
            unit: "requests".into(),
            quantity_micros: 1_000_000,
            amount_micro_usd: amount,
        }
    }

    #[tokio::test]
    async fn ledger_is_idempotent_per_job() {
        let db = memory_db().await;
        assert_eq!(
            record_charges(&db, &[charge("a", 10), charge("b", 15)], 100)
                .await
                .unwrap(),
            2
        );
        assert_eq!(record_charges(&db, &[charge("a", 10)], 200).await.unwrap(), 0);
        assert_eq!(
            record_charges(&db, &[charge("a", 99), charge("c", 5)], 300)
                .await
                .unwrap(),
            1
        );
        let ledger = Ledger::new(db);
        let all = ledger.charges("u1", 0, 1_000).await.unwrap();
        assert_eq!(
            all.iter()
                .map(|e| (e.job_id.as_str(), e.amount_micro_usd))
                .collect::<Vec<_>>(),
            [("a", 10), ("b", 15), ("c", 5)]
        );
        assert_eq!(ledger.total("u1", 0, 1_000).await.unwrap(), 30);
        assert_eq!(ledger.total("u1", 0, 300).await.unwrap(), 25);
        assert_eq!(ledger.total("u2", 0, 1_000).await.unwrap(), 0);
    }

    /// The one-charge statements of writers outside sea-orm leave the ledger
    /// and the balance exactly as `record_charges` does: one entry per job,
    /// one debit per entry.
    #[tokio::test]
    async fn the_one_charge_statements_agree_with_record_charges() {
        use sea_orm::{ConnectionTrait, DbBackend, Statement};
        let (by_function, by_statements) = (memory_db().await, memory_db().await);
        let charges = [("a", 10), ("a", 99), ("b", 15)];
        for (i, (job, amount)) in charges.into_iter().enumerate() {
            let now = 100 * (i as i64 + 1);
            record_charges(&by_function, &[charge(job, amount)], now).await.unwrap();
            let written = by_statements
                .execute_raw(Statement::from_sql_and_values(
                    DbBackend::Sqlite,
                    RECORD_ONE_SQL,
                    [
                        entry_id(job).into(),
                        "u1".into(),
                        job.into(),
                        "gantry-echo".into(),
                        "requests".into(),
                        1_000_000i64.into(),
                        amount.into(),
                        now.into(),
                    ],
                ))
                .await
                .unwrap()
                .rows_affected();
            if written == 1 {
                by_statements
                    .execute_raw(Statement::from_sql_and_values(
                        DbBackend::Sqlite,
                        credit::ADJUST_ONE_SQL,
                        ["u1".into(), (-amount).into(), now.into()],
                    ))
                    .await
                    .unwrap();
            }
        }
        let entries = |db| async move {
            Ledger::new(db)
                .charges("u1", 0, 1_000)
                .await
                .unwrap()
                .into_iter()
                .map(|e| (e.id, e.job_id, e.amount_micro_usd, e.created_at))
                .collect::<Vec<_>>()
        };
        let (balance_a, balance_b) = (
            credit::balance(&by_function, "u1").await.unwrap(),
            credit::balance(&by_statements, "u1").await.unwrap(),
        );
        let (a, b) = (entries(by_function).await, entries(by_statements).await);
        assert_eq!(a.len(), 2, "one entry per job: {a:?}");
        assert_eq!(a, b);
        assert_eq!((balance_a, balance_b), (-25, -25));
    }
}
