//! Users' own containers: templates, registry credentials and serverless
//! endpoints through the management API, and endpoints' jobs run by the
//! unmodified runpod-python worker SDK, as a host process and in Docker
//! containers the fleet starts and stops.
//!
//! Needs a Docker engine with the test images (`DOCKER_HOST`; unset, the
//! tests start a private one with `scripts/test-docker.sh start`, as root)
//! and a venv with runpod-python (`scripts/test-docker.sh venv`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

const WORKER_IMAGE: &str = "gantry-test/runpod-worker:1";

/// Runs `scripts/test-docker.sh <command>` once per test process and
/// returns the last line it printed.
fn test_docker(command: &'static str) -> String {
    static START: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static VENV: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let cell = if command == "start" { &START } else { &VENV };
    cell.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-docker.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(command)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "`scripts/test-docker.sh {command}` failed: {stdout}"
        );
        stdout.lines().last().unwrap_or_default().trim().to_owned()
    })
    .clone()
}

/// The test engine: `DOCKER_HOST`, or the private one `scripts/test-docker.sh
/// start` starts (with the test images imported).
pub(crate) fn docker_host() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => host,
        _ => {
            let line = test_docker("start");
            line.strip_prefix("DOCKER_HOST=").unwrap_or(&line).to_owned()
        }
    }
}

