//! Pods: `/v2/pods` (create, list, get, update, delete), their actions and
//! logs, and the account's SSH keys (`/v2/account/ssh-keys`). Desired state
//! is written by `gantry_containers`; the fleet of the scheduler process
//! runs it on the container engine.
use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_containers::pods::{
    ActionRefused, PodChange, PodCpu, PodGpu, PodMounts, PodPersistentMount, PodPrices, check_ssh_key,
    pod_container_name,
};
use gantry_containers::{Container, PodAction, PodRecord, PodSpec, PodStatus, check_name};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::body::{Failures, RequestBody, present, present_object, read_body};
use crate::handlers::serverless::{
    LogRequest, check_container_into, check_registry_into, empty_container, log_response, merge_container, poke,
    require_runtime, with_container_fields,
};
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::query::{self, RequestQuery, parse_query};
use crate::state::AppState;

// --- request bodies -------------------------------------------------------

/// GPUs of a new pod.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodGpuRequest {
    /// GPU type (`id` of `/v2/catalog/gpus`).
    #[schema(min_length = 1)]
    id: String,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 8, default = 1)]
    count: Option<u32>,
}

/// CPUs of a new pod.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodCpuRequest {
    /// CPU flavor (`id` of `/v2/catalog/cpus`).
    #[schema(min_length = 1)]
    id: String,
    /// vCPUs: a power of two the flavor offers.
    #[schema(minimum = 2)]
    vcpu_count: u32,
}

/// Cloud tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Cloud {
    Secure,
    Community,
}

impl Cloud {
    fn as_str(self) -> &'static str {
        match self {
            Cloud::Secure => "SECURE",
            Cloud::Community => "COMMUNITY",
        }
    }
}

with_container_fields! {
/// A pod to create: an image (or a template) and exactly one of `gpu` or `cpu`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePodRequest {
    #[schema(min_length = 1, max_length = 191, example = "my-training-pod")]
    name: String,
    /// A pod template whose container settings this body overrides (`env` merged per key, the body winning).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1)]
    template_id: Option<String>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    gpu: Option<PodGpuRequest>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    cpu: Option<PodCpuRequest>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    cloud: Option<Cloud>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    mounts: Option<PodMounts>,
    /// Put the account's SSH keys in the pod as `PUBLIC_KEY` (unless `env` sets it).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    start_ssh: Option<bool>,
    /// Put a generated `JUPYTER_PASSWORD` in the pod (unless `env` sets it).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    start_jupyter: Option<bool>,
    /// Accepted for compatibility: this platform places pods on its one engine.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    data_center_ids: Option<Vec<String>>,
    /// Only `false`: global networking is not offered.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    global_networking: Option<bool>,
}
}

impl RequestBody for CreatePodRequest {
    type Context = ();
    type Valid = CreatePodRequest;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<CreatePodRequest> {
        if let Err(problem) = check_name(&self.name) {
            failures.fail("name", problem);
        }
        Some(self)
    }
}

with_container_fields! {
/// Changes to a pod; fields left out stay. A change of the container's
/// configuration replaces its container (a running pod restarts on it; the
/// persistent mount stays).
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdatePodRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1, max_length = 191)]
    name: Option<String>,
    /// Locked pods cannot be stopped or restarted.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    locked: Option<bool>,
    /// A pod template whose container settings apply as if given here.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1)]
    template_id: Option<String>,
    /// The persistent mount's size and path (its kind is fixed at create).
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    mounts: Option<PodMounts>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    global_networking: Option<bool>,
}
}

impl RequestBody for UpdatePodRequest {
    type Context = ();
    type Valid = UpdatePodRequest;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<UpdatePodRequest> {
        if let Some(name) = &self.name
            && let Err(problem) = check_name(name)
        {
            failures.fail("name", problem);
        }
        Some(self)
    }
}

/// The action to take.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PodActionRequest {
    action: PodAction,
}

impl RequestBody for PodActionRequest {
    type Context = ();
    type Valid = PodAction;

    fn validate(self, _: &(), _: &mut Failures) -> Option<PodAction> {
        Some(self.action)
    }
}

