//! Admitting jobs against their owner's credit.
//!
//! Every job carries a hold: the most it may cost (`jobs.hold_micro_usd`,
//! [`hold`]). With `SchedulerConfig::require_credit`, a job is admitted only
//! while its owner's balance minus the holds of their queued and running jobs
//! is above zero, and the check and the job's insert are one transaction
//! serialized per user (on SQLite the writer thread admits, one after
//! another inside its group commits; on PostgreSQL the transaction's first
//! statement writes the user's `credit_accounts` row, which locks it).
//!
//! The holds of a user's jobs in flight are summed in their account row
//! (`credit_accounts.held_micro_usd`) by triggers on `jobs`: every insert,
//! status change or delete that moves a job into or out of the queued and
//! running states changes the sum in the same transaction. So a job that
//! fails, is cancelled, times out or is lost with its process releases its
//! hold by reaching that state, whichever writer moved it, and an admission
//! reads one row however deep its caller's queue (it used to sum every job
//! in flight). The transitions' parity tests check the sum after each one.
//! A `runsync` job admitted without being written (the fast lane, on an
//! SQLite file this process owns alone) has its hold reserved in the SQLite
//! writer thread instead, which adds it to the sum for every later admission
//! until the job is written or lost (`transition/reserved.rs`).
//! A completion debits the balance by the actual cost in its own
//! transaction (`gantry_billing::record_charges`).
//!
//! The bound: each admitted job saw credit left after every hold before it,
//! so as long as a job costs at most its hold, the balance never ends more
//! than one job's cost below zero, however many jobs race for the last credit.

use gantry_billing::credit::account;
use gantry_catalog::ModelSpec;
use sea_orm::{ConnectionTrait, DbBackend, EntityTrait, Statement};
use serde_json::Value;

use crate::types::JobError;

/// The most a job of `model` with `input` may cost, in micro-USD: its price
/// for the most units it can use, which the model's manifest entry states
/// ([`gantry_catalog::Hold`]; one unit where it states none).
pub fn hold(model: &ModelSpec, input: &Value) -> i64 {
    let units = model.hold_units(input);
    let micros = (units * 1e6).ceil().min(i64::MAX as f64) as i64;
    gantry_billing::cost(micros, &model.unit, model).unwrap_or(i64::MAX / 4)
}

/// The user's balance and what their jobs in flight may still cost, from
/// their account row ((0, 0) without one).
pub async fn standing<C: ConnectionTrait>(db: &C, user: &str) -> Result<(i64, i64), sea_orm::DbErr> {
    Ok(account::Entity::find_by_id(user.to_owned())
        .one(db)
        .await?
        .map_or((0, 0), |a| (a.balance_micro_usd, a.held_micro_usd)))
}

/// Takes the per-user lock of an admission on PostgreSQL (see
/// `JobWriter::admit`): a write to the user's `credit_accounts` row as the
/// transaction's first statement. Returns the balance and the holds.
pub(crate) async fn lock_account<C: ConnectionTrait>(
    db: &C,
    user: &str,
    now: i64,
) -> Result<(i64, i64), sea_orm::DbErr> {
    let lock = "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms) VALUES ($1, 0, $2) \
         ON CONFLICT (user_id) DO UPDATE SET updated_at_ms = credit_accounts.updated_at_ms \
         RETURNING balance_micro_usd, held_micro_usd";
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            lock,
            [user.into(), now.into()],
        ))
        .await?;
    Ok(match row {
        Some(row) => (row.try_get_by_index::<i64>(0)?, row.try_get_by_index::<i64>(1)?),
        None => (0, 0),
    })
}

