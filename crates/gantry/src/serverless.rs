//! Serverless endpoints in this process: the key that seals registry
//! credentials and signs worker tokens, the container service, the runtime
//! and the fleet that runs the workers.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gantry_containers::{ContainerService, Fleet, FleetConfig, SecretBox};
use gantry_dispatch::Dispatcher;
use gantry_runtime::{Docker, KubeToken, Kubernetes, KubernetesConfig, Runtime};
use sea_orm::DatabaseConnection;

use crate::{Settings, StartError};

/// The passphrases in effect: the configured ones, or the one kept in
/// `<data_dir>/serverless.key` (made on first use, readable by its owner only).
fn passphrases(settings: &Settings) -> Result<Vec<String>, StartError> {
    let configured: Vec<String> = settings
        .serverless
        .keys
        .iter()
        .filter(|k| !k.is_empty())
        .cloned()
        .collect();
    if !configured.is_empty() {
        return Ok(configured);
    }
    let path = settings.data_dir.join("serverless.key");
    Ok(vec![read_or_make_key(&path)?])
}

fn read_or_make_key(path: &Path) -> Result<String, StartError> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let key = text.trim().to_owned();
        if !key.is_empty() {
            return Ok(key);
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    use rand::RngExt;
    let bytes: [u8; 32] = rand::rng().random();
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(mut file) => {
            use std::io::Write;
            file.write_all(key.as_bytes())?;
            file.write_all(b"\n")?;
            tracing::info!(path = %path.display(), "made the key that seals registry credentials");
            Ok(key)
        }
        // Another process made it first: use theirs.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(std::fs::read_to_string(path)?.trim().to_owned())
        }
        Err(error) => Err(StartError::Io(error)),
    }
}

/// The container service on `db`, with the configured sealing keys.
pub fn container_service(settings: &Settings, db: DatabaseConnection) -> Result<ContainerService, StartError> {
    let phrases = passphrases(settings)?;
    let keys: Vec<[u8; 32]> = phrases.iter().map(|p| SecretBox::derive(p)).collect();
    let (current, previous) = keys
        .split_first()
        .ok_or_else(|| StartError::Config("serverless.keys is empty".into()))?;
    Ok(ContainerService::new(db, Arc::new(SecretBox::new(*current, previous))))
}

/// The container runtime the settings name, if one is configured.
fn runtime(settings: &Settings) -> Result<Option<Arc<dyn Runtime>>, StartError> {
    match settings.serverless.runtime.as_str() {
        "none" => Ok(None),
        "docker" => {
            let docker = match settings.serverless.docker_host.as_deref().filter(|h| !h.is_empty()) {
                Some(host) => Docker::connect(host),
                None => Docker::from_env(),
            };
            match docker {
                Ok(docker) => Ok(Some(Arc::new(docker))),
                Err(error) => {
                    tracing::warn!(%error, "no container engine found: serverless endpoints will answer 503");
                    Ok(None)
                }
            }
        }
        "kubernetes" => kubernetes(&settings.serverless.kubernetes).map(|k| Some(Arc::new(k) as Arc<dyn Runtime>)),
        other => Err(StartError::Config(format!(
            "serverless.runtime must be docker, kubernetes or none (got {other:?})"
        ))),
    }
}

/// The Kubernetes runtime of `k`: what it names, and the pod's own
/// ServiceAccount (in a cluster) for the rest.
fn kubernetes(k: &crate::settings::KubernetesSettings) -> Result<Kubernetes, StartError> {
    let set = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    let mut config = match (set(&k.server), KubernetesConfig::in_cluster()) {
        (Some(server), Some(in_cluster)) => KubernetesConfig { server, ..in_cluster },
        (Some(server), None) => KubernetesConfig::new(server),
        (None, Some(in_cluster)) => in_cluster,
        (None, None) => {
            return Err(StartError::Config(
                "serverless.runtime is kubernetes, but serverless.kubernetes.server is unset and this \
                 process is not in a pod (no KUBERNETES_SERVICE_HOST)"
                    .into(),
            ));
        }
    };
    if let Some(file) = set(&k.token_file) {
        config.token = KubeToken::File(file.into());
    }
    if let Some(file) = set(&k.ca_file) {
        config.ca_file = Some(file.into());
    }
    if let Some(namespace) = set(&k.namespace) {
        config.namespace = namespace;
    }
    config.storage_class = set(&k.storage_class);
    if k.volume_size_gib > 0 {
        config.volume_size_gib = k.volume_size_gib;
    }
    Kubernetes::new(config).map_err(|e| StartError::Config(format!("serverless.kubernetes: {e}")))
}

/// The secret worker tokens are signed with (stable across restarts: it
/// comes from the serverless key).
fn token_secret(settings: &Settings) -> Result<Vec<u8>, StartError> {
    let phrases = passphrases(settings)?;
    Ok(SecretBox::derive(&format!("worker tokens\0{}", phrases[0])).to_vec())
}

/// The heartbeat interval of the scheduler, which a worker's pings must beat.
fn ping_interval(settings: &Settings) -> Duration {
    Duration::from_millis(settings.scheduler.heartbeat_interval_ms.max(50))
}

