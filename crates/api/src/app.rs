use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::middleware::ErrorHandlers;
use actix_web::{App, HttpServer, web};
use gantry_auth::AuthService;
use gantry_catalog::{Catalog, ModelCatalog};
use gantry_dispatch::Dispatcher;
use gantry_migrations::{Migrator, MigratorTrait};
use gantry_ratelimit::{RateLimiter, RedisConfig};
use gantry_scheduler::JobStore;
use gantry_volumes::VolumeService;
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::middleware::ensure_problem;
use crate::routes::{self, Endpoint};
use crate::settings::Settings;

/// Everything a handler can reach; one instance shared by all workers.
pub struct AppState {
    pub db: DatabaseConnection,
    pub auth: Arc<AuthService>,
    pub volumes: VolumeService,
    pub catalog: Arc<Catalog>,
    /// The GPU types and CPU flavors of `/v2/catalog/gpus` and `/cpus`.
    pub gpus: Arc<Vec<gantry_catalog::GpuType>>,
    pub cpus: Arc<Vec<gantry_catalog::CpuType>>,
    pub body_limit: usize,
    /// How long a request body may take to arrive (`http.body_timeout_ms`).
    pub body_timeout: Duration,
    pub limiter: RateLimiter,
    pub jobs: JobStore,
    pub models: Arc<ModelCatalog>,
    /// The model manifest in effect (descriptions and input schemas).
    pub manifest: &'static gantry_manifest::Manifest,
    /// The in-process scheduler's workers, when this process runs one.
    pub workers: Option<WorkerCounts>,
    pub(crate) rate_limits: crate::settings::RateLimitSettings,
    pub(crate) openapi: web::Bytes,
    pub(crate) openapi_public: web::Bytes,
    /// The store of generated files (`GET /files/…` reads the local one).
    pub files: Option<gantry_files::Files>,
    /// Held while serving an SQLite database: one serving process per file.
    _sqlite_lock: Option<std::fs::File>,
}

/// Idle and running workers per model, from the in-process dispatcher.
#[derive(Clone)]
pub struct WorkerCounts(pub Dispatcher);

impl WorkerCounts {
    pub fn counts(&self, model: &str) -> (usize, usize) {
        self.0
            .health()
            .models
            .get(model)
            .map(|m| (m.idle_workers, m.running_workers))
            .unwrap_or((0, 0))
    }
}

/// Which listener a request came in on; each has its own rate limit policy and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Management,
    Public,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("database {url}: {source}")]
    Database { url: String, source: sea_orm::DbErr },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The running platform: both listeners, started by `build`, shared by `main` and the tests.
pub struct Application {
    state: web::Data<AppState>,
    management_addr: SocketAddr,
    public_addr: SocketAddr,
    servers: Vec<actix_web::dev::Server>,
    handles: Vec<ServerHandle>,
}

/// Connects to the configured database and applies pending migrations.
pub async fn connect_database(settings: &Settings) -> Result<DatabaseConnection, StartError> {
    let url = settings.database_url();
    let db_err = |source| StartError::Database {
        url: redact(&url),
        source,
    };
    let sqlite = url.starts_with("sqlite:");
    if sqlite {
        std::fs::create_dir_all(&settings.data_dir)?;
    }
    let mut options = ConnectOptions::new(url.clone());
    options
        .max_connections(
            settings
                .database_max_connections
                .unwrap_or(if sqlite { 8 } else { 16 })
                .max(1),
        )
        .min_connections(1)
        .connect_timeout(Duration::from_secs(10))
        .sqlx_logging(false)
        // A file-backed SQLite connection cannot go stale; skip the ping that would cost
        // one extra trip through the connection's worker thread on every query.
        .test_before_acquire(!sqlite);
    if !sqlite {
        // A server connection can die while idle; check only those, not every busy one.
        options.test_before_acquire_if_idle_for(Duration::from_secs(30));
    }
    if sqlite {
        // WAL lets readers proceed during a write; with WAL, synchronous=NORMAL loses
        // nothing when a process crashes (only an OS crash can drop the last commits).
        options.map_sqlx_sqlite_opts(|o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(5))
        });
    }
    let db = Database::connect(options).await.map_err(db_err)?;
    Migrator::up(&db, None).await.map_err(db_err)?;
    Ok(db)
}

