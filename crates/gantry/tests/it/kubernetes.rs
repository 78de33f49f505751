//! Serverless endpoints and pods on the Kubernetes runtime, end to end: Gantry talks to a real
//! kube-apiserver (`scripts/test-kube.sh`), and the unmodified runpod-python worker runs the jobs.
//!
//! The test cluster has an API server and etcd but no kubelet, so this file brings a small one:
//! [`Kubelet`] binds each pending pod to a node, runs its container on the private Docker engine
//! (image, args, env, host network, as the pod spec says), writes the pod's status back through
//! `pods/status` (running, then the exit code), ends pods whose `activeDeadlineSeconds` is set,
//! and removes the containers of pods that were deleted. Everything Gantry does, it does through
//! the Kubernetes API only.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gantry_runtime::{ContainerSpec, Docker, Network, Runtime};
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};

const WORKER_IMAGE: &str = "gantry-test/runpod-worker:1";
const BUSYBOX: &str = "gantry-test/busybox:1";

/// `GANTRY_TEST_KUBE_SERVER`, `_TOKEN`, `_CA`: from the environment, or from
/// `scripts/test-kube.sh start` (once per test process).
fn kube_env() -> (String, String, String) {
    static STARTED: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let (Some(server), Some(token), Some(ca)) = (
        from_env("GANTRY_TEST_KUBE_SERVER"),
        from_env("GANTRY_TEST_KUBE_TOKEN"),
        from_env("GANTRY_TEST_KUBE_CA"),
    ) {
        return (server, token, ca);
    }
    let lines = STARTED.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-kube.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg("start")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "`scripts/test-kube.sh start` failed: {stdout}");
        stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    });
    let get = |name: &str| {
        lines
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("scripts/test-kube.sh printed no {name}"))
    };
    (
        get("GANTRY_TEST_KUBE_SERVER"),
        get("GANTRY_TEST_KUBE_TOKEN"),
        get("GANTRY_TEST_KUBE_CA"),
    )
}

/// The API server as an administrator (and a kubelet) reaches it.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    server: String,
    token: String,
    ns: String,
}

impl Api {
    async fn new(ns: String) -> Api {
        let (server, token, ca) = kube_env();
        let tls = gantry_net::tls_config(Some(&PathBuf::from(ca))).unwrap();
        let api = Api {
            http: reqwest::Client::builder()
                .tls_backend_preconfigured(tls)
                .build()
                .unwrap(),
            server,
            token,
            ns,
        };
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": api.ns}});
        let (status, answer) = api.send(Method::POST, "/api/v1/namespaces", Some(body), None).await;
        assert!(status == 201 || status == 409, "namespace: {status} {answer}");
        api
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>, content_type: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.server))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .header("Content-Type", content_type.unwrap_or("application/json"))
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn path(&self, rest: &str) -> String {
        format!("/api/v1/namespaces/{}/{rest}", self.ns)
    }

    async fn pods(&self) -> Vec<Value> {
        let (status, list) = self.send(Method::GET, &self.path("pods"), None, None).await;
        assert_eq!(status, 200, "{list}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    async fn patch_status(&self, pod: &str, status: Value) {
        // A pod deleted meanwhile answers 404: nothing to report then.
        let (code, answer) = self
            .send(
                Method::PATCH,
                &self.path(&format!("pods/{pod}/status")),
                Some(json!({"status": status})),
                Some("application/merge-patch+json"),
            )
            .await;
        assert!(code == 200 || code == 404, "status of {pod}: {code} {answer}");
    }
}

fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    gantry_runtime::format_rfc3339(i64::try_from(secs).unwrap())
}

/// The stand-in kubelet of one namespace (see the module's documentation); stops when dropped.
struct Kubelet {
    task: tokio::task::JoinHandle<()>,
    /// The namespace whose containers it runs.
    ns: String,
}

impl Drop for Kubelet {
    /// Stops the kubelet and removes every container it started for its
    /// namespace, still running or not: a worker left running after its
    /// test polls a platform that is gone, and the busy loop would slow the
    /// test binaries after this one.
    fn drop(&mut self) {
        self.task.abort();
        let label = format!("kubelet.namespace={}", self.ns);
        crate::serverless::remove_containers(&crate::serverless::docker_host(), &[&label]);
    }
}

