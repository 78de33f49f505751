//! Gantry's container runtime: small clients of the Docker Engine API and of the Kubernetes API.
//!
//! Gantry runs pods and serverless workers as containers on the machine it runs on. Everything it
//! needs from an engine — make sure an image is there, create and start a container, find its own
//! containers again by label, stop, start, remove, read logs — is a handful of Engine API calls, so
//! this crate makes them directly over HTTP/1.1 on the engine's Unix socket (or a plain `tcp://`
//! listener) with hyper, instead of depending on a full generated client. The same calls work
//! against Docker Engine and against Podman's Docker-compatible socket.
//!
//! The [`Runtime`] trait is what the rest of Gantry programs against. [`Docker`] implements it for
//! Engine API sockets, and [`Kubernetes`] for a Kubernetes API server, where each container is a
//! Pod (see the `kubernetes` module's documentation for how the operations map).
//!
//! ```no_run
//! # async fn demo() -> Result<(), gantry_runtime::RuntimeError> {
//! use gantry_runtime::{ContainerSpec, Docker, Network, Runtime};
//!
//! let docker = Docker::from_env()?;
//! let engine = docker.negotiate().await?; // optional: the first call negotiates by itself
//! println!("engine {} (API {})", engine.version, engine.api_version);
//!
//! let mut spec = ContainerSpec::new("gantry-worker-ep1-0", "ghcr.io/acme/worker:1");
//! spec.network = Network::Host;
//! spec.env.push(("RUNPOD_POD_ID".into(), "ep1-0".into()));
//! spec.labels.insert("gantry.kind".into(), "worker".into());
//! docker.ensure_image(&spec.image, None).await?;
//! let id = docker.run(&spec).await?;
//! for line in docker.logs(&id, Some(100), None).await? {
//!     println!("{:?} {} {}", line.stream, line.ts_unix_nanos, line.line);
//! }
//! docker.remove(&id).await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/runtime.md` for socket discovery, version negotiation, networking and GPUs.

mod docker;
mod error;
mod kubernetes;
mod logs;
mod transport;
mod types;

use std::time::Duration;

use futures_util::stream::BoxStream;

pub use docker::{DEFAULT_REQUEST_TIMEOUT, Docker, MAX_API_VERSION};
pub use error::RuntimeError;
pub use kubernetes::{KubeToken, Kubernetes, KubernetesConfig, format_rfc3339, object_name};
pub use logs::{LogDecoder, LogLine, LogStream, parse_rfc3339_nanos};
pub use types::{
    Container, ContainerSpec, ContainerState, EngineInfo, Network, Placement, PortSpec, Protocol, RegistryAuth, Stats,
};

/// What Gantry needs from a container runtime.
///
/// Every operation that names a container accepts its id or its name. Operations are idempotent where
/// a reconciler needs them to be: stopping a stopped container, starting a running one and removing
/// a missing one all succeed.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// The engine's version and platform.
    async fn info(&self) -> Result<EngineInfo, RuntimeError>;

    /// When the engine now answering started, as Unix milliseconds: its start, or a time it
    /// cannot have started before. A container whose last start is earlier than this ran under an
    /// earlier instance of the engine (or an earlier boot of its host) and was stopped when that
    /// one went down. `None` where the engine gives nothing to tell it by.
    async fn started_at(&self) -> Result<Option<i64>, RuntimeError> {
        Ok(None)
    }

    /// Makes sure `image` is present, pulling it (with `auth` as `X-Registry-Auth`) when it is not.
    /// A failed pull, whether refused up front or reported mid-stream, is [`RuntimeError::Pull`].
    async fn ensure_image(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<(), RuntimeError>;

    /// Creates and starts a container and returns its id. A taken name is [`RuntimeError::Conflict`];
    /// a missing image is [`RuntimeError::NotFound`] (call [`Runtime::ensure_image`] first). If the
    /// container cannot be started it is removed again, so a failed `run` leaves nothing behind.
    async fn run(&self, spec: &ContainerSpec) -> Result<String, RuntimeError>;

    /// All containers, running or not, that carry every one of `labels` (all containers when empty).
    async fn list(&self, labels: &[(String, String)]) -> Result<Vec<Container>, RuntimeError>;

    /// One container; [`RuntimeError::NotFound`] when there is no such container.
    async fn inspect(&self, id: &str) -> Result<Container, RuntimeError>;

    /// Sends SIGTERM (or the image's stop signal), then SIGKILL after `grace` (rounded up to whole
    /// seconds). Already stopped or missing containers are fine.
    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError>;

    /// Starts a stopped container; an already running one is fine.
    async fn start(&self, id: &str) -> Result<(), RuntimeError>;

    /// Removes a container, killing it if it runs, together with its anonymous volumes. A missing
    /// container is fine.
    async fn remove(&self, id: &str) -> Result<(), RuntimeError>;

    /// The container's CPU time and memory use now (one sample, no waiting).
    async fn stats(&self, id: &str) -> Result<Stats, RuntimeError>;

    /// Makes the private network `name` ([`Network::Private`]) with `labels`, unless it exists.
    async fn ensure_network(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), RuntimeError>;

    /// Removes the private network `name`; a missing one is fine, one that containers still use is
    /// [`RuntimeError::Conflict`].
    async fn remove_network(&self, name: &str) -> Result<(), RuntimeError>;

    /// Removes a named volume (one a container's `binds` made by naming it); a missing one is fine.
    /// A volume still used by a container is [`RuntimeError::Conflict`].
    async fn remove_volume(&self, name: &str) -> Result<(), RuntimeError>;

    /// The container's output so far: the last `tail` lines (all when `None`) written at or after
    /// `since_unix_secs`, stdout and stderr interleaved in the order the engine logged them.
    async fn logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> Result<Vec<LogLine>, RuntimeError>;

    /// Like [`Runtime::logs`], then every new line as it is written, until the container stops or the
    /// stream is dropped (which closes the connection). Errors, including opening errors such as
    /// [`RuntimeError::NotFound`], arrive as the stream's last item.
    fn follow_logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> BoxStream<'static, Result<LogLine, RuntimeError>>;
}