/// With `redis_url` set, `jobs` sends and hears job wake-ups over Redis, so
/// that API and scheduler processes sharing the database learn of queued and
/// finished jobs at once (see `docs/scheduler.md`, "Signals").
pub fn connect_job_signals(settings: &Settings, jobs: &JobStore) -> Result<(), StartError> {
    match settings.redis_url.as_deref().filter(|u| !u.trim().is_empty()) {
        None => Ok(()),
        Some(url) => jobs
            .connect_signals(url, &settings.scheduler.signal_channel)
            .map_err(|e| StartError::Config(e.to_string())),
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***{}", &url[..scheme], &url[at..]),
        _ => url.to_string(),
    }
}

impl Application {
    /// Builds the HTTP side. `dispatcher` is the in-process scheduler's, when there is one
    /// (it only feeds the workers' counts of `/health`).
    pub async fn build(settings: Settings, dispatcher: Option<Dispatcher>) -> Result<Self, StartError> {
        let catalog = if settings.catalog.data_centers.is_empty() {
            Catalog::default()
        } else {
            Catalog::new(settings.catalog.data_centers.clone())
        };
        catalog.validate().map_err(StartError::Config)?;
        let lock = lock_sqlite(&settings)?;
        let db = connect_database(&settings).await?;
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
        let mut job_config = settings.job_config().map_err(StartError::Config)?;
        let files = job_config.files.clone();
        // Holding the SQLite file's lock proves no other process runs its jobs.
        job_config.sole_owner = lock.is_some();
        let jobs = JobStore::new(db.clone(), job_config);
        connect_job_signals(&settings, &jobs)?;
        let document = |doc| serde_json::to_vec(&doc).map_err(|e| StartError::Config(e.to_string()));
        let openapi = document(crate::openapi::openapi_json())?;
        let openapi_public = serde_json::to_vec(&crate::openapi::public_openapi_json_with(settings.manifest()))
            .map_err(|e| StartError::Config(e.to_string()))?;
        let state = web::Data::new(AppState {
            auth: Arc::new(AuthService::new(
                db.clone(),
                Duration::from_millis(settings.auth.cache_ttl_ms),
            )),
            volumes: match &lock {
                // Sole writer of this SQLite file: volume lists can be served from memory.
                Some(_) => VolumeService::new(db.clone()).with_list_cache(),
                None => VolumeService::new(db.clone()),
            },
            _sqlite_lock: lock,
            catalog: Arc::new(catalog),
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
            body_limit: settings.http.body_limit_bytes,
            body_timeout: Duration::from_millis(settings.http.body_timeout_ms.max(1)),
            limiter,
            jobs,
            models: Arc::new(settings.models.clone()),
            manifest: settings.manifest(),
            workers: dispatcher.map(WorkerCounts),
            rate_limits: settings.rate_limits.clone(),
            openapi: openapi.into(),
            openapi_public: openapi_public.into(),
            files: files.clone(),
            db,
        });
        let workers = settings
            .http
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
        let (management, management_addr) =
            serve(&settings.management_addr, state.clone(), Surface::Management, workers)?;
        let (public, public_addr) = serve(&settings.public_addr, state.clone(), Surface::Public, workers)?;
        if let Some(files) = &files {
            files.listening_at(public_addr);
        }
        Ok(Self {
            handles: vec![management.handle(), public.handle()],
            servers: vec![management, public],
            state,
            management_addr,
            public_addr,
        })
    }

    pub fn management_addr(&self) -> SocketAddr {
        self.management_addr
    }

