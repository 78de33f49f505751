//! The [`Runtime`] on a Kubernetes API server: each container Gantry runs is one Pod.
//!
//! Gantry's reconciler already decides, container by container, what should run: which worker of
//! an endpoint is idle long enough to go, which holds a job and must stay, which pod a user
//! stopped. So the Kubernetes backend keeps that one decision-maker and gives every worker and
//! every user pod a Pod of its own (`restartPolicy: Never`, no service-account token), which
//! Kubernetes places on a node, pulls and runs. Nothing in Gantry does placement across machines.
//!
//! How the container operations map:
//! - `run`: `POST pods`, after creating the PersistentVolumeClaims its named binds refer to
//!   (ReadWriteMany). The ContainerSpec's own pod manifest is kept in an annotation, so that `start`
//!   can make the same pod again.
//! - `stop`: a pod's containers cannot be stopped and kept, so Gantry sets
//!   `spec.activeDeadlineSeconds`, which makes the kubelet end the pod (SIGTERM, then SIGKILL after
//!   the pod's `terminationGracePeriodSeconds`). The pod object stays, `Failed`, with its exit
//!   status; its PersistentVolumeClaims stay as well (a stopped pod keeps its disk).
//! - `start`: a pod that has ended is deleted and made again from the kept manifest.
//! - `ensure_image`: nodes pull images themselves. Credentials become a `kubernetes.io/dockerconfigjson`
//!   Secret that the next pod of that image names in `imagePullSecrets`; `remove` deletes it once
//!   no pod names it, so credentials do not outlive the containers that used them. A failed pull
//!   shows up as the pod's state (`ErrImagePull`, `ImagePullBackOff`): [`ContainerState::Dead`]
//!   with the reason.
//! - `logs`: `pods/{name}/log?timestamps=true`, followed with `follow=true`.
//! - `stats`: the `metrics.k8s.io` API, where metrics-server is installed.
//!
//! Authentication is a bearer token (a ServiceAccount's, re-read from its file as it rotates);
//! TLS trusts the cluster's CA file. In a pod, [`Kubernetes::in_cluster`] finds all of it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde_json::{Value, json};

use crate::logs::{LogLine, LogStream, parse_rfc3339_nanos};
use crate::types::{
    Container, ContainerSpec, ContainerState, EngineInfo, Network, Placement, Protocol, RegistryAuth, Stats,
};
use crate::{Runtime, RuntimeError};

/// The annotation that holds the name Gantry gave the container (Pod names are DNS labels).
const ANNOTATION_NAME: &str = "gantry.dev/name";
/// The annotation that holds the container's labels exactly as Gantry set them.
const ANNOTATION_LABELS: &str = "gantry.dev/labels";
/// The annotation that holds the pod manifest `run` made, for `start` to make it again.
const ANNOTATION_MANIFEST: &str = "gantry.dev/manifest";
/// The one container of each pod.
const CONTAINER: &str = "main";
/// The start of the names of the pull Secrets Gantry makes (then a hash of what they hold).
const PULL_SECRET_PREFIX: &str = "gantry-pull-";
/// Where a pod's ServiceAccount finds its token, CA and namespace.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Waiting reasons that mean the container will not start without a change (image or config).
const BROKEN_WAITING: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// How the client reaches and authenticates to the API server.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// The API server's origin, e.g. `https://10.0.0.1:443`.
    pub server: String,
    /// A PEM file of the CA certificates that sign the server's certificate (besides the system's).
    pub ca_file: Option<PathBuf>,
    /// The bearer token.
    pub token: KubeToken,
    /// The namespace every object goes into.
    pub namespace: String,
    /// The StorageClass of the claims Gantry makes for volumes; the cluster's default when `None`.
    pub storage_class: Option<String>,
    /// The size requested for a volume's claim, in GiB, when the container's spec gives none.
    pub volume_size_gib: u32,
    /// The bound of each request (pulls and followed logs excepted).
    pub request_timeout: Duration,
}

/// Where the bearer token comes from.
#[derive(Debug, Clone)]
pub enum KubeToken {
    /// This value.
    Value(String),
    /// Read from this file, again a minute after each read (projected ServiceAccount tokens rotate).
    File(PathBuf),
}

impl KubernetesConfig {
    /// The server at `server`, with no token, the system's CA roots, the `default` namespace and the
    /// cluster's default StorageClass.
    pub fn new(server: impl Into<String>) -> KubernetesConfig {
        KubernetesConfig {
            server: server.into(),
            ca_file: None,
            token: KubeToken::Value(String::new()),
            namespace: "default".into(),
            storage_class: None,
            volume_size_gib: 10,
            request_timeout: crate::DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The configuration of a process running in a pod: `KUBERNETES_SERVICE_HOST`/`_PORT`, and the
    /// ServiceAccount's token, CA and namespace files. `None` outside a cluster.
    pub fn in_cluster() -> Option<KubernetesConfig> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .ok()
            .filter(|h| !h.is_empty())?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        let host = if host.contains(':') { format!("[{host}]") } else { host };
        Some(KubernetesConfig {
            server: format!("https://{host}:{port}"),
            ca_file: Some(dir.join("ca.crt")).filter(|p| p.exists()),
            token: KubeToken::File(dir.join("token")),
            namespace: std::fs::read_to_string(dir.join("namespace"))
                .map(|n| n.trim().to_owned())
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".into()),
            storage_class: None,
            volume_size_gib: 10,
            request_timeout: crate::DEFAULT_REQUEST_TIMEOUT,
        })
    }
}

/// A [`Runtime`] on a Kubernetes API server; cheap to clone.
#[derive(Clone)]
pub struct Kubernetes {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// For requests that may run long: pulls (none here) and followed logs.
    streaming: reqwest::Client,
    config: KubernetesConfig,
    token: Mutex<Option<(Instant, String)>>,
    /// image -> the pull Secret its next pod names (set by `ensure_image`).
    pull_secrets: Mutex<HashMap<String, String>>,
    /// Secret name -> the Secret as made, to make it again where a removal
    /// deleted it while a new pod came to name it.
    secret_bodies: Mutex<HashMap<String, Value>>,
}

impl std::fmt::Debug for Kubernetes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubernetes")
            .field("server", &self.inner.config.server)
            .field("namespace", &self.inner.config.namespace)
            .finish_non_exhaustive()
    }
}

