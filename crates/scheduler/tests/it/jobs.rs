//! The life of single jobs: results and billing, failures, cancel, timeouts,
//! streams, waiting, queue management.

use std::time::Duration;

use gantry_scheduler::{JobError, JobPolicy, JobStatus, Mode, NewJob};
use serde_json::json;

use crate::harness::{Backend, ECHO, Env, Node, USER};

gantry_testkit::on_both_backends!(
    completes_with_cost_and_one_charge,
    bad_input_fails_uncharged_and_can_be_retried,
    cancels_queued_and_running_jobs,
    execution_timeout_and_ttl,
    stream_chunks_arrive_in_order,
    wait_returns_current_view_at_timeout,
    purge_queue_and_health,
    rejects_invalid_requests_without_writing,
    webhook_gets_the_final_view,
);

async fn completes_with_cost_and_one_charge(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 2);

    let submitted = env.submit(json!({"prompt": "hi"})).await;
    assert_eq!(submitted.status, JobStatus::InQueue);
    let done = env.finished(&submitted.id).await;
    assert_eq!(done.status, JobStatus::Completed, "{done:?}");
    // 1 request of gantry-echo = 10 µUSD = 0.00001 USD.
    assert_eq!(done.output, Some(json!({"prompt": "hi", "cost": 0.00001})));
    assert_eq!(done.worker_id.as_deref(), Some("w1"));
    assert_eq!(env.charges_of(&done.id).await, [10]);

    // Sync mode too, and the public JSON shape.
    let sync = env
        .store
        .submit(USER, &env.echo(), NewJob::new(json!({"n": 1})), Mode::Sync)
        .await
        .unwrap();
    let done = env
        .store
        .wait(USER, ECHO, &sync.id, crate::harness::WAIT)
        .await
        .unwrap();
    let body = serde_json::to_value(&done).unwrap();
    assert_eq!(body["status"], "COMPLETED");
    assert_eq!(body["output"], json!({"n": 1, "cost": 0.00001}));
    assert!(body["delayTime"].is_u64() && body["executionTime"].is_u64(), "{body}");
    assert_eq!(body["workerId"], "w1");
    assert_eq!(env.ledger_count().await, 2);

    // Another user's or another model's job is not found.
    assert!(matches!(
        env.store.get("someone-else", ECHO, &done.id).await,
        Err(JobError::NotFound)
    ));
    assert!(matches!(
        env.store.get(USER, "flux-dev", &done.id).await,
        Err(JobError::NotFound)
    ));
    node.shutdown().await;
}

async fn bad_input_fails_uncharged_and_can_be_retried(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);

    let job = env.submit(json!({"fail": true})).await;
    let failed = env.finished(&job.id).await;
    assert_eq!(failed.status, JobStatus::Failed);
    assert!(
        failed.error.as_deref().unwrap().contains("failure requested"),
        "{failed:?}"
    );
    assert!(failed.output.is_none());
    assert!(env.charges_of(&job.id).await.is_empty());

    // Retry: same id, same input, back in the queue, fails again (bad input stays bad).
    let again = env.store.retry(USER, ECHO, &job.id).await.unwrap();
    assert_eq!(again.id, job.id);
    assert!(matches!(again.status, JobStatus::InQueue | JobStatus::InProgress));
    let failed = env.finished(&job.id).await;
    assert_eq!(failed.status, JobStatus::Failed);
    assert_eq!(env.store.health(ECHO).await.unwrap().retried, 1);
    assert!(env.charges_of(&job.id).await.is_empty());

    // A completed job cannot be retried.
    let ok = env.submit(json!({})).await;
    env.finished(&ok.id).await;
    assert!(matches!(
        env.store.retry(USER, ECHO, &ok.id).await,
        Err(JobError::NotRetryable(JobStatus::Completed))
    ));
    assert!(matches!(
        env.store.retry(USER, ECHO, "nope").await,
        Err(JobError::NotFound)
    ));
    node.shutdown().await;
}