impl Kubelet {
    fn start(api: Api, docker: Docker) -> Kubelet {
        let ns = api.ns.clone();
        let task = tokio::spawn(async move {
            loop {
                kubelet_pass(&api, &docker).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Kubelet { task, ns }
    }
}

/// Namespaces whose cluster has no node with a free GPU now: the stand-in
/// scheduler leaves their GPU Pods unplaced, as the real one does.
static NO_FREE_GPUS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// What the real scheduler says of a Pod asking for GPUs no node has free.
const NO_GPU_NODE: &str = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are \
     available: 1 No preemption victims found for incoming pod.";

async fn kubelet_pass(api: &Api, docker: &Docker) {
    let pods = api.pods().await;
    let mine = [("kubelet.namespace".to_owned(), api.ns.clone())];
    let containers = docker.list(&mine).await.unwrap();
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        let wants_gpus = !pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_null();
        let unplaced = pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
        if unplaced && wants_gpus && NO_FREE_GPUS.lock().unwrap().contains(&api.ns) {
            if pod["status"]["conditions"][0]["reason"] != "Unschedulable" {
                let condition = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": NO_GPU_NODE, "lastTransitionTime": now_rfc3339()});
                api.patch_status(&name, json!({"phase": "Pending", "conditions": [condition]}))
                    .await;
            }
            continue;
        }
        if unplaced {
            let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                 "target": {"kind": "Node", "name": "docker-node"}});
            api.send(
                Method::POST,
                &api.path(&format!("pods/{name}/binding")),
                Some(binding),
                None,
            )
            .await;
            continue;
        }
        let container = containers.iter().find(|c| c.labels.get("kubelet.uid") == Some(&uid));
        let status = |state: Value, phase: &str| {
            json!({"phase": phase, "podIP": "127.0.0.1", "startTime": now_rfc3339(),
                   "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}],
                   "containerStatuses": [{"name": "main", "ready": phase == "Running", "restartCount": 0,
                                          "image": pod["spec"]["containers"][0]["image"], "imageID": "", "state": state}]})
        };
        match (phase, container) {
            ("Pending", None) => {
                let spec = &pod["spec"]["containers"][0];
                let mut run = ContainerSpec::new(
                    format!("kubelet-{}-{}", api.ns, &uid[..8]),
                    spec["image"].as_str().unwrap(),
                );
                run.cmd = spec["args"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect());
                run.env = spec["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        (
                            e["name"].as_str().unwrap().to_owned(),
                            e["value"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect();
                run.network = Network::Host;
                run.labels.insert("kubelet.namespace".into(), api.ns.clone());
                run.labels.insert("kubelet.uid".into(), uid.clone());
                match docker.run(&run).await {
                    Ok(_) => {
                        api.patch_status(
                            &name,
                            status(json!({"running": {"startedAt": now_rfc3339()}}), "Running"),
                        )
                        .await;
                    }
                    Err(error) => {
                        let waiting = json!({"waiting": {"reason": "ErrImagePull", "message": error.to_string()}});
                        api.patch_status(&name, status(waiting, "Pending")).await;
                    }
                }
            }
            ("Running", Some(c)) => {
                let deadline = !pod["spec"]["activeDeadlineSeconds"].is_null();
                if deadline {
                    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
                    docker.stop(&c.id, Duration::from_secs(grace)).await.unwrap();
                }
                let inspected = docker.inspect(&c.id).await.unwrap();
                if inspected.state == gantry_runtime::ContainerState::Exited {
                    let code = inspected.exit_code.unwrap_or(0);
                    let ended = json!({"terminated": {"exitCode": code, "startedAt": inspected.started_at,
                                                      "finishedAt": inspected.finished_at}});
                    let phase = if code == 0 && !deadline { "Succeeded" } else { "Failed" };
                    let mut status = status(ended, phase);
                    if deadline {
                        status["reason"] = json!("DeadlineExceeded");
                    }
                    api.patch_status(&name, status).await;
                }
            }
            _ => {}
        }
    }
    // Containers of pods that are gone (deleted by Gantry).
    for c in &containers {
        let uid = c.labels.get("kubelet.uid").cloned().unwrap_or_default();
        if !pods.iter().any(|p| p["metadata"]["uid"] == uid.as_str()) {
            let _ = docker.remove(&c.id).await;
        }
    }
}

/// Gantry on the Kubernetes runtime in namespace `ns`, and the stand-in kubelet of that namespace.
async fn spawn(ns: &str) -> (TestApp, Api, Kubelet) {
    spawn_tuned(ns, |_| {}).await
}

/// [`spawn`], with `tune` applied to the settings last.
async fn spawn_tuned(ns: &str, tune: impl FnOnce(&mut gantry::Settings) + Send + 'static) -> (TestApp, Api, Kubelet) {
    let (server, token, ca) = kube_env();
    let token_file = std::env::temp_dir().join(format!("gantry-kube-token-{}", std::process::id()));
    std::fs::write(&token_file, &token).unwrap();
    let ns = format!("{ns}-{}", std::process::id());
    let api = Api::new(ns.clone()).await;
    let docker = Docker::connect(&crate::serverless::docker_host()).unwrap();
    let kubelet = Kubelet::start(api.clone(), docker);
    let app = TestApp::spawn_with(Backend::Sqlite, move |settings| {
        settings.serverless.runtime = "kubernetes".into();
        settings.serverless.kubernetes.server = Some(server);
        settings.serverless.kubernetes.token_file = Some(token_file.display().to_string());
        settings.serverless.kubernetes.ca_file = Some(ca);
        settings.serverless.kubernetes.namespace = Some(ns);
        settings.serverless.tick_ms = 200;
        settings.serverless.stop_grace_ms = 5_000;
        tune(settings);
    })
    .await;
    (app, api, kubelet)
}

async fn json_of(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

/// An endpoint on Kubernetes: each worker is a Pod of the endpoint's image with the RunPod
/// environment; jobs sent to the endpoint are run by the unmodified SDK in those pods; idle
/// workers' pods are deleted; every worker is billed up to its end.
#[tokio::test]
async fn an_endpoint_on_kubernetes_runs_its_jobs_in_pods_and_scales_back_to_zero() {
    let (app, api, _kubelet) = spawn("gt-serverless").await;
    let (_, key) = app.user_with_key("all").await;
    let body = json!({
        "name": "on kubernetes", "type": "QUEUE", "image": WORKER_IMAGE,
        "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5},
        "workers": {"min": 0, "max": 2, "idleTimeout": 1},
        "cpu": [{"id": "cpu3c", "vcpuCount": 2}],
        "env": {"GREETING": "hello"},
    });
    let (status, created) = json_of(app.send_json(Method::POST, "/v2/serverless", &key, &body).await).await;
    assert_eq!(status, 201, "{created}");
    let endpoint = created["id"].as_str().unwrap().to_owned();
    assert!(api.pods().await.is_empty(), "no pod before a job");

    let client = crate::harness::http_client(Duration::from_secs(300));
    let job = |route: &'static str, input: Value| {
        let (client, endpoint, key, base) = (client.clone(), endpoint.clone(), key.clone(), app.public_base.clone());
        async move {
            let res = client
                .post(format!("{base}/v2/{endpoint}/{route}"))
                .bearer_auth(&key)
                .json(&json!({"input": input}))
                .send()
                .await
                .unwrap();
            json_of(res).await
        }
    };
    let mut queued = Vec::new();
    for i in 0..12 {
        let (status, view) = job("run", json!({"i": i, "sleep": 0.05})).await;
        assert_eq!(status, 200, "{view}");
        queued.push(view["id"].as_str().unwrap().to_owned());
    }
    let synced = futures_util::future::join_all((0..3).map(|i| job("runsync?wait=300000", json!({"sync": i})))).await;

    // While they run: the workers are pods with what the endpoint says.
    for (i, (status, view)) in synced.iter().enumerate() {
        assert_eq!(*status, 200, "{view}");
        assert_eq!(view["status"], "COMPLETED", "{view}");
        assert_eq!(view["output"]["echo"]["sync"], i);
    }
    let pods = api.pods().await;
    assert!(!pods.is_empty() && pods.len() <= 2, "{} pods", pods.len());
    for pod in &pods {
        assert_eq!(pod["metadata"]["labels"]["gantry.id"], endpoint.as_str());
        assert_eq!(pod["metadata"]["labels"]["gantry.kind"], "worker");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], WORKER_IMAGE);
        assert_eq!(container["resources"]["limits"]["cpu"], "2");
        let env: Vec<&str> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        for name in [
            "GREETING",
            "RUNPOD_POD_ID",
            "RUNPOD_AI_API_KEY",
            "RUNPOD_WEBHOOK_GET_JOB",
        ] {
            assert!(env.contains(&name), "{name} missing from {env:?}");
        }
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    }
    let mut seen = std::collections::HashSet::new();
    for (i, id) in queued.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(180);
        let view = loop {
            let (_, view) = json_of(
                client
                    .get(format!("{}/v2/{endpoint}/status/{id}", app.public_base))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            if view["status"] == "COMPLETED" || view["status"] == "FAILED" {
                break view;
            }
            assert!(Instant::now() < deadline, "job {id} never ended: {view}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(view["status"], "COMPLETED", "{view}");
        assert_eq!(view["output"]["echo"]["i"], i);
        seen.insert(id.clone());
    }
    assert_eq!(seen.len(), 12);

    // Idle past idleTimeout: back to zero, and no pod is left.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, workers) = json_of(app.get(&format!("/v2/serverless/{endpoint}/workers"), &key).await).await;
        if workers["summary"]["total"] == 0 && api.pods().await.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "never scaled back to 0: {workers}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every worker ended, billed up to its end.
    app.fleet
        .service()
        .accrue_workers(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let db = sea_orm::Database::connect(&app.database_url).await.unwrap();
    use sea_orm::ConnectionTrait;
    let rows = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!("SELECT ended_at_ms, billed_until_ms FROM endpoint_workers WHERE endpoint_id = '{endpoint}'"),
        ))
        .await
        .unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        let ended: Option<i64> = row.try_get_by_index(0).unwrap();
        let billed: i64 = row.try_get_by_index(1).unwrap();
        assert_eq!(Some(billed), ended, "every worker ended and billed to its end");
    }
}

