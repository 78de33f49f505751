use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use gantry_catalog::{DataCenter, ModelCatalog};
use gantry_ratelimit::{FailMode, Policy};
use serde::{Deserialize, Serialize};

/// All of Gantry's configuration: defaults, then a TOML file, then `GANTRY_…`
/// environment variables (nested keys joined by `__`). Documented in docs/configuration.md.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Listen address of the management REST API.
    pub management_addr: String,
    /// Listen address of the public model endpoints.
    pub public_addr: String,
    /// Where the embedded database and generated files live.
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; unset means SQLite in the data dir.
    pub database_url: Option<String>,
    /// Connections in the database pool; unset means 8 for SQLite, 16 for PostgreSQL.
    pub database_max_connections: Option<u32>,
    /// `redis://…`: rate limit counters live in Redis (shared by every API
    /// process). Unset means the in-process limiter.
    pub redis_url: Option<String>,
    /// A tracing filter, e.g. `info` or `gantry_api=debug,info`.
    pub log: String,
    /// `text` (for people) or `json` (one object per line, for collectors).
    pub log_format: String,
    /// Worker threads of the process's async runtime (scheduler, gRPC, the
    /// bundled workers, background work); unset means [`Settings::runtime_threads`]'s default.
    pub runtime_threads: Option<usize>,
    pub http: HttpSettings,
    pub rate_limits: RateLimitSettings,
    pub auth: AuthSettings,
    pub scheduler: SchedulerSettings,
    /// The models served under `/v2/<model_id>/…` with their billing unit and
    /// price; by default every model of the model manifest.
    pub models: ModelCatalog,
    /// An operator's model manifest, in the built-in one's format, whose
    /// models are served besides the built-in ones (weights from a path or
    /// the Hugging Face hub: Stable Diffusion, for example). Its models join
    /// `models` unless `models` names them already (`GANTRY_MANIFEST`).
    pub manifest: Option<PathBuf>,
    /// Where model weights live; unset means `<data_dir>/models`
    /// (`GANTRY_MODELS_DIR` sets it).
    pub models_dir: Option<PathBuf>,
    /// `serve` fetches the missing weights of its bundled models when it starts.
    pub pull_on_start: bool,
    /// The ONNX Runtime library every ONNX model (speech voices, terrain)
    /// runs on, instead of the CPU build among its files: the
    /// `onnxruntime-gpu` wheel's (`scripts/fetch-onnxruntime-gpu.sh`), for
    /// their `cuda_device` settings (`GANTRY_ONNX_LIBRARY`).
    pub onnx_library: Option<PathBuf>,
    /// `gantry scheduler` serves `GET /metrics` on this address when set (the
    /// `api` and `serve` roles serve it on the management listener).
    pub metrics_addr: Option<String>,
    pub catalog: CatalogSettings,
    /// Where generated files (images, audio, video) are stored and how long
    /// their URLs work.
    pub files: gantry_files::FilesConfig,
    pub billing: BillingSettings,
    /// Users' own containers as serverless endpoints ([serverless.md](../../docs/serverless.md)).
    pub serverless: ServerlessSettings,
    /// The web console on the management listener ([console.md](../../docs/console.md)).
    pub console: ConsoleSettings,
    /// The settings table of each model family, under the name its model
    /// crate gives it (`[text]`, `[speech]`, `[video]`, `[image]`,
    /// `[diffusion]`, `[embedding]`, `[transcription]`): the crate defines its fields and
    /// defaults ([`gantry_worker_sdk::ModelFactory::Settings`]), and
    /// [`Settings::load`] checks each table against them. Other top-level
    /// keys nobody reads also land here and are ignored.
    #[serde(flatten)]
    pub engines: BTreeMap<String, serde_json::Value>,
}

/// The web console (`/console` on the management listener).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsoleSettings {
    /// Serve the console.
    pub enabled: bool,
    /// Anyone may create an account at `/console/sign-up`.
    pub self_signup: bool,
    /// How long a console session lasts after sign-in, in hours.
    pub session_hours: u64,
    /// Sign-in attempts allowed per account, and separately per client
    /// address, in each window.
    pub sign_in_per_minute: u64,
    pub sign_in_per_hour: u64,
    pub sign_in_per_day: u64,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            self_signup: false,
            session_hours: 12,
            sign_in_per_minute: 10,
            sign_in_per_hour: 50,
            sign_in_per_day: 200,
        }
    }
}

