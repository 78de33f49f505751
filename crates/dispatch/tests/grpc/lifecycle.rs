//! Worker sessions coming and going: crashes, leases, drains, restarts.

use std::time::Duration;

use gantry_dispatch::{AssignError, Assignment, Event};
use gantry_proto::v1::scheduler_message;
use serde_json::json;
use tonic::Code;

use crate::harness::{ECHO, SECRET, Server, WAIT, Worker, config, hello, raw_connect, token};

#[tokio::test]
async fn a_killed_worker_is_lost_with_its_running_jobs() {
    let mut server = Server::start();
    let worker = Worker::echo(&server, "w-doomed", 2);
    server.wait_capacity(ECHO).await;
    for job in ["job-1", "job-2"] {
        server
            .dispatcher
            .assign(Assignment::new(job, 1, ECHO, json!({"sleep_ms": 60_000})))
            .unwrap();
    }

    worker.kill();
    let event = server
        .wait_for("worker lost", |e| matches!(e, Event::WorkerLost { .. }))
        .await;
    assert_eq!(
        event,
        Event::WorkerLost {
            worker_id: "w-doomed".into(),
            running_job_ids: vec!["job-1".into(), "job-2".into()],
        }
    );
    assert!(server.dispatcher.workers().is_empty());
    assert!(server.dispatcher.health().models.is_empty());
    assert_eq!(server.dispatcher.cancel("job-1", "gone"), None);
    assert_eq!(
        server.dispatcher.assign(Assignment::new("job-1", 2, ECHO, json!(null))),
        Err(AssignError::NoCapacity { model: ECHO.into() })
    );
}

