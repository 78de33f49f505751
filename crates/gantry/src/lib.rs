//! How the roles are composed. This crate owns the settings, the database
//! (connection, migrations, the SQLite lock) and the construction of every
//! service; the roles receive what they need, built:
//! - the API role (`api_role`): the HTTP side, `gantry_api::Application`,
//!   serving services built here;
//! - the scheduler role (`scheduler_role`): the gRPC listener for workers and
//!   the job loops;
//! - the bundled workers (`workers`), which reach the scheduler over loopback
//!   gRPC exactly as remote workers do.
//!
//! `main` and the integration tests both start the platform through here.
mod api_role;
mod database;
mod scheduler_role;
mod serverless;
pub use serverless::worker_env;
mod settings;
mod workers;

pub use api_role::{http_config, start_api};
pub use database::{Database, connect_database, job_store};
pub use scheduler_role::{SchedulerRole, worker_secret};
pub use settings::{
    AuthSettings, BillingSettings, CatalogSettings, HttpSettings, RateLimitSettings, SchedulerSettings, Settings,
};
pub use workers::{Workers, detect_gpu, ensure_weights, families, family_of, model_slots, worker_config};

use gantry_api::Application;

/// Why a role could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A model whose files are present did not load (bad files, a bad
    /// engine table, a device it cannot use).
    #[error("{0}")]
    Load(String),
    #[error("database {url}: {source}")]
    Database { url: String, source: sea_orm::DbErr },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<gantry_api::ListenError> for StartError {
    fn from(error: gantry_api::ListenError) -> Self {
        match error {
            gantry_api::ListenError::Bind { addr, source } => StartError::Bind { addr, source },
            gantry_api::ListenError::Io(error) => StartError::Io(error),
        }
    }
}

/// The whole platform in one process: what `gantry serve` runs.
pub struct Platform {
    /// The database, held (with its SQLite lock) until the platform is dropped.
    pub database: Database,
    pub app: Application,
    pub scheduler: SchedulerRole,
    pub workers: Workers,
    /// Users' serverless workers (their containers outlive a restart and are
    /// adopted by the next start).
    pub fleet: std::sync::Arc<gantry_containers::Fleet>,
    /// The fleet's reconciler loop.
    pub reconciler: Reconciler,
}

/// The running reconciler of the fleet; it runs until [`Reconciler::stop`]
/// (dropping the handle leaves it running).
pub struct Reconciler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Reconciler {
    /// Ends the loop after its current look. Worker containers keep running
    /// (the next start adopts them).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

impl Platform {
    pub async fn start(mut settings: Settings) -> Result<Platform, StartError> {
        settings.apply_manifest().map_err(StartError::Config)?;
        // Settings made in code skip `Settings::load`, which checks these too.
        settings.check_engines().map_err(StartError::Config)?;
        SchedulerRole::check(&settings)?;
        let secret = worker_secret(&settings);
        let (dispatcher, events) = SchedulerRole::dispatcher(&settings, &secret)?;
        let database = Database::open_serving(&settings).await?;
        let jobs = job_store(&settings, &database)?;
        let containers = serverless::container_service(&settings, database.conn.clone())?;
        let fleet = serverless::fleet(&settings, containers, dispatcher.clone()).await?;
        serverless::hear_jobs_queued_elsewhere(&jobs, &fleet)?;
        let app = start_api(
            &settings,
            &database,
            jobs.clone(),
            Some(dispatcher.clone()),
            Some(fleet.clone()),
        )
        .await?;
        fleet.listening_at(app.public_addr());
        let scheduler = SchedulerRole::start(&settings, jobs, (dispatcher, events), secret).await?;
        let workers = scheduler.start_bundled_workers(&settings).await?;
        let (fleet_stop, mut stopped) = tokio::sync::watch::channel(false);
        let reconciler = tokio::spawn(fleet.clone().run(async move {
            // Stopped by `shutdown`; a platform taken apart keeps it running.
            if stopped.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }));
        Ok(Platform {
            database,
            app,
            scheduler,
            workers,
            fleet,
            reconciler: Reconciler {
                stop: fleet_stop,
                task: reconciler,
            },
        })
    }

    /// Stops accepting requests, lets the workers finish their jobs, stops the scheduler.
    pub async fn shutdown(self) {
        for handle in self.app.handles() {
            handle.stop(true).await;
        }
        self.reconciler.stop().await;
        self.workers.shutdown().await;
        self.scheduler.shutdown().await;
    }
}
