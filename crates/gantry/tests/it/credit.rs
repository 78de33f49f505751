//! Credit: jobs are admitted only while their owner has credit, completed jobs
//! are debited exactly their cost once, failed ones nothing, and jobs racing
//! for the last credit never overdraw by more than one job's cost.
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::gantry;
use crate::harness::{Backend, TestApp, problem};

gantry_testkit::on_both_backends!(
    credit_gates_jobs_and_pays_for_exactly_what_ran,
    jobs_racing_for_the_last_credit_never_overdraw,
    runsyncs_racing_for_the_last_credit_never_overdraw,
);

/// Credit required (the default), and users who start with none.
async fn with_credit(backend: Backend) -> TestApp {
    let mut app = TestApp::spawn_with(backend, |s| s.billing.require_credit = true).await;
    app.starting_credit_micro_usd = 0;
    app
}

impl TestApp {
    pub(crate) async fn balance(&self, key: &str) -> Value {
        let res = self.get("/v2/billing/balance", key).await;
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }

    pub(crate) fn add_credit(&self, email: &str, usd: &str) -> String {
        let out = gantry(self, &["users", "add-credit", email, usd]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

async fn credit_gates_jobs_and_pays_for_exactly_what_ran(backend: Backend) {
    let app = with_credit(backend).await;
    let (email, key) = app.user_with_key("endpoints:run billing:read").await;

    // No credit: 402, and nothing is queued.
    let res = app.submit("runsync", &key, json!({"input": {"n": 1}})).await;
    let body = problem(res, 402).await;
    assert!(body["detail"].as_str().unwrap().contains("credit"), "{body}");
    let res = app.submit("run", &key, json!({"input": {"n": 1}})).await;
    problem(res, 402).await;
    assert_eq!(app.count("SELECT COUNT(*) FROM jobs").await, 0);
    let balance = app.balance(&key).await;
    assert_eq!(balance["balanceUsd"], "0.000000");
    assert_eq!(balance["availableUsd"], "0.000000");
    assert_eq!(balance["creditRequired"], true);

    // Bad amounts change nothing.
    for bad in ["-1", "0", "1.0000001", "ten"] {
        let out = gantry(&app, &["users", "add-credit", &email, bad]);
        assert!(!out.status.success(), "{bad}");
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM credit_entries").await, 0);

    // 50 micro-dollars: five echo jobs (10 µUSD each).
    assert_eq!(app.add_credit(&email, "0.00005"), "0.000050");
    for n in 0..3 {
        let res = app.submit("runsync", &key, json!({"input": {"n": n}})).await;
        let job: Value = res.json().await.unwrap();
        assert_eq!(job["status"], "COMPLETED", "{job}");
    }
    // A failed job costs nothing.
    let res = app.submit("runsync", &key, json!({"input": {"fail": "no"}})).await;
    let job: Value = res.json().await.unwrap();
    assert_eq!(job["status"], "FAILED", "{job}");
    let balance = app.balance(&key).await;
    assert_eq!(balance["balanceUsd"], "0.000020", "{balance}");
    assert_eq!(balance["heldUsd"], "0.000000", "{balance}");

    // Two more fit; the next one is refused.
    for n in 0..2 {
        let res = app.submit("runsync", &key, json!({"input": {"more": n}})).await;
        assert_eq!(res.json::<Value>().await.unwrap()["status"], "COMPLETED");
    }
    problem(app.submit("runsync", &key, json!({"input": {}})).await, 402).await;
    assert_eq!(app.balance(&key).await["balanceUsd"], "0.000000");

    // The ledger says the same: five charges of 10, one credit entry of 50.
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 5);
    assert_eq!(
        app.count("SELECT CAST(SUM(amount_micro_usd) AS BIGINT) FROM ledger_entries")
            .await,
        50
    );
    assert_eq!(
        app.count("SELECT CAST(SUM(amount_micro_usd) AS BIGINT) FROM credit_entries")
            .await,
        50
    );

    // A retry of the failed job needs credit too.
    let failed = job["id"].as_str().unwrap();
    let res = app
        .public(Method::POST, &format!("/v2/gantry-echo/retry/{failed}"), &key)
        .send()
        .await
        .unwrap();
    problem(res, 402).await;
}

/// 64 echo jobs of 300 ms submitted at once through `route`: each answer's
/// status and body.
async fn race(app: &TestApp, key: &str, route: &str) -> Vec<(u16, Value)> {
    let submits = (0..64).map(|n| async move {
        let res = app
            .submit(route, key, json!({"input": {"n": n, "sleep_ms": 300}}))
            .await;
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        (status, body)
    });
    futures_util::future::join_all(submits).await
}

async fn jobs_racing_for_the_last_credit_never_overdraw(backend: Backend) {
    let app = with_credit(backend).await;
    let (email, key) = app.user_with_key("endpoints:run billing:read").await;
    // 35 µUSD: three echo jobs and half of a fourth.
    app.add_credit(&email, "0.000035");
    let answers = race(&app, &key, "run").await;
    let admitted: Vec<String> = answers
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, body)| body["id"].as_str().unwrap().to_owned())
        .collect();
    let refused = answers.iter().filter(|(status, _)| *status == 402).count();
    assert_eq!(admitted.len() + refused, 64, "only 200 or 402: {answers:?}");
    // Admitted while credit was left after every earlier hold: 35, 25, 15, 5.
    assert_eq!(admitted.len(), 4, "{answers:?}");

    let deadline = Instant::now() + Duration::from_secs(30);
    for id in &admitted {
        loop {
            let job = app
                .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
                .await;
            if job["status"] == "COMPLETED" {
                break;
            }
            assert!(Instant::now() < deadline, "{job}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // One job's cost below zero at most, never more; charged once each.
    let balance = app.balance(&key).await;
    assert_eq!(balance["balanceUsd"], "-0.000005", "{balance}");
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 4);
    problem(app.submit("run", &key, json!({"input": {}})).await, 402).await;
}

/// The same race through `runsync`, where the jobs the scheduler takes at
/// once run unwritten (on SQLite their holds are reserved in the writer
/// thread, on PostgreSQL they are written at admission): the holds of both
/// kinds count against each other, and each job is charged once.
async fn runsyncs_racing_for_the_last_credit_never_overdraw(backend: Backend) {
    let app = with_credit(backend).await;
    let (email, key) = app.user_with_key("endpoints:run billing:read").await;
    app.add_credit(&email, "0.000035");
    let answers = race(&app, &key, "runsync").await;
    let completed = answers
        .iter()
        .filter(|(status, body)| *status == 200 && body["status"] == "COMPLETED")
        .count();
    let refused = answers.iter().filter(|(status, _)| *status == 402).count();
    assert_eq!(completed + refused, 64, "only results or 402: {answers:?}");
    assert_eq!(completed, 4, "{answers:?}");
    let balance = app.balance(&key).await;
    assert_eq!(balance["balanceUsd"], "-0.000005", "{balance}");
    assert_eq!(balance["heldUsd"], "0.000000", "{balance}");
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 4);
    problem(app.submit("runsync", &key, json!({"input": {}})).await, 402).await;
}