impl Kubernetes {
    /// A client of the server `config` names. Fails only on a CA file that cannot be read.
    pub fn new(config: KubernetesConfig) -> Result<Kubernetes, RuntimeError> {
        let tls = gantry_net::tls_config(config.ca_file.as_deref())
            .map_err(|e| RuntimeError::Unavailable(format!("Kubernetes CA: {e}")))?;
        let build = |timeout: Option<Duration>| {
            let mut builder = reqwest::Client::builder()
                .tls_backend_preconfigured(tls.clone())
                .connect_timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none());
            if let Some(timeout) = timeout {
                builder = builder.timeout(timeout);
            }
            builder
                .build()
                .map_err(|e| RuntimeError::Unavailable(format!("Kubernetes client: {e}")))
        };
        Ok(Kubernetes {
            inner: Arc::new(Inner {
                http: build(Some(config.request_timeout))?,
                streaming: build(None)?,
                config,
                token: Mutex::new(None),
                pull_secrets: Mutex::new(HashMap::new()),
                secret_bodies: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The namespace this client works in.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    fn token(&self) -> Result<Option<String>, RuntimeError> {
        match &self.inner.config.token {
            KubeToken::Value(value) => Ok(Some(value.clone()).filter(|v| !v.is_empty())),
            KubeToken::File(path) => {
                let mut cached = self.inner.token.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((at, token)) = cached.as_ref()
                    && at.elapsed() < Duration::from_secs(60)
                {
                    return Ok(Some(token.clone()));
                }
                let token = std::fs::read_to_string(path)
                    .map_err(|e| RuntimeError::Unavailable(format!("Kubernetes token {}: {e}", path.display())))?
                    .trim()
                    .to_owned();
                *cached = Some((Instant::now(), token.clone()));
                Ok(Some(token))
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.config.server.trim_end_matches('/'))
    }

    fn ns_path(&self, rest: &str) -> String {
        format!("/api/v1/namespaces/{}/{rest}", self.inner.config.namespace)
    }

    fn request(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, RuntimeError> {
        let mut request = client
            .request(method, self.url(path))
            .header("Accept", "application/json");
        if let Some(token) = self.token()? {
            request = request.bearer_auth(token);
        }
        Ok(request)
    }

    fn unavailable(&self, error: &reqwest::Error) -> RuntimeError {
        RuntimeError::Unavailable(format!(
            "no Kubernetes API server at {}: {}",
            self.inner.config.server,
            gantry_net::error_chain(error)
        ))
    }

    /// Sends one request and returns the body of a 2xx answer; an error status becomes its variant.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&'static str, &Value)>,
    ) -> Result<Value, RuntimeError> {
        let mut request = self.request(&self.inner.http, method, path)?;
        if let Some((content_type, body)) = body {
            request = request.header("Content-Type", content_type).body(body.to_string());
        }
        let response = request.send().await.map_err(|e| self.unavailable(&e))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| self.unavailable(&e))?;
        if !(200..300).contains(&status) {
            return Err(status_error(status, &bytes));
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Protocol(format!("{path}: {e}")))
    }

    async fn get(&self, path: &str) -> Result<Value, RuntimeError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn get_pod(&self, id: &str) -> Result<Value, RuntimeError> {
        self.get(&self.ns_path(&format!("pods/{}", object_name(id)))).await
    }

    async fn delete_pod_now(&self, name: &str) -> Result<(), RuntimeError> {
        let body = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "propagationPolicy": "Background"});
        match self
            .call(
                reqwest::Method::DELETE,
                &self.ns_path(&format!("pods/{name}")),
                Some(("application/json", &body)),
            )
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Makes the claims the pod's volumes name, where they are missing: of the size `sizes` gives
    /// (by the volume's Gantry name), else the configured size. A claim that exists smaller than
    /// the size given is grown ([`Kubernetes::grow_claim`]).
    async fn ensure_claims(&self, manifest: &Value, sizes: &BTreeMap<String, u32>) -> Result<(), RuntimeError> {
        let claims = manifest["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str());
        for claim in claims {
            let given = sizes
                .iter()
                .find(|(name, _)| object_name(name) == claim)
                .map(|(_, gb)| (*gb).max(1));
            let size = given.unwrap_or(self.inner.config.volume_size_gib).max(1);
            let mut spec = json!({
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": format!("{size}Gi")}},
            });
            if let Some(class) = &self.inner.config.storage_class {
                spec["storageClassName"] = json!(class);
            }
            let body = json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "labels": {"gantry.dev/volume": "true"}},
                "spec": spec,
            });
            match self
                .call(
                    reqwest::Method::POST,
                    &self.ns_path("persistentvolumeclaims"),
                    Some(("application/json", &body)),
                )
                .await
            {
                Ok(_) => {}
                Err(RuntimeError::Conflict(_)) => {
                    if let Some(size) = given {
                        self.grow_claim(claim, size).await;
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Asks for `size_gib` of an existing claim that requests less (a network volume grown since
    /// its claim was made). Kubernetes grows a claim only where its StorageClass allows it
    /// (`allowVolumeExpansion`) and the claim is bound; a refusal is logged and the claim stays as
    /// it is: the container still runs, on the smaller volume. A claim is never shrunk.
    async fn grow_claim(&self, claim: &str, size_gib: u32) {
        let path = self.ns_path(&format!("persistentvolumeclaims/{claim}"));
        let current = match self.call(reqwest::Method::GET, &path, None).await {
            Ok(found) => found["spec"]["resources"]["requests"]["storage"]
                .as_str()
                .and_then(quantity_bytes),
            Err(error) => {
                tracing::warn!(%claim, %error, "the claim could not be read to check its size");
                return;
            }
        };
        let wanted = u128::from(size_gib) << 30;
        if current.is_some_and(|bytes| bytes >= wanted) {
            return;
        }
        let patch = json!({"spec": {"resources": {"requests": {"storage": format!("{size_gib}Gi")}}}});
        match self
            .call(
                reqwest::Method::PATCH,
                &path,
                Some(("application/merge-patch+json", &patch)),
            )
            .await
        {
            Ok(_) => tracing::info!(%claim, size_gib, "claim grown to its volume's size"),
            Err(error) => tracing::warn!(
                %claim,
                size_gib,
                %error,
                "the claim could not grow to its volume's size (its StorageClass must allow volume expansion, and the claim be bound); it keeps its size"
            ),
        }
    }

    async fn create_pod(&self, manifest: &Value, sizes: &BTreeMap<String, u32>) -> Result<String, RuntimeError> {
        self.ensure_claims(manifest, sizes).await?;
        let created = self
            .call(
                reqwest::Method::POST,
                &self.ns_path("pods"),
                Some(("application/json", manifest)),
            )
            .await?;
        // A removal running meanwhile may have found the pull Secret named by no pod (before this
        // one was made) and deleted it: it is made again (a conflict where it is still there).
        for name in pull_secret_names(manifest) {
            let body = lock(&self.inner.secret_bodies).get(&name).cloned();
            if let Some(body) = body {
                self.post_secret(&body).await?;
            }
        }
        Ok(created["metadata"]["name"].as_str().unwrap_or_default().to_owned())
    }

    /// Creates a Secret; one of that name exists already holds the same (the name is a hash of
    /// what it holds).
    async fn post_secret(&self, body: &Value) -> Result<(), RuntimeError> {
        match self
            .call(
                reqwest::Method::POST,
                &self.ns_path("secrets"),
                Some(("application/json", body)),
            )
            .await
        {
            Ok(_) | Err(RuntimeError::Conflict(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Whether a pod in the namespace names the pull Secret `name`.
    async fn secret_in_use(&self, name: &str) -> Result<bool, RuntimeError> {
        let pods = self.get(&self.ns_path("pods")).await?;
        Ok(pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|pod| pull_secret_names(pod).iter().any(|n| n == name)))
    }

    /// Deletes the pull Secret `name` when no pod names it any more, so that registry credentials
    /// do not outlive the last container that used them. A pod made meanwhile keeps it: the pod's
    /// own creation makes it again afterwards, and one made between the look and the delete is
    /// found by a second look, which makes it again from the credentials `ensure_image` was given.
    /// (Gantry needs no right to read Secrets for this.)
    async fn collect_pull_secret(&self, name: &str) -> Result<(), RuntimeError> {
        if self.secret_in_use(name).await? {
            return Ok(());
        }
        match self
            .call(reqwest::Method::DELETE, &self.ns_path(&format!("secrets/{name}")), None)
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound(_)) => {}
            Err(error) => return Err(error),
        }
        let body = lock(&self.inner.secret_bodies).get(name).cloned();
        if let Some(body) = body
            && self.secret_in_use(name).await?
        {
            self.post_secret(&body).await?;
        }
        Ok(())
    }

    /// Polls the pod until `done` says so or `bound` passes; a missing pod counts as done.
    async fn wait_for(&self, name: &str, bound: Duration, done: impl Fn(&Value) -> bool) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + bound;
        loop {
            match self.get_pod(name).await {
                Err(RuntimeError::NotFound(_)) => return Ok(()),
                Err(error) => return Err(error),
                Ok(pod) if done(&pod) => return Ok(()),
                Ok(_) if Instant::now() >= deadline => return Ok(()),
                Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn log_path(&self, id: &str, tail: Option<u32>, since_unix_secs: Option<i64>, follow: bool) -> String {
        let mut path = self.ns_path(&format!(
            "pods/{}/log?container={CONTAINER}&timestamps=true",
            object_name(id)
        ));
        if let Some(tail) = tail {
            path.push_str(&format!("&tailLines={tail}"));
        }
        if let Some(since) = since_unix_secs {
            path.push_str(&format!("&sinceTime={}", format_rfc3339(since)));
        }
        if follow {
            path.push_str("&follow=true");
        }
        path
    }

    /// The pod manifest of `spec` (what `run` creates and `start` makes again).
    pub fn manifest(&self, spec: &ContainerSpec) -> Value {
        manifest(
            spec,
            self.inner
                .pull_secrets
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&spec.image),
        )
    }
}

/// The pull Secrets a pod (or its manifest) names that Gantry made.
fn pull_secret_names(pod: &Value) -> Vec<String> {
    pod["spec"]["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|name| name.starts_with(PULL_SECRET_PREFIX))
        .map(str::to_owned)
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pod manifest of `spec`, naming `pull_secret` in `imagePullSecrets` when there is one.
fn manifest(spec: &ContainerSpec, pull_secret: Option<&String>) -> Value {
    let mut resources = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    if let Some(nano) = spec.nano_cpus {
        limits.insert("cpu".into(), json!(format!("{}m", nano.div_ceil(1_000_000).max(1))));
    }
    if let Some(bytes) = spec.memory_bytes {
        limits.insert("memory".into(), json!(bytes.to_string()));
    }
    if !limits.is_empty() {
        // Requests equal to limits: the pod is scheduled where what it is billed for exists.
        resources.insert("requests".into(), Value::Object(limits.clone()));
    }
    if spec.gpus > 0 {
        limits.insert("nvidia.com/gpu".into(), json!(spec.gpus.to_string()));
    }
    if !limits.is_empty() {
        resources.insert("limits".into(), Value::Object(limits));
    }
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, bind) in spec.binds.iter().enumerate() {
        let mut parts = bind.splitn(3, ':');
        let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
            continue;
        };
        let read_only = parts.next().is_some_and(|o| o.split(',').any(|o| o == "ro"));
        let name = format!("v{i}");
        if source.starts_with('/') {
            volumes.push(json!({"name": name, "hostPath": {"path": source, "type": "DirectoryOrCreate"}}));
        } else {
            volumes.push(json!({"name": name, "persistentVolumeClaim": {"claimName": object_name(source)}}));
        }
        mounts.push(json!({"name": name, "mountPath": target, "readOnly": read_only}));
    }
    let mut container = json!({
        "name": CONTAINER,
        "image": spec.image,
        "env": spec.env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        "ports": spec.ports.iter().map(|p| json!({
            "containerPort": p.container,
            "protocol": match p.protocol { Protocol::Tcp => "TCP", Protocol::Udp => "UDP" },
        })).collect::<Vec<_>>(),
        "resources": Value::Object(resources),
        "volumeMounts": mounts,
    });
    if let Some(cmd) = &spec.cmd {
        // Docker's Cmd replaces the image's CMD and keeps its ENTRYPOINT: Kubernetes' `args`.
        container["args"] = json!(cmd);
    }
    if spec.tty {
        container["tty"] = json!(true);
        container["stdin"] = json!(true);
    }
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        // The container runtime's default syscall filter, as Docker applies its own by default.
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    });
    if let Some(grace) = spec.stop_timeout_secs {
        pod_spec["terminationGracePeriodSeconds"] = json!(grace);
    }
    match &spec.network {
        Network::Host => pod_spec["hostNetwork"] = json!(true),
        Network::Bridge { extra_hosts } => {
            // `name:ip` entries with a literal address; `host-gateway` has no meaning on a cluster.
            let aliases: Vec<Value> = extra_hosts
                .iter()
                .filter_map(|h| h.rsplit_once(':'))
                .filter(|(_, ip)| ip.parse::<std::net::IpAddr>().is_ok())
                .map(|(name, ip)| json!({"ip": ip, "hostnames": [name]}))
                .collect();
            if !aliases.is_empty() {
                pod_spec["hostAliases"] = json!(aliases);
            }
        }
        // A headless Service of the network's name selects its Pods: each is reached as
        // `<hostname>.<service>` (and, through the namespace's DNS search path, by that name).
        Network::Private { name, aliases } => {
            pod_spec["subdomain"] = json!(object_name(name));
            if spec.hostname.is_none()
                && let Some(first) = aliases.first()
            {
                pod_spec["hostname"] = json!(object_name(first));
            }
        }
    }
    if let Some(hostname) = &spec.hostname {
        pod_spec["hostname"] = json!(object_name(hostname));
    }
    if let Some(secret) = pull_secret {
        pod_spec["imagePullSecrets"] = json!([{"name": secret}]);
    }
    if !spec.placement.is_empty() {
        pod_spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": node_selector_terms(&spec.placement),
        }}});
    }
    let mut labels: serde_json::Map<String, Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(label_value(v))))
        .collect();
    if let Network::Private { name, .. } = &spec.network {
        labels.insert(NETWORK_LABEL.into(), json!(label_value(name)));
    }
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": object_name(&spec.name),
            "labels": labels,
            "annotations": {
                ANNOTATION_NAME: spec.name,
                ANNOTATION_LABELS: serde_json::to_string(&spec.labels).unwrap_or_default(),
            },
        },
        "spec": pod_spec,
    });
    let kept = pod.to_string();
    pod["metadata"]["annotations"][ANNOTATION_MANIFEST] = json!(kept);
    pod
}