    pub fn public_addr(&self) -> SocketAddr {
        self.public_addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Handles that stop the listeners gracefully.
    pub fn handles(&self) -> Vec<ServerHandle> {
        self.handles.clone()
    }

    /// Serves until both listeners stop (see `handles`).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let results = futures_util::future::join_all(self.servers).await;
        results.into_iter().collect()
    }
}

fn serve(
    addr: &str,
    state: web::Data<AppState>,
    surface: Surface,
    workers: usize,
) -> Result<(actix_web::dev::Server, SocketAddr), StartError> {
    let bind_err = |source| StartError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let endpoints: Arc<Vec<Endpoint>> = Arc::new(match surface {
        Surface::Management => routes::management_endpoints(),
        Surface::Public => routes::public_endpoints(),
    });
    let server = HttpServer::new(move || {
        let endpoints = endpoints.clone();
        App::new()
            .app_data(state.clone())
            .app_data(surface)
            .wrap(ErrorHandlers::new().default_handler(ensure_problem))
            .wrap(actix_web::middleware::from_fn(crate::middleware::observe))
            .configure(move |cfg| routes::register(cfg, &endpoints))
            .default_service(web::to(routes::not_found))
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(10)
    .listen(listener)
    .map_err(bind_err)?
    .run();
    Ok((server, local))
}

/// Takes an exclusive lock next to an SQLite database file, so that two serving
/// processes never share one embedded database.
fn lock_sqlite(settings: &Settings) -> Result<Option<std::fs::File>, StartError> {
    let url = settings.database_url();
    let Some(rest) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) else {
        return Ok(None);
    };
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.starts_with(':') {
        return Ok(None); // in-memory
    }
    if let Some(dir) = std::path::Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let lock_path = format!("{path}.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(StartError::Config(format!(
            "another Gantry process is serving the SQLite database {path} (lock {lock_path} is held); \
             run one process per SQLite file, or use PostgreSQL for several"
        ))),
        Err(std::fs::TryLockError::Error(err)) => Err(err.into()),
    }
}

/// A listener that serves only `GET /metrics`, for the roles without HTTP
/// listeners of their own (`gantry scheduler`): `metrics_addr`.
pub fn metrics_server(
    addr: &str,
    jobs: JobStore,
    models: Arc<ModelCatalog>,
    dispatcher: Option<Dispatcher>,
) -> Result<(actix_web::dev::Server, SocketAddr), StartError> {
    let bind_err = |source| StartError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let server = HttpServer::new(move || {
        let (jobs, models, dispatcher) = (jobs.clone(), models.clone(), dispatcher.clone());
        App::new().route(
            "/metrics",
            web::get().to(move || {
                let (jobs, models, dispatcher) = (jobs.clone(), models.clone(), dispatcher.clone());
                async move {
                    let ids: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
                    match gantry_scheduler::metrics::render(&jobs, &ids, dispatcher.as_ref()).await {
                        Ok(text) => actix_web::HttpResponse::Ok()
                            .content_type(gantry_telemetry::CONTENT_TYPE)
                            .body(text),
                        Err(error) => {
                            tracing::warn!(%error, "metrics could not be read");
                            actix_web::HttpResponse::ServiceUnavailable().finish()
                        }
                    }
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(bind_err)?
    .run();
    Ok((server, local))
}

/// `GET /metrics` of a process without a database (`gantry worker`): what
/// this process observed itself (its workers' jobs, run times and slots).
pub fn process_metrics_server(addr: &str) -> Result<(actix_web::dev::Server, SocketAddr), StartError> {
    let bind_err = |source| StartError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let server = HttpServer::new(|| {
        App::new().route(
            "/metrics",
            web::get().to(|| async {
                let mut out = gantry_telemetry::Exposition::new();
                gantry_telemetry::metrics().write(&mut out);
                actix_web::HttpResponse::Ok()
                    .content_type(gantry_telemetry::CONTENT_TYPE)
                    .body(out.finish())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(bind_err)?
    .run();
    Ok((server, local))
}
