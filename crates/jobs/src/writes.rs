//! How a process writes jobs: on SQLite, the writer thread (`engine.rs`)
//! and one in-process write lock that every other writer takes (see
//! `db::serialize_writes`); on PostgreSQL, submitted rows in grouped inserts.

use std::sync::{Arc, OnceLock};

use sea_orm::{ActiveModelTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, IntoActiveModel};
use tokio::sync::{mpsc, oneshot};

use crate::db::serialize_writes;
use crate::engine::Engine;
use crate::entity::job;

#[derive(Default)]
pub struct Writes {
    /// Serializes this process's writes on SQLite (see [`serialize_writes`]).
    pub lock: Arc<tokio::sync::Mutex<()>>,
    inserts: OnceLock<mpsc::UnboundedSender<Insert>>,
    /// The SQLite writer thread, when the database is a SQLite file.
    pub engine: Option<Engine>,
}

impl Writes {
    /// On SQLite every hot write (submits, admissions, settlements, claims)
    /// goes through a writer thread of its own on the database file (see
    /// `engine.rs`): that is SQLite's one statement set for them. An SQLite
    /// database without a file (in memory) has none and is refused.
    pub fn open(db: &DatabaseConnection) -> Result<Self, DbErr> {
        let mut writes = Self::default();
        if db.get_database_backend() == DbBackend::Sqlite {
            let options = db.get_sqlite_connection_pool().connect_options();
            let path = options.get_filename();
            writes.engine = Some(Engine::open(path, Arc::clone(&writes.lock)).map_err(|error| {
                DbErr::Custom(format!(
                    "the job store needs an SQLite database file it can open ({}): {error}",
                    path.display()
                ))
            })?);
        }
        Ok(writes)
    }

    /// Inserts one job row, committed when this returns. Concurrent inserts are
    /// grouped: one writer task writes whatever is queued as one multi-row
    /// `INSERT` (one commit, one fsync) and answers each caller after it.
    pub async fn insert(&self, db: &DatabaseConnection, row: &job::Model) -> Result<(), DbErr> {
        if let Some(engine) = &self.engine {
            return engine.insert(row.clone()).await;
        }
        let row = row.clone().into_active_model().reset_all();
        let writer = self
            .inserts
            .get_or_init(|| spawn_insert_writer(db.clone(), Arc::clone(&self.lock)));
        let (reply, committed) = oneshot::channel();
        match writer.send((row, reply)) {
            Ok(()) => match committed.await {
                Ok(result) => result,
                // The writer's runtime is gone (e.g. a test runtime ended): the
                // row may or may not be written, which the caller must treat as
                // a failure (nothing was accepted).
                Err(_) => Err(DbErr::Custom("the job writer stopped".into())),
            },
            Err(mpsc::error::SendError((row, _))) => {
                let _guard = serialize_writes(&self.lock, db).await;
                job::Entity::insert(row).exec_without_returning(db).await.map(drop)
            }
        }
    }
}

/// Most rows of one grouped `INSERT` (28 bind values each: well under the
/// limits of both backends).
const INSERT_BATCH: usize = 256;

/// Grouped inserts in flight at once on PostgreSQL, where concurrent commits
/// share WAL flushes. SQLite writes one at a time anyway.
const POSTGRES_INSERTS_IN_FLIGHT: usize = 4;

/// Starts the task that writes submitted rows in groups (see `JobStore::insert`).
fn spawn_insert_writer(db: DatabaseConnection, lock: Arc<tokio::sync::Mutex<()>>) -> mpsc::UnboundedSender<Insert> {
    let (sender, mut queue) = mpsc::unbounded_channel::<Insert>();
    let in_flight = match db.get_database_backend() {
        DbBackend::Postgres => POSTGRES_INSERTS_IN_FLIGHT,
        _ => 1,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(in_flight));
    tokio::spawn(async move {
        loop {
            // Take a slot first, so the group grows while earlier ones commit.
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            // A power of two of what is queued (at least one): few distinct
            // statements, so the prepared-statement caches keep them.
            let take = match queue.len().min(INSERT_BATCH) {
                0 | 1 => 1,
                queued => 1 << queued.ilog2(),
            };
            let mut batch = Vec::with_capacity(take);
            if queue.recv_many(&mut batch, take).await == 0 {
                return;
            }
            let (db, lock) = (db.clone(), Arc::clone(&lock));
            tokio::spawn(async move {
                let (rows, replies): (Vec<job::ActiveModel>, Vec<oneshot::Sender<Result<(), DbErr>>>) =
                    batch.into_iter().unzip();
                let guard = serialize_writes(&lock, &db).await;
                // One statement: all rows commit together, or none does.
                let result = job::Entity::insert_many(rows).exec_without_returning(&db).await;
                drop(guard);
                drop(slot);
                for reply in replies {
                    let _ = reply.send(result.as_ref().map(drop).map_err(|e| DbErr::Custom(e.to_string())));
                }
            });
        }
    });
    sender
}

type Insert = (job::ActiveModel, oneshot::Sender<Result<(), DbErr>>);
