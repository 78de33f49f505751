//! Servers, workers and event helpers shared by the tests.

use std::net::SocketAddr;
use std::time::Duration;

use gantry_dispatch::{DispatchConfig, Dispatcher, Event};
use gantry_proto::auth::AUTHORIZATION;
use gantry_proto::v1::worker_gateway_client::WorkerGatewayClient;
use gantry_proto::v1::{Hello, SchedulerMessage, WorkerMessage, worker_message::Kind};
use gantry_worker_sdk::{Credentials, Model, WorkerConfig, WorkerError, WorkerRuntime};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

pub const SECRET: &[u8] = b"test-secret";
pub const ECHO: &str = gantry_model_echo::MODEL_ID;
/// Upper bound for anything a test waits for; tests normally take far less.
pub const WAIT: Duration = Duration::from_secs(5);

pub fn config() -> DispatchConfig {
    DispatchConfig::new(SECRET)
}

/// The dispatch service on its own runtime and thread, so that stopping it
/// kills its connections the way a crashed scheduler process would.
pub struct Server {
    pub addr: SocketAddr,
    pub dispatcher: Dispatcher,
    pub events: mpsc::Receiver<Event>,
    /// Events of other jobs that [`Server::job_events`] read past, kept for
    /// the calls about those jobs: jobs that end together may report in any
    /// order.
    others: Vec<Event>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(config())
    }

    pub fn start_with(config: DispatchConfig) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), config)
    }

    pub fn start_on(addr: SocketAddr, config: DispatchConfig) -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = bind(addr).await;
                let (dispatcher, events) = Dispatcher::new(config);
                let local = listener.local_addr().unwrap();
                ready_tx.send((local, dispatcher.clone(), events)).unwrap();
                tokio::select! {
                    served = dispatcher.serve(listener, std::future::pending()) => served.unwrap(),
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task.
            drop(runtime);
        });
        let (addr, dispatcher, events) = ready_rx.recv_timeout(WAIT).unwrap();
        Self {
            addr,
            dispatcher,
            events,
            others: Vec::new(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the server: listener and every connection go away at once.
    pub fn kill(mut self) -> SocketAddr {
        self.shutdown();
        self.addr
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }

    /// The next event, failing the test after [`WAIT`].
    pub async fn next_event(&mut self) -> Event {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("timed out waiting for an event")
            .expect("event channel closed")
    }

    /// Skips events until one matches.
    pub async fn wait_for(&mut self, what: &str, mut matches: impl FnMut(&Event) -> bool) -> Event {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
                .expect("event channel closed");
            if matches(&event) {
                return event;
            }
        }
    }

    /// Waits until a worker serving `model` has announced free slots.
    pub async fn wait_capacity(&mut self, model: &str) {
        self.wait_for(
            "capacity",
            |e| matches!(e, Event::CapacityAvailable { model: m } if m == model),
        )
        .await;
    }

    /// Events of one job, up to and including its terminal event. Events of
    /// other jobs read meanwhile are kept for the calls about them.
    pub async fn job_events(&mut self, job_id: &str) -> Vec<Event> {
        fn about(event: &Event) -> Option<(&str, bool)> {
            match event {
                Event::Progress { job_id, .. } | Event::Chunk { job_id, .. } => Some((job_id, false)),
                Event::Completed { job_id, .. } | Event::Failed { job_id, .. } | Event::Cancelled { job_id, .. } => {
                    Some((job_id, true))
                }
                _ => None,
            }
        }
        let mut seen = Vec::new();
        let kept = std::mem::take(&mut self.others);
        let mut kept = kept.into_iter();
        loop {
            let event = match kept.next() {
                Some(event) => event,
                None => self.next_event().await,
            };
            let Some((id, terminal)) = about(&event) else {
                continue;
            };
            if id != job_id {
                self.others.push(event);
                continue;
            }
            seen.push(event);
            if terminal {
                self.others.extend(kept);
                return seen;
            }
        }
    }

    /// The terminal event of one job.
    pub async fn terminal(&mut self, job_id: &str) -> Event {
        self.job_events(job_id).await.pop().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds, retrying briefly in case the port is still being released.
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let mut tries = 0;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(error) if tries < 50 => {
                tries += 1;
                eprintln!("bind {addr}: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("bind {addr}: {error}"),
        }
    }
}

/// A worker config tuned for tests: quick reconnects, short grace.
pub fn worker_config(url: &str, worker_id: &str, slots: u32) -> WorkerConfig {
    let mut config = WorkerConfig::new(url, worker_id, Credentials::Secret(SECRET.to_vec()));
    config.slots = slots;
    config.backoff_initial = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(200);
    config.connect_timeout = Duration::from_secs(2);
    config.cancel_grace = Duration::from_millis(500);
    config
}

/// An SDK worker running on the test's runtime.
pub struct Worker {
    handle: Option<JoinHandle<Result<(), WorkerError>>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Worker {
    pub fn spawn<M: Model>(model: M, config: WorkerConfig) -> Self {
        let (shutdown, signal) = oneshot::channel::<()>();
        let runtime = WorkerRuntime::new(model, config);
        let handle = tokio::spawn(runtime.run_until(async {
            let _ = signal.await;
        }));
        Self {
            handle: Some(handle),
            shutdown: Some(shutdown),
        }
    }

    pub fn echo(server: &Server, worker_id: &str, slots: u32) -> Self {
        Self::spawn(
            gantry_model_echo::EchoModel,
            worker_config(&server.url(), worker_id, slots),
        )
    }

    /// Like a SIGTERM: asks the runtime to drain.
    pub fn request_shutdown(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    /// Waits for the runtime to return by itself.
    pub async fn finished(mut self) -> Result<(), WorkerError> {
        let handle = self.handle.take().unwrap();
        tokio::time::timeout(WAIT, handle)
            .await
            .expect("worker did not stop")
            .expect("worker task panicked")
    }

    /// Whether the runtime is still going (connected or reconnecting).
    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Kills the worker abruptly (its task is dropped mid-flight).
    pub fn kill(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

/// A hand-driven worker stream, for what the SDK never does on purpose.
pub struct RawWorker {
    /// Our half of the stream; it stays open while this lives.
    pub out: mpsc::Sender<WorkerMessage>,
    pub inbound: Streaming<SchedulerMessage>,
}

impl RawWorker {
    /// Sends a heartbeat that lists `running` as the jobs it runs.
    pub async fn heartbeat(&self, running: &[&str]) {
        let beat = gantry_proto::v1::Heartbeat {
            timestamp_unix_ms: 0,
            running_job_ids: running.iter().map(|id| (*id).to_owned()).collect(),
        };
        self.out
            .send(WorkerMessage {
                kind: Some(Kind::Heartbeat(beat)),
            })
            .await
            .unwrap();
    }
}

pub fn hello(worker_id: &str, models: &[&str], slots: u32) -> Hello {
    Hello {
        worker_id: worker_id.into(),
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        slots,
        gpu_name: "test".into(),
        gpu_memory_bytes: 0,
        version: "raw".into(),
    }
}

pub fn token(worker_id: &str, models: &[&str], secret: &[u8]) -> String {
    let claims = gantry_proto::auth::WorkerClaims::new(
        worker_id,
        models.iter().map(|m| (*m).to_owned()).collect(),
        Duration::from_secs(60),
    );
    gantry_proto::auth::mint(&claims, secret).unwrap()
}

/// Opens a stream with `authorization` set to `authorization` (if any) and
/// sends `hello` first.
pub async fn raw_connect(url: &str, authorization: Option<String>, hello: Hello) -> Result<RawWorker, Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = WorkerGatewayClient::new(channel);
    let (out, rx) = mpsc::channel(16);
    out.send(WorkerMessage {
        kind: Some(Kind::Hello(hello)),
    })
    .await
    .unwrap();
    let mut request = Request::new(ReceiverStream::new(rx));
    if let Some(value) = authorization {
        request.metadata_mut().insert(AUTHORIZATION, value.parse().unwrap());
    }
    let inbound = tokio::time::timeout(WAIT, client.connect(request))
        .await
        .expect("connect timed out")?
        .into_inner();
    Ok(RawWorker { out, inbound })
}
