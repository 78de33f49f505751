//! Crashes and concurrency: lost workers, restarted and crashed schedulers,
//! duplicate results, two schedulers on one database.

use std::time::Duration;

use gantry_dispatch::Event;
use gantry_jobs::{JobStatus, JobStore};
use serde_json::json;
use tokio::sync::mpsc;

use crate::harness::{Backend, ECHO, Env, Node, Runs, USER, WAIT, crash_and_recover};

gantry_testkit::on_both_backends!(
    killed_worker_job_completes_elsewhere_charged_once,
    restarted_scheduler_loses_no_queued_job,
    crashed_scheduler_jobs_are_requeued,
    duplicate_and_late_results_never_charge_twice,
    low_priority_runs_after_others,
    a_result_lost_on_the_way_is_run_again_and_charged_once,
);

async fn killed_worker_job_completes_elsewhere_charged_once(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let runs = Runs::default();
    let first = node.counting_worker("w1", 1, runs.clone());

    // Held by w1 until it dies: it cannot end there first, however slow the
    // test is to kill it. Echo (w2) ignores `hold`.
    let job = env.submit(json!({"hold": true})).await;
    started(&runs, 1).await;
    let _second = node.echo_worker("w2", 1);
    first.kill();

    crate::harness::completed_once_by(&env, &job.id, "w2").await;
    assert_eq!(env.store.health(USER, ECHO).await.unwrap().retried, 1);
    node.shutdown().await;
}

async fn restarted_scheduler_loses_no_queued_job(backend: Backend) {
    let env = Env::new(backend).await;
    // No worker: everything stays queued.
    let first = Node::start(&env.store, &env.catalog).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(env.submit(json!({"i": i})).await.id);
    }
    first.shutdown().await;

    let second = Node::start(&env.store, &env.catalog).await;
    let _worker = second.echo_worker("w1", 2);
    for id in &ids {
        assert_eq!(env.finished(id).await.status, JobStatus::Completed);
        assert_eq!(env.charges_of(id).await, [10]);
    }
    second.shutdown().await;
}

async fn crashed_scheduler_jobs_are_requeued(backend: Backend) {
    let env = Env::with_config(backend, crate::harness::crash_config()).await;
    let first = Node::start(&env.store, &env.catalog).await;
    let runs = Runs::default();
    let old_worker = first.counting_worker("w1", 1, runs.clone());
    // Held until the crash: it is mid-run however slow the machine is.
    let job = env.submit(json!({"hold": true})).await;
    started(&runs, 1).await;
    crash_and_recover(&env, first, old_worker, &job.id).await;
}

async fn duplicate_and_late_results_never_charge_twice(backend: Backend) {
    let env = Env::new(backend).await;
    let (inject, injected) = mpsc::channel::<Event>(16);
    // Forward every event; repeat each Completed right away, and once more
    // later (as a late duplicate from another batch).
    let node = Node::start_with(&env.store, &env.catalog, |events| with_injected(events, injected, true)).await;
    let _worker = node.echo_worker("w1", 1);

    let job = env.submit(json!({"x": 1})).await;
    let done = env.finished(&job.id).await;
    assert_eq!(done.status, JobStatus::Completed);
    // A late result of the same attempt, with a different output and usage.
    inject
        .send(Event::Completed {
            job_id: job.id.clone(),
            attempt: 1,
            worker_id: "w1".into(),
            output: json!({"other": true}),
            usage: gantry_dispatch::Usage {
                unit: "requests".into(),
                quantity_micros: 5_000_000,
            },
            timings: Default::default(),
            files: Vec::new(),
        })
        .await
        .unwrap();
    // Let it be processed, then check nothing changed.
    let next = env.submit(json!({"y": 2})).await;
    env.finished(&next.id).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(env.get(&job.id).await.output, Some(json!({"x": 1, "cost": 0.00001})));
    assert_eq!(env.charges_of(&job.id).await, [10]);
    assert_eq!(env.ledger_count().await, 2);
    node.shutdown().await;
}

async fn low_priority_runs_after_others(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let echo = env.echo();
    let mut low = gantry_jobs::NewJob::new(json!({"low": true}));
    low.policy.low_priority = true;
    let low = env
        .store
        .submit(USER, &echo, low, gantry_jobs::Mode::Async)
        .await
        .unwrap();
    let normal = env.submit(json!({"low": false, "sleep_ms": 300})).await;
    // One slot: jobs run one at a time, in claim order.
    let _worker = node.echo_worker("w1", 1);
    let normal_done = env.finished(&normal.id).await;
    let low_done = env.finished(&low.id).await;
    assert_eq!(
        (normal_done.status, low_done.status),
        (JobStatus::Completed, JobStatus::Completed)
    );
    // Submitted first, the low-priority job still waited for the normal one
    // to run: it started at least the normal job's 300 ms after that one did.
    assert!(
        low_done.delay_time_ms >= normal_done.delay_time_ms + 300,
        "{normal_done:?} {low_done:?}"
    );
    node.shutdown().await;
}

