//! The defects an outside probe of the running system found, each asked
//! again the way the probe asked it: NUL characters where PostgreSQL's text
//! cannot hold them, response bodies that look like the server's own error
//! answers, caller-chosen media types, oversized output files, and the small
//! protocol cases (ranges of an empty file, two `Authorization` headers, a
//! policy given as an array).
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    a_nul_in_a_media_type_stalls_no_tenant,
    a_nul_in_an_id_is_not_found,
    output_files_past_the_limits_fail_their_job_for_good,
);

/// The probe repeated a job whose file's media type holds a NUL while
/// another user ran `runsync` jobs: on PostgreSQL each of those waited for a
/// lease, ran three times and failed. Now the type is stored as plain bytes,
/// and the other user's jobs go through at once.
async fn a_nul_in_a_media_type_stalls_no_tenant(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, prober) = app.user_with_key("endpoints:run").await;
    let (_, other) = app.user_with_key("endpoints:run").await;
    let started = Instant::now();
    let mut probes = Vec::new();
    for _ in 0..5 {
        let res = app
            .submit(
                "run",
                &prober,
                json!({"input": {"file": {"text": "x", "media_type": "a\u{0}"}}}),
            )
            .await;
        assert_eq!(res.status(), 200);
        probes.push(res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
        let job: Value = app
            .submit("runsync", &other, json!({"input": {"n": probes.len()}}))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(job["status"], "COMPLETED", "{job}");
    }
    for id in &probes {
        let job = app.until_final(&prober, id).await;
        assert_eq!(job["status"], "COMPLETED", "{job}");
        let res = app
            .client
            .get(job["output"]["file_url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "application/octet-stream");
        assert_eq!(res.bytes().await.unwrap().as_ref(), b"x");
    }
    // Not one job waited for a lease (60 s) to be requeued.
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}

/// `%00` in a job or volume id is a 404 on both databases, never a 500.
async fn a_nul_in_an_id_is_not_found(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run,volumes:read,volumes:write").await;
    for (method, path) in [
        (Method::GET, "/v2/gantry-echo/status/%00"),
        (Method::GET, "/v2/gantry-echo/stream/%00"),
        (Method::POST, "/v2/gantry-echo/cancel/%00"),
        (Method::POST, "/v2/gantry-echo/retry/a%00b"),
        (Method::GET, "/v2/gantry-echo%00/status/x"),
    ] {
        let res = app.public(method.clone(), path, &key).send().await.unwrap();
        problem(res, 404).await;
    }
    for method in [Method::GET, Method::DELETE] {
        problem(
            app.request(method, "/v2/network-volumes/%00", Some(&key))
                .send()
                .await
                .unwrap(),
            404,
        )
        .await;
    }
    let res = app
        .send_json(Method::PATCH, "/v2/network-volumes/x%00", &key, &json!({"name": "n"}))
        .await;
    problem(res, 404).await;
}

/// The server's bodiless 400, 408 and 431 answers are rewritten as problems;
/// a file whose bytes are exactly such an answer is served byte for byte,
/// twice on one connection, and the next response on it is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_looks_like_an_error_answer_is_served_as_it_is() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // One connection for everything below.
    let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    for head in [
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
    ] {
        let job = app
            .echo_file_job(&key, json!({"text": head, "media_type": "text/plain"}))
            .await;
        let url = job["output"]["file_url"].as_str().unwrap().to_owned();
        for _ in 0..2 {
            let res = client.get(&url).send().await.unwrap();
            assert_eq!(res.status(), 200);
            assert_eq!(res.headers()["content-type"], "text/plain");
            assert_eq!(res.bytes().await.unwrap().as_ref(), head.as_bytes());
            let health = client
                .get(format!("{}/v2/gantry-echo/health", app.public_base))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(health.status(), 200);
            health.json::<Value>().await.expect("an intact JSON answer");
        }
    }
}

/// Only the media types a browser may show as themselves are served so;
/// any other (HTML, SVG, a CRLF that would split the header) is an
/// attachment of plain bytes. Every file is `nosniff` and sandboxed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_chosen_media_types_never_render_on_the_platform() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for (asked, served, attachment) in [
        ("image/png", "image/png", false),
        ("audio/ogg; codecs=opus", "audio/ogg; codecs=opus", false),
        ("text/html", "application/octet-stream", true),
        ("image/svg+xml", "application/octet-stream", true),
        ("text/plain\r\nx-evil: 1", "application/octet-stream", true),
        ("", "application/octet-stream", true),
    ] {
        let job = app
            .echo_file_job(&key, json!({"text": "<script>alert(1)</script>", "media_type": asked}))
            .await;
        assert_eq!(job["status"], "COMPLETED", "{job}");
        let res = app
            .client
            .get(job["output"]["file_url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{asked:?}");
        let headers = res.headers();
        assert_eq!(headers["content-type"], served, "{asked:?}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["content-security-policy"], "sandbox");
        assert!(headers.get("x-evil").is_none());
        assert_eq!(
            headers
                .get("content-disposition")
                .map(|v| v.to_str().unwrap().to_owned()),
            attachment.then(|| "attachment".to_owned()),
            "{asked:?}"
        );
    }
}

/// A range of an empty file cannot be satisfied: 416, even for a suffix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_range_of_an_empty_file_can_be_satisfied() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app.echo_file_job(&key, json!({"text": ""})).await;
    let url = job["output"]["file_url"].as_str().unwrap();
    let whole = app.client.get(url).send().await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["content-length"], "0");
    for range in ["bytes=-5", "bytes=0-", "bytes=0-0"] {
        let res = app.client.get(url).header("range", range).send().await.unwrap();
        assert_eq!(res.headers()["content-range"], "bytes */0", "{range}");
        problem(res, 416).await;
    }
}

