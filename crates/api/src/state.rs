//! What a handler can reach: the services this crate is given, and what the
//! listeners add to them. A leaf: it imports nothing of this crate, so every
//! module (handlers, middleware, the console) may depend on it and it on none
//! of them (`tests::the_modules_import_each_other_without_circles` in
//! `lib.rs` checks the whole crate).

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use gantry_auth::AuthService;
use gantry_catalog::{Catalog, ModelCatalog};
use gantry_dispatch::Dispatcher;
use gantry_jobs::JobStore;
use gantry_ratelimit::{Policy, RateLimiter};
use gantry_volumes::VolumeService;
use sea_orm::DatabaseConnection;

/// The services the handlers use, built and configured by the caller (the
/// `gantry` crate composes them from its settings); this crate only serves them.
pub struct Services {
    pub db: DatabaseConnection,
    pub auth: Arc<AuthService>,
    pub volumes: VolumeService,
    pub catalog: Arc<Catalog>,
    /// The GPU types and CPU flavors of `/v2/catalog/gpus` and `/cpus`.
    pub gpus: Arc<Vec<gantry_catalog::GpuType>>,
    pub cpus: Arc<Vec<gantry_catalog::CpuType>>,
    pub limiter: RateLimiter,
    pub jobs: JobStore,
    /// Reads of the platform's state beside the jobs: metrics counts,
    /// worker presence and GPUs, ledger totals, stored files.
    pub census: gantry_jobs::Census,
    pub models: Arc<ModelCatalog>,
    /// The model manifest in effect (descriptions and input schemas).
    pub manifest: &'static gantry_manifest::Manifest,
    /// The in-process scheduler's dispatcher, when this process runs one
    /// (it only feeds the workers' counts of `/health`).
    pub dispatcher: Option<Dispatcher>,
    /// The store of generated files (`GET /files/…` reads the local one).
    pub files: Option<gantry_files::Files>,
    /// Templates, registry credentials and serverless endpoints.
    pub containers: gantry_containers::ContainerService,
    /// The worker containers and their sessions, in a process that runs a
    /// scheduler (`serve`); an API-only process stores endpoints and serves
    /// their jobs, and the scheduler's process runs them.
    pub fleet: Option<std::sync::Arc<gantry_containers::Fleet>>,
    /// The public listener's origin as clients reach it (`http.public_url`);
    /// by default `http://<public listen address>`.
    pub public_url: Option<String>,
    /// The web console on the management listener (`/console`).
    pub console: ConsoleConfig,
}

/// How the console behaves (`[console]` in the settings).
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// Serve `/console` at all.
    pub enabled: bool,
    /// Let anyone create an account at `/console/sign-up` (off: accounts come
    /// from an operator, `gantry users create` and `set-password`).
    pub self_signup: bool,
    /// How long a session lasts after sign-in.
    pub session_ttl: Duration,
    /// Sign-in attempts allowed per account and, separately, per client address.
    pub sign_in_policy: Policy,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            self_signup: false,
            session_ttl: Duration::from_secs(12 * 3600),
            sign_in_policy: Policy::new(10, 50, 200),
        }
    }
}

/// Everything a handler can reach; one instance shared by all workers: the
/// services (read through `Deref`), and what the listeners add to them.
pub struct AppState {
    pub(crate) services: Services,
    pub body_limit: usize,
    /// How long a request body may take to arrive (`http.body_timeout_ms`).
    pub body_timeout: Duration,
    /// Default quotas: (management, public).
    pub(crate) policies: (Policy, Policy),
    pub(crate) openapi: web::Bytes,
    pub(crate) openapi_public: web::Bytes,
    /// `http://<public address>`, known once the listener is bound.
    pub(crate) public_origin: std::sync::OnceLock<String>,
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.services
    }
}

impl AppState {
    /// The origin of the public listener, for the URLs of endpoints' jobs.
    pub fn public_origin(&self) -> String {
        match &self.services.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => self.public_origin.get().cloned().unwrap_or_default(),
        }
    }

    /// Idle and running workers of `model`: exact and free from the
    /// in-process dispatcher; an API-only process reads what the live
    /// schedulers publish.
    pub async fn worker_counts(&self, model: &str) -> Result<(u64, u64), gantry_jobs::JobError> {
        match &self.dispatcher {
            Some(dispatcher) => Ok(dispatcher
                .health()
                .models
                .get(model)
                .map_or((0, 0), |m| (m.idle_workers as u64, m.running_workers as u64))),
            None => self.census.workers(model).await,
        }
    }
}

/// Which listener a request came in on; each has its own rate limit policy and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Management,
    Public,
}