async fn cancels_queued_and_running_jobs(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;

    // Queued: no worker yet.
    let queued = env.submit(json!({})).await;
    let cancelled = env.store.cancel(USER, ECHO, &queued.id).await.unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);

    // Running: stopped on the worker too.
    let _worker = node.echo_worker("w1", 1);
    let running = env.submit(json!({"sleep_ms": 30_000})).await;
    env.until_status(&running.id, JobStatus::InProgress).await;
    let cancelled = env.store.cancel(USER, ECHO, &running.id).await.unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    let deadline = tokio::time::Instant::now() + crate::harness::WAIT;
    while node.dispatcher.workers().iter().any(|w| !w.running_job_ids.is_empty()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker still runs the cancelled job"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The freed slot takes new work; cancelling a finished job changes nothing.
    let next = env.submit(json!({"after": "cancel"})).await;
    let done = env.finished(&next.id).await;
    assert_eq!(done.status, JobStatus::Completed);
    assert_eq!(
        env.store.cancel(USER, ECHO, &next.id).await.unwrap(),
        env.get(&next.id).await
    );
    assert_eq!(env.get(&running.id).await.status, JobStatus::Cancelled);
    assert!(env.charges_of(&queued.id).await.is_empty());
    assert!(env.charges_of(&running.id).await.is_empty());
    node.shutdown().await;
}

async fn execution_timeout_and_ttl(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);

    let mut slow = NewJob::new(json!({"sleep_ms": 30_000}));
    slow.policy.execution_timeout_ms = Some(300);
    let slow = env.store.submit(USER, &env.echo(), slow, Mode::Async).await.unwrap();
    let ended = env.finished(&slow.id).await;
    assert_eq!(ended.status, JobStatus::TimedOut, "{ended:?}");
    assert!(ended.execution_time_ms >= 300, "{ended:?}");
    assert!(env.charges_of(&slow.id).await.is_empty());
    // The worker was told to stop: its slot serves the next job.
    let next = env.submit(json!({})).await;
    assert_eq!(env.finished(&next.id).await.status, JobStatus::Completed);

    // TTL: a job that waits longer than its ttl is removed.
    let blocker = env.submit(json!({"sleep_ms": 30_000})).await;
    env.until_status(&blocker.id, JobStatus::InProgress).await;
    let short = NewJob {
        policy: JobPolicy {
            ttl_ms: Some(200),
            ..JobPolicy::default()
        },
        ..NewJob::new(json!({}))
    };
    let short = env.store.submit(USER, &env.echo(), short, Mode::Async).await.unwrap();
    assert_eq!(env.get(&short.id).await.status, JobStatus::InQueue);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        env.store.get(USER, ECHO, &short.id).await,
        Err(JobError::NotFound)
    ));
    assert!(matches!(
        env.store.wait(USER, ECHO, &short.id, Duration::from_millis(10)).await,
        Err(JobError::NotFound)
    ));
    node.shutdown().await;
}

async fn stream_chunks_arrive_in_order(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);

    let job = env.submit(json!({"stream": 25})).await;
    let mut chunks = Vec::new();
    let deadline = tokio::time::Instant::now() + crate::harness::WAIT;
    loop {
        let view = env.store.read_stream(USER, ECHO, &job.id).await.unwrap();
        let last = view.status.is_final() && view.chunks.is_empty();
        chunks.extend(view.chunks);
        if last {
            assert_eq!(view.status, JobStatus::Completed);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "stream did not end");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let expected: Vec<_> = (0..25).map(|i| json!({"chunk": i})).collect();
    assert_eq!(chunks, expected);
    // Read chunks are not returned again.
    assert!(
        env.store
            .read_stream(USER, ECHO, &job.id)
            .await
            .unwrap()
            .chunks
            .is_empty()
    );
    assert_eq!(env.charges_of(&job.id).await, [10]);
    node.shutdown().await;
}

async fn wait_returns_current_view_at_timeout(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);

    let job = env.submit(json!({"sleep_ms": 700})).await;
    let started = tokio::time::Instant::now();
    let early = env
        .store
        .wait(USER, ECHO, &job.id, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        matches!(early.status, JobStatus::InQueue | JobStatus::InProgress),
        "{early:?}"
    );
    let done = env.store.wait(USER, ECHO, &job.id, crate::harness::WAIT).await.unwrap();
    assert_eq!(done.status, JobStatus::Completed);
    assert!(done.execution_time_ms >= 700, "{done:?}");
    node.shutdown().await;
}