impl ConsoleSettings {
    pub fn config(&self) -> gantry_api::ConsoleConfig {
        gantry_api::ConsoleConfig {
            enabled: self.enabled,
            self_signup: self.self_signup,
            session_ttl: std::time::Duration::from_secs(self.session_hours.clamp(1, 24 * 90) * 3600),
            sign_in_policy: gantry_ratelimit::Policy::new(
                self.sign_in_per_minute,
                self.sign_in_per_hour,
                self.sign_in_per_day,
            ),
        }
    }
}

/// Serverless endpoints: the container runtime and the worker protocol.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerlessSettings {
    /// `docker` (the Docker Engine API: Docker, Docker Desktop or Podman's
    /// compatible socket), `kubernetes` (each worker and pod is a Pod; see
    /// [`KubernetesSettings`]) or `none` (endpoints can be stored, but no
    /// worker runs: their routes answer 503).
    pub runtime: String,
    /// The Kubernetes API server, with `runtime = "kubernetes"`.
    pub kubernetes: KubernetesSettings,
    /// The engine's socket (`unix:///…` or `tcp://host:port`); unset means
    /// `DOCKER_HOST`, then the usual Docker and Podman sockets.
    pub docker_host: Option<String>,
    /// The origin worker containers reach the public listener at; unset
    /// means `http://127.0.0.1:<public port>` (with host networking).
    pub worker_base_url: Option<String>,
    /// `host` (workers share the host's network; Linux) or `bridge` (they
    /// reach the host as `host.docker.internal`; set `worker_base_url`).
    pub network: String,
    /// How often the reconciler looks at the endpoints and containers.
    pub tick_ms: u64,
    /// A worker that has not called in this long after its start is replaced.
    pub start_timeout_ms: u64,
    /// How long a stopping worker has to finish its job before it is killed.
    pub stop_grace_ms: u64,
    /// A worker silent this long (no call, no ping, no request open) is lost
    /// and its jobs go back to the queue.
    pub worker_lease_ms: u64,
    /// With `billing.require_credit`, a running pod whose owner's balance
    /// has been at or below zero this long is stopped (not deleted).
    pub pod_credit_grace_ms: u64,
    /// The machine's GPUs that Docker containers are given, one container
    /// to a GPU, by the ids `nvidia-smi` shows (indexes or UUIDs). Unset
    /// means every GPU `nvidia_smi` lists; an empty list hands out none.
    pub gpu_devices: Option<Vec<String>>,
    /// The `nvidia-smi` command that lists the GPUs and reads what a pod's
    /// are doing; empty: none (GPUs are then asked for by count, Docker
    /// picking the machine's first ones).
    pub nvidia_smi: String,
    /// Passphrases of the key that seals registry credentials (and signs
    /// worker tokens): the first seals, all open (rotation). Unset means a
    /// key generated once into `<data_dir>/serverless.key`; several
    /// processes sharing a database must set the same value.
    pub keys: Vec<String>,
}

impl Default for ServerlessSettings {
    fn default() -> Self {
        Self {
            runtime: "docker".into(),
            kubernetes: KubernetesSettings::default(),
            docker_host: None,
            worker_base_url: None,
            network: "host".into(),
            tick_ms: 1_000,
            start_timeout_ms: 120_000,
            stop_grace_ms: 10_000,
            worker_lease_ms: 30_000,
            pod_credit_grace_ms: 300_000,
            gpu_devices: None,
            nvidia_smi: "nvidia-smi".into(),
            keys: Vec::new(),
        }
    }
}

/// Where the Kubernetes runtime finds its API server. Every field unset in a
/// pod means the pod's own ServiceAccount (its token, CA and namespace).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KubernetesSettings {
    /// The API server's origin, e.g. `https://10.0.0.1:443`; unset means
    /// `KUBERNETES_SERVICE_HOST`/`_PORT` (in a pod).
    pub server: Option<String>,
    /// A file holding the bearer token (re-read as it rotates); unset means
    /// the ServiceAccount's.
    pub token_file: Option<String>,
    /// PEM CA certificates of the server's certificate; unset means the
    /// ServiceAccount's `ca.crt` (and the system's roots).
    pub ca_file: Option<String>,
    /// The namespace of workers, pods, claims and pull secrets; unset means
    /// the ServiceAccount's namespace, else `default`.
    pub namespace: Option<String>,
    /// The StorageClass of network volumes' claims (ReadWriteMany); unset
    /// means the cluster's default class.
    pub storage_class: Option<String>,
    /// The size of a claim whose volume's own size Gantry does not know, in
    /// GiB (0 means 10); network volumes and pods' disks request theirs.
    pub volume_size_gib: u32,
}