/// The account's SSH public keys, all of them (a replacement, not a merge).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSshKeysRequest {
    /// authorized_keys lines: `<type> <base64-key> [comment]`.
    #[schema(max_items = 64)]
    keys: Vec<String>,
}

impl RequestBody for UpdateSshKeysRequest {
    type Context = ();
    type Valid = Vec<String>;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<Vec<String>> {
        if self.keys.len() > gantry_containers::pods::SSH_KEYS_MAX {
            failures.fail(
                "keys",
                format!(
                    "at most {} keys (got {})",
                    gantry_containers::pods::SSH_KEYS_MAX,
                    self.keys.len()
                ),
            );
        }
        for (i, key) in self.keys.iter().enumerate() {
            if let Err(problem) = check_ssh_key(key) {
                failures.fail(&format!("keys[{i}]"), problem);
            }
        }
        let keys: Vec<String> = self.keys.iter().map(|k| k.trim().to_owned()).collect();
        Some(keys)
    }
}

// --- responses ------------------------------------------------------------

/// One way to reach a pod over SSH.
#[derive(Serialize, ToSchema)]
pub struct SshEndpoint {
    host: String,
    port: u16,
    username: String,
    command: String,
}

/// How to connect to the pod over SSH.
#[derive(Serialize, ToSchema)]
pub struct PodSsh {
    /// No SSH proxy runs here: always null.
    proxy: Option<SshEndpoint>,
    /// Straight to the pod's `22/tcp`, while it runs.
    direct: Option<SshEndpoint>,
}

/// A live port of a running pod.
#[derive(Serialize, ToSchema)]
pub struct PodRuntimePort {
    private: u16,
    public: Option<u16>,
    #[serde(rename = "type")]
    kind: String,
    ip: Option<String>,
}

/// A utilisation percentage (0 to 100).
#[derive(Serialize, ToSchema)]
pub struct Utilization {
    #[schema(minimum = 0, maximum = 100)]
    util: u32,
}

/// What one of a pod's GPUs is doing.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGpuUtilization {
    /// Percent of the last sample period a kernel ran.
    #[schema(minimum = 0, maximum = 100)]
    util: u32,
    /// Percent of the GPU's memory in use.
    #[schema(minimum = 0, maximum = 100)]
    memory_util: u32,
}

/// A running pod's live view.
#[derive(Serialize, ToSchema)]
pub struct PodRuntime {
    /// Seconds since the container started.
    uptime: u64,
    ports: Vec<PodRuntimePort>,
    /// Each of the pod's GPUs, as `nvidia-smi` reads it (one-pod reads of a
    /// pod given its GPUs by id, on Docker; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus: Option<Vec<PodGpuUtilization>>,
    /// CPU use of the pod's vCPUs, averaged since its container started
    /// (one-pod reads only; absent in listings, and while the engine has no
    /// sample yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Utilization>,
    /// Memory in use of the pod's limit, now (one-pod reads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Utilization>,
}

#[derive(Serialize, ToSchema)]
pub struct GlobalNetworking {
    enabled: bool,
}

/// A pod.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    id: String,
    name: String,
    status: PodStatus,
    /// Valid actions in the current status.
    actions: Vec<PodAction>,
    #[serde(flatten)]
    container: Container,
    mounts: PodMounts,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<PodGpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<PodCpu>,
    cloud: String,
    data_center_id: Option<String>,
    cuda_version: Option<String>,
    ssh: PodSsh,
    template: Option<String>,
    /// USD per hour now: its compute while RUNNING, its disk (container disk
    /// and volume) while EXITED after a run, 0 otherwise.
    cost: f64,
    locked: bool,
    global_networking: GlobalNetworking,
    runtime: Option<PodRuntime>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    started_at: Option<String>,
    /// Why the pod is in ERROR or EXITED by itself, or what it waits for
    /// while PROVISIONING (free GPUs), when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    status_reason: Option<String>,
    /// Its cluster, when it is a member of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<PodCluster>,
}

/// A pod's membership of a cluster.
#[derive(Serialize, ToSchema)]
pub struct PodCluster {
    /// The cluster's id.
    id: String,
    /// Its rank: 0 is the cluster's primary; the others reach it as `node-<rank>`.
    rank: u32,
}

