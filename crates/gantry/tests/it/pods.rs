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

/// `gantry serve` killed (SIGKILL) while a pod runs, then started again on
/// the same data: the pod is adopted (the same container, no second one), it
/// stays RUNNING, and its one run is billed across the downtime with no
/// second lost or counted twice.
#[tokio::test]
async fn a_pod_survives_a_crash_of_gantry_and_is_billed_across_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = docker_host();
    let env = [
        ("GANTRY_SERVERLESS__DOCKER_HOST", host.as_str()),
        ("GANTRY_SERVERLESS__TICK_MS", "200"),
        ("GANTRY_SERVERLESS__STOP_GRACE_MS", "2000"),
    ];
    let serve = crate::cli::ServeProcess::start_with(dir.path(), &env);
    let key = serve.admin_key().expect("admin key");
    let client = crate::harness::http_client(Duration::from_secs(30));
    let base = format!("http://{}", serve.management);
    let res = client
        .post(format!("{base}/v2/pods"))
        .bearer_auth(&key)
        .json(&json!({"name": "long", "image": BUSYBOX, "args": "sleep 3600", "cpu": {"id": "cpu3c", "vcpuCount": 2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let status = |base: String, key: String, id: String, client: reqwest::Client| async move {
        let pod: Value = client
            .get(format!("{base}/v2/pods/{id}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pod["status"].as_str().unwrap_or("").to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while status(base.clone(), key.clone(), id.clone(), client.clone()).await != "RUNNING" {
        assert!(Instant::now() < deadline, "never RUNNING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let docker = gantry_runtime::Docker::connect(&host).unwrap();
    use gantry_runtime::Runtime;
    let label = [("gantry.id".to_owned(), id.clone())];
    let before = docker.list(&label).await.unwrap();
    assert_eq!(before.len(), 1);

    // A crash, and some downtime.
    drop(serve);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let serve = crate::cli::ServeProcess::start_with(dir.path(), &env);
    let base = format!("http://{}", serve.management);
    // It comes back RUNNING on the same container, and stays so.
    for _ in 0..20 {
        assert_eq!(
            status(base.clone(), key.clone(), id.clone(), client.clone()).await,
            "RUNNING"
        );
        let now = docker.list(&label).await.unwrap();
        assert_eq!(now.len(), 1, "{now:?}");
        assert_eq!(now[0].id, before[0].id, "adopted, not replaced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let res = client
        .delete(format!("{base}/v2/pods/{id}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 204);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !docker.list(&label).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the pod's container is still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(serve);

    // One run, from the first start to the delete, charged whole.
    let db = sea_orm::Database::connect(format!("sqlite://{}/gantry.db?mode=ro", dir.path().display()))
        .await
        .unwrap();
    use sea_orm::ConnectionTrait;
    let row = |sql: String| {
        let db = &db;
        async move {
            db.query_all_raw(sea_orm::Statement::from_string(db.get_database_backend(), sql))
                .await
                .unwrap()
        }
    };
    let runs = row(format!(
        "SELECT id, created_at_ms, ended_at_ms, billed_until_ms FROM pod_runs WHERE pod_id = '{id}' AND kind = 'run'"
    ))
    .await;
    assert_eq!(runs.len(), 1, "one run across the crash");
    let run_id: String = runs[0].try_get_by_index(0).unwrap();
    let created: i64 = runs[0].try_get_by_index(1).unwrap();
    let ended: Option<i64> = runs[0].try_get_by_index(2).unwrap();
    let billed: i64 = runs[0].try_get_by_index(3).unwrap();
    let ended = ended.expect("the run ended with the pod");
    // The last charge is written by the next look after the end; the process
    // was stopped right after the delete, so up to its end or short of it by
    // what that look would have charged, never more.
    assert!(billed <= ended, "never charged past the end");
    let charged = row(format!(
        "SELECT quantity_micros FROM ledger_entries WHERE job_id LIKE '{run_id}@%' AND unit = 'cpu_pod_seconds'"
    ))
    .await;
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
