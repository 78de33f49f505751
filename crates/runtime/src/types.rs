//! The runtime's own vocabulary (what Gantry asks for and gets back) and its translation to and from
//! the Engine API's JSON.
//!
//! The public types are deliberately smaller than the Engine API: they carry what pods and serverless
//! workers need and nothing that would tie callers to Docker's object model, so that a Kubernetes
//! runtime can implement the same trait. The wire types below are private and lenient: every field is
//! optional or defaulted, because Docker and Podman's compat layer differ in what they leave out
//! (Podman omits `Labels` when empty, old engines omit `StartedAt`, ...), and a missing field must not
//! turn a listing into an error.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::logs::parse_rfc3339_nanos;

/// What [`crate::Docker::negotiate`] and [`crate::Runtime::info`] report about the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// The engine's product version, e.g. `20.10.24+dfsg1` (Docker) or `4.3.1` (Podman).
    pub version: String,
    /// The newest Engine API version the engine speaks, e.g. `1.41`.
    pub api_version: String,
    /// The oldest Engine API version the engine accepts, when it says.
    pub min_api_version: Option<String>,
    /// `linux` for every engine Gantry supports.
    pub os: String,
    /// The engine's CPU architecture, e.g. `amd64`.
    pub arch: String,
}

/// Credentials for one registry, sent as `X-Registry-Auth` on a pull.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    /// The registry user.
    pub username: String,
    /// The password or token. Never printed.
    pub password: String,
    /// The registry host, e.g. `ghcr.io` or `registry.example.com:5000`.
    pub server: String,
}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("server", &self.server)
            .finish()
    }
}

/// How a container is attached to the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace: the container reaches Gantry on 127.0.0.1 and its ports are the
    /// host's. Published ports ([`ContainerSpec::ports`]) do not apply and are not sent.
    Host,
    /// The engine's default bridge. `extra_hosts` are `/etc/hosts` entries, e.g.
    /// `host.docker.internal:host-gateway` so that a worker can reach a Gantry listening on the bridge
    /// gateway.
    Bridge {
        /// `name:ip` entries (`host-gateway` is resolved by the engine).
        extra_hosts: Vec<String>,
    },
    /// A network of Gantry's own, made with [`crate::Runtime::ensure_network`] (a cluster's):
    /// its containers reach each other by their `aliases`. Ports are published as on the bridge.
    Private {
        /// The network's name.
        name: String,
        /// The names the other containers of the network reach this one by.
        aliases: Vec<String>,
    },
}

impl Default for Network {
    /// The engine's own default, and the isolated choice.
    fn default() -> Self {
        Network::Bridge {
            extra_hosts: Vec::new(),
        }
    }
}

/// A transport protocol of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The engine's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }

    fn parse(s: &str) -> Option<Protocol> {
        match s {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            _ => None,
        }
    }
}

/// A container port published on the host (bridge networking only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port inside the container.
    pub container: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The host address to bind, e.g. `127.0.0.1`; empty means all addresses.
    pub host_ip: String,
    /// The host port; 0 lets the engine pick a free one (read it back from [`Container::ports`]).
    pub host_port: u16,
}

