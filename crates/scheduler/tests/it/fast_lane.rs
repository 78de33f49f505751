//! The fast lane: a submit that finds a free slot and an empty queue
//! is written already claimed by the scheduler of its process, and handed to
//! it after the commit. It must behave like any claimed job: run once, charged
//! once, and requeued if its scheduler dies. Also `claim_ahead`, on both.

use std::time::Duration;

use gantry_jobs::JobStatus;
use serde_json::json;

use crate::harness::{Backend, Env, Node, Runs, completed_once_by, crash_and_recover};

gantry_testkit::on_both_backends!(
    a_submit_with_a_free_slot_is_written_claimed,
    a_handed_over_job_survives_its_scheduler_crashing,
    submits_beyond_the_free_slots_queue_and_all_run_once,
    jobs_claimed_ahead_run_once_and_cancel_while_waiting,
);

/// Runs one job through, then gives the scheduler a moment to refresh the
/// lane's credits (it found the queue empty when that job's slot freed).
pub async fn prime(env: &Env) {
    let first = env.submit(json!({})).await;
    assert_eq!(env.finished(&first.id).await.status, JobStatus::Completed);
    tokio::time::sleep(Duration::from_millis(800)).await;
}

async fn a_submit_with_a_free_slot_is_written_claimed(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 2);
    prime(&env).await;

    let job = env.submit(json!({"sleep_ms": 300})).await;
    // The caller is told the job was queued, as the API promises...
    assert_eq!(job.status, JobStatus::InQueue);
    // ...but the committed row is already running: no claim came in between.
    assert_eq!(env.get(&job.id).await.status, JobStatus::InProgress);
    completed_once_by(&env, &job.id, "w1").await;
    node.shutdown().await;
}

async fn a_handed_over_job_survives_its_scheduler_crashing(backend: Backend) {
    let env = Env::with_config(backend, crate::harness::crash_config()).await;
    let first = Node::start(&env.store, &env.catalog).await;
    let runs = Runs::default();
    let old_worker = first.counting_worker("w1", 1, runs.clone());
    prime(&env).await;
    // Held until the crash (echo, the survivor's model, ignores `hold`).
    let job = env.submit(json!({"hold": true})).await;
    assert_eq!(env.get(&job.id).await.status, JobStatus::InProgress);
    crash_and_recover(&env, first, old_worker, &job.id).await;
}

async fn submits_beyond_the_free_slots_queue_and_all_run_once(backend: Backend) {
    const JOBS: usize = 40;
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 3);
    prime(&env).await;
    // More at once than the lane has credits: the rest take the queue.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..JOBS {
        let env_store = env.store.clone();
        let echo = env.echo();
        tasks.spawn(async move {
            env_store
                .submit(
                    crate::harness::USER,
                    &echo,
                    gantry_jobs::NewJob::new(json!({"i": i, "sleep_ms": 20})),
                    gantry_jobs::Mode::Async,
                )
                .await
                .unwrap()
                .id
        });
    }
    let mut ids = Vec::new();
    while let Some(id) = tasks.join_next().await {
        ids.push(id.unwrap());
    }
    for id in &ids {
        let done = env.finished(id).await;
        assert_eq!(done.status, JobStatus::Completed, "{done:?}");
        assert_eq!(env.charges_of(id).await, [10]);
    }
    // The priming job and these, each charged once.
    assert_eq!(env.ledger_count().await, JOBS as i64 + 1);
    node.shutdown().await;
}

/// `claim_ahead`: jobs claimed beyond the free slots wait in the scheduler and
/// take slots as they free. Each still runs once and is charged once, and one
/// cancelled while it waits never runs.
async fn jobs_claimed_ahead_run_once_and_cancel_while_waiting(backend: Backend) {
    const JOBS: usize = 10;
    let mut config = crate::harness::config();
    config.claim_ahead = 8;
    let env = Env::with_config(backend, config).await;
    let node = Node::start(&env.store, &env.catalog).await;
    // Queued before any worker is there. The first holds the only slot until
    // the gate opens, however long the checks below take; the claim that
    // gives it the slot also claims the next 8 ahead.
    let mut ids = vec![env.submit(json!({"hold": true})).await.id];
    for i in 1..JOBS {
        ids.push(env.submit(json!({"i": i, "sleep_ms": 10})).await.id);
    }
    let runs = Runs::default();
    let _worker = node.counting_worker("w1", 1, runs.clone());
    // The second job reads IN_PROGRESS (claimed) while it waits for the slot.
    let waiting = env.until_status(&ids[1], JobStatus::InProgress).await;
    // The first job's assignment may still be on its way to the worker.
    let deadline = tokio::time::Instant::now() + crate::harness::WAIT;
    while runs.count() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // It holds the only slot: nothing else has started.
    assert_eq!(runs.started(), ids[..1], "only the first job has started");
    let cancelled = env
        .store
        .cancel(crate::harness::USER, crate::harness::ECHO, &waiting.id)
        .await
        .unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    runs.open_gate();
    for (i, id) in ids.iter().enumerate() {
        let done = env.finished(id).await;
        if i == 1 {
            assert_eq!(done.status, JobStatus::Cancelled, "{done:?}");
            assert!(env.charges_of(id).await.is_empty());
        } else {
            assert_eq!(done.status, JobStatus::Completed, "{done:?}");
            assert_eq!(env.charges_of(id).await, [10]);
        }
    }
    let mut started = runs.started();
    started.sort();
    let mut expected: Vec<String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, id)| id.clone())
        .collect();
    expected.sort();
    assert_eq!(started, expected, "each job ran once; the cancelled one never ran");
    node.shutdown().await;
}
