//! A rough throughput probe (not a test): `cargo test -p gantry-scheduler --release
//! --test it bench -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use gantry_jobs::{JobStatus, Mode, NewJob};
use serde_json::json;

use crate::harness::{Backend, ECHO, Env, Node, USER};

async fn runsync_throughput(backend: Backend) {
    const JOBS: usize = 2000;
    const CONCURRENCY: usize = 64;
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _workers = [node.echo_worker("w1", 32), node.echo_worker("w2", 32)];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let echo = env.echo();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..CONCURRENCY {
        let store = env.store.clone();
        let echo = echo.clone();
        tasks.spawn(async move {
            for i in (lane..JOBS).step_by(CONCURRENCY) {
                let job = store
                    .submit(USER, &echo, NewJob::new(json!({"i": i})), Mode::Sync)
                    .await
                    .unwrap();
                let done = store.wait(USER, ECHO, &job.id, Duration::from_secs(30)).await.unwrap();
                assert_eq!(done.status, JobStatus::Completed);
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "{backend:?}: {JOBS} runsync jobs in {elapsed:?}: {:.0} jobs/s",
        JOBS as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(env.ledger_count().await, JOBS as i64);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "throughput probe; run by hand"]
async fn bench_sqlite() {
    runsync_throughput(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "throughput probe; run by hand"]
async fn bench_postgres() {
    runsync_throughput(Backend::Postgres).await;
}
