//! Jobs running through real workers.

use std::time::{Duration, Instant, SystemTime};

use gantry_dispatch::{AssignError, Assignment, Event, ModelHealth, Usage};
use gantry_worker_sdk::{JobContext, JobError, Model, Output};
use serde_json::{Value, json};

use crate::harness::{ECHO, Server, WAIT, Worker, worker_config};

#[tokio::test]
async fn echo_job_completes_with_output_and_usage() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-echo", 1);
    server.wait_capacity(ECHO).await;
    assert_eq!(
        server.dispatcher.health().models[ECHO],
        ModelHealth {
            idle_workers: 1,
            free_slots: 1,
            ..ModelHealth::default()
        }
    );

    let input = json!({"prompt": "hello", "n": [1, 2, 3]});
    let worker = server
        .dispatcher
        .assign(Assignment::new("job-1", 1, ECHO, input.clone()))
        .unwrap();
    assert_eq!(worker, "w-echo");

    match server.terminal("job-1").await {
        Event::Completed {
            job_id,
            attempt,
            worker_id,
            output,
            usage,
            timings,
            files,
        } => {
            assert!(files.is_empty());
            assert_eq!((job_id.as_str(), attempt, worker_id.as_str()), ("job-1", 1, "w-echo"));
            assert_eq!(output, input);
            assert_eq!(usage, Usage::whole("requests", 1));
            assert_eq!(usage.quantity_micros, 1_000_000);
            assert!(timings.run_ns > 0, "{timings:?}");
        }
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[tokio::test]
async fn stream_chunks_arrive_in_order_before_completion() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-stream", 1);
    server.wait_capacity(ECHO).await;

    let input = json!({"stream": 20});
    server
        .dispatcher
        .assign(Assignment::new("job-s", 3, ECHO, input.clone()))
        .unwrap();
    let events = server.job_events("job-s").await;
    assert_eq!(events.len(), 21, "{events:?}");
    for (i, event) in events[..20].iter().enumerate() {
        match event {
            Event::Chunk {
                seq, output, attempt, ..
            } => {
                assert_eq!(*seq, i as u64);
                assert_eq!(*output, json!({"chunk": i}));
                assert_eq!(*attempt, 3);
            }
            other => panic!("expected chunk {i}, got {other:?}"),
        }
    }
    assert!(
        matches!(&events[20], Event::Completed { output, .. } if *output == input),
        "{:?}",
        events[20]
    );
}

#[tokio::test]
async fn cancel_stops_a_sleeping_job_promptly_and_frees_its_slot() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-cancel", 1);
    server.wait_capacity(ECHO).await;

    server
        .dispatcher
        .assign(Assignment::new("job-c", 1, ECHO, json!({"sleep_ms": 60_000})))
        .unwrap();
    // Cancel once the model is sleeping.
    let progress = server.next_event().await;
    assert!(
        matches!(&progress, Event::Progress { job_id, .. } if job_id == "job-c"),
        "{progress:?}"
    );
    assert_eq!(
        server.dispatcher.cancel("job-c", "user asked"),
        Some("w-cancel".to_owned())
    );
    let started = Instant::now();
    let event = server.terminal("job-c").await;
    assert!(
        matches!(&event, Event::Cancelled { job_id, attempt: 1, worker_id } if job_id == "job-c" && worker_id == "w-cancel"),
        "{event:?}"
    );
    assert!(started.elapsed() < WAIT / 2, "cancel took {:?}", started.elapsed());
    assert_eq!(server.dispatcher.cancel("job-c", "again"), None);

    // The slot comes back: the worker takes a new job.
    server.wait_capacity(ECHO).await;
    server
        .dispatcher
        .assign(Assignment::new("job-after", 1, ECHO, json!(1)))
        .unwrap();
    assert!(matches!(server.terminal("job-after").await, Event::Completed { .. }));
}