/// The RunPod environment of worker `worker_id` of `endpoint_id`
/// (`gantry endpoints worker-env`).
pub fn worker_env(
    settings: &Settings,
    endpoint_id: &str,
    worker_id: &str,
    base: &str,
    gpu: bool,
) -> Result<Vec<(String, String)>, StartError> {
    Ok(gantry_containers::fleet::worker_env(
        &token_secret(settings)?,
        endpoint_id,
        worker_id,
        base,
        if gpu { "gpu" } else { "cpu" },
        ping_interval(settings),
    ))
}

/// The fleet of a process that runs a scheduler; its base URL is set once
/// the public listener is bound ([`Fleet::listening_at`]).
pub async fn fleet(
    settings: &Settings,
    service: ContainerService,
    dispatcher: Dispatcher,
) -> Result<Arc<Fleet>, StartError> {
    let s = &settings.serverless;
    let network = match s.network.as_str() {
        "host" => true,
        "bridge" => false,
        other => {
            return Err(StartError::Config(format!(
                "serverless.network must be host or bridge (got {other:?})"
            )));
        }
    };
    let base_url_set = s.worker_base_url.as_deref().is_some_and(|u| !u.trim().is_empty());
    if s.runtime == "kubernetes" && !network && !base_url_set {
        // Pods on the cluster's network cannot reach this process at the loopback address that
        // is the default.
        return Err(StartError::Config(
            "serverless.runtime is kubernetes with serverless.network = bridge: set \
             serverless.worker_base_url to a URL at which the worker Pods reach this process's \
             public listener, and this process only (its Pod's address, e.g. http://$(POD_IP):8081: \
             a worker's calls must all reach the process that holds its session)"
                .into(),
        ));
    }
    let nvidia_smi = Some(s.nvidia_smi.trim())
        .filter(|smi| !smi.is_empty())
        .map(std::path::PathBuf::from);
    let config = FleetConfig {
        worker_base_url: s.worker_base_url.clone().unwrap_or_default(),
        host_network: network,
        token_secret: token_secret(settings)?,
        // Pings renew the worker's lease (three heartbeat intervals).
        ping_interval: ping_interval(settings),
        worker_lease: Duration::from_millis(s.worker_lease_ms.max(1000)),
        tick: Duration::from_millis(s.tick_ms.max(50)),
        start_timeout: Duration::from_millis(s.start_timeout_ms.max(1000)),
        stop_grace: Duration::from_millis(s.stop_grace_ms),
        gpus: Arc::new(if settings.catalog.gpus.is_empty() {
            gantry_catalog::default_gpus()
        } else {
            settings.catalog.gpus.clone()
        }),
        cpus: Arc::new(if settings.catalog.cpus.is_empty() {
            gantry_catalog::default_cpus()
        } else {
            settings.catalog.cpus.clone()
        }),
        // Unique even between processes of one host name and pid (two
        // containers' first processes, or two platforms in one test).
        instance: format!("{}-{}-{:08x}", hostname(), std::process::id(), rand::random::<u32>()),
        pod_credit_grace: settings
            .billing
            .require_credit
            .then(|| Duration::from_millis(s.pod_credit_grace_ms)),
        gpu_devices: gpu_devices(s, nvidia_smi.as_deref()).await,
        nvidia_smi,
    };
    let fleet = Fleet::new(service, runtime(settings)?, dispatcher, config);
    if let Some(reason) = fleet.probe().await {
        tracing::warn!(%reason, "serverless endpoints will answer 503 until the container runtime answers");
    }
    Ok(fleet)
}

/// A job queued through another process (an API replica, or a scheduler
/// that does not hold the fleet's lease) for an endpoint none of whose
/// workers here waits for one wakes this process's fleet, as one queued
/// here does: its leader starts the workers at once, not at its next look.
/// The other process's `Queued` signal carries it (with `redis_url` set);
/// without signals the next look finds the job.
pub fn hear_jobs_queued_elsewhere(jobs: &gantry_jobs::JobStore, fleet: &Arc<Fleet>) -> Result<(), StartError> {
    let fleet = Arc::downgrade(fleet);
    jobs.on_queued_elsewhere(move |model| {
        if let Some(fleet) = fleet.upgrade()
            && gantry_containers::is_endpoint_id(model)
            && fleet.needs_look_for_job(model)
        {
            fleet.job_queued();
        }
    })
    .map_err(|e| StartError::Config(e.to_string()))
}

/// The GPUs Docker containers are given by id: the configured ones, else
/// those `nvidia_smi` lists; `None` (asked for by count) when neither says.
/// Kubernetes' device plugin picks a Pod's GPUs itself.
async fn gpu_devices(
    s: &crate::settings::ServerlessSettings,
    nvidia_smi: Option<&std::path::Path>,
) -> Option<Vec<String>> {
    if s.runtime != "docker" {
        return None;
    }
    let devices = match (&s.gpu_devices, nvidia_smi) {
        (Some(devices), _) => Some(devices.iter().map(|d| d.trim().to_owned()).collect()),
        (None, Some(smi)) => {
            let smi = smi.to_owned();
            tokio::task::spawn_blocking(move || gantry_containers::gpus::GpuPool::discover(&smi))
                .await
                .ok()
                .flatten()
        }
        (None, None) => None,
    };
    match &devices {
        Some(devices) => tracing::info!(?devices, "GPUs are handed out to containers by id"),
        None => tracing::info!("the machine's GPUs are not known: containers ask the engine for a count"),
    }
    devices
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gantry".into())
}
