//! The Kubernetes runtime against a real kube-apiserver (1.20, with etcd; no kubelet).
//!
//! These tests need the server that `scripts/test-kube.sh start` runs, named by
//! `GANTRY_TEST_KUBE_SERVER`, `GANTRY_TEST_KUBE_TOKEN` and `GANTRY_TEST_KUBE_CA`; they fail
//! (rather than skip) without it. `scripts/test` starts it. There is no kubelet, so the tests play
//! its part where they need one: they bind a pod to a node, and write its status (running, then
//! ended once its deadline is set) through `pods/status`, as a kubelet would.
//!
//! Each test works in a namespace of its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use gantry_runtime::{
    ContainerSpec, ContainerState, KubeToken, Kubernetes, KubernetesConfig, Network, RegistryAuth, Runtime,
    RuntimeError,
};
use serde_json::{Value, json};

fn env(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{name} is not set. These tests need a real kube-apiserver: run `bash scripts/test-kube.sh start` \
             and export the three GANTRY_TEST_KUBE_* lines it prints (scripts/test does this)."
        ),
    }
}

fn config(namespace: &str) -> KubernetesConfig {
    KubernetesConfig {
        server: env("GANTRY_TEST_KUBE_SERVER"),
        ca_file: Some(PathBuf::from(env("GANTRY_TEST_KUBE_CA"))),
        token: KubeToken::Value(env("GANTRY_TEST_KUBE_TOKEN")),
        namespace: namespace.to_owned(),
        storage_class: Some("gantry-test-rwx".into()),
        volume_size_gib: 20,
        request_timeout: Duration::from_secs(10),
    }
}

/// What a kubelet and an administrator would do, over plain HTTPS.
struct Cluster {
    http: reqwest::Client,
    server: String,
    token: String,
    ns: String,
}