/// Credit and billing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BillingSettings {
    /// Jobs are accepted only while their owner has credit (`402` otherwise);
    /// operators add it with `gantry users add-credit EMAIL USD`.
    pub require_credit: bool,
    /// Monthly prices of network volume storage per GB, in micro-USD, by tier.
    pub storage: gantry_billing::storage::StoragePrices,
}

impl Default for BillingSettings {
    fn default() -> Self {
        Self {
            require_credit: true,
            storage: gantry_billing::storage::StoragePrices::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpSettings {
    /// Largest accepted request body on the management API, in bytes.
    pub body_limit_bytes: usize,
    /// Worker threads per listener; unset means one per CPU core.
    pub workers: Option<usize>,
    /// Longest a request body may take to arrive, in milliseconds (408 after).
    pub body_timeout_ms: u64,
    /// Longest the request line and header fields may take to arrive on a new
    /// connection, in milliseconds (408 after); at least 1000 (it is measured
    /// on a clock with a 0.5 s tick).
    pub head_timeout_ms: u64,
    /// The public listener's origin as clients reach it (behind a proxy,
    /// for example), used in endpoints' `requestUrls`; unset means
    /// `http://<public_addr>`.
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthSettings {
    /// How long a verified key is trusted without a fresh lookup. Bounds how
    /// long a revocation made by another process takes to take effect.
    pub cache_ttl_ms: u64,
}

/// The job layer: the scheduler's gRPC listener for workers, and job policies.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerSettings {
    /// Where workers connect (gRPC).
    pub addr: String,
    /// HS256 secret worker tokens are signed with. Unset in `serve`: a random one
    /// per process, which only the bundled workers know. Set it to run external workers.
    pub worker_secret: Option<String>,
    /// Models whose bundled worker `gantry serve` runs in-process.
    pub bundled_workers: Vec<String>,
    /// Concurrent jobs of each bundled worker.
    pub bundled_slots: u32,
    /// Dispatches a job may get before a crash or a lost worker fails it.
    pub max_attempts: u32,
    /// Results of `/run` jobs are kept this long after they finish, in seconds.
    pub async_retention_secs: u64,
    /// Results of `/runsync` jobs are kept this long after they finish, in seconds.
    pub sync_retention_secs: u64,
    /// How long a scheduler holds the jobs it runs without renewing, in milliseconds.
    pub lease_ms: u64,
    /// Period of the scheduler's sweeps (timeouts, expiry, lost leases), in milliseconds.
    pub sweep_interval_ms: u64,
    /// How often workers heartbeat, in milliseconds; a worker silent for 3 intervals is lost.
    pub heartbeat_interval_ms: u64,
    /// Jobs a scheduler keeps claimed beyond its free worker slots, per model (0: none).
    pub claim_ahead: u32,
    /// A `/runsync` job run by the scheduler of its own process is written
    /// when it ends, or after running this long, in milliseconds (0: at
    /// submit; at most 500).
    pub sync_store_after_ms: u64,
    /// Redis pub/sub channel for job wake-ups between processes (used when
    /// `redis_url` is set; processes sharing a database must use the same).
    pub signal_channel: String,
    /// Webhook deliveries tried per job.
    pub webhook_attempts: u32,
    /// Timeout of one webhook request, in milliseconds.
    pub webhook_timeout_ms: u64,
    /// PEM file of extra root certificates trusted for `https://` webhooks,
    /// on top of the system's.
    pub webhook_ca_file: Option<std::path::PathBuf>,
    /// Address ranges (CIDR) webhooks may reach although they are loopback,
    /// private, link-local or otherwise special-purpose (refused by default).
    pub webhook_allow_ranges: Vec<String>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:50051".into(),
            worker_secret: None,
            // The manifest's default models: the echo model and a text model.
            bundled_workers: gantry_manifest::Manifest::builtin()
                .defaults()
                .map(|model| model.id.clone())
                .collect(),
            bundled_slots: 16,
            max_attempts: 3,
            async_retention_secs: 30 * 60,
            sync_retention_secs: 60,
            lease_ms: 30_000,
            sweep_interval_ms: 1_000,
            heartbeat_interval_ms: 5_000,
            claim_ahead: 0,
            sync_store_after_ms: 200,
            signal_channel: "gantry:jobs".into(),
            webhook_attempts: 3,
            webhook_timeout_ms: 10_000,
            webhook_ca_file: None,
            webhook_allow_ranges: Vec::new(),
        }
    }
}

impl Settings {
    /// Opens the store of generated files.
    pub fn open_files(&self) -> Result<gantry_files::Files, String> {
        gantry_files::Files::open(&self.files, &self.data_dir, &format!("http://{}", self.public_addr))
            .map_err(|e| format!("files: {e}"))
    }