/// A cluster's member takes no change of its own: the cluster is acted on as a whole (409).
fn refuse_member(record: &PodRecord) -> Result<(), ApiError> {
    match &record.spec.cluster {
        Some(member) => Err(ApiError::Conflict(format!(
            "pod {} is a member of cluster {}: members are changed, stopped and deleted with their cluster",
            record.id, member.id
        ))),
        None => Ok(()),
    }
}

#[derive(Serialize, ToSchema)]
pub struct ListPodsResponse {
    pods: Vec<Pod>,
}

#[derive(Serialize, ToSchema)]
pub struct SshKeys {
    keys: Vec<String>,
}

/// How long a read of a pod waits for the engine's CPU and memory sample.
const STATS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The view of a pod; `live` adds the engine's published ports (one engine
/// call, made for a single pod, not for a listing).
pub(crate) async fn pod_view(state: &AppState, record: PodRecord, live: bool) -> Pod {
    let running = record.status == PodStatus::Running;
    let mut ports: Vec<PodRuntimePort> = Vec::new();
    let (mut published, mut stats, mut gpus) = (Vec::new(), None, None);
    if running
        && live
        && let Some(runtime) = state.fleet.as_ref().and_then(|f| f.runtime().cloned())
    {
        let container = pod_container_name(&record.id);
        // The engine samples a container's use on a timer of its own, so its
        // first answer for a container just started can take a second: a read
        // of the pod never waits for it (the use is then left out).
        let (inspected, sampled) = tokio::join!(
            runtime.inspect(&container),
            tokio::time::timeout(STATS_WAIT, runtime.stats(&container))
        );
        if let Ok(container) = &inspected {
            let devices = gantry_containers::gpus::devices_of(&container.labels);
            if !devices.is_empty()
                && let Some(fleet) = &state.fleet
            {
                gpus = fleet.gpu_pool().usage(&devices).await.map(|readings| {
                    readings
                        .into_iter()
                        .map(|r| PodGpuUtilization {
                            util: r.util,
                            memory_util: r.memory_util,
                        })
                        .collect()
                });
            }
        }
        published = inspected.map(|c| c.ports).unwrap_or_default();
        stats = sampled.ok().and_then(Result::ok);
    }
    let host_network = state.fleet.as_ref().is_some_and(|f| f.config().host_network);
    for text in &record.spec.container.ports {
        let Ok(port) = gantry_containers::parse_port(text) else {
            continue;
        };
        let kind = text.split_once('/').map_or("tcp", |(_, k)| k).to_owned();
        let found = published.iter().find(|(private, _, _, _)| *private == port.number);
        let (public, ip) = match found {
            Some((_, _, ip, public)) => (
                Some(*public),
                Some(if ip.is_empty() { "127.0.0.1".into() } else { ip.clone() }),
            ),
            // With host networking a port of the container is the host's.
            None if running && host_network => (Some(port.number), Some("127.0.0.1".to_owned())),
            None => (None, None),
        };
        ports.push(PodRuntimePort {
            private: port.number,
            public,
            kind,
            ip,
        });
    }
    let direct = ports
        .iter()
        .find(|p| p.private == 22 && p.kind == "tcp")
        .and_then(|p| Some((p.ip.clone()?, p.public?)))
        .map(|(host, port)| SshEndpoint {
            command: format!("ssh root@{host} -p {port}"),
            host,
            port,
            username: "root".into(),
        });
    let now = gantry_containers::service::now_ms();
    let uptime_ms = u64::try_from(now - record.started_at_ms.unwrap_or(now)).unwrap_or(0);
    let percent = |part: f64, whole: f64| Utilization {
        util: if whole > 0.0 {
            (part / whole * 100.0).clamp(0.0, 100.0).round() as u32
        } else {
            0
        },
    };
    let cpus = record
        .spec
        .cpu
        .as_ref()
        .map_or_else(|| stats.map_or(1, |s| s.online_cpus), |cpu| cpu.vcpu_count);
    let runtime = running.then(|| PodRuntime {
        uptime: uptime_ms / 1000,
        ports,
        gpus,
        cpu: stats.map(|s| percent(s.cpu_total_ns as f64, uptime_ms as f64 * 1e6 * f64::from(cpus.max(1)))),
        memory: stats.map(|s| percent(s.memory_bytes as f64, s.memory_limit_bytes as f64)),
    });
    // Why it stopped, or (PROVISIONING) what it waits for.
    let status_reason = matches!(
        record.status,
        PodStatus::Error | PodStatus::Exited | PodStatus::Provisioning
    )
    .then(|| record.reason.clone())
    .flatten();
    Pod {
        actions: record.status.actions(),
        cost: record.cost(),
        status: record.status,
        id: record.id,
        name: record.name,
        container: record.spec.container,
        mounts: record.spec.mounts,
        gpu: record.spec.gpu,
        cpu: record.spec.cpu,
        cloud: record.spec.cloud,
        data_center_id: state.catalog.home().map(|dc| dc.id.clone()),
        cuda_version: None,
        ssh: PodSsh { proxy: None, direct },
        template: record.spec.template,
        locked: record.locked,
        global_networking: GlobalNetworking { enabled: false },
        runtime,
        created_at: gantry_billing::history::format_rfc3339(record.created_at_ms),
        started_at: record.started_at_ms.map(gantry_billing::history::format_rfc3339),
        status_reason,
        cluster: record.spec.cluster.map(|member| PodCluster {
            id: member.id,
            rank: member.rank,
        }),
    }
}

