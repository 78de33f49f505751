//! Pods on the real Docker engine (the private one of
//! `scripts/test-docker.sh`): the whole life of a pod with a persistent
//! mount, its logs and SSH keys, an image that cannot be pulled, the 409s of
//! the action state machine, tenant isolation, and the seconds it is billed.
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, parse_sse, problem};
use crate::serverless::{docker_host, spawn};

const BUSYBOX: &str = "gantry-test/busybox:1";
const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILXGDN/SclOozk1xsDztpmhGiKkkrfQB9SKoO8dSIQQZ me@example.com";

impl TestApp {
    async fn pod(&self, id: &str, key: &str) -> Value {
        let res = self.get(&format!("/v2/pods/{id}"), key).await;
        assert_eq!(res.status().as_u16(), 200);
        res.json().await.unwrap()
    }

    /// Polls a pod until its status is `want` (a generous bound: no speed is asserted).
    async fn pod_until(&self, id: &str, key: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pod = self.pod(id, key).await;
            if pod["status"] == want {
                return pod;
            }
            assert!(Instant::now() < deadline, "pod {id} never became {want}: {pod}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn delete(&self, path: &str, key: &str) -> reqwest::Response {
        self.request(Method::DELETE, path, Some(key)).send().await.unwrap()
    }

    async fn action(&self, id: &str, key: &str, action: &str) -> reqwest::Response {
        self.send_json(
            Method::POST,
            &format!("/v2/pods/{id}/action"),
            key,
            &json!({"action": action}),
        )
        .await
    }

    /// The lines of the pod's log, `(source, line)`.
    async fn pod_log(&self, id: &str, key: &str) -> Vec<(String, String)> {
        let res = self.get(&format!("/v2/pods/{id}/logs?tail=1000"), key).await;
        let status = res.status().as_u16();
        let body = res.text().await.unwrap();
        assert_eq!(status, 200, "{body}");
        parse_sse(&body)
            .into_iter()
            .map(|(_, _, data)| {
                (
                    data["source"].as_str().unwrap_or("").to_owned(),
                    data["line"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// Waits until the pod's container log has a line equal to `line`.
    async fn log_line(&self, id: &str, key: &str, line: &str) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.pod_log(id, key).await;
            if log.iter().any(|(source, l)| source == "container" && l == line) {
                return log;
            }
            assert!(Instant::now() < deadline, "no line '{line}' in {log:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A pod's life on Docker: created with the account's SSH key and a network
/// volume, running, logged, stopped (409 for a second stop), started again
/// with the files of its container disk, restarted, reconfigured (a new
/// container and a fresh container disk; the volume's files stay),
/// terminated and deleted (the volume, in use until then, with it); every
/// second it ran is charged once.
#[tokio::test]
async fn a_pod_lives_on_docker_keeps_its_files_and_is_billed_by_the_second() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let (_, other) = app.user_with_key("all").await;
    let put = app
        .send_json(Method::PUT, "/v2/account/ssh-keys", &key, &json!({"keys": [KEY]}))
        .await;
    assert_eq!(put.status().as_u16(), 200);
    let keys: Value = app.get("/v2/account/ssh-keys", &key).await.json().await.unwrap();
    assert_eq!(keys["keys"], json!([KEY]));

    let res = app
        .send_json(
            Method::POST,
            "/v2/network-volumes",
            &key,
            &json!({"name": "data", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let volume = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();

    // Each start appends a line to a file on the container's disk and one on
    // the volume, prints how many there are, then idles.
    let args = "sh -c 'echo s >> /starts; echo s >> /data/starts; echo starts=$(wc -l < /starts) kept=$(wc -l < /data/starts); echo key=$PUBLIC_KEY; echo mode=$MODE; exec sleep 3600'";
    let res = app
        .send_json(
            Method::POST,
            "/v2/pods",
            &key,
            &json!({"name": "trainer", "image": BUSYBOX, "args": args, "env": {"MODE": "one"},
                    "cpu": {"id": "cpu3c", "vcpuCount": 2}, "startSsh": true,
                    "ports": ["8888/http", "22/tcp"],
                    "mounts": {"network": [{"volumeId": volume, "path": "/data"}]}}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let created: Value = res.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("pod_"), "{created}");
    assert!(
        ["PROVISIONING", "STARTING", "RUNNING"].contains(&created["status"].as_str().unwrap()),
        "{created}"
    );
    assert_eq!(
        created["env"]["PUBLIC_KEY"], KEY,
        "startSsh puts the account's keys in the pod"
    );
    assert!(created["cost"].is_number());

    let running = app.pod_until(&id, &key, "RUNNING").await;
    assert_eq!(running["actions"], json!(["stop", "restart", "terminate"]));
    assert!(running["cost"].as_f64().unwrap() > 0.0, "{running}");
    assert!(running["runtime"]["uptime"].is_u64(), "{running}");
    // The engine's first sample of a new container may come a second later.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pod = app.pod(&id, &key).await;
        if pod["runtime"]["memory"].is_object() {
            for measure in ["cpu", "memory"] {
                let util = pod["runtime"][measure]["util"].as_u64().unwrap_or(101);
                assert!(util <= 100, "{measure}: {pod}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no CPU and memory use: {pod}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ports = running["runtime"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2, "{running}");
    assert!(
        ports.iter().all(|p| p["public"].is_u64() && p["ip"].is_string()),
        "{running}"
    );
    assert_eq!(running["ssh"]["direct"]["username"], "root", "{running}");
    assert!(running["startedAt"].is_string());
    let log = app.log_line(&id, &key, "starts=1 kept=1").await;
    assert!(log.iter().any(|(_, l)| l == &format!("key={KEY}")), "{log:?}");
    assert!(
        log.iter().any(|(s, l)| s == "system" && l == "container started"),
        "{log:?}"
    );

    // Another user sees none of it.
    assert_eq!(app.get(&format!("/v2/pods/{id}"), &other).await.status(), 404);
    assert_eq!(app.action(&id, &other, "stop").await.status(), 404);
    assert_eq!(app.get(&format!("/v2/pods/{id}/logs"), &other).await.status(), 404);
    let theirs: Value = app.get("/v2/pods", &other).await.json().await.unwrap();
    assert_eq!(theirs["pods"], json!([]));
    assert_eq!(
        app.get("/v2/account/ssh-keys", &other)
            .await
            .json::<Value>()
            .await
            .unwrap()["keys"],
        json!([])
    );

    // Stop: EXITED; a second stop is refused with the state and what is valid.
    assert_eq!(app.action(&id, &key, "stop").await.status(), 200);
    let stopped = app.pod_until(&id, &key, "EXITED").await;
    assert_eq!(stopped["actions"], json!(["start", "terminate"]));
    // Stopped, it costs what its disk does: GB × 0.20 USD / 730 h.
    let disk = stopped["disk"].as_i64().unwrap();
    let disk_hourly = (disk * 200_000 * 2 + 730) / (730 * 2);
    assert_eq!(stopped["cost"].as_f64(), Some(disk_hourly as f64 / 1e6), "{stopped}");
    assert!(stopped["runtime"].is_null());
    let refused = problem(app.action(&id, &key, "stop").await, 409).await;
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("EXITED") && detail.contains("start, terminate"),
        "{refused}"
    );

    // Start: the same files.
    assert_eq!(app.action(&id, &key, "start").await.status(), 200);
    app.pod_until(&id, &key, "RUNNING").await;
    app.log_line(&id, &key, "starts=2 kept=2").await;
    // The volume is in use.
    let in_use = problem(app.delete(&format!("/v2/network-volumes/{volume}"), &key).await, 409).await;
    assert!(in_use["detail"].as_str().unwrap().contains(&id), "{in_use}");

    // A locked pod is neither stopped nor restarted.
    let lock = |locked: bool| json!({ "locked": locked });
    let res = app
        .send_json(Method::PATCH, &format!("/v2/pods/{id}"), &key, &lock(true))
        .await;
    assert_eq!(res.status().as_u16(), 200);
    for action in ["stop", "restart"] {
        let refused = problem(app.action(&id, &key, action).await, 409).await;
        assert!(refused["detail"].as_str().unwrap().contains("locked"), "{refused}");
    }
    assert_eq!(app.pod(&id, &key).await["status"], "RUNNING");
    let res = app
        .send_json(Method::PATCH, &format!("/v2/pods/{id}"), &key, &lock(false))
        .await;
    assert_eq!(res.status().as_u16(), 200);

    // Restart: the same container, run again.
    assert_eq!(app.action(&id, &key, "restart").await.status(), 200);
    app.log_line(&id, &key, "starts=3 kept=3").await;
    app.pod_until(&id, &key, "RUNNING").await;

    // A new configuration: a new container, with a disk of its own.
    let res = app
        .send_json(
            Method::PATCH,
            &format!("/v2/pods/{id}"),
            &key,
            &json!({"env": {"MODE": "two"}, "name": "renamed"}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = app.pod_log(&id, &key).await;
        if log.iter().any(|(_, l)| l == "mode=two") {
            assert!(log.iter().any(|(_, l)| l == "starts=1 kept=4"), "{log:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never restarted with the new env: {log:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.pod_until(&id, &key, "RUNNING").await["name"], "renamed");

    // Terminate, then delete: the container is gone.
    assert_eq!(app.action(&id, &key, "terminate").await.status(), 200);
    let over = app.pod_until(&id, &key, "TERMINATED").await;
    assert_eq!(over["actions"], json!([]));
    problem(app.action(&id, &key, "start").await, 409).await;
    let docker = gantry_runtime::Docker::connect(&docker_host()).unwrap();
    use gantry_runtime::Runtime;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !docker
        .list(&[("gantry.id".to_owned(), id.clone())])
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the pod's container is still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = app.delete(&format!("/v2/pods/{id}"), &key).await;
    assert_eq!(deleted.status().as_u16(), 204);
    assert_eq!(app.get(&format!("/v2/pods/{id}"), &key).await.status(), 404);

    // The volume is free again, and goes.
    let res = app.delete(&format!("/v2/network-volumes/{volume}"), &key).await;
    assert_eq!(res.status().as_u16(), 204);

    // Every run is closed and charged once, millisecond by millisecond.
    app.fleet
        .service()
        .accrue_pods(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let runs = app.fleet.service().pod_runs(&id).await.unwrap();
    assert_eq!(
        runs.len(),
        4,
        "first start, start after the stop, restart, the new configuration: {runs:?}"
    );
    let db = sea_orm::Database::connect(&app.database_url).await.unwrap();
    use sea_orm::ConnectionTrait;
    // Between runs its disk was charged: from the end of one run to the
    // start of the next, never after the terminate.
    let disks = app.fleet.service().pod_stretches(&id, "disk").await.unwrap();
    assert!(!disks.is_empty(), "the stop left its disk charged");
    for disk in &disks {
        assert_eq!(disk.hourly_micro_usd, disk_hourly);
        assert!(
            runs.iter().any(|r| r.ended_at_ms == Some(disk.created_at_ms)),
            "{disk:?} {runs:?}"
        );
        assert!(
            runs.iter().any(|r| Some(r.created_at_ms) == disk.ended_at_ms),
            "{disk:?} {runs:?}"
        );
    }
    let stop_gap = disks
        .iter()
        .map(|d| d.ended_at_ms.unwrap() - d.created_at_ms)
        .max()
        .unwrap();
    assert!(stop_gap > 0, "{disks:?}");
    let mut charged = 0i64;
    let mut disk_charged = 0i64;
    for (run, unit) in runs
        .iter()
        .map(|r| (r, "cpu_pod_seconds"))
        .chain(disks.iter().map(|d| (d, "pod_disk_seconds")))
    {
        let ended = run.ended_at_ms.expect("every run ended");
        assert_eq!(run.billed_until_ms, ended, "charged up to its end");
        let charges = db
            .query_all_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                format!(
                    "SELECT quantity_micros, amount_micro_usd FROM ledger_entries WHERE job_id LIKE '{}@%' AND unit = '{unit}' AND model = '{id}'",
                    run.id
                ),
            ))
            .await
            .unwrap();
        let quantity: i64 = charges.iter().map(|r| r.try_get_by_index::<i64>(0).unwrap()).sum();
        let amount: i64 = charges.iter().map(|r| r.try_get_by_index::<i64>(1).unwrap()).sum();
        assert_eq!(
            quantity,
            (ended - run.created_at_ms) * 1000,
            "run {}: every millisecond once",
            run.id
        );
        assert_eq!(
            amount,
            (i128::from(ended - run.created_at_ms) * i128::from(run.hourly_micro_usd) / 3_600_000) as i64
        );
        if unit == "pod_disk_seconds" {
            disk_charged += amount;
        } else {
            charged += amount;
        }
    }
    // The billing history shows the same, as CPU pod time.
    let billed: Value = app
        .get(&format!("/v2/billing/pods?podId={id}&bucketSize=hour&lastN=2"), &key)
        .await
        .json()
        .await
        .unwrap();
    let total = billed["metadata"]["totals"]["cpuAmount"].as_f64().unwrap();
    assert!((total - charged as f64 / 1e6).abs() < 1e-6, "{billed} vs {charged}");
    assert_eq!(billed["metadata"]["totals"]["gpuAmount"], 0.0);
    let disk_total = billed["metadata"]["totals"]["diskAmount"].as_f64().unwrap();
    assert!(
        (disk_total - disk_charged as f64 / 1e6).abs() < 1e-6,
        "{billed} vs {disk_charged}"
    );
    assert_eq!(billed["metadata"]["uniquePodCount"], 1, "{billed}");
    assert!(
        billed["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["podId"] == id.as_str())
    );
    // And so does the account's whole history.
    let history: Value = app
        .get("/v2/billing?bucketSize=hour&lastN=2", &key)
        .await
        .json()
        .await
        .unwrap();
    let totals = &history["metadata"]["totals"];
    let pods = totals["podCpuAmount"].as_f64().unwrap();
    assert!((pods - charged as f64 / 1e6).abs() < 1e-6, "{history} vs {charged}");
    let disks = totals["podDiskAmount"].as_f64().unwrap();
    assert!(
        (disks - disk_charged as f64 / 1e6).abs() < 1e-6,
        "{history} vs {disk_charged}"
    );
    // A pod's charges are no model job's, and count once in the total (with
    // the volume's storage).
    assert_eq!(totals["endpointAmount"], 0.0, "{history}");
    let sum = pods + disks + totals["storageStandardAmount"].as_f64().unwrap();
    assert!(
        (totals["totalAmount"].as_f64().unwrap() - sum).abs() < 1e-6,
        "{history}"
    );
    // Runs do not overlap: a pod is billed once at a time.
    for pair in runs.windows(2) {
        assert!(pair[0].ended_at_ms.unwrap() <= pair[1].created_at_ms, "{runs:?}");
    }
}

/// An image that cannot be pulled: ERROR with the reason in the system log,
/// no run and no charge; an update with a good image starts it.
#[tokio::test]
async fn a_pod_whose_image_cannot_be_pulled_is_in_error_until_fixed() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let res = app
        .send_json(
            Method::POST,
            "/v2/pods",
            &key,
            &json!({"name": "broken", "image": "127.0.0.1:9/nothing/here:1", "args": "sleep 3600",
                    "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let failed = app.pod_until(&id, &key, "ERROR").await;
    assert!(
        failed["statusReason"].as_str().unwrap().contains("could not be pulled"),
        "{failed}"
    );
    assert_eq!(failed["actions"], json!(["start", "terminate"]));
    let log = app.pod_log(&id, &key).await;
    assert!(
        log.iter()
            .any(|(s, l)| s == "system" && l.contains("could not be pulled")),
        "{log:?}"
    );
    assert!(
        app.fleet.service().pod_runs(&id).await.unwrap().is_empty(),
        "not billed"
    );

    let res = app
        .send_json(
            Method::PATCH,
            &format!("/v2/pods/{id}"),
            &key,
            &json!({"image": BUSYBOX}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(app.action(&id, &key, "start").await.status(), 200);
    app.pod_until(&id, &key, "RUNNING").await;
    let deleted = app.delete(&format!("/v2/pods/{id}"), &key).await;
    assert_eq!(deleted.status().as_u16(), 204);

    // From a pod template: its settings, the body's over them, env merged per
    // key; a serverless template is refused.
    let template = |serverless: bool| {
        json!({"name": "t", "image": BUSYBOX, "args": "sleep 3600", "serverless": serverless,
               "env": {"FROM": "template", "BOTH": "template"}})
    };
    let res = app
        .send_json(Method::POST, "/v2/templates", &key, &template(false))
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let pod_template = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let res = app
        .send_json(Method::POST, "/v2/templates", &key, &template(true))
        .await;
    let serverless_template = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let body = |template: &str| {
        json!({"name": "templated", "templateId": template, "env": {"BOTH": "body"},
               "cpu": {"id": "cpu3c", "vcpuCount": 2}})
    };
    let refused = problem(
        app.send_json(Method::POST, "/v2/pods", &key, &body(&serverless_template))
            .await,
        422,
    )
    .await;
    assert!(
        errors_of(&refused).iter().any(|e| e.starts_with("$.templateId")),
        "{refused}"
    );
    let res = app
        .send_json(Method::POST, "/v2/pods", &key, &body(&pod_template))
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let made: Value = res.json().await.unwrap();
    assert_eq!(made["image"], BUSYBOX);
    assert_eq!(made["args"], "sleep 3600");
    assert_eq!(made["template"], pod_template.as_str());
    assert_eq!(
        (&made["env"]["FROM"], &made["env"]["BOTH"]),
        (&json!("template"), &json!("body")),
        "{made}"
    );
    // The template's startJupyter (true by default) gives the pod a password.
    assert_eq!(
        made["env"]["JUPYTER_PASSWORD"].as_str().map(str::len),
        Some(20),
        "{made}"
    );
    let templated = made["id"].as_str().unwrap().to_owned();
    app.pod_until(&templated, &key, "RUNNING").await;
    let deleted = app.delete(&format!("/v2/pods/{templated}"), &key).await;
    assert_eq!(deleted.status().as_u16(), 204);
}

/// Bad pod requests list every problem and create nothing; scopes hold.
#[tokio::test]
async fn bad_pod_requests_say_every_problem_and_change_nothing() {
    let app = spawn(Backend::Postgres).await;
    let (_, key) = app.user_with_key("all").await;
    let body = problem(
        app.send_json(
            Method::POST,
            "/v2/pods",
            &key,
            &json!({"name": "x", "image": "Bad Image", "ports": ["99999/http"],
                    "gpu": {"id": "NO SUCH GPU"}, "cpu": {"id": "cpu3c", "vcpuCount": 3},
                    "mounts": {"persistent": {"size": 0, "path": "relative"}}, "globalNetworking": true}),
        )
        .await,
        422,
    )
    .await;
    let errors = errors_of(&body);
    for needle in [
        "$.image",
        "$.ports",
        "$: give exactly one of gpu or cpu",
        "$.mounts.persistent.size",
        "$.mounts.persistent.path",
        "$.globalNetworking",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(needle)),
            "{needle} missing from {errors:?}"
        );
    }
    let body = problem(
        app.send_json(
            Method::POST,
            "/v2/pods",
            &key,
            &json!({"name": "x", "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await,
        422,
    )
    .await;
    assert!(errors_of(&body).iter().any(|e| e.starts_with("$.image")), "{body}");
    let body = problem(
        app.send_json(
            Method::PUT,
            "/v2/account/ssh-keys",
            &key,
            &json!({"keys": ["rsa AAAA", KEY, "ssh-rsa ***"]}),
        )
        .await,
        422,
    )
    .await;
    assert_eq!(errors_of(&body).len(), 2, "{body}");
    let listed: Value = app.get("/v2/pods", &key).await.json().await.unwrap();
    assert_eq!(listed["pods"], json!([]));
    assert_eq!(
        app.get("/v2/account/ssh-keys", &key)
            .await
            .json::<Value>()
            .await
            .unwrap()["keys"],
        json!([])
    );
    problem(app.action("pod_missing", &key, "start").await, 404).await;
    problem(
        app.send_json(
            Method::POST,
            "/v2/pods/pod_missing/action",
            &key,
            &json!({"action": "explode"}),
        )
        .await,
        422,
    )
    .await;

    // System lines written at once (the reconciler and API calls) are all kept.
    let service = app.fleet.service();
    let writes = (0..50).map(|i| async move { service.pod_event("pod_lines", &format!("line {i}")).await });
    for written in futures_util::future::join_all(writes).await {
        written.unwrap();
    }
    let mut lines: Vec<String> = service
        .pod_events("pod_lines")
        .await
        .unwrap()
        .into_iter()
        .map(|(_, _, line)| line)
        .collect();
    lines.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("line {i}")).collect();
    want.sort();
    assert_eq!(lines, want);

    // Read-only keys read; they do not create.
    let (_, read_only) = app.user_with_key("read-only").await;
    assert_eq!(app.get("/v2/pods", &read_only).await.status(), 200);
    problem(
        app.send_json(
            Method::POST,
            "/v2/pods",
            &read_only,
            &json!({"name": "x", "image": BUSYBOX, "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await,
        403,
    )
    .await;
}

/// A `gantry serve` process's management API, as a user's client sees it.
struct Served {
    client: reqwest::Client,
    base: String,
    key: String,
}

impl Served {
    fn of(serve: &crate::cli::ServeProcess, key: &str) -> Served {
        Served {
            client: crate::harness::http_client(Duration::from_secs(30)),
            base: format!("http://{}", serve.management),
            key: key.to_owned(),
        }
    }

    async fn create_pod(&self, body: &Value) -> String {
        let res = self
            .client
            .post(format!("{}/v2/pods", self.base))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 201);
        res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
    }

    async fn pod(&self, id: &str) -> Value {
        let res = self
            .client
            .get(format!("{}/v2/pods/{id}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        res.json().await.unwrap()
    }

    async fn pod_until(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pod = self.pod(id).await;
            if pod["status"] == want {
                return pod;
            }
            assert!(Instant::now() < deadline, "pod {id} never became {want}: {pod}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The system lines of the pod's log.
    async fn system_log(&self, id: &str) -> Vec<String> {
        let res = self
            .client
            .get(format!("{}/v2/pods/{id}/logs?tail=1000", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        parse_sse(&res.text().await.unwrap())
            .into_iter()
            .filter(|(_, _, data)| data["source"] == "system")
            .map(|(_, _, data)| data["line"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Deletes the pod and waits until its container is gone.
    async fn delete_pod(&self, id: &str, docker: &gantry_runtime::Docker) {
        use gantry_runtime::Runtime;
        let res = self
            .client
            .delete(format!("{}/v2/pods/{id}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 204);
        let label = [("gantry.id".to_owned(), id.to_owned())];
        let deadline = Instant::now() + Duration::from_secs(60);
        while !docker.list(&label).await.unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the pod's container is still there");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The runs of a pod, from the data dir of a `gantry serve`: `(id,
/// created_at_ms, ended_at_ms, billed_until_ms)`, oldest first.
async fn pod_runs(dir: &std::path::Path, pod: &str) -> Vec<(String, i64, Option<i64>, i64)> {
    use sea_orm::ConnectionTrait;
    let db = sea_orm::Database::connect(format!("sqlite://{}/gantry.db?mode=ro", dir.display()))
        .await
        .unwrap();
    db.query_all_raw(sea_orm::Statement::from_string(
        db.get_database_backend(),
        format!(
            "SELECT id, created_at_ms, ended_at_ms, billed_until_ms FROM pod_runs \
             WHERE pod_id = '{pod}' AND kind = 'run' ORDER BY created_at_ms"
        ),
    ))
    .await
    .unwrap()
    .iter()
    .map(|r| {
        (
            r.try_get_by_index(0).unwrap(),
            r.try_get_by_index(1).unwrap(),
            r.try_get_by_index(2).unwrap(),
            r.try_get_by_index(3).unwrap(),
        )
    })
    .collect()
}

fn rfc3339_ms(at: Option<&str>) -> i64 {
    gantry_runtime::parse_rfc3339_nanos(at.expect("the engine gave a time")).unwrap() / 1_000_000
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A `gantry serve` on one data dir and one engine, looking every 200 ms;
/// started again on the same data after a crash.
struct ServeOn {
    dir: tempfile::TempDir,
    host: String,
}

impl ServeOn {
    /// A fresh data dir, on the engine at `host`.
    fn new(host: &str) -> ServeOn {
        ServeOn {
            dir: tempfile::tempdir().unwrap(),
            host: host.to_owned(),
        }
    }

    fn docker(&self) -> gantry_runtime::Docker {
        gantry_runtime::Docker::connect(&self.host).unwrap()
    }

    fn start(&self) -> crate::cli::ServeProcess {
        crate::cli::ServeProcess::start_with(
            self.dir.path(),
            &[
                ("GANTRY_SERVERLESS__DOCKER_HOST", self.host.as_str()),
                ("GANTRY_SERVERLESS__TICK_MS", "200"),
                ("GANTRY_SERVERLESS__STOP_GRACE_MS", "2000"),
            ],
        )
    }

    /// The first start, with a CPU pod running `args`: the process, the
    /// admin's API, the pod's id and its container.
    async fn with_a_pod(&self, args: &str) -> (crate::cli::ServeProcess, Served, String, gantry_runtime::Container) {
        use gantry_runtime::Runtime;
        let serve = self.start();
        let key = serve.admin_key().expect("admin key");
        let api = Served::of(&serve, &key);
        let id = api
            .create_pod(&json!({"name": "p", "image": BUSYBOX, "args": args, "cpu": {"id": "cpu3c", "vcpuCount": 2}}))
            .await;
        api.pod_until(&id, "RUNNING").await;
        let mut containers = self
            .docker()
            .list(&[("gantry.id".to_owned(), id.clone())])
            .await
            .unwrap();
        assert_eq!(containers.len(), 1, "{containers:?}");
        (serve, api, id, containers.remove(0))
    }
}

/// `gantry serve` killed (SIGKILL) while a pod runs, then started again on
/// the same data: the pod is adopted (the same container, no second one), it
/// stays RUNNING, and its one run is billed across the downtime with no
/// second lost or counted twice.
#[tokio::test]
async fn a_pod_survives_a_crash_of_gantry_and_is_billed_across_it() {
    let on = ServeOn::new(&docker_host());
    let (serve, api, id, container) = on.with_a_pod("sleep 3600").await;
    let key = api.key.clone();
    let docker = on.docker();
    use gantry_runtime::Runtime;
    let label = [("gantry.id".to_owned(), id.clone())];

    // A crash, and some downtime.
    drop(serve);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let serve = on.start();
    let api = Served::of(&serve, &key);
    // It comes back RUNNING on the same container, and stays so.
    for _ in 0..20 {
        assert_eq!(api.pod(&id).await["status"], "RUNNING");
        let now = docker.list(&label).await.unwrap();
        assert_eq!(now.len(), 1, "{now:?}");
        assert_eq!(now[0].id, container.id, "adopted, not replaced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    api.delete_pod(&id, &docker).await;
    drop(serve);

    // One run, from the first start to the delete, charged whole.
    let runs = pod_runs(on.dir.path(), &id).await;
    assert_eq!(runs.len(), 1, "one run across the crash");
    let (run_id, created, ended, billed) = runs[0].clone();
    let ended = ended.expect("the run ended with the pod");
    // The last charge is written by the next look after the end; the process
    // was stopped right after the delete, so up to its end or short of it by
    // what that look would have charged, never more.
    assert!(billed <= ended, "never charged past the end");
    let db = sea_orm::Database::connect(format!("sqlite://{}/gantry.db?mode=ro", on.dir.path().display()))
        .await
        .unwrap();
    use sea_orm::ConnectionTrait;
    let charged = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT quantity_micros FROM ledger_entries WHERE job_id LIKE '{run_id}@%' AND unit = 'cpu_pod_seconds'"
            ),
        ))
        .await
        .unwrap();
    let quantity: i64 = charged.iter().map(|r| r.try_get_by_index::<i64>(0).unwrap()).sum();
    assert_eq!(
        quantity,
        (billed - created) * 1000,
        "every millisecond up to billed_until once"
    );
    assert!(
        billed - created >= 2000,
        "the downtime is charged: {}",
        billed - created
    );
}

/// A pod's program that ends by itself while `gantry serve` is down (the
/// engine stays up): when Gantry is back, the pod is EXITED with the exit
/// status and its run ends where the engine says the program ended. The
/// container is not started again: it last started under the engine that is
/// still running, so its stop was not the engine's doing.
#[tokio::test]
async fn a_pod_whose_program_ends_while_gantry_is_down_is_exited_with_its_status() {
    let on = ServeOn::new(&docker_host());
    let (serve, api, id, container) = on.with_a_pod("sh -c 'sleep 3; exit 3'").await;
    let key = api.key.clone();
    let docker = on.docker();
    use gantry_runtime::Runtime;

    drop(serve);
    let deadline = Instant::now() + Duration::from_secs(60);
    let ended = loop {
        let now = docker.inspect(&container.id).await.unwrap();
        if now.state == gantry_runtime::ContainerState::Exited {
            break now;
        }
        assert!(Instant::now() < deadline, "the program never ended: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(ended.exit_code, Some(3));

    let serve = on.start();
    let api = Served::of(&serve, &key);
    let pod = api.pod_until(&id, "EXITED").await;
    assert!(pod["statusReason"].as_str().unwrap_or("").contains("status 3"), "{pod}");
    // It stays so: a few more looks do not start it again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(api.pod(&id).await["status"], "EXITED");
    let after = docker.inspect(&container.id).await.unwrap();
    assert_eq!(after.state, gantry_runtime::ContainerState::Exited);
    assert_eq!(after.started_at, ended.started_at, "not started again");
    let runs = pod_runs(on.dir.path(), &id).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    let finished = rfc3339_ms(ended.finished_at.as_deref());
    assert_eq!(runs[0].2, Some(finished), "the run ends where the program did");
    api.delete_pod(&id, &docker).await;
}

/// Gantry and the container engine down together, as in a reboot of their
/// host: `gantry serve` is killed, then the engine stops (stopping the pod's
/// container), and both start again. Gantry never saw the engine away, yet
/// the pod comes back RUNNING on the same container: the container last
/// started under the earlier engine. The run before ends where the engine
/// stopped the container, and a new one begins when it started again.
#[tokio::test]
async fn a_pod_comes_back_when_gantry_and_its_engine_went_down_together() {
    let engine = OwnEngine::start("reboot", false).await;
    let on = ServeOn::new(&engine.host);
    let (serve, api, id, container) = on.with_a_pod("sleep 3600").await;
    let key = api.key.clone();
    let docker = on.docker();
    use gantry_runtime::Runtime;
    let label = [("gantry.id".to_owned(), id.clone())];

    drop(serve);
    let going_down = unix_ms();
    engine.run("stop").await;
    let down = unix_ms();
    engine.run("start").await;
    let serve = on.start();
    let api = Served::of(&serve, &key);

    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let now = docker.list(&label).await.unwrap_or_default();
        if now.len() == 1 && now[0].state == gantry_runtime::ContainerState::Running {
            assert_eq!(now[0].id, container.id, "the same container, started again");
            break docker.inspect(&now[0].id).await.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the pod's container never ran again: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(api.pod_until(&id, "RUNNING").await["status"], "RUNNING");
    let log = api.system_log(&id).await;
    assert!(
        log.iter()
            .any(|l| l.contains("stopped the container while it was away")),
        "{log:?}"
    );

    let runs = pod_runs(on.dir.path(), &id).await;
    assert_eq!(runs.len(), 2, "a run before the reboot and one after: {runs:?}");
    let first_end = runs[0].2.expect("the first run ended");
    assert!(
        (going_down..=down).contains(&first_end),
        "the first run ends while the engine went down: {first_end} not in {going_down}..={down}"
    );
    let started_again = rfc3339_ms(again.started_at.as_deref());
    assert!(
        (runs[1].1 - started_again).abs() < 2_000,
        "the second run starts with the container: {} against {started_again}",
        runs[1].1
    );
    assert_eq!(runs[1].2, None, "the second run is open");
    api.delete_pod(&id, &docker).await;
}

/// A private Docker engine of one test's own (`scripts/test-docker.sh` with a
/// state dir of its own and only the busybox image), stopped and deleted
/// however the test ends: for tests that restart their engine, or that need
/// one whose GPU requests start (`fake_gpus`: a stand-in NVIDIA hook).
pub(crate) struct OwnEngine {
    state: String,
    fake_gpus: bool,
    /// Only the busybox image (not the runpod-python ones).
    busybox_only: bool,
    /// A default bridge network (`GANTRY_TEST_DOCKER_BRIDGE`): containers
    /// reach the host at [`OwnEngine::BRIDGE_HOST`].
    bridge: bool,
    pub(crate) host: String,
}

impl OwnEngine {
    pub(crate) async fn start(name: &str, fake_gpus: bool) -> OwnEngine {
        Self::start_with(name, fake_gpus, true).await
    }

    /// [`OwnEngine::start`], with the runpod-python images too unless `busybox_only`.
    pub(crate) async fn start_with(name: &str, fake_gpus: bool, busybox_only: bool) -> OwnEngine {
        Self::launch(name, fake_gpus, busybox_only, false).await
    }

    /// The host's address on the bridge of [`OwnEngine::start_bridged`].
    pub(crate) const BRIDGE_HOST: &str = "172.31.251.1";

    /// An engine with the runpod-python images whose containers get the
    /// default bridge network rather than the host's.
    pub(crate) async fn start_bridged(name: &str) -> OwnEngine {
        Self::launch(name, false, false, true).await
    }

    async fn launch(name: &str, fake_gpus: bool, busybox_only: bool, bridge: bool) -> OwnEngine {
        let mut engine = OwnEngine {
            state: format!("/tmp/gantry-test-docker-{name}-{}", std::process::id()),
            fake_gpus,
            busybox_only,
            bridge,
            host: String::new(),
        };
        let line = engine.run("start").await;
        engine.host = line.strip_prefix("DOCKER_HOST=").unwrap_or(&line).to_owned();
        engine
    }

    /// Runs `scripts/test-docker.sh <command>` on this engine; its last line.
    pub(crate) async fn run(&self, command: &'static str) -> String {
        let mut cmd = self.command(command);
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        assert!(out.status.success(), "test-docker.sh {command} failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_owned()
    }

    fn command(&self, command: &str) -> std::process::Command {
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-docker.sh");
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(script)
            .arg(command)
            .env("GANTRY_TEST_DOCKER_DIR", &self.state)
            .env(
                "GANTRY_TEST_DOCKER_IMAGES",
                if self.busybox_only { "busybox" } else { "all" },
            )
            .env("GANTRY_TEST_DOCKER_FAKE_GPUS", if self.fake_gpus { "1" } else { "0" })
            .env("GANTRY_TEST_DOCKER_BRIDGE", if self.bridge { "1" } else { "0" })
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        cmd
    }
}

impl Drop for OwnEngine {
    fn drop(&mut self) {
        let _ = self.command("purge").output();
    }
}

/// The container engine restarted under a running pod (without
/// `live-restore`, dockerd stops every container on its way down): the pod
/// comes back RUNNING on the same container, its run ends where the engine
/// stopped the container and a new run starts with it, and no second
/// container is made. The engine is one of this test's own, so that
/// restarting it disturbs no other test.
#[tokio::test]
async fn a_pod_comes_back_after_its_container_engine_restarts() {
    let engine = OwnEngine::start("restart", false).await;
    let host = engine.host.clone();

    let app = TestApp::spawn_with(Backend::Sqlite, {
        let host = host.clone();
        move |settings| {
            settings.serverless.docker_host = Some(host);
            settings.serverless.tick_ms = 200;
            settings.serverless.stop_grace_ms = 2_000;
        }
    })
    .await;
    let (_, key) = app.user_with_key("all").await;
    let res = app
        .send_json(
            Method::POST,
            "/v2/pods",
            &key,
            &json!({"name": "steady", "image": BUSYBOX, "args": "sleep 3600", "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await;
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    app.pod_until(&id, &key, "RUNNING").await;
    let docker = gantry_runtime::Docker::connect(&host).unwrap();
    use gantry_runtime::Runtime;
    let label = [("gantry.id".to_owned(), id.clone())];
    let before = docker.list(&label).await.unwrap();
    assert_eq!(before.len(), 1);

    // The engine goes down (stopping the container) and comes back.
    engine.run("stop").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    engine.run("start").await;

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = docker.list(&label).await.unwrap_or_default();
        if now.len() == 1 && now[0].state == gantry_runtime::ContainerState::Running {
            assert_eq!(now[0].id, before[0].id, "the same container, started again");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod's container never ran again: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.pod_until(&id, &key, "RUNNING").await;
    let log = app.pod_log(&id, &key).await;
    assert!(
        log.iter()
            .any(|(s, l)| s == "system" && l.contains("stopped the container while it was away")),
        "{log:?}"
    );

    // Two runs: the first ends where the engine stopped the container, the
    // second begins when it started again; no overlap.
    let db = sea_orm::Database::connect(&app.database_url).await.unwrap();
    use sea_orm::ConnectionTrait;
    let runs = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!("SELECT created_at_ms, ended_at_ms FROM pod_runs WHERE pod_id = '{id}' AND kind = 'run' ORDER BY created_at_ms"),
        ))
        .await
        .unwrap();
    assert_eq!(runs.len(), 2, "a run before the restart and one after");
    let first_end: Option<i64> = runs[0].try_get_by_index(1).unwrap();
    let second_start: i64 = runs[1].try_get_by_index(0).unwrap();
    let second_end: Option<i64> = runs[1].try_get_by_index(1).unwrap();
    let first_end = first_end.expect("the first run ended");
    assert!(first_end <= second_start, "no second is billed twice");
    assert_eq!(second_end, None, "the second run is open");
    let finished = docker.inspect(&before[0].id).await.unwrap();
    let started_again = finished
        .started_at
        .as_deref()
        .and_then(gantry_runtime::parse_rfc3339_nanos)
        .unwrap()
        / 1_000_000;
    assert!(
        (second_start - started_again).abs() < 2_000,
        "the second run starts with the container: {second_start} against {started_again}"
    );
    let res = app
        .send_json(Method::DELETE, &format!("/v2/pods/{id}"), &key, &json!({}))
        .await;
    assert_eq!(res.status().as_u16(), 204);
}

/// With credit required: no pod starts without credit (402), and a running
/// pod whose owner's credit runs out is stopped after the grace period (not
/// deleted), with the reason in its log; topped up, it starts again.
#[tokio::test]
async fn a_pod_is_stopped_when_its_owners_credit_runs_out() {
    let host = docker_host();
    let mut app = TestApp::spawn_with(Backend::Sqlite, move |settings| {
        settings.serverless.docker_host = Some(host);
        settings.serverless.tick_ms = 200;
        settings.serverless.stop_grace_ms = 1_000;
        settings.serverless.pod_credit_grace_ms = 500;
        settings.billing.require_credit = true;
    })
    .await;
    app.starting_credit_micro_usd = 0;
    let (email, key) = app.user_with_key("all").await;
    let body = json!({"name": "short", "image": BUSYBOX, "args": "sleep 3600", "cpu": {"id": "cpu3c", "vcpuCount": 2}});
    let refused = problem(app.send_json(Method::POST, "/v2/pods", &key, &body).await, 402).await;
    assert!(refused["detail"].as_str().unwrap().contains("credit"), "{refused}");
    assert_eq!(
        app.get("/v2/pods", &key).await.json::<Value>().await.unwrap()["pods"],
        json!([])
    );

    // Credit for well under a second of the pod (0.06 USD an hour).
    app.add_credit(&email, "0.00001");
    let res = app.send_json(Method::POST, "/v2/pods", &key, &body).await;
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let stopped = app.pod_until(&id, &key, "EXITED").await;
    assert!(
        stopped["statusReason"].as_str().unwrap().contains("credit"),
        "{stopped}"
    );
    let log = app.pod_log(&id, &key).await;
    assert!(
        log.iter().any(|(s, l)| s == "system" && l.contains("credit ran out")),
        "{log:?}"
    );
    let balance = app.balance(&key).await;
    assert!(
        balance["balanceUsd"].as_str().unwrap().starts_with('-'),
        "charged for what ran: {balance}"
    );
    problem(app.action(&id, &key, "start").await, 402).await;

    app.add_credit(&email, "1");
    assert_eq!(app.action(&id, &key, "start").await.status(), 200);
    app.pod_until(&id, &key, "RUNNING").await;
    let res = app.delete(&format!("/v2/pods/{id}"), &key).await;
    assert_eq!(res.status().as_u16(), 204);
}

/// A platform on `engine` (one with the stand-in NVIDIA hook) whose machine
/// has two GPUs, as a stand-in `nvidia-smi` written in `dir` lists them.
pub(crate) async fn on_two_gpus(engine: &OwnEngine, dir: &std::path::Path) -> TestApp {
    let smi = two_gpus_smi(dir);
    let host = engine.host.clone();
    TestApp::spawn_with(Backend::Sqlite, move |settings| {
        settings.serverless.docker_host = Some(host);
        settings.serverless.tick_ms = 200;
        settings.serverless.stop_grace_ms = 1_000;
        settings.serverless.gpu_devices = None;
        settings.serverless.nvidia_smi = smi.display().to_string();
    })
    .await
}

/// A stand-in for `nvidia-smi` in `dir` that lists two GPUs (0 and 1) as
/// Gantry queries them.
fn two_gpus_smi(dir: &std::path::Path) -> std::path::PathBuf {
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\n# A stand-in for nvidia-smi: two GPUs.\n\
         echo '0, GPU-00000000, 94, 62914, 81559'\necho '1, GPU-11111111, 3, 1024, 81559'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    smi
}

/// GPU pods on one Docker machine of two GPUs (a test engine with a
/// stand-in for the NVIDIA toolkit's hook, and a stand-in `nvidia-smi`):
/// each pod gets GPUs no other running pod has, by id (its program sees
/// them in `NVIDIA_VISIBLE_DEVICES`); a third waits PROVISIONING, unbilled,
/// saying why, and starts when one is freed; a pod asking for more than the
/// machine has is ERROR; a stopped pod started again waits for its own GPU;
/// `runtime.gpus` is what `nvidia-smi` says of the pod's GPU.
#[tokio::test]
async fn gpu_pods_on_one_machine_get_gpus_of_their_own_and_wait_for_them() {
    let engine = OwnEngine::start("gpus", true).await;
    let dir = tempfile::tempdir().unwrap();
    let app = on_two_gpus(&engine, dir.path()).await;
    let (_, key) = app.user_with_key("all").await;
    let h100 = "NVIDIA H100 80GB HBM3";
    let gpu_pod = |name: &str, count: u32| {
        json!({"name": name, "image": BUSYBOX, "gpu": {"id": h100, "count": count},
               "args": "sh -c 'echo gpus=$NVIDIA_VISIBLE_DEVICES; exec sleep 3600'"})
    };
    let create = |body: Value| {
        let app = &app;
        let key = &key;
        async move {
            let res = app.send_json(Method::POST, "/v2/pods", key, &body).await;
            assert_eq!(res.status().as_u16(), 201);
            res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
        }
    };
    let docker = gantry_runtime::Docker::connect(&engine.host).unwrap();
    use gantry_runtime::Runtime;
    let containers_of = |id: &str| {
        let docker = &docker;
        let label = [("gantry.id".to_owned(), id.to_owned())];
        async move { docker.list(&label).await.unwrap() }
    };

    // Two pods, one GPU each: GPU 0 and GPU 1, each its own.
    let a = create(gpu_pod("a", 1)).await;
    app.pod_until(&a, &key, "RUNNING").await;
    app.log_line(&a, &key, "gpus=0").await;
    let b = create(gpu_pod("b", 1)).await;
    app.pod_until(&b, &key, "RUNNING").await;
    app.log_line(&b, &key, "gpus=1").await;
    assert_eq!(containers_of(&b).await[0].labels["gantry.gpus"], "1");

    // What nvidia-smi says of the pod's own GPU.
    let seen = app.pod(&a, &key).await;
    assert_eq!(
        seen["runtime"]["gpus"],
        json!([{"util": 94, "memoryUtil": 77}]),
        "{seen}"
    );

    // A third waits, with no container and no run; more than the machine has is an error.
    let c = create(gpu_pod("c", 1)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let waiting = loop {
        let pod = app.pod(&c, &key).await;
        if pod["statusReason"].as_str().is_some() {
            break pod;
        }
        assert!(Instant::now() < deadline, "never said it waits: {pod}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(waiting["status"], "PROVISIONING", "{waiting}");
    assert!(
        waiting["statusReason"]
            .as_str()
            .unwrap()
            .contains("waiting for 1 free GPU: 2 of this machine's 2 are in use"),
        "{waiting}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(containers_of(&c).await.is_empty(), "no container while it waits");
    assert_eq!(app.pod(&c, &key).await["cost"], json!(0.0));
    let too_many = create(gpu_pod("d", 3)).await;
    let refused = app.pod_until(&too_many, &key, "ERROR").await;
    assert!(
        refused["statusReason"]
            .as_str()
            .unwrap()
            .contains("3 GPUs asked for, and this machine has 2"),
        "{refused}"
    );

    // A's GPU is freed: C starts on it.
    assert_eq!(app.action(&a, &key, "stop").await.status().as_u16(), 200);
    app.pod_until(&a, &key, "EXITED").await;
    app.pod_until(&c, &key, "RUNNING").await;
    app.log_line(&c, &key, "gpus=0").await;

    // A started again waits for its own GPU (its container, and its files, have it) ...
    assert_eq!(app.action(&a, &key, "start").await.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pod = app.pod(&a, &key).await;
        if pod["statusReason"]
            .as_str()
            .is_some_and(|r| r.contains("waiting for its GPU 0 to be free"))
        {
            assert_eq!(pod["status"], "PROVISIONING");
            break;
        }
        assert_ne!(pod["status"], "RUNNING", "A ran on a GPU that C has: {pod}");
        assert!(Instant::now() < deadline, "never said it waits for GPU 0: {pod}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and runs on it, in the same container, once C is gone.
    let before = containers_of(&a).await;
    assert_eq!(app.action(&c, &key, "terminate").await.status().as_u16(), 200);
    app.pod_until(&a, &key, "RUNNING").await;
    let after = containers_of(&a).await;
    assert_eq!(after[0].id, before[0].id, "the same container");
    assert_eq!(after[0].labels["gantry.gpus"], "0");

    for id in [&a, &b, &c, &too_many] {
        let res = app.delete(&format!("/v2/pods/{id}"), &key).await;
        assert_eq!(res.status().as_u16(), 204);
    }
}
