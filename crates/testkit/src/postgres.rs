//! A fresh PostgreSQL database per test on the machine's server, dropped afterwards.
use sea_orm::{ConnectionTrait, Database};
use tokio::sync::OnceCell;

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
    pub async fn create() -> PgDatabase {
        let admin_url = postgres_admin_url();
        let admin = Database::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is not reachable at {admin_url} ({e}). The suite needs it: run the tests \
                 with scripts/test (it starts one when none answers), or point \
                 GANTRY_TEST_POSTGRES_URL at a server"
            )
        });
        ORPHANS_SWEPT.get_or_init(|| sweep_orphans(&admin)).await;
        let name = format!("gantry_t_{}_{}", std::process::id(), crate::unique());
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