// --- building a pod's configuration ----------------------------------------

/// What a pod costs per hour: its compute while it runs, and while it is
/// stopped the disk it keeps (container disk and volume) at
/// `billing.storage.stopped_pod_disk_micro_usd_per_gb_month`.
pub(crate) fn prices_of(state: &AppState, spec: &PodSpec) -> PodPrices {
    let disk_gb = i64::from(spec.container.disk) + spec.mounts.persistent.as_ref().map_or(0, |m| i64::from(m.size));
    PodPrices {
        hourly_micro_usd: hourly_of(state, spec),
        disk_hourly_micro_usd: state.jobs.config().storage_prices.stopped_pod_disk_hourly(disk_gb),
    }
}

/// The hourly price of a pod's compute, micro-USD.
fn hourly_of(state: &AppState, spec: &PodSpec) -> i64 {
    let usd = if let Some(gpu) = &spec.gpu {
        state.gpus.iter().find(|g| g.id == gpu.id).map_or(0.0, |g| {
            let per = if spec.cloud == "COMMUNITY" {
                g.price.community
            } else {
                g.price.secure
            };
            per * f64::from(gpu.count)
        })
    } else if let Some(cpu) = &spec.cpu {
        state
            .cpus
            .iter()
            .find(|c| c.id == cpu.id)
            .map_or(0.0, |c| c.price.secure_per_vcpu * f64::from(cpu.vcpu_count))
    } else {
        0.0
    };
    (usd * 1e6).round() as i64
}

fn check_gpu(state: &AppState, gpu: PodGpuRequest, failures: &mut Failures) -> Option<PodGpu> {
    let count = gpu.count.unwrap_or(1);
    if !(1..=8).contains(&count) {
        failures.fail("gpu.count", format!("must be from 1 to 8 (got {count})"));
    }
    if !state.gpus.iter().any(|g| g.id == gpu.id) {
        failures.fail("gpu.id", format!("unknown GPU type '{}'", gpu.id));
        return None;
    }
    Some(PodGpu { id: gpu.id, count })
}

fn check_cpu(state: &AppState, cpu: PodCpuRequest, failures: &mut Failures) -> Option<PodCpu> {
    let Some(flavor) = state.cpus.iter().find(|c| c.id == cpu.id) else {
        failures.fail("cpu.id", format!("unknown CPU flavor '{}'", cpu.id));
        return None;
    };
    let n = cpu.vcpu_count;
    let (min, max) = (flavor.vcpu.min.max(2), flavor.vcpu.max);
    if !n.is_power_of_two() || n < min || n > max {
        failures.fail(
            "cpu.vcpuCount",
            format!(
                "must be a power of two from {min} to {max} for '{}' (got {n})",
                flavor.id
            ),
        );
        return None;
    }
    Some(PodCpu {
        memory: ((flavor.ram_gb_per_vcpu * f64::from(n)).round() as u32).max(1),
        id: cpu.id,
        vcpu_count: n,
    })
}