/// Everything needed to create and start one container.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The container name; unique per engine, so it doubles as an idempotency key.
    pub name: String,
    /// The image reference, e.g. `ghcr.io/acme/worker:1.2`.
    pub image: String,
    /// Replaces the image's `CMD` when set.
    pub cmd: Option<Vec<String>>,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    /// Labels; Gantry finds its containers again by these.
    pub labels: BTreeMap<String, String>,
    /// Host or bridge networking.
    pub network: Network,
    /// Ports to publish (bridge only).
    pub ports: Vec<PortSpec>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU limit in billionths of a CPU (1.5 CPUs = 1_500_000_000).
    pub nano_cpus: Option<u64>,
    /// Number of NVIDIA GPUs, requested through `DeviceRequests` (see the crate docs on Podman).
    pub gpus: u32,
    /// Which of the machine's GPUs (indexes or UUIDs, as `nvidia-smi` names them), when the caller
    /// chose them: Docker then asks for these `DeviceIDs` instead of a count, which its NVIDIA
    /// driver would answer with the first `gpus` of the machine whoever else has them. Kubernetes
    /// ignores it (its device plugin picks).
    pub gpu_devices: Vec<String>,
    /// Bind mounts, `host:container[:ro]`.
    pub binds: Vec<String>,
    /// Seconds between SIGTERM and SIGKILL when the engine stops the container without an explicit
    /// timeout (e.g. on engine shutdown).
    pub stop_timeout_secs: Option<u32>,
    /// Let the engine delete the container when it exits.
    pub auto_remove: bool,
    /// Allocate a pseudo-terminal. Its output is then one unframed stream (all lines are stdout).
    pub tty: bool,
    /// Which machines may run it (runtimes with several: Kubernetes). Docker runs it on its one
    /// machine, whatever that has.
    pub placement: Placement,
    /// The container's host name (the engine's default, its short id, when `None`).
    pub hostname: Option<String>,
    /// The size, GB, of each named volume its `binds` make, where the runtime sizes volumes when
    /// it makes them (Kubernetes claims); Docker's local volumes have no size.
    pub volume_sizes_gb: BTreeMap<String, u32>,
}

/// Constraints on the machine a container runs on. Each list holds alternatives (any one will
/// do); an empty list constrains nothing. On Kubernetes they become the Pod's required node
/// affinity, on node labels (see `docs/runtime.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// GPU types (catalog ids such as `NVIDIA H100 80GB HBM3`).
    pub gpu_types: Vec<String>,
    /// Data centers (catalog ids such as `EU-RO-1`).
    pub data_centers: Vec<String>,
    /// CUDA versions (`12.4`) the machine's driver must support exactly.
    pub cuda_versions: Vec<String>,
    /// The oldest CUDA version (`12.2`) the machine's driver may support.
    pub min_cuda_version: Option<String>,
}

impl Placement {
    /// Whether it constrains nothing.
    pub fn is_empty(&self) -> bool {
        self.gpu_types.is_empty()
            && self.data_centers.is_empty()
            && self.cuda_versions.is_empty()
            && self.min_cuda_version.is_none()
    }
}

