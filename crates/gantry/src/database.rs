//! The database a process works on: the connection pool, the migrations, and
//! (for an SQLite file) the lock that makes one serving process its only user.

use std::time::Duration;

use gantry_jobs::JobStore;
use gantry_migrations::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database as SeaDatabase, DatabaseConnection};

use crate::{Settings, StartError};

/// A migrated database, and the SQLite file's lock when this process serves one.
pub struct Database {
    pub conn: DatabaseConnection,
    /// Held while this process serves: no second serving process may open
    /// the same SQLite file, and this one may treat every job as its own.
    lock: Option<std::fs::File>,
}

impl Database {
    /// For a serving process (`serve`, `api`): takes the SQLite file's lock
    /// first, then connects and migrates.
    pub async fn open_serving(settings: &Settings) -> Result<Self, StartError> {
        let lock = lock_sqlite(settings)?;
        let conn = connect_database(settings).await?;
        Ok(Self { conn, lock })
    }

    /// For a process that shares the database (`gantry scheduler`): connects
    /// and migrates, takes no lock.
    pub async fn open_shared(settings: &Settings) -> Result<Self, StartError> {
        let conn = connect_database(settings).await?;
        Ok(Self { conn, lock: None })
    }

    /// Whether this process holds the SQLite file's lock: it is the sole
    /// writer, so no other process runs its jobs or changes its volumes.
    pub fn sole_owner(&self) -> bool {
        self.lock.is_some()
    }
}

/// Connects to the configured database and applies pending migrations.
pub async fn connect_database(settings: &Settings) -> Result<DatabaseConnection, StartError> {
    let url = settings.database_url();
    let db_err = |source| StartError::Database {
        url: redact(&url),
        source,
    };
    let sqlite = url.starts_with("sqlite:");
    if sqlite {
        std::fs::create_dir_all(&settings.data_dir)?;
    }
    let mut options = ConnectOptions::new(url.clone());
    options
        .max_connections(
            settings
                .database_max_connections
                .unwrap_or(if sqlite { 8 } else { 16 })
                .max(1),
        )
        .min_connections(1)
        .connect_timeout(Duration::from_secs(10))
        .sqlx_logging(false)
        // A file-backed SQLite connection cannot go stale; skip the ping that would cost
        // one extra trip through the connection's worker thread on every query.
        .test_before_acquire(!sqlite);
    if !sqlite {
        // A server connection can die while idle; check only those, not every busy one.
        options.test_before_acquire_if_idle_for(Duration::from_secs(30));
    }
    if sqlite {
        // WAL lets readers proceed during a write; with WAL, synchronous=NORMAL loses
        // nothing when a process crashes (only an OS crash can drop the last commits).
        options.map_sqlx_sqlite_opts(|o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(5))
        });
    }
    let db = SeaDatabase::connect(options).await.map_err(db_err)?;
    Migrator::up(&db, None).await.map_err(db_err)?;
    Ok(db)
}

/// The job store of a process on `database`: its settings, whether it owns
/// the database alone (the SQLite lock), and the Redis signals when configured.
pub fn job_store(settings: &Settings, database: &Database) -> Result<JobStore, StartError> {
    let mut config = settings.job_config().map_err(StartError::Config)?;
    // Holding the SQLite file's lock proves no other process runs its jobs.
    config.sole_owner = database.sole_owner();
    let jobs = JobStore::new(database.conn.clone(), config).map_err(|e| StartError::Config(e.to_string()))?;
    connect_job_signals(settings, &jobs)?;
    Ok(jobs)
}

/// With `redis_url` set, `jobs` sends and hears job wake-ups over Redis, so
/// that API and scheduler processes sharing the database learn of queued and
/// finished jobs at once (see `docs/scheduler.md`, "Signals").
fn connect_job_signals(settings: &Settings, jobs: &JobStore) -> Result<(), StartError> {
    match settings.redis_url.as_deref().filter(|u| !u.trim().is_empty()) {
        None => Ok(()),
        Some(url) => jobs
            .connect_signals(url, &settings.scheduler.signal_channel)
            .map_err(|e| StartError::Config(e.to_string())),
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***{}", &url[..scheme], &url[at..]),
        _ => url.to_string(),
    }
}

/// Takes an exclusive lock next to an SQLite database file, so that two serving
/// processes never share one embedded database.
fn lock_sqlite(settings: &Settings) -> Result<Option<std::fs::File>, StartError> {
    let url = settings.database_url();
    let Some(rest) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) else {
        return Ok(None);
    };
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.starts_with(':') {
        return Ok(None); // in-memory
    }
    if let Some(dir) = std::path::Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let lock_path = format!("{path}.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(StartError::Config(format!(
            "another Gantry process is serving the SQLite database {path} (lock {lock_path} is held); \
             run one process per SQLite file, or use PostgreSQL for several"
        ))),
        Err(std::fs::TryLockError::Error(err)) => Err(err.into()),
    }
}
