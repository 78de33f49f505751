//! Billing history: buckets that add up exactly to the ledger, and network
//! volume storage charged by the started hour over a simulated clock.
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    billing_buckets_add_up_to_the_ledger,
    storage_accrues_by_the_hour_until_deletion,
);

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn micros(amount: &Value) -> i64 {
    (amount.as_f64().unwrap_or_else(|| panic!("{amount}")) * 1e6).round() as i64
}

fn rfc3339(ms: i64) -> String {
    gantry_billing::history::format_rfc3339(ms)
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

impl TestApp {
    async fn user_id(&self, email: &str) -> String {
        self.auth.find_user(email).await.unwrap().id
    }

    async fn billing(&self, path: &str, key: &str) -> Value {
        let res = self.get(path, key).await;
        assert_eq!(res.status(), 200, "{path}");
        res.json().await.unwrap()
    }
}

async fn billing_buckets_add_up_to_the_ledger(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (email, key) = app.user_with_key("endpoints:run billing:read").await;
    let user = app.user_id(&email).await;
    // Five real jobs now (10 µUSD each) ...
    for n in 0..5 {
        let res = app.submit("runsync", &key, json!({"input": {"n": n}})).await;
        assert_eq!(res.json::<Value>().await.unwrap()["status"], "COMPLETED");
    }
    // ... and charges on earlier days, one on a day boundary (it belongs to
    // the later day: buckets are half-open).
    let today = gantry_billing::history::BucketSize::Day.floor(now_ms());
    for (i, (at, amount)) in [
        (today - 3 * DAY + 5, 1_000),
        (today - 2 * DAY, 2_500),
        (today - DAY - 1, 7),
    ]
    .into_iter()
    .enumerate()
    {
        app.sql(&format!(
            "INSERT INTO ledger_entries (id, user_id, job_id, model, unit, quantity_micros, amount_micro_usd, created_at) \
             VALUES ('le_past{i}', '{user}', 'past{i}', 'gantry-echo', 'requests', 1000000, {amount}, {at})"
        ))
        .await;
    }
    // Another user's charges are not ours.
    app.sql(&format!(
        "INSERT INTO ledger_entries (id, user_id, job_id, model, unit, quantity_micros, amount_micro_usd, created_at) \
         VALUES ('le_other', 'someone-else', 'other', 'gantry-echo', 'requests', 1000000, 999, {})",
        today - DAY
    ))
    .await;

    let start = rfc3339(today - 3 * DAY);
    let end = rfc3339(today + DAY);
    let body = app
        .billing(
            &format!("/v2/billing/endpoints?startTime={start}&endTime={end}&bucketSize=day"),
            &key,
        )
        .await;
    let records = body["records"].as_array().unwrap();
    let amounts: Vec<i64> = records.iter().map(|r| micros(&r["totalAmount"])).collect();
    assert_eq!(amounts, [1_000, 2_507, 0, 50], "{body}");
    assert_eq!(records[0]["startTime"], start);
    assert_eq!(records[3]["endTime"], end);
    assert_eq!(body["metadata"]["recordCount"], 4);
    assert_eq!(micros(&body["metadata"]["totals"]["totalAmount"]), 3_557);
    assert_eq!(body["metadata"]["query"]["bucketSize"], "day");
    // The sum equals the ledger's, to the micro-dollar.
    let ledger = app
        .count(&format!(
            "SELECT CAST(SUM(amount_micro_usd) AS BIGINT) FROM ledger_entries WHERE user_id = '{user}'"
        ))
        .await;
    assert_eq!(amounts.iter().sum::<i64>(), ledger);

    // The same window in hours: 96 records, the same total; `lastN` counts back from now.
    let hourly = app
        .billing(
            &format!("/v2/billing/endpoints?startTime={start}&endTime={end}&bucketSize=hour"),
            &key,
        )
        .await;
    assert_eq!(hourly["records"].as_array().unwrap().len(), 96);
    assert_eq!(micros(&hourly["metadata"]["totals"]["totalAmount"]), 3_557);
    let last = app.billing("/v2/billing/endpoints?lastN=2&bucketSize=day", &key).await;
    let last: Vec<i64> = last["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| micros(&r["totalAmount"]))
        .collect();
    assert_eq!(last, [0, 50]);

    // The aggregate: endpoint charges in `endpointAmount`, the rest 0.
    let all = app
        .billing(
            &format!("/v2/billing?startTime={start}&endTime={end}&bucketSize=week"),
            &key,
        )
        .await;
    let total: i64 = all["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| micros(&r["totalAmount"]))
        .sum();
    assert_eq!(total, 3_557);
    assert_eq!(micros(&all["metadata"]["totals"]["endpointAmount"]), 3_557);
    assert_eq!(all["metadata"]["totals"]["podGpuAmount"], 0.0);

    // Bad parameters: 400, every failure listed, and the scope is needed.
    let res = app
        .get(
            "/v2/billing/endpoints?bucketSize=minute&startTime=yesterday&lastN=0&color=red",
            &key,
        )
        .await;
    let body = problem(res, 400).await;
    let errors = errors_of(&body);
    assert!(errors.iter().any(|e| e.starts_with("color:")), "{errors:?}");
    let res = app
        .get(
            "/v2/billing/endpoints?bucketSize=minute&startTime=yesterday&lastN=0",
            &key,
        )
        .await;
    let errors = errors_of(&problem(res, 400).await);
    assert_eq!(errors.len(), 3, "{errors:?}");
    let res = app
        .get(&format!("/v2/billing/endpoints?startTime={end}&endTime={start}"), &key)
        .await;
    problem(res, 400).await;
    let res = app
        .get(
            "/v2/billing/endpoints?startTime=2000-01-01T00:00:00Z&bucketSize=hour",
            &key,
        )
        .await;
    assert!(
        problem(res, 400).await["errors"][0]
            .as_str()
            .unwrap()
            .contains("more than")
    );
    let (_, runner) = app.user_with_key("endpoints:run").await;
    problem(app.get("/v2/billing/endpoints", &runner).await, 403).await;
}

async fn storage_accrues_by_the_hour_until_deletion(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (email, key) = app.user_with_key("volumes:read volumes:write billing:read").await;
    let user = app.user_id(&email).await;
    let create = async |body: Value| -> String {
        let res = app
            .request(Method::POST, "/v2/network-volumes", Some(&key))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
    };
    let standard = create(json!({"name": "std", "size": 50, "dataCenter": "EU-RO-1", "type": "STANDARD"})).await;
    let fast = create(json!({"name": "fast", "size": 10, "dataCenter": "EU-RO-1", "type": "HIGH_PERFORMANCE"})).await;
    let created_hour = gantry_billing::storage::hour_of(now_ms());

    // A simulated clock: five hours later, six started hours are charged;
    // accruing again charges nothing more.
    let later = created_hour + 5 * HOUR + 1;
    app.jobs.accrue_storage(later, None).await.unwrap();
    assert_eq!(app.jobs.accrue_storage(later, None).await.unwrap(), 0);
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM storage_charges WHERE user_id = '{user}'"
        ))
        .await,
        12
    );
    // 50 GB × 0.07 USD / 730 h = 4795 µUSD an hour; 10 GB × 0.14 / 730 = 1918.
    let start = rfc3339(created_hour);
    let end = rfc3339(created_hour + 6 * HOUR);
    let body = app
        .billing(
            &format!(
                "/v2/billing/network-volumes?startTime={start}&endTime={end}&bucketSize=hour&networkVolumeId={standard}"
            ),
            &key,
        )
        .await;
    let records = body["records"].as_array().unwrap();
    assert_eq!(records.len(), 6, "{body}");
    assert!(
        records
            .iter()
            .all(|r| micros(&r["standardAmount"]) == 4_795 && r["networkVolumeId"] == standard.as_str())
    );
    assert_eq!(micros(&body["metadata"]["totals"]["totalAmount"]), 6 * 4_795);
    assert_eq!(body["metadata"]["uniqueNetworkVolumeCount"], 1);
    let body = app
        .billing(
            &format!("/v2/billing/network-volumes?startTime={start}&endTime={end}&bucketSize=day"),
            &key,
        )
        .await;
    assert_eq!(body["metadata"]["uniqueNetworkVolumeCount"], 2);
    assert_eq!(micros(&body["metadata"]["totals"]["standardAmount"]), 6 * 4_795);
    assert_eq!(micros(&body["metadata"]["totals"]["highPerformanceAmount"]), 6 * 1_918);
    // The balance paid for every hour, exactly once.
    let balance = app.balance(&key).await;
    assert_eq!(
        balance["balanceUsd"],
        gantry_billing::credit::usd_string(app.starting_credit_micro_usd - 6 * (4_795 + 1_918))
    );

    // Deleted: charged up to the hour in progress, then never again.
    let res = app
        .request(Method::DELETE, &format!("/v2/network-volumes/{standard}"), Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    app.jobs.accrue_storage(later + 24 * HOUR, None).await.unwrap();
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM storage_charges WHERE volume_id = '{standard}'"
        ))
        .await,
        6
    );
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM storage_charges WHERE volume_id = '{fast}'"
        ))
        .await,
        6 + 24
    );
    // `/v2/billing` puts storage in its own components.
    let all = app
        .billing(
            &format!("/v2/billing?startTime={start}&endTime={end}&bucketSize=day"),
            &key,
        )
        .await;
    assert_eq!(micros(&all["metadata"]["totals"]["storageStandardAmount"]), 6 * 4_795);
    assert_eq!(micros(&all["metadata"]["totals"]["endpointAmount"]), 0);
}