/// Two schedulers (each with its own dispatcher and workers) on one
/// PostgreSQL database: every job runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_share_one_postgres() {
    const JOBS: usize = 40;
    let env = Env::new(Backend::Postgres).await;
    // Separate stores: no in-process wake-ups between the two instances.
    let store_b = JobStore::new(env.db.clone(), crate::harness::config()).expect("job store");
    let a = Node::start(&env.store, &env.catalog).await;
    let b = Node::start(&store_b, &env.catalog).await;
    let runs = Runs::default();
    let _workers = [
        a.counting_worker("a1", 2, runs.clone()),
        a.counting_worker("a2", 2, runs.clone()),
        b.counting_worker("b1", 2, runs.clone()),
        b.counting_worker("b2", 2, runs.clone()),
    ];
    let echo = env.echo();
    let mut ids = Vec::new();
    for i in 0..JOBS {
        let store = if i % 2 == 0 { &env.store } else { &store_b };
        let job = store
            .submit(
                USER,
                &echo,
                gantry_jobs::NewJob::new(json!({"i": i, "sleep_ms": 20})),
                gantry_jobs::Mode::Async,
            )
            .await
            .unwrap();
        ids.push(job.id);
    }
    let mut workers_seen = std::collections::HashSet::new();
    for id in &ids {
        let done = env.store.wait(USER, ECHO, id, WAIT).await.unwrap();
        assert_eq!(done.status, JobStatus::Completed, "{done:?}");
        workers_seen.insert(done.worker_id.unwrap());
    }
    assert_eq!(env.ledger_count().await, JOBS as i64);
    let mut started = runs.started();
    started.sort();
    ids.sort();
    assert_eq!(started, ids, "every job ran exactly once");
    assert!(
        workers_seen.len() >= 2,
        "both instances should have worked: {workers_seen:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A result the database refuses (PostgreSQL's text cannot hold a NUL, here
/// in the worker id of an injected completion) fails that job alone: the
/// other job settled in the same batch completes and is charged once, and
/// neither waits for a lease (60 s in these tests) to be requeued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_database_refuses_fails_its_job_alone() {
    let env = Env::new(Backend::Postgres).await;
    let (inject, injected) = mpsc::channel::<Event>(16);
    let node = Node::start_with(&env.store, &env.catalog, |events| {
        with_injected(events, injected, false)
    })
    .await;
    let runs = Runs::default();
    let _worker = node.counting_worker("w1", 2, runs.clone());
    let bad = env.submit(json!({"hold": true, "n": 1})).await;
    let good = env.submit(json!({"hold": true, "n": 2})).await;
    env.until_status(&bad.id, JobStatus::InProgress).await;
    env.until_status(&good.id, JobStatus::InProgress).await;
    let completed = |job_id: &str, worker_id: &str| Event::Completed {
        job_id: job_id.to_owned(),
        attempt: 1,
        worker_id: worker_id.to_owned(),
        output: json!({"n": 0}),
        usage: gantry_dispatch::Usage {
            unit: "requests".into(),
            quantity_micros: 1_000_000,
        },
        timings: Default::default(),
        files: Vec::new(),
    };
    inject.send(completed(&bad.id, "w1\u{0}")).await.unwrap();
    inject.send(completed(&good.id, "w1")).await.unwrap();
    let failed = env.finished(&bad.id).await;
    assert_eq!(failed.status, JobStatus::Failed, "{failed:?}");
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("could not be stored")),
        "{failed:?}"
    );
    assert!(env.charges_of(&bad.id).await.is_empty(), "a failed job costs nothing");
    let done = env.finished(&good.id).await;
    assert_eq!(done.status, JobStatus::Completed, "{done:?}");
    assert_eq!(env.charges_of(&good.id).await, [10]);
    // The worker's own late results change nothing.
    runs.open_gate();
    let next = env.submit(json!({"n": 3})).await;
    assert_eq!(env.finished(&next.id).await.status, JobStatus::Completed);
    assert_eq!(env.get(&bad.id).await.status, JobStatus::Failed);
    assert_eq!(env.charges_of(&good.id).await, [10]);
    node.shutdown().await;
}

/// The dispatcher's `events` and the test's `injected` ones, as the
/// scheduler reads them; with `repeat`, each completion a second time right
/// after it.
fn with_injected(
    mut events: mpsc::Receiver<Event>,
    mut injected: mpsc::Receiver<Event>,
    repeat: bool,
) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                Some(event) = injected.recv() => event,
                Some(event) = events.recv() => event,
                else => return,
            };
            let again = (repeat && matches!(event, Event::Completed { .. })).then(|| event.clone());
            if tx.send(event).await.is_err() {
                return;
            }
            if let Some(again) = again {
                let _ = tx.send(again).await;
            }
        }
    });
    rx
}

/// The first result of a job never reaches the scheduler (dropped between
/// the dispatcher and the job layer, as a defect anywhere on that path
/// would): the dispatcher no longer runs the job, and the scheduler, which
/// would otherwise renew its lease for ever, requeues it. It runs again on
/// the worker, completes, and is charged once.
async fn a_result_lost_on_the_way_is_run_again_and_charged_once(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start_with(&env.store, &env.catalog, |mut events| {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut dropped = false;
            while let Some(event) = events.recv().await {
                if !dropped && matches!(event, Event::Completed { .. }) {
                    dropped = true;
                    continue;
                }
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        rx
    })
    .await;
    let runs = Runs::default();
    let _worker = node.counting_worker("w1", 1, runs.clone());
    let job = env.submit(json!({"lost": true})).await;
    let done = crate::harness::completed_once_by(&env, &job.id, "w1").await;
    assert_eq!(done.output, Some(json!({"lost": true, "cost": 0.00001})));
    assert_eq!(runs.count(), 2, "run again after its first result was lost");
    assert_eq!(env.store.health(USER, ECHO).await.unwrap().retried, 1);
    assert_eq!(env.ledger_count().await, 1);
    node.shutdown().await;
}

/// Waits until counting workers have started `n` runs.
pub async fn started(runs: &Runs, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while runs.count() < n {
        assert!(tokio::time::Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