fn check_mount(mount: &PodPersistentMount, failures: &mut Failures) {
    if !(10..=gantry_containers::DISK_MAX_GB).contains(&mount.size) {
        failures.fail(
            "mounts.persistent.size",
            format!(
                "must be from 10 to {} GB (got {})",
                gantry_containers::DISK_MAX_GB,
                mount.size
            ),
        );
    }
    check_mount_path(&mount.path, "mounts.persistent.path", failures);
}

fn check_mount_path(path: &str, field: &str, failures: &mut Failures) {
    if !path.starts_with('/') || path == "/" || path.contains([':', ',']) || path.split('/').any(|part| part == "..") {
        failures.fail(
            field,
            format!("must be an absolute path below / without '..', ':' or ',' (got '{path}')"),
        );
    }
}

/// Checks the network mounts: at most one, of one of the caller's volumes.
async fn check_network(
    state: &AppState,
    owner: &str,
    mounts: &PodMounts,
    failures: &mut Failures,
) -> Result<(), ApiError> {
    if mounts.network.len() > 1 {
        failures.fail("mounts.network", "at most one network volume");
    }
    if mounts.persistent.is_some() && !mounts.network.is_empty() {
        failures.fail("mounts", "persistent and network mounts exclude each other");
    }
    for (i, mount) in mounts.network.iter().enumerate() {
        check_mount_path(&mount.path, &format!("mounts.network[{i}].path"), failures);
        if state.volumes.get(owner, &mount.volume_id).await.is_err() {
            failures.fail(
                &format!("mounts.network[{i}].volumeId"),
                format!("no network volume '{}' of yours", mount.volume_id),
            );
        }
    }
    Ok(())
}
/// A random password for Jupyter.
fn jupyter_password() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..20)
        .map(|_| {
            let i = rng.random_range(0..36u8);
            char::from(if i < 10 { b'0' + i } else { b'a' + i - 10 })
        })
        .collect()
}

/// A cluster member's configuration (`body`, a pod's create body), checked as a pod's is, every
/// failure at once.
pub(crate) async fn member_spec(state: &AppState, owner: &str, body: serde_json::Value) -> Result<PodSpec, ApiError> {
    let body: CreatePodRequest = serde_json::from_value(body).map_err(|e| ApiError::BadRequest {
        detail: "the cluster's pod configuration is not valid".into(),
        errors: vec![e.to_string()],
    })?;
    new_pod_spec(state, owner, body).await
}

