use std::time::Duration;

/// How a worker proves who it is when it connects.
#[derive(Clone)]
pub enum Credentials {
    /// The scheduler's shared HS256 secret: the SDK mints a short-lived token
    /// (`sub` = worker id, `models` = the served model) on every connect.
    Secret(Vec<u8>),
    /// A token minted elsewhere, sent as is. Once it expires the scheduler
    /// refuses the worker, so prefer [`Credentials::Secret`] for long-running
    /// workers.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(_) => f.write_str("Secret(<redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Settings of a [`WorkerRuntime`](crate::WorkerRuntime).
///
/// Build it with [`WorkerConfig::new`] and adjust the public fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Scheduler's worker endpoint, e.g. `http://127.0.0.1:7070`.
    pub scheduler_url: String,
    /// Stable id of this worker; it must match the token's `sub`.
    pub worker_id: String,
    /// Jobs run at once. Default 1.
    pub slots: u32,
    /// Secret or token for the `authorization` metadata.
    pub credentials: Credentials,
    /// Lifetime of tokens minted from [`Credentials::Secret`]. Default 5 min.
    pub token_ttl: Duration,
    /// Heartbeat interval used when the scheduler does not name one in its
    /// HelloAck. Default 5 s.
    pub heartbeat_interval: Duration,
    /// First reconnect delay; it doubles on each failed attempt. Default
    /// 200 ms.
    pub backoff_initial: Duration,
    /// Upper bound of the reconnect delay. Default 10 s. Each delay is
    /// jittered down to as little as half its value.
    pub backoff_max: Duration,
    /// Time allowed for the TCP connection and the scheduler's HelloAck.
    /// Default 10 s.
    pub connect_timeout: Duration,
    /// How long a cancelled job may keep running before the SDK drops it.
    /// Default 5 s.
    pub cancel_grace: Duration,
    /// GPU name announced in Hello (informational). Default empty.
    pub gpu_name: String,
    /// GPU memory announced in Hello, in bytes (informational). Default 0.
    pub gpu_memory_bytes: u64,
    /// Version string announced in Hello. Default `gantry-worker-sdk/<version>`.
    pub version: String,
    /// Largest gRPC message sent or accepted (a job's input or output travels
    /// in one message). Default 64 MiB.
    pub max_message_bytes: usize,
}

impl WorkerConfig {
    /// A config with the defaults listed on each field.
    pub fn new(scheduler_url: impl Into<String>, worker_id: impl Into<String>, credentials: Credentials) -> Self {
        Self {
            scheduler_url: scheduler_url.into(),
            worker_id: worker_id.into(),
            slots: 1,
            credentials,
            token_ttl: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            cancel_grace: Duration::from_secs(5),
            gpu_name: String::new(),
            gpu_memory_bytes: 0,
            version: concat!("gantry-worker-sdk/", env!("CARGO_PKG_VERSION")).to_owned(),
            max_message_bytes: 64 << 20,
        }
    }
}