/// The Pod label that a private network's headless Service selects.
const NETWORK_LABEL: &str = "gantry.dev/network";

/// The node label naming a node's data center (a catalog id); operators set it.
pub const DATA_CENTER_LABEL: &str = "gantry.dev/data-center";
/// The node label of NVIDIA GPU Feature Discovery naming the GPU product (`NVIDIA-H100-80GB-HBM3`).
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// The node labels of NVIDIA GPU Feature Discovery with the CUDA version the driver supports.
pub const CUDA_LABEL_PREFIX: &str = "nvidia.com/cuda.runtime-version";

/// The node selector terms of a placement: any term will do, every expression of a term must hold.
fn node_selector_terms(placement: &Placement) -> Vec<Value> {
    let mut base = Vec::new();
    if !placement.data_centers.is_empty() {
        base.push(json!({"key": DATA_CENTER_LABEL, "operator": "In", "values": placement.data_centers}));
    }
    if !placement.gpu_types.is_empty() {
        // GFD writes the product name with its spaces as dashes.
        let products: Vec<String> = placement.gpu_types.iter().map(|t| label_value(t)).collect();
        base.push(json!({"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}));
    }
    if !placement.cuda_versions.is_empty() {
        base.push(
            json!({"key": format!("{CUDA_LABEL_PREFIX}.full"), "operator": "In", "values": placement.cuda_versions}),
        );
    }
    // At least major.minor: a newer major, or the same major and at least the minor.
    let version = placement
        .min_cuda_version
        .as_deref()
        .and_then(|v| v.split_once('.'))
        .and_then(|(major, minor)| Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?)));
    let alternatives: Vec<Vec<Value>> = match version {
        None => vec![Vec::new()],
        Some((major, 0)) => vec![vec![
            json!({"key": format!("{CUDA_LABEL_PREFIX}.major"), "operator": "Gt",
                                               "values": [major.saturating_sub(1).to_string()]}),
        ]],
        Some((major, minor)) => vec![
            vec![json!({"key": format!("{CUDA_LABEL_PREFIX}.major"), "operator": "Gt", "values": [major.to_string()]})],
            vec![
                json!({"key": format!("{CUDA_LABEL_PREFIX}.major"), "operator": "In", "values": [major.to_string()]}),
                json!({"key": format!("{CUDA_LABEL_PREFIX}.minor"), "operator": "Gt", "values": [(minor - 1).to_string()]}),
            ],
        ],
    };
    alternatives
        .into_iter()
        .map(|extra| json!({"matchExpressions": base.iter().cloned().chain(extra).collect::<Vec<_>>()}))
        .collect()
}

/// The bytes of a Kubernetes quantity (`20Gi`, `500M`, `1.5Ti`, `1e3`, `21474836480`); `None` for
/// milli-units, which no storage request uses.
fn quantity_bytes(text: &str) -> Option<u128> {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let text = text.trim();
    let (number, unit) = SUFFIXES
        .iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, *unit)))
        .unwrap_or((text, 1));
    let value: f64 = number.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    Some((value * unit as f64).round() as u128)
}