async fn new_pod_spec(state: &AppState, owner: &str, mut body: CreatePodRequest) -> Result<PodSpec, ApiError> {
    let mut failures = Failures::default();
    let fields = body.container();
    let mut container = empty_container();
    let mut mounts = body.mounts.take().unwrap_or_default();
    let mut start_ssh = body.start_ssh.unwrap_or(false);
    let mut start_jupyter = body.start_jupyter.unwrap_or(false);
    let image_given = fields.image.is_some();
    let template = merge_container(
        state,
        owner,
        body.template_id.as_deref(),
        false,
        fields,
        &mut container,
        &mut failures,
    )
    .await?;
    if body.template_id.is_none() && !image_given {
        failures.fail("image", "is required unless templateId names a template");
    }
    if let Some(template) = template {
        if mounts.persistent.is_none() && body.cpu.is_none() {
            mounts.persistent = template.mounts.persistent.map(|p| PodPersistentMount {
                size: p.size,
                path: p.path,
            });
        }
        start_ssh = body.start_ssh.unwrap_or(template.start_ssh);
        start_jupyter = body.start_jupyter.unwrap_or(template.start_jupyter);
    }
    check_container_into(&container, &mut failures);
    check_registry_into(state, owner, container.registry.as_deref(), &mut failures).await?;
    if let Some(mount) = &mounts.persistent {
        check_mount(mount, &mut failures);
    }
    check_network(state, owner, &mounts, &mut failures).await?;
    let (gpu, cpu) = match (body.gpu, body.cpu) {
        (Some(_), Some(_)) | (None, None) => {
            failures.fail("", "give exactly one of gpu or cpu");
            (None, None)
        }
        (Some(gpu), None) => (check_gpu(state, gpu, &mut failures), None),
        (None, Some(cpu)) => (None, check_cpu(state, cpu, &mut failures)),
    };
    if cpu.is_some() && mounts.persistent.is_some() && body.template_id.is_none() {
        failures.fail("mounts.persistent", "is not offered on CPU pods (use a network volume)");
    }
    if body.global_networking == Some(true) {
        failures.fail("globalNetworking", "global networking is not offered by this platform");
    }
    for id in body.data_center_ids.unwrap_or_default() {
        if state.catalog.data_center(&id).is_none() {
            failures.fail("dataCenterIds", format!("unknown data center '{id}'"));
        }
    }
    if start_ssh && !container.env.contains_key("PUBLIC_KEY") {
        let keys = state.containers.ssh_keys(owner).await?;
        if !keys.is_empty() {
            container.env.insert("PUBLIC_KEY".into(), keys.join("\n"));
        }
    }
    if start_jupyter && !container.env.contains_key("JUPYTER_PASSWORD") {
        container.env.insert("JUPYTER_PASSWORD".into(), jupyter_password());
    }
    if !failures.is_empty() {
        return Err(failures.into_api_error());
    }
    Ok(PodSpec {
        container,
        mounts,
        gpu,
        cpu,
        cloud: body.cloud.unwrap_or(Cloud::Secure).as_str().to_owned(),
        template: body.template_id,
        cluster: None,
    })
}

/// The query of the pod list.
#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct ListPodsQuery {
    /// Accepted; this platform has no cluster pods yet
    #[serde(default, deserialize_with = "query::value")]
    #[allow(dead_code)]
    include_cluster_pods: Option<bool>,
}

impl RequestQuery for ListPodsQuery {
    type Valid = ();

    fn validate(self, _: &mut Vec<String>) -> Option<()> {
        Some(())
    }
}

// --- handlers -------------------------------------------------------------

/// A pod starts only with credit, when credit is required (402 otherwise):
/// a running pod is charged by the second.
pub(crate) async fn require_credit(state: &AppState, owner: &str) -> Result<(), ApiError> {
    if !state.jobs.config().require_credit {
        return Ok(());
    }
    let (balance, held) = state.census.credit(owner).await?;
    if balance.saturating_sub(held) <= 0 {
        return Err(ApiError::PaymentRequired(
            "no credit left: a pod is charged while it runs (ask an operator to add credit)".into(),
        ));
    }
    Ok(())
}

