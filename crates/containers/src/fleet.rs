//! The running half of serverless endpoints: the worker containers, the
//! workers' protocol sessions, and the loop that keeps both where the
//! endpoints say.
//!
//! Desired state is in the database ([`ContainerService`]); a [`Fleet`] (one
//! per scheduler process) looks at it every tick and drives the container
//! runtime: it starts workers when jobs queue, removes them after their idle
//! timeout, replaces the ones running an older release once they are idle,
//! drains the workers of a deleted endpoint, and removes what it finds with
//! its labels but no record (left by a crash). The reconciler runs only
//! while this process holds the `fleet` lease in the database, so several
//! schedulers on one PostgreSQL database never start the same workers twice.
//!
//! Worker containers run the RunPod worker protocol against the public
//! listener of the process that started them; each worker's session is a
//! [`PolledWorker`] of that process's dispatcher, so its jobs are assigned,
//! leased, requeued and settled by the same code as a bundled model's. Every
//! process publishes its workers' loads in their records and renews a
//! `host:<instance>` lease; the leader judges workers hosted elsewhere from
//! those and asks their host to stop them (`stop_request`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gantry_catalog::{CpuType, GpuType};
use gantry_dispatch::{Dispatcher, PolledWorker};
use gantry_runtime::{
    Container as RuntimeContainer, ContainerSpec, ContainerState, Network, Placement, RegistryAuth, Runtime,
};
use hmac::{KeyInit, Mac};
use sea_orm::{ConnectionTrait, Statement};

use crate::pods::network_volume_name;
use crate::service::{ContainerError, ContainerService, EndpointRecord, WorkerRecord, new_id, now_ms, statement};
use crate::spec::{Scaling, split_args};

/// Where a worker container finds its endpoint's network volume (RunPod's
/// serverless path).
pub const WORKER_VOLUME_PATH: &str = "/runpod-volume";

/// Label keys every container of Gantry carries.
pub const LABEL_KIND: &str = "gantry.kind";
pub const LABEL_ID: &str = "gantry.id";
pub const LABEL_OWNER: &str = "gantry.owner";
pub const LABEL_WORKER: &str = "gantry.worker";
pub const LABEL_VERSION: &str = "gantry.version";
/// Which installation of Gantry made the container: engines may be shared
/// (two deployments on one host, tests in parallel), and a reconciler must
/// never take another installation's containers for orphans of its own.
pub const LABEL_INSTALLATION: &str = "gantry.installation";

/// The reconciler's counters, shown by [`Fleet::write_metrics`].
#[derive(Default)]
struct Counts {
    looks: AtomicU64,
    endpoint_wakeups: AtomicU64,
    job_wakeups: AtomicU64,
}

/// The shortest time between two looks of the reconciler that pokes asked
/// for (a tick looks whenever it is due).
const POKE_GAP: Duration = Duration::from_millis(100);

/// How a [`Fleet`] behaves.
#[derive(Clone)]
pub struct FleetConfig {
    /// The origin worker containers reach this process's public listener
    /// at (`http://127.0.0.1:<port>` with host networking).
    pub worker_base_url: String,
    /// Host networking (the default on Linux), or a bridge with
    /// `host.docker.internal` pointing at the host gateway.
    pub host_network: bool,
    /// Signs the workers' tokens (`RUNPOD_AI_API_KEY`).
    pub token_secret: Vec<u8>,
    /// How often the SDK pings (`RUNPOD_PING_INTERVAL`).
    pub ping_interval: Duration,
    /// A worker silent this long (no call and no ping; an open take or stop
    /// poll does not count, see `PolledWorker`) is
    /// lost and its jobs requeued. A container that exits is noticed by the
    /// reconciler sooner; this covers a worker that hangs.
    pub worker_lease: Duration,
    /// How often the reconciler looks.
    pub tick: Duration,
    /// How long a worker may take from its container's start to its first
    /// call before it is replaced.
    pub start_timeout: Duration,
    /// How long a stopping worker has to finish before it is killed.
    pub stop_grace: Duration,
    /// Prices of the compute a worker gets.
    pub gpus: Arc<Vec<GpuType>>,
    pub cpus: Arc<Vec<CpuType>>,
    /// Name of this process in the lease table.
    pub instance: String,
    /// When credit is required: how long a running pod may go on while its
    /// owner's balance is at or below zero before it is stopped.
    pub pod_credit_grace: Option<Duration>,
    /// The machine's GPUs that containers are given by id (Docker; see
    /// [`crate::gpus`]); `None`: unknown, GPUs are asked for by count.
    pub gpu_devices: Option<Vec<String>>,
    /// The `nvidia-smi` that reads what pods' GPUs are doing; `None`: not
    /// read.
    pub nvidia_smi: Option<std::path::PathBuf>,
}

/// The state of one worker, as `/v2/serverless/{id}/workers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    pub id: String,
    /// RUNNING, IDLE, INITIALIZING, THROTTLED (its Pod waits for a node)
    /// or UNHEALTHY.
    pub status: &'static str,
    pub version: u32,
    pub image: String,
    pub gpu_count: u32,
    pub started_at_ms: i64,
    pub reason: Option<String>,
}

/// What happens to a worker, kept in memory by the fleet.
struct Tracked {
    /// Since when it has held no job (None while busy).
    idle_since: Option<Instant>,
    /// When its container started.
    started: Instant,
    /// Whether it has called in yet.
    seen: bool,
    /// Asked to take no more jobs; removed once idle.
    draining: bool,
}

/// What became of one worker's start.
enum Start {
    Started,
    /// It could not start; its record says why, and the endpoint backs off.
    Failed,
    /// Not started: the GPUs it needs are not free now, or this machine
    /// has fewer than it asks for (the GPU pool's words).
    NoGpus(String),
}

/// A live worker that holds no job, as one look of the reconciler saw it.
struct Idle {
    id: String,
    idle_for: Duration,
    /// Of an older version of its endpoint.
    stale: bool,
    /// Has called no process within the start timeout.
    never_seen: bool,
}

/// The serverless runtime of one scheduler process.
pub struct Fleet {
    service: ContainerService,
    runtime: Option<Arc<dyn Runtime>>,
    dispatcher: Dispatcher,
    config: FleetConfig,
    sessions: tokio::sync::Mutex<HashMap<String, PolledWorker>>,
    tracked: Mutex<HashMap<String, Tracked>>,
    /// Why the runtime is unusable, from the last look (None: it answers).
    runtime_error: Mutex<Option<String>>,
    /// This installation's [`LABEL_INSTALLATION`] value.
    installation: String,
    /// Endpoint id -> when its image last failed to pull or start.
    backoff: Mutex<HashMap<String, Instant>>,
    wake: tokio::sync::Notify,
    /// Until when this process holds the `fleet` lease, as it last wrote it
    /// (ms since the epoch; 0 when it does not hold it).
    lease_until_ms: AtomicI64,
    /// Until when this process's `host:<instance>` lease runs, as it last
    /// wrote it: while it runs, other processes leave the workers whose
    /// sessions are here to this process.
    host_until_ms: AtomicI64,
    /// What this process last published of each hosted worker's load:
    /// (jobs held, idle since).
    published: Mutex<HashMap<String, (i32, Option<i64>)>>,
    /// How often the reconciler looked, and what woke it between ticks.
    counts: Counts,
    /// Where workers reach the public listener.
    base_url: Mutex<String>,
    /// Workers being stopped and removed (in tasks of their own, so that a
    /// container slow to stop holds up no other endpoint).
    stopping: Mutex<std::collections::HashSet<String>>,
    /// Pods with an engine call under way (each in a task of its own).
    pods_busy: Mutex<std::collections::HashSet<String>>,
    /// Running pods whose owner has had no credit since then.
    pods_unpaid: Mutex<HashMap<String, Instant>>,
    /// When the runtime last answered, and the recent stretches (ms, from the
    /// last answer before to the first after) when it did not.
    outages: Mutex<Outages>,
    /// Held while a cluster's network is made: its members start in tasks of
    /// their own, and an engine may make two networks of one name when asked
    /// at once.
    pub(crate) networks: tokio::sync::Mutex<()>,
    /// The machine's GPUs and who has them.
    pub(crate) gpu_pool: crate::gpus::GpuPool,
}

