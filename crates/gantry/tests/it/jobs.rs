use std::time::{Duration, Instant};

use reqwest::{Method, Response};
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    runsync_returns_the_output_with_its_cost,
    run_then_poll_until_completed,
    a_runsync_that_outlasts_wait_returns_the_id_to_poll,
    stream_chunks_arrive_in_order_then_complete,
    cancel_a_running_job,
    bad_input_fails_is_retryable_and_costs_nothing,
    request_rules_and_ownership,
    nul_characters_are_stored_safely_and_harm_no_other_job,
);

impl TestApp {
    pub fn public(&self, method: Method, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.public_base, path))
            .bearer_auth(key)
    }

    pub async fn submit(&self, endpoint: &str, key: &str, body: Value) -> Response {
        self.public(Method::POST, &format!("/v2/gantry-echo/{endpoint}"), key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A request to the public listener that must answer 200 with JSON.
    pub async fn public_ok(&self, method: Method, path: &str, key: &str) -> Value {
        let res = self.public(method, path, key).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        res.json().await.unwrap()
    }

    /// Polls the status until the job is final (at most 20 s).
    pub async fn until_final(&self, key: &str, id: &str) -> Value {
        let started = Instant::now();
        loop {
            let res = self
                .public(Method::GET, &format!("/v2/gantry-echo/status/{id}"), key)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            let job: Value = res.json().await.unwrap();
            if !["IN_QUEUE", "IN_PROGRESS"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "job {id} never finished: {job}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn runsync_returns_the_output_with_its_cost(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app
        .submit("runsync", &key, json!({"input": {"prompt": "hello", "n": 3}}))
        .await;
    assert_eq!(res.status(), 200);
    let job: Value = res.json().await.unwrap();
    assert_eq!(job["status"], "COMPLETED", "{job}");
    assert_eq!(job["output"]["prompt"], "hello");
    assert_eq!(job["output"]["n"], 3);
    assert!(
        job["output"]["cost"].as_f64().is_some_and(|c| c > 0.0),
        "cost in USD: {job}"
    );
    assert!(job["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(job["workerId"].as_str().is_some_and(|w| w.starts_with("gantry-echo")));
    assert!(job["delayTime"].is_u64() && job["executionTime"].is_u64());
    // What the worker reported of the attempt, by phase.
    for phase in ["queueMs", "loadMs", "runMs"] {
        assert!(
            job["workerTimings"][phase].as_f64().is_some_and(|ms| ms >= 0.0),
            "{phase}: {job}"
        );
    }
    // The same job is visible through status, as it was stored.
    let id = job["id"].as_str().unwrap();
    let again: Value = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
        .await;
    assert_eq!(again["output"], job["output"]);
    assert_eq!(again["workerTimings"], job["workerTimings"]);
}

async fn run_then_poll_until_completed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app.submit("run", &key, json!({"input": {"sleep_ms": 200}})).await;
    assert_eq!(res.status(), 200);
    let queued: Value = res.json().await.unwrap();
    assert_eq!(queued["status"], "IN_QUEUE");
    assert_eq!(queued.as_object().unwrap().len(), 2, "just {{id, status}}: {queued}");
    let job = app.until_final(&key, queued["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "COMPLETED");
    assert!(job["executionTime"].as_u64().unwrap() >= 150, "{job}");
    // The worker ran it for its 200 ms sleep, and said so.
    assert!(
        job["workerTimings"]["runMs"].as_f64().is_some_and(|ms| ms >= 150.0),
        "{job}"
    );
    let health: Value = app.public_ok(Method::GET, "/v2/gantry-echo/health", &key).await;
    assert_eq!(health["jobs"]["completed"], 1, "{health}");
    assert_eq!(health["jobs"]["inQueue"], 0);
    assert_eq!(health["workers"]["idle"], 1, "{health}");
}

async fn a_runsync_that_outlasts_wait_returns_the_id_to_poll(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app
        .public(Method::POST, "/v2/gantry-echo/runsync?wait=1000", &key)
        .json(&json!({"input": {"sleep_ms": 2500}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let pending: Value = res.json().await.unwrap();
    // Not final, with the id to poll (IN_QUEUE if the bundled worker was
    // still connecting on a loaded machine).
    assert!(
        matches!(pending["status"].as_str(), Some("IN_PROGRESS" | "IN_QUEUE")),
        "{pending}"
    );
    assert_eq!(pending.as_object().unwrap().len(), 2, "just {{id, status}}: {pending}");
    let job = app.until_final(&key, pending["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "COMPLETED");
}

async fn stream_chunks_arrive_in_order_then_complete(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let queued: Value = app
        .submit("run", &key, json!({"input": {"stream": 5}}))
        .await
        .json()
        .await
        .unwrap();
    let id = queued["id"].as_str().unwrap();
    let mut chunks = Vec::new();
    let started = Instant::now();
    loop {
        let res = app
            .public(Method::GET, &format!("/v2/gantry-echo/stream/{id}"), &key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let page: Value = res.json().await.unwrap();
        let stream = page["stream"].as_array().expect("always a stream array");
        chunks.extend(stream.iter().map(|c| c["output"]["chunk"].as_u64().unwrap()));
        if page["status"] == "COMPLETED" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(chunks, (0..5).collect::<Vec<_>>(), "every chunk once, in order");
    let after: Value = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/stream/{id}"), &key)
        .await;
    assert_eq!(after["stream"], json!([]), "chunks are read once");
}

async fn cancel_a_running_job(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let queued: Value = app
        .submit("run", &key, json!({"input": {"sleep_ms": 30000}}))
        .await
        .json()
        .await
        .unwrap();
    let id = queued["id"].as_str().unwrap();
    let started = Instant::now();
    loop {
        let job: Value = app
            .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
            .await;
        if job["status"] == "IN_PROGRESS" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let res = app
        .public(Method::POST, &format!("/v2/gantry-echo/cancel/{id}"), &key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let cancelled: Value = res.json().await.unwrap();
    assert_eq!(cancelled["status"], "CANCELLED");
    let job = app.until_final(&key, id).await;
    assert_eq!(job["status"], "CANCELLED");
    assert!(job.get("output").is_none());
    // The worker's slot comes back: a new job runs.
    let res = app.submit("runsync", &key, json!({"input": {"x": 1}})).await;
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "COMPLETED");
}

async fn bad_input_fails_is_retryable_and_costs_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job: Value = app
        .submit("runsync", &key, json!({"input": {"fail": "bad prompt"}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(job["status"], "FAILED", "{job}");
    assert!(job["error"].as_str().is_some_and(|e| e.contains("bad prompt")), "{job}");
    assert!(job.get("output").is_none(), "a failed job has no output and no cost");
    assert!(
        job.get("workerTimings").is_none(),
        "only a completed job shows them: {job}"
    );
    let id = job["id"].as_str().unwrap();
    let res = app
        .public(Method::POST, &format!("/v2/gantry-echo/retry/{id}"), &key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let retried: Value = res.json().await.unwrap();
    assert_eq!(retried["id"], id, "same id");
    assert_eq!(
        app.until_final(&key, id).await["status"],
        "FAILED",
        "same input, same outcome"
    );

    let done: Value = app
        .submit("runsync", &key, json!({"input": {}}))
        .await
        .json()
        .await
        .unwrap();
    let done_id = done["id"].as_str().unwrap();
    let res = app
        .public(Method::POST, &format!("/v2/gantry-echo/retry/{done_id}"), &key)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(res, 409).await["title"], "Conflict");
}

async fn request_rules_and_ownership(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.scheduler.bundled_workers.clear()).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let (_, other) = app.user_with_key("endpoints:run").await;
    let (_, reader) = app.user_with_key("read-only").await;

    problem(app.submit("run", &reader, json!({"input": {}})).await, 403).await;
    let unknown = app
        .public(Method::POST, "/v2/no-such-model/run", &key)
        .json(&json!({"input": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(unknown, 404).await["detail"], "model 'no-such-model' not found");

    let res = app.submit("run", &key, json!({"input": "text", "webhook": "ftp://x", "policy": {"ttl": 0, "lowPriority": "yes", "speed": 1}, "extra": 1})).await;
    let errors = errors_of(&problem(res, 422).await);
    for expected in [
        "$.extra: unknown property",
        "$.input: must be a JSON object, not a string",
        "$.webhook: must be an http or https URL",
        "$.policy.speed: unknown property",
        "$.policy.ttl: must be a positive integer (milliseconds)",
        "$.policy.lowPriority: must be a boolean, not a string",
    ] {
        assert!(
            errors.contains(&expected.to_string()),
            "missing {expected:?} in {errors:?}"
        );
    }
    problem(app.submit("run", &key, json!({})).await, 422).await;
    let res = app
        .public(Method::POST, "/v2/gantry-echo/runsync?wait=5", &key)
        .json(&json!({"input": {}}))
        .send()
        .await
        .unwrap();
    problem(res, 400).await;

    // 10 MB for /run, 20 MB for /runsync.
    let big = json!({"input": {"blob": "x".repeat(11 * 1024 * 1024)}});
    problem(app.submit("run", &key, big.clone()).await, 413).await;
    let huge = json!({"input": {"blob": "x".repeat(21 * 1024 * 1024)}});
    problem(
        app.public(Method::POST, "/v2/gantry-echo/runsync?wait=1000", &key)
            .json(&huge)
            .send()
            .await
            .unwrap(),
        413,
    )
    .await;

    // No worker runs here: jobs stay queued, and only their owner sees them.
    let queued: Value = app
        .submit("run", &key, json!({"input": {"n": 1}}))
        .await
        .json()
        .await
        .unwrap();
    let id = queued["id"].as_str().unwrap();
    let theirs = app
        .public(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &other)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(theirs, 404).await["detail"], "job not found");
    problem(
        app.public(Method::POST, &format!("/v2/gantry-echo/cancel/{id}"), &other)
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    app.submit("run", &key, json!({"input": {"n": 2}})).await;
    app.submit("run", &other, json!({"input": {"n": 3}})).await;
    let purged: Value = app.public_ok(Method::POST, "/v2/gantry-echo/purge-queue", &key).await;
    assert_eq!(
        purged,
        json!({"removed": 2, "status": "completed"}),
        "only the caller's queued jobs"
    );
    let purged_job: Value = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
        .await;
    assert_eq!(
        purged_job["status"], "CANCELLED",
        "a purged job reads as cancelled until its retention ends"
    );
    let health: Value = app.public_ok(Method::GET, "/v2/gantry-echo/health", &other).await;
    assert_eq!(health["jobs"]["inQueue"], 1, "{health}");
    assert_eq!(health["workers"], json!({"idle": 0, "running": 0}));
    // Each caller counts only its own jobs: the other user's queued job is not the caller's.
    let own: Value = app.public_ok(Method::GET, "/v2/gantry-echo/health", &key).await;
    assert_eq!(own["jobs"]["inQueue"], 0, "{own}");
}

/// A NUL character (which PostgreSQL's text type cannot hold) in a job's
/// input, error or output is stored safely, and the other jobs of the same
/// settlement are not affected.
async fn nul_characters_are_stored_safely_and_harm_no_other_job(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let bad = app.submit("run", &key, json!({"input": {"fail": "bad\u{0}news"}}));
    let echoed = app.submit("run", &key, json!({"input": {"text": "nul \u{0} inside", "stream": 2}}));
    let plain = app.submit("run", &key, json!({"input": {"prompt": "fine"}}));
    let (bad, echoed, plain) = tokio::join!(bad, echoed, plain);
    let mut ids = Vec::new();
    for res in [bad, echoed, plain] {
        assert_eq!(res.status(), 200);
        ids.push(res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let started = Instant::now();
    let failed = app.until_final(&key, &ids[0]).await;
    assert_eq!(failed["status"], "FAILED", "{failed}");
    assert_eq!(failed["error"], "bad input: bad\\u0000news", "the NUL is escaped");
    let echoed = app.until_final(&key, &ids[1]).await;
    assert_eq!(echoed["status"], "COMPLETED", "{echoed}");
    assert_eq!(echoed["output"]["text"], "nul \u{0} inside", "JSON keeps it exactly");
    let stream: Value = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/stream/{}", ids[1]), &key)
        .await;
    assert_eq!(stream["stream"].as_array().unwrap().len(), 2);
    assert_eq!(app.until_final(&key, &ids[2]).await["status"], "COMPLETED");
    assert!(started.elapsed() < Duration::from_secs(10), "no job waited for a lease");
    // A webhook URL with a control character is refused before anything is written.
    let res = app
        .submit(
            "run",
            &key,
            json!({"input": {}, "webhook": "http://example.test/\u{0}"}),
        )
        .await;
    let body = problem(res, 422).await;
    assert!(errors_of(&body).iter().any(|e| e.contains("webhook")), "{body}");
}

/// Webhooks never reach loopback, private or link-local addresses unless the
/// operator allows the range: IP literals in any spelling are refused at
/// submit, and a name is refused on the address it resolves to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_to_internal_addresses_are_refused() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.scheduler.webhook_allow_ranges.clear()).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://[::ffff:127.0.0.1]/",
        "http://0x7f000001/",
        "http://user:pw@127.0.0.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        "http://[::1]/",
    ] {
        let res = app.submit("run", &key, json!({"input": {}, "webhook": url})).await;
        let body = problem(res, 422).await;
        assert!(errors_of(&body).iter().any(|e| e.contains("webhook")), "{url}: {body}");
    }
    // A name that resolves to loopback: accepted (names resolve later), never delivered.
    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = receiver.local_addr().unwrap().port();
    let res = app
        .submit(
            "run",
            &key,
            json!({"input": {}, "webhook": format!("http://localhost:{port}/hook")}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(app.until_final(&key, &id).await["status"], "COMPLETED");
    let connected = tokio::time::timeout(Duration::from_secs(2), receiver.accept()).await;
    assert!(connected.is_err(), "the webhook reached a loopback address");
}
