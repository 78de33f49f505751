//! Network volume storage, charged by the hour.
//!
//! A volume costs its size × the monthly price of its tier per GB, prorated
//! over 730 hours a month, for every hour it exists in: an hour is charged as
//! soon as it has started (at creation for the first one), at the size the
//! volume has then, rounded half up to a whole micro-dollar. [`accrue`]
//! writes the hours not charged yet, one `storage_charges` row each (its id
//! names the volume and the hour, so several schedulers accruing at once
//! charge an hour once), and debits each owner's balance by what it wrote,
//! in one transaction. Deleting a volume first accrues it up to the hour in
//! progress, so no started hour goes unbilled.

use sea_orm::sea_query::{OnConflict, Query};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, TransactionTrait};
use serde::{Deserialize, Serialize};

use crate::credit;

pub const HOUR_MS: i64 = 3_600_000;
/// Hours in a billing month (365 × 24 / 12).
pub const HOURS_PER_MONTH: i64 = 730;

/// Monthly prices per GB in micro-USD, by tier (`[billing.storage]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoragePrices {
    /// `STANDARD` volumes: 0.07 USD per GB-month by default.
    pub standard_micro_usd_per_gb_month: i64,
    /// `HIGH_PERFORMANCE` volumes: 0.14 USD per GB-month by default.
    pub high_performance_micro_usd_per_gb_month: i64,
    /// A job's output files, kept until their URLs expire: 0.07 USD per
    /// GB-month by default (the `STANDARD` volume price). Charged with the
    /// job, for the whole time the files are kept ([`Self::kept_files`]).
    pub output_files_micro_usd_per_gb_month: i64,
    /// What a stopped pod keeps (its container disk and volume): 0.20 USD
    /// per GB-month by default, charged per second while it is stopped.
    pub stopped_pod_disk_micro_usd_per_gb_month: i64,
}

impl Default for StoragePrices {
    fn default() -> Self {
        Self {
            standard_micro_usd_per_gb_month: 70_000,
            high_performance_micro_usd_per_gb_month: 140_000,
            output_files_micro_usd_per_gb_month: 70_000,
            stopped_pod_disk_micro_usd_per_gb_month: 200_000,
        }
    }
}

impl StoragePrices {
    /// One hour of `size_gb` GB of `volume_type`, in micro-USD (half up).
    pub fn hourly(&self, volume_type: &str, size_gb: i64) -> i64 {
        let per_month = if volume_type == "HIGH_PERFORMANCE" {
            self.high_performance_micro_usd_per_gb_month
        } else {
            self.standard_micro_usd_per_gb_month
        };
        per_hour(size_gb, per_month)
    }

    /// An hour of a stopped pod's `size_gb` GB of disk, in micro-USD (half
    /// up; charged per second from this hourly price).
    pub fn stopped_pod_disk_hourly(&self, size_gb: i64) -> i64 {
        per_hour(size_gb, self.stopped_pod_disk_micro_usd_per_gb_month)
    }

    /// Keeping `bytes` of output files for `kept_ms`, in micro-USD: the
    /// prorated monthly price (GB = 10⁹ bytes, 730 hours a month), rounded
    /// half up to a whole micro-dollar. A job's files are stored at once and
    /// kept until their URLs expire, so the whole stay is charged with the
    /// job: at the default price 20 MiB for 7 days is 338 µUSD, a 100 KB
    /// image 2 µUSD, and a 10 KB one nothing.
    pub fn kept_files(&self, bytes: u64, kept_ms: i64) -> i64 {
        let numerator = i128::from(bytes)
            * i128::from(self.output_files_micro_usd_per_gb_month.max(0))
            * i128::from(kept_ms.max(0));
        half_up(
            numerator,
            1_000_000_000i128 * i128::from(HOURS_PER_MONTH) * i128::from(HOUR_MS),
        )
    }
}

/// An hour of `size_gb` GB at `per_month` micro-USD per GB-month, rounded
/// half up.
fn per_hour(size_gb: i64, per_month: i64) -> i64 {
    half_up(
        i128::from(size_gb.max(0)) * i128::from(per_month.max(0)),
        i128::from(HOURS_PER_MONTH),
    )
}

/// `numerator / denominator` (both positive) rounded half up, at most
/// `i64::MAX`.
fn half_up(numerator: i128, denominator: i128) -> i64 {
    i64::try_from((numerator * 2 + denominator) / (denominator * 2)).unwrap_or(i64::MAX)
}

