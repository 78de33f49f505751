//! Databases, dispatchers, schedulers and echo workers for the tests. Real
//! gRPC on loopback, real SDK workers; nothing is mocked.

use std::sync::Arc;
use std::time::Duration;

use gantry_catalog::{ModelCatalog, ModelSpec};
use gantry_dispatch::{DispatchConfig, Dispatcher, Event};
use gantry_jobs::{JobStatus, JobStore, JobView, Mode, NewJob, SchedulerConfig};
use gantry_migrations::MigratorTrait;
use gantry_scheduler::{Scheduler, WebhookConfig};
use gantry_worker_sdk::{Credentials, JobContext, JobError, Model, Output, WorkerConfig, WorkerRuntime};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub const SECRET: &[u8] = b"scheduler-test-secret";
pub const ECHO: &str = gantry_model_echo::MODEL_ID;
pub const USER: &str = "user-1";
/// Upper bound for anything a test waits for. Only a failing test waits
/// that long; it is generous so that a machine with its CPUs oversubscribed
/// (a build beside the tests) still passes (10 s was seen to be too short).
pub const WAIT: Duration = Duration::from_secs(60);

pub use gantry_testkit::Backend;

/// Quick sweeps, and a lease no loaded machine lets lapse: a lapsed lease
/// rightly runs a job a second time (at least once, charged once), so the
/// tests that count runs need one that holds however slow the sweeps get.
/// Tests of crash recovery use [`crash_config`].
pub fn config() -> SchedulerConfig {
    let mut config = SchedulerConfig::default();
    config.webhook_destinations = webhooks().policy().expect("valid ranges");
    config.sweep_interval = Duration::from_millis(50);
    config.lease = Duration::from_secs(60);
    config
}

/// Webhooks as the tests deliver them: their receivers listen on loopback.
pub fn webhooks() -> WebhookConfig {
    let mut config = WebhookConfig::default();
    config.allow_ranges = vec!["127.0.0.0/8".into()];
    config
}

/// [`config`] with a short lease, so that a crashed scheduler's jobs are
/// requeued within a second. These tests never count runs: on a starved
/// machine a survivor's lease may lapse too, and the job then runs again.
pub fn crash_config() -> SchedulerConfig {
    let mut config = config();
    config.lease = Duration::from_millis(600);
    config
}

/// An empty database for one test: an SQLite file in a temp dir, or a fresh
/// PostgreSQL database (dropped with it).
pub struct Fresh {
    pub url: String,
    _pg: Option<PgDatabase>,
    _dir: tempfile::TempDir,
}

impl Fresh {
    pub async fn new(backend: Backend) -> Fresh {
        gantry_testkit::trace_to_file();
        let dir = tempfile::tempdir().expect("temp dir");
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/gantry.db?mode=rwc", dir.path().display()), None),
            Backend::Postgres => {
                let pg = PgDatabase::create().await;
                (pg.url.clone(), Some(pg))
            }
        };
        Fresh {
            url,
            _pg: pg,
            _dir: dir,
        }
    }
}

/// A migrated database and a job store on it.
pub struct Env {
    pub db: DatabaseConnection,
    pub catalog: Arc<ModelCatalog>,
    pub store: JobStore,
    _database: Fresh,
}

impl Env {
    pub async fn new(backend: Backend) -> Env {
        Self::with_config(backend, config()).await
    }

    pub async fn with_config(backend: Backend, config: SchedulerConfig) -> Env {
        Self::on(Fresh::new(backend).await, backend, config).await
    }

    /// Migrates `database` (whatever it already holds) and opens a store on it.
    pub async fn on(database: Fresh, backend: Backend, config: SchedulerConfig) -> Env {
        let db = Database::connect(&database.url).await.expect("connect");
        if backend == Backend::Sqlite {
            // As `gantry serve` does.
            db.execute_unprepared("PRAGMA journal_mode=WAL").await.expect("wal");
        }
        gantry_migrations::Migrator::up(&db, None).await.expect("migrate");
        let store = JobStore::new(db.clone(), config).expect("job store");
        Env {
            db,
            catalog: Arc::new(ModelCatalog::default()),
            store,
            _database: database,
        }
    }

    pub fn echo(&self) -> ModelSpec {
        self.catalog.get(ECHO).expect("echo in catalog").clone()
    }

    /// Submits an async echo job for [`USER`].
    pub async fn submit(&self, input: Value) -> JobView {
        self.try_submit(input).await.expect("submit")
    }

    /// [`Env::submit`], which may be refused.
    pub async fn try_submit(&self, input: Value) -> Result<JobView, gantry_jobs::JobError> {
        self.store
            .submit(USER, &self.echo(), NewJob::new(input), Mode::Async)
            .await
    }

    /// Submits a sync (`runsync`) echo job for [`USER`].
    pub async fn submit_sync(&self, input: Value) -> JobView {
        self.store
            .submit(USER, &self.echo(), NewJob::new(input), Mode::Sync)
            .await
            .expect("submit")
    }