/// A pod on Kubernetes: created and RUNNING once its Pod runs, stopped (its Pod ended by its
/// deadline and kept), started again (a new Pod from the same manifest), terminated (no Pod
/// left). An image that cannot be pulled is ERROR with the reason, and no Pod is left running.
#[tokio::test]
async fn a_pod_on_kubernetes_lives_its_whole_life() {
    let (app, api, _kubelet) = spawn("gt-pods").await;
    let (_, key) = app.user_with_key("all").await;
    // A network volume of 25 GB: its claim asks for that much.
    let (status, volume) = json_of(
        app.send_json(
            Method::POST,
            "/v2/network-volumes",
            &key,
            &json!({"name": "data", "size": 25, "dataCenter": "EU-RO-1"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{volume}");
    let volume = volume["id"].as_str().unwrap().to_owned();
    let create = |image: &'static str, mounts: Value| {
        let (app, key) = (&app, key.clone());
        async move {
            let body = json!({"name": "k8s pod", "image": image, "args": "sh -c 'echo up; exec sleep 600'",
                              "cpu": {"id": "cpu3c", "vcpuCount": 2}, "mounts": mounts});
            let (status, created) = json_of(app.send_json(Method::POST, "/v2/pods", &key, &body).await).await;
            assert_eq!(status, 201, "{created}");
            created["id"].as_str().unwrap().to_owned()
        }
    };
    let wait_for = |want: &'static str, id: String| {
        let (app, key) = (&app, key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let (_, pod) = json_of(app.get(&format!("/v2/pods/{id}"), &key).await).await;
                if pod["status"] == want {
                    return pod;
                }
                assert!(Instant::now() < deadline, "pod never {want}: {pod}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let action = |id: String, what: &'static str| {
        let (app, key) = (&app, key.clone());
        async move {
            let res = app
                .send_json(
                    Method::POST,
                    &format!("/v2/pods/{id}/action"),
                    &key,
                    &json!({"action": what}),
                )
                .await;
            assert!(res.status().is_success(), "{what}: {}", res.status());
        }
    };

    let id = create(BUSYBOX, json!({"network": [{"volumeId": volume, "path": "/data"}]})).await;
    let running = wait_for("RUNNING", id.clone()).await;
    assert!(running["startedAt"].is_string(), "{running}");
    let pods = api.pods().await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["metadata"]["labels"]["gantry.kind"], "pod");
    assert_eq!(
        pods[0]["spec"]["containers"][0]["args"],
        json!(["sh", "-c", "echo up; exec sleep 600"])
    );
    let first_uid = pods[0]["metadata"]["uid"].clone();
    let claim = gantry_runtime::object_name(&format!("gantry-vol-{volume}"));
    let (status, pvc) = api
        .send(
            Method::GET,
            &api.path(&format!("persistentvolumeclaims/{claim}")),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200, "{pvc}");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "25Gi", "{pvc}");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteMany"]));

    action(id.clone(), "stop").await;
    wait_for("EXITED", id.clone()).await;
    let pods = api.pods().await;
    assert_eq!(
        pods[0]["status"]["phase"], "Failed",
        "the stopped Pod stays, ended by its deadline"
    );

    action(id.clone(), "start").await;
    wait_for("RUNNING", id.clone()).await;
    let pods = api.pods().await;
    assert_eq!(pods.len(), 1);
    assert_ne!(pods[0]["metadata"]["uid"], first_uid, "started again as a new Pod");

    action(id.clone(), "terminate").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !api.pods().await.is_empty() {
        assert!(Instant::now() < deadline, "the Pod was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An image the node cannot pull: ERROR, with the node's reason, and its Pod removed.
    let broken = create("gantry-test/no-such-image:1", json!({})).await;
    let failed = wait_for("ERROR", broken.clone()).await;
    let reason = failed["statusReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ErrImagePull") && reason.contains("no-such-image"),
        "{failed}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !api.pods().await.is_empty() {
        assert!(Instant::now() < deadline, "the broken Pod was left behind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(failed["actions"], json!(["start", "terminate"]), "{failed}");
}

/// A GPU endpoint's workers are placed by Kubernetes on what the endpoint asks for: a node with a
/// GPU type of its pools (less the excluded types), in one of its data centers, whose driver
/// supports its CUDA versions; and they ask for their GPUs as `nvidia.com/gpu`.
#[tokio::test]
async fn a_gpu_endpoints_workers_ask_kubernetes_for_its_gpu_type_data_center_and_cuda() {
    let (app, api, _kubelet) = spawn("gt-placement").await;
    let (_, key) = app.user_with_key("all").await;
    let body = json!({
        "name": "placed", "type": "QUEUE", "image": WORKER_IMAGE,
        "scaling": {"type": "REQUEST_COUNT", "requestCount": 1},
        "workers": {"min": 1, "max": 1, "idleTimeout": 5},
        "gpu": {"pools": ["HOPPER_80"], "excludedTypes": ["NVIDIA H100 PCIe"], "count": 2,
                "minCudaVersion": "12.4"},
        "dataCenterIds": ["EU-RO-1"],
    });
    let (status, created) = json_of(app.send_json(Method::POST, "/v2/serverless", &key, &body).await).await;
    assert_eq!(status, 201, "{created}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod = loop {
        if let Some(pod) = api.pods().await.into_iter().next() {
            break pod;
        }
        assert!(Instant::now() < deadline, "no worker Pod was made");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "2"
    );
    let terms =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let base = [
        json!({"key": "gantry.dev/data-center", "operator": "In", "values": ["EU-RO-1"]}),
        json!({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}),
    ];
    let term = |extra: Vec<Value>| json!({"matchExpressions": base.iter().cloned().chain(extra).collect::<Vec<_>>()});
    assert_eq!(
        terms,
        &json!([
            term(vec![
                json!({"key": "nvidia.com/cuda.runtime-version.major", "operator": "Gt", "values": ["12"]})
            ]),
            term(vec![
                json!({"key": "nvidia.com/cuda.runtime-version.major", "operator": "In", "values": ["12"]}),
                json!({"key": "nvidia.com/cuda.runtime-version.minor", "operator": "Gt", "values": ["3"]}),
            ]),
        ]),
        "{pod}"
    );
    let endpoint = created["id"].as_str().unwrap();
    let res = app
        .send_json(Method::DELETE, &format!("/v2/serverless/{endpoint}"), &key, &json!({}))
        .await;
    assert!(res.status().is_success(), "{}", res.status());
}

/// A GPU endpoint's worker whose Pod no node can take (the cluster's GPUs
/// are taken) is THROTTLED with the scheduler's reason, not billed for the
/// wait, and not replaced for not calling in; once a node frees, the same
/// Pod runs and does the job that waited.
#[tokio::test]
async fn a_worker_whose_pod_waits_for_a_gpu_node_is_throttled_and_not_billed() {
    // A start timeout the wait outlasts (a worker that has not called in
    // by then is replaced, unless its Pod is still waiting for a node). It
    // runs again once the Pod has a node, so it must also cover the start
    // of the worker's Python on a loaded machine: 5 s did not, under three
    // busy loops on two cores, and the Pod was rightly replaced.
    const START_TIMEOUT: Duration = Duration::from_secs(20);
    let (app, api, _kubelet) = spawn_tuned("gt-throttled", |s| {
        s.serverless.start_timeout_ms = START_TIMEOUT.as_millis() as u64;
    })
    .await;
    NO_FREE_GPUS.lock().unwrap().push(api.ns.clone());
    let (_, key) = app.user_with_key("all").await;
    let body = json!({
        "name": "waits", "type": "QUEUE", "image": WORKER_IMAGE,
        "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5},
        "workers": {"min": 1, "max": 1, "idleTimeout": 5},
        "gpu": {"pools": ["HOPPER_80"], "count": 1},
    });
    let (status, created) = json_of(app.send_json(Method::POST, "/v2/serverless", &key, &body).await).await;
    assert_eq!(status, 201, "{created}");
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let workers = || {
        let (app, key, endpoint) = (&app, &key, &endpoint);
        async move {
            let res = app.get(&format!("/v2/serverless/{endpoint}/workers"), key).await;
            json_of(res).await.1
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let view = loop {
        let view = workers().await;
        if view["summary"]["throttled"] == 1 {
            break view;
        }
        assert!(Instant::now() < deadline, "never throttled: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["workers"][0]["status"], "THROTTLED", "{view}");
    assert_eq!(view["workers"][0]["reason"], NO_GPU_NODE, "{view}");
    assert_eq!(view["summary"]["throttledReason"], NO_GPU_NODE, "{view}");
    assert_eq!(view["summary"]["initializing"], 0, "{view}");
    let pod = view["workers"][0]["id"].as_str().unwrap().to_owned();

    // A job waits with it, past the start timeout: the same Pod, nothing billed.
    let client = crate::harness::http_client(Duration::from_secs(300));
    let res = client
        .post(format!("{}/v2/{endpoint}/run", app.public_base))
        .bearer_auth(&key)
        .json(&json!({"input": {"waited": true}}))
        .send()
        .await
        .unwrap();
    let (status, queued) = json_of(res).await;
    assert_eq!(status, 200, "{queued}");
    tokio::time::sleep(START_TIMEOUT + Duration::from_secs(2)).await;
    let view = workers().await;
    assert_eq!(view["workers"][0]["id"], pod.as_str(), "not replaced: {view}");
    assert_eq!(api.pods().await.len(), 1);
    let service = app.fleet.service();
    service
        .accrue_workers(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let path = format!("/v2/billing/serverless?serverlessId={endpoint}&bucketSize=hour&lastN=2");
    let billed = || async { json_of(app.get(&path, &key).await).await.1["metadata"]["totals"]["gpuAmount"].as_f64() };
    assert_eq!(billed().await.unwrap_or(0.0), 0.0, "the wait is not billed");

    // A node frees: the Pod runs, the job is done, and from then on it is billed.
    NO_FREE_GPUS.lock().unwrap().retain(|ns| *ns != api.ns);
    let id = queued["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let res = app
            .public(Method::GET, &format!("/v2/{endpoint}/status/{id}"), &key)
            .send()
            .await;
        let (_, job) = json_of(res.unwrap()).await;
        if job["status"] == "COMPLETED" {
            assert_eq!(job["output"]["echo"]["waited"], true, "{job}");
            break;
        }
        assert!(Instant::now() < deadline, "the job never ran: {job}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let view = workers().await;
    assert_eq!(view["workers"][0]["id"], pod.as_str(), "{view}");
    assert_eq!(view["summary"]["throttled"], 0, "{view}");
    assert!(view["workers"][0].get("reason").is_none(), "{view}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    service
        .accrue_workers(gantry_containers::service::now_ms())
        .await
        .unwrap();
    assert!(billed().await.unwrap() > 0.0, "billed once it runs");
    let res = app
        .send_json(Method::DELETE, &format!("/v2/serverless/{endpoint}"), &key, &json!({}))
        .await;
    assert!(res.status().is_success(), "{}", res.status());
}