/// Takes, on PostgreSQL, the account rows of the owners of the jobs a
/// transaction is about to move, in user order, as its first statement:
/// the owners of the rows of `jobs` that `jobs_where` matches (its
/// placeholders `$1`… bound to `values`), and `users` (owners of rows not
/// written yet). The triggers that keep `held_micro_usd`, and the debits of
/// completions, lock account rows in the order of the jobs they change,
/// which differs between two transactions (two schedulers' settlements, or
/// one and a time-out sweep): each could hold one user's row and wait for
/// the other's, until PostgreSQL aborts one. Taking them sorted first, the
/// later transaction waits for the earlier one before it holds anything the
/// earlier one wants. Returns how many rows it locked: every owner of a job
/// in flight has one (the triggers make it), so none means no such job.
pub(crate) async fn lock_owners<C: ConnectionTrait>(
    db: &C,
    jobs_where: &str,
    mut values: Vec<sea_orm::Value>,
    users: &[&str],
) -> Result<usize, sea_orm::DbErr> {
    let mut sql =
        format!("SELECT user_id FROM credit_accounts WHERE user_id IN (SELECT user_id FROM jobs WHERE {jobs_where})");
    if !users.is_empty() {
        let first = values.len() + 1;
        let list: Vec<String> = (first..first + users.len()).map(|n| format!("${n}")).collect();
        sql.push_str(&format!(" OR user_id IN ({})", list.join(", ")));
        values.extend(users.iter().map(|user| sea_orm::Value::from(*user)));
    }
    sql.push_str(" ORDER BY user_id FOR UPDATE");
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values))
        .await?;
    Ok(rows.len())
}

/// Whether the user could start one more job now (for a retry; not
/// serialized with other admissions).
pub async fn has_credit<C: ConnectionTrait>(db: &C, user: &str) -> Result<(), JobError> {
    let (balance, held) = standing(db, user).await?;
    if balance.saturating_sub(held) <= 0 {
        return Err(JobError::PaymentRequired { balance, held });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use gantry_catalog::{Hold, ModelKind, ModelSpec, Price};
    use serde_json::json;

    use super::hold;

    fn video(per: i64, micro_usd: i64) -> ModelSpec {
        ModelSpec::new("v", ModelKind::Video, "seconds", Price::new(micro_usd, per).unwrap()).with_hold(Some(
            Hold::Blocks {
                field: "duration".into(),
                default: 10,
            },
        ))
    }

    #[test]
    fn a_video_holds_every_block_it_can_start() {
        // 0.50 USD per started 5 s: 4 s and 5 s hold one block, 5.5 s two.
        let video_5s = video(5, 500_000);
        assert_eq!(hold(&video_5s, &json!({"duration": 4})), 500_000);
        assert_eq!(hold(&video_5s, &json!({"duration": 5})), 500_000);
        assert_eq!(hold(&video_5s, &json!({"duration": 5.5})), 1_000_000);
        assert_eq!(hold(&video_5s, &json!({})), 1_000_000);
        assert_eq!(hold(&video(1, 100), &json!({"duration": 2.5})), 300);
    }

    #[test]
    fn embeddings_hold_the_longest_read_of_every_input() {
        // 0.10 USD per million tokens: 512 tokens an input.
        let embed = ModelSpec::new(
            "e",
            ModelKind::Embedding,
            "tokens",
            Price::new(100_000, 1_000_000).unwrap(),
        )
        .with_hold(Some(Hold::Items {
            field: "input".into(),
            each: 512,
        }));
        assert_eq!(hold(&embed, &json!({"input": "one"})), 51);
        assert_eq!(hold(&embed, &json!({"input": ["a", "b", "c"]})), 154);
        assert_eq!(hold(&embed, &json!({"input": [1, 2, 3]})), 51);
        assert_eq!(hold(&embed, &json!({"input": [[1], [2]]})), 102);
    }

    #[test]
    fn a_fixed_hold_ignores_the_input_and_no_rule_holds_one_unit() {
        // 1800 s at 100 µUSD per second, whatever the input.
        let audio = ModelSpec::new(
            "w",
            ModelKind::Transcription,
            "audio_seconds",
            Price::new(100, 1).unwrap(),
        );
        assert_eq!(hold(&audio, &json!({"audio": "AAAA"})), 100);
        let audio = audio.with_hold(Some(Hold::Units(1800)));
        assert_eq!(hold(&audio, &json!({"audio": "AAAA"})), 180_000);
    }

    #[test]
    fn the_example_catalog_holds_by_its_rules() {
        let catalog = gantry_catalog::ModelCatalog::default();
        let of = |id: &str| catalog.get(id).unwrap();
        // 1024 x 1024 x 2 pixels at 0.02 USD per megapixel.
        assert_eq!(hold(of("flux-dev"), &json!({"num_images": 2})), 41_943);
        // 8192 tokens at 10 USD per million.
        assert_eq!(hold(of("qwen-text"), &json!({"prompt": "hi"})), 81_920);
        // Echo has no rule: one request.
        assert_eq!(hold(of("gantry-echo"), &json!({"sleep_ms": 5})), 10);
    }
}