#[utoipa::path(get, path = "/v2/pods", operation_id = "listPods", tag = "Pods",
    description = "The caller's pods, oldest first. Requires `pods:read`.",
    params(ListPodsQuery),
    responses((status = 200, description = "OK", body = ListPodsResponse),
        (status = 400, description = "Bad query parameters", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn list_pods(state: web::Data<AppState>, caller: Caller, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    parse_query::<ListPodsQuery>(&req)?;
    let mut pods = Vec::new();
    for record in state.containers.list_pods(caller.user_id()).await? {
        pods.push(pod_view(&state, record, false).await);
    }
    Ok(HttpResponse::Ok().json(ListPodsResponse { pods }))
}

#[utoipa::path(post, path = "/v2/pods", operation_id = "createPod", tag = "Pods",
    description = "Creates a pod and starts it (asynchronously: it is PROVISIONING, then RUNNING once its container runs, or ERROR with the reason). Exactly one of `gpu` or `cpu`; `image` unless `templateId` is given. Billed per second while it runs; when credit is required, 402 without credit, and a running pod is stopped once its owner's credit has run out for `serverless.pod_credit_grace_ms`. Requires `pods:write`; 503 while no container runtime answers.",
    request_body = CreatePodRequest,
    responses((status = 201, description = "Created", body = Pod),
        (status = 402, description = "No credit, when credit is required", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn create_pod(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let body = read_body::<CreatePodRequest>(&req, payload, state.body_limit, &()).await?;
    require_runtime(&state)?;
    require_credit(&state, caller.user_id()).await?;
    let name = body.name.clone();
    let spec = new_pod_spec(&state, caller.user_id(), body).await?;
    let prices = prices_of(&state, &spec);
    let record = state
        .containers
        .create_pod(caller.user_id(), &name, spec, prices)
        .await?;
    poke(&state);
    Ok(HttpResponse::Created().json(pod_view(&state, record, false).await))
}

#[utoipa::path(get, path = "/v2/pods/{id}", operation_id = "getPod", tag = "Pods",
    description = "One of the caller's pods, with its live ports while it runs. Requires `pods:read`.",
    params(("id" = String, Path, description = "Pod id")),
    responses((status = 200, description = "OK", body = Pod)))]
pub async fn get_pod(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let record = state.containers.get_pod(caller.user_id(), &id).await?;
    Ok(HttpResponse::Ok().json(pod_view(&state, record, true).await))
}

#[utoipa::path(patch, path = "/v2/pods/{id}", operation_id = "updatePod", tag = "Pods",
    description = "Changes the fields given. A change of image, args, env, ports, disk, registry or mount replaces the pod's container: a running pod restarts on the new configuration (its persistent mount stays), a stopped one uses it on its next start. Requires `pods:write`.",
    params(("id" = String, Path, description = "Pod id")),
    request_body = UpdatePodRequest,
    responses((status = 200, description = "OK", body = Pod)))]
pub async fn update_pod(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let mut body = read_body::<UpdatePodRequest>(&req, payload, state.body_limit, &()).await?;
    let owner = caller.user_id();
    let current = state.containers.get_pod(owner, &id).await?;
    refuse_member(&current)?;
    if current.status == PodStatus::Terminated {
        return Err(ApiError::Conflict("the pod is terminated".into()));
    }
    let mut failures = Failures::default();
    let mut spec = current.spec.clone();
    let fields = body.container();
    let template_id = body.template_id.take();
    if merge_container(
        &state,
        owner,
        template_id.as_deref(),
        false,
        fields,
        &mut spec.container,
        &mut failures,
    )
    .await?
    .is_some()
    {
        spec.template = template_id;
    }
    check_container_into(&spec.container, &mut failures);
    check_registry_into(&state, owner, spec.container.registry.as_deref(), &mut failures).await?;
    if let Some(mounts) = body.mounts.take() {
        match (mounts.persistent, &current.spec.mounts.persistent) {
            (None, _) => {}
            (Some(mount), Some(_)) => {
                check_mount(&mount, &mut failures);
                spec.mounts.persistent = Some(mount);
            }
            (Some(_), None) => failures.fail("mounts", "the pod was created without a persistent mount"),
        }
        // The volume is fixed at create; its path may change.
        match (mounts.network.as_slice(), current.spec.mounts.network.as_slice()) {
            ([], _) => {}
            ([new], [old]) if new.volume_id == old.volume_id => {
                check_mount_path(&new.path, "mounts.network[0].path", &mut failures);
                spec.mounts.network = vec![new.clone()];
            }
            ([_], [_]) => failures.fail("mounts.network[0].volumeId", "the pod's network volume cannot change"),
            _ => failures.fail("mounts", "the pod was created without a network volume"),
        }
    }
    if body.global_networking == Some(true) {
        failures.fail("globalNetworking", "global networking is not offered by this platform");
    }
    if !failures.is_empty() {
        return Err(failures.into_api_error());
    }
    let prices = prices_of(&state, &spec);
    let change = PodChange {
        name: body.name,
        spec: Some(spec),
        locked: body.locked,
    };
    let record = state.containers.update_pod(owner, &id, change, Some(prices)).await?;
    poke(&state);
    Ok(HttpResponse::Ok().json(pod_view(&state, record, false).await))
}

#[utoipa::path(delete, path = "/v2/pods/{id}", operation_id = "deletePod", tag = "Pods",
    description = "Deletes a pod: its container and persistent mount are removed, its time billed up to then. Requires `pods:write`.",
    params(("id" = String, Path, description = "Pod id")),
    responses((status = 204, description = "Deleted. Response has no body.")))]
