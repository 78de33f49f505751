//! The grouped paths: many concurrent submits (one grouped insert per batch),
//! completions settled together (one statement per batch), and the waiter a
//! sync submit registers for the `wait` that follows it.

use std::time::Duration;

use gantry_jobs::{JobStatus, Mode, NewJob};
use serde_json::json;

use crate::harness::{Backend, ECHO, Env, Node, USER, WAIT};

gantry_testkit::on_both_backends!(
    concurrent_jobs_complete_once_with_their_own_output,
    late_wait_on_a_sync_job_still_gets_its_result,
    wait_for_another_user_does_not_take_the_parked_waiter,
);

async fn concurrent_jobs_complete_once_with_their_own_output(backend: Backend) {
    const JOBS: usize = 300;
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _workers = [node.echo_worker("w1", 16), node.echo_worker("w2", 16)];
    let echo = env.echo();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..JOBS {
        let store = env.store.clone();
        let echo = echo.clone();
        let dispatcher = node.dispatcher.clone();
        tasks.spawn(async move {
            let mode = if i % 2 == 0 { Mode::Sync } else { Mode::Async };
            let job = store
                .submit(USER, &echo, NewJob::new(json!({"i": i})), mode)
                .await
                .unwrap();
            // 300 jobs share 32 slots: a machine with its CPUs oversubscribed
            // several times over took about 10 s for them in a debug build.
            let done = store.wait(USER, ECHO, &job.id, WAIT * 3).await.unwrap();
            // Where the dispatcher thinks it is, should it not be done.
            assert_eq!(
                done.status,
                JobStatus::Completed,
                "{done:?}; the workers: {:?}",
                dispatcher.workers()
            );
            assert_eq!(done.output, Some(json!({"i": i, "cost": 0.00001})));
            assert!(done.worker_id.is_some());
            done.id
        });
    }
    let mut ids = Vec::new();
    while let Some(id) = tasks.join_next().await {
        ids.push(id.unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), JOBS);
    assert_eq!(env.ledger_count().await, JOBS as i64);
    for id in ids.iter().take(20) {
        assert_eq!(env.charges_of(id).await, [10]);
        // The stored row agrees with what the waiter got.
        assert_eq!(env.get(id).await.status, JobStatus::Completed);
    }
    node.shutdown().await;
}

async fn late_wait_on_a_sync_job_still_gets_its_result(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 2);
    let job = env
        .store
        .submit(USER, &env.echo(), NewJob::new(json!({"late": true})), Mode::Sync)
        .await
        .unwrap();
    // Let it finish before anyone waits.
    env.until_status(&job.id, JobStatus::Completed).await;
    let started = tokio::time::Instant::now();
    let done = env.store.wait(USER, ECHO, &job.id, WAIT).await.unwrap();
    assert_eq!(done.status, JobStatus::Completed);
    assert_eq!(done.output, Some(json!({"late": true, "cost": 0.00001})));
    assert!(started.elapsed() < Duration::from_secs(1));
    // Waiting again reads the row.
    let again = env.store.wait(USER, ECHO, &job.id, WAIT).await.unwrap();
    assert_eq!(again, done);
    node.shutdown().await;
}

async fn wait_for_another_user_does_not_take_the_parked_waiter(backend: Backend) {
    let env = Env::new(backend).await;
    // No scheduler: the job stays queued.
    let job = env
        .store
        .submit(USER, &env.echo(), NewJob::new(json!({})), Mode::Sync)
        .await
        .unwrap();
    assert!(
        env.store
            .wait("someone-else", ECHO, &job.id, Duration::from_millis(50))
            .await
            .is_err()
    );
    let view = env
        .store
        .wait(USER, ECHO, &job.id, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(view.status, JobStatus::InQueue);
    // Now a scheduler runs it; a new wait sees the result.
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);
    let done = env.finished(&job.id).await;
    assert_eq!(done.status, JobStatus::Completed);
    node.shutdown().await;
}