    /// The job layer's configuration, with the file store.
    pub fn job_config(&self) -> Result<gantry_jobs::SchedulerConfig, String> {
        let mut config = self.scheduler.job_config();
        config.webhook_destinations = self
            .scheduler
            .webhook_config()
            .policy()
            .map_err(|e| format!("scheduler: {e}"))?;
        config.files = Some(self.open_files()?);
        config.require_credit = self.billing.require_credit;
        config.storage_prices = self.billing.storage;
        Ok(config)
    }
}

impl SchedulerSettings {
    pub fn job_config(&self) -> gantry_jobs::SchedulerConfig {
        let mut config = gantry_jobs::SchedulerConfig::default();
        config.max_attempts = self.max_attempts.max(1);
        config.async_retention = std::time::Duration::from_secs(self.async_retention_secs);
        config.sync_retention = std::time::Duration::from_secs(self.sync_retention_secs);
        config.lease = std::time::Duration::from_millis(self.lease_ms.max(100));
        config.sweep_interval = std::time::Duration::from_millis(self.sweep_interval_ms.max(10));
        config.claim_ahead = self.claim_ahead;
        config.sync_store_after = std::time::Duration::from_millis(self.sync_store_after_ms);
        config
    }

    /// The webhook outbox's settings.
    pub fn webhook_config(&self) -> gantry_webhooks::WebhookConfig {
        let mut config = gantry_webhooks::WebhookConfig::default();
        config.attempts = self.webhook_attempts.max(1);
        config.timeout = std::time::Duration::from_millis(self.webhook_timeout_ms.max(1));
        config.ca_file = self.webhook_ca_file.clone();
        config.allow_ranges = self.webhook_allow_ranges.clone();
        config
    }
}

/// Per-user request quotas. Users can be given their own with `gantry users set-limits`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimitSettings {
    /// Default quotas for the management API.
    pub management: Policy,
    /// Default quotas for the public model endpoints (counted separately).
    pub public: Policy,
    /// What to do when Redis cannot answer: `open` admits, `closed` answers 503.
    pub fail_mode: FailMode,
    /// Budget for one Redis decision, in milliseconds.
    pub redis_timeout_ms: u64,
    /// Multiplexed Redis connections the decisions are spread over.
    pub redis_connections: usize,
}

impl Default for RateLimitSettings {
    fn default() -> Self {
        Self {
            management: Policy::new(600, 20_000, 200_000),
            public: Policy::new(600, 20_000, 200_000),
            fail_mode: FailMode::Open,
            redis_timeout_ms: 50,
            redis_connections: 4,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CatalogSettings {
    /// Replaces the built-in data center set when non-empty.
    pub data_centers: Vec<DataCenter>,
    /// Replaces the built-in GPU types when non-empty.
    pub gpus: Vec<gantry_catalog::GpuType>,
    /// Replaces the built-in CPU flavors when non-empty.
    pub cpus: Vec<gantry_catalog::CpuType>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            management_addr: "127.0.0.1:8080".into(),
            public_addr: "127.0.0.1:8081".into(),
            data_dir: PathBuf::from("./data"),
            database_url: None,
            database_max_connections: None,
            redis_url: None,
            log: "info,llama_cpp=warn".into(),
            log_format: "text".into(),
            runtime_threads: None,
            http: HttpSettings::default(),
            rate_limits: RateLimitSettings::default(),
            scheduler: SchedulerSettings::default(),
            models: gantry_manifest::Manifest::builtin().catalog(),
            manifest: None,
            models_dir: None,
            pull_on_start: true,
            onnx_library: None,
            metrics_addr: None,
            auth: AuthSettings::default(),
            catalog: CatalogSettings::default(),
            files: gantry_files::FilesConfig::default(),
            billing: BillingSettings::default(),
            serverless: ServerlessSettings::default(),
            console: ConsoleSettings::default(),
            engines: crate::families()
                .iter()
                .filter_map(|family| Some((family.settings_table()?.to_owned(), family.default_settings())))
                .collect(),
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            body_limit_bytes: 64 * 1024,
            workers: None,
            body_timeout_ms: 10_000,
            head_timeout_ms: 5_000,
            public_url: None,
        }
    }
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self { cache_ttl_ms: 4_000 }
    }
}