pub async fn delete_pod(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    refuse_member(&state.containers.get_pod(caller.user_id(), &id).await?)?;
    state.containers.delete_pod(caller.user_id(), &id).await?;
    poke(&state);
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/v2/pods/{id}/action", operation_id = "podAction", tag = "Pods",
    description = "`start`, `stop`, `restart` or `terminate`. An action the pod's status does not allow (or a stop or restart of a locked pod) is 409, naming the status and the valid `actions`. Requires `pods:write`.",
    params(("id" = String, Path, description = "Pod id")),
    request_body = PodActionRequest,
    responses((status = 200, description = "Action taken: the pod", body = Pod),
        (status = 409, description = "Not valid in the pod's status", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 402, description = "A start without credit, when credit is required", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "A start with no container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn pod_action(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let action = read_body::<PodActionRequest>(&req, payload, state.body_limit, &()).await?;
    refuse_member(&state.containers.get_pod(caller.user_id(), &id).await?)?;
    if action == PodAction::Start {
        require_runtime(&state)?;
        require_credit(&state, caller.user_id()).await?;
    }
    match state.containers.pod_action(caller.user_id(), &id, action).await? {
        Ok(record) => {
            poke(&state);
            Ok(HttpResponse::Ok().json(pod_view(&state, record, false).await))
        }
        Err(ActionRefused { status, reason }) => {
            let valid: Vec<&str> = status.actions().iter().map(|a| a.as_str()).collect();
            Err(ApiError::Conflict(format!(
                "{reason} (status {}; valid actions: {})",
                status.as_str(),
                if valid.is_empty() {
                    "none".to_owned()
                } else {
                    valid.join(", ")
                }
            )))
        }
    }
}

#[utoipa::path(get, path = "/v2/pods/{id}/logs", operation_id = "getPodLogs", tag = "Pods",
    description = "The pod's logs as Server-Sent Events: `data: {source, line, ts}` with the line's time as the event id, so `Last-Event-ID` resumes after it. `source` is `container` (stdout and stderr), `system` (created, pulled, started, stopped, exit codes, errors) or `all` (default); `tail` (0 to 5000, default 100) lines first, or those after `since` (RFC 3339); `follow=true` keeps the stream open while the container runs. Requires `pods:read`.",
    params(("id" = String, Path, description = "Pod id"),
        crate::handlers::serverless::LogQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, description = "The log as Server-Sent Events", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad query parameters or Last-Event-ID, every failure listed", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn pod_logs(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let query = LogRequest::parse(&req)?;
    let pod = state.containers.get_pod(caller.user_id(), &id).await?;
    let system = state
        .containers
        .pod_events(&pod.id)
        .await?
        .into_iter()
        .map(|(ms, seq, line)| (ms.saturating_mul(1_000_000).saturating_add(seq), line))
        .collect();
    let live = pod.status != PodStatus::Terminated;
    log_response(&state, query, &pod_container_name(&pod.id), system, live).await
}

#[utoipa::path(get, path = "/v2/account/ssh-keys", operation_id = "getSshKeys", tag = "Pods",
    description = "The account's SSH public keys, put into pods created with `startSsh`. Requires `pods:read`.",
    responses((status = 200, description = "OK", body = SshKeys)))]
pub async fn get_ssh_keys(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let keys = state.containers.ssh_keys(caller.user_id()).await?;
    Ok(HttpResponse::Ok().json(SshKeys { keys }))
}

#[utoipa::path(put, path = "/v2/account/ssh-keys", operation_id = "updateSshKeys", tag = "Pods",
    description = "Replaces the account's SSH public keys (`[]` removes them all). Pods created with `startSsh` from then on get them. Requires `pods:write`.",
    request_body = UpdateSshKeysRequest,
    responses((status = 200, description = "The keys now", body = SshKeys)))]
pub async fn put_ssh_keys(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let keys = read_body::<UpdateSshKeysRequest>(&req, payload, state.body_limit, &()).await?;
    state.containers.put_ssh_keys(caller.user_id(), &keys).await?;
    Ok(HttpResponse::Ok().json(SshKeys { keys }))
}