/// A Kubernetes object name for a Gantry name: lower case, `[a-z0-9-.]`, at most 253 characters,
/// starting and ending alphanumeric. Gantry's names (`gantry-<id>`) only lose their underscores.
pub fn object_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    out.truncate(253);
    out.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// A label value Kubernetes accepts (63 characters of `[A-Za-z0-9-_.]`, alphanumeric at both
/// ends). The exact value stays in an annotation, which [`Runtime::list`] filters on as well.
fn label_value(value: &str) -> String {
    let mut out: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(63);
    out.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The `Status` message of an error answer, as the matching [`RuntimeError`].
fn status_error(status: u16, body: &[u8]) -> RuntimeError {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            if text.trim().is_empty() {
                format!("HTTP {status}")
            } else {
                text.trim().to_owned()
            }
        });
    match status {
        404 => RuntimeError::NotFound(message),
        409 => RuntimeError::Conflict(message),
        _ => RuntimeError::Engine { status, message },
    }
}

/// A Pod as a [`Container`].
fn container_of(pod: &Value) -> Container {
    let meta = &pod["metadata"];
    let name = meta["name"].as_str().unwrap_or_default().to_owned();
    let labels: BTreeMap<String, String> = meta["annotations"][ANNOTATION_LABELS]
        .as_str()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            meta["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        });
    let status = &pod["status"];
    let main = status["containerStatuses"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == CONTAINER))
        .cloned()
        .unwrap_or(Value::Null);
    let waiting = &main["state"]["waiting"];
    let running = &main["state"]["running"];
    let terminated = &main["state"]["terminated"];
    let phase = status["phase"].as_str().unwrap_or("Pending");
    let broken = waiting["reason"].as_str().filter(|r| BROKEN_WAITING.contains(r));
    let mut error = None;
    let state = if !meta["deletionTimestamp"].is_null() {
        ContainerState::Removing
    } else if let Some(reason) = broken {
        error = Some(match waiting["message"].as_str() {
            Some(message) => format!("{reason}: {message}"),
            None => reason.to_owned(),
        });
        ContainerState::Dead
    } else {
        match phase {
            "Pending" => ContainerState::Created,
            "Running" if terminated.is_object() => ContainerState::Exited,
            "Running" => ContainerState::Running,
            "Succeeded" | "Failed" => ContainerState::Exited,
            other => ContainerState::Unknown(other.to_owned()),
        }
    };
    if phase == "Failed"
        && error.is_none()
        && let Some(reason) = status["reason"].as_str().filter(|r| *r != "DeadlineExceeded")
    {
        // Evicted, NodeLost, ...: the pod ended for a reason of the cluster's, not of the program's.
        error = Some(match status["message"].as_str() {
            Some(message) => format!("{reason}: {message}"),
            None => reason.to_owned(),
        });
    }
    let ip = status["podIP"].as_str().unwrap_or_default().to_owned();
    let ports = pod["spec"]["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == CONTAINER))
        .and_then(|c| c["ports"].as_array())
        .map(|ports| {
            ports
                .iter()
                .filter(|_| !ip.is_empty())
                .filter_map(|p| {
                    let port = u16::try_from(p["containerPort"].as_u64()?).ok()?;
                    let protocol = if p["protocol"] == "UDP" {
                        Protocol::Udp
                    } else {
                        Protocol::Tcp
                    };
                    Some((port, protocol, ip.clone(), port))
                })
                .collect()
        })
        .unwrap_or_default();
    let exit_code = terminated["exitCode"].as_i64().or_else(|| {
        // Ended by its deadline (a stop) before the kubelet wrote the container's status.
        (phase == "Failed").then_some(137)
    });
    Container {
        id: name.clone(),
        name: meta["annotations"][ANNOTATION_NAME]
            .as_str()
            .map_or(name, str::to_owned),
        image: pod["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        labels,
        state,
        exit_code: if matches!(phase, "Succeeded" | "Failed") || terminated.is_object() {
            exit_code
        } else {
            None
        },
        created_unix: meta["creationTimestamp"]
            .as_str()
            .and_then(parse_rfc3339_nanos)
            .map_or(0, |n| n / 1_000_000_000),
        started_at: running["startedAt"]
            .as_str()
            .or_else(|| terminated["startedAt"].as_str())
            .map(str::to_owned),
        finished_at: terminated["finishedAt"].as_str().map(str::to_owned),
        ports,
        error,
        unschedulable: unschedulable(pod),
    }
}

/// The scheduler's message for a Pod it cannot place yet: it has no node,
/// and its `PodScheduled` condition is False with reason `Unschedulable` (a
/// Pod waiting for its scheduling gates is not unschedulable).
fn unschedulable(pod: &Value) -> Option<String> {
    if pod["spec"]["nodeName"].as_str().is_some_and(|node| !node.is_empty()) {
        return None;
    }
    let condition = pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PodScheduled")?;
    if condition["status"] != "False" || condition["reason"] != "Unschedulable" {
        return None;
    }
    Some(
        condition["message"]
            .as_str()
            .filter(|m| !m.is_empty())
            .unwrap_or("no node can take it")
            .to_owned(),
    )
}

/// Unix seconds as RFC 3339 in UTC (as Kubernetes writes times and reads `sinceTime`; also the
/// CLI's key listing).
pub fn format_rfc3339(unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// One line of `pods/log?timestamps=true`: an RFC 3339 time, a space, the text.
fn log_line(raw: &[u8]) -> LogLine {
    let text = String::from_utf8_lossy(raw);
    let text = text.trim_end_matches(['\n', '\r']);
    let (ts, line) = match text.split_once(' ') {
        Some((ts, line)) => match parse_rfc3339_nanos(ts) {
            Some(ns) => (ns, line),
            None => (0, text),
        },
        None => match parse_rfc3339_nanos(text) {
            Some(ns) => (ns, ""),
            None => (0, text),
        },
    };
    LogLine {
        stream: LogStream::Stdout,
        ts_unix_nanos: ts,
        line: line.to_owned(),
    }
}

/// 64-bit FNV-1a: a stable name for a pull Secret from what it holds.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// A Kubernetes quantity (`250m`, `1500000n`, `2`, `128Mi`, `1G`) as a number of base units.
fn quantity(text: &str) -> Option<f64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number * factor)
}

#[async_trait::async_trait]
impl Runtime for Kubernetes {
    async fn info(&self) -> Result<EngineInfo, RuntimeError> {
        let version = self.get("/version").await?;
        let platform = version["platform"].as_str().unwrap_or("linux/amd64");
        let (os, arch) = platform.split_once('/').unwrap_or((platform, ""));
        Ok(EngineInfo {
            version: version["gitVersion"].as_str().unwrap_or_default().to_owned(),
            api_version: "v1".into(),
            min_api_version: None,
            os: os.to_owned(),
            arch: arch.to_owned(),
        })
    }

    async fn ensure_image(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<(), RuntimeError> {
        let Some(auth) = auth else {
            self.inner
                .pull_secrets
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(image);
            return Ok(());
        };
        let name = format!(
            "{PULL_SECRET_PREFIX}{:016x}",
            fnv1a(&[&auth.server, &auth.username, &auth.password])
        );
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", auth.username, auth.password));
        let config = json!({"auths": {auth.server.clone(): {"username": auth.username, "password": auth.password, "auth": basic}}});
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "labels": {"gantry.dev/pull-secret": "true"}},
            "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config.to_string())},
        });
        self.post_secret(&body).await?;
        lock(&self.inner.secret_bodies).insert(name.clone(), body);
        self.inner
            .pull_secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(image.to_owned(), name);
        Ok(())
    }

    async fn run(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let manifest = self.manifest(spec);
        self.create_pod(&manifest, &spec.volume_sizes_gb).await
    }

    async fn list(&self, labels: &[(String, String)]) -> Result<Vec<Container>, RuntimeError> {
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={}", label_value(v))).collect();
        let mut path = self.ns_path("pods");
        if !selector.is_empty() {
            path.push_str("?labelSelector=");
            path.push_str(&percent_encode(&selector.join(",")));
        }
        let list = self.get(&path).await?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(container_of)
            .filter(|c| labels.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .collect())
    }

    async fn inspect(&self, id: &str) -> Result<Container, RuntimeError> {
        Ok(container_of(&self.get_pod(id).await?))
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let name = object_name(id);
        let pod = match self.get_pod(&name).await {
            Ok(pod) => pod,
            Err(RuntimeError::NotFound(_)) => return Ok(()),
            Err(error) => return Err(error),
        };
        if matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
            return Ok(());
        }
        let patch = json!({"spec": {"activeDeadlineSeconds": 1}});
        match self
            .call(
                reqwest::Method::PATCH,
                &self.ns_path(&format!("pods/{name}")),
                Some(("application/merge-patch+json", &patch)),
            )
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound(_)) => {}
            Err(error) => return Err(error),
        }
        // Like `docker stop`, return once it has stopped (or the grace and some slack are over); a
        // pod no node has taken yet has nothing to stop.
        self.wait_for(&name, grace + Duration::from_secs(5), |pod| {
            pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
                || matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        })
        .await
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        let name = object_name(id);
        let pod = self.get_pod(&name).await?;
        let ended = matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
        if !ended && pod["spec"]["activeDeadlineSeconds"].is_null() {
            return Ok(()); // pending or running
        }
        let manifest: Value = pod["metadata"]["annotations"][ANNOTATION_MANIFEST]
            .as_str()
            .and_then(|m| serde_json::from_str(m).ok())
            .ok_or_else(|| RuntimeError::Protocol(format!("pod {name} was not made by Gantry (no manifest)")))?;
        let mut manifest = manifest;
        let kept = manifest.to_string();
        manifest["metadata"]["annotations"][ANNOTATION_MANIFEST] = json!(kept);
        if !ended {
            // A stop that has not finished yet: let it finish, then start again.
            self.wait_for(&name, Duration::from_secs(30), |pod| {
                matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
            })
            .await?;
        }
        self.delete_pod_now(&name).await?;
        self.wait_for(&name, Duration::from_secs(30), |_| false).await?;
        // The claims were made with the pod, and outlive it.
        self.create_pod(&manifest, &BTreeMap::new()).await.map(|_| ())
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let secrets = match self.get_pod(id).await {
            Ok(pod) => pull_secret_names(&pod),
            Err(RuntimeError::NotFound(_)) => Vec::new(),
            Err(error) => return Err(error),
        };
        self.delete_pod_now(&object_name(id)).await?;
        // The pod is gone: a Secret that cannot be collected now (a Role without `delete` on
        // secrets, an API server that went away) is reported, not made the removal's failure.
        for name in secrets {
            if let Err(error) = self.collect_pull_secret(&name).await {
                tracing::warn!(secret = %name, %error, "the pull Secret could not be deleted");
            }
        }
        Ok(())
    }

    async fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        let pod = self.get_pod(id).await?;
        let path = format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{}/pods/{}",
            self.inner.config.namespace,
            object_name(id)
        );
        let metrics = self.get(&path).await.map_err(|error| match error {
            RuntimeError::NotFound(message) => RuntimeError::Engine {
                status: 501,
                message: format!("no metrics for this pod (is metrics-server installed?): {message}"),
            },
            other => other,
        })?;
        let usage = &metrics["containers"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["name"] == CONTAINER))
            .cloned()
            .unwrap_or(Value::Null)["usage"];
        let cores = usage["cpu"].as_str().and_then(quantity).unwrap_or(0.0);
        let started = container_of(&pod)
            .started_at
            .as_deref()
            .and_then(parse_rfc3339_nanos)
            .unwrap_or(0);
        let window = metrics["timestamp"]
            .as_str()
            .and_then(parse_rfc3339_nanos)
            .unwrap_or(started)
            - started;
        let limit = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
            .as_str()
            .and_then(quantity)
            .unwrap_or(0.0);
        Ok(Stats {
            // metrics-server reports a rate; spread over the time since the start it is the CPU time.
            cpu_total_ns: (cores * window.max(0) as f64) as u64,
            online_cpus: 0,
            memory_bytes: usage["memory"].as_str().and_then(quantity).unwrap_or(0.0) as u64,
            memory_limit_bytes: limit as u64,
        })
    }

    async fn ensure_network(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), RuntimeError> {
        let labels: serde_json::Map<String, Value> =
            labels.iter().map(|(k, v)| (k.clone(), json!(label_value(v)))).collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": object_name(name), "labels": labels},
            "spec": {
                "clusterIP": "None",
                "selector": {NETWORK_LABEL: label_value(name)},
                // Members find each other while they start, before any is ready.
                "publishNotReadyAddresses": true,
            },
        });
        match self
            .call(
                reqwest::Method::POST,
                &self.ns_path("services"),
                Some(("application/json", &body)),
            )
            .await
        {
            Ok(_) | Err(RuntimeError::Conflict(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn remove_network(&self, name: &str) -> Result<(), RuntimeError> {
        match self
            .call(
                reqwest::Method::DELETE,
                &self.ns_path(&format!("services/{}", object_name(name))),
                None,
            )
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<(), RuntimeError> {
        match self
            .call(
                reqwest::Method::DELETE,
                &self.ns_path(&format!("persistentvolumeclaims/{}", object_name(name))),
                None,
            )
            .await
        {
            Ok(_) | Err(RuntimeError::NotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> Result<Vec<LogLine>, RuntimeError> {
        let path = self.log_path(id, tail, since_unix_secs, false);
        let response = self
            .request(&self.inner.http, reqwest::Method::GET, &path)?
            .send()
            .await
            .map_err(|e| self.unavailable(&e))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| self.unavailable(&e))?;
        match status {
            200..=299 => Ok(bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(log_line)
                .collect()),
            // "container main in pod ... is waiting to start", "pod ... does not have a host
            // assigned": nothing written yet.
            400 if {
                let text = String::from_utf8_lossy(&bytes);
                text.contains("waiting to start") || text.contains("does not have a host")
            } =>
            {
                Ok(Vec::new())
            }
            _ => Err(status_error(status, &bytes)),
        }
    }

    fn follow_logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> BoxStream<'static, Result<LogLine, RuntimeError>> {
        let this = self.clone();
        let path = self.log_path(id, tail, since_unix_secs, true);
        let opened = async move {
            let response = this
                .request(&this.inner.streaming, reqwest::Method::GET, &path)?
                .send()
                .await
                .map_err(|e| this.unavailable(&e))?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let bytes = response.bytes().await.unwrap_or_default();
                return Err(status_error(status, &bytes));
            }
            Ok((this, response.bytes_stream()))
        };
        futures_util::stream::once(opened)
            .flat_map(|opened| match opened {
                Err(error) => futures_util::stream::iter(vec![Err(error)]).boxed(),
                Ok((this, body)) => {
                    let mut pending: Vec<u8> = Vec::new();
                    let lines = body
                        .map(move |chunk| match chunk {
                            Err(error) => vec![Err(this.unavailable(&error))],
                            Ok(chunk) => {
                                pending.extend_from_slice(&chunk);
                                let mut out = Vec::new();
                                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                                    let line: Vec<u8> = pending.drain(..=end).collect();
                                    out.push(Ok(log_line(&line)));
                                }
                                out
                            }
                        })
                        .flat_map(futures_util::stream::iter);
                    lines.boxed()
                }
            })
            .boxed()
    }
}

/// Percent-encodes a query value (label selectors hold `=` and `,`).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_bytes() {
        assert_eq!(quantity_bytes("20Gi"), Some(20 << 30));
        assert_eq!(quantity_bytes("1.5Ti"), Some(3 << 39));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("21474836480"), Some(20 << 30));
        assert_eq!(quantity_bytes("1e3"), Some(1000));
        assert_eq!(quantity_bytes("100m"), None);
        assert_eq!(quantity_bytes("Gi"), None);
    }

    #[test]
    fn names_and_label_values_are_what_kubernetes_accepts() {
        assert_eq!(object_name("gantry-wk_abc123"), "gantry-wk-abc123");
        assert_eq!(object_name("gantry-vol-vol_X1"), "gantry-vol-vol-x1");
        assert_eq!(object_name("_x_"), "x");
        assert_eq!(label_value("user@example.com"), "user-example.com");
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    }

    #[test]
    fn times_format_as_rfc3339_and_read_back() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(1_795_910_400), "2026-11-29T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_795_289_883), "2026-11-21T19:38:03Z");
        for t in [0, 86_399, 951_782_400, 1_795_923_661, 4_102_444_800] {
            assert_eq!(parse_rfc3339_nanos(&format_rfc3339(t)), Some(t * 1_000_000_000));
        }
    }

    #[test]
    fn log_lines_split_their_timestamp() {
        let line = log_line(b"2026-11-29T06:00:01.5Z hello world\n");
        assert_eq!(line.line, "hello world");
        assert_eq!(line.ts_unix_nanos, 1_795_932_001_500_000_000);
        assert_eq!(log_line(b"no time here").line, "no time here");
    }

    #[test]
    fn quantities_read_as_base_units() {
        assert_eq!(quantity("250m"), Some(0.25));
        assert_eq!(quantity("128Mi"), Some(134_217_728.0));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1500000n"), Some(0.0015));
        assert_eq!(quantity("3x"), None);
    }

    #[test]
    fn a_pod_manifest_carries_what_the_spec_says() {
        let mut spec = ContainerSpec::new("gantry-wk_1", "ghcr.io/acme/worker:1");
        spec.cmd = Some(vec!["python".into(), "-u".into(), "handler.py".into()]);
        spec.env.push(("A".into(), "1".into()));
        spec.labels.insert("gantry.kind".into(), "worker".into());
        spec.memory_bytes = Some(1 << 30);
        spec.nano_cpus = Some(1_500_000_000);
        spec.gpus = 2;
        spec.binds = vec!["gantry-vol-v_1:/runpod-volume".into(), "/data/x:/x:ro".into()];
        spec.stop_timeout_secs = Some(7);
        spec.network = Network::Host;
        let secret = "gantry-pull-1".to_owned();
        let pod = manifest(&spec, Some(&secret));
        assert_eq!(pod["metadata"]["name"], "gantry-wk-1");
        assert_eq!(pod["metadata"]["annotations"][ANNOTATION_NAME], "gantry-wk_1");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["args"], json!(["python", "-u", "handler.py"]));
        assert_eq!(
            c["resources"]["limits"],
            json!({"cpu": "1500m", "memory": "1073741824", "nvidia.com/gpu": "2"})
        );
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "1500m", "memory": "1073741824"})
        );
        assert_eq!(
            c["volumeMounts"][1],
            json!({"name": "v1", "mountPath": "/x", "readOnly": true})
        );
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "gantry-vol-v-1"
        );
        assert_eq!(pod["spec"]["hostNetwork"], true);
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 7);
        assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "gantry-pull-1"}]));
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        let kept: Value = serde_json::from_str(
            pod["metadata"]["annotations"][ANNOTATION_MANIFEST]
                .as_str()
                .unwrap_or(""),
        )
        .unwrap_or_default();
        assert_eq!(kept["spec"], pod["spec"]);
    }

    #[test]
    fn a_placement_is_required_node_affinity() {
        let mut spec = ContainerSpec::new("p", "i");
        assert!(
            manifest(&spec, None)["spec"]["affinity"].is_null(),
            "no placement, no affinity"
        );
        spec.placement = Placement {
            gpu_types: vec!["NVIDIA H100 80GB HBM3".into(), "NVIDIA A100-SXM4-80GB".into()],
            data_centers: vec!["EU-RO-1".into()],
            cuda_versions: vec![],
            min_cuda_version: Some("12.4".into()),
        };
        let terms = &manifest(&spec, None)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        let base = json!([
            {"key": "gantry.dev/data-center", "operator": "In", "values": ["EU-RO-1"]},
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"]},
        ]);
        let with = |extra: Value| {
            let mut all = base.as_array().cloned().unwrap_or_default();
            all.extend(extra.as_array().cloned().unwrap_or_default());
            json!({"matchExpressions": all})
        };
        assert_eq!(
            terms,
            &json!([
                with(json!([{"key": "nvidia.com/cuda.runtime-version.major", "operator": "Gt", "values": ["12"]}])),
                with(
                    json!([{"key": "nvidia.com/cuda.runtime-version.major", "operator": "In", "values": ["12"]},
                            {"key": "nvidia.com/cuda.runtime-version.minor", "operator": "Gt", "values": ["3"]}])
                ),
            ])
        );
        spec.placement = Placement {
            cuda_versions: vec!["12.4".into(), "12.6".into()],
            min_cuda_version: Some("12.0".into()),
            ..Placement::default()
        };
        let terms = &manifest(&spec, None)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(
            terms,
            &json!([{"matchExpressions": [
                {"key": "nvidia.com/cuda.runtime-version.full", "operator": "In", "values": ["12.4", "12.6"]},
                {"key": "nvidia.com/cuda.runtime-version.major", "operator": "Gt", "values": ["11"]},
            ]}])
        );
    }

    #[test]
    fn pod_states_read_as_container_states() {
        let pod = |phase: &str, state: Value| {
            json!({"metadata": {"name": "p", "creationTimestamp": "2026-11-29T06:00:00Z"},
                   "spec": {"containers": [{"name": "main", "image": "i"}]},
                   "status": {"phase": phase, "containerStatuses": [{"name": "main", "state": state}]}})
        };
        assert_eq!(container_of(&pod("Pending", json!({}))).state, ContainerState::Created);
        assert_eq!(container_of(&pod("Pending", json!({}))).unschedulable, None);
        let pulling = container_of(&pod(
            "Pending",
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}),
        ));
        assert_eq!(pulling.state, ContainerState::Dead);
        assert_eq!(pulling.error.as_deref(), Some("ImagePullBackOff: no such image"));
        let running = container_of(&pod(
            "Running",
            json!({"running": {"startedAt": "2026-11-29T06:00:01Z"}}),
        ));
        assert_eq!(
            (running.state, running.started_at.as_deref()),
            (ContainerState::Running, Some("2026-11-29T06:00:01Z"))
        );
        let done = container_of(&pod(
            "Succeeded",
            json!({"terminated": {"exitCode": 0, "finishedAt": "2026-11-29T06:01:00Z"}}),
        ));
        assert_eq!((done.state, done.exit_code), (ContainerState::Exited, Some(0)));
        assert_eq!(done.created_unix, 1_795_932_000);
    }

    #[test]
    fn a_pod_the_scheduler_cannot_place_says_why() {
        let pod = |condition: Value| {
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "i"}]},
                   "status": {"phase": "Pending", "conditions": [condition]}})
        };
        let waiting = container_of(&pod(json!({"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."})));
        assert_eq!(waiting.state, ContainerState::Created);
        assert_eq!(
            waiting.unschedulable.as_deref(),
            Some("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        );
        let gated = pod(json!({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}));
        assert_eq!(container_of(&gated).unschedulable, None);
        let placed = pod(json!({"type": "PodScheduled", "status": "True"}));
        assert_eq!(container_of(&placed).unschedulable, None);
        let mut bound = pod(json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}));
        bound["spec"]["nodeName"] = json!("node-1");
        assert_eq!(container_of(&bound).unschedulable, None, "a Pod with a node is placed");
    }
}