impl Settings {
    /// Loads the layered configuration. `file` wins over `GANTRY_CONFIG`;
    /// with neither, `./gantry.toml` is read if it exists.
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let from_env = std::env::var_os("GANTRY_CONFIG").map(PathBuf::from);
        let path = file.map(Path::to_path_buf).or(from_env);
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        figment = match path {
            Some(path) => figment.merge(Toml::file_exact(path)),
            None => figment.merge(Toml::file("gantry.toml")),
        };
        let mut settings: Settings = figment
            .merge(Env::prefixed("GANTRY_").ignore(&["config"]).split("__"))
            .extract()
            .map_err(Box::new)?;
        settings
            .apply_manifest()
            .map_err(|e| Box::new(figment::Error::from(e)))?;
        settings
            .check_engines()
            .map_err(|e| Box::new(figment::Error::from(e)))?;
        Ok(settings)
    }

    /// Checks every model family's settings table against its type: a
    /// wrong type or value is refused when the process starts, not when a
    /// model loads.
    pub fn check_engines(&self) -> Result<(), String> {
        for family in crate::families() {
            family.check_settings(self.engine(&**family))?;
        }
        Ok(())
    }

    /// The settings table of `family` (absent: its defaults apply).
    pub fn engine(&self, family: &dyn gantry_worker_sdk::Family) -> Option<&serde_json::Value> {
        self.engines.get(family.settings_table()?)
    }

    /// The settings table named `name`, made empty if absent, to change a
    /// field in code: `settings.engine_mut("text")["threads"] = 1.into()`.
    pub fn engine_mut(&mut self, name: &str) -> &mut serde_json::Value {
        let table = self
            .engines
            .entry(name.to_owned())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if !table.is_object() {
            *table = serde_json::Value::Object(Default::default());
        }
        table
    }

    /// The model manifest in effect: the built-in one, and the models of
    /// `manifest` after them when it is set. [`Settings::apply_manifest`]
    /// reports a bad file; here one is logged and the built-in one used.
    /// Each entry without an `input_schema` of its own has the schema of the
    /// family that serves it ([`crate::workers::described`]).
    pub fn manifest(&self) -> &'static gantry_manifest::Manifest {
        let builtin = gantry_manifest::Manifest::builtin();
        let manifest = match &self.manifest {
            None => builtin,
            Some(path) => gantry_manifest::Manifest::with_extra(path).unwrap_or_else(|error| {
                tracing::error!(%error, "using the built-in model manifest only");
                builtin
            }),
        };
        crate::workers::described(manifest)
    }

    /// Reads the operator's manifest (an error names what is wrong with it)
    /// and adds its models to `models` where `models` does not list them.
    pub fn apply_manifest(&mut self) -> Result<(), String> {
        let Some(path) = &self.manifest else {
            return Ok(());
        };
        let manifest = gantry_manifest::Manifest::with_extra(path).map_err(|e| e.to_string())?;
        let mut specs: Vec<_> = self.models.iter().cloned().collect();
        for spec in manifest.catalog().iter() {
            if self.models.get(&spec.id).is_none() {
                specs.push(spec.clone());
            }
        }
        self.models = ModelCatalog::new(specs)?;
        Ok(())
    }

    /// Worker threads for the async runtime of a process that serves HTTP
    /// (`with_http`) or not. The configured number wins (at least one).
    /// Unset: a process with the HTTP listeners already runs one HTTP worker
    /// thread per core (`http.workers`), so its runtime gets half the cores,
    /// rounded up, rather than another thread per core; on two cores the
    /// second runtime thread only added context switches
    /// (decision 0026 in docs/decisions/http-and-process.md). Other processes get one per core.
    pub fn runtime_threads(&self, with_http: bool) -> usize {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        match self.runtime_threads {
            Some(threads) => threads.max(1),
            None if with_http => cores.div_ceil(2),
            None => cores,
        }
    }

    /// Where model weights live (see [`Settings::models_dir`]).
    pub fn models_dir(&self) -> PathBuf {
        self.models_dir.clone().unwrap_or_else(|| self.data_dir.join("models"))
    }

    /// The database URL in effect: the configured one, or SQLite under the data dir.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) if !url.trim().is_empty() => url.clone(),
            _ => format!("sqlite://{}?mode=rwc", self.data_dir.join("gantry.db").display()),
        }
    }
}