impl ContainerSpec {
    /// A spec with the given name and image and everything else at its default.
    pub fn new(name: impl Into<String>, image: impl Into<String>) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            image: image.into(),
            ..ContainerSpec::default()
        }
    }

    /// The body of `POST /containers/create`.
    pub(crate) fn create_body(&self) -> Value {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut host_config = serde_json::Map::new();
        let mut body = serde_json::Map::new();
        body.insert("Image".into(), json!(self.image));
        if let Some(cmd) = &self.cmd {
            body.insert("Cmd".into(), json!(cmd));
        }
        body.insert("Env".into(), json!(env));
        body.insert("Labels".into(), json!(self.labels));
        body.insert("Tty".into(), json!(self.tty));
        if let Some(t) = self.stop_timeout_secs {
            body.insert("StopTimeout".into(), json!(t));
        }
        if let Some(hostname) = &self.hostname {
            body.insert("Hostname".into(), json!(hostname));
        }
        match &self.network {
            Network::Host => {
                host_config.insert("NetworkMode".into(), json!("host"));
            }
            Network::Bridge { .. } | Network::Private { .. } => {
                match &self.network {
                    Network::Private { name, aliases } => {
                        host_config.insert("NetworkMode".into(), json!(name));
                        body.insert(
                            "NetworkingConfig".into(),
                            json!({"EndpointsConfig": {name.clone(): {"Aliases": aliases}}}),
                        );
                    }
                    Network::Bridge { extra_hosts } => {
                        host_config.insert("NetworkMode".into(), json!("bridge"));
                        if !extra_hosts.is_empty() {
                            host_config.insert("ExtraHosts".into(), json!(extra_hosts));
                        }
                    }
                    Network::Host => {}
                }
                if !self.ports.is_empty() {
                    let mut exposed = serde_json::Map::new();
                    let mut bindings: BTreeMap<String, Vec<Value>> = BTreeMap::new();
                    for p in &self.ports {
                        let key = format!("{}/{}", p.container, p.protocol.as_str());
                        exposed.insert(key.clone(), json!({}));
                        // An empty HostPort is the engine's "pick one" (the CLI's `-p ip::port`).
                        let host_port = if p.host_port == 0 {
                            String::new()
                        } else {
                            p.host_port.to_string()
                        };
                        bindings
                            .entry(key)
                            .or_default()
                            .push(json!({"HostIp": p.host_ip, "HostPort": host_port}));
                    }
                    body.insert("ExposedPorts".into(), Value::Object(exposed));
                    host_config.insert("PortBindings".into(), json!(bindings));
                }
            }
        }
        if let Some(m) = self.memory_bytes {
            host_config.insert("Memory".into(), json!(m));
        }
        if let Some(c) = self.nano_cpus {
            host_config.insert("NanoCpus".into(), json!(c));
        }
        if !self.gpu_devices.is_empty() {
            host_config.insert(
                "DeviceRequests".into(),
                json!([{"Driver": "nvidia", "DeviceIDs": self.gpu_devices, "Capabilities": [["gpu"]]}]),
            );
        } else if self.gpus > 0 {
            host_config.insert(
                "DeviceRequests".into(),
                json!([{"Driver": "nvidia", "Count": self.gpus, "Capabilities": [["gpu"]]}]),
            );
        }
        if !self.binds.is_empty() {
            host_config.insert("Binds".into(), json!(self.binds));
        }
        host_config.insert("AutoRemove".into(), json!(self.auto_remove));
        body.insert("HostConfig".into(), Value::Object(host_config));
        Value::Object(body)
    }
}

impl fmt::Debug for ContainerSpec {
    /// Environment values are left out: they carry worker API keys and user secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env_keys: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ContainerSpec")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("cmd", &self.cmd)
            .field("env_keys", &env_keys)
            .field("labels", &self.labels)
            .field("network", &self.network)
            .field("ports", &self.ports)
            .field("memory_bytes", &self.memory_bytes)
            .field("nano_cpus", &self.nano_cpus)
            .field("gpus", &self.gpus)
            .field("gpu_devices", &self.gpu_devices)
            .field("binds", &self.binds)
            .field("stop_timeout_secs", &self.stop_timeout_secs)
            .field("auto_remove", &self.auto_remove)
            .field("tty", &self.tty)
            .field("placement", &self.placement)
            .field("hostname", &self.hostname)
            .field("volume_sizes_gb", &self.volume_sizes_gb)
            .finish()
    }
}

/// A container's lifecycle state, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, never started.
    Created,
    /// Running.
    Running,
    /// Frozen.
    Paused,
    /// Being restarted by a restart policy.
    Restarting,
    /// Being deleted.
    Removing,
    /// Stopped; see [`Container::exit_code`].
    Exited,
    /// Failed to stop or be removed; needs a forced removal.
    Dead,
    /// A state this client does not know, kept verbatim.
    Unknown(String),
}

impl ContainerState {
    pub(crate) fn parse(s: &str) -> ContainerState {
        match s.to_ascii_lowercase().as_str() {
            "created" => ContainerState::Created,
            "running" => ContainerState::Running,
            "paused" => ContainerState::Paused,
            "restarting" => ContainerState::Restarting,
            "removing" => ContainerState::Removing,
            // Podman says "stopped" (and "configured" for created) in some versions.
            "exited" | "stopped" => ContainerState::Exited,
            "configured" => ContainerState::Created,
            "dead" => ContainerState::Dead,
            _ => ContainerState::Unknown(s.to_owned()),
        }
    }
}

