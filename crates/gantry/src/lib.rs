//! How the roles are composed: the HTTP side (`gantry_api::Application`), the
//! scheduler with its gRPC listener for workers, and the bundled workers, which
//! reach the scheduler over loopback gRPC exactly as remote workers do.
//! `main` and the integration tests both start the platform through here.
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::{Application, Settings, StartError};
use gantry_dispatch::{DispatchConfig, Dispatcher, Event};
use gantry_scheduler::{JobStore, Scheduler};
use gantry_worker::{Credentials, WorkerConfig};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// A running scheduler: the gRPC listener for workers and the job loops.
pub struct SchedulerRole {
    pub addr: SocketAddr,
    pub dispatcher: Dispatcher,
    secret: Vec<u8>,
    scheduler: Scheduler,
    grpc: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

/// The secret workers sign their tokens with: the configured one, or a random
/// one that only this process's bundled workers will know.
pub fn worker_secret(settings: &Settings) -> Vec<u8> {
    match &settings.scheduler.worker_secret {
        Some(secret) if !secret.is_empty() => secret.as_bytes().to_vec(),
        _ => {
            use rand::RngExt;
            let bytes: [u8; 32] = rand::rng().random();
            bytes.to_vec()
        }
    }
}

impl SchedulerRole {
    /// The dispatcher (worker registry) and its event stream, before anything listens.
    pub fn dispatcher(settings: &Settings, secret: &[u8]) -> (Dispatcher, mpsc::Receiver<Event>) {
        let mut config = DispatchConfig::new(secret.to_vec());
        config.heartbeat_interval = Duration::from_millis(settings.scheduler.heartbeat_interval_ms.max(50));
        config.lease = config.heartbeat_interval * 3;
        Dispatcher::new(config)
    }

    /// Refuses settings the scheduler would fail on, before anything is
    /// created or bound.
    pub fn check(settings: &Settings) -> Result<(), StartError> {
        settings
            .scheduler
            .job_config()
            .check()
            .map_err(|e| StartError::Config(format!("scheduler: {e}")))
    }

    /// Binds the worker listener and starts claiming jobs from the database.
    pub async fn start(
        settings: &Settings,
        store: JobStore,
        (dispatcher, events): (Dispatcher, mpsc::Receiver<Event>),
        secret: Vec<u8>,
    ) -> Result<Self, StartError> {
        let addr = &settings.scheduler.addr;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let serving = dispatcher.clone();
        let grpc = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(err) = serving.serve(listener, shutdown).await {
                tracing::error!(error = %err, "scheduler gRPC listener failed");
            }
        });
        let models = Arc::new(settings.models.clone());
        let scheduler = Scheduler::start(store, models, dispatcher.clone(), events)
            .await
            .map_err(|e| StartError::Config(format!("scheduler: {e}")))?;
        tracing::info!(scheduler = %local, instance = scheduler.instance_id(), "scheduler is listening for workers");
        Ok(Self {
            addr: local,
            dispatcher,
            secret,
            scheduler,
            grpc,
            stop,
        })
    }

    /// Starts the bundled workers named in the settings, in this process.
    pub fn start_bundled_workers(&self, settings: &Settings) -> Result<Workers, StartError> {
        let url = format!("http://{}", self.addr);
        let mut workers = Workers::new();
        for model in &settings.scheduler.bundled_workers {
            let id = format!("{model}-bundled-{}", std::process::id());
            workers.start(
                model,
                worker_config(&url, &id, Credentials::Secret(self.secret.clone()), settings),
            )?;
        }
        Ok(workers)
    }

    /// Stops claiming, then closes the worker listener.
    pub async fn shutdown(self) {
        self.scheduler.shutdown().await;
        let _ = self.stop.send(true);
        let _ = self.grpc.await;
    }
}

pub fn worker_config(url: &str, worker_id: &str, credentials: Credentials, settings: &Settings) -> WorkerConfig {
    let mut config = WorkerConfig::new(url, worker_id, credentials);
    config.slots = settings.scheduler.bundled_slots.max(1);
    config.heartbeat_interval = Duration::from_millis(settings.scheduler.heartbeat_interval_ms.max(50));
    config
}

/// Workers running in this process; each drains (finishes what runs) on shutdown.
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Default for Workers {
    fn default() -> Self {
        Self::new()
    }
}

impl Workers {
    pub fn new() -> Self {
        Self {
            stop: watch::channel(false).0,
            tasks: Vec::new(),
        }
    }

    /// Starts the worker of `model` (one of the worker crates linked into this binary).
    pub fn start(&mut self, model: &str, config: WorkerConfig) -> Result<(), StartError> {
        let mut stopped = self.stop.subscribe();
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let task = match model {
            gantry_worker_echo::MODEL_ID => spawn_runtime(gantry_worker_echo::runtime(config), shutdown),
            other => {
                return Err(StartError::Config(format!(
                    "no worker for model '{other}' is built into this binary (available: {})",
                    gantry_worker_echo::MODEL_ID
                )));
            }
        };
        self.tasks.push(task);
        Ok(())
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

fn spawn_runtime<M: gantry_worker::Model>(
    runtime: gantry_worker::WorkerRuntime<M>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(err) = runtime.run_until(shutdown).await {
            tracing::error!(error = %err, "worker stopped");
        }
    })
}

/// The whole platform in one process: what `gantry serve` runs.
pub struct Platform {
    pub app: Application,
    pub scheduler: SchedulerRole,
    pub workers: Workers,
}

impl Platform {
    pub async fn start(settings: Settings) -> Result<Platform, StartError> {
        SchedulerRole::check(&settings)?;
        let secret = worker_secret(&settings);
        let (dispatcher, events) = SchedulerRole::dispatcher(&settings, &secret);
        let app = Application::build(settings.clone(), Some(dispatcher.clone())).await?;
        let store = app.state().jobs.clone();
        let scheduler = SchedulerRole::start(&settings, store, (dispatcher, events), secret).await?;
        let workers = scheduler.start_bundled_workers(&settings)?;
        Ok(Platform {
            app,
            scheduler,
            workers,
        })
    }

    /// Stops accepting requests, lets the workers finish their jobs, stops the scheduler.
    pub async fn shutdown(self) {
        for handle in self.app.handles() {
            handle.stop(true).await;
        }
        self.workers.shutdown().await;
        self.scheduler.shutdown().await;
    }
}
