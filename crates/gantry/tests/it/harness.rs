use std::sync::Arc;
use std::time::Duration;

use gantry_api::{Application, Settings};
use gantry_auth::{AuthService, ScopeSet};
use reqwest::{Client, Method, RequestBuilder, Response};
use sea_orm::{ConnectionTrait, Database};
use serde_json::Value;
use tokio::sync::OnceCell;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates one test per backend from an `async fn name(Backend)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::harness::Backend::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::harness::Backend::Postgres).await } )*
        }
    };
}

pub struct TestApp {
    pub base: String,
    pub public_base: String,
    pub client: Client,
    pub auth: Arc<AuthService>,
    pub database_url: String,
    pub settings: Settings,
    handles: Vec<gantry_api::ServerHandle>,
    _database: Option<PgDatabase>,
    _dir: tempfile::TempDir,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> TestApp {
        Self::spawn_with(backend, |_| {}).await
    }

    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
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
        tweak(&mut settings);
        let app = Application::build(settings.clone()).await.expect("application starts");
        let base = format!("http://{}", app.management_addr());
        let public_base = format!("http://{}", app.public_addr());
        let auth = app.state().auth.clone();
        let handles = app.handles();
        tokio::spawn(app.run_until_stopped());
        TestApp {
            base,
            public_base,
            client: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            auth,
            database_url,
            settings,
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
    }
}

pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    NEXT.fetch_add(1, Ordering::Relaxed) * 1_000_000_000 + nanos
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

/// The PostgreSQL server the suite runs against; never its shared databases' tables.
pub fn postgres_admin_url() -> String {
    std::env::var("GANTRY_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database for one test, dropped afterwards.
pub struct PgDatabase {
    pub url: String,
    name: String,
}

static ORPHANS_SWEPT: OnceCell<()> = OnceCell::const_new();

impl PgDatabase {
    async fn create() -> PgDatabase {
        let admin_url = postgres_admin_url();
        let admin = Database::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is not reachable at {admin_url} ({e}). The suite needs it: start it with \
                 `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or point \
                 GANTRY_TEST_POSTGRES_URL at a server"
            )
        });
        ORPHANS_SWEPT.get_or_init(|| sweep_orphans(&admin)).await;
        let name = format!("gantry_t_{}_{}", std::process::id(), unique());
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        admin.close().await.ok();
        let base = admin_url
            .rsplit_once('/')
            .map(|(b, _)| b.to_string())
            .unwrap_or(admin_url);
        PgDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

/// Drops databases left by test processes that no longer run (killed mid-test).
async fn sweep_orphans(admin: &sea_orm::DatabaseConnection) {
    use sea_orm::{DbBackend, Statement};
    let rows = admin
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT datname FROM pg_database WHERE datname LIKE 'gantry_t_%'",
        ))
        .await
        .unwrap_or_default();
    for row in rows {
        let Ok(name) = row.try_get::<String>("", "datname") else {
            continue;
        };
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            admin
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
                .ok();
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = postgres_admin_url();
        // Drop runs outside async; a short-lived runtime on its own thread does the work.
        let dropper = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async move {
                if let Ok(admin) = Database::connect(&admin_url).await {
                    admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await
                        .ok();
                    admin.close().await.ok();
                }
            });
        });
        dropper.join().ok();
    }
}