impl Cluster {
    async fn new(test: &str) -> Cluster {
        let tls = gantry_net::tls_config(Some(&PathBuf::from(env("GANTRY_TEST_KUBE_CA")))).unwrap();
        let cluster = Cluster {
            http: reqwest::Client::builder()
                .tls_backend_preconfigured(tls)
                .build()
                .unwrap(),
            server: env("GANTRY_TEST_KUBE_SERVER"),
            token: env("GANTRY_TEST_KUBE_TOKEN"),
            ns: format!("gt-{test}-{}", std::process::id()),
        };
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cluster.ns}});
        let (status, answer) = cluster
            .send(reqwest::Method::POST, "/api/v1/namespaces", Some(body), None)
            .await;
        assert!(status == 201 || status == 409, "namespace: {status} {answer}");
        cluster
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        patch: Option<&str>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.server))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .header("Content-Type", patch.unwrap_or("application/json"))
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

    async fn get(&self, rest: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, &self.path(rest), None, None).await
    }

    async fn delete(&self, rest: &str) {
        let (status, answer) = self.send(reqwest::Method::DELETE, &self.path(rest), None, None).await;
        assert_eq!(status, 200, "delete {rest}: {answer}");
    }

    /// What the scheduler does: the pod is placed on `node`.
    async fn bind(&self, pod: &str, node: &str) {
        let body = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}});
        let (status, answer) = self
            .send(
                reqwest::Method::POST,
                &self.path(&format!("pods/{pod}/binding")),
                Some(body),
                None,
            )
            .await;
        assert_eq!(status, 201, "binding: {answer}");
    }

    /// What the kubelet reports once the container runs.
    async fn running(&self, pod: &str, ip: &str) {
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "startTime": "2026-11-29T06:00:00Z",
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"running": {"startedAt": "2026-11-29T06:00:01Z"}}}]}});
        self.patch_status(pod, status).await;
    }

    /// What the kubelet reports once the container ended.
    async fn ended(&self, pod: &str, exit_code: i32, reason: &str) {
        let status = json!({"status": {
            "phase": "Failed", "reason": reason,
            "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"terminated": {"exitCode": exit_code, "startedAt": "2026-11-29T06:00:01Z",
                                                            "finishedAt": "2026-11-29T06:00:09Z"}}}]}});
        self.patch_status(pod, status).await;
    }

    /// What the kubelet reports while the image cannot be pulled.
    async fn pull_fails(&self, pod: &str) {
        let status = json!({"status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0, "image": "img", "imageID": "",
                                   "state": {"waiting": {"reason": "ImagePullBackOff",
                                                         "message": "Back-off pulling image \"nope:1\""}}}]}});
        self.patch_status(pod, status).await;
    }

    async fn patch_status(&self, pod: &str, status: Value) {
        let (code, answer) = self
            .send(
                reqwest::Method::PATCH,
                &self.path(&format!("pods/{pod}/status")),
                Some(status),
                Some("application/merge-patch+json"),
            )
            .await;
        assert_eq!(code, 200, "status patch: {answer}");
    }

    /// Plays the kubelet's deadline: once `pod` has `activeDeadlineSeconds`, it is ended (143).
    fn end_on_deadline(&self, pod: &str) -> tokio::task::JoinHandle<()> {
        let this = Cluster {
            http: self.http.clone(),
            server: self.server.clone(),
            token: self.token.clone(),
            ns: self.ns.clone(),
        };
        let pod = pod.to_owned();
        tokio::spawn(async move {
            for _ in 0..200 {
                let (_, found) = this.get(&format!("pods/{pod}")).await;
                if !found["spec"]["activeDeadlineSeconds"].is_null() {
                    this.ended(&pod, 143, "DeadlineExceeded").await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("no deadline was set on {pod}");
        })
    }
}

fn spec(name: &str) -> ContainerSpec {
    let mut spec = ContainerSpec::new(name, "registry.example.com/acme/worker:1");
    spec.cmd = Some(vec!["python".into(), "-u".into(), "/handler.py".into()]);
    spec.env = vec![
        ("RUNPOD_POD_ID".into(), "wk_1".into()),
        ("GREETING".into(), "hello".into()),
    ];
    spec.labels.insert("gantry.kind".into(), "worker".into());
    spec.labels.insert("gantry.worker".into(), "wk_1".into());
    spec.labels.insert("gantry.owner".into(), "user@example.com".into());
    spec.memory_bytes = Some(512 << 20);
    spec.nano_cpus = Some(2_000_000_000);
    spec.gpus = 1;
    spec.binds = vec![
        "gantry-vol-vol_1:/runpod-volume".into(),
        "gantry-pod_1-disk:/workspace".into(),
    ];
    spec.volume_sizes_gb.insert("gantry-pod_1-disk".into(), 50);
    spec.stop_timeout_secs = Some(3);
    spec.network = Network::Host;
    spec
}

#[tokio::test]
async fn a_container_is_a_pod_through_its_whole_life() {
    let cluster = Cluster::new("life").await;
    let kube = Kubernetes::new(config(&cluster.ns)).unwrap();
    assert!(kube.info().await.unwrap().version.starts_with("v1."));

    // Credentials become a dockerconfigjson Secret that the pod names.
    let auth = RegistryAuth {
        username: "robot".into(),
        password: "s3cret".into(),
        server: "registry.example.com".into(),
    };
    let image = "registry.example.com/acme/worker:1";
    kube.ensure_image(image, Some(&auth)).await.unwrap();
    kube.ensure_image(image, Some(&auth)).await.unwrap(); // again: the same Secret
    let (_, secrets) = cluster
        .get("secrets?labelSelector=gantry.dev%2Fpull-secret%3Dtrue")
        .await;
    let secrets = secrets["items"].as_array().unwrap().clone();
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    assert_eq!(secrets[0]["type"], "kubernetes.io/dockerconfigjson");
    let secret_name = secrets[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let config = base64_decode(secrets[0]["data"][".dockerconfigjson"].as_str().unwrap());
    let config: Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["auths"]["registry.example.com"]["username"], "robot");
    assert_eq!(config["auths"]["registry.example.com"]["password"], "s3cret");

    let id = kube.run(&spec("gantry-wk_1")).await.unwrap();
    assert_eq!(id, "gantry-wk-1");
    let (_, pod) = cluster.get("pods/gantry-wk-1").await;
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], image);
    assert_eq!(container["args"], json!(["python", "-u", "/handler.py"]));
    assert_eq!(container["env"][1], json!({"name": "GREETING", "value": "hello"}));
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(container["resources"]["limits"]["cpu"], "2");
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/runpod-volume");
    assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": secret_name}]));
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"]["hostNetwork"], true);
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 3);
    assert_eq!(pod["metadata"]["labels"]["gantry.owner"], "user-example.com");

    // The named bind is a ReadWriteMany claim of the configured class and size.
    let (status, claim) = cluster.get("persistentvolumeclaims/gantry-vol-vol-1").await;
    assert_eq!(status, 200, "{claim}");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claim["spec"]["storageClassName"], "gantry-test-rwx");
    assert_eq!(
        claim["spec"]["resources"]["requests"]["storage"], "20Gi",
        "no size given: the configured one"
    );
    let (_, disk) = cluster.get("persistentvolumeclaims/gantry-pod-1-disk").await;
    assert_eq!(disk["spec"]["resources"]["requests"]["storage"], "50Gi", "{disk}");

    // The same name twice is a conflict, as on Docker.
    assert!(matches!(
        kube.run(&spec("gantry-wk_1")).await,
        Err(RuntimeError::Conflict(_))
    ));

    // Listing by labels matches the exact values (kept in an annotation), not only the label form.
    let mine = [("gantry.owner".to_owned(), "user@example.com".to_owned())];
    let listed = kube.list(&mine).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "gantry-wk_1");
    assert_eq!(listed[0].labels["gantry.owner"], "user@example.com");
    assert_eq!(listed[0].state, ContainerState::Created);
    let other = [("gantry.owner".to_owned(), "user-example.com".to_owned())];
    assert!(kube.list(&other).await.unwrap().is_empty());

    // Scheduled and started (the kubelet's part, played here).
    cluster.bind("gantry-wk-1", "node-a").await;
    cluster.running("gantry-wk-1", "10.1.2.3").await;
    let running = kube.inspect("gantry-wk_1").await.unwrap();
    assert_eq!(running.state, ContainerState::Running);
    assert_eq!(running.started_at.as_deref(), Some("2026-11-29T06:00:01Z"));
    // (Its logs would come from the node's kubelet, through the API server; there is none here.)

    // Stop: the deadline ends the pod; the object and its claim stay.
    let kubelet = cluster.end_on_deadline("gantry-wk-1");
    kube.stop("gantry-wk_1", Duration::from_secs(3)).await.unwrap();
    kubelet.await.unwrap();
    let stopped = kube.inspect("gantry-wk_1").await.unwrap();
    assert_eq!(
        (stopped.state.clone(), stopped.exit_code),
        (ContainerState::Exited, Some(143))
    );
    assert_eq!(stopped.finished_at.as_deref(), Some("2026-11-29T06:00:09Z"));
    assert_eq!(stopped.error, None, "a stop is not an error");
    kube.stop("gantry-wk_1", Duration::from_secs(1)).await.unwrap(); // stopping a stopped pod is fine
    let uid = pod["metadata"]["uid"].clone();

    // Start: the same pod again, new, unscheduled, without the deadline.
    kube.start("gantry-wk_1").await.unwrap();
    let (_, again) = cluster.get("pods/gantry-wk-1").await;
    assert_ne!(again["metadata"]["uid"], uid);
    assert!(again["spec"]["activeDeadlineSeconds"].is_null());
    assert_eq!(
        again["spec"]["containers"][0]["env"],
        pod["spec"]["containers"][0]["env"]
    );
    assert_eq!(again["spec"]["imagePullSecrets"], pod["spec"]["imagePullSecrets"]);
    assert_eq!(
        kube.inspect("gantry-wk_1").await.unwrap().state,
        ContainerState::Created
    );
    kube.start("gantry-wk_1").await.unwrap(); // starting a pending pod is fine

    // Remove: gone at once, twice is fine; the claim goes with remove_volume.
    kube.remove("gantry-wk_1").await.unwrap();
    assert!(matches!(
        kube.inspect("gantry-wk_1").await,
        Err(RuntimeError::NotFound(_))
    ));
    // No pod names the pull Secret any more: the credentials go with the last one.
    let (status, _) = cluster.get(&format!("secrets/{secret_name}")).await;
    assert_eq!(status, 404, "the pull Secret outlived its last pod");
    kube.remove("gantry-wk_1").await.unwrap();
    kube.stop("gantry-wk_1", Duration::from_secs(1)).await.unwrap();
    assert!(matches!(
        kube.start("gantry-wk_1").await,
        Err(RuntimeError::NotFound(_))
    ));
    kube.remove_volume("gantry-vol-vol_1").await.unwrap();
    // Deleted, or (where the claim-protection finalizer waits for a controller) being deleted.
    let (status, claim) = cluster.get("persistentvolumeclaims/gantry-vol-vol-1").await;
    assert!(
        status == 404 || !claim["metadata"]["deletionTimestamp"].is_null(),
        "{status} {claim}"
    );
    kube.remove_volume("gantry-vol-vol_1").await.unwrap();
}

