//! The distributed deployment as real processes: `gantry api`, `gantry scheduler`
//! and `gantry worker` children of this test, sharing one fresh PostgreSQL
//! database, killed (SIGKILL) or stopped (SIGTERM) the way an operator or a
//! crash would. What is asserted is what must survive that: every job runs to
//! COMPLETED and is charged exactly once.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gantry_testkit::{PgDatabase, RedisServer};
use reqwest::Client;
use sea_orm::{ConnectionTrait, Database, DbBackend, QueryResult, Statement};
use serde_json::{Value, json};

use crate::harness::{Backend, SseReader};
use crate::live::{block_chunk_writes, expect_chunks_before_they_are_stored, late_and_resuming_readers_agree};

/// The bound of every wait in this module.
const WAIT: Duration = Duration::from_secs(30);
/// Shared by the schedulers and the workers of a test.
const WORKER_SECRET: &str = "processes-test-worker-secret-0123456789";

type Log = Arc<Mutex<Vec<String>>>;

/// One `gantry` child process. Its stderr (the log) is drained by a thread into
/// memory, so the child never blocks on a full pipe; it is killed on drop.
pub(crate) struct Proc {
    name: String,
    child: Child,
    log: Log,
}

impl Proc {
    pub(crate) fn spawn(name: &str, mut command: Command) -> Proc {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let log: Log = Arc::default();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).trim_end().to_string();
                        sink.lock().unwrap().push(text);
                    }
                }
            }
        });
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the log, for failure messages.
    fn tail(&self) -> String {
        let log = self.log.lock().unwrap();
        let from = log.len().saturating_sub(25);
        format!(
            "--- {} (pid {}) ---\n{}\n",
            self.name,
            self.pid(),
            log[from..].join("\n")
        )
    }

    /// Waits for a log line containing `needle`; fails if the process exits first.
    pub(crate) async fn wait_for_log(&mut self, needle: &str) -> String {
        let started = Instant::now();
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Give the drain thread a moment to collect the last lines.
                tokio::time::sleep(Duration::from_millis(100)).await;
                panic!(
                    "{} exited ({status}) before logging {needle:?}\n{}",
                    self.name,
                    self.tail()
                );
            }
            assert!(
                started.elapsed() < WAIT,
                "{} did not log {needle:?} within {WAIT:?}\n{}",
                self.name,
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every line logged so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL: the process dies at once, without any cleanup of its own.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap the killed process");
    }

    /// SIGTERM: the graceful stop.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
    }

    pub(crate) async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                started.elapsed() < within,
                "{} did not exit within {within:?}\n{}",
                self.name,
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Proc {
    /// SIGTERM, then a graceful exit (status 0) within [`WAIT`].
    pub(crate) async fn stop(&mut self) {
        self.terminate();
        let status = self.wait_exit(WAIT).await;
        assert!(status.success(), "{} exited with {status}\n{}", self.name, self.tail());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The value of `key=` in a tracing log line.
pub(crate) fn log_field(line: &str, key: &str) -> String {
    let needle = format!(" {key}=");
    let at = line
        .find(&needle)
        .unwrap_or_else(|| panic!("no {key}= in log line {line:?}"));
    line[at + needle.len()..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A `gantry api` process: the management API and the public endpoints.
struct Api {
    proc: Proc,
    /// `http://host:port` of the public endpoints.
    public: String,
}

/// A `gantry scheduler` process.
struct Sched {
    proc: Proc,
    /// The gRPC URL workers dial.
    url: String,
}

/// One deployment: a fresh database and the settings all its processes share.
struct Cluster {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    client: Client,
    /// Every process started, for failure messages.
    logs: Mutex<Vec<(String, Log)>>,
    db: PgDatabase,
}

impl Cluster {
    /// `env`: extra `GANTRY_*` settings for every process of this deployment.
    async fn new(env: &[(&str, &str)]) -> Cluster {
        let db = PgDatabase::create().await;
        let mut all = vec![
            ("GANTRY_DATABASE_URL".to_string(), db.url.clone()),
            ("GANTRY_SCHEDULER__WORKER_SECRET".into(), WORKER_SECRET.into()),
            ("GANTRY_MANAGEMENT_ADDR".into(), "127.0.0.1:0".into()),
            ("GANTRY_PUBLIC_ADDR".into(), "127.0.0.1:0".into()),
            ("GANTRY_SCHEDULER__ADDR".into(), "127.0.0.1:0".into()),
            ("GANTRY_HTTP__WORKERS".into(), "1".into()),
            // Several processes per test, tests in parallel: stay well under max_connections.
            ("GANTRY_DATABASE_MAX_CONNECTIONS".into(), "4".into()),
            ("GANTRY_LOG".into(), "info".into()),
            // The text model has its own tests; these are about the job path.
            ("GANTRY_SCHEDULER__BUNDLED_WORKERS".into(), "[gantry-echo]".into()),
        ];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Cluster {
            dir: tempfile::tempdir().expect("temp dir"),
            env: all,
            client: crate::harness::http_client(Duration::from_secs(40)),
            logs: Mutex::default(),
            db,
        }
    }

    /// The `gantry` binary with this deployment's settings and nothing inherited.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command.args(args).current_dir(self.dir.path());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("GANTRY_") {
                command.env_remove(key);
            }
        }
        command
            .env_remove("RUST_LOG")
            .env("GANTRY_DATA_DIR", self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Runs a CLI command to completion; returns its stdout.
    fn cli(&self, args: &[&str]) -> String {
        let output = self.command(args).stdin(Stdio::null()).output().expect("run gantry");
        assert!(
            output.status.success(),
            "gantry {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8 stdout")
    }

    /// A user (exempt from rate limits: the tests poll a lot) with credit and an `endpoints:run` key,
    /// made with the CLI. This also applies the migrations, before any server starts.
    fn user_key(&self) -> String {
        let email = format!("procs{}@example.test", crate::harness::unique());
        self.cli(&["users", "create", &email]);
        self.cli(&["users", "set-limits", &email, "--exempt"]);
        // Credit is required (the default): enough for every test's jobs.
        self.cli(&["users", "add-credit", &email, "100"]);
        let key = self.cli(&["keys", "create", "--user", &email, "--scopes", "endpoints:run"]);
        let key = key.trim().to_string();
        assert!(key.starts_with("gk_"), "a key on stdout: {key:?}");
        key
    }

    fn spawn(&self, name: &str, args: &[&str], extra_env: &[(&str, &str)]) -> Proc {
        let mut command = self.command(args);
        command.envs(extra_env.iter().copied());
        let proc = Proc::spawn(name, command);
        self.logs
            .lock()
            .unwrap()
            .push((format!("{name} (pid {})", proc.pid()), Arc::clone(&proc.log)));
        proc
    }

    /// Starts `gantry api` (ready once [`Cluster::ready_api`] returns).
    fn api(&self, name: &str) -> Proc {
        self.spawn(name, &["api"], &[])
    }

    async fn ready_api(mut proc: Proc) -> Api {
        let line = proc.wait_for_log("gantry api is serving").await;
        let public = format!("http://{}", log_field(&line, "public"));
        Api { proc, public }
    }

    fn scheduler(&self, name: &str) -> Proc {
        self.spawn(name, &["scheduler"], &[])
    }

    async fn ready_scheduler(mut proc: Proc) -> Sched {
        let line = proc.wait_for_log("scheduler is listening for workers").await;
        let url = format!("http://{}", log_field(&line, "scheduler"));
        Sched { proc, url }
    }

    fn worker(&self, id: &str, scheduler: &Sched, slots: u32) -> Proc {
        self.worker_with(id, scheduler, slots, &[])
    }

    fn worker_with(&self, id: &str, scheduler: &Sched, slots: u32, env: &[(&str, &str)]) -> Proc {
        let slots = slots.to_string();
        let args = [
            "worker",
            "--model",
            "gantry-echo",
            "--scheduler",
            scheduler.url.as_str(),
            "--slots",
            slots.as_str(),
            "--id",
            id,
        ];
        self.spawn(id, &args, env)
    }

    /// The last lines of every process's log.
    fn logs(&self) -> String {
        let logs = self.logs.lock().unwrap();
        let mut out = String::new();
        for (name, log) in logs.iter() {
            let log = log.lock().unwrap();
            let from = log.len().saturating_sub(15);
            out.push_str(&format!("--- {name} ---\n{}\n", log[from..].join("\n")));
        }
        out
    }

    async fn submit(&self, api: &Api, endpoint: &str, key: &str, input: Value) -> Value {
        let response = self
            .client
            .post(format!("{}/v2/gantry-echo/{endpoint}", api.public))
            .bearer_auth(key)
            .json(&json!({ "input": input }))
            .send()
            .await
            .expect("submit");
        assert_eq!(response.status(), 200, "{endpoint} through {}", api.proc.name);
        response.json().await.expect("a JSON job")
    }

    async fn status(&self, api: &Api, key: &str, id: &str) -> Value {
        let response = self
            .client
            .get(format!("{}/v2/gantry-echo/status/{id}", api.public))
            .bearer_auth(key)
            .send()
            .await
            .expect("status");
        assert_eq!(response.status(), 200, "status of {id} through {}", api.proc.name);
        response.json().await.expect("a JSON job")
    }

    /// Polls (through `api`) until every job is final; returns the final views by id.
    async fn until_final(&self, api: &Api, key: &str, ids: &[String], within: Duration) -> HashMap<String, Value> {
        let started = Instant::now();
        let mut done = HashMap::new();
        loop {
            for id in ids
                .iter()
                .filter(|id| !done.contains_key(*id))
                .cloned()
                .collect::<Vec<_>>()
            {
                let job = self.status(api, key, &id).await;
                if !["IN_QUEUE", "IN_PROGRESS"].contains(&job["status"].as_str().unwrap_or_default()) {
                    done.insert(id, job);
                }
            }
            if done.len() == ids.len() {
                return done;
            }
            assert!(
                started.elapsed() < within,
                "{} of {} jobs not final within {within:?}\n{}",
                ids.len() - done.len(),
                ids.len(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls until `check` accepts the job's view; returns it.
    async fn until_status(&self, api: &Api, key: &str, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let job = self.status(api, key, id).await;
            if check(&job) {
                return job;
            }
            assert!(
                started.elapsed() < WAIT,
                "job {id} never got {what} within {WAIT:?}: {job}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn query(&self, sql: &str) -> Vec<QueryResult> {
        let db = Database::connect(&self.db.url).await.expect("connect");
        let rows = db
            .query_all_raw(Statement::from_string(DbBackend::Postgres, sql))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        db.close().await.ok();
        rows
    }

    /// Every job row: id -> (status, worker_id, attempt, cost_micro_usd).
    async fn jobs(&self) -> BTreeMap<String, JobRow> {
        self.query("SELECT id, status, worker_id, attempt, cost_micro_usd FROM jobs")
            .await
            .into_iter()
            .map(|row| {
                let id: String = row.try_get("", "id").expect("id");
                let job = JobRow {
                    status: row.try_get("", "status").expect("status"),
                    worker_id: row.try_get("", "worker_id").expect("worker_id"),
                    attempt: row.try_get("", "attempt").expect("attempt"),
                    cost: row.try_get("", "cost_micro_usd").expect("cost_micro_usd"),
                };
                (id, job)
            })
            .collect()
    }

    /// Every ledger entry as (job_id, amount_micro_usd).
    async fn ledger(&self) -> Vec<(String, i64)> {
        self.query("SELECT job_id, amount_micro_usd FROM ledger_entries")
            .await
            .into_iter()
            .map(|row| {
                (
                    row.try_get("", "job_id").expect("job_id"),
                    row.try_get("", "amount_micro_usd").expect("amount"),
                )
            })
            .collect()
    }

    /// The database says: exactly these jobs exist, each COMPLETED, each with exactly
    /// one ledger entry of the job's own cost, nothing else is charged, and every
    /// balance was debited exactly its charges.
    async fn assert_each_completed_and_charged_once(&self, ids: &[String]) -> BTreeMap<String, JobRow> {
        let jobs = self.jobs().await;
        let ledger = self.ledger().await;
        let expected: BTreeSet<&String> = ids.iter().collect();
        let stored: BTreeSet<&String> = jobs.keys().collect();
        assert_eq!(stored, expected, "the jobs table holds exactly the submitted jobs");
        for (id, job) in &jobs {
            assert_eq!(job.status, "COMPLETED", "job {id}: {job:?}");
        }
        assert_eq!(ledger.len(), ids.len(), "one ledger entry per job: {ledger:?}");
        let mut charged: HashMap<&str, usize> = HashMap::new();
        for (job_id, amount) in &ledger {
            *charged.entry(job_id.as_str()).or_default() += 1;
            let job = jobs
                .get(job_id)
                .unwrap_or_else(|| panic!("a charge for an unknown job {job_id}"));
            assert_eq!(job.cost, Some(*amount), "job {job_id} costs what it was charged");
            assert!(*amount > 0, "gantry-echo is not free: {amount}");
        }
        for id in ids {
            assert_eq!(charged.get(id.as_str()), Some(&1), "job {id} charged exactly once");
        }
        // Every balance is its credit entries minus its charges: each charge
        // was debited once, whatever crashed or was retried.
        let balances = self
            .query(
                "SELECT a.user_id, a.balance_micro_usd, \
                 CAST((SELECT COALESCE(SUM(c.amount_micro_usd), 0) FROM credit_entries c WHERE c.user_id = a.user_id) AS BIGINT) AS credited, \
                 CAST((SELECT COALESCE(SUM(l.amount_micro_usd), 0) FROM ledger_entries l WHERE l.user_id = a.user_id) AS BIGINT) AS charged \
                 FROM credit_accounts a",
            )
            .await;
        assert!(!balances.is_empty(), "the test users have credit");
        for row in balances {
            let balance: i64 = row.try_get("", "balance_micro_usd").expect("balance");
            let credited: i64 = row.try_get("", "credited").expect("credited");
            let charged: i64 = row.try_get("", "charged").expect("charged");
            assert_eq!(balance, credited - charged, "balance = credit entries - charges");
        }
        jobs
    }
}

#[derive(Debug)]
struct JobRow {
    status: String,
    worker_id: Option<String>,
    attempt: i32,
    cost: Option<i64>,
}

fn id_of(job: &Value) -> String {
    job["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a job id: {job}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_two_apis_run_every_job_exactly_once() {
    const N: usize = 60;
    let cluster = Cluster::new(&[("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100")]).await;
    let key = cluster.user_key();
    // Start all four servers at once, then wait for each.
    let (api1, api2) = (cluster.api("api-1"), cluster.api("api-2"));
    let (s1, s2) = (cluster.scheduler("scheduler-1"), cluster.scheduler("scheduler-2"));
    let apis = [Cluster::ready_api(api1).await, Cluster::ready_api(api2).await];
    let s1 = Cluster::ready_scheduler(s1).await;
    let s2 = Cluster::ready_scheduler(s2).await;
    assert_ne!(s1.url, s2.url, "two scheduler listeners");
    let mut workers = [cluster.worker("worker-a", &s1, 2), cluster.worker("worker-b", &s2, 2)];
    for worker in &mut workers {
        worker.wait_for_log("connected to the scheduler").await;
    }

    // Jobs alternate between the two API processes; none of them runs a scheduler.
    let mut ids = Vec::new();
    for n in 0..N {
        let queued = cluster
            .submit(&apis[n % 2], "run", &key, json!({ "n": n, "sleep_ms": 50 }))
            .await;
        assert_eq!(queued["status"], "IN_QUEUE", "{queued}");
        ids.push(id_of(&queued));
    }
    // A synchronous job answered by API 1, run by a scheduler of another process.
    let sync = cluster
        .submit(&apis[0], "runsync?wait=30000", &key, json!({ "n": "sync" }))
        .await;
    assert_eq!(sync["status"], "COMPLETED", "runsync answered with the result: {sync}");
    assert_eq!(sync["output"]["n"], "sync", "{sync}");
    assert!(sync["output"]["cost"].as_f64().is_some_and(|c| c > 0.0), "{sync}");
    let sync_worker = sync["workerId"].as_str().unwrap_or_default();
    assert!(
        ["worker-a", "worker-b"].contains(&sync_worker),
        "run by one of the worker processes: {sync}"
    );

    // Every job is visible, and final, through the API it was NOT submitted to.
    let mut finals = HashMap::new();
    for (parity, api) in apis.iter().enumerate() {
        let mine: Vec<String> = ids.iter().skip(1 - parity).step_by(2).cloned().collect();
        finals.extend(cluster.until_final(api, &key, &mine, WAIT).await);
    }
    for (n, id) in ids.iter().enumerate() {
        let job = &finals[id];
        assert_eq!(job["status"], "COMPLETED", "{job}\n{}", cluster.logs());
        assert_eq!(job["output"]["n"], n, "job {id} has its own output: {job}");
    }

    let mut all = ids.clone();
    all.push(id_of(&sync));
    let rows = cluster.assert_each_completed_and_charged_once(&all).await;
    for (id, row) in &rows {
        assert_eq!(row.attempt, 1, "job {id} was dispatched exactly once: {row:?}");
    }
    let used: BTreeSet<&str> = rows.values().filter_map(|r| r.worker_id.as_deref()).collect();
    assert_eq!(
        used,
        BTreeSet::from(["worker-a", "worker-b"]),
        "jobs ran through both schedulers (each worker dials one)\n{}",
        cluster.logs()
    );
    for worker in ["worker-a", "worker-b"] {
        let count = rows.values().filter(|r| r.worker_id.as_deref() == Some(worker)).count();
        eprintln!("{worker} ran {count} of {} jobs", all.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_job_loses_nothing_and_charges_once() {
    let cluster = Cluster::new(&[
        ("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100"),
        ("GANTRY_SCHEDULER__HEARTBEAT_INTERVAL_MS", "250"),
    ])
    .await;
    let key = cluster.user_key();
    let (api, sched) = (cluster.api("api"), cluster.scheduler("scheduler"));
    let api = Cluster::ready_api(api).await;
    let sched = Cluster::ready_scheduler(sched).await;
    let mut workers: HashMap<String, Proc> = HashMap::new();
    for id in ["worker-a", "worker-b"] {
        let mut worker = cluster.worker(id, &sched, 1);
        worker.wait_for_log("connected to the scheduler").await;
        workers.insert(id.to_string(), worker);
    }

    let queued = cluster.submit(&api, "run", &key, json!({ "sleep_ms": 1500 })).await;
    let id = id_of(&queued);
    let running = cluster
        .until_status(&api, &key, &id, "a worker", |job| {
            job["status"] == "IN_PROGRESS" && job["workerId"].is_string()
        })
        .await;
    let victim = running["workerId"].as_str().unwrap().to_string();
    let survivor = if victim == "worker-a" { "worker-b" } else { "worker-a" };
    workers
        .get_mut(&victim)
        .unwrap_or_else(|| panic!("an unknown worker runs the job: {running}"))
        .kill();

    let done = cluster.until_final(&api, &key, std::slice::from_ref(&id), WAIT).await;
    let job = &done[&id];
    assert_eq!(job["status"], "COMPLETED", "the job survives its worker: {job}");
    assert_eq!(job["workerId"], survivor, "finished on the other worker: {job}");
    assert!(
        job["executionTime"].as_u64().is_some_and(|ms| ms >= 1400),
        "the whole job ran again: {job}"
    );
    let rows = cluster
        .assert_each_completed_and_charged_once(std::slice::from_ref(&id))
        .await;
    assert!(rows[&id].attempt >= 2, "the lost attempt was counted: {:?}", rows[&id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_scheduler_loses_no_queued_job() {
    let cluster = Cluster::new(&[("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100")]).await;
    let key = cluster.user_key();
    let (api, first) = (cluster.api("api"), cluster.scheduler("scheduler-1"));
    let api = Cluster::ready_api(api).await;
    let mut first = Cluster::ready_scheduler(first).await;

    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(id_of(&cluster.submit(&api, "run", &key, json!({ "n": n })).await));
    }
    // Several sweeps of the scheduler pass; with no worker nothing may leave the queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &ids {
        let job = cluster.status(&api, &key, id).await;
        assert_eq!(job["status"], "IN_QUEUE", "no worker yet: {job}");
    }
    first.proc.kill();

    let second = Cluster::ready_scheduler(cluster.scheduler("scheduler-2")).await;
    let mut worker = cluster.worker("worker", &second, 2);
    worker.wait_for_log("connected to the scheduler").await;
    let done = cluster.until_final(&api, &key, &ids, WAIT).await;
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(done[id]["status"], "COMPLETED", "{}", done[id]);
        assert_eq!(done[id]["output"]["n"], n, "{}", done[id]);
    }
    let rows = cluster.assert_each_completed_and_charged_once(&ids).await;
    for (id, row) in &rows {
        assert_eq!(row.attempt, 1, "job {id} was dispatched once: {row:?}");
        assert_eq!(row.worker_id.as_deref(), Some("worker"), "{row:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_worker() {
    let cluster = Cluster::new(&[("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100")]).await;
    let key = cluster.user_key();
    let (api, sched) = (cluster.api("api"), cluster.scheduler("scheduler"));
    let api = Cluster::ready_api(api).await;
    let sched = Cluster::ready_scheduler(sched).await;
    let mut worker = cluster.worker("worker", &sched, 1);
    worker.wait_for_log("connected to the scheduler").await;

    let submitted = Instant::now();
    let id = id_of(&cluster.submit(&api, "run", &key, json!({ "sleep_ms": 1500 })).await);
    cluster
        .until_status(&api, &key, &id, "its worker", |job| {
            job["status"] == "IN_PROGRESS" && job["workerId"] == "worker"
        })
        .await;
    worker.terminate();
    let status = worker.wait_exit(WAIT).await;
    assert!(
        status.success(),
        "a drained worker exits 0: {status}\n{}",
        worker.tail()
    );
    assert!(
        submitted.elapsed() >= Duration::from_millis(1500),
        "the worker waited for its job before exiting\n{}",
        worker.tail()
    );

    // No worker is left: only a job finished by the drained worker can be final now.
    let done = cluster
        .until_final(&api, &key, std::slice::from_ref(&id), Duration::from_secs(5))
        .await;
    let job = &done[&id];
    assert_eq!(job["status"], "COMPLETED", "the running job was finished: {job}");
    assert_eq!(job["workerId"], "worker", "{job}");
    let rows = cluster
        .assert_each_completed_and_charged_once(std::slice::from_ref(&id))
        .await;
    assert_eq!(rows[&id].attempt, 1, "not run twice: {:?}", rows[&id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_mid_job_hands_it_over_once_its_lease_lapses() {
    let cluster = Cluster::new(&[
        ("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100"),
        ("GANTRY_SCHEDULER__LEASE_MS", "1000"),
    ])
    .await;
    let key = cluster.user_key();
    let (api, s1, s2) = (
        cluster.api("api"),
        cluster.scheduler("scheduler-1"),
        cluster.scheduler("scheduler-2"),
    );
    let api = Cluster::ready_api(api).await;
    let mut schedulers = HashMap::new();
    for (worker_id, sched) in [("worker-a", s1), ("worker-b", s2)] {
        let sched = Cluster::ready_scheduler(sched).await;
        let mut worker = cluster.worker(worker_id, &sched, 1);
        worker.wait_for_log("connected to the scheduler").await;
        schedulers.insert(worker_id.to_string(), (sched, worker));
    }

    let id = id_of(&cluster.submit(&api, "run", &key, json!({ "sleep_ms": 1500 })).await);
    let running = cluster
        .until_status(&api, &key, &id, "a worker", |job| {
            job["status"] == "IN_PROGRESS" && job["workerId"].is_string()
        })
        .await;
    let victim = running["workerId"].as_str().unwrap().to_string();
    let survivor = if victim == "worker-a" { "worker-b" } else { "worker-a" };
    // The scheduler that dispatched the job dies; its worker stays, cut off.
    schedulers
        .get_mut(&victim)
        .unwrap_or_else(|| panic!("an unknown worker runs the job: {running}"))
        .0
        .proc
        .kill();

    let done = cluster.until_final(&api, &key, std::slice::from_ref(&id), WAIT).await;
    let job = &done[&id];
    assert_eq!(job["status"], "COMPLETED", "the job survives its scheduler: {job}");
    assert_eq!(
        job["workerId"], survivor,
        "run again through the other scheduler: {job}"
    );
    let rows = cluster
        .assert_each_completed_and_charged_once(std::slice::from_ref(&id))
        .await;
    assert!(
        rows[&id].attempt >= 2,
        "the lapsed attempt was counted: {:?}",
        rows[&id]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_process_reports_workers_of_schedulers_elsewhere() {
    let cluster = Cluster::new(&[("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "100")]).await;
    let key = cluster.user_key();
    let (api, sched) = (cluster.api("api"), cluster.scheduler("scheduler"));
    let api = Cluster::ready_api(api).await;
    let sched = Cluster::ready_scheduler(sched).await;
    let mut worker = cluster.worker("worker", &sched, 1);
    worker.wait_for_log("connected to the scheduler").await;

    // The API process has no dispatcher: it reports what the scheduler publishes.
    let started = Instant::now();
    loop {
        let response = cluster
            .client
            .get(format!("{}/v2/gantry-echo/health", api.public))
            .bearer_auth(&key)
            .send()
            .await
            .expect("health");
        assert_eq!(response.status(), 200, "health through {}", api.proc.name);
        let health: Value = response.json().await.expect("JSON health");
        assert!(health["jobs"].is_object(), "{health}");
        assert!(health["workers"]["running"].is_u64(), "{health}");
        if health["workers"]["idle"].as_u64().is_some_and(|idle| idle >= 1) {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the API never reported the worker: {health}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the job signals published on `channel` (see `docs/scheduler.md`,
/// "Signals") into memory, from a subscription of the test's own.
async fn listen(redis: &RedisServer, channel: &str) -> Log {
    let client = redis::Client::open(redis.url()).expect("redis client");
    let mut pubsub = client.get_async_pubsub().await.expect("subscribe");
    pubsub.subscribe(channel).await.expect("subscribe");
    let heard: Log = Arc::default();
    let sink = Arc::clone(&heard);
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if let Ok(text) = message.get_payload::<String>() {
                sink.lock().unwrap().push(text);
            }
        }
    });
    heard
}

/// Waits (up to 5 s) until the test's own subscription has heard the signal
/// `<origin> <kind> <argument>`: the process it woke may act on it before
/// this subscriber reads it. Panics with everything heard otherwise.
async fn expect_heard(log: &Log, kind: &str, argument: &str) {
    let suffix = format!(" {kind} {argument}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !log.lock().unwrap().iter().any(|line| line.ends_with(&suffix)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never heard `{kind} {argument}`: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With Redis configured, an API process and a scheduler process learn of
/// each other's jobs at once. The sweep is set far beyond every wait of this
/// test (120 s against 30 s), so a job that runs here was claimed because of
/// a signal, and a running job stopped here was stopped because of one. Then
/// Redis dies and comes back: the jobs queued meanwhile still run, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_signals_wake_the_other_processes_and_losing_them_loses_no_job() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let channel = format!("gantry-test:{}", crate::harness::unique());
    let cluster = Cluster::new(&[
        ("GANTRY_REDIS_URL", url.as_str()),
        ("GANTRY_SCHEDULER__SIGNAL_CHANNEL", channel.as_str()),
        ("GANTRY_SCHEDULER__SWEEP_INTERVAL_MS", "120000"),
        ("GANTRY_SCHEDULER__LEASE_MS", "600000"),
    ])
    .await;
    let heard_signals = listen(&redis, &channel).await;
    let key = cluster.user_key();
    let (api, sched) = (cluster.api("api"), cluster.scheduler("scheduler"));
    let api = Cluster::ready_api(api).await;
    let sched = Cluster::ready_scheduler(sched).await;
    let mut worker = cluster.worker("worker", &sched, 2);
    worker.wait_for_log("connected to the scheduler").await;

    // Queued through the API process, claimed by the scheduler process long
    // before its next sweep.
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(id_of(&cluster.submit(&api, "run", &key, json!({ "n": n })).await));
    }
    let done = cluster.until_final(&api, &key, &ids, WAIT).await;
    for id in &ids {
        assert_eq!(done[id]["status"], "COMPLETED", "{}", done[id]);
    }
    expect_heard(&heard_signals, "q", "gantry-echo").await;

    // A runsync caller waiting in the API process: the scheduler process
    // announces the end of the job.
    let sync = cluster
        .submit(&api, "runsync?wait=30000", &key, json!({ "n": "sync" }))
        .await;
    assert_eq!(sync["status"], "COMPLETED", "{sync}");
    let sync_id = id_of(&sync);
    expect_heard(&heard_signals, "f", &sync_id).await;

    // Cancelled through the API process while the scheduler process runs it:
    // its worker is told at once, not at the next sweep.
    let long = id_of(&cluster.submit(&api, "run", &key, json!({ "sleep_ms": 60_000 })).await);
    cluster
        .until_status(&api, &key, &long, "its worker", |job| job["status"] == "IN_PROGRESS")
        .await;
    let response = cluster
        .client
        .post(format!("{}/v2/gantry-echo/cancel/{long}", api.public))
        .bearer_auth(&key)
        .send()
        .await
        .expect("cancel");
    assert_eq!(response.status(), 200);
    let line = worker.wait_for_log("job cancelled by the scheduler").await;
    assert!(line.contains(&long), "{line}");
    expect_heard(&heard_signals, "c", &long).await;

    // A reader on the API process follows a job the scheduler process runs:
    // its chunks come over Redis as the worker sends them, even while the
    // database cannot store them.
    let streamed = id_of(
        &cluster
            .submit(
                &api,
                "run",
                &key,
                json!({ "sleep_ms": 1000, "stream": 3, "stream_interval_ms": 20 }),
            )
            .await,
    );
    let mut reader = SseReader::new(
        cluster
            .client
            .get(format!("{}/v2/gantry-echo/stream/{streamed}", api.public))
            .bearer_auth(&key)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("stream"),
    );
    let (_, name, _) = reader.next(WAIT).await.expect("the progress event");
    assert_eq!(name, "progress");
    let lock = block_chunk_writes(&cluster.db.url, Backend::Postgres).await;
    expect_chunks_before_they_are_stored(&mut reader, lock, 3).await;
    // Readers that join late or resume there read what they missed from the
    // database (no store wake-up reaches that process) and the rest live.
    let followed = id_of(
        &cluster
            .submit(&api, "run", &key, json!({ "stream": 60, "stream_interval_ms": 5 }))
            .await,
    );
    let open = |last: Option<i64>| {
        let mut request = cluster
            .client
            .get(format!("{}/v2/gantry-echo/stream/{followed}", api.public))
            .bearer_auth(&key)
            .header("accept", "text/event-stream");
        if let Some(last) = last {
            request = request.header("last-event-id", last.to_string());
        }
        async move { SseReader::new(request.send().await.expect("stream")) }
    };
    late_and_resuming_readers_agree(open, 60).await;

    // Redis goes away: the signal of this job is lost...
    redis.kill();
    let lost = id_of(&cluster.submit(&api, "run", &key, json!({ "n": "lost" })).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cluster.status(&api, &key, &lost).await["status"], "IN_QUEUE");
    // ...and once it is back, the scheduler resubscribes and claims what is
    // queued (nothing else could run it before the sweep)...
    redis.spawn();
    let done = cluster.until_final(&api, &key, std::slice::from_ref(&lost), WAIT).await;
    assert_eq!(done[&lost]["status"], "COMPLETED", "{}", done[&lost]);
    // ...and jobs queued from now on are signalled again.
    let after = id_of(&cluster.submit(&api, "run", &key, json!({ "n": "after" })).await);
    let done = cluster
        .until_final(&api, &key, std::slice::from_ref(&after), WAIT)
        .await;
    assert_eq!(done[&after]["status"], "COMPLETED", "{}", done[&after]);

    let mut charged = ids.clone();
    charged.extend([sync_id, streamed, followed, lost, after]);
    let jobs = cluster.jobs().await;
    assert_eq!(jobs[&long].status, "CANCELLED", "{:?}", jobs[&long]);
    let ledger = cluster.ledger().await;
    assert!(
        ledger.iter().all(|(id, _)| id != &long),
        "a cancelled job is not charged"
    );
    assert_eq!(ledger.len(), charged.len(), "one charge per completed job: {ledger:?}");
    for id in &charged {
        assert_eq!(jobs[id].status, "COMPLETED", "{id}: {:?}", jobs[id]);
        assert_eq!(
            ledger.iter().filter(|(job, _)| job == id).count(),
            1,
            "{id} charged once"
        );
    }
}

/// `/metrics` of the scheduler and worker roles on their own addresses,
/// parsed by the Prometheus client: the scheduler's queue and charges, the
/// worker's jobs, run times and slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_and_worker_roles_serve_metrics() {
    let cluster = Cluster::new(&[]).await;
    let key = cluster.user_key();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string()
    };
    let (sched_metrics, worker_metrics) = (free(), free());
    let api = Cluster::ready_api(cluster.api("api")).await;
    let sched = cluster.spawn(
        "scheduler",
        &["scheduler"],
        &[("GANTRY_METRICS_ADDR", sched_metrics.as_str())],
    );
    let sched = Cluster::ready_scheduler(sched).await;
    let mut worker = cluster.worker_with("worker", &sched, 2, &[("GANTRY_METRICS_ADDR", worker_metrics.as_str())]);
    worker.wait_for_log("connected to the scheduler").await;
    let job = cluster
        .submit(&api, "runsync?wait=30000", &key, json!({ "n": 1 }))
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}\n{}", cluster.logs());

    let scrape = async |addr: &str| {
        let res = cluster
            .client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        crate::metrics::parse(&res.text().await.unwrap())
    };
    let echo = [("model", "gantry-echo")];
    let samples = scrape(&sched_metrics).await;
    assert_eq!(crate::metrics::value(&samples, "gantry_queue_depth", &echo), Some(0.0));
    assert!(crate::metrics::value(&samples, "gantry_charged_usd_total", &echo).is_some_and(|usd| usd > 0.0));
    let samples = scrape(&worker_metrics).await;
    assert_eq!(
        crate::metrics::value(
            &samples,
            "gantry_worker_jobs_total",
            &[("model", "gantry-echo"), ("outcome", "completed")]
        ),
        Some(1.0)
    );
    assert_eq!(
        crate::metrics::value(&samples, "gantry_worker_job_run_seconds_count", &echo),
        Some(1.0)
    );
    assert_eq!(
        crate::metrics::value(
            &samples,
            "gantry_worker_slots",
            &[("model", "gantry-echo"), ("state", "free")]
        ),
        Some(2.0)
    );
}

/// The topology `docker-compose.yml` describes, as real processes: the
/// migrations run once (`gantry migrate`), two API replicas, one scheduler
/// serving /metrics, a worker for the bundled model, Redis for signals and
/// rate limits, all on one PostgreSQL database and one files directory with
/// one signing key. A job with an output file goes in through one replica;
/// its file is read through the URL the other replica gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_topology_runs_as_real_processes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let channel = format!("gantry-compose:{}", crate::harness::unique());
    let files_dir = tempfile::tempdir().unwrap();
    let files = files_dir.path().to_str().unwrap().to_owned();
    let cluster = Cluster::new(&[
        ("GANTRY_REDIS_URL", url.as_str()),
        ("GANTRY_SCHEDULER__SIGNAL_CHANNEL", channel.as_str()),
        ("GANTRY_FILES__DIR", files.as_str()),
        ("GANTRY_FILES__SIGNING_KEY", "compose-test-signing-key"),
    ])
    .await;
    cluster.cli(&["migrate"]);
    let key = cluster.user_key();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (api1, api2) = (cluster.api("api-1"), cluster.api("api-2"));
    let sched = cluster.spawn(
        "scheduler",
        &["scheduler"],
        &[("GANTRY_METRICS_ADDR", metrics.as_str())],
    );
    let apis = [Cluster::ready_api(api1).await, Cluster::ready_api(api2).await];
    let sched = Cluster::ready_scheduler(sched).await;
    let mut worker = cluster.worker("worker-echo", &sched, 8);
    worker.wait_for_log("connected to the scheduler").await;

    let job = cluster
        .submit(
            &apis[0],
            "runsync?wait=30000",
            &key,
            json!({ "file": {"text": "compose ", "repeat": 3} }),
        )
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}\n{}", cluster.logs());
    let first = job["output"]["file_url"].as_str().expect("a file URL").to_owned();
    assert!(first.starts_with(&apis[0].public), "{first}");
    let read = |url: String| {
        let client = cluster.client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    assert_eq!(read(first).await, "compose compose compose ");
    let again = cluster.status(&apis[1], &key, &id_of(&job)).await;
    let second = again["output"]["file_url"].as_str().unwrap().to_owned();
    assert!(second.starts_with(&apis[1].public), "{second}");
    assert_eq!(read(second).await, "compose compose compose ");

    let res = cluster
        .client
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    let samples = crate::metrics::parse(&res.text().await.unwrap());
    assert_eq!(crate::metrics::value(&samples, "gantry_files_stored", &[]), Some(1.0));
    cluster.assert_each_completed_and_charged_once(&[id_of(&job)]).await;
}

/// `onnx_library` puts every ONNX model of a process on the operator's ONNX
/// Runtime: here the `onnxruntime-gpu` wheel's (`scripts/test` fetches it).
/// A worker on the CPU serves terrain jobs on it; a worker told to use a GPU
/// (`image.cuda_device`) where none can be had (no GPU on this machine) does
/// not start, and says why, rather than quietly running on the CPU: the
/// terrain model on ONNX Runtime's CUDA provider, and a GAN on candle's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn onnx_models_run_on_the_operators_runtime_and_an_unreachable_gpu_stops_the_worker() {
    let gpu_runtime = std::env::var("GANTRY_TEST_ONNXRUNTIME_GPU")
        .expect("GANTRY_TEST_ONNXRUNTIME_GPU names onnxruntime-gpu's library: scripts/fetch-onnxruntime-gpu.sh (scripts/test runs it)");
    let models = crate::text::models_dir();
    let models = models.to_str().expect("a UTF-8 models dir");
    let cluster = Cluster::new(&[
        ("GANTRY_MODELS_DIR", models),
        ("GANTRY_PULL_ON_START", "false"),
        ("GANTRY_ONNX_LIBRARY", gpu_runtime.as_str()),
    ])
    .await;
    let key = cluster.user_key();
    let api = Cluster::ready_api(cluster.api("api")).await;
    let sched = Cluster::ready_scheduler(cluster.scheduler("scheduler")).await;
    let worker_args = |id| {
        [
            "worker",
            "--model",
            "terrain-128",
            "--scheduler",
            sched.url.as_str(),
            "--id",
            id,
        ]
    };

    if !std::path::Path::new("/dev/nvidia0").exists() {
        // Without a GPU, a model set on CUDA device 0 does not load, and its
        // worker stops saying why: the terrain on ONNX Runtime's provider,
        // the GAN generators and Whisper on candle's (no `cuda` build either).
        for (id, model, setting, reason) in [
            (
                "gpu-worker",
                "terrain-128",
                "GANTRY_IMAGE__CUDA_DEVICE",
                "ONNX Runtime cannot run on CUDA device 0",
            ),
            (
                "gan-worker",
                "dcgan-faces-64",
                "GANTRY_IMAGE__CUDA_DEVICE",
                "no CUDA device 0",
            ),
            (
                "whisper-worker",
                "whisper-tiny-en",
                "GANTRY_TRANSCRIPTION__CUDA_DEVICE",
                "no CUDA device 0",
            ),
        ] {
            let args = [
                "worker",
                "--model",
                model,
                "--scheduler",
                sched.url.as_str(),
                "--id",
                id,
            ];
            let mut worker = cluster.spawn(id, &args, &[(setting, "0")]);
            let status = worker.wait_exit(WAIT).await;
            let log = worker.lines().join("\n");
            assert!(
                !status.success(),
                "a worker without its GPU does not serve: {status}\n{log}"
            );
            assert!(
                log.contains(&format!("cannot load '{model}'")) && log.contains(reason),
                "the reason is logged:\n{log}"
            );
        }
    }

    let mut cpu = cluster.spawn("cpu-worker", &worker_args("cpu-worker"), &[]);
    cpu.wait_for_log("connected to the scheduler").await;
    let log = cpu.lines().join("\n");
    let canonical = std::fs::canonicalize(&gpu_runtime).unwrap();
    assert!(
        log.contains(&format!("ONNX models run on {}", canonical.display())),
        "the worker names its runtime:\n{log}"
    );
    assert!(log.contains("onnxruntime on the CPU"), "{log}");

    let response = cluster
        .client
        .post(format!("{}/v2/terrain-128/runsync", api.public))
        .bearer_auth(&key)
        .json(&json!({ "input": { "difficulty": 40, "seed": 3 } }))
        .send()
        .await
        .expect("runsync");
    assert_eq!(response.status(), 200);
    let job: Value = response.json().await.expect("a JSON job");
    assert_eq!(job["status"], "COMPLETED", "{job}\n{}", cluster.logs());
    assert_eq!(job["output"]["difficulty"], 40, "{job}");
    assert_eq!(job["output"]["width"], 128, "{job}");
    let id = id_of(&job);
    cluster
        .assert_each_completed_and_charged_once(std::slice::from_ref(&id))
        .await;
}