/// The start of the hour `ms` falls in.
pub fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// Charges every started hour of every volume (or of `volume` alone) not
/// charged yet, up to the hour `now_ms` is in; returns the hours charged.
/// Runs as one transaction on `db`.
pub async fn accrue(
    db: &sea_orm::DatabaseConnection,
    prices: &StoragePrices,
    now_ms: i64,
    volume: Option<&str>,
) -> Result<u64, DbErr> {
    let txn = db.begin().await?;
    let backend = txn.get_database_backend();
    // A write first: on SQLite it takes the write lock before the reads
    // below, which would otherwise see a snapshot that a concurrent writer
    // makes stale by the time this transaction writes (SQLITE_BUSY_SNAPSHOT).
    txn.execute_unprepared("DELETE FROM storage_charges WHERE 1 = 0")
        .await?;
    let placeholder = if backend == DbBackend::Postgres { "$1" } else { "?" };
    // Each volume with the last hour charged (if any). `created_at` is Unix µs.
    let mut sql = String::from(
        "SELECT v.id, v.user_id, v.volume_type, v.size, v.created_at, \
         (SELECT MAX(s.hour_start_ms) FROM storage_charges s WHERE s.volume_id = v.id) \
         FROM network_volumes v",
    );
    let mut values: Vec<sea_orm::Value> = Vec::new();
    if let Some(id) = volume {
        sql.push_str(&format!(" WHERE v.id = {placeholder}"));
        values.push(id.into());
    }
    let rows = txn
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?;
    let now_hour = hour_of(now_ms);
    let mut charges: Vec<(String, String, String, String, i64, i64, i64)> = Vec::new();
    for row in rows {
        let id: String = row.try_get_by_index(0)?;
        let user: String = row.try_get_by_index(1)?;
        let volume_type: String = row.try_get_by_index(2)?;
        let size: i32 = row.try_get_by_index(3)?;
        let created_us: i64 = row.try_get_by_index(4)?;
        let last: Option<i64> = row.try_get_by_index(5)?;
        let first = match last {
            Some(last) => last + HOUR_MS,
            None => hour_of(created_us.div_euclid(1000)),
        };
        let amount = prices.hourly(&volume_type, i64::from(size));
        let mut hour = first;
        while hour <= now_hour {
            charges.push((
                format!("st_{id}_{hour}"),
                user.clone(),
                id.clone(),
                volume_type.clone(),
                i64::from(size),
                hour,
                amount,
            ));
            hour += HOUR_MS;
        }
    }
    let mut written = 0u64;
    for part in charges.chunks(500) {
        let mut insert = Query::insert();
        insert
            .into_table(sea_orm::sea_query::Alias::new("storage_charges"))
            .columns(
                [
                    "id",
                    "user_id",
                    "volume_id",
                    "volume_type",
                    "size_gb",
                    "hour_start_ms",
                    "amount_micro_usd",
                    "created_at",
                ]
                .map(sea_orm::sea_query::Alias::new),
            );
        for (id, user, volume, volume_type, size, hour, amount) in part {
            insert
                .values([
                    id.as_str().into(),
                    user.as_str().into(),
                    volume.as_str().into(),
                    volume_type.as_str().into(),
                    (*size).into(),
                    (*hour).into(),
                    (*amount).into(),
                    now_ms.into(),
                ])
                .map_err(|e| DbErr::Custom(e.to_string()))?;
        }
        insert.on_conflict(
            OnConflict::column(sea_orm::sea_query::Alias::new("id"))
                .do_nothing()
                .to_owned(),
        );
        insert.returning_col(sea_orm::sea_query::Alias::new("id"));
        let inserted = txn.query_all(&insert).await?;
        let mut debits: Vec<(String, i64)> = Vec::new();
        for row in &inserted {
            let id: String = row.try_get_by_index(0)?;
            if let Some((_, user, _, _, _, _, amount)) = part.iter().find(|c| c.0 == id) {
                match debits.iter_mut().find(|(u, _)| u == user) {
                    Some((_, total)) => *total -= amount,
                    None => debits.push((user.clone(), -amount)),
                }
            }
        }
        credit::adjust(&txn, &debits, now_ms).await?;
        written += inserted.len() as u64;
    }
    txn.commit().await?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hourly_prices_round_half_up() {
        let prices = StoragePrices::default();
        // 50 GB × 0.07 USD / 730 h = 4794.52… µUSD.
        assert_eq!(prices.hourly("STANDARD", 50), 4795);
        // 10 GB × 0.14 USD / 730 h = 1917.80… µUSD.
        assert_eq!(prices.hourly("HIGH_PERFORMANCE", 10), 1918);
        assert_eq!(prices.hourly("STANDARD", 0), 0);
        // A stopped pod with 20 GB of disk and 30 GB of volume:
        // 50 GB × 0.20 USD / 730 h = 13698.63… µUSD.
        assert_eq!(prices.stopped_pod_disk_hourly(50), 13_699);
        assert_eq!(hour_of(7_199_999), 3_600_000);
        assert_eq!(hour_of(-1), -3_600_000);
    }

    #[test]
    fn kept_output_files_are_prorated_and_round_half_up() {
        let prices = StoragePrices::default();
        let week = 7 * 24 * HOUR_MS;
        // 20 MiB × 0.07 USD/GB-month × 168 h / 730 h = 337.85… µUSD.
        assert_eq!(prices.kept_files(20 << 20, week), 338);
        // 100 KB: 1.61… µUSD; 10 KB: 0.16… µUSD.
        assert_eq!(prices.kept_files(100_000, week), 2);
        assert_eq!(prices.kept_files(10_000, week), 0);
        // A GB for a whole month is the monthly price.
        assert_eq!(prices.kept_files(1_000_000_000, HOURS_PER_MONTH * HOUR_MS), 70_000);
        assert_eq!(prices.kept_files(0, week), 0);
        let free = StoragePrices {
            output_files_micro_usd_per_gb_month: 0,
            ..prices
        };
        assert_eq!(free.kept_files(20 << 20, week), 0);
    }
}
