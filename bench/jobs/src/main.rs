//! `gantry-bench-jobs`: a load generator for the job path.
//!
//! Starts the whole platform in this process (`gantry::Platform::start`: API,
//! scheduler, bundled echo worker over loopback gRPC) on SQLite in a temporary
//! directory, or on a fresh PostgreSQL database (`--postgres ADMIN_URL`), and
//! drives the public HTTP endpoints with keep-alive HTTP/1.1 connections from
//! a client runtime on its own thread:
//!
//! * `runsync`: for each concurrency level, N connections loop on
//!   `POST /v2/gantry-echo/runsync` for a fixed time; prints throughput and
//!   latency percentiles (after a warm-up).
//! * `async`: N connections submit M jobs with `POST /v2/gantry-echo/run`; the
//!   ledger is polled every 25 ms until M charges were written since the
//!   submits began (one per completed job), then the number `COMPLETED` is
//!   checked; prints the submit rate and the end-to-end rate.
//!
//! Afterwards it checks that every completed job has exactly one ledger entry.
//!
//! ```text
//! cargo run --release -p gantry-bench-jobs -- [--postgres URL] [--scenario all|runsync|async]
//!     [--concurrency 1,16,64] [--duration SECS] [--warmup SECS]
//!     [--async-jobs M] [--async-conns N] [--slots S] [--db-connections N] [--claim-ahead N]
//!     [--http-workers N] [--runtime-threads N]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// mimalloc: the request path allocates and frees many small buffers across
/// threads; glibc's allocator spent ~6 % of the CPU there (decision 0016 in docs/decisions/http-and-process.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gantry::Platform;
use gantry::Settings;
use gantry_auth::{ScopeSet, UserLimits};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "gantry-echo";
const EMAIL: &str = "bench@example.com";

struct Args {
    postgres: Option<String>,
    scenario: String,
    concurrency: Vec<usize>,
    duration: Duration,
    warmup: Duration,
    async_jobs: usize,
    async_conns: usize,
    slots: u32,
    db_connections: Option<u32>,
    claim_ahead: u32,
    http_workers: Option<usize>,
    runtime_threads: Option<usize>,
}

fn or_default<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or("default".to_string(), |v| v.to_string())
}

