//! Migration 6 on a database that already holds charges and queued jobs:
//! the ledger keeps every entry under its job-derived id, a second charge of
//! a job is still impossible, queued jobs are still claimed, and the
//! migration rolls back and forward again. Migration 22 on a database with
//! jobs in flight: each account starts with the sum of its owner's holds,
//! and keeps it as jobs move.

use gantry_billing::{Charge, entry_id, record_charges};
use gantry_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

use crate::harness::{Backend, ECHO, Env, Fresh, Node, config};

gantry_testkit::on_both_backends!(
    ledger_and_queue_survive_migration_6,
    accounts_sum_the_holds_in_flight_from_migration_22_on
);

/// Migrations before the one that narrowed the job and ledger writes.
const BEFORE_6: u32 = 5;

async fn ledger_and_queue_survive_migration_6(backend: Backend) {
    let database = Fresh::new(backend).await;
    let db = Database::connect(&database.url).await.unwrap();
    Migrator::up(&db, Some(BEFORE_6)).await.unwrap();

    // Two charges with the old random ids, and one queued job.
    for (id, job) in [("le_0oldrandomid000001", "job-a"), ("le_0oldrandomid000002", "job-b")] {
        exec(
            &db,
            &format!(
                "INSERT INTO ledger_entries (id, user_id, job_id, model, unit, quantity_micros, \
                 amount_micro_usd, created_at) VALUES ('{id}', 'user-1', '{job}', '{ECHO}', 'request', 1000000, 7, 1)"
            ),
        )
        .await;
    }
    exec(
        &db,
        &format!(
            "INSERT INTO jobs (id, user_id, model, status, input, low_priority, sync, execution_timeout_ms, ttl_ms, \
             attempt, max_attempts, retries, created_at_ms, queued_at_ms, expires_at_ms, chunks_read) VALUES \
             ('00000000000000queued000001', 'user-1', '{ECHO}', 'IN_QUEUE', '{{\"n\":1}}', false, false, 60000, \
             86400000, 0, 3, 0, 1, 1, 9999999999999, 0)"
        ),
    )
    .await;

    Migrator::up(&db, None).await.unwrap();
    assert_eq!(
        ledger(&db).await,
        vec![
            (entry_id("job-a"), "job-a".to_string(), 7),
            (entry_id("job-b"), "job-b".to_string(), 7)
        ],
        "every entry kept, under its job-derived id"
    );
    let again = charge("job-a");
    assert_eq!(
        record_charges(&db, std::slice::from_ref(&again), 2).await.unwrap(),
        0,
        "job-a is charged already"
    );
    assert_eq!(record_charges(&db, &[charge("job-c")], 2).await.unwrap(), 1);
    assert_eq!(ledger(&db).await.len(), 3);

    // Down past migration 6 (every later one first) and up again: nothing
    // lost, still one charge per job.
    let after_5 = u32::try_from(Migrator::migrations().len()).unwrap() - BEFORE_6;
    Migrator::down(&db, Some(after_5)).await.unwrap();
    assert_eq!(ledger(&db).await.len(), 3);
    Migrator::up(&db, None).await.unwrap();
    assert_eq!(ledger(&db).await.len(), 3);
    assert_eq!(record_charges(&db, &[again], 3).await.unwrap(), 0);

    if backend == Backend::Sqlite {
        // The claim and purge-queue read the partial index of queued jobs.
        let detail = plan_of(
            &db,
            &format!(
                "SELECT id FROM jobs WHERE model = '{ECHO}' AND status = 'IN_QUEUE' \
                 AND expires_at_ms > 0 ORDER BY low_priority ASC, id ASC LIMIT 8"
            ),
        )
        .await;
        assert!(
            detail.iter().any(|d| d.contains("idx_jobs_queued")),
            "claim plan: {detail:?}"
        );
        // Migration 7: the webhook take-over reads the partial index of
        // pending deliveries.
        let detail = plan_of(
            &db,
            "SELECT id FROM jobs WHERE webhook_due_ms IS NOT NULL \
             AND completed_at_ms <= 5 AND webhook_due_ms <= 10 ORDER BY completed_at_ms LIMIT 64",
        )
        .await;
        assert!(
            detail.iter().any(|d| d.contains("idx_jobs_webhook_due")),
            "webhook take-over plan: {detail:?}"
        );
    }
    drop(db);

    // The job queued before the migration is claimed and completed after it.
    let env = Env::on(database, backend, config()).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);
    let done = env.finished("00000000000000queued000001").await;
    assert_eq!(done.status, gantry_jobs::JobStatus::Completed);
    assert_eq!(env.ledger_count().await, 4, "three earlier charges and this job's");
    drop(node);
}