/// The runtime's recent outages, as the looks saw them.
#[derive(Default)]
struct Outages {
    /// The last look the runtime answered.
    last_answer_ms: Option<i64>,
    /// The last answer before the current outage, while one lasts.
    open_since_ms: Option<i64>,
    /// Ended outages of the last hour: (last answer before, first answer after).
    ended: Vec<(i64, i64)>,
}

impl Outages {
    fn answered(&mut self, now: i64) {
        if let Some(since) = self.open_since_ms.take() {
            self.ended.push((since, now));
        }
        self.ended.retain(|(_, to)| now - to < 3_600_000);
        self.last_answer_ms = Some(now);
    }

    fn failed(&mut self) {
        if self.open_since_ms.is_none()
            && let Some(last) = self.last_answer_ms
        {
            self.open_since_ms = Some(last);
        }
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl Fleet {
    pub fn new(
        service: ContainerService,
        runtime: Option<Arc<dyn Runtime>>,
        dispatcher: Dispatcher,
        config: FleetConfig,
    ) -> Arc<Self> {
        let runtime_error = if runtime.is_none() {
            Some("no container runtime is configured (set DOCKER_HOST or start Docker or Podman)".to_owned())
        } else {
            None
        };
        // Derived from the secret the workers' tokens are signed with, which
        // every process of one installation shares and no other has.
        let installation = {
            use sha2::Digest;
            let digest = sha2::Sha256::digest([b"gantry installation\0".as_slice(), &config.token_secret].concat());
            digest.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
        };
        Arc::new(Self {
            installation,
            base_url: Mutex::new(config.worker_base_url.clone()),
            stopping: Mutex::new(std::collections::HashSet::new()),
            pods_busy: Mutex::new(std::collections::HashSet::new()),
            pods_unpaid: Mutex::new(HashMap::new()),
            outages: Mutex::new(Outages::default()),
            networks: tokio::sync::Mutex::new(()),
            gpu_pool: crate::gpus::GpuPool::new(config.gpu_devices.clone(), config.nvidia_smi.clone()),
            service,
            runtime,
            dispatcher,
            config,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            tracked: Mutex::new(HashMap::new()),
            runtime_error: Mutex::new(runtime_error),
            backoff: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            lease_until_ms: AtomicI64::new(0),
            host_until_ms: AtomicI64::new(0),
            published: Mutex::new(HashMap::new()),
            counts: Counts::default(),
        })
    }

    /// The public listener is bound at `addr`: workers reach it there
    /// (over loopback when it listens on every address), unless
    /// `worker_base_url` was configured.
    pub fn listening_at(&self, addr: std::net::SocketAddr) {
        let mut base = lock(&self.base_url);
        if base.is_empty() {
            let host = if addr.ip().is_unspecified() {
                "127.0.0.1".to_owned()
            } else if addr.is_ipv6() {
                format!("[{}]", addr.ip())
            } else {
                addr.ip().to_string()
            };
            *base = format!("http://{host}:{}", addr.port());
        }
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// The labels that find this installation's containers of `kind`.
    pub(crate) fn own(&self, kind: &str) -> Vec<(String, String)> {
        vec![
            (LABEL_KIND.to_owned(), kind.to_owned()),
            (LABEL_INSTALLATION.to_owned(), self.installation.clone()),
        ]
    }

    /// The machine's GPUs and who has them.
    pub fn gpu_pool(&self) -> &crate::gpus::GpuPool {
        &self.gpu_pool
    }

    /// GPUs for a container about to be made: none asked for, or the
    /// machine's GPUs unknown, is [`Grant::ByCount`](crate::gpus::Grant)
    /// (no engine call).
    pub(crate) async fn grant_gpus(
        &self,
        runtime: &Arc<dyn Runtime>,
        wanted: u32,
    ) -> Result<crate::gpus::Grant<'_>, ContainerError> {
        if wanted == 0 || self.gpu_pool.devices().is_none() {
            return Ok(crate::gpus::Grant::ByCount);
        }
        let in_use = self.gpus_in_use(runtime, None).await?;
        Ok(self.gpu_pool.reserve(wanted, &in_use))
    }

    /// The GPUs (by id) that this installation's containers hold: those
    /// running, starting or restarting, except `except`.
    pub(crate) async fn gpus_in_use(
        &self,
        runtime: &Arc<dyn Runtime>,
        except: Option<&str>,
    ) -> Result<std::collections::HashSet<String>, ContainerError> {
        let mine = [(LABEL_INSTALLATION.to_owned(), self.installation.clone())];
        let containers = runtime
            .list(&mine)
            .await
            .map_err(|e| ContainerError::Runtime(e.to_string()))?;
        Ok(containers
            .iter()
            .filter(|c| Some(c.id.as_str()) != except)
            .filter(|c| {
                matches!(
                    c.state,
                    gantry_runtime::ContainerState::Running
                        | gantry_runtime::ContainerState::Created
                        | gantry_runtime::ContainerState::Paused
                        | gantry_runtime::ContainerState::Restarting
                )
            })
            .flat_map(|c| crate::gpus::devices_of(&c.labels))
            .collect())
    }

    /// This installation's [`LABEL_INSTALLATION`] value: what finds its
    /// containers on an engine that others share.
    pub fn installation(&self) -> &str {
        &self.installation
    }

    /// Marks a pod busy; false if it already was.
    pub(crate) fn pod_lock(&self, pod_id: &str) -> bool {
        lock(&self.pods_busy).insert(pod_id.to_owned())
    }

    pub(crate) fn pod_unlock(&self, pod_id: &str) {
        lock(&self.pods_busy).remove(pod_id);
    }

    /// Whether a running pod has been without credit past the grace period
    /// (noting when it first was); clears the note once it has credit.
    pub(crate) fn unpaid_past_grace(&self, pod_id: &str, broke: bool) -> bool {
        let mut unpaid = lock(&self.pods_unpaid);
        let Some(grace) = self.config.pod_credit_grace.filter(|_| broke) else {
            unpaid.remove(pod_id);
            return false;
        };
        unpaid.entry(pod_id.to_owned()).or_insert_with(Instant::now).elapsed() >= grace
    }

    pub fn service(&self) -> &ContainerService {
        &self.service
    }

    pub fn runtime(&self) -> Option<&Arc<dyn Runtime>> {
        self.runtime.as_ref()
    }

    /// Why containers cannot run now (the routes that need them answer 503).
    pub fn unavailable(&self) -> Option<String> {
        lock(&self.runtime_error).clone()
    }

    /// Checks the runtime now; the answer is also kept for [`Fleet::unavailable`].
    pub async fn probe(&self) -> Option<String> {
        let error = match &self.runtime {
            None => Some("no container runtime is configured (set DOCKER_HOST or start Docker or Podman)".to_owned()),
            Some(runtime) => runtime
                .info()
                .await
                .err()
                .map(|e| format!("the container runtime does not answer: {e}")),
        };
        *lock(&self.runtime_error) = error.clone();
        error
    }

    /// Asks the reconciler to look now (an endpoint changed).
    pub fn poke(&self) {
        self.counts.endpoint_wakeups.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether a job about to be queued for `endpoint_id` needs the
    /// reconciler to look at once: when none of the endpoint's workers waits
    /// in a take, the endpoint may need a worker (it is at zero, or every
    /// worker is busy). While one waits, the job is taken at once and the
    /// next tick looks at the scale as usual: a look per job would put an
    /// engine call and database writes beside every job. Asked before the
    /// job is queued, since a waiting worker may take it the moment it is.
    pub fn needs_look_for_job(&self, endpoint_id: &str) -> bool {
        self.dispatcher.free_slots(endpoint_id) == 0
    }

    /// A job was queued that [`Fleet::needs_look_for_job`] said needs a look.
    pub fn job_queued(&self) {
        self.counts.job_wakeups.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// The reconciler's looks and wake-ups, in the metrics exposition.
    pub fn write_metrics(&self, out: &mut gantry_telemetry::Exposition) {
        out.family(
            "gantry_reconciler_looks_total",
            "counter",
            "Looks of the serverless reconciler at the endpoints, their workers and the engine (by this process, \
             while it holds the reconciler's lease).",
        );
        out.sample(
            "gantry_reconciler_looks_total",
            &[],
            self.counts.looks.load(Ordering::Relaxed) as f64,
        );
        out.family(
            "gantry_reconciler_wakeups_total",
            "counter",
            "Requests for the serverless reconciler to look before its next tick, by cause: endpoint (created or \
             changed), job (queued for an endpoint none of whose workers was waiting for one).",
        );
        for (cause, counter) in [
            ("endpoint", &self.counts.endpoint_wakeups),
            ("job", &self.counts.job_wakeups),
        ] {
            out.sample(
                "gantry_reconciler_wakeups_total",
                &[("cause", cause)],
                counter.load(Ordering::Relaxed) as f64,
            );
        }
    }

    /// The token worker `worker_id` of `endpoint_id` authenticates with.
    pub fn worker_token(&self, endpoint_id: &str, worker_id: &str) -> String {
        worker_token(&self.config.token_secret, endpoint_id, worker_id)
    }

    /// Whether `presented` (the raw `Authorization` value the SDK sends, or
    /// a `Bearer` form) is the token of this worker; in constant time.
    pub fn verify_worker(&self, endpoint_id: &str, worker_id: &str, presented: &str) -> bool {
        let presented = presented.strip_prefix("Bearer ").unwrap_or(presented).trim();
        let expected = self.worker_token(endpoint_id, worker_id);
        presented.len() == expected.len()
            && presented
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The protocol session of a worker, registered with the dispatcher on
    /// its first call (and again if its lease ran out in between). `None`
    /// for a worker this platform has ended or is stopping: a container that
    /// outlived its record (a start that timed out after all, an engine that
    /// answered late) must not take jobs it will lose when it is removed.
    pub async fn session(&self, endpoint_id: &str, worker_id: &str) -> Option<PolledWorker> {
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(worker_id).filter(|s| !s.is_closed()) {
            return Some(session.clone());
        }
        if lock(&self.stopping).contains(worker_id) {
            return None;
        }
        let record = match self.service.worker(worker_id).await {
            Ok(Some(record)) if record.ended_at_ms.is_some() || record.endpoint_id != endpoint_id => return None,
            Ok(record) => record,
            Err(error) => {
                tracing::warn!(%worker_id, %error, "the worker's record could not be read");
                return None;
            }
        };
        // A worker's calls all go to one process, where its session and its
        // jobs are. Another live process holding it means the worker's URL
        // does not name one process (a load balancer in front of several).
        if let Some(host) = record.as_ref().and_then(|r| r.host.as_deref())
            && host != self.config.instance
        {
            match self.host_alive(host).await {
                Ok(false) => {} // its process is gone: this one takes it over
                Ok(true) => {
                    tracing::warn!(
                        %worker_id, %host,
                        "a worker whose session is with another live Gantry process called this one; \
                         serverless.worker_base_url must name each process, not a service in front of several"
                    );
                    return None;
                }
                Err(error) => {
                    tracing::warn!(%worker_id, %error, "the worker's host could not be checked");
                    return None;
                }
            }
        }
        let session = self
            .dispatcher
            .attach_polled(worker_id, endpoint_id, "runpod-protocol", self.config.worker_lease)
            .await;
        if record.is_some() {
            let at = now_ms();
            match self.service.host_worker(worker_id, &self.config.instance, at).await {
                Ok(true) => {
                    lock(&self.published).insert(worker_id.to_owned(), (0, Some(at)));
                }
                Ok(false) => {
                    session.close().await;
                    return None; // ended in between
                }
                Err(error) => tracing::warn!(%worker_id, %error, "the worker's host could not be recorded"),
            }
        }
        sessions.insert(worker_id.to_owned(), session.clone());
        if let Some(tracked) = lock(&self.tracked).get_mut(worker_id) {
            tracked.seen = true;
        }
        Some(session)
    }

    /// The workers of an endpoint that have not ended.
    pub async fn worker_views(&self, endpoint_id: &str) -> Result<Vec<WorkerView>, ContainerError> {
        let records = self.service.open_workers(endpoint_id).await?;
        let sessions = self.sessions.lock().await;
        let tracked = lock(&self.tracked);
        Ok(records
            .into_iter()
            .map(|record| {
                let session = sessions.get(&record.id).filter(|s| !s.is_closed());
                // A worker whose session is in another process: what that
                // process published.
                let busy = match session {
                    Some(session) => !session.running().is_empty(),
                    None => record.held_jobs > 0 && record.host.as_deref() != Some(self.config.instance.as_str()),
                };
                let seen =
                    session.is_some() || record.seen_at_ms.is_some() || tracked.get(&record.id).is_some_and(|t| t.seen);
                let status = if record.reason.is_some() && !seen {
                    "UNHEALTHY"
                } else if !seen && record.unschedulable.is_some() {
                    "THROTTLED"
                } else if !seen {
                    "INITIALIZING"
                } else if busy {
                    "RUNNING"
                } else {
                    "IDLE"
                };
                WorkerView {
                    id: record.id,
                    status,
                    version: u32::try_from(record.version).unwrap_or(0),
                    image: record.image,
                    gpu_count: u32::try_from(record.gpu_count).unwrap_or(0),
                    started_at_ms: record.created_at_ms,
                    reason: record.reason.or(record.unschedulable),
                }
            })
            .collect())
    }

    /// Reconciles until `shutdown` resolves: every tick, or at once when
    /// poked. Workers are left running at shutdown (the next start finds
    /// them by their labels and adopts or removes them).
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last_accrual: Option<Instant> = None;
        let mut last_hosting: Option<Instant> = None;
        loop {
            let looked = Instant::now();
            // Every process hosts the sessions of the workers that call it,
            // leader or not: once a tick.
            if last_hosting.is_none_or(|at| at.elapsed() >= self.config.tick) {
                last_hosting = Some(Instant::now());
                self.host_duties().await;
            }
            if self.hold_lease().await {
                self.counts.looks.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.reconcile().await {
                    tracing::warn!(%error, "serverless reconcile failed");
                }
                // Time is charged once a tick: a look a poke asked for
                // between ticks changes no bill.
                if last_accrual.is_none_or(|at| at.elapsed() >= self.config.tick) {
                    last_accrual = Some(Instant::now());
                    if let Err(error) = self.service.accrue_workers(now_ms()).await {
                        tracing::warn!(%error, "charging worker time failed");
                    }
                    if let Err(error) = self.service.accrue_pods(now_ms()).await {
                        tracing::warn!(%error, "charging pod time failed");
                    }
                    self.forget_old_hosts().await;
                }
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = self.wake.notified() => {
                    // Pokes that come in a burst make one look, at most one
                    // every POKE_GAP (those in between wait on the permit).
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep_until((looked + POKE_GAP).into()) => {}
                    }
                }
                () = tokio::time::sleep(self.config.tick) => {}
            }
        }
        self.release_lease().await;
    }

    /// Gives the `fleet` lease up if this process holds it, so that another
    /// process's reconciler takes over at its next tick rather than when the
    /// lease would have lapsed (a crash still leaves it to lapse).
    /// The process's host lease ends now as well: the workers whose sessions
    /// were here are another process's to take over (the moment it ended is
    /// kept, and a worker that calls nobody within the start timeout of it
    /// is replaced).
    async fn release_lease(&self) {
        let now = now_ms();
        if self.lease_until_ms.swap(0, Ordering::Relaxed) > now
            && let Err(error) = self.end_lease("fleet", 0).await
        {
            tracing::warn!(%error, "the fleet lease could not be given up; another process takes over when it lapses");
        }
        if self.host_until_ms.swap(0, Ordering::Relaxed) > now
            && let Err(error) = self.end_lease(&self.host_lease_name(), now).await
        {
            tracing::warn!(%error, "the host lease could not be given up; it lapses");
        }
    }

    /// Ends lease `name` if this process holds it, writing `until_ms`.
    async fn end_lease(&self, name: &str, until_ms: i64) -> Result<(), sea_orm::DbErr> {
        let db = self.service.db();
        let backend = db.get_database_backend();
        let values = vec![until_ms.into(), name.into(), self.config.instance.clone().into()];
        let sql = "UPDATE leases SET until_ms = ? WHERE name = ? AND holder = ?";
        db.execute_raw(statement(backend, sql, values)).await.map(drop)
    }

    fn host_lease_name(&self) -> String {
        format!("host:{}", self.config.instance)
    }

    /// How long a lease runs: three ticks, at least 10 s.
    fn lease_span_ms(&self) -> i64 {
        i64::try_from((self.config.tick * 3).max(Duration::from_secs(10)).as_millis()).unwrap_or(10_000)
    }

    /// Takes or renews lease `name` for this process until `until`: true if
    /// it holds it (it was free, lapsed, or its own).
    async fn take_lease(&self, name: &str, now: i64, until: i64) -> Result<bool, sea_orm::DbErr> {
        let db = self.service.db();
        let backend = db.get_database_backend();
        let sql = "INSERT INTO leases (name, holder, until_ms) VALUES (?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms \
             WHERE leases.holder = ? OR leases.until_ms < ?";
        let values = vec![
            name.into(),
            self.config.instance.clone().into(),
            until.into(),
            self.config.instance.clone().into(),
            now.into(),
        ];
        let result = db.execute_raw(statement(backend, sql, values)).await?;
        Ok(result.rows_affected() == 1)
    }

    /// Whether the process `instance` runs (its host lease has not ended).
    async fn host_alive(&self, instance: &str) -> Result<bool, sea_orm::DbErr> {
        let db = self.service.db();
        let row = db
            .query_one_raw(statement(
                db.get_database_backend(),
                "SELECT until_ms FROM leases WHERE name = ?",
                vec![format!("host:{instance}").into()],
            ))
            .await?;
        Ok(match row {
            Some(row) => row.try_get_by_index::<i64>(0)? >= now_ms(),
            None => false,
        })
    }

    /// Every process's host lease: instance -> until when it runs (ran).
    async fn hosts(&self) -> Result<HashMap<String, i64>, sea_orm::DbErr> {
        let db = self.service.db();
        let backend = db.get_database_backend();
        let rows = db
            .query_all_raw(Statement::from_string(
                backend,
                "SELECT name, until_ms FROM leases WHERE name LIKE 'host:%'",
            ))
            .await?;
        let mut out = HashMap::new();
        for row in rows {
            let name: String = row.try_get_by_index(0)?;
            let until: i64 = row.try_get_by_index(1)?;
            if let Some(instance) = name.strip_prefix("host:") {
                out.insert(instance.to_owned(), until);
            }
        }
        Ok(out)
    }

    /// Drops the host leases of processes gone for an hour (each start of a
    /// process is a new instance).
    async fn forget_old_hosts(&self) {
        let db = self.service.db();
        let backend = db.get_database_backend();
        let sql = "DELETE FROM leases WHERE name LIKE 'host:%' AND until_ms < ?";
        if let Err(error) = db
            .execute_raw(statement(backend, sql, vec![(now_ms() - 3_600_000).into()]))
            .await
        {
            tracing::warn!(%error, "old host leases could not be dropped");
        }
    }

    /// What every process does each tick for the workers whose sessions it
    /// holds: renews its host lease, publishes their loads where they
    /// changed, and carries out the leader's requests to stop them.
    async fn host_duties(self: &Arc<Self>) {
        let now = now_ms();
        let span = self.lease_span_ms();
        if self.host_until_ms.load(Ordering::Relaxed) - now <= span / 2 {
            match self.take_lease(&self.host_lease_name(), now, now + span).await {
                Ok(true) => self.host_until_ms.store(now + span, Ordering::Relaxed),
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "the host lease could not be renewed"),
            }
        }
        self.publish_loads().await;
        if let Err(error) = self.serve_stop_requests().await {
            tracing::warn!(%error, "the leader's requests to stop workers could not be carried out");
        }
    }

    /// Writes each hosted worker's load where it changed since the last
    /// write: the jobs it holds, and since when it has held none.
    async fn publish_loads(&self) {
        let loads: Vec<(String, i32)> = self
            .sessions
            .lock()
            .await
            .iter()
            .filter(|(_, s)| !s.is_closed())
            .map(|(id, s)| (id.clone(), i32::try_from(s.load()).unwrap_or(i32::MAX)))
            .collect();
        let now = now_ms();
        for (id, held) in loads {
            if lock(&self.published).get(&id).is_some_and(|(was, _)| *was == held) {
                continue;
            }
            // Busy, or idle from now on.
            let next = if held == 0 { (0, Some(now)) } else { (held, None) };
            match self
                .service
                .publish_worker_load(&id, &self.config.instance, next.0, next.1)
                .await
            {
                Ok(()) => {
                    lock(&self.published).insert(id, next);
                }
                Err(error) => tracing::warn!(worker_id = %id, %error, "the worker's load could not be published"),
            }
        }
    }

    /// The leader's requests for workers hosted here: `retire` ends one that
    /// holds nothing now (a busy one keeps running, and the request is
    /// withdrawn for the leader to decide again); `drain` stops a worker's
    /// new jobs and ends it once it holds nothing.
    async fn serve_stop_requests(self: &Arc<Self>) -> Result<(), ContainerError> {
        let Some(runtime) = self.runtime.clone() else {
            return Ok(());
        };
        let requests = self.service.stop_requests(&self.config.instance).await?;
        if requests.is_empty() {
            return Ok(());
        }
        let mut containers: HashMap<String, RuntimeContainer> = match runtime.list(&self.own("worker")).await {
            Ok(list) => list
                .into_iter()
                .filter_map(|c| c.labels.get(LABEL_WORKER).cloned().map(|w| (w, c)))
                .collect(),
            Err(_) => return Ok(()), // the engine does not answer: next tick
        };
        for record in requests {
            if lock(&self.stopping).contains(&record.id) {
                continue;
            }
            let retired = self
                .sessions
                .lock()
                .await
                .get(&record.id)
                .filter(|s| !s.is_closed())
                .is_none_or(PolledWorker::retire);
            if retired {
                match containers.remove(&record.id) {
                    Some(container) => self.end(&runtime, &record.id, &container.id, "scaled down").await?,
                    None => {
                        self.service
                            .end_worker(&record.id, now_ms(), "container is gone")
                            .await?;
                        self.forget(&record.id).await;
                    }
                }
            } else if record.stop_request.as_deref() == Some("drain") {
                self.dispatcher.drain(&record.id);
            } else {
                self.service.request_worker_stop(&record.id, None).await?;
            }
        }
        Ok(())
    }

    /// Takes or renews the `fleet` lease (three ticks long, at least 10 s).
    async fn hold_lease(&self) -> bool {
        let now = now_ms();
        let span = self.lease_span_ms();
        // Held for more than half its span still: nobody else can take it
        // before it ends, and a later tick renews it well before then.
        if self.lease_until_ms.load(Ordering::Relaxed) - now > span / 2 {
            return true;
        }
        let until = now + span;
        match self.take_lease("fleet", now, until).await {
            Ok(held) => {
                self.lease_until_ms
                    .store(if held { until } else { 0 }, Ordering::Relaxed);
                held
            }
            Err(error) => {
                tracing::warn!(%error, "the fleet lease could not be taken");
                self.lease_until_ms.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// One look at every endpoint and every container.
    pub async fn reconcile(self: &Arc<Self>) -> Result<(), ContainerError> {
        let Some(runtime) = self.runtime.clone() else {
            return Ok(());
        };
        let containers = match runtime.list(&self.own("worker")).await {
            Ok(list) => {
                *lock(&self.runtime_error) = None;
                lock(&self.outages).answered(now_ms());
                list
            }
            Err(error) => {
                *lock(&self.runtime_error) = Some(format!("the container runtime does not answer: {error}"));
                lock(&self.outages).failed();
                return Ok(());
            }
        };
        let mut by_worker: HashMap<String, RuntimeContainer> = containers
            .into_iter()
            .filter_map(|c| c.labels.get(LABEL_WORKER).cloned().map(|w| (w, c)))
            .collect();
        // Four reads a look, however many endpoints: the endpoints, every
        // open worker, the queue of every endpoint, and every process's host
        // lease.
        let endpoints = self.service.endpoints_to_reconcile().await?;
        let mut workers: HashMap<String, Vec<WorkerRecord>> = HashMap::new();
        let mut known: std::collections::HashSet<String> = std::collections::HashSet::new();
        for worker in self.service.every_open_worker().await? {
            known.insert(worker.id.clone());
            workers.entry(worker.endpoint_id.clone()).or_default().push(worker);
        }
        let queues = queues(self.service.db()).await?;
        let hosts = self.hosts().await?;
        for endpoint in &endpoints {
            let open = workers.remove(&endpoint.id).unwrap_or_default();
            let queue = queues.get(&endpoint.id).copied().unwrap_or((0, Duration::ZERO));
            if open.is_empty() && queue.0 == 0 && endpoint.spec.workers.min == 0 && endpoint.throttled == 0 {
                continue; // idle and empty: nothing to do
            }
            self.reconcile_endpoint(&runtime, endpoint, open, queue, &hosts, &mut by_worker)
                .await?;
        }
        self.reconcile_pods(&runtime).await?;
        // Containers with our labels and no open record: left by a crash
        // between a container's start and its record, or after its end.
        for (worker_id, container) in by_worker {
            if !known.contains(&worker_id) {
                tracing::info!(%worker_id, container = %container.name, "removing a worker container with no record");
                let _ = runtime.remove(&container.id).await;
                self.forget(&worker_id).await;
            }
        }
        Ok(())
    }

    async fn reconcile_endpoint(
        self: &Arc<Self>,
        runtime: &Arc<dyn Runtime>,
        endpoint: &EndpointRecord,
        workers: Vec<WorkerRecord>,
        (outstanding, oldest_wait): (u64, Duration),
        hosts: &HashMap<String, i64>,
        containers: &mut HashMap<String, RuntimeContainer>,
    ) -> Result<(), ContainerError> {
        let mut alive: Vec<WorkerRecord> = Vec::new();
        // Workers whose Pods Kubernetes cannot place yet, and why.
        let mut unplaced: HashMap<String, String> = HashMap::new();
        for worker in workers {
            if lock(&self.stopping).contains(&worker.id) {
                continue; // on its way out
            }
            match containers.get(&worker.id) {
                Some(c) if c.state == ContainerState::Running || c.state == ContainerState::Created => {
                    if let Some(reason) = &c.unschedulable {
                        unplaced.insert(worker.id.clone(), reason.clone());
                    }
                    alive.push(worker);
                }
                Some(c) => {
                    let reason = match (&c.error, c.exit_code) {
                        (Some(error), _) => format!("the container could not run: {error}"),
                        (None, Some(code)) => format!("container exited with status {code}"),
                        (None, None) => format!("container is {:?}", c.state),
                    };
                    self.end(runtime, &worker.id, &c.id, &reason).await?;
                    containers.remove(&worker.id);
                }
                None => {
                    // Its record exists but the container never started
                    // (a failed pull) or was removed behind our back.
                    let reason = worker.reason.clone().unwrap_or_else(|| "container is gone".to_owned());
                    self.service.end_worker(&worker.id, now_ms(), &reason).await?;
                    self.forget(&worker.id).await;
                }
            }
        }
        // A worker whose Pod waits for a node (for GPUs, mostly) is
        // throttled: its wait is not billed, nor counted against its start
        // timeout (below); the scheduler's reason is published for the
        // workers' listing.
        let now_wall = now_ms();
        for worker in &alive {
            let waiting = unplaced.get(&worker.id).map(String::as_str);
            if worker.unschedulable.as_deref() != waiting {
                match waiting {
                    Some(reason) => tracing::info!(worker = %worker.id, %reason, "the worker's Pod waits for a node"),
                    None if !endpoint.deleted => tracing::info!(worker = %worker.id, "the worker's Pod has a node"),
                    None => {}
                }
                self.service.publish_unschedulable(&worker.id, waiting).await?;
            }
            if waiting.is_some() {
                self.service.skip_billing(&worker.id, now_wall).await?;
            }
        }
        // What each live worker is doing: from its session when it calls
        // this process; from what its host published when it calls another
        // live one (`remote`).
        let now = Instant::now();
        let start_timeout_ms = i64::try_from(self.config.start_timeout.as_millis()).unwrap_or(i64::MAX);
        let me = self.config.instance.as_str();
        let mut idle: Vec<Idle> = Vec::new();
        let mut remote: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut busy = 0usize;
        let mut jobs_on_workers = 0u64;
        {
            let sessions = self.sessions.lock().await;
            let mut tracked = lock(&self.tracked);
            for worker in &alive {
                let session = sessions.get(&worker.id).filter(|s| !s.is_closed());
                let stale = worker.version < endpoint.version as i32;
                // When the other process it called last stopped running
                // (or runs until, when it still does).
                let elsewhere = worker
                    .host
                    .as_deref()
                    .filter(|host| *host != me)
                    .map(|host| hosts.get(host).copied().unwrap_or(0));
                let entry = tracked.entry(worker.id.clone()).or_insert_with(|| Tracked {
                    idle_since: Some(now),
                    started: now,
                    seen: false,
                    draining: false,
                });
                entry.seen |= session.is_some() || worker.host.as_deref() == Some(me);
                if unplaced.contains_key(&worker.id) {
                    // Its start timeout runs from when it has a node.
                    entry.started = now;
                }
                if session.is_none()
                    && let Some(until) = elsewhere
                    && until >= now_wall
                {
                    remote.insert(worker.id.clone());
                    let held = u64::try_from(worker.held_jobs).unwrap_or(0);
                    jobs_on_workers += held;
                    match worker.idle_since_ms.filter(|_| held == 0) {
                        Some(since) => idle.push(Idle {
                            id: worker.id.clone(),
                            idle_for: Duration::from_millis(u64::try_from(now_wall - since).unwrap_or(0)),
                            stale,
                            never_seen: false,
                        }),
                        None => busy += 1,
                    }
                    continue;
                }
                let waited = now.duration_since(entry.started) > self.config.start_timeout;
                let never_seen = match elsewhere {
                    // Its process is gone, and it has called no other since.
                    Some(gone) if session.is_none() => waited && now_wall - gone > start_timeout_ms,
                    _ => waited && !entry.seen,
                };
                let held = session.map_or(0, PolledWorker::load);
                jobs_on_workers += held as u64;
                if held > 0 {
                    entry.idle_since = None;
                    busy += 1;
                } else {
                    let since = *entry.idle_since.get_or_insert(now);
                    idle.push(Idle {
                        id: worker.id.clone(),
                        idle_for: now.duration_since(since),
                        stale,
                        never_seen,
                    });
                }
            }
        }
        // Jobs not on a worker yet: queued, or claimed by the scheduler and
        // waiting for a worker's take.
        let queued = outstanding.saturating_sub(jobs_on_workers);
        let oldest_wait = if queued == 0 { Duration::ZERO } else { oldest_wait };
        let spec = &endpoint.spec;
        let current = alive.len() as u64;
        let wanted = if endpoint.deleted {
            0
        } else {
            let want = match spec.scaling {
                Scaling::RequestCount { request_count } => {
                    (queued + busy as u64).div_ceil(u64::from(request_count.max(1)))
                }
                Scaling::QueueDelay { queue_delay } => {
                    if queued == 0 {
                        busy as u64
                    } else if current == 0 || oldest_wait.as_secs_f64() >= queue_delay {
                        // Jobs wait: one more worker per queued job beyond
                        // the ones already there, so a burst is met at once.
                        current.max(busy as u64 + queued)
                    } else {
                        current
                    }
                }
            };
            want.clamp(u64::from(spec.workers.min), u64::from(spec.workers.max))
        };
        // Stale idle workers go first (a rollout), then the longest idle
        // past the idle timeout, down to what is wanted. A worker that never
        // called in within the start timeout is replaced.
        let idle_timeout = Duration::from_secs(u64::from(spec.workers.idle_timeout.unwrap_or(5)));
        let mut removable: Vec<String> = Vec::new();
        let mut keep = current;
        idle.sort_by(|a, b| b.stale.cmp(&a.stale).then(b.idle_for.cmp(&a.idle_for)));
        for worker in &idle {
            if worker.stale
                || worker.never_seen
                || endpoint.deleted
                || (keep > wanted && worker.idle_for >= idle_timeout)
            {
                removable.push(worker.id.clone());
                keep -= 1;
            }
        }
        // A worker goes only once drained while it holds nothing: a job
        // assigned since the look above keeps it for another pass, so scaling
        // down never takes a job from a worker (and never uses up an attempt).
        // That step is its host's: a worker hosted by another process is
        // asked for there (drained when it goes for good, so that it
        // finishes what it holds).
        {
            let sessions = self.sessions.lock().await;
            removable.retain(|id| {
                remote.contains(id)
                    || sessions
                        .get(id)
                        .filter(|s| !s.is_closed())
                        .is_none_or(PolledWorker::retire)
            });
        }
        for id in &removable {
            if remote.contains(id) {
                continue;
            }
            if let Some(container) = containers.remove(id) {
                self.end(runtime, id, &container.id, "scaled down").await?;
            }
        }
        for worker in alive.iter().filter(|w| remote.contains(&w.id)) {
            let outdated = worker.version < endpoint.version as i32 || endpoint.deleted;
            let request = if outdated {
                Some("drain")
            } else if removable.contains(&worker.id) {
                Some("retire")
            } else {
                None
            };
            // A retire asked for at an earlier look is withdrawn once the
            // worker is wanted again.
            if worker.stop_request.as_deref() != request {
                self.service.request_worker_stop(&worker.id, request).await?;
            }
        }
        // Busy stale workers take no new jobs; they go once idle.
        for worker in alive.iter().filter(|w| !remote.contains(&w.id)) {
            if worker.version < endpoint.version as i32 || endpoint.deleted {
                let mut tracked = lock(&self.tracked);
                if let Some(t) = tracked.get_mut(&worker.id)
                    && !t.draining
                {
                    t.draining = true;
                    drop(tracked);
                    self.dispatcher.drain(&worker.id);
                }
            }
        }
        let fresh = alive
            .iter()
            .filter(|w| !removable.contains(&w.id) && w.version == endpoint.version as i32)
            .count() as u64;
        // Workers wanted and not started for want of GPUs: `throttled`,
        // published for every process's listing of the workers.
        let mut throttled: Option<(u64, String)> = None;
        if !endpoint.deleted && fresh < wanted {
            let backing_off = lock(&self.backoff)
                .get(&endpoint.id)
                .is_some_and(|at| at.elapsed() < Duration::from_secs(30));
            if !backing_off {
                for started in fresh..wanted {
                    match self.start_worker(runtime, endpoint).await? {
                        Start::Started => {}
                        Start::Failed => break,
                        Start::NoGpus(reason) => {
                            throttled = Some((wanted - started, reason));
                            break;
                        }
                    }
                }
            } else if endpoint.throttled > 0 {
                // A start failed lately: what was short of GPUs still is.
                throttled = Some((
                    (wanted - fresh).min(u64::from(endpoint.throttled)),
                    endpoint.throttled_reason.clone().unwrap_or_default(),
                ));
            }
        }
        let (count, reason) = match &throttled {
            Some((count, reason)) => (u32::try_from(*count).unwrap_or(u32::MAX), Some(reason.as_str())),
            None => (0, None),
        };
        if count != endpoint.throttled || reason != endpoint.throttled_reason.as_deref() {
            match reason {
                Some(reason) => {
                    tracing::warn!(endpoint = %endpoint.id, throttled = count, %reason, "workers wait for GPUs");
                }
                None => tracing::info!(endpoint = %endpoint.id, "no worker waits for GPUs"),
            }
            self.service.publish_throttled(&endpoint.id, count, reason).await?;
        }
        Ok(())
    }

    /// Starts one worker of the endpoint's current version, unless the GPUs
    /// it needs are not free (nothing is recorded or billed then) or it
    /// cannot start (the reason is on the worker's record and in its logs).
    async fn start_worker(
        &self,
        runtime: &Arc<dyn Runtime>,
        endpoint: &EndpointRecord,
    ) -> Result<Start, ContainerError> {
        let spec = &endpoint.spec;
        let worker_id = new_id("wk_");
        let (gpu_count, hourly, memory_gb, vcpus) = self.compute_of(endpoint);
        // Its GPUs first: a worker that cannot have them is not started (nor
        // billed), and the next look tries again.
        let gpus = match self.grant_gpus(runtime, gpu_count).await? {
            crate::gpus::Grant::ByCount => None,
            crate::gpus::Grant::Devices(held) => Some(held),
            crate::gpus::Grant::Wait(reason) | crate::gpus::Grant::Never(reason) => {
                return Ok(Start::NoGpus(reason));
            }
        };
        let now = now_ms();
        self.service
            .add_worker(WorkerRecord {
                id: worker_id.clone(),
                endpoint_id: endpoint.id.clone(),
                user_id: endpoint.user_id.clone(),
                version: endpoint.version as i32,
                image: spec.container.image.clone(),
                gpu_count: gpu_count as i32,
                hourly_micro_usd: hourly,
                created_at_ms: now,
                billed_until_ms: now,
                ended_at_ms: None,
                reason: None,
                host: None,
                seen_at_ms: None,
                held_jobs: 0,
                idle_since_ms: None,
                stop_request: None,
                unschedulable: None,
            })
            .await?;
        lock(&self.tracked).insert(
            worker_id.clone(),
            Tracked {
                idle_since: Some(Instant::now()),
                started: Instant::now(),
                seen: false,
                draining: false,
            },
        );
        let auth = match &spec.container.registry {
            Some(id) => match self.service.credentials(&endpoint.user_id, id).await {
                Ok((username, password)) => Some(RegistryAuth {
                    username,
                    password,
                    server: registry_host(&spec.container.image),
                }),
                Err(error) => {
                    self.fail_start(&endpoint.id, &worker_id, &format!("registry credential {id}: {error}"))
                        .await?;
                    return Ok(Start::Failed);
                }
            },
            None => None,
        };
        if let Err(error) = runtime.ensure_image(&spec.container.image, auth.as_ref()).await {
            self.fail_start(
                &endpoint.id,
                &worker_id,
                &format!("image {} could not be pulled: {error}", spec.container.image),
            )
            .await?;
            return Ok(Start::Failed);
        }
        let mut container = self.container_spec(endpoint, &worker_id, gpu_count, memory_gb, vcpus);
        if let Some(held) = &gpus {
            container.gpu_devices = held.devices.clone();
            container
                .labels
                .insert(crate::gpus::LABEL_GPUS.to_owned(), held.devices.join(","));
        }
        if let Some(volume) = spec.network_volumes.first()
            && let Some(size) = self.service.volume_size_gb(volume).await?
        {
            container.volume_sizes_gb.insert(network_volume_name(volume), size);
        }
        match runtime.run(&container).await {
            Ok(id) => {
                tracing::info!(endpoint = %endpoint.id, %worker_id, container = %id, "worker started");
                Ok(Start::Started)
            }
            Err(error) => {
                self.fail_start(
                    &endpoint.id,
                    &worker_id,
                    &format!("the container could not start: {error}"),
                )
                .await?;
                Ok(Start::Failed)
            }
        }
    }

    async fn fail_start(&self, endpoint_id: &str, worker_id: &str, reason: &str) -> Result<(), ContainerError> {
        tracing::warn!(%endpoint_id, %worker_id, %reason, "worker did not start");
        lock(&self.backoff).insert(endpoint_id.to_owned(), Instant::now());
        self.service.end_worker(worker_id, now_ms(), reason).await?;
        lock(&self.tracked).remove(worker_id);
        Ok(())
    }

    /// Stops and removes a worker's container, ends its record (billing
    /// stops there), and closes its session: a job it still held is
    /// requeued by the dispatcher.
    async fn end(
        self: &Arc<Self>,
        runtime: &Arc<dyn Runtime>,
        worker_id: &str,
        container: &str,
        reason: &str,
    ) -> Result<(), ContainerError> {
        if !lock(&self.stopping).insert(worker_id.to_owned()) {
            return Ok(());
        }
        self.dispatcher.drain(worker_id);
        let (fleet, runtime) = (Arc::clone(self), Arc::clone(runtime));
        let (worker_id, container, reason) = (worker_id.to_owned(), container.to_owned(), reason.to_owned());
        tokio::spawn(async move {
            let _ = runtime.stop(&container, fleet.config.stop_grace).await;
            if let Err(error) = runtime.remove(&container).await {
                tracing::warn!(%worker_id, %error, "worker container could not be removed");
            }
            // Billed up to here: the container is gone.
            if let Err(error) = fleet.service.end_worker(&worker_id, now_ms(), &reason).await {
                tracing::warn!(%worker_id, %error, "the worker's end could not be recorded; the next look ends it");
            }
            fleet.forget(&worker_id).await;
            lock(&fleet.stopping).remove(&worker_id);
            tracing::info!(%worker_id, %reason, "worker removed");
        });
        Ok(())
    }

    /// Whether a container that stopped at `at_ms` stopped while the runtime
    /// did not answer this process (an engine restarted under it stops its
    /// containers; the looks either side saw it answer).
    pub(crate) fn stopped_in_outage(&self, at_ms: i64) -> bool {
        lock(&self.outages)
            .ended
            .iter()
            .any(|(from, to)| (*from - crate::pod_fleet::OUTAGE_MARGIN_MS..=*to).contains(&at_ms))
    }

    async fn forget(&self, worker_id: &str) {
        let session = self.sessions.lock().await.remove(worker_id);
        if let Some(session) = session {
            session.close().await;
        }
        lock(&self.tracked).remove(worker_id);
        lock(&self.published).remove(worker_id);
    }

    /// GPUs per worker, the hourly price, memory (GB) and vCPUs.
    fn compute_of(&self, endpoint: &EndpointRecord) -> (u32, i64, u32, u32) {
        let spec = &endpoint.spec;
        if let Some(gpu) = &spec.gpu {
            let price = self
                .config
                .gpus
                .iter()
                .filter(|g| gpu.pools.iter().any(|p| g.pool.as_deref() == Some(p.as_str())))
                .filter(|g| !gpu.excluded_types.contains(&g.id))
                .map(|g| g.price.serverless.unwrap_or(g.price.secure))
                .fold(f64::INFINITY, f64::min);
            let hourly = if price.is_finite() {
                price * f64::from(gpu.count)
            } else {
                0.0
            };
            return (gpu.count, usd_to_micro(hourly), 0, 0);
        }
        let cpu = spec.cpu.as_ref().and_then(|list| list.first());
        match cpu {
            Some(cpu) => {
                let per_vcpu = self
                    .config
                    .cpus
                    .iter()
                    .find(|c| c.id == cpu.id)
                    .map_or(0.0, |c| c.price.serverless_per_vcpu);
                (
                    0,
                    usd_to_micro(per_vcpu * f64::from(cpu.vcpu_count)),
                    cpu.memory,
                    cpu.vcpu_count,
                )
            }
            None => (0, 0, 0, 0),
        }
    }

    /// The container of one worker: the endpoint's image, args and env,
    /// plus what the RunPod SDK reads to find this process.
    pub fn container_spec(
        &self,
        endpoint: &EndpointRecord,
        worker_id: &str,
        gpu_count: u32,
        memory_gb: u32,
        vcpus: u32,
    ) -> ContainerSpec {
        let spec = &endpoint.spec;
        let base = lock(&self.base_url).trim_end_matches('/').to_owned();
        let base = base.as_str();
        let ep = &endpoint.id;
        let gpu = if gpu_count > 0 { "gpu" } else { "cpu" };
        let mut env: Vec<(String, String)> = spec.container.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (name, value) in self.protocol_env(ep, worker_id, base, gpu) {
            env.retain(|(k, _)| k != &name);
            env.push((name, value));
        }
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_KIND.to_owned(), "worker".to_owned());
        labels.insert(LABEL_INSTALLATION.to_owned(), self.installation.clone());
        labels.insert(LABEL_ID.to_owned(), endpoint.id.clone());
        labels.insert(LABEL_OWNER.to_owned(), endpoint.user_id.clone());
        labels.insert(LABEL_WORKER.to_owned(), worker_id.to_owned());
        labels.insert(LABEL_VERSION.to_owned(), endpoint.version.to_string());
        let args = split_args(&spec.container.args).unwrap_or_default();
        ContainerSpec {
            name: container_name(worker_id),
            image: spec.container.image.clone(),
            cmd: (!args.is_empty()).then_some(args),
            env,
            labels,
            network: if self.config.host_network {
                Network::Host
            } else {
                Network::Bridge {
                    extra_hosts: vec!["host.docker.internal:host-gateway".to_owned()],
                }
            },
            ports: Vec::new(),
            memory_bytes: (memory_gb > 0).then(|| u64::from(memory_gb) << 30),
            nano_cpus: (vcpus > 0).then(|| u64::from(vcpus) * 1_000_000_000),
            gpus: gpu_count,
            gpu_devices: Vec::new(),
            // The endpoint's network volume, where RunPod workers find it.
            binds: spec
                .network_volumes
                .first()
                .map(|id| format!("{}:{WORKER_VOLUME_PATH}", network_volume_name(id)))
                .into_iter()
                .collect(),
            stop_timeout_secs: Some(u32::try_from(self.config.stop_grace.as_secs()).unwrap_or(10)),
            auto_remove: false,
            tty: false,
            placement: self.placement_of(endpoint),
            hostname: None,
            volume_sizes_gb: BTreeMap::new(),
        }
    }

    /// Where an endpoint's workers may run: a GPU type of its pools (less the excluded ones), one
    /// of its data centers, the CUDA versions it allows (runtimes that place containers on
    /// machines apply it: Kubernetes).
    pub fn placement_of(&self, endpoint: &EndpointRecord) -> Placement {
        let spec = &endpoint.spec;
        let mut placement = Placement {
            data_centers: spec.data_center_ids.clone(),
            ..Placement::default()
        };
        if let Some(gpu) = &spec.gpu {
            placement.gpu_types = self
                .config
                .gpus
                .iter()
                .filter(|g| gpu.pools.iter().any(|p| g.pool.as_deref() == Some(p.as_str())))
                .filter(|g| !gpu.excluded_types.contains(&g.id))
                .map(|g| g.id.clone())
                .collect();
            placement.cuda_versions = gpu.allowed_cuda_versions.clone();
            placement.min_cuda_version = gpu.min_cuda_version.clone();
        }
        placement
    }

    /// The environment of the RunPod worker protocol (runpod-python reads it).
    pub fn protocol_env(&self, endpoint_id: &str, worker_id: &str, base: &str, gpu: &str) -> Vec<(String, String)> {
        worker_env(
            &self.config.token_secret,
            endpoint_id,
            worker_id,
            base,
            gpu,
            self.config.ping_interval,
        )
    }
}

/// The token worker `worker_id` of `endpoint_id` authenticates with: an
/// HMAC of both under `secret`, so only that worker of that endpoint can use it.
pub fn worker_token(secret: &[u8], endpoint_id: &str, worker_id: &str) -> String {
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"gantry worker token v1\0");
    mac.update(endpoint_id.as_bytes());
    mac.update(b"\0");
    mac.update(worker_id.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("gw_{hex}")
}

/// The environment of the RunPod worker protocol for worker `worker_id` of
/// `endpoint_id`, reaching Gantry's public listener at `base`; `gpu` is
/// `gpu` or `cpu` (runpod-python reads all of it).
pub fn worker_env(
    secret: &[u8],
    endpoint_id: &str,
    worker_id: &str,
    base: &str,
    gpu: &str,
    ping_interval: Duration,
) -> Vec<(String, String)> {
    let root = format!("{}/v2/{endpoint_id}", base.trim_end_matches('/'));
    vec![
        (
            "RUNPOD_WEBHOOK_GET_JOB".into(),
            format!("{root}/job-take/$ID?gpu={gpu}"),
        ),
        (
            "RUNPOD_WEBHOOK_POST_OUTPUT".into(),
            format!("{root}/job-done/$RUNPOD_POD_ID/$ID?gpu={gpu}"),
        ),
        (
            "RUNPOD_WEBHOOK_POST_STREAM".into(),
            format!("{root}/job-stream/$RUNPOD_POD_ID/$ID?gpu={gpu}"),
        ),
        (
            "RUNPOD_WEBHOOK_PING".into(),
            format!("{root}/ping/$RUNPOD_POD_ID?gpu={gpu}"),
        ),
        ("RUNPOD_POD_ID".into(), worker_id.to_owned()),
        ("RUNPOD_POD_HOSTNAME".into(), worker_id.to_owned()),
        ("RUNPOD_ENDPOINT_ID".into(), endpoint_id.to_owned()),
        ("RUNPOD_AI_API_KEY".into(), worker_token(secret, endpoint_id, worker_id)),
        ("RUNPOD_PING_INTERVAL".into(), ping_interval.as_millis().to_string()),
        // The SDK's fitness checks dial 8.8.8.8 and need 4 GB of memory.
        ("RUNPOD_SKIP_AUTO_SYSTEM_CHECKS".into(), "true".into()),
        ("RUNPOD_SKIP_GPU_CHECK".into(), (gpu == "cpu").to_string()),
    ]
}

/// The name of a worker's container.
pub fn container_name(worker_id: &str) -> String {
    format!("gantry-{}", worker_id.replace('_', "-"))
}

/// The registry host of an image reference (Docker Hub's when none is named).
pub fn registry_host(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first.to_owned(),
        _ => "https://index.docker.io/v1/".to_owned(),
    }
}

fn usd_to_micro(usd: f64) -> i64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).round() as i64
    } else {
        0
    }
}

/// Per endpoint with any: its jobs queued or running, and how long the
/// oldest has been there.
async fn queues(db: &sea_orm::DatabaseConnection) -> Result<HashMap<String, (u64, Duration)>, ContainerError> {
    let backend = db.get_database_backend();
    let rows = db
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT model, COUNT(*), MIN(queued_at_ms) FROM jobs \
             WHERE status IN ('IN_QUEUE', 'IN_PROGRESS') AND substr(model, 1, 3) = 'ep_' GROUP BY model",
        ))
        .await?;
    let now = now_ms();
    let mut out = HashMap::new();
    for row in rows {
        let model: String = row.try_get_by_index(0)?;
        let count: i64 = row.try_get_by_index(1)?;
        let oldest: Option<i64> = row.try_get_by_index(2)?;
        let waited = oldest.map_or(0, |at| (now - at).max(0));
        out.insert(
            model,
            (
                u64::try_from(count).unwrap_or(0),
                Duration::from_millis(u64::try_from(waited).unwrap_or(0)),
            ),
        );
    }
    Ok(out)
}

/// Three placeholders of the backend's kind.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