fn parse_args() -> Args {
    let mut args = Args {
        postgres: None,
        scenario: "all".into(),
        concurrency: vec![1, 16, 64],
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(1),
        async_jobs: 20_000,
        async_conns: 64,
        slots: 64,
        db_connections: None,
        claim_ahead: 0,
        http_workers: None,
        runtime_threads: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--postgres" => args.postgres = Some(value()),
            "--scenario" => args.scenario = value(),
            "--concurrency" => {
                args.concurrency = value()
                    .split(',')
                    .map(|c| c.trim().parse().expect("concurrency"))
                    .collect()
            }
            "--duration" => args.duration = Duration::from_secs_f64(value().parse().expect("duration")),
            "--warmup" => args.warmup = Duration::from_secs_f64(value().parse().expect("warmup")),
            "--async-jobs" => args.async_jobs = value().parse().expect("async-jobs"),
            "--async-conns" => args.async_conns = value().parse().expect("async-conns"),
            "--slots" => args.slots = value().parse().expect("slots"),
            "--claim-ahead" => args.claim_ahead = value().parse().expect("claim-ahead"),
            "--db-connections" => args.db_connections = Some(value().parse().expect("db-connections")),
            "--http-workers" => args.http_workers = Some(value().parse().expect("http-workers")),
            "--runtime-threads" => args.runtime_threads = Some(value().parse().expect("runtime-threads")),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn main() {
    let args = parse_args();
    // The platform's runtime, sized as `gantry serve` sizes it.
    let threads = Settings {
        runtime_threads: args.runtime_threads,
        ..Settings::default()
    }
    .runtime_threads(true);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(args, threads));
}

/// `runtime_threads`: the size of the runtime this runs on (for the report).
async fn run(args: Args, runtime_threads: usize) {
    let dir = std::env::temp_dir().join(format!("gantry-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pg = match &args.postgres {
        Some(admin) => Some(PgDatabase::create(admin).await),
        None => None,
    };
    let mut settings = Settings {
        data_dir: PathBuf::from(&dir),
        database_url: pg.as_ref().map(|p| p.url.clone()),
        database_max_connections: args.db_connections,
        management_addr: "127.0.0.1:0".into(),
        public_addr: "127.0.0.1:0".into(),
        ..Settings::default()
    };
    settings.http.workers = args.http_workers;
    settings.scheduler.addr = "127.0.0.1:0".into();
    settings.scheduler.bundled_workers = vec![MODEL.into()];
    settings.scheduler.bundled_slots = args.slots;
    settings.scheduler.claim_ahead = args.claim_ahead;
    // Keep every job of the run (nothing expires while we count).
    settings.scheduler.sync_retention_secs = 3600;
    settings.scheduler.async_retention_secs = 3600;
    let backend = if pg.is_some() { "postgres" } else { "sqlite" };

    let Platform {
        database: _database,
        app,
        scheduler,
        workers,
        ..
    } = Platform::start(settings).await.expect("platform");
    let state = app.state();
    let user = state.auth.create_user(EMAIL).await.expect("user");
    state
        .auth
        .set_limits(
            EMAIL,
            UserLimits {
                exempt: true,
                ..UserLimits::default()
            },
        )
        .await
        .expect("limits");
    let key = state
        .auth
        .issue_key(&user, ScopeSet::all(), None, Some("bench".into()))
        .await
        .expect("key")
        .key
        .expose()
        .to_string();
    let addr = app.public_addr();
    let db = state.db.clone();
    let handles = app.handles();
    let serving = tokio::spawn(app.run_until_stopped());
    // Wait for the bundled worker.
    let ready = Instant::now();
    while scheduler
        .dispatcher
        .health()
        .models
        .get(MODEL)
        .is_none_or(|m| m.free_slots == 0)
    {
        assert!(ready.elapsed() < Duration::from_secs(10), "worker did not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "backend={backend} cpus={} slots={} db-connections={} http-workers={} runtime-threads={}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.slots,
        or_default(args.db_connections),
        or_default(args.http_workers),
        runtime_threads,
    );

    if args.scenario == "all" || args.scenario == "runsync" {
        println!(
            "runsync ({MODEL}, {:?} per level after {:?} warm-up)",
            args.duration, args.warmup
        );
        println!("  conns  requests   req/s      p50 ms   p90 ms   p99 ms   max ms  errors");
        for &conns in &args.concurrency {
            let (key, duration, warmup) = (key.clone(), args.duration, args.warmup);
            let result = on_client_thread(move || runsync(addr, key, conns, warmup, duration)).await;
            let mut lat = result.latencies_us;
            lat.sort_unstable();
            let pct = |p: f64| -> f64 {
                if lat.is_empty() {
                    return 0.0;
                }
                let i = ((lat.len() as f64 * p) as usize).min(lat.len() - 1);
                f64::from(lat[i]) / 1000.0
            };
            println!(
                "  {conns:>5}  {:>8}  {:>8.0}  {:>8.3} {:>8.3} {:>8.3} {:>8.3}  {:>6}",
                lat.len(),
                lat.len() as f64 / duration.as_secs_f64(),
                pct(0.5),
                pct(0.9),
                pct(0.99),
                lat.last().map_or(0.0, |m| f64::from(*m) / 1000.0),
                result.errors
            );
        }
    }

    if args.scenario == "all" || args.scenario == "async" {
        let before = count(
            &db,
            "SELECT COUNT(*) FROM jobs WHERE model = 'gantry-echo' AND status = 'COMPLETED'",
        )
        .await;
        let (jobs, conns, key) = (args.async_jobs, args.async_conns, key.clone());
        let started = Instant::now();
        let submitting = tokio::spawn(on_client_thread(move || submit_all(addr, key, conns, jobs)));
        // Poll the ledger every 25 ms for the charges written since the
        // submits began: every completed job has exactly one, and the query
        // reads only this phase's entries (an index range on user and time).
        // Counting jobs by status instead walks the index entries of every job
        // that ever had that status, dead ones included, which on PostgreSQL
        // cost the platform a core once tens of thousands of jobs had run.
        let since_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis();
        let charged_since = format!(
            "SELECT COUNT(*) FROM ledger_entries WHERE user_id = '{}' AND created_at >= {since_ms}",
            user.id
        );
        let mut last_progress = Instant::now();
        let mut last = -1;
        let done = loop {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let charged = count(&db, &charged_since).await;
            if charged >= jobs as i64 && submitting.is_finished() {
                break started.elapsed();
            }
            if charged != last {
                last = charged;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > Duration::from_secs(20) {
                println!("  async: stalled at {charged} of {jobs}");
                break started.elapsed();
            }
        };
        let completed = count(
            &db,
            "SELECT COUNT(*) FROM jobs WHERE model = 'gantry-echo' AND status = 'COMPLETED'",
        )
        .await;
        if completed != before + jobs as i64 {
            println!("  async: only {} of {jobs} COMPLETED", completed - before);
        }
        let submitted = submitting.await.expect("submitters");
        println!("async ({jobs} jobs of {MODEL} over {conns} connections)");
        println!(
            "  submit: {:.0} jobs/s ({:?}, errors {});  all COMPLETED: {:?} -> {:.0} jobs/s",
            jobs as f64 / submitted.elapsed.as_secs_f64(),
            submitted.elapsed,
            submitted.errors,
            done,
            jobs as f64 / done.as_secs_f64()
        );
    }

    // Correctness: one ledger entry per completed job, nothing left unfinished.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let completed = count(&db, "SELECT COUNT(*) FROM jobs WHERE status = 'COMPLETED'").await;
    let unfinished = count(&db, "SELECT COUNT(*) FROM jobs WHERE status <> 'COMPLETED'").await;
    let charged = count(&db, "SELECT COUNT(*) FROM ledger_entries").await;
    let distinct = count(&db, "SELECT COUNT(DISTINCT job_id) FROM ledger_entries").await;
    println!("check: completed={completed} other={unfinished} ledger={charged} distinct-ledger-jobs={distinct}");
    if completed != charged || charged != distinct {
        println!("check: MISMATCH between completed jobs and ledger entries");
    }

    for handle in handles {
        handle.stop(true).await;
    }
    let _ = serving.await;
    workers.shutdown().await;
    scheduler.shutdown().await;
    drop(db);
    if let Some(pg) = pg {
        pg.drop_database().await;
    }
    std::fs::remove_dir_all(&dir).ok();
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .expect("count")
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("an integer")
}

/// Runs `work` on a current-thread runtime of its own thread, so the client's
/// work is not scheduled on the platform's runtime.
async fn on_client_thread<F, Fut, T>(work: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("client runtime");
        let _ = tx.send(runtime.block_on(work()));
    });
    rx.await.expect("client thread")
}

struct RunsyncResult {
    latencies_us: Vec<u32>,
    errors: u64,
}

async fn runsync(addr: SocketAddr, key: String, conns: usize, warmup: Duration, duration: Duration) -> RunsyncResult {
    let body = br#"{"input":{"prompt":"hello from the benchmark"}}"#;
    let request = build_request(&format!("/v2/{MODEL}/runsync"), &key, body);
    let start = Instant::now();
    let (measure_from, end) = (start + warmup, start + warmup + duration);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let request = request.clone();
        tasks.spawn(async move {
            let mut conn = Conn::connect(addr).await;
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let answer = conn.request(&request).await;
                let ok = match answer.map(|(status, body)| status == 200 && contains(body, br#""status":"COMPLETED""#))
                {
                    Ok(ok) => ok,
                    Err(_) => {
                        conn = Conn::connect(addr).await;
                        false
                    }
                };
                if t0 >= measure_from {
                    if ok {
                        latencies.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        });
    }
    let mut result = RunsyncResult {
        latencies_us: Vec::new(),
        errors: 0,
    };
    while let Some(done) = tasks.join_next().await {
        let (latencies, errors) = done.expect("client task");
        result.latencies_us.extend(latencies);
        result.errors += errors;
    }
    result
}

struct SubmitResult {
    elapsed: Duration,
    errors: u64,
}

async fn submit_all(addr: SocketAddr, key: String, conns: usize, jobs: usize) -> SubmitResult {
    let body = br#"{"input":{"prompt":"hello from the benchmark"}}"#;
    let request = build_request(&format!("/v2/{MODEL}/run"), &key, body);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..conns {
        let request = request.clone();
        let share = jobs / conns + usize::from(lane < jobs % conns);
        tasks.spawn(async move {
            let mut conn = Conn::connect(addr).await;
            let mut errors = 0u64;
            for _ in 0..share {
                let answer = conn.request(&request).await;
                match answer.map(|(status, body)| status == 200 && contains(body, br#""status":"IN_QUEUE""#)) {
                    Ok(true) => {}
                    Ok(false) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        conn = Conn::connect(addr).await;
                    }
                }
            }
            errors
        });
    }
    let mut errors = 0;
    while let Some(done) = tasks.join_next().await {
        errors += done.expect("submit task");
    }
    SubmitResult {
        elapsed: start.elapsed(),
        errors,
    }
}

fn build_request(path: &str, key: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A minimal keep-alive HTTP/1.1 client connection (Content-Length bodies only).
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends `request` and reads one response; returns its status and body.
    /// Reads straight into the connection's buffer (no per-request scratch
    /// buffer to zero, no copy of the body), so the client stays cheap next
    /// to the server it loads on the same two cores.
    async fn request(&mut self, request: &[u8]) -> std::io::Result<(u16, &[u8])> {
        self.stream.write_all(request).await?;
        self.buf.clear();
        let header_end = loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                break at + 4;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..header_end]).map_err(|_| std::io::ErrorKind::InvalidData)?;
        let status: u16 = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .ok_or(std::io::ErrorKind::InvalidData)?;
        while self.buf.len() < header_end + length {
            self.fill().await?;
        }
        Ok((status, &self.buf[header_end..header_end + length]))
    }

    /// Appends what the socket has to the buffer; an error at end of stream.
    async fn fill(&mut self) -> std::io::Result<()> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        match self.stream.read_buf(&mut self.buf).await? {
            0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => Ok(()),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A fresh PostgreSQL database for one run, dropped afterwards.
struct PgDatabase {
    admin: String,
    name: String,
    url: String,
}

impl PgDatabase {
    async fn create(admin: &str) -> PgDatabase {
        let name = format!("gantry_bench_{}", std::process::id());
        let conn = Database::connect(admin).await.expect("postgres admin connection");
        conn.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .expect("drop");
        conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        conn.close().await.ok();
        let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
        PgDatabase {
            admin: admin.to_string(),
            url: format!("{base}/{name}"),
            name,
        }
    }

    async fn drop_database(self) {
        if let Ok(conn) = Database::connect(&self.admin).await {
            conn.execute_unprepared(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
                .await
                .ok();
            conn.close().await.ok();
        }
    }
}
