//! Worker presence: what schedulers publish to `worker_presence`, read back by
//! `Census::workers` as an API process without a dispatcher does.

use std::time::Duration;

use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

use crate::harness::{Backend, ECHO, Env, Node, WAIT};

gantry_testkit::on_both_backends!(schedulers_publish_their_workers_and_withdraw_them_on_shutdown);

/// Polls `Census::workers` until it reports `(idle, running)`.
/// The presence reads of `env`'s database, as an API process makes them.
fn census(env: &Env) -> gantry_jobs::Census {
    gantry_jobs::Census::new(env.db.clone(), env.store.config())
}

async fn until_workers(env: &Env, expected: (u64, u64)) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = census(env).workers(ECHO).await.expect("workers");
        if seen == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers never {expected:?}, last {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `worker_presence` rows of one scheduler instance.
async fn rows_of(env: &Env, instance: &str) -> i64 {
    assert!(instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    let row = env
        .db
        .query_one_raw(Statement::from_string(
            env.db.get_database_backend(),
            format!("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM worker_presence WHERE scheduler_id = '{instance}'"),
        ))
        .await
        .expect("count")
        .expect("row");
    row.try_get::<i64>("", "n").expect("n")
}

async fn schedulers_publish_their_workers_and_withdraw_them_on_shutdown(backend: Backend) {
    let env = Env::new(backend).await;
    assert_eq!(
        census(&env).workers(ECHO).await.expect("workers"),
        (0, 0),
        "nothing published yet"
    );

    // Two schedulers on one database, each with the store of its own
    // process (as two processes have): the counts are summed over both.
    let store_b = gantry_jobs::JobStore::new(env.db.clone(), crate::harness::config()).expect("job store");
    let a = Node::start(&env.store, &env.catalog).await;
    let b = Node::start(&store_b, &env.catalog).await;
    let a_id = a.scheduler.as_ref().expect("scheduler").instance_id().to_string();
    let b_id = b.scheduler.as_ref().expect("scheduler").instance_id().to_string();
    let _a1 = a.echo_worker("a-1", 1);
    let _a2 = a.echo_worker("a-2", 1);
    let _b1 = b.echo_worker("b-1", 1);
    until_workers(&env, (3, 0)).await;
    assert_eq!(census(&env).workers("no-such-model").await.expect("workers"), (0, 0));

    // A running job makes its worker count as running.
    let job = env.submit(json!({"sleep_ms": 1500})).await;
    until_workers(&env, (2, 1)).await;
    let done = env.finished(&job.id).await;
    assert_eq!(done.status, gantry_jobs::JobStatus::Completed, "{done:?}");
    until_workers(&env, (3, 0)).await;

    // A graceful shutdown removes the instance's rows at once.
    assert_eq!(rows_of(&env, &b_id).await, 1);
    b.shutdown().await;
    assert_eq!(rows_of(&env, &b_id).await, 0, "rows of a stopped scheduler are gone");
    assert_eq!(census(&env).workers(ECHO).await.expect("workers"), (2, 0));

    assert_eq!(rows_of(&env, &a_id).await, 1);
    a.shutdown().await;
    assert_eq!(rows_of(&env, &a_id).await, 0);
    assert_eq!(census(&env).workers(ECHO).await.expect("workers"), (0, 0));
}
