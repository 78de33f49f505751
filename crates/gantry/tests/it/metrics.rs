//! `GET /metrics`: parsed by the official Prometheus Python client's parser,
//! with the queue depth following submitted jobs and the usage and dollars
//! of completed ones.
use std::io::Write;
use std::process::{Command, Stdio};

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};

/// Every sample of the app's metrics, as parsed by prometheus_client.
async fn scrape(app: &TestApp) -> Vec<Value> {
    let res = app.client.get(format!("{}/metrics", app.base)).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "the Prometheus text format"
    );
    let text = res.text().await.unwrap();
    parse(&text)
}

/// Every sample of a Prometheus text exposition, as prometheus_client parses it.
pub(crate) fn parse(text: &str) -> Vec<Value> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parse_metrics.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the parser refused the exposition (install it with `pip install prometheus-client`):\n{}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

pub(crate) fn value(samples: &[Value], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][*k] == *v))
        .map(|s| s["value"].as_f64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_is_valid_prometheus_text() {
    // No worker: submitted jobs stay queued.
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.scheduler.bundled_workers.clear()).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let before = scrape(&app).await;
    assert_eq!(
        value(&before, "gantry_queue_depth", &[("model", "gantry-echo")]),
        Some(0.0)
    );
    for _ in 0..3 {
        let res = app.submit("run", &key, json!({"input": {}})).await;
        assert_eq!(res.status(), 200);
    }
    let after = scrape(&app).await;
    assert_eq!(
        value(&after, "gantry_queue_depth", &[("model", "gantry-echo")]),
        Some(3.0)
    );
    assert_eq!(
        value(
            &after,
            "gantry_jobs",
            &[("model", "gantry-echo"), ("status", "IN_QUEUE")]
        ),
        Some(3.0)
    );
    assert!(
        value(&after, "gantry_queue_oldest_age_seconds", &[("model", "gantry-echo")]).is_some_and(|age| age >= 0.0)
    );
    // The request, limiter and latency figures are the process's (other tests of
    // this binary count too): compare before and after.
    let route = [("route", "/v2/{model_id}/run"), ("method", "POST"), ("status", "200")];
    let runs = |samples: &[Value]| value(samples, "gantry_http_requests_total", &route).unwrap_or(0.0);
    assert!(runs(&after) - runs(&before) >= 3.0, "by route pattern, not path");
    assert!(
        value(
            &after,
            "gantry_ratelimit_decisions_total",
            &[("listener", "public"), ("decision", "allowed")]
        )
        .is_some_and(|n| n >= 3.0)
    );
    assert!(
        value(
            &after,
            "gantry_http_request_duration_seconds_count",
            &[("route", "/v2/{model_id}/run"), ("method", "POST")]
        )
        .is_some_and(|n| n >= 3.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_jobs_show_in_usage_dollars_and_latency() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for n in 0..2 {
        // One of them returns an output file of 5 bytes.
        let input = if n == 0 {
            json!({"file": {"text": "bytes"}})
        } else {
            json!({})
        };
        let job: Value = app
            .public(Method::POST, "/v2/gantry-echo/runsync", &key)
            .json(&json!({"input": input}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(job["status"], "COMPLETED");
    }
    let samples = scrape(&app).await;
    let echo = [("model", "gantry-echo")];
    assert_eq!(
        value(
            &samples,
            "gantry_units_produced_total",
            &[("model", "gantry-echo"), ("unit", "requests")]
        ),
        Some(2.0)
    );
    assert_eq!(value(&samples, "gantry_charged_usd_total", &echo), Some(0.00002));
    assert_eq!(value(&samples, "gantry_files_stored", &[]), Some(1.0));
    assert_eq!(value(&samples, "gantry_files_stored_bytes", &[]), Some(5.0));
    // Observed by every scheduler of this test process: at least this app's two.
    assert!(value(&samples, "gantry_job_execution_seconds_count", &echo).is_some_and(|n| n >= 2.0));
    // What the worker reported of each job is kept, by phase.
    for phase in ["queue", "load", "run"] {
        let labels = [("model", "gantry-echo"), ("phase", phase)];
        assert!(
            value(&samples, "gantry_job_worker_seconds_count", &labels).is_some_and(|n| n >= 2.0),
            "{phase}"
        );
    }
    let run = [("model", "gantry-echo"), ("phase", "run")];
    assert!(value(&samples, "gantry_job_worker_seconds_sum", &run).is_some_and(|s| s > 0.0));
    assert_eq!(
        value(
            &samples,
            "gantry_workers",
            &[("model", "gantry-echo"), ("state", "idle")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "gantry_worker_slots",
            &[("model", "gantry-echo"), ("state", "free")]
        ),
        Some(16.0)
    );
}