/// Migrations before the one that keeps each account's holds.
const BEFORE_22: u32 = 21;

async fn accounts_sum_the_holds_in_flight_from_migration_22_on(backend: Backend) {
    let database = Fresh::new(backend).await;
    let db = Database::connect(&database.url).await.unwrap();
    Migrator::up(&db, Some(BEFORE_22)).await.unwrap();
    exec(
        &db,
        "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms) VALUES ('user-1', 500, 1)",
    )
    .await;
    for (id, user, status, hold) in [
        ("a", "user-1", "IN_QUEUE", 10),
        ("b", "user-1", "IN_PROGRESS", 20),
        ("c", "user-1", "COMPLETED", 40),
        ("d", "user-2", "IN_QUEUE", 7),
    ] {
        exec(
            &db,
            &format!(
                "INSERT INTO jobs (id, user_id, model, status, input, low_priority, sync, execution_timeout_ms, \
                 ttl_ms, attempt, max_attempts, retries, created_at_ms, queued_at_ms, expires_at_ms, chunks_read, \
                 hold_micro_usd) VALUES ('{id}', '{user}', '{ECHO}', '{status}', '{{}}', false, false, 60000, \
                 86400000, 0, 3, 0, 1, 1, 9999999999999, 0, {hold})"
            ),
        )
        .await;
    }
    Migrator::up(&db, None).await.unwrap();
    assert_eq!(
        accounts(&db).await,
        [("user-1".to_string(), 500, 30), ("user-2".to_string(), 0, 7)],
        "the holds of the jobs in flight, summed per user; balances kept"
    );
    // A completion, a delete of a queued job, a retry of a completed one,
    // and a claim (no change).
    exec(&db, "UPDATE jobs SET status = 'COMPLETED' WHERE id = 'b'").await;
    exec(&db, "DELETE FROM jobs WHERE id = 'd'").await;
    exec(&db, "UPDATE jobs SET status = 'IN_QUEUE' WHERE id = 'c'").await;
    exec(
        &db,
        "UPDATE jobs SET status = 'IN_PROGRESS', attempt = 1 WHERE id = 'a'",
    )
    .await;
    assert_eq!(
        accounts(&db).await,
        [("user-1".to_string(), 500, 50), ("user-2".to_string(), 0, 0)]
    );
}

/// (user, balance, held) of every account.
async fn accounts(db: &DatabaseConnection) -> Vec<(String, i64, i64)> {
    db.query_all_raw(Statement::from_string(
        db.get_database_backend(),
        "SELECT user_id, balance_micro_usd, held_micro_usd FROM credit_accounts ORDER BY user_id",
    ))
    .await
    .unwrap()
    .iter()
    .map(|row| {
        (
            row.try_get_by_index(0).unwrap(),
            row.try_get_by_index(1).unwrap(),
            row.try_get_by_index(2).unwrap(),
        )
    })
    .collect()
}

fn charge(job: &str) -> Charge {
    Charge {
        user_id: "user-1".into(),
        job_id: job.into(),
        model: ECHO.into(),
        unit: "request".into(),
        quantity_micros: 1_000_000,
        amount_micro_usd: 7,
    }
}

async fn exec(db: &DatabaseConnection, sql: &str) {
    db.execute_unprepared(sql).await.unwrap();
}

async fn ledger(db: &DatabaseConnection) -> Vec<(String, String, i64)> {
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT id, job_id, amount_micro_usd FROM ledger_entries ORDER BY job_id",
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|row| {
            (
                row.try_get("", "id").unwrap(),
                row.try_get("", "job_id").unwrap(),
                row.try_get("", "amount_micro_usd").unwrap(),
            )
        })
        .collect()
}

/// SQLite's `EXPLAIN QUERY PLAN` of `sql`, one line per step.
async fn plan_of(db: &sea_orm::DatabaseConnection, sql: &str) -> Vec<String> {
    let plan = db
        .query_all_raw(Statement::from_string(
            DbBackend::Sqlite,
            format!("EXPLAIN QUERY PLAN {sql}"),
        ))
        .await
        .unwrap();
    plan.iter().map(|row| row.try_get("", "detail").unwrap()).collect()
}