/// Two `Authorization` headers are a 400, whichever of them is valid; a
/// `policy` that is not an object is refused, not read field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_and_a_policy_array_are_refused() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run,volumes:read").await;
    for headers in [
        [key.as_str(), "gk_nope"],
        ["gk_nope", key.as_str()],
        [key.as_str(), key.as_str()],
    ] {
        let res = app
            .client
            .get(format!("{}/v2/network-volumes", app.base))
            .header("authorization", format!("Bearer {}", headers[0]))
            .header("authorization", format!("Bearer {}", headers[1]))
            .send()
            .await
            .unwrap();
        let body = problem(res, 400).await;
        assert!(errors_of(&body).iter().any(|e| e.contains("Authorization")), "{body}");
    }
    let res = app.submit("run", &key, json!({"input": {}, "policy": [5]})).await;
    let body = problem(res, 422).await;
    assert!(errors_of(&body).iter().any(|e| e.contains("policy")), "{body}");
    // An object still works.
    let res = app
        .submit(
            "runsync",
            &key,
            json!({"input": {}, "policy": {"executionTimeout": 5000}}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
}

/// Output files past `files.max_file_bytes` or `files.max_job_bytes` fail
/// the job for good (one attempt, no charge) and nothing of them is kept.
async fn output_files_past_the_limits_fail_their_job_for_good(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| {
        s.files.max_file_bytes = 100_000;
        s.files.max_job_bytes = 150_000;
    })
    .await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app
        .echo_file_job(&key, json!({"text": "0123456789", "repeat": 10_001}))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    let error = job["error"].as_str().unwrap();
    assert!(error.contains("larger than 100000 bytes"), "{error}");
    let id = job["id"].as_str().unwrap();
    let once = format!("SELECT COUNT(*) FROM jobs WHERE id = '{id}' AND attempt = 1 AND retries = 0");
    assert_eq!(app.count(&once).await, 1, "one attempt, never retried");
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 0);
    // Within the bound: stored.
    let job = app
        .echo_file_job(&key, json!({"text": "0123456789", "repeat": 10_000}))
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    assert_eq!(app.count("SELECT COUNT(*) FROM files").await, 1);
}

/// `files.max_job_bytes` bounds all the files of a job together, even when
/// each is within `files.max_file_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_files_past_the_job_limit_fail_their_job_for_good() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| {
        s.files.max_file_bytes = 200_000;
        s.files.max_job_bytes = 150_000;
    })
    .await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app
        .echo_file_job(&key, json!({"text": "0123456789", "repeat": 16_000}))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    let error = job["error"].as_str().unwrap();
    assert!(
        error.contains("larger than 150000 bytes, the most one job may store"),
        "{error}"
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 0);
    assert_eq!(app.count("SELECT COUNT(*) FROM files").await, 0);
}