/// A container as listed or inspected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// The full container id.
    pub id: String,
    /// The name, without the engine's leading `/`.
    pub name: String,
    /// The image reference the container was created from.
    pub image: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its state.
    pub state: ContainerState,
    /// The exit code once it has stopped (from inspect; from a listing, parsed from the status text).
    pub exit_code: Option<i64>,
    /// Creation time, unix seconds.
    pub created_unix: i64,
    /// When it last started (RFC 3339), from inspect only; `None` if it never ran.
    pub started_at: Option<String>,
    /// When it last stopped (RFC 3339), from inspect only; `None` if it never stopped.
    pub finished_at: Option<String>,
    /// Published ports: (container port, protocol, host ip, host port).
    pub ports: Vec<(u16, Protocol, String, u16)>,
    /// The engine's error for the last start attempt (e.g. a missing GPU driver), from inspect only.
    pub error: Option<String>,
    /// Why it has no machine to run on yet: the Kubernetes scheduler's
    /// message for a Pod it cannot place (`PodScheduled` False, reason
    /// `Unschedulable`, e.g. too few free `nvidia.com/gpu`). Docker places
    /// every container on its own machine: always `None` there.
    pub unschedulable: Option<String>,
}

// ---- wire types -------------------------------------------------------------------------------------

/// `GET /version`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct VersionBody {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub api_version: String,
    #[serde(default, rename = "MinAPIVersion")]
    pub min_api_version: Option<String>,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub arch: String,
}

impl From<VersionBody> for EngineInfo {
    fn from(v: VersionBody) -> EngineInfo {
        EngineInfo {
            version: v.version,
            api_version: v.api_version,
            min_api_version: v.min_api_version.filter(|s| !s.is_empty()),
            os: v.os,
            arch: v.arch,
        }
    }
}

/// `POST /containers/create`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct CreateBody {
    pub id: String,
    #[serde(default)]
    pub warnings: Option<Vec<String>>,
}

/// One entry of `GET /containers/json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ListEntry {
    pub id: String,
    #[serde(default)]
    pub names: Option<Vec<String>>,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub ports: Option<Vec<ListPort>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListPort {
    #[serde(default, rename = "IP")]
    pub ip: Option<String>,
    #[serde(default, rename = "PrivatePort")]
    pub private_port: u16,
    #[serde(default, rename = "PublicPort")]
    pub public_port: Option<u16>,
    #[serde(default, rename = "Type")]
    pub kind: String,
}

impl From<ListEntry> for Container {
    fn from(e: ListEntry) -> Container {
        let state = ContainerState::parse(&e.state);
        let exit_code = if state == ContainerState::Exited {
            exit_code_from_status(&e.status)
        } else {
            None
        };
        let ports = e
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let host_port = p.public_port.filter(|&hp| hp != 0)?;
                Some((
                    p.private_port,
                    Protocol::parse(&p.kind)?,
                    p.ip.unwrap_or_default(),
                    host_port,
                ))
            })
            .collect();
        let name = e.names.unwrap_or_default().into_iter().next().unwrap_or_default();
        Container {
            id: e.id,
            name: strip_slash(name),
            image: e.image,
            labels: e.labels.unwrap_or_default(),
            state,
            exit_code,
            created_unix: e.created,
            started_at: None,
            finished_at: None,
            ports,
            error: None,
            unschedulable: None,
        }
    }
}

/// A container's resource use at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// CPU time used since the container started, nanoseconds.
    pub cpu_total_ns: u64,
    /// CPUs the engine's host has online.
    pub online_cpus: u32,
    /// Memory in use, bytes (without the reclaimable page cache).
    pub memory_bytes: u64,
    /// The memory limit, bytes (the host's memory without one).
    pub memory_limit_bytes: u64,
}

