//! The scheduler role: the gRPC listener for workers and the job loops.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gantry_dispatch::{DispatchConfig, Dispatcher, Event};
use gantry_jobs::JobStore;
use gantry_scheduler::Scheduler;
use gantry_worker_sdk::Credentials;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::workers::{Workers, ensure_weights, model_slots, worker_config};
use crate::{Settings, StartError};

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
    pub fn dispatcher(settings: &Settings, secret: &[u8]) -> Result<(Dispatcher, mpsc::Receiver<Event>), StartError> {
        let mut config = DispatchConfig::new(secret.to_vec());
        // Workers stream output files here; the store keeps them.
        config.files = Some(settings.open_files().map_err(StartError::Config)?.sink());
        config.heartbeat_interval = Duration::from_millis(settings.scheduler.heartbeat_interval_ms.max(50));
        config.lease = config.heartbeat_interval * 3;
        Ok(Dispatcher::new(config))
    }

    /// Refuses settings the scheduler would fail on, before anything is
    /// created or bound.
    pub fn check(settings: &Settings) -> Result<(), StartError> {
        settings.job_config().map_err(StartError::Config)?;
        settings
            .scheduler
            .webhook_config()
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
        let webhooks = settings.scheduler.webhook_config();
        let scheduler = Scheduler::start(store, models, dispatcher.clone(), events, &webhooks)
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

    /// The secret this scheduler's workers sign their tokens with.
    pub fn worker_secret(&self) -> &[u8] {
        &self.secret
    }

    /// Starts the bundled workers named in the settings, in this process.
    /// Missing weights are fetched first when `pull_on_start` is set; a model
    /// whose weights cannot be had is left out (with a message that says how
    /// to fetch it) and the rest are served.
    pub async fn start_bundled_workers(&self, settings: &Settings) -> Result<Workers, StartError> {
        let url = format!("http://{}", self.addr);
        let mut workers = Workers::new();
        for model in &settings.scheduler.bundled_workers {
            if !ensure_weights(settings, model).await {
                continue;
            }
            let id = format!("{model}-bundled-{}", std::process::id());
            let mut config = worker_config(&url, &id, Credentials::Secret(self.secret.clone()), settings);
            if let Some(slots) = model_slots(settings, model) {
                config.slots = slots;
            }
            let started = workers.start(model, config, settings);
            match started {
                Ok(()) => {}
                // A model that cannot load is left out, like missing weights.
                Err(StartError::Load(message)) => {
                    tracing::error!(%model, "not serving {model}: {message}");
                }
                Err(error) => return Err(error),
            }
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