#[tokio::test]
async fn a_silent_worker_loses_its_lease_but_a_heartbeating_one_does_not() {
    // Heartbeats every 100 ms, a lease of ten: a loaded machine may delay the
    // healthy worker's heartbeats by a few hundred ms without reaping it.
    let mut config = config().with_heartbeat(Duration::from_millis(100));
    config.lease = Duration::from_secs(1);
    let lease = config.lease;
    let mut server = Server::start_with(config);
    let _healthy = Worker::echo(&server, "w-healthy", 1);
    server.wait_capacity(ECHO).await;

    // A worker that says hello and then nothing at all.
    let bearer = format!("Bearer {}", token("w-silent", &["silent-model"], SECRET));
    let mut silent = raw_connect(&server.url(), Some(bearer), hello("w-silent", &["silent-model"], 1))
        .await
        .unwrap();
    server.wait_capacity("silent-model").await;
    server
        .dispatcher
        .assign(Assignment::new("job-stuck", 1, "silent-model", json!({})))
        .unwrap();

    let event = server
        .wait_for("lease expiry", |e| matches!(e, Event::WorkerLost { .. }))
        .await;
    assert_eq!(
        event,
        Event::WorkerLost {
            worker_id: "w-silent".into(),
            running_job_ids: vec!["job-stuck".into()],
        }
    );

    // The silent worker's stream was ended with UNAVAILABLE after its ack
    // and assignment.
    let mut kinds = Vec::new();
    let status = loop {
        match tokio::time::timeout(WAIT, silent.inbound.message()).await.unwrap() {
            Ok(Some(message)) => kinds.push(message.kind),
            Ok(None) => panic!("stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(matches!(kinds[0], Some(scheduler_message::Kind::HelloAck(_))));
    assert!(matches!(kinds[1], Some(scheduler_message::Kind::Assign(_))));

    // Several leases later the heartbeating worker is still there.
    tokio::time::sleep(lease * 5 / 2).await;
    let workers = server.dispatcher.workers();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].worker_id, "w-healthy");
    assert!(workers[0].last_seen < lease, "{workers:?}");
    while let Ok(event) = server.events.try_recv() {
        assert!(!matches!(event, Event::WorkerLost { .. }), "{event:?}");
    }
}

#[tokio::test]
async fn drain_finishes_the_running_job_and_takes_nothing_new() {
    let mut server = Server::start();
    let worker = Worker::echo(&server, "w-drain", 2);
    server.wait_capacity(ECHO).await;
    server
        .dispatcher
        .assign(Assignment::new("job-last", 1, ECHO, json!({"sleep_ms": 300})))
        .unwrap();

    // One slot taken, one free: the claim's count agrees with the summary.
    assert_eq!(server.dispatcher.free_slots(ECHO), 1);
    assert_eq!(server.dispatcher.health().models[ECHO].free_slots, 1);
    assert!(server.dispatcher.drain("w-drain"));
    assert!(!server.dispatcher.drain("nobody"));
    // A draining worker's free slot is not offered.
    assert_eq!(server.dispatcher.free_slots(ECHO), 0);
    assert_eq!(server.dispatcher.health().models[ECHO].free_slots, 0);
    assert_eq!(server.dispatcher.free_slots("no-such-model"), 0);
    assert_eq!(
        server.dispatcher.assign(Assignment::new("job-new", 1, ECHO, json!({}))),
        Err(AssignError::NoCapacity { model: ECHO.into() })
    );
    assert_eq!(server.dispatcher.health().models[ECHO].draining_workers, 1);

    assert!(matches!(server.terminal("job-last").await, Event::Completed { .. }));
    let event = server
        .wait_for("worker left", |e| matches!(e, Event::WorkerLost { .. }))
        .await;
    assert_eq!(
        event,
        Event::WorkerLost {
            worker_id: "w-drain".into(),
            running_job_ids: vec![],
        }
    );
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn shutdown_of_the_worker_process_drains_it() {
    let mut server = Server::start();
    let mut worker = Worker::echo(&server, "w-sigterm", 1);
    server.wait_capacity(ECHO).await;
    server
        .dispatcher
        .assign(Assignment::new(
            "job-running",
            1,
            ECHO,
            json!({"sleep_ms": 2000, "k": "v"}),
        ))
        .unwrap();
    // (2 s: the drain below must be seen while it still runs, on a loaded
    // machine too.) Shut down only once the job runs (echo reports progress before it
    // sleeps); a worker told to stop before its assignment arrives leaves
    // at once and the job is reported with WorkerLost instead.
    let progress = server.next_event().await;
    assert!(
        matches!(&progress, Event::Progress { job_id, message, .. } if job_id == "job-running" && *message == json!({"sleeping_ms": 2000})),
        "{progress:?}"
    );

    worker.request_shutdown();
    // The worker announces it is draining; from then on nothing is assigned.
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.dispatcher.health().models[ECHO].draining_workers == 0 {
        assert!(tokio::time::Instant::now() < deadline, "worker never said it drains");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    match server.terminal("job-running").await {
        Event::Completed { output, .. } => assert_eq!(output, json!({"sleep_ms": 2000, "k": "v"})),
        other => panic!("expected Completed, got {other:?}"),
    }
    assert_eq!(
        server.dispatcher.assign(Assignment::new("job-new", 1, ECHO, json!({}))),
        Err(AssignError::NoCapacity { model: ECHO.into() })
    );
    let event = server
        .wait_for("worker left", |e| matches!(e, Event::WorkerLost { .. }))
        .await;
    assert!(
        matches!(&event, Event::WorkerLost { running_job_ids, .. } if running_job_ids.is_empty()),
        "{event:?}"
    );
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn a_worker_reconnects_after_the_scheduler_restarts() {
    let mut first = Server::start();
    let _worker = Worker::echo(&first, "w-phoenix", 1);
    first.wait_capacity(ECHO).await;
    first
        .dispatcher
        .assign(Assignment::new("job-before", 1, ECHO, json!({"sleep_ms": 60_000})))
        .unwrap();

    let addr = first.kill();
    let mut second = Server::start_on(addr, config());
    second.wait_capacity(ECHO).await;
    assert_eq!(second.dispatcher.workers()[0].worker_id, "w-phoenix");
    // The job the crash interrupted was dropped: the whole slot is free.
    assert_eq!(second.dispatcher.workers()[0].free_slots, 1);

    second
        .dispatcher
        .assign(Assignment::new("job-after", 1, ECHO, json!({"again": true})))
        .unwrap();
    assert!(matches!(
        second.terminal("job-after").await,
        Event::Completed { output, .. } if output == json!({"again": true})
    ));
}

#[tokio::test]
async fn a_reconnecting_worker_replaces_its_old_stream() {
    let mut server = Server::start();
    let bearer = format!("Bearer {}", token("w-twin", &[ECHO], SECRET));
    let mut old = raw_connect(&server.url(), Some(bearer.clone()), hello("w-twin", &[ECHO], 1))
        .await
        .unwrap();
    server.wait_capacity(ECHO).await;
    server
        .dispatcher
        .assign(Assignment::new("job-orphan", 1, ECHO, json!({})))
        .unwrap();

    let _new = raw_connect(&server.url(), Some(bearer), hello("w-twin", &[ECHO], 1))
        .await
        .unwrap();
    let event = server
        .wait_for("old stream lost", |e| matches!(e, Event::WorkerLost { .. }))
        .await;
    assert_eq!(
        event,
        Event::WorkerLost {
            worker_id: "w-twin".into(),
            running_job_ids: vec!["job-orphan".into()],
        }
    );
    let status = loop {
        match tokio::time::timeout(WAIT, old.inbound.message()).await.unwrap() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("old stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(server.dispatcher.workers().len(), 1);
}

#[tokio::test]
async fn a_graceful_scheduler_shutdown_disconnects_workers_who_keep_retrying() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (dispatcher, mut events) = gantry_dispatch::Dispatcher::new(config());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(dispatcher.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    let worker = Worker::spawn(
        gantry_model_echo::EchoModel,
        crate::harness::worker_config(&url, "w-graceful", 1),
    );
    let joined = tokio::time::timeout(WAIT, events.recv()).await.unwrap().unwrap();
    assert_eq!(joined, Event::CapacityAvailable { model: ECHO.into() });

    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("serve did not return after shutdown")
        .unwrap()
        .unwrap();
    let lost = tokio::time::timeout(WAIT, events.recv()).await.unwrap().unwrap();
    assert_eq!(
        lost,
        Event::WorkerLost {
            worker_id: "w-graceful".into(),
            running_job_ids: vec![]
        }
    );
    assert!(dispatcher.workers().is_empty());
    // UNAVAILABLE is not fatal: the worker is still trying to come back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(worker.is_running());
}

/// An assignment the worker's heartbeats leave out twice in a row was never
/// run there (lost on the way, or dropped by the worker): it is failed for a
/// retry, its slot comes back, and the worker is told to stop it should it
/// turn up. A job the heartbeats list is left alone, and one omission alone
/// (a heartbeat written before the assignment was read) changes nothing.
#[tokio::test]
async fn a_job_the_workers_heartbeats_leave_out_is_failed_for_a_retry() {
    let mut server = Server::start();
    let bearer = format!("Bearer {}", token("w-forgetful", &["forgetful"], SECRET));
    let mut worker = raw_connect(&server.url(), Some(bearer), hello("w-forgetful", &["forgetful"], 2))
        .await
        .unwrap();
    server.wait_capacity("forgetful").await;
    for job in ["job-kept", "job-dropped"] {
        server
            .dispatcher
            .assign(Assignment::new(job, 1, "forgetful", json!({})))
            .unwrap();
    }
    assert_eq!(server.dispatcher.health().models["forgetful"].free_slots, 0);

    // One heartbeat without it: nothing yet. (The progress message after
    // it marks when the dispatcher has read it: one stream is read in order.)
    worker.heartbeat(&["job-kept"]).await;
    let progress = gantry_proto::v1::Progress {
        job_id: "job-kept".into(),
        attempt: 1,
        message_json: "{}".into(),
    };
    worker
        .out
        .send(gantry_proto::v1::WorkerMessage {
            kind: Some(gantry_proto::v1::worker_message::Kind::Progress(progress)),
        })
        .await
        .unwrap();
    let event = server
        .wait_for("progress", |e| {
            matches!(e, Event::Progress { .. } | Event::Failed { .. })
        })
        .await;
    assert!(matches!(event, Event::Progress { .. }), "{event:?}");
    assert!(server.dispatcher.not_running(["job-dropped".to_owned()]).is_empty());
    worker.heartbeat(&["job-kept", "job-dropped"]).await;
    worker.heartbeat(&["job-kept"]).await;
    // Two in a row: failed, retryable.
    worker.heartbeat(&["job-kept"]).await;
    let event = server
        .wait_for("the dropped job's failure", |e| matches!(e, Event::Failed { .. }))
        .await;
    let Event::Failed {
        job_id,
        attempt,
        worker_id,
        error,
        retryable,
    } = event
    else {
        unreachable!()
    };
    assert_eq!(
        (job_id.as_str(), attempt, worker_id.as_str()),
        ("job-dropped", 1, "w-forgetful")
    );
    assert!(retryable);
    assert!(error.contains("heartbeats"), "{error}");
    // Its slot is free again; the listed job still runs there.
    let workers = server.dispatcher.workers();
    assert_eq!(workers[0].running_job_ids, ["job-kept"]);
    assert_eq!(workers[0].free_slots, 1);
    assert_eq!(
        server
            .dispatcher
            .not_running(["job-kept".to_owned(), "job-dropped".to_owned()]),
        ["job-dropped"]
    );
    // The worker was told to stop it.
    let mut cancelled = None;
    while cancelled.is_none() {
        let message = tokio::time::timeout(WAIT, worker.inbound.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(scheduler_message::Kind::Cancel(cancel)) = message.kind {
            cancelled = Some(cancel.job_id);
        }
    }
    assert_eq!(cancelled.as_deref(), Some("job-dropped"));
    // Nothing else was reported of the listed job.
    while let Ok(event) = server.events.try_recv() {
        assert!(
            !matches!(&event, Event::Failed { job_id, .. } if job_id == "job-kept"),
            "{event:?}"
        );
    }
}