/// `GET /containers/{id}/stats?stream=false&one-shot=true`, the parts Gantry reads.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StatsBody {
    #[serde(default)]
    pub cpu_stats: CpuStatsBody,
    #[serde(default)]
    pub memory_stats: MemoryStatsBody,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CpuStatsBody {
    #[serde(default)]
    pub cpu_usage: CpuUsageBody,
    #[serde(default)]
    pub online_cpus: u32,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CpuUsageBody {
    #[serde(default)]
    pub total_usage: u64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct MemoryStatsBody {
    #[serde(default)]
    pub usage: u64,
    #[serde(default)]
    pub limit: u64,
    #[serde(default)]
    pub stats: BTreeMap<String, u64>,
}

impl From<StatsBody> for Stats {
    fn from(body: StatsBody) -> Stats {
        let memory = &body.memory_stats;
        // As `docker stats` counts it: the page cache the kernel can take back is not in use.
        let cache = memory
            .stats
            .get("inactive_file")
            .or_else(|| memory.stats.get("total_inactive_file"))
            .copied()
            .unwrap_or(0);
        Stats {
            cpu_total_ns: body.cpu_stats.cpu_usage.total_usage,
            online_cpus: body.cpu_stats.online_cpus.max(1),
            memory_bytes: memory.usage.saturating_sub(cache),
            memory_limit_bytes: memory.limit,
        }
    }
}

/// `GET /containers/{id}/json`, the parts Gantry reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct InspectBody {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub created: String,
    /// The image id; the reference is in `Config.Image`.
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub config: Option<InspectConfig>,
    #[serde(default)]
    pub state: Option<InspectState>,
    #[serde(default)]
    pub network_settings: Option<InspectNetwork>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct InspectConfig {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct InspectState {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct InspectNetwork {
    /// `"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32768"}]`, or `null` when not published.
    #[serde(default)]
    pub ports: Option<BTreeMap<String, Option<Vec<InspectBinding>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct InspectBinding {
    #[serde(default)]
    pub host_ip: String,
    #[serde(default)]
    pub host_port: String,
}

impl From<InspectBody> for Container {
    fn from(b: InspectBody) -> Container {
        let config = b.config.unwrap_or_default();
        let st = b.state.unwrap_or_default();
        let state = ContainerState::parse(&st.status);
        let exit_code = matches!(state, ContainerState::Exited | ContainerState::Dead)
            .then_some(st.exit_code)
            .flatten();
        // The engine reports "0001-01-01T00:00:00Z" for a container that never started.
        let started_at = st
            .started_at
            .filter(|s| parse_rfc3339_nanos(s).is_some_and(|ns| ns > 0));
        let finished_at = st
            .finished_at
            .filter(|s| parse_rfc3339_nanos(s).is_some_and(|ns| ns > 0));
        let mut ports = Vec::new();
        for (key, bindings) in b.network_settings.unwrap_or_default().ports.unwrap_or_default() {
            let Some((port, proto)) = key.split_once('/') else {
                continue;
            };
            let (Ok(port), Some(proto)) = (port.parse::<u16>(), Protocol::parse(proto)) else {
                continue;
            };
            for binding in bindings.unwrap_or_default() {
                if let Ok(host_port) = binding.host_port.parse::<u16>() {
                    ports.push((port, proto, binding.host_ip, host_port));
                }
            }
        }
        Container {
            id: b.id,
            name: strip_slash(b.name),
            image: config.image.unwrap_or(b.image),
            labels: config.labels.unwrap_or_default(),
            state,
            exit_code,
            created_unix: parse_rfc3339_nanos(&b.created).map_or(0, |ns| ns.div_euclid(1_000_000_000)),
            started_at,
            finished_at,
            ports,
            error: st.error.filter(|e| !e.is_empty()),
            unschedulable: None,
        }
    }
}

fn strip_slash(name: String) -> String {
    match name.strip_prefix('/') {
        Some(rest) => rest.to_owned(),
        None => name,
    }
}

/// The code in a listing's status text, `Exited (137) 5 seconds ago`.
fn exit_code_from_status(status: &str) -> Option<i64> {
    let rest = status.strip_prefix("Exited (")?;
    rest.split_once(')')?.0.parse().ok()
}

/// Splits an image reference into the `fromImage` and `tag` of a pull.
///
/// The tag is whatever follows the last `:` of the last path component (so a registry port is not
/// mistaken for a tag); a digest (`@sha256:...`) is passed as the tag, which the engine accepts. With
/// neither, the tag is `latest`: an empty tag would make the engine pull every tag of the repository.
pub(crate) fn split_reference(image: &str) -> (&str, &str) {
    if let Some((repo, digest)) = image.split_once('@') {
        return (repo, digest);
    }
    let last_component = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_component..].rfind(':') {
        Some(i) => (&image[..last_component + i], &image[last_component + i + 1..]),
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
        assert_eq!(split_reference("gantry-test/busybox:1"), ("gantry-test/busybox", "1"));
        assert_eq!(split_reference("localhost:5000/a/b"), ("localhost:5000/a/b", "latest"));
        assert_eq!(split_reference("localhost:5000/a/b:v2"), ("localhost:5000/a/b", "v2"));
        assert_eq!(split_reference("ghcr.io/a/b@sha256:abc"), ("ghcr.io/a/b", "sha256:abc"));
    }

    #[test]
    fn registry_auth_debug_hides_the_password() {
        let auth = RegistryAuth {
            username: "u".into(),
            password: "hunter2".into(),
            server: "r.example".into(),
        };
        let shown = format!("{auth:?}");
        assert!(!shown.contains("hunter2") && shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn spec_debug_hides_env_values() {
        let mut spec = ContainerSpec::new("n", "i");
        spec.env.push(("RUNPOD_AI_API_KEY".into(), "secret-key".into()));
        let shown = format!("{spec:?}");
        assert!(
            shown.contains("RUNPOD_AI_API_KEY") && !shown.contains("secret-key"),
            "{shown}"
        );
    }

    #[test]
    fn create_body_for_a_bridge_gpu_worker() {
        let mut spec = ContainerSpec::new("w1", "img:1");
        spec.cmd = Some(vec!["python".into(), "-u".into(), "h.py".into()]);
        spec.env = vec![("A".into(), "1".into()), ("B".into(), "x=y".into())];
        spec.labels.insert("gantry.kind".into(), "worker".into());
        spec.network = Network::Bridge {
            extra_hosts: vec!["host.docker.internal:host-gateway".into()],
        };
        spec.ports = vec![
            PortSpec {
                container: 8080,
                protocol: Protocol::Tcp,
                host_ip: "127.0.0.1".into(),
                host_port: 0,
            },
            PortSpec {
                container: 8080,
                protocol: Protocol::Tcp,
                host_ip: "::1".into(),
                host_port: 18080,
            },
            PortSpec {
                container: 53,
                protocol: Protocol::Udp,
                host_ip: String::new(),
                host_port: 5353,
            },
        ];
        spec.memory_bytes = Some(64 << 20);
        spec.nano_cpus = Some(500_000_000);
        spec.gpus = 2;
        spec.binds = vec!["/data/v1:/workspace".into(), "/etc/x:/x:ro".into()];
        spec.stop_timeout_secs = Some(7);
        let body = spec.create_body();
        let expected = json!({
            "Image": "img:1",
            "Cmd": ["python", "-u", "h.py"],
            "Env": ["A=1", "B=x=y"],
            "Labels": {"gantry.kind": "worker"},
            "Tty": false,
            "StopTimeout": 7,
            "ExposedPorts": {"8080/tcp": {}, "53/udp": {}},
            "HostConfig": {
                "NetworkMode": "bridge",
                "ExtraHosts": ["host.docker.internal:host-gateway"],
                "PortBindings": {
                    "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}, {"HostIp": "::1", "HostPort": "18080"}],
                    "53/udp": [{"HostIp": "", "HostPort": "5353"}]
                },
                "Memory": 67108864,
                "NanoCpus": 500000000,
                "DeviceRequests": [{"Driver": "nvidia", "Count": 2, "Capabilities": [["gpu"]]}],
                "Binds": ["/data/v1:/workspace", "/etc/x:/x:ro"],
                "AutoRemove": false
            }
        });
        assert_eq!(body, expected);

        // GPUs chosen by the caller are asked for by id, not by count.
        spec.gpu_devices = vec!["1".into(), "3".into()];
        assert_eq!(
            spec.create_body()["HostConfig"]["DeviceRequests"],
            json!([{"Driver": "nvidia", "DeviceIDs": ["1", "3"], "Capabilities": [["gpu"]]}])
        );
    }

    #[test]
    fn create_body_for_host_networking_drops_published_ports() {
        let mut spec = ContainerSpec::new("p", "img");
        spec.network = Network::Host;
        spec.ports = vec![PortSpec {
            container: 80,
            protocol: Protocol::Tcp,
            host_ip: String::new(),
            host_port: 0,
        }];
        spec.auto_remove = true;
        let body = spec.create_body();
        assert_eq!(body["HostConfig"], json!({"NetworkMode": "host", "AutoRemove": true}));
        assert!(body.get("ExposedPorts").is_none() && body.get("Cmd").is_none());
    }

    #[test]
    fn list_entry_converts_with_exit_code_and_published_ports_only() {
        let entry: ListEntry = serde_json::from_value(json!({
            "Id": "abc", "Names": ["/gantry-pod-1"], "Image": "img:1", "Labels": {"k": "v"},
            "State": "exited", "Status": "Exited (137) 3 seconds ago", "Created": 1700000000,
            "Ports": [{"PrivatePort": 8080, "Type": "tcp"}, {"IP": "127.0.0.1", "PrivatePort": 8080, "PublicPort": 32768, "Type": "tcp"}]
        }))
        .unwrap();
        let c = Container::from(entry);
        assert_eq!(c.name, "gantry-pod-1");
        assert_eq!(c.state, ContainerState::Exited);
        assert_eq!(c.exit_code, Some(137));
        assert_eq!(c.ports, vec![(8080, Protocol::Tcp, "127.0.0.1".to_owned(), 32768)]);
        // Podman leaves out what is empty.
        let sparse: ListEntry = serde_json::from_value(json!({"Id": "x", "State": "running"})).unwrap();
        let c = Container::from(sparse);
        assert_eq!(
            (c.name.as_str(), c.state, c.exit_code),
            ("", ContainerState::Running, None)
        );
    }

    #[test]
    fn inspect_converts_times_ports_and_never_started() {
        let body: InspectBody = serde_json::from_value(json!({
            "Id": "abc", "Name": "/n", "Created": "2024-05-01T10:00:00.5Z", "Image": "sha256:1",
            "Config": {"Image": "img:1", "Labels": null},
            "State": {"Status": "created", "ExitCode": 0, "StartedAt": "0001-01-01T00:00:00Z", "Error": ""},
            "NetworkSettings": {"Ports": {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "49153"}], "9000/udp": null}}
        }))
        .unwrap();
        let c = Container::from(body);
        assert_eq!(c.image, "img:1");
        assert_eq!(c.created_unix, 1_714_557_600);
        assert_eq!(c.started_at, None);
        assert_eq!(c.exit_code, None);
        assert_eq!(c.error, None);
        assert_eq!(c.ports, vec![(8080, Protocol::Tcp, "0.0.0.0".to_owned(), 49153)]);
    }
}