/// A network volume grown since its claim was made: the next container that mounts it asks for
/// the new size, where the claim's StorageClass allows expansion and the claim is bound (the
/// controller's part, played here). It never shrinks; where the class does not allow it, the claim
/// keeps its size and the container still runs.
#[tokio::test]
async fn a_claim_grows_with_its_volume_where_its_class_allows() {
    let cluster = Cluster::new("grow").await;
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                       "metadata": {"name": "gantry-test-grow"}, "provisioner": "example.com/none",
                       "allowVolumeExpansion": true});
    let (status, answer) = cluster
        .send(
            reqwest::Method::POST,
            "/apis/storage.k8s.io/v1/storageclasses",
            Some(class),
            None,
        )
        .await;
    assert!(status == 201 || status == 409, "storage class: {status} {answer}");
    let growing = Kubernetes::new(KubernetesConfig {
        storage_class: Some("gantry-test-grow".into()),
        ..config(&cluster.ns)
    })
    .unwrap();
    let fixed = Kubernetes::new(config(&cluster.ns)).unwrap();
    let with_volume = |kube: &Kubernetes, volume: &str, size: u32| {
        let mut spec = spec("gantry-wk_g");
        spec.binds = vec![format!("{volume}:/runpod-volume")];
        spec.volume_sizes_gb.insert(volume.to_owned(), size);
        let kube = kube.clone();
        async move {
            kube.run(&spec).await.unwrap();
            kube.remove("gantry-wk_g").await.unwrap();
        }
    };
    let requested = |claim: &'static str| {
        let cluster = &cluster;
        async move {
            let (_, found) = cluster.get(&format!("persistentvolumeclaims/{claim}")).await;
            found["spec"]["resources"]["requests"]["storage"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };

    with_volume(&growing, "gantry-vol-vol_g", 10).await;
    assert_eq!(requested("gantry-vol-vol-g").await, "10Gi");
    // Bound, as the claim's controller would have it.
    let (status, answer) = cluster
        .send(
            reqwest::Method::PATCH,
            &cluster.path("persistentvolumeclaims/gantry-vol-vol-g/status"),
            Some(json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "10Gi"}}})),
            Some("application/merge-patch+json"),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    with_volume(&growing, "gantry-vol-vol_g", 30).await;
    assert_eq!(requested("gantry-vol-vol-g").await, "30Gi", "grown with its volume");
    with_volume(&growing, "gantry-vol-vol_g", 5).await;
    assert_eq!(requested("gantry-vol-vol-g").await, "30Gi", "never shrunk");

    // A claim that cannot grow (unbound, of a class that does not exist here): refused, and the
    // container is made all the same.
    with_volume(&fixed, "gantry-vol-vol_f", 10).await;
    with_volume(&fixed, "gantry-vol-vol_f", 30).await;
    assert_eq!(requested("gantry-vol-vol-f").await, "10Gi");
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_a_dead_container_with_the_reason() {
    let cluster = Cluster::new("pull").await;
    let kube = Kubernetes::new(config(&cluster.ns)).unwrap();
    let mut spec = ContainerSpec::new("gantry-wk_2", "nope:1");
    spec.labels.insert("gantry.kind".into(), "worker".into());
    kube.ensure_image("nope:1", None).await.unwrap();
    kube.run(&spec).await.unwrap();
    cluster.bind("gantry-wk-2", "node-a").await;
    cluster.pull_fails("gantry-wk-2").await;
    let dead = kube.inspect("gantry-wk_2").await.unwrap();
    assert_eq!(dead.state, ContainerState::Dead);
    assert_eq!(
        dead.error.as_deref(),
        Some("ImagePullBackOff: Back-off pulling image \"nope:1\"")
    );
    // No credentials: no pull secret named.
    let (_, pod) = cluster.get("pods/gantry-wk-2").await;
    assert!(pod["spec"]["imagePullSecrets"].is_null());
    // A pod no node has taken has no logs yet: that is an empty log, not an error.
    kube.remove("gantry-wk_2").await.unwrap();
    kube.run(&spec).await.unwrap();
    assert!(kube.logs("gantry-wk_2", Some(10), None).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_pull_secret_stays_while_a_pod_names_it() {
    let cluster = Cluster::new("secrets").await;
    let kube = Kubernetes::new(config(&cluster.ns)).unwrap();
    let auth = RegistryAuth {
        username: "robot".into(),
        password: "s3cret".into(),
        server: "registry.example.com".into(),
    };
    let image = "registry.example.com/acme/worker:1";
    let secrets = || async {
        let (_, list) = cluster
            .get("secrets?labelSelector=gantry.dev%2Fpull-secret%3Dtrue")
            .await;
        list["items"].as_array().unwrap().len()
    };
    let one = |name: &str| {
        let mut spec = ContainerSpec::new(name, image);
        spec.labels.insert("gantry.kind".into(), "worker".into());
        spec
    };
    // Two pods of one image and credentials share a Secret; a pod without credentials names none.
    kube.ensure_image(image, Some(&auth)).await.unwrap();
    kube.run(&one("gantry-wk_a")).await.unwrap();
    kube.ensure_image(image, Some(&auth)).await.unwrap();
    kube.run(&one("gantry-wk_b")).await.unwrap();
    kube.ensure_image("busybox:1", None).await.unwrap();
    kube.run(&ContainerSpec::new("gantry-wk_c", "busybox:1")).await.unwrap();
    assert_eq!(secrets().await, 1);
    kube.remove("gantry-wk_a").await.unwrap();
    assert_eq!(secrets().await, 1, "removed while another pod names it");
    kube.remove("gantry-wk_c").await.unwrap();
    assert_eq!(secrets().await, 1);
    kube.remove("gantry-wk_b").await.unwrap();
    assert_eq!(secrets().await, 0, "the last pod that named it is gone");
    // The next pod with those credentials has it made again.
    kube.ensure_image(image, Some(&auth)).await.unwrap();
    kube.run(&one("gantry-wk_d")).await.unwrap();
    assert_eq!(secrets().await, 1);
    let (_, pod) = cluster.get("pods/gantry-wk-d").await;
    let name = pod["spec"]["imagePullSecrets"][0]["name"].as_str().unwrap().to_owned();
    assert_eq!(cluster.get(&format!("secrets/{name}")).await.0, 200);
    // A Secret deleted behind a pod's back while it is made (a removal racing a start) is made
    // again by the start.
    cluster.delete(&format!("secrets/{name}")).await;
    kube.remove("gantry-wk_d").await.unwrap();
    kube.run(&one("gantry-wk_d")).await.unwrap();
    assert_eq!(cluster.get(&format!("secrets/{name}")).await.0, 200);
}

#[tokio::test]
async fn a_wrong_token_or_no_server_are_errors_that_say_so() {
    let mut wrong = config("default");
    wrong.token = KubeToken::Value("not-a-token".into());
    match Kubernetes::new(wrong).unwrap().list(&[]).await {
        Err(RuntimeError::Engine { status: 401, .. }) => {}
        other => panic!("expected 401, got {other:?}"),
    }
    let mut nowhere = config("default");
    nowhere.server = "https://127.0.0.1:1".into();
    match Kubernetes::new(nowhere).unwrap().list(&[]).await {
        Err(error @ RuntimeError::Unavailable(_)) => assert!(error.to_string().contains("127.0.0.1:1"), "{error}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

#[tokio::test]
async fn a_private_network_is_a_headless_service_that_names_its_pods() {
    let cluster = Cluster::new("net").await;
    let kube = Kubernetes::new(config(&cluster.ns)).unwrap();
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("gantry.owner".to_owned(), "user@example.com".to_owned());
    kube.ensure_network("gantry-cluster_1", &labels).await.unwrap();
    kube.ensure_network("gantry-cluster_1", &labels).await.unwrap(); // again: fine
    let (status, service) = cluster.get("services/gantry-cluster-1").await;
    assert_eq!(status, 200, "{service}");
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(
        service["spec"]["selector"],
        json!({"gantry.dev/network": "gantry-cluster_1"})
    );
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);

    let mut spec = ContainerSpec::new("gantry-pod_a", "img:1");
    spec.network = Network::Private {
        name: "gantry-cluster_1".into(),
        aliases: vec!["node-1".into()],
    };
    spec.hostname = Some("node-1".into());
    kube.run(&spec).await.unwrap();
    let (_, pod) = cluster.get("pods/gantry-pod-a").await;
    assert_eq!(pod["spec"]["hostname"], "node-1");
    assert_eq!(pod["spec"]["subdomain"], "gantry-cluster-1");
    assert_eq!(pod["metadata"]["labels"]["gantry.dev/network"], "gantry-cluster_1");

    kube.remove("gantry-pod_a").await.unwrap();
    kube.remove_network("gantry-cluster_1").await.unwrap();
    kube.remove_network("gantry-cluster_1").await.unwrap(); // again: fine
    let (status, _) = cluster.get("services/gantry-cluster-1").await;
    assert_eq!(status, 404);
}