    /// The job, or `None` if the caller cannot see it (no such job, or expired).
    pub async fn try_get(&self, id: &str) -> Option<JobView> {
        match self.store.get(USER, ECHO, id).await {
            Ok(view) => Some(view),
            Err(gantry_jobs::JobError::NotFound) => None,
            Err(error) => panic!("get: {error}"),
        }
    }

    /// Columns of the job's row as written to the database.
    async fn columns_of(&self, columns: &str, id: &str) -> Option<sea_orm::QueryResult> {
        let backend = self.db.get_database_backend();
        let placeholder = if backend == DbBackend::Postgres { "$1" } else { "?" };
        let sql = format!("SELECT {columns} FROM jobs WHERE id = {placeholder}");
        self.db
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [id.into()]))
            .await
            .expect("job query")
    }

    /// The job's row as written to the database: (status, worker id).
    pub async fn row_of(&self, id: &str) -> Option<(String, Option<String>)> {
        let row = self.columns_of("status, worker_id", id).await?;
        Some((
            row.try_get::<String>("", "status").expect("status"),
            row.try_get::<Option<String>>("", "worker_id").expect("worker_id"),
        ))
    }

    /// The row's `webhook_due_ms` (`None`: no delivery pending).
    pub async fn webhook_due_of(&self, id: &str) -> Option<i64> {
        let row = self.columns_of("webhook_due_ms", id).await.expect("job row");
        row.try_get::<Option<i64>>("", "webhook_due_ms")
            .expect("webhook_due_ms")
    }

    pub async fn get(&self, id: &str) -> JobView {
        self.store.get(USER, ECHO, id).await.expect("get")
    }

    /// Waits for the job to be final; fails the test after [`WAIT`].
    pub async fn finished(&self, id: &str) -> JobView {
        let view = self.store.wait(USER, ECHO, id, WAIT).await.expect("wait");
        assert!(view.status.is_final(), "job did not finish in time: {view:?}");
        view
    }

    /// Polls until the job has the status.
    pub async fn until_status(&self, id: &str, status: JobStatus) -> JobView {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let view = self.get(id).await;
            if view.status == status {
                return view;
            }
            assert!(tokio::time::Instant::now() < deadline, "never {status:?}: {view:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ledger rows of a job.
    pub async fn charges_of(&self, job_id: &str) -> Vec<i64> {
        let rows = self
            .db
            .query_all_raw(Statement::from_sql_and_values(
                self.db.get_database_backend(),
                match self.db.get_database_backend() {
                    DbBackend::Postgres => "SELECT amount_micro_usd FROM ledger_entries WHERE job_id = $1",
                    _ => "SELECT amount_micro_usd FROM ledger_entries WHERE job_id = ?",
                },
                [job_id.into()],
            ))
            .await
            .expect("ledger query");
        rows.iter()
            .map(|row| row.try_get::<i64>("", "amount_micro_usd").expect("amount"))
            .collect()
    }

    pub async fn ledger_count(&self) -> i64 {
        let row = self
            .db
            .query_one_raw(Statement::from_string(
                self.db.get_database_backend(),
                "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM ledger_entries",
            ))
            .await
            .expect("count")
            .expect("row");
        row.try_get::<i64>("", "n").expect("n")
    }
}

/// Crashes `node` (its scheduler's task dies without releasing anything) and
/// kills `worker`. A new scheduler with worker `w2` must then requeue the job
/// once the lease lapses (600 ms: `env` comes from [`crash_config`]), run it,
/// and charge it once.
pub async fn crash_and_recover(env: &Env, mut node: Node, worker: Worker, job_id: &str) {
    node.scheduler.take().expect("running").crash().await;
    drop(node);
    worker.kill();
    let second = Node::start(&env.store, &env.catalog).await;
    let _worker = second.echo_worker("w2", 1);
    completed_once_by(env, job_id, "w2").await;
    second.shutdown().await;
}

/// Waits for the job: COMPLETED by `worker`, and charged exactly once.
pub async fn completed_once_by(env: &Env, job_id: &str, worker: &str) -> JobView {
    let done = env.finished(job_id).await;
    assert_eq!(done.status, JobStatus::Completed, "{done:?}");
    assert_eq!(done.worker_id.as_deref(), Some(worker));
    assert_eq!(env.charges_of(job_id).await, [10]);
    done
}

/// A dispatcher serving on 127.0.0.1:0 with a scheduler on top.
pub struct Node {
    pub url: String,
    pub dispatcher: Dispatcher,
    pub scheduler: Option<Scheduler>,
    stop_serving: Option<oneshot::Sender<()>>,
}

impl Node {
    pub async fn start(store: &JobStore, catalog: &Arc<ModelCatalog>) -> Node {
        Self::start_with(store, catalog, |events| events).await
    }

    /// A node whose scheduler delivers webhooks as `webhooks` says.
    pub async fn start_with_webhooks(store: &JobStore, catalog: &Arc<ModelCatalog>, webhooks: &WebhookConfig) -> Node {
        Self::start_full(store, catalog, |events| events, webhooks).await
    }

    /// `tap` may interpose on the dispatcher's events before the scheduler sees them.
    pub async fn start_with(
        store: &JobStore,
        catalog: &Arc<ModelCatalog>,
        tap: impl FnOnce(mpsc::Receiver<Event>) -> mpsc::Receiver<Event>,
    ) -> Node {
        Self::start_full(store, catalog, tap, &webhooks()).await
    }

    async fn start_full(
        store: &JobStore,
        catalog: &Arc<ModelCatalog>,
        tap: impl FnOnce(mpsc::Receiver<Event>) -> mpsc::Receiver<Event>,
        webhooks: &WebhookConfig,
    ) -> Node {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        // A worker is lost after 6 s of silence: no test here waits for
        // that (a killed worker's stream closes, which reports it at once),
        // and a starved machine must not reap a live one.
        let (dispatcher, events) = Dispatcher::new(DispatchConfig::new(SECRET).with_heartbeat(Duration::from_secs(2)));
        let (stop_serving, stopped) = oneshot::channel::<()>();
        tokio::spawn(dispatcher.clone().serve(listener, async {
            let _ = stopped.await;
        }));
        let scheduler = Scheduler::start(
            store.clone(),
            Arc::clone(catalog),
            dispatcher.clone(),
            tap(events),
            webhooks,
        )
        .await
        .expect("scheduler starts");
        Node {
            url,
            dispatcher,
            scheduler: Some(scheduler),
            stop_serving: Some(stop_serving),
        }
    }

    pub fn echo_worker(&self, worker_id: &str, slots: u32) -> Worker {
        Worker::spawn(gantry_model_echo::runtime(worker_config(&self.url, worker_id, slots)))
    }

    /// An echo worker that records the jobs it starts in `runs`.
    pub fn counting_worker(&self, worker_id: &str, slots: u32, runs: Runs) -> Worker {
        Worker::spawn(WorkerRuntime::new(
            Counting { runs },
            worker_config(&self.url, worker_id, slots),
        ))
    }

    pub async fn shutdown(mut self) {
        if let Some(scheduler) = self.scheduler.take() {
            scheduler.shutdown().await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(stop) = self.stop_serving.take() {
            let _ = stop.send(());
        }
    }
}

pub fn worker_config(url: &str, worker_id: &str, slots: u32) -> WorkerConfig {
    let mut config = WorkerConfig::new(url, worker_id, Credentials::Secret(SECRET.to_vec()));
    config.slots = slots;
    config.backoff_initial = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(200);
    config.connect_timeout = Duration::from_secs(2);
    config.cancel_grace = Duration::from_millis(300);
    config
}

/// A worker runtime on the test's Tokio runtime.
pub struct Worker {
    handle: JoinHandle<Result<(), gantry_worker_sdk::WorkerError>>,
}

impl Worker {
    fn spawn<M: Model>(runtime: WorkerRuntime<M>) -> Worker {
        Worker {
            handle: tokio::spawn(runtime.run_until(std::future::pending())),
        }
    }

    /// Kills the worker abruptly: its connection and running jobs vanish.
    pub fn kill(self) {
        self.handle.abort();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// The job ids that counting workers started, one entry per run, and a gate
/// that holds the jobs submitted with `"hold": true` until the test opens it.
#[derive(Clone)]
pub struct Runs {
    started: Arc<std::sync::Mutex<Vec<String>>>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Default for Runs {
    fn default() -> Self {
        Self {
            started: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl Runs {
    /// Every run so far, in the order they started.
    pub fn started(&self) -> Vec<String> {
        self.started.lock().expect("runs").clone()
    }

    /// How many runs started.
    pub fn count(&self) -> usize {
        self.started.lock().expect("runs").len()
    }

    /// Lets one held job go on.
    pub fn release_one(&self) {
        self.gate.add_permits(1);
    }

    /// Lets every held job (and any held later) go on.
    pub fn open_gate(&self) {
        self.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }
}

/// The echo model, recording its runs; `"hold": true` in the input (taken out
/// before echo sees it) waits at [`Runs`]' gate or until cancelled.
pub struct Counting {
    runs: Runs,
}

impl Model for Counting {
    fn id(&self) -> &str {
        ECHO
    }

    async fn run(&self, mut input: Value, ctx: JobContext) -> Result<Output, JobError> {
        self.runs.started.lock().expect("runs").push(ctx.job_id().to_owned());
        let hold = input.as_object_mut().and_then(|o| o.remove("hold")) == Some(Value::Bool(true));
        if hold {
            tokio::select! {
                permit = self.runs.gate.acquire() => drop(permit),
                () = ctx.cancelled() => return Err(JobError::Cancelled),
            }
        }
        gantry_model_echo::EchoModel.run(input, ctx).await
    }
}

pub use gantry_testkit::PgDatabase;
