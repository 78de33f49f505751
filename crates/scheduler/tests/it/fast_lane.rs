//! The fast lane (SQLite): a submit that finds a free slot and an empty queue
//! is written already claimed by the scheduler of its process, and handed to
//! it after the commit. It must behave like any claimed job: run once, charged
//! once, and requeued if its scheduler dies. Also `claim_ahead`, on both.

use std::time::Duration;

use gantry_scheduler::JobStatus;
use serde_json::json;

use crate::harness::{Backend, Env, Node, crash_and_recover};

gantry_testkit::on_both_backends!(
    submits_beyond_the_free_slots_queue_and_all_run_once,
    jobs_claimed_ahead_run_once_and_cancel_while_waiting,
);

/// The lane is on with SQLite only (see `Scheduler::start`).
mod sqlite_lane {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_submit_with_a_free_slot_is_written_claimed() {
        super::a_submit_with_a_free_slot_is_written_claimed(super::Backend::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handed_over_job_survives_its_scheduler_crashing() {
        super::a_handed_over_job_survives_its_scheduler_crashing(super::Backend::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_runsync_job_is_written_once_when_it_ends() {
        super::unstored::written_once_when_it_ends().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_runsync_job_is_written_while_it_runs() {
        super::unstored::written_while_it_runs().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstored_runsync_job_times_out() {
        super::unstored::times_out().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstored_runsync_job_whose_worker_dies_runs_elsewhere_charged_once() {
        super::unstored::worker_dies().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstored_runsync_job_is_lost_with_its_scheduler_and_never_charged() {
        super::unstored::lost_with_its_scheduler().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstored_runsync_job_goes_back_to_the_queue_on_shutdown() {
        super::unstored::queued_on_shutdown().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_streaming_runsync_job_is_written_at_its_first_chunk() {
        super::unstored::written_at_first_chunk().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_sync_store_after_zero_runsync_jobs_are_written_at_submit() {
        super::unstored::written_at_submit_when_off().await
    }
}

/// `runsync` jobs of the lane are kept in memory until they end or have run
/// `sync_store_after` (200 ms by default); see `SchedulerConfig`.
mod unstored {
    use super::*;
    use crate::harness::{ECHO, USER};
    use gantry_scheduler::JobError;

    async fn env() -> (Env, Node, crate::harness::Worker) {
        let env = Env::new(Backend::Sqlite).await;
        let node = Node::start(&env.store, &env.catalog).await;
        let worker = node.echo_worker("w1", 2);
        prime(&env).await;
        (env, node, worker)
    }

    pub async fn written_once_when_it_ends() {
        let (env, node, _worker) = env().await;
        let job = env.submit_sync(json!({"sleep_ms": 100})).await;
        assert_eq!(job.status, JobStatus::InQueue);
        assert!(env.try_get(&job.id).await.is_none(), "not written while it runs");
        assert_eq!(env.store.health(ECHO).await.unwrap().in_progress, 1, "but counted");
        let done = crate::harness::completed_once_by(&env, &job.id, "w1").await;
        assert_eq!(done.output.as_ref().and_then(|o| o.get("cost")), Some(&json!(0.00001)));
        // Written whole, final, with its one charge.
        let stored = env.get(&job.id).await;
        assert_eq!(stored, done);
        assert!(stored.execution_time_ms >= 100, "{stored:?}");
        assert_eq!(env.charges_of(&job.id).await, [10]);
        assert_eq!(env.store.health(ECHO).await.unwrap().in_progress, 0);
        node.shutdown().await;
    }

    pub async fn written_while_it_runs() {
        let (env, node, _worker) = env().await;
        let job = env.submit_sync(json!({"sleep_ms": 900})).await;
        // Written claimed once it has run 200 ms: a caller that gets the id
        // back from a `runsync` wait can read it.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(700);
        let running = loop {
            if let Some(view) = env.try_get(&job.id).await {
                break view;
            }
            assert!(tokio::time::Instant::now() < deadline, "not written while it ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(running.status, JobStatus::InProgress);
        assert_eq!(running.worker_id.as_deref(), Some("w1"));
        let done = env.finished(&job.id).await;
        assert_eq!(done.status, JobStatus::Completed, "{done:?}");
        assert_eq!(env.charges_of(&job.id).await, [10]);
        node.shutdown().await;
    }

    pub async fn times_out() {
        let (env, node, _worker) = env().await;
        let mut request = gantry_scheduler::NewJob::new(json!({"sleep_ms": 3000}));
        request.policy.execution_timeout_ms = Some(50);
        let job = env
            .store
            .submit(USER, &env.echo(), request, gantry_scheduler::Mode::Sync)
            .await
            .unwrap();
        let done = env.finished(&job.id).await;
        assert_eq!(done.status, JobStatus::TimedOut, "{done:?}");
        assert!(env.charges_of(&job.id).await.is_empty());
        node.shutdown().await;
    }

    pub async fn worker_dies() {
        let (env, node, worker) = env().await;
        let job = env.submit_sync(json!({"sleep_ms": 150})).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
        worker.kill();
        let _second = node.echo_worker("w2", 1);
        crate::harness::completed_once_by(&env, &job.id, "w2").await;
        assert_eq!(env.store.health(ECHO).await.unwrap().retried, 1);
        node.shutdown().await;
    }

    pub async fn lost_with_its_scheduler() {
        let (env, mut node, _worker) = env().await;
        let job = env.submit_sync(json!({"sleep_ms": 150})).await;
        let waiting = {
            let store = env.store.clone();
            let id = job.id.clone();
            tokio::spawn(async move { store.wait(USER, ECHO, &id, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(40)).await;
        // A crash: the task dies without writing anything.
        drop(node.scheduler.take());
        let result = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the waiter is told at once")
            .unwrap();
        assert!(matches!(result, Err(JobError::Lost)), "{result:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(env.try_get(&job.id).await.is_none());
        assert_eq!(env.ledger_count().await, 1, "only the priming job was charged");
    }

    pub async fn queued_on_shutdown() {
        let (env, node, worker) = env().await;
        let job = env.submit_sync(json!({"sleep_ms": 150})).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
        node.shutdown().await;
        drop(worker);
        assert_eq!(env.get(&job.id).await.status, JobStatus::InQueue);
        let second = Node::start(&env.store, &env.catalog).await;
        let _worker = second.echo_worker("w2", 1);
        let done = env.finished(&job.id).await;
        assert_eq!(done.status, JobStatus::Completed, "{done:?}");
        assert_eq!(env.charges_of(&job.id).await, [10]);
        second.shutdown().await;
    }

    pub async fn written_at_first_chunk() {
        let (env, node, _worker) = env().await;
        let job = env.submit_sync(json!({"stream": 3, "sleep_ms": 100})).await;
        let done = env.finished(&job.id).await;
        assert_eq!(done.status, JobStatus::Completed, "{done:?}");
        let stream = env.store.read_stream(USER, ECHO, &job.id).await.unwrap();
        let chunks: Vec<_> = stream.chunks.iter().map(|c| c["chunk"].clone()).collect();
        assert_eq!(chunks, [json!(0), json!(1), json!(2)]);
        assert_eq!(env.charges_of(&job.id).await, [10]);
        node.shutdown().await;
    }

    pub async fn written_at_submit_when_off() {
        let mut config = crate::harness::config();
        config.sync_store_after = Duration::ZERO;
        let env = Env::with_config(Backend::Sqlite, config).await;
        let node = Node::start(&env.store, &env.catalog).await;
        let _worker = node.echo_worker("w1", 2);
        prime(&env).await;
        let job = env.submit_sync(json!({"sleep_ms": 100})).await;
        assert_eq!(env.get(&job.id).await.status, JobStatus::InProgress);
        assert_eq!(env.finished(&job.id).await.status, JobStatus::Completed);
        node.shutdown().await;
    }
}

/// Runs one job through, then gives the scheduler a moment to refresh the
/// lane's credits (it found the queue empty when that job's slot freed).
async fn prime(env: &Env) {
    let first = env.submit(json!({})).await;
    assert_eq!(env.finished(&first.id).await.status, JobStatus::Completed);
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let done = env.finished(&job.id).await;
    assert_eq!(done.status, JobStatus::Completed, "{done:?}");
    assert_eq!(done.worker_id.as_deref(), Some("w1"));
    assert_eq!(env.charges_of(&job.id).await, [10]);
    node.shutdown().await;
}

async fn a_handed_over_job_survives_its_scheduler_crashing(backend: Backend) {
    let env = Env::new(backend).await;
    let first = Node::start(&env.store, &env.catalog).await;
    let old_worker = first.echo_worker("w1", 1);
    prime(&env).await;
    let job = env.submit(json!({"sleep_ms": 400})).await;
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
                    gantry_scheduler::NewJob::new(json!({"i": i, "sleep_ms": 20})),
                    gantry_scheduler::Mode::Async,
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const JOBS: usize = 10;
    let mut config = crate::harness::config();
    config.claim_ahead = 8;
    let env = Env::with_config(backend, config).await;
    let node = Node::start(&env.store, &env.catalog).await;
    // Queued before any worker is there. The first holds the only slot for
    // 600 ms; the claim that gives it the slot also claims the next 8 ahead.
    let mut ids = vec![env.submit(json!({"sleep_ms": 600})).await.id];
    for i in 1..JOBS {
        ids.push(env.submit(json!({"i": i, "sleep_ms": 10})).await.id);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let _worker = node.counting_worker("w1", 1, Arc::clone(&runs));
    // The second job reads IN_PROGRESS (claimed) while it waits for the slot.
    let waiting = env.until_status(&ids[1], JobStatus::InProgress).await;
    // The first job's assignment may still be on its way to the worker.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while runs.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // It holds the only slot for 600 ms: nothing else has started.
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the first job has started");
    let cancelled = env
        .store
        .cancel(crate::harness::USER, crate::harness::ECHO, &waiting.id)
        .await
        .unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);
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
    assert_eq!(runs.load(Ordering::SeqCst), JOBS - 1, "the cancelled job never ran");
    node.shutdown().await;
}