/// `docker <args>` (the command line) against the engine at `host`: its
/// standard output, or `None` where the command could not run at all.
pub(crate) fn docker_cli(host: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("docker")
        .env("DOCKER_HOST", host)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes every container (running or not) on the engine at `host` that
/// has all the `labels` (`name=value`); for tests' cleanup, so it never
/// fails (a stopped engine has nothing to remove).
pub(crate) fn remove_containers(host: &str, labels: &[&str]) {
    let filters: Vec<String> = labels.iter().map(|label| format!("label={label}")).collect();
    let mut list = vec!["ps", "-aq"];
    for filter in &filters {
        list.extend(["--filter", filter.as_str()]);
    }
    let Some(ids) = docker_cli(host, &list) else {
        return;
    };
    let mut remove = vec!["rm", "-f"];
    remove.extend(ids.split_whitespace());
    if remove.len() > 2 {
        let _ = docker_cli(host, &remove);
    }
}

/// The Python of the venv with runpod-python 1.12.0 (made by
/// `scripts/test-docker.sh venv` unless `GANTRY_TEST_RUNPOD_PYTHON` names one).
fn runpod_python() -> PathBuf {
    let path = match std::env::var_os("GANTRY_TEST_RUNPOD_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(test_docker("venv")),
    };
    assert!(path.exists(), "{} is missing", path.display());
    path
}

fn handler(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/runpod-handlers")
        .join(name)
}

pub(crate) async fn spawn(backend: Backend) -> TestApp {
    let host = docker_host();
    TestApp::spawn_with(backend, move |settings| {
        settings.serverless.docker_host = Some(host);
        settings.serverless.tick_ms = 200;
        settings.serverless.stop_grace_ms = 5_000;
    })
    .await
}

impl TestApp {
    async fn create(&self, path: &str, key: &str, body: Value) -> Value {
        let res = self.send_json(Method::POST, path, key, &body).await;
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        assert_eq!(status, 201, "create {path}: {body}");
        body
    }

    /// A CPU endpoint of `image` with the given workers and scaling.
    async fn endpoint(&self, key: &str, image: &str, workers: Value) -> String {
        self.endpoint_with(key, image, workers, json!({})).await
    }

    /// [`Self::endpoint`] with the fields of `extra` added to its body.
    async fn endpoint_with(&self, key: &str, image: &str, workers: Value, extra: Value) -> String {
        let mut body = json!({
            "name": "test endpoint",
            "type": "QUEUE",
            "image": image,
            "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5},
            "workers": workers,
            "cpu": [{"id": "cpu3c", "vcpuCount": 2}],
        });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        let created = self.create("/v2/serverless", key, body).await;
        created["id"].as_str().unwrap().to_owned()
    }

    async fn endpoint_job(&self, endpoint: &str, key: &str, route: &str, input: Value) -> Value {
        // A runsync waits for a worker that may still be starting: no
        // client timeout shorter than the wait it asks for.
        let res = crate::harness::http_client(Duration::from_secs(300))
            .post(format!("{}/v2/{endpoint}/{route}", self.public_base))
            .bearer_auth(key)
            .json(&json!({"input": input}))
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        assert_eq!(status, 200, "{route}: {body}");
        body
    }

    async fn status_of(&self, endpoint: &str, key: &str, id: &str) -> Value {
        let res = self
            .client
            .get(format!("{}/v2/{endpoint}/status/{id}", self.public_base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        res.json().await.unwrap()
    }

    /// Polls a job until it is final (a generous bound: no speed is asserted).
    async fn final_of(&self, endpoint: &str, key: &str, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let view = self.status_of(endpoint, key, id).await;
            if ["COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"].contains(&view["status"].as_str().unwrap_or("")) {
                return view;
            }
            assert!(Instant::now() < deadline, "job {id} never ended: {view}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the endpoint has no worker (a generous bound: no speed
    /// is asserted).
    async fn scaled_to_zero(&self, endpoint: &str, key: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.workers_of(endpoint, key).await["summary"]["total"] != 0 {
            assert!(Instant::now() < deadline, "never scaled back to 0");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn workers_of(&self, endpoint: &str, key: &str) -> Value {
        self.get(&format!("/v2/serverless/{endpoint}/workers"), key)
            .await
            .json()
            .await
            .unwrap()
    }
}

/// `docker inspect -f <format>` of the first container (running or not) of
/// `endpoint` on the engine at `docker_host`, trimmed.
fn worker_container_inspect(docker_host: &str, endpoint: &str, format: &str) -> String {
    let docker = |args: &[&str]| {
        docker_cli(docker_host, args)
            .expect("the docker command runs")
            .trim()
            .to_owned()
    };
    let ids = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=gantry.id={endpoint}"),
        "--format",
        "{{.ID}}",
    ]);
    let id = ids.lines().next().unwrap_or("");
    assert!(!id.is_empty(), "no worker container");
    docker(&["inspect", "-f", format, id])
}

/// A runpod-python worker running `script` on this host, as worker
/// `worker_id` of `endpoint`. Its process group (the SDK pings from a
/// process of its own) is killed when it is dropped.
struct HostWorker(tokio::process::Child);

impl Drop for HostWorker {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

fn host_worker(app: &TestApp, endpoint: &str, worker_id: &str, script: &str) -> HostWorker {
    spawn_worker(
        app.fleet.protocol_env(endpoint, worker_id, &app.public_base, "cpu"),
        script,
    )
}

fn spawn_worker(env: Vec<(String, String)>, script: &str) -> HostWorker {
    HostWorker(
        tokio::process::Command::new(runpod_python())
            .arg("-u")
            .arg(handler(script))
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("the runpod worker starts"),
    )
}

#[tokio::test]
async fn templates_registries_and_endpoints_round_trip_on_sqlite() {
    round_trip(Backend::Sqlite).await;
}

#[tokio::test]
async fn templates_registries_and_endpoints_round_trip_on_postgres() {
    round_trip(Backend::Postgres).await;
}

async fn round_trip(backend: Backend) {
    let app = spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let (_, other) = app.user_with_key("all").await;

    // A registry credential: its secret parts are never shown, nor stored in the clear.
    let registry = app
        .create(
            "/v2/registries",
            &key,
            json!({"name": "private", "username": "robot", "password": "s3cret-Passw0rd"}),
        )
        .await;
    let registry_id = registry["id"].as_str().unwrap().to_owned();
    assert_eq!(registry, json!({"id": registry_id, "name": "private"}));
    let listed: Value = app.get("/v2/registries", &key).await.json().await.unwrap();
    assert_eq!(listed["registries"], json!([registry]));
    let db = sea_orm::Database::connect(&app.database_url).await.unwrap();
    use sea_orm::ConnectionTrait;
    let rows = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT credential FROM registries",
        ))
        .await
        .unwrap();
    let sealed: String = rows[0].try_get_by_index(0).unwrap();
    assert!(sealed.starts_with("v1:") && !sealed.contains("s3cret") && !sealed.contains("robot"));
    assert_eq!(
        app.get(&format!("/v2/registries/{registry_id}"), &other).await.status(),
        404,
        "another user's credential is not found"
    );

    // A serverless template.
    let template = app
        .create(
            "/v2/templates",
            &key,
            json!({"name": "worker", "image": "gantry-test/runpod-worker:1", "serverless": true,
                   "env": {"MODE": "template", "KEEP": "yes"}, "ports": ["8000/http"], "registry": registry_id}),
        )
        .await;
    let template_id = template["id"].as_str().unwrap().to_owned();
    assert_eq!(template["startSsh"], true, "{template}");
    assert_eq!(template["category"], "NVIDIA");
    assert_eq!(template["disk"], 20);
    let patched: Value = app
        .send_json(
            Method::PATCH,
            &format!("/v2/templates/{template_id}"),
            &key,
            &json!({"public": true}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(patched["public"], true);
    let catalog: Value = app.get("/v2/catalog/templates", &other).await.json().await.unwrap();
    assert!(
        catalog["templates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == template_id.as_str())
    );
    assert_eq!(
        app.get(&format!("/v2/templates/{template_id}"), &other).await.status(),
        404
    );

    // An endpoint from the template: the body's env wins per key.
    let endpoint = app
        .create(
            "/v2/serverless",
            &key,
            json!({"name": "ep", "type": "QUEUE", "templateId": template_id,
                   "scaling": {"type": "REQUEST_COUNT", "requestCount": 2},
                   "env": {"MODE": "body"}, "workers": {"min": 0, "max": 2}}),
        )
        .await;
    let endpoint_id = endpoint["id"].as_str().unwrap().to_owned();
    assert!(endpoint_id.starts_with("ep_"));
    assert_eq!(endpoint["image"], "gantry-test/runpod-worker:1");
    assert_eq!(endpoint["env"], json!({"KEEP": "yes", "MODE": "body"}));
    assert_eq!(endpoint["registry"], registry_id.as_str());
    assert_eq!(endpoint["version"], 1);
    assert_eq!(endpoint["timeout"], 300000);
    assert!(endpoint["cpu"].is_array(), "a CPU endpoint by default: {endpoint}");
    assert!(
        endpoint["requestUrls"]["runSync"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v2/{endpoint_id}/runsync"))
    );
    assert!(
        endpoint["workers"].get("idleTimeout").is_none(),
        "not with request-count scaling"
    );
    // Used by the endpoint: neither the template nor the credential can go.
    assert_eq!(
        app.request(Method::DELETE, &format!("/v2/templates/{template_id}"), Some(&key))
            .send()
            .await
            .unwrap()
            .status(),
        409
    );
    problem(
        app.request(Method::DELETE, &format!("/v2/registries/{registry_id}"), Some(&key))
            .send()
            .await
            .unwrap(),
        409,
    )
    .await;

    // A change of the image is a release; a rename is not.
    let renamed: Value = app
        .send_json(
            Method::PATCH,
            &format!("/v2/serverless/{endpoint_id}"),
            &key,
            &json!({"name": "renamed"}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (renamed["name"].as_str(), renamed["version"].as_u64()),
        (Some("renamed"), Some(1))
    );
    let changed: Value = app
        .send_json(
            Method::PATCH,
            &format!("/v2/serverless/{endpoint_id}"),
            &key,
            &json!({"image": "gantry-test/busybox:1", "env": {"MODE": "v2"}}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(changed["version"], 2, "{changed}");
    let releases: Value = app
        .get(&format!("/v2/serverless/{endpoint_id}/releases"), &key)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(releases["endpointVersion"], 2);
    let latest = &releases["releases"][0];
    assert_eq!(latest["version"], 2);
    let fields: Vec<&str> = latest["diff"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["image", "env"], "{latest}");
    assert_eq!(latest["diff"][0]["old"], "gantry-test/runpod-worker:1");

    // Tenants never see each other's endpoints, nor run jobs on them.
    assert_eq!(
        app.get(&format!("/v2/serverless/{endpoint_id}"), &other).await.status(),
        404
    );
    let listed: Value = app.get("/v2/serverless", &other).await.json().await.unwrap();
    assert_eq!(listed["endpoints"], json!([]));
    let foreign = app
        .client
        .post(format!("{}/v2/{endpoint_id}/run", app.public_base))
        .bearer_auth(&other)
        .json(&json!({"input": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 404);

    // Delete: gone, and then the template and credential are free.
    let deleted = app
        .request(Method::DELETE, &format!("/v2/serverless/{endpoint_id}"), Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(
        app.get(&format!("/v2/serverless/{endpoint_id}"), &key).await.status(),
        404
    );
    for path in [
        format!("/v2/templates/{template_id}"),
        format!("/v2/registries/{registry_id}"),
    ] {
        let res = app.request(Method::DELETE, &path, Some(&key)).send().await.unwrap();
        assert_eq!(res.status(), 204, "{path}");
    }
    let delegations = app.get("/v2/registries/delegations", &key).await;
    problem(delegations, 501).await;
}

#[tokio::test]
async fn bad_endpoint_requests_say_every_problem_and_change_nothing() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let res = app
        .send_json(
            Method::POST,
            "/v2/serverless",
            &key,
            &json!({
                "name": "bad",
                "type": "QUEUE",
                "image": "Not A/Valid::image",
                "ports": ["70000/tcp", "22/sctp"],
                "env": {"1BAD": "x", "NUL": "a\u{0}b", "NL": "a\nb"},
                "scaling": {"type": "QUEUE_DELAY", "queueDelay": 1},
                "workers": {"min": 5, "max": 2},
                "registry": "reg_missing",
                "networkVolumes": ["vol_missing"],
                "cpu": [{"id": "cpu3c", "vcpuCount": 3}],
            }),
        )
        .await;
    let body = problem(res, 422).await;
    let errors = errors_of(&body);
    for field in [
        "$.image",
        "$.ports",
        "$.env",
        "$.workers",
        "$.registry",
        "$.networkVolumes",
        "$.cpu[0].vcpuCount",
    ] {
        assert!(errors.iter().any(|e| e.starts_with(field)), "{field} in {errors:?}");
    }
    assert!(
        errors.iter().filter(|e| e.starts_with("$.env")).count() >= 3,
        "{errors:?}"
    );
    let res = app
        .send_json(
            Method::POST,
            "/v2/serverless",
            &key,
            &json!({"name": "no image", "type": "QUEUE", "scaling": {"type": "REQUEST_COUNT", "requestCount": 1},
                    "templateId": "tpl_missing"}),
        )
        .await;
    let errors = errors_of(&problem(res, 422).await);
    assert!(errors.iter().any(|e| e.starts_with("$.templateId")), "{errors:?}");
    assert!(errors.iter().any(|e| e.starts_with("$.image")), "{errors:?}");
    let res = app
        .send_json(
            Method::POST,
            "/v2/serverless",
            &key,
            &json!({"name": "lb", "type": "LOAD_BALANCER", "image": "a:1", "scaling": {"type": "REQUEST_COUNT", "requestCount": 1}}),
        )
        .await;
    problem(res, 422).await;
    let listed: Value = app.get("/v2/serverless", &key).await.json().await.unwrap();
    assert_eq!(listed["endpoints"], json!([]), "nothing was created");
    // A read-only key reads, but does not write.
    let (_, read_only) = app.user_with_key("read-only").await;
    assert_eq!(app.get("/v2/serverless", &read_only).await.status(), 200);
    let res = app
        .send_json(
            Method::POST,
            "/v2/templates",
            &read_only,
            &json!({"name": "t", "image": "a:1"}),
        )
        .await;
    problem(res, 403).await;
}

#[tokio::test]
async fn without_a_container_engine_endpoints_answer_503_and_the_rest_works() {
    let app = TestApp::spawn_with(Backend::Sqlite, |settings| {
        settings.serverless.docker_host = Some("unix:///nonexistent/docker.sock".into());
    })
    .await;
    let (_, key) = app.user_with_key("all").await;
    let res = app
        .send_json(
            Method::POST,
            "/v2/serverless",
            &key,
            &json!({"name": "x", "type": "QUEUE", "image": "a:1", "scaling": {"type": "REQUEST_COUNT", "requestCount": 1}}),
        )
        .await;
    let body = problem(res, 503).await;
    assert!(body["detail"].as_str().unwrap().contains("container runtime"), "{body}");
    // Templates are only stored: they need no engine.
    app.create("/v2/templates", &key, json!({"name": "t", "image": "a:1"}))
        .await;
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
}

/// The unmodified runpod-python SDK as a worker on this host: sync and
/// async jobs, a failing handler, streaming, cancel, and a worker killed
/// mid-job whose job is run again by another, exactly once.
#[tokio::test]
async fn the_runpod_sdk_runs_an_endpoints_jobs() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    // No containers: the workers are host processes.
    let endpoint = app.endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 0})).await;
    let _worker = host_worker(&app, &endpoint, "wk_host1", "echo.py");

    let done = app
        .endpoint_job(&endpoint, &key, "runsync?wait=120000", json!({"x": 1}))
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["output"]["echo"], json!({"x": 1}));
    assert_eq!(done["output"]["worker"], "wk_host1");

    let mut ids = Vec::new();
    for i in 0..20 {
        let queued = app.endpoint_job(&endpoint, &key, "run", json!({"i": i})).await;
        ids.push(queued["id"].as_str().unwrap().to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        let view = app.final_of(&endpoint, &key, id).await;
        assert_eq!(view["status"], "COMPLETED", "{view}");
        assert_eq!(view["output"]["echo"]["i"], i);
    }

    let failed = app
        .endpoint_job(&endpoint, &key, "runsync?wait=120000", json!({"fail": true}))
        .await;
    assert_eq!(failed["status"], "FAILED", "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("asked to fail"), "{failed}");

    // Cancel a running job: the SDK is told to stop it.
    let long = app.endpoint_job(&endpoint, &key, "run", json!({"sleep": 60})).await;
    let long_id = long["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.status_of(&endpoint, &key, &long_id).await["status"] != "IN_PROGRESS" {
        assert!(Instant::now() < deadline, "the long job never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = app
        .client
        .post(format!("{}/v2/{endpoint}/cancel/{long_id}", app.public_base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(app.final_of(&endpoint, &key, &long_id).await["status"], "CANCELLED");
    // The worker is free again.
    let after = app
        .endpoint_job(&endpoint, &key, "runsync?wait=120000", json!({"after": "cancel"}))
        .await;
    assert_eq!(after["status"], "COMPLETED", "{after}");

    // A worker killed mid-job: its job goes back to the queue (once its
    // lease lapses) and the next worker runs it, once.
    let slow = app
        .endpoint_job(&endpoint, &key, "run", json!({"sleep": 3, "tag": "survivor"}))
        .await;
    let slow_id = slow["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.status_of(&endpoint, &key, &slow_id).await["status"] != "IN_PROGRESS" {
        assert!(Instant::now() < deadline, "the slow job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(_worker);
    let _second = host_worker(&app, &endpoint, "wk_host2", "echo.py");
    let view = app.final_of(&endpoint, &key, &slow_id).await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["output"]["worker"], "wk_host2");
    assert_eq!(view["output"]["echo"]["tag"], "survivor");
    // Jobs on user endpoints are not charged per job (their workers' time is).
    assert_eq!(view["output"].get("cost"), None);
}

/// One sample of the management listener's `/metrics`, by its exact series
/// (`name{labels}`); 0 when absent.
async fn sample(app: &TestApp, key: &str, series: &str) -> f64 {
    let text = app.get("/metrics", key).await.text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_job_that_a_waiting_worker_takes_wakes_no_reconciler_look() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let endpoint = app.endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 0})).await;
    let job_wakeups = r#"gantry_reconciler_wakeups_total{cause="job"}"#;
    let free_slots = format!(r#"gantry_worker_slots{{model="{endpoint}",state="free"}}"#);

    // No worker waits: the job wakes the reconciler (an endpoint at zero
    // needs one started).
    let before = sample(&app, &key, job_wakeups).await;
    let first = app.endpoint_job(&endpoint, &key, "run", json!({"n": 1})).await;
    assert_eq!(sample(&app, &key, job_wakeups).await, before + 1.0);

    // A worker of the protocol, driven by hand, takes it.
    let env: std::collections::HashMap<String, String> = app
        .fleet
        .protocol_env(&endpoint, "wk_hand", &app.public_base, "cpu")
        .into_iter()
        .collect();
    let take_url = env["RUNPOD_WEBHOOK_GET_JOB"].replace("$ID", "wk_hand");
    let token = env["RUNPOD_AI_API_KEY"].clone();
    let client = crate::harness::http_client(Duration::from_secs(60));
    let take = |client: reqwest::Client, url: String, token: String| async move {
        let res = client.get(url).header("Authorization", token).send().await.unwrap();
        assert_eq!(res.status(), 200);
        res.json::<Value>().await.unwrap()
    };
    let taken = take(client.clone(), take_url.clone(), token.clone()).await;
    assert_eq!(taken["id"], first["id"], "{taken}");

    // It waits in its next take (its slot shows as free): the next job is
    // handed to it and wakes nothing.
    let waiting = tokio::spawn(take(client.clone(), take_url.clone(), token.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(&app, &key, &free_slots).await < 1.0 {
        assert!(Instant::now() < deadline, "the take never waited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = app.endpoint_job(&endpoint, &key, "run", json!({"n": 2})).await;
    let taken = waiting.await.unwrap();
    assert_eq!(taken["id"], second["id"], "{taken}");
    assert_eq!(sample(&app, &key, job_wakeups).await, before + 1.0);
}

#[tokio::test]
async fn a_generator_handler_streams_its_output() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let endpoint = app.endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 0})).await;
    // The worker's environment as an operator gets it, from the command line.
    let out = crate::cli::gantry(
        &app,
        &[
            "endpoints",
            "worker-env",
            &endpoint,
            "--worker-id",
            "wk_stream1",
            "--base-url",
            &app.public_base,
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    // The same as the platform's own, but for the ping interval: the
    // command line reads the default heartbeat, this app runs a shorter one.
    let ours = app.fleet.protocol_env(&endpoint, "wk_stream1", &app.public_base, "cpu");
    let differ: Vec<&str> = env
        .iter()
        .zip(&ours)
        .filter(|(a, b)| a != b)
        .map(|((name, _), _)| name.as_str())
        .collect();
    assert_eq!(
        (env.len(), differ),
        (ours.len(), vec!["RUNPOD_PING_INTERVAL"]),
        "{env:?}"
    );
    let _worker = spawn_worker(ours, "stream.py");
    let queued = app.endpoint_job(&endpoint, &key, "run", json!({"n": 5})).await;
    let id = queued["id"].as_str().unwrap().to_owned();
    let view = app.final_of(&endpoint, &key, &id).await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    let res = app
        .client
        .get(format!("{}/v2/{endpoint}/stream/{id}", app.public_base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    let toks: Vec<Value> = body["stream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|chunk| chunk["output"]["tok"].clone())
        .collect();
    assert_eq!(toks, (0..5).map(|i| json!(i)).collect::<Vec<_>>(), "{body}");
}

/// The whole path on Docker: 200 `/run` jobs and 20 waiting `/runsync`
/// callers; the endpoint scales from 0 to its max (3) as they queue and back
/// to 0 when idle, a worker container killed mid-job loses no job, every job
/// ends once, and every worker-second is charged once.
#[tokio::test]
async fn an_endpoint_on_docker_scales_from_zero_to_max_and_back_and_bills_worker_seconds() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let endpoint = app
        .endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 3, "idleTimeout": 1}))
        .await;
    assert_eq!(
        app.workers_of(&endpoint, &key).await["summary"]["total"],
        0,
        "none before a job"
    );

    // 200 jobs queued with /run, and 20 callers waiting with /runsync.
    let mut ids = Vec::new();
    for i in 0..200 {
        let queued = app
            .endpoint_job(&endpoint, &key, "run", json!({"i": i, "sleep": 0.05}))
            .await;
        ids.push(queued["id"].as_str().unwrap().to_owned());
    }
    let waiting: Vec<_> = (0..20)
        .map(|i| {
            let (app, endpoint, key) = (&app, endpoint.clone(), key.clone());
            async move {
                app.endpoint_job(&endpoint, &key, "runsync?wait=300000", json!({"sync": i}))
                    .await
            }
        })
        .collect();
    let waiting = futures_util::future::join_all(waiting);
    // It scales up to its max, and no further.
    let watch = async {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut most = 0;
        loop {
            let total = app.workers_of(&endpoint, &key).await["summary"]["total"]
                .as_u64()
                .unwrap();
            assert!(total <= 3, "{total} workers: more than max");
            most = most.max(total);
            if most == 3 {
                break;
            }
            assert!(Instant::now() < deadline, "never reached 3 workers (most {most})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A worker killed mid-job: its job is run again, and ends once.
        let docker = gantry_runtime::Docker::connect(&docker_host()).unwrap();
        use gantry_runtime::Runtime;
        // (A worker is listed from the moment it is decided; its container
        // follows once the image is checked and the container created.)
        let deadline = Instant::now() + Duration::from_secs(120);
        let victim = loop {
            let running = docker
                .list(&[("gantry.id".to_owned(), endpoint.clone())])
                .await
                .unwrap()
                .into_iter()
                .find(|c| c.state == gantry_runtime::ContainerState::Running);
            if let Some(container) = running {
                break container;
            }
            assert!(Instant::now() < deadline, "no worker container ever ran");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        docker.remove(&victim.id).await.unwrap();
    };
    let (synced, ()) = tokio::join!(waiting, watch);
    for (i, view) in synced.iter().enumerate() {
        assert_eq!(view["status"], "COMPLETED", "{view}");
        assert_eq!(view["output"]["echo"]["sync"], i);
    }
    for (i, id) in ids.iter().enumerate() {
        let view = app.final_of(&endpoint, &key, id).await;
        assert_eq!(view["status"], "COMPLETED", "{view}");
        assert_eq!(view["output"]["echo"]["i"], i);
    }
    let docker = gantry_runtime::Docker::connect(&docker_host()).unwrap();
    use gantry_runtime::Runtime;
    // Idle for longer than idleTimeout: back to zero.
    app.scaled_to_zero(&endpoint, &key).await;
    let left = docker
        .list(&[("gantry.id".to_owned(), endpoint.clone())])
        .await
        .unwrap();
    assert!(left.is_empty(), "containers left: {left:?}");

    // Every worker's life is charged once, second by second, with no gap or overlap.
    app.fleet
        .service()
        .accrue_workers(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let db = sea_orm::Database::connect(&app.database_url).await.unwrap();
    use sea_orm::ConnectionTrait;
    let workers = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT id, created_at_ms, ended_at_ms, billed_until_ms, hourly_micro_usd FROM endpoint_workers WHERE endpoint_id = '{endpoint}'"
            ),
        ))
        .await
        .unwrap();
    assert!(workers.len() >= 2, "{} workers", workers.len());
    let mut charged = 0i64;
    for row in &workers {
        let id: String = row.try_get_by_index(0).unwrap();
        let created: i64 = row.try_get_by_index(1).unwrap();
        let ended: Option<i64> = row.try_get_by_index(2).unwrap();
        let billed: i64 = row.try_get_by_index(3).unwrap();
        let hourly: i64 = row.try_get_by_index(4).unwrap();
        let ended = ended.expect("every worker ended");
        assert_eq!(billed, ended, "worker {id} is charged up to its end");
        let charges = db
            .query_all_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                format!(
                    "SELECT quantity_micros, amount_micro_usd FROM ledger_entries WHERE job_id LIKE '{id}@%' AND unit = 'cpu_worker_seconds'"
                ),
            ))
            .await
            .unwrap();
        let quantity: i64 = charges.iter().map(|r| r.try_get_by_index::<i64>(0).unwrap()).sum();
        let amount: i64 = charges.iter().map(|r| r.try_get_by_index::<i64>(1).unwrap()).sum();
        assert_eq!(
            quantity,
            (ended - created) * 1000,
            "worker {id}: every millisecond once"
        );
        assert_eq!(
            amount,
            (i128::from(ended - created) * i128::from(hourly) / 3_600_000) as i64
        );
        assert!(hourly > 0, "a CPU worker has a price");
        charged += amount;
    }
    // The billing history shows the same, as CPU serverless time.
    let billed: Value = app
        .get(
            &format!("/v2/billing/serverless?serverlessId={endpoint}&bucketSize=hour&lastN=2"),
            &key,
        )
        .await
        .json()
        .await
        .unwrap();
    let totals = &billed["metadata"]["totals"];
    assert_eq!(totals["cpuAmount"].as_f64(), Some(charged as f64 / 1e6), "{billed}");
    assert_eq!(totals["gpuAmount"].as_f64(), Some(0.0));
    assert_eq!(billed["metadata"]["uniqueServerlessCount"], 1);
    assert!(
        billed["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["serverlessId"] == endpoint.as_str())
    );
}

/// An endpoint's network volume is mounted into each of its workers at
/// `/runpod-volume`: a file one worker writes, a later worker reads. The
/// volume cannot be deleted while the endpoint has it.
#[tokio::test]
async fn an_endpoints_workers_share_its_network_volume() {
    let app = spawn(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("all").await;
    let volume = app
        .create(
            "/v2/network-volumes",
            &key,
            json!({"name": "shared", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let endpoint = app
        .endpoint_with(
            &key,
            WORKER_IMAGE,
            json!({"min": 0, "max": 1, "idleTimeout": 1}),
            json!({"networkVolumes": [volume]}),
        )
        .await;

    let wrote = app
        .endpoint_job(
            &endpoint,
            &key,
            "runsync?wait=300000",
            json!({"write": {"name": "note", "text": "kept"}}),
        )
        .await;
    assert_eq!(wrote["status"], "COMPLETED", "{wrote}");
    let first = wrote["output"]["worker"].as_str().unwrap().to_owned();

    let res = app.delete(&format!("/v2/network-volumes/{volume}"), &key).await;
    assert_eq!(res.status().as_u16(), 409);
    let problem: Value = res.json().await.unwrap();
    assert!(problem["detail"].as_str().unwrap().contains(&endpoint), "{problem}");

    // Idle past its timeout, the worker goes; the next job gets a new one,
    // which finds the file.
    app.scaled_to_zero(&endpoint, &key).await;
    let read = app
        .endpoint_job(&endpoint, &key, "runsync?wait=300000", json!({"read": "note"}))
        .await;
    assert_eq!(read["status"], "COMPLETED", "{read}");
    assert_eq!(read["output"]["read"], "kept", "{read}");
    assert_ne!(read["output"]["worker"], first.as_str(), "{read}");

    // Without the endpoint, the volume goes.
    let res = app.delete(&format!("/v2/serverless/{endpoint}"), &key).await;
    assert!(res.status().is_success(), "{}", res.status());
    let res = app.delete(&format!("/v2/network-volumes/{volume}"), &key).await;
    assert_eq!(res.status().as_u16(), 204);
}

/// A GPU endpoint's workers ask the engine for their GPUs (`DeviceRequests`
/// of the endpoint's count), run its jobs, and are billed at the GPU price.
/// The engine is one of this test's own with a stand-in for the NVIDIA
/// Container Toolkit's hook: its GPU containers start, without GPUs.
#[tokio::test]
async fn a_gpu_endpoints_workers_get_their_gpus_from_the_engine_and_are_billed_for_them() {
    let engine = crate::pods::OwnEngine::start_with("gpu-workers", true, false).await;
    let app = TestApp::spawn_with(Backend::Sqlite, {
        let host = engine.host.clone();
        move |settings| {
            settings.serverless.docker_host = Some(host);
            settings.serverless.tick_ms = 200;
            settings.serverless.stop_grace_ms = 2_000;
        }
    })
    .await;
    let (_, key) = app.user_with_key("all").await;
    let created = app
        .create(
            "/v2/serverless",
            &key,
            json!({"name": "on gpus", "type": "QUEUE", "image": WORKER_IMAGE,
                   "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5},
                   "workers": {"min": 0, "max": 1, "idleTimeout": 1},
                   "gpu": {"pools": ["HOPPER_80"], "count": 2}}),
        )
        .await;
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let view = app
        .endpoint_job(&endpoint, &key, "runsync?wait=300000", json!({"on": "gpu"}))
        .await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["output"]["echo"]["on"], "gpu");
    // The worker's container asked for two NVIDIA GPUs.
    let requests = worker_container_inspect(&engine.host, &endpoint, "{{json .HostConfig.DeviceRequests}}");
    let requests: Value = serde_json::from_str(&requests).unwrap();
    assert_eq!(requests[0]["Driver"], "nvidia", "{requests}");
    assert_eq!(requests[0]["Count"], 2, "{requests}");
    // Back to zero, and billed as GPU time.
    app.scaled_to_zero(&endpoint, &key).await;
    app.fleet
        .service()
        .accrue_workers(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let billed: Value = app
        .get(
            &format!("/v2/billing/serverless?serverlessId={endpoint}&bucketSize=hour&lastN=2"),
            &key,
        )
        .await
        .json()
        .await
        .unwrap();
    let totals = &billed["metadata"]["totals"];
    assert!(totals["gpuAmount"].as_f64().unwrap() > 0.0, "{billed}");
    assert_eq!(totals["cpuAmount"].as_f64(), Some(0.0), "{billed}");
}

/// Workers a GPU endpoint wants and cannot start for want of free GPUs are
/// its throttled ones, with the GPU pool's reason: on a machine of two GPUs
/// (a stand-in `nvidia-smi`), three one-GPU workers are two running and one
/// throttled, until the endpoint wants two; an endpoint whose workers ask
/// for three GPUs each can never start one here, and says so. Throttled
/// workers have no container and no record, so nothing bills them.
#[tokio::test]
async fn workers_that_wait_for_gpus_are_counted_throttled_with_the_reason() {
    let engine = crate::pods::OwnEngine::start_with("gpu-throttled", true, false).await;
    let dir = tempfile::tempdir().unwrap();
    let app = crate::pods::on_two_gpus(&engine, dir.path()).await;
    let (_, key) = app.user_with_key("all").await;
    let gpu_endpoint = |count: u32, min: u32| {
        json!({"name": format!("{count} gpus"), "type": "QUEUE", "image": WORKER_IMAGE,
               "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5},
               "workers": {"min": min, "max": min, "idleTimeout": 1},
               "gpu": {"pools": ["HOPPER_80"], "count": count}})
    };
    let summary_until = |endpoint: String, done: fn(&Value) -> bool| {
        let (app, key) = (&app, &key);
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let view = app.workers_of(&endpoint, key).await;
                if done(&view["summary"]) {
                    return view;
                }
                assert!(Instant::now() < deadline, "never came: {view}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };

    // Three workers of one GPU each on two GPUs: two start, one waits.
    let a = app.create("/v2/serverless", &key, gpu_endpoint(1, 3)).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = summary_until(a.clone(), |s| s["total"] == 2 && s["throttled"] == 1).await;
    assert_eq!(
        view["summary"]["throttledReason"], "waiting for 1 free GPU: 2 of this machine's 2 are in use",
        "{view}"
    );
    assert_eq!(endpoint_containers_on(&engine.host, &a).await.len(), 2);
    // Published for every process: the same from the database's row.
    let row = app.fleet.service().endpoint_by_id(&a).await.unwrap().unwrap();
    assert_eq!((row.throttled, row.throttled_reason.is_some()), (1, true));
    // And the endpoint's public health says so, as RunPod's does.
    let health: Value = app
        .public(Method::GET, &format!("/v2/{a}/health"), &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["workers"]["throttled"], 1, "{health}");
    assert_eq!(health["workers"]["total"], 2, "{health}");
    assert_eq!(health["jobs"]["inQueue"], 0, "{health}");

    // Wanting two, none waits, and the reason is gone.
    patch_workers(&app, &a, &key, json!({"min": 2, "max": 2, "idleTimeout": 1})).await;
    let view = summary_until(a.clone(), |s| s["throttled"] == 0).await;
    assert!(view["summary"].get("throttledReason").is_none(), "{view}");
    assert_eq!(view["summary"]["total"], 2, "{view}");

    // Three GPUs a worker on a machine of two: never, and not retried into a loop of failures.
    let b = app.create("/v2/serverless", &key, gpu_endpoint(3, 1)).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = summary_until(b.clone(), |s| s["throttled"] == 1).await;
    assert_eq!(
        view["summary"]["throttledReason"], "3 GPUs asked for, and this machine has 2",
        "{view}"
    );
    assert_eq!(view["summary"]["total"], 0, "{view}");
    assert!(endpoint_containers_on(&engine.host, &b).await.is_empty());

    // Deleted, they go, and nothing waits any more.
    for endpoint in [&a, &b] {
        let res = app.delete(&format!("/v2/serverless/{endpoint}"), &key).await;
        assert_eq!(res.status().as_u16(), 204);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !endpoint_containers_on(&engine.host, &a).await.is_empty() {
        assert!(Instant::now() < deadline, "the workers were never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let row = app.fleet.service().endpoint_by_id(&b).await.unwrap().unwrap();
    assert_eq!(row.throttled, 0, "a deleted endpoint wants no worker");
}

/// The containers (running or not) of `endpoint` on the tests' engine.
async fn endpoint_containers(endpoint: &str) -> Vec<gantry_runtime::Container> {
    endpoint_containers_on(&docker_host(), endpoint).await
}

/// The containers (running or not) of `endpoint` on the engine at `host`.
async fn endpoint_containers_on(host: &str, endpoint: &str) -> Vec<gantry_runtime::Container> {
    use gantry_runtime::Runtime;
    gantry_runtime::Docker::connect(host)
        .unwrap()
        .list(&[("gantry.id".to_owned(), endpoint.to_owned())])
        .await
        .unwrap()
}

/// Deletes the endpoint through `app` and waits until its containers are
/// gone.
async fn delete_endpoint_and_its_workers(app: &TestApp, endpoint: &str, key: &str) {
    let res = app
        .request(Method::DELETE, &format!("/v2/serverless/{endpoint}"), Some(key))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !endpoint_containers(endpoint).await.is_empty() {
        assert!(Instant::now() < deadline, "the deleted endpoint's workers stayed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The settings of one of several replicas on the engine of the tests: a
/// tick of 200 ms, the serverless keys `keys` (one installation per test,
/// so that no test takes another's workers for orphans), and the database
/// at `database_url` (the harness's own where None).
fn replica(keys: &'static str, database_url: Option<String>) -> impl FnOnce(&mut gantry::Settings) {
    let host = docker_host();
    move |settings: &mut gantry::Settings| {
        settings.serverless.docker_host = Some(host);
        settings.serverless.tick_ms = 200;
        settings.serverless.stop_grace_ms = 5_000;
        settings.serverless.keys = vec![keys.into()];
        if database_url.is_some() {
            settings.database_url = database_url;
        }
    }
}

/// Two platforms on one PostgreSQL database, as two scheduler replicas of a
/// deployment sharing their serverless keys: one reconciler looks at a time,
/// so an endpoint's worker is started once; when the leader stops, it gives
/// the lease up, and the other takes over at its next tick and keeps the
/// worker it finds (same installation) rather than starting a second one.
#[tokio::test]
async fn two_platforms_on_one_database_run_one_reconciler_and_hand_over() {
    let replica = |database_url| replica("both replicas of this test", database_url);
    let mut first = TestApp::spawn_with(Backend::Postgres, replica(None)).await;
    let mut second = TestApp::spawn_with(Backend::Postgres, replica(Some(first.database_url.clone()))).await;
    let (_, key) = first.user_with_key("all").await;
    let looks = "gantry_reconciler_looks_total";
    let endpoint = first
        .endpoint(&key, WORKER_IMAGE, json!({"min": 1, "max": 1, "idleTimeout": 1}))
        .await;
    let containers = || endpoint_containers(&endpoint);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !containers()
        .await
        .iter()
        .any(|c| c.state == gantry_runtime::ContainerState::Running)
    {
        assert!(Instant::now() < deadline, "the endpoint's worker never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Exactly one of the two looks, tick after tick.
    let before = [sample(&first, &key, looks).await, sample(&second, &key, looks).await];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = [sample(&first, &key, looks).await, sample(&second, &key, looks).await];
    let looked: Vec<bool> = before.iter().zip(&after).map(|(b, a)| a > b).collect();
    assert_eq!(
        looked.iter().filter(|l| **l).count(),
        1,
        "looks before {before:?}, after {after:?}"
    );
    let (leader, follower) = if looked[0] {
        (&mut first, &second)
    } else {
        (&mut second, &first)
    };
    let worker = containers().await;
    assert_eq!(worker.len(), 1, "one worker for min 1: {worker:?}");

    // The leader stops: the other takes over at once, before the lease
    // (10 s, renewed when less than 5 s are left) could have lapsed, and
    // keeps the worker.
    leader.reconciler.take().expect("running").stop().await;
    let stopped_at = Instant::now();
    let from = sample(follower, &key, looks).await;
    while sample(follower, &key, looks).await <= from {
        assert!(
            stopped_at.elapsed() < Duration::from_millis(4_500),
            "the other replica did not take over before the lease would have lapsed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = containers().await;
    assert_eq!(
        now.iter().map(|c| &c.id).collect::<Vec<_>>(),
        worker.iter().map(|c| &c.id).collect::<Vec<_>>(),
        "the same worker, and no other"
    );
    assert_eq!(now[0].state, gantry_runtime::ContainerState::Running);

    // Deleted, the endpoint's worker is removed by the new leader.
    delete_endpoint_and_its_workers(follower, &endpoint, &key).await;
}

/// Sets an endpoint's `workers` through `app`.
async fn patch_workers(app: &TestApp, endpoint: &str, key: &str, workers: Value) {
    let res = app
        .send_json(
            Method::PATCH,
            &format!("/v2/serverless/{endpoint}"),
            key,
            &json!({ "workers": workers }),
        )
        .await;
    assert_eq!(res.status(), 200);
}

/// Waits until the endpoint's only worker has called in and is idle, as
/// `app` shows it; its id.
async fn idle_worker(app: &TestApp, endpoint: &str, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view = app.workers_of(endpoint, key).await;
        if view["workers"][0]["status"] == "IDLE" {
            return view["workers"][0]["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the worker never called in: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job queued through a replica that does not lead the fleet wakes the
/// leader over the job signals (Redis), which starts the endpoint's worker
/// at once rather than at its next look: the leader's wake-ups for jobs
/// count the one the signal brought (none without it: the job was queued
/// through the other).
#[tokio::test]
async fn a_job_queued_through_another_replica_wakes_the_leader_over_the_signals() {
    let redis = gantry_testkit::RedisServer::start();
    let settings = |database_url: Option<String>| {
        let base = replica("signalled replicas of this test", database_url);
        let redis_url = redis.url();
        move |s: &mut gantry::Settings| {
            base(s);
            s.redis_url = Some(redis_url);
        }
    };
    let leader = TestApp::spawn_with(Backend::Postgres, settings(None)).await;
    let other = TestApp::spawn_with(Backend::Postgres, settings(Some(leader.database_url.clone()))).await;
    let (_, key) = leader.user_with_key("all").await;
    let looks = "gantry_reconciler_looks_total";
    assert!(sample(&leader, &key, looks).await >= 1.0, "the first replica leads");
    assert_eq!(sample(&other, &key, looks).await, 0.0, "the second does not");
    let endpoint = leader
        .endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 1, "idleTimeout": 5}))
        .await;
    let job_wakeups = r#"gantry_reconciler_wakeups_total{cause="job"}"#;
    let before = sample(&leader, &key, job_wakeups).await;

    let view = other
        .endpoint_job(
            &endpoint,
            &key,
            "runsync?wait=300000",
            json!({"via": "the other replica"}),
        )
        .await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["output"]["echo"]["via"], "the other replica");
    assert_eq!(
        sample(&leader, &key, job_wakeups).await,
        before + 1.0,
        "woken by the signal"
    );
    assert_eq!(sample(&other, &key, looks).await, 0.0, "the second never looked");
    delete_endpoint_and_its_workers(&leader, &endpoint, &key).await;
}

/// Moves the fleet lease from `from` to `to` behind their backs (as when
/// `from`'s renewal came too late), and waits until `to` leads and `from`
/// has stopped looking.
async fn move_lease(from: &TestApp, to: &TestApp, key: &str) {
    let looks = "gantry_reconciler_looks_total";
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000;
    // Both share one database, which only the settings name (the harness's
    // own is the first's).
    let url = to.settings.database_url.clone().expect("a shared database");
    let db = sea_orm::Database::connect(&url).await.unwrap();
    use sea_orm::ConnectionTrait;
    db.execute_unprepared(&format!(
        "UPDATE leases SET holder = '{}', until_ms = {until} WHERE name = 'fleet'",
        to.fleet.config().instance
    ))
    .await
    .unwrap();
    db.close().await.ok();
    let led = sample(to, key, looks).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = sample(from, key, looks).await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        if sample(from, key, looks).await == before && sample(to, key, looks).await > led {
            break;
        }
        assert!(Instant::now() < deadline, "the lease did not pass");
    }
}

/// Two schedulers on one database, whose workers each call the one that
/// started them while the other may lead the fleet (a lease that lapsed
/// while its holder ran on, then a stop). The leader judges a worker hosted
/// by the other from what that one publishes, and stops it through it:
/// - a busy worker of an older release that never called the leader is
///   neither replaced nor removed mid-job: its host drains it, and it goes
///   once its job is done (run once, on it);
/// - an idle one past its idle timeout is retired by its host;
/// - one whose host stopped calls nobody, and the leader replaces it.
#[tokio::test]
async fn workers_hosted_by_another_replica_are_judged_by_what_it_publishes_and_stopped_through_it() {
    let replica = |database_url| {
        let base = replica("the replicas of the hosting test", database_url);
        move |settings: &mut gantry::Settings| {
            base(settings);
            // Short, for the replacement of the orphaned worker at the end,
            // yet long enough for a worker to start on a loaded machine (3 s
            // was not, in one CI run beside other builds: every worker was
            // replaced before it could call in).
            settings.serverless.start_timeout_ms = 10_000;
        }
    };
    let first = TestApp::spawn_with(Backend::Postgres, replica(None)).await;
    let (_, key) = first.user_with_key("all").await;
    let looks = "gantry_reconciler_looks_total";
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(&first, &key, looks).await == 0.0 {
        assert!(Instant::now() < deadline, "the first replica never took the lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut second = TestApp::spawn_with(Backend::Postgres, replica(Some(first.database_url.clone()))).await;
    let endpoint = first
        .endpoint(&key, WORKER_IMAGE, json!({"min": 1, "max": 1, "idleTimeout": 2}))
        .await;
    // The endpoint's containers: worker id -> running.
    let containers = || async {
        endpoint_containers(&endpoint)
            .await
            .into_iter()
            .map(|c| {
                let running = c.state == gantry_runtime::ContainerState::Running;
                (c.labels["gantry.worker"].clone(), running)
            })
            .collect::<std::collections::BTreeMap<String, bool>>()
    };
    // The first starts the worker, which calls it, and gives it a long job.
    let old = idle_worker(&first, &endpoint, &key).await;
    let long = first
        .endpoint_job(&endpoint, &key, "run", json!({"sleep": 15, "tag": "long"}))
        .await;
    let long_id = long["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.status_of(&endpoint, &key, &long_id).await["status"] != "IN_PROGRESS" {
        assert!(Instant::now() < deadline, "the long job never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The second comes to lead, sees the worker busy as the first
    // publishes it, and a new release makes the worker stale mid-job.
    move_lease(&first, &second, &key).await;
    let view = second.workers_of(&endpoint, &key).await;
    assert_eq!(view["workers"][0]["id"], old.as_str(), "{view}");
    assert_eq!(view["workers"][0]["status"], "RUNNING", "{view}");
    let res = second
        .send_json(
            Method::PATCH,
            &format!("/v2/serverless/{endpoint}"),
            &key,
            &json!({"env": {"RELEASE": "2"}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    // Past the start timeout, the job runs on where it started, once.
    while first.status_of(&endpoint, &key, &long_id).await["status"] == "IN_PROGRESS" {
        let now = containers().await;
        assert_eq!(now.get(&old), Some(&true), "the busy worker was stopped: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = first.final_of(&endpoint, &key, &long_id).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["output"]["worker"], old.as_str(), "{done}");
    assert_eq!(done["output"]["echo"]["tag"], "long");
    // Drained, it goes; the new release's worker (the second's) stays.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fresh = loop {
        let now = containers().await;
        let view = second.workers_of(&endpoint, &key).await;
        if !now.contains_key(&old) && now.len() == 1 && view["workers"][0]["status"] == "IDLE" {
            assert_eq!(view["workers"][0]["version"], 2, "{view}");
            break view["workers"][0]["id"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the old worker was not replaced: {now:?} {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The first leads again; the endpoint may go to zero: the second's idle
    // worker is retired by the second, at the first's request.
    move_lease(&second, &first, &key).await;
    patch_workers(&first, &endpoint, &key, json!({"min": 0, "max": 1, "idleTimeout": 2})).await;
    first.scaled_to_zero(&endpoint, &key).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while containers().await.contains_key(&fresh) {
        assert!(Instant::now() < deadline, "the idle worker's container stayed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A worker of the second's, which leads again; the second stops (its
    // leases end) and its listener goes: the first leads and replaces the
    // worker, which calls nobody now.
    move_lease(&first, &second, &key).await;
    patch_workers(&second, &endpoint, &key, json!({"min": 1, "max": 1, "idleTimeout": 2})).await;
    let orphan = idle_worker(&second, &endpoint, &key).await;
    second.reconciler.take().expect("running").stop().await;
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(120);
    let replacement = loop {
        let view = first.workers_of(&endpoint, &key).await;
        let workers = view["workers"].as_array().unwrap_or_else(|| panic!("{view}"));
        if workers.len() == 1 && workers[0]["id"] != orphan.as_str() && workers[0]["status"] == "IDLE" {
            break workers[0]["id"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the orphaned worker was not replaced: {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let view = first
        .endpoint_job(&endpoint, &key, "runsync?wait=120000", json!({"after": "handover"}))
        .await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["output"]["worker"], replacement.as_str(), "{view}");
    let left: Vec<String> = containers().await.into_keys().collect();
    assert_eq!(left, vec![replacement], "only the replacement's container is left");
    delete_endpoint_and_its_workers(&first, &endpoint, &key).await;
}

/// Workers on the engine's bridge network (`serverless.network = "bridge"`),
/// as on an engine whose containers do not share the host's network: a
/// worker reaches Gantry at `host.docker.internal` (the engine's host
/// gateway, which the fleet maps into every worker), runs a job and is
/// removed when idle. The engine is one of this test's own, with a bridge of
/// its own and still no iptables rules; Gantry's public listener is bound to
/// the host's address on that bridge.
#[tokio::test]
async fn bridge_networked_workers_reach_gantry_at_the_host_gateway() {
    let engine = crate::pods::OwnEngine::start_bridged("bridge").await;
    let host = crate::pods::OwnEngine::BRIDGE_HOST;
    // A port free on the bridge's address now, for the listener and the
    // URL workers are given (both must be known before the platform starts).
    let port = std::net::TcpListener::bind((host, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = TestApp::spawn_with(Backend::Sqlite, {
        let docker = engine.host.clone();
        move |settings| {
            settings.public_addr = format!("{host}:{port}");
            settings.serverless.docker_host = Some(docker);
            settings.serverless.network = "bridge".into();
            settings.serverless.worker_base_url = Some(format!("http://host.docker.internal:{port}"));
            settings.serverless.tick_ms = 200;
            settings.serverless.stop_grace_ms = 2_000;
        }
    })
    .await;
    let (_, key) = app.user_with_key("all").await;
    let endpoint = app
        .endpoint(&key, WORKER_IMAGE, json!({"min": 0, "max": 1, "idleTimeout": 1}))
        .await;
    let view = app
        .endpoint_job(&endpoint, &key, "runsync?wait=300000", json!({"over": "bridge"}))
        .await;
    assert_eq!(view["status"], "COMPLETED", "{view}");
    assert_eq!(view["output"]["echo"]["over"], "bridge");
    // The worker's container was on the bridge, not the host's network.
    let inspected = worker_container_inspect(
        &engine.host,
        &endpoint,
        "{{.HostConfig.NetworkMode}} {{json .HostConfig.ExtraHosts}}",
    );
    assert_eq!(
        inspected, r#"bridge ["host.docker.internal:host-gateway"]"#,
        "{inspected}"
    );
    app.scaled_to_zero(&endpoint, &key).await;
}
