use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gantry::Platform;
use gantry::Settings;
use gantry_auth::{AuthService, ScopeSet};
use gantry_testkit::PgDatabase;
use reqwest::{Client, Method, RequestBuilder, Response};
use sea_orm::{ConnectionTrait, Database};
use serde_json::Value;

pub use gantry_testkit::Backend;

pub struct TestApp {
    pub base: String,
    pub public_base: String,
    pub client: Client,
    pub auth: Arc<AuthService>,
    /// The job layer of the platform (for what a test drives behind HTTP,
    /// such as a simulated clock).
    pub jobs: gantry_jobs::JobStore,
    pub database_url: String,
    pub settings: Settings,
    /// What each user made by [`TestApp::user_with_key`] starts with, in
    /// micro-dollars: 100 USD, as the first start's admin gets. Tests about
    /// credit itself set it to 0 before making users.
    pub starting_credit_micro_usd: i64,
    db: sea_orm::DatabaseConnection,
    pub scheduler: gantry::SchedulerRole,
    /// Users' serverless workers.
    pub fleet: Arc<gantry_containers::Fleet>,
    /// The fleet's reconciler loop (taken by a test that stops it).
    pub reconciler: Option<gantry::Reconciler>,
    _workers: gantry::Workers,
    /// The platform's database handle (and SQLite lock), held while it serves.
    _platform_database: gantry::Database,
    handles: Vec<gantry_api::ServerHandle>,
    _database: Option<PgDatabase>,
    _dir: tempfile::TempDir,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> TestApp {
        Self::spawn_with(backend, |_| {}).await
    }

    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
        gantry_testkit::trace_to_file();
        let dir = tempfile::tempdir().expect("temp dir");
        let (database_url, database) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/gantry.db?mode=rwc", dir.path().display()), None),
            Backend::Postgres => {
                let db = PgDatabase::create().await;
                (db.url.clone(), Some(db))
            }
        };
        let mut settings = Settings {
            management_addr: "127.0.0.1:0".into(),
            public_addr: "127.0.0.1:0".into(),
            data_dir: dir.path().to_path_buf(),
            database_url: Some(database_url.clone()),
            ..Settings::default()
        };
        settings.http.workers = Some(1);
        settings.database_max_connections = Some(8);
        settings.scheduler.addr = "127.0.0.1:0".into();
        // A worker is lost after 6 s of silence. No test waits for that (a
        // killed worker's stream closes, which reports it at once), and a
        // starved machine must never reap a live worker and run its job twice.
        settings.scheduler.heartbeat_interval_ms = 2000;
        settings.scheduler.sweep_interval_ms = 100;
        // The echo model only; the text model tests add theirs.
        settings.scheduler.bundled_workers = vec!["gantry-echo".into()];
        settings.pull_on_start = false;
        // Credit is required, as it is by default for users: every job takes
        // the path of admission with a credit hold. Users start with credit.
        // The tests' webhook receivers listen on loopback.
        settings.scheduler.webhook_allow_ranges = vec!["127.0.0.0/8".into()];
        tweak(&mut settings);
        let Platform {
            database: platform_database,
            app,
            scheduler,
            workers,
            fleet,
            reconciler,
            ..
        } = Platform::start(settings.clone()).await.expect("platform starts");
        let base = format!("http://{}", app.management_addr());
        let public_base = format!("http://{}", app.public_addr());
        let auth = app.state().auth.clone();
        let jobs = app.state().jobs.clone();
        let db = app.state().db.clone();
        let handles = app.handles();
        tokio::spawn(app.run_until_stopped());
        if settings.serverless.docker_host.is_some() {
            *live_installations().entry(fleet.installation().to_owned()).or_default() += 1;
        }
        TestApp {
            scheduler,
            fleet,
            reconciler: Some(reconciler),
            _workers: workers,
            _platform_database: platform_database,
            base,
            public_base,
            client: http_client(Duration::from_secs(30)),
            auth,
            jobs,
            database_url,
            settings,
            starting_credit_micro_usd: 100_000_000,
            db,
            handles,
            _database: database,
            _dir: dir,
        }
    }

    /// A new user with one key of the given scopes; returns (email, key).
    pub async fn user_with_key(&self, scopes: &str) -> (String, String) {
        let email = format!("user{}@example.test", unique());
        let user = self.auth.create_user(&email).await.expect("create user");
        let scopes = ScopeSet::parse(scopes).expect("scopes");
        let issued = self.auth.issue_key(&user, scopes, None, None).await.expect("issue key");
        if self.starting_credit_micro_usd > 0 {
            gantry_billing::credit::add_credit(
                &self.db,
                &user.id,
                self.starting_credit_micro_usd,
                "test",
                gantry_jobs::now_ms(),
            )
            .await
            .expect("add credit");
        }
        (user.email, issued.key.expose().to_string())
    }

    pub fn request(&self, method: Method, path: &str, key: Option<&str>) -> RequestBuilder {
        let builder = self.client.request(method, format!("{}{}", self.base, path));
        match key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    pub async fn get(&self, path: &str, key: &str) -> Response {
        self.request(Method::GET, path, Some(key))
            .send()
            .await
            .expect("request")
    }

    pub async fn send_json(&self, method: Method, path: &str, key: &str, body: &Value) -> Response {
        self.request(method, path, Some(key))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    /// The OpenAPI document a listener serves (`base` or `public_base`).
    pub async fn document(&self, base: &str) -> Value {
        self.client
            .get(format!("{base}/v2/openapi.json"))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("a JSON document")
    }

    /// Runs SQL directly against the app's database, behind its back.
    pub async fn sql(&self, statement: &str) {
        let db = Database::connect(&self.database_url).await.expect("connect");
        db.execute_unprepared(statement).await.expect("sql");
        db.close().await.ok();
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        for handle in &self.handles {
            // Stopping is asynchronous; the listener threads end on their own.
            drop(handle.stop(false));
        }
        // The last process of an installation is gone: its serverless
        // workers would poll a platform that no longer answers, in a busy
        // loop that slows every test after this one (a test that fails
        // before deleting its endpoint, or one that ends with workers up).
        // Its pods stay: a test may start the installation again to adopt them.
        let Some(host) = self.settings.serverless.docker_host.as_deref() else {
            return;
        };
        let installation = self.fleet.installation().to_owned();
        let last = {
            let mut live = live_installations();
            let count = live.entry(installation.clone()).or_default();
            *count = count.saturating_sub(1);
            let last = *count == 0;
            if last {
                live.remove(&installation);
            }
            last
        };
        if last {
            crate::serverless::remove_containers(
                host,
                &[
                    &format!("{}={installation}", gantry_containers::fleet::LABEL_INSTALLATION),
                    &format!("{}=worker", gantry_containers::fleet::LABEL_KIND),
                ],
            );
        }
    }
}

/// How many [`TestApp`]s of each installation (see `Fleet::installation`)
/// with a container engine are alive in this test process.
fn live_installations() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, usize>> {
    static LIVE: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, usize>>> =
        std::sync::LazyLock::new(Default::default);
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use gantry_testkit::unique;

/// Runs the Python client script `tests/<script>` against the app's OpenAI
/// routes of `model` (`OPENAI_BASE_URL`, `OPENAI_API_KEY` and `GANTRY_MODEL`
/// set, and `extra`), and asserts that it succeeds and prints `done`;
/// `needs` names the packages it imports, for the failure message.
pub async fn run_client_script(
    app: &TestApp,
    script: &str,
    model: &str,
    key: &str,
    extra: &[(&str, String)],
    done: &str,
    needs: &str,
) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let mut command = std::process::Command::new("python3");
    command
        .arg(&path)
        .env("OPENAI_BASE_URL", format!("{}/v2/{model}/openai/v1", app.public_base))
        .env("OPENAI_API_KEY", key)
        .env("GANTRY_MODEL", model);
    for (name, value) in extra {
        command.env(name, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output().expect("python3 runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed (it needs `pip install {needs}`):\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(done), "{stdout}");
}

/// Asserts a problem+json response and returns its body.
pub async fn problem(response: Response, status: u16) -> Value {
    assert_eq!(response.status().as_u16(), status, "unexpected status");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(body["status"], status, "status member equals the HTTP status: {body}");
    assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()), "title: {body}");
    assert!(body["detail"].as_str().is_some_and(|t| !t.is_empty()), "detail: {body}");
    assert!(body["errors"].is_array(), "errors: {body}");
    body
}

pub fn errors_of(body: &Value) -> Vec<String> {
    body["errors"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// A plain-HTTP client for the tests. The workspace's reqwest has TLS without
/// a built-in crypto provider (the scheduler's webhook client brings ring
/// itself), so reqwest wants a process default before building any client.
pub fn http_client(timeout: Duration) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The server closes a connection idle for 5 s (its keep-alive); a pooled
    // connection reused just as it does so fails mid-request. The client lets
    // idle connections go well before, as a careful client of it would.
    Client::builder()
        .timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .expect("client")
}

/// `(id, event, data)` of one SSE event.
pub type Event = (Option<i64>, String, Value);

/// `(id, event, data)` of every event of an SSE body.
pub fn parse_sse(body: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for block in body.split("\n\n") {
        let (mut id, mut name, mut data) = (None, "message".to_string(), String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().ok();
            } else if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_string();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if !data.is_empty() {
            let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            events.push((id, name, value));
        }
    }
    events
}

/// An SSE response read event by event.
pub struct SseReader {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    pending: String,
}

impl SseReader {
    pub async fn open(app: &TestApp, model: &str, key: &str, id: &str, last_event_id: Option<i64>) -> SseReader {
        // The client's 30 s bounds a whole request, body included, which would
        // cap a stream at 30 s however slowly the machine runs the job: the
        // waits of `next` bound a stream instead, one event at a time.
        let mut request = app
            .public(Method::GET, &format!("/v2/{model}/stream/{id}"), key)
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(24 * 3600));
        if let Some(last) = last_event_id {
            request = request.header("last-event-id", last.to_string());
        }
        SseReader::new(request.send().await.unwrap())
    }

    /// Reads the events of `res`, an answer to a stream request.
    pub fn new(res: reqwest::Response) -> SseReader {
        assert_eq!(res.status(), 200);
        SseReader {
            body: res
                .bytes_stream()
                .map(|piece| piece.map(|bytes| bytes.to_vec()))
                .boxed(),
            pending: String::new(),
        }
    }

    /// The next event, or `None` once the stream ends; panics after `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Event> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                if let Some(event) = parse_sse(&block).into_iter().next() {
                    return Some(event);
                }
                continue;
            }
            let piece = tokio::time::timeout(wait, self.body.next())
                .await
                .expect("an event in time")?;
            self.pending.push_str(&String::from_utf8_lossy(&piece.unwrap()));
        }
    }

    /// Every remaining event up to the end of the stream.
    pub async fn rest(&mut self, wait: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next(wait).await {
            events.push(event);
        }
        events
    }
}
