//! The API role: the services the HTTP handlers use, built from the settings
//! and handed to `gantry_api`, which only serves them.
use std::sync::Arc;
use std::time::Duration;

use gantry_api::{Application, HttpConfig, Services};
use gantry_auth::AuthService;
use gantry_catalog::Catalog;
use gantry_dispatch::Dispatcher;
use gantry_jobs::JobStore;
use gantry_ratelimit::{RateLimiter, RedisConfig};
use gantry_volumes::VolumeService;

use crate::database::Database;
use crate::{Settings, StartError};

/// Builds every service of the HTTP side, then starts both listeners.
/// `dispatcher` is the in-process scheduler's, when there is one.
pub async fn start_api(
    settings: &Settings,
    database: &Database,
    jobs: JobStore,
    dispatcher: Option<Dispatcher>,
    fleet: Option<Arc<gantry_containers::Fleet>>,
) -> Result<Application, StartError> {
    let catalog = if settings.catalog.data_centers.is_empty() {
        Catalog::default()
    } else {
        Catalog::new(settings.catalog.data_centers.clone())
    };
    catalog.validate().map_err(StartError::Config)?;
    let limiter = match settings.redis_url.as_deref().filter(|u| !u.trim().is_empty()) {
        None => RateLimiter::in_memory(),
        Some(url) => {
            let config = RedisConfig {
                url: url.to_string(),
                timeout_ms: settings.rate_limits.redis_timeout_ms,
                connections: settings.rate_limits.redis_connections,
                ..RedisConfig::default()
            };
            RateLimiter::redis(&config, settings.rate_limits.fail_mode)
                .await
                .map_err(|e| StartError::Config(e.to_string()))?
        }
    };
    let db = database.conn.clone();
    let services = Services {
        auth: Arc::new(AuthService::new(
            db.clone(),
            Duration::from_millis(settings.auth.cache_ttl_ms),
        )),
        volumes: if database.sole_owner() {
            // Sole writer of this SQLite file: volume lists can be served from memory.
            VolumeService::new(db.clone()).with_list_cache()
        } else {
            VolumeService::new(db.clone())
        },
        catalog: Arc::new(catalog),
        gpus: Arc::new(or_default(&settings.catalog.gpus, gantry_catalog::default_gpus)),
        cpus: Arc::new(or_default(&settings.catalog.cpus, gantry_catalog::default_cpus)),
        limiter,
        files: jobs.config().files.clone(),
        census: gantry_jobs::Census::new(db.clone(), jobs.config()),
        jobs,
        models: Arc::new(settings.models.clone()),
        manifest: settings.manifest(),
        dispatcher,
        containers: match &fleet {
            Some(fleet) => fleet.service().clone(),
            None => crate::serverless::container_service(settings, db.clone())?,
        },
        fleet,
        public_url: settings.http.public_url.clone(),
        console: settings.console.config(),
        db,
    };
    Ok(Application::start(services, http_config(settings))?)
}

/// The listeners' configuration.
pub fn http_config(settings: &Settings) -> HttpConfig {
    HttpConfig {
        management_addr: settings.management_addr.clone(),
        public_addr: settings.public_addr.clone(),
        body_limit: settings.http.body_limit_bytes,
        body_timeout: Duration::from_millis(settings.http.body_timeout_ms),
        // actix-http measures it on a clock that ticks every 0.5 s: below 1 s,
        // a head arriving at once could be refused.
        head_timeout: Duration::from_millis(settings.http.head_timeout_ms.max(1_000)),
        workers: settings
            .http
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)),
        management_policy: settings.rate_limits.management,
        public_policy: settings.rate_limits.public,
    }
}

/// The configured list, or the built-in one when none is configured.
fn or_default<T: Clone>(configured: &[T], builtin: fn() -> Vec<T>) -> Vec<T> {
    if configured.is_empty() {
        builtin()
    } else {
        configured.to_vec()
    }
}