async fn purge_queue_and_health(backend: Backend) {
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let echo = env.echo();

    let mine: Vec<_> = futures_join(3, || env.submit(json!({}))).await;
    let theirs = env
        .store
        .submit("user-2", &echo, NewJob::new(json!({})), Mode::Async)
        .await
        .unwrap();
    let counts = env.store.health(ECHO).await.unwrap();
    assert_eq!((counts.in_queue, counts.in_progress, counts.completed), (4, 0, 0));

    assert_eq!(env.store.purge_queue(USER, ECHO).await.unwrap(), 3);
    for job in &mine {
        assert_eq!(env.get(&job.id).await.status, JobStatus::Cancelled);
    }
    assert_eq!(
        env.store.get("user-2", ECHO, &theirs.id).await.unwrap().status,
        JobStatus::InQueue
    );
    assert_eq!(env.store.purge_queue(USER, ECHO).await.unwrap(), 0);

    let _worker = node.echo_worker("w1", 2);
    let bad = env.submit(json!({"fail": "no"})).await;
    let good = env.submit(json!({})).await;
    env.finished(&bad.id).await;
    env.finished(&good.id).await;
    env.store
        .wait("user-2", ECHO, &theirs.id, crate::harness::WAIT)
        .await
        .unwrap();
    let counts = env.store.health(ECHO).await.unwrap();
    assert_eq!(
        (
            counts.completed,
            counts.failed,
            counts.in_progress,
            counts.in_queue,
            counts.retried
        ),
        (2, 1, 0, 0, 0)
    );
    assert_eq!(env.store.health("flux-dev").await.unwrap(), Default::default());
    node.shutdown().await;
}

async fn rejects_invalid_requests_without_writing(backend: Backend) {
    let env = Env::new(backend).await;
    let echo = env.echo();
    let bad = [
        NewJob::new(json!("text")),
        NewJob {
            webhook: Some("ftp://x".into()),
            ..NewJob::new(json!({}))
        },
        NewJob {
            webhook: Some("not a url".into()),
            ..NewJob::new(json!({}))
        },
        NewJob {
            policy: JobPolicy {
                execution_timeout_ms: Some(0),
                ..JobPolicy::default()
            },
            ..NewJob::new(json!({}))
        },
        NewJob {
            policy: JobPolicy {
                ttl_ms: Some(u64::MAX),
                ..JobPolicy::default()
            },
            ..NewJob::new(json!({}))
        },
    ];
    for job in bad {
        let result = env.store.submit(USER, &echo, job.clone(), Mode::Async).await;
        assert!(matches!(result, Err(JobError::Invalid(_))), "{job:?}: {result:?}");
    }
    assert_eq!(env.store.health(ECHO).await.unwrap(), Default::default());
}

/// Runs `n` futures made by `make` one after the other (keeps ids in order).
async fn futures_join<F, Fut, T>(n: usize, make: F) -> Vec<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(make().await);
    }
    out
}

async fn webhook_gets_the_final_view(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::new(backend).await;
    let node = Node::start(&env.store, &env.catalog).await;
    let _worker = node.echo_worker("w1", 1);

    // A one-shot HTTP endpoint: refuses the first delivery, accepts the second.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<serde_json::Value>(4);
    tokio::spawn(async move {
        for status in ["500 Internal Server Error", "200 OK"] {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            let body = loop {
                let n = socket.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break body.to_string();
                    }
                }
            };
            let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            socket.write_all(reply.as_bytes()).await.unwrap();
            tx.send(serde_json::from_str(&body).unwrap()).await.unwrap();
        }
    });

    let job = NewJob {
        webhook: Some(url),
        ..NewJob::new(json!({"hook": 1}))
    };
    let job = env.store.submit(USER, &env.echo(), job, Mode::Async).await.unwrap();
    for _ in 0..2 {
        let delivered = tokio::time::timeout(crate::harness::WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(delivered["id"], job.id.as_str());
        assert_eq!(delivered["status"], "COMPLETED");
        assert_eq!(delivered["output"], json!({"hook": 1, "cost": 0.00001}));
    }
    node.shutdown().await;
}