#[tokio::test]
async fn bad_input_fails_without_retry() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-fail", 1);
    server.wait_capacity(ECHO).await;

    server
        .dispatcher
        .assign(Assignment::new("job-f", 2, ECHO, json!({"fail": "no thanks"})))
        .unwrap();
    match server.terminal("job-f").await {
        Event::Failed {
            attempt,
            error,
            retryable,
            ..
        } => {
            assert_eq!(attempt, 2);
            assert!(!retryable);
            assert!(error.contains("no thanks"), "{error}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }

    server.wait_capacity(ECHO).await;
    server
        .dispatcher
        .assign(Assignment::new("job-f2", 1, ECHO, json!({"fail": true})))
        .unwrap();
    assert!(matches!(
        server.terminal("job-f2").await,
        Event::Failed { retryable: false, .. }
    ));
}

/// The input travels as JSON text; text that is not JSON is the input's
/// fault, so the worker fails the job without retry.
#[tokio::test]
async fn input_text_that_is_not_json_fails_without_retry() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-text", 1);
    server.wait_capacity(ECHO).await;
    let mut job = Assignment::new("job-text", 1, ECHO, json!({}));
    job.input_json = "{\"prompt\": ".into();
    server.dispatcher.assign(job).unwrap();
    match server.terminal("job-text").await {
        Event::Failed { error, retryable, .. } => {
            assert!(!retryable);
            assert!(error.contains("input is not valid JSON"), "{error}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// Panics when the input says so, echoes otherwise.
struct Panicky;

impl Model for Panicky {
    fn id(&self) -> &str {
        "panicky"
    }

    async fn run(&self, input: Value, _ctx: JobContext) -> Result<Output, JobError> {
        if input["panic"] == json!(true) {
            panic!("boom at {}", input["where"]);
        }
        Ok(Output::new(
            input,
            gantry_worker_sdk::Usage::micros("seconds", 1_500_000),
        ))
    }
}

#[tokio::test]
async fn a_panicking_model_reports_a_retryable_failure_and_keeps_serving() {
    let mut server = Server::start();
    let _worker = Worker::spawn(Panicky, worker_config(&server.url(), "w-panic", 1));
    server.wait_capacity("panicky").await;

    server
        .dispatcher
        .assign(Assignment::new(
            "job-p",
            1,
            "panicky",
            json!({"panic": true, "where": "layer 7"}),
        ))
        .unwrap();
    match server.terminal("job-p").await {
        Event::Failed { error, retryable, .. } => {
            assert!(retryable);
            assert!(error.contains("model panicked: boom at \"layer 7\""), "{error}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }

    server.wait_capacity("panicky").await;
    server
        .dispatcher
        .assign(Assignment::new("job-ok", 1, "panicky", json!({"panic": false})))
        .unwrap();
    match server.terminal("job-ok").await {
        Event::Completed { usage, .. } => assert_eq!(usage, Usage::micros("seconds", 1_500_000)),
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[tokio::test]
async fn slots_limit_concurrency() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-slots", 2);
    server.wait_capacity(ECHO).await;

    let sleepy = json!({"sleep_ms": 60_000});
    for job in ["job-a", "job-b"] {
        server
            .dispatcher
            .assign(Assignment::new(job, 1, ECHO, sleepy.clone()))
            .unwrap();
    }
    assert_eq!(
        server
            .dispatcher
            .assign(Assignment::new("job-c", 1, ECHO, sleepy.clone())),
        Err(AssignError::NoCapacity { model: ECHO.into() })
    );
    assert_eq!(
        server
            .dispatcher
            .assign(Assignment::new("job-a", 2, ECHO, sleepy.clone())),
        Err(AssignError::AlreadyRunning {
            job_id: "job-a".into(),
            worker_id: "w-slots".into()
        })
    );
    let health = &server.dispatcher.health().models[ECHO];
    assert_eq!(
        (health.running_workers, health.free_slots, health.running_jobs),
        (1, 0, 2)
    );
    assert_eq!(server.dispatcher.free_slots(ECHO), 0);
    let workers = server.dispatcher.workers();
    assert_eq!(workers[0].running_job_ids, ["job-a", "job-b"]);

    // Free one slot; only then does the third job go through.
    server.dispatcher.cancel("job-a", "make room").unwrap();
    assert!(matches!(server.terminal("job-a").await, Event::Cancelled { .. }));
    server.wait_capacity(ECHO).await;
    assert_eq!(
        server
            .dispatcher
            .assign(Assignment::new("job-c", 1, ECHO, json!({"x": 1}))),
        Ok("w-slots".into())
    );
    assert!(matches!(server.terminal("job-c").await, Event::Completed { .. }));
}

/// Jobs that end together may have their slots returned in one credit: every
/// slot still comes back exactly once, never more.
#[tokio::test]
async fn slots_of_jobs_ending_together_come_back_exactly() {
    let mut server = Server::start();
    let _worker = Worker::echo(&server, "w-batch", 4);
    server.wait_capacity(ECHO).await;
    for round in 1..=3u32 {
        let jobs: Vec<String> = (0..4).map(|n| format!("job-{round}-{n}")).collect();
        for job in &jobs {
            let assigned = server
                .dispatcher
                .assign(Assignment::new(job, 1, ECHO, json!({"sleep_ms": 20})));
            assert_eq!(assigned, Ok("w-batch".into()), "{job}");
        }
        assert_eq!(
            server
                .dispatcher
                .assign(Assignment::new("one-too-many", 1, ECHO, json!({}))),
            Err(AssignError::NoCapacity { model: ECHO.into() }),
            "four slots, four jobs"
        );
        for job in &jobs {
            assert!(matches!(server.terminal(job).await, Event::Completed { .. }), "{job}");
        }
        let started = Instant::now();
        while server.dispatcher.health().models[ECHO].free_slots < 4 {
            assert!(started.elapsed() < WAIT, "slots never came back");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(server.dispatcher.health().models[ECHO].free_slots, 4, "round {round}");
    }
}

#[tokio::test]
async fn least_loaded_worker_is_preferred() {
    let mut server = Server::start();
    let _one = Worker::echo(&server, "w-1", 2);
    let _two = Worker::echo(&server, "w-2", 2);
    server.wait_capacity(ECHO).await;
    server.wait_capacity(ECHO).await;

    let sleepy = json!({"sleep_ms": 60_000});
    let first = server
        .dispatcher
        .assign(Assignment::new("job-1", 1, ECHO, sleepy.clone()))
        .unwrap();
    let second = server
        .dispatcher
        .assign(Assignment::new("job-2", 1, ECHO, sleepy.clone()))
        .unwrap();
    assert_ne!(first, second, "both jobs went to {first}");
    let health = &server.dispatcher.health().models[ECHO];
    assert_eq!(
        (health.running_workers, health.idle_workers, health.free_slots),
        (2, 0, 2)
    );
}

#[tokio::test]
async fn a_past_deadline_fails_without_retry() {
    exceeds_its_deadline(SystemTime::now() + Duration::from_millis(100)).await;
}

/// A deadline that passed before the worker could start the attempt (a slow
/// hand-over, a clock ahead of the scheduler's) is reported the same way as one
/// that passed while it ran, so the scheduler records the job as timed out.
#[tokio::test]
async fn a_deadline_passed_on_arrival_is_exceeded_too() {
    let (mut server, _worker) = exceeds_its_deadline(SystemTime::now() - Duration::from_millis(5)).await;
    // Its slot comes back.
    server.wait_capacity(ECHO).await;
}

/// Assigns a one-minute job with `deadline` to a 1-slot worker and checks
/// that it fails with exactly `DEADLINE_EXCEEDED`, not retryable.
async fn exceeds_its_deadline(deadline: SystemTime) -> (Server, Worker) {
    let mut server = Server::start();
    let worker = Worker::echo(&server, "w-deadline", 1);
    server.wait_capacity(ECHO).await;
    let mut job = Assignment::new("job-d", 1, ECHO, json!({"sleep_ms": 60_000}));
    job.deadline = Some(deadline);
    server.dispatcher.assign(job).unwrap();
    match server.terminal("job-d").await {
        Event::Failed { error, retryable, .. } => {
            assert!(!retryable);
            assert_eq!(error, gantry_dispatch::DEADLINE_EXCEEDED);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    (server, worker)
}
