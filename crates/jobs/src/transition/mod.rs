//! Every write of the `jobs` table, and the one executor that runs them.
//!
//! A job changes state only here. Each transition is written once: its
//! guard (which rows it may change), its statement for each backend where
//! the two need different forms, and, for the transitions a job kept only
//! in memory also takes (the fast lane's unwritten `runsync` jobs), the
//! function that applies it to a row in memory. The API half
//! ([`crate::JobStore`]), the scheduler and the webhook outbox submit
//! transitions to a [`JobWriter`]; none of them holds a statement on `jobs`
//! or the write lock (`tests::nothing_outside_this_module_writes_jobs`
//! below checks the source tree for it).
//!
//! - `plan.rs`: a settlement, decided before any statement runs (complete,
//!   finish, requeue, claim, first writes of unstored jobs), the in-memory
//!   form of each of its steps, and its PostgreSQL statements.
//! - `engine.rs`: the SQLite writer thread, which runs inserts, admissions and
//!   settlements with its own statements. The SQLite form of each settlement
//!   step sits in `plan.rs` beside its PostgreSQL form
//!   ([`plan::sqlite`]); the engine only binds and runs them.
//! - `guarded.rs`: the transitions outside a settlement (cancel, retry,
//!   purge, the stream cursor, lease renewal, timeouts, orphans, expiry,
//!   put-back and release of claims, worker ids, webhook holds), one
//!   sea-query statement each: the builder writes both backends' forms.
//!
//! How a process writes: on SQLite, the writer thread (`engine.rs`) and one
//! in-process write lock that every other writer takes (writers queue on it,
//! woken in order, instead of in SQLite's busy handler, which sleeps for
//! milliseconds); on PostgreSQL, rows are locked by the database, nothing is
//! taken here, and submitted rows go in grouped inserts.

mod engine;
mod guarded;
#[cfg(test)]
mod parity;
pub mod plan;
mod reserved;

use std::sync::{Arc, OnceLock};

use sea_orm::{ActiveModelTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, IntoActiveModel, TransactionTrait};
use tokio::sync::{mpsc, oneshot};

use crate::entity::job;
use crate::types::JobError;
use engine::Engine;
use plan::{Plan, Settled};

pub use guarded::Retention;

/// The executor of job transitions: cheap to clone; clones share the write
/// lock, the SQLite writer thread and the grouped-insert writer.
#[derive(Clone)]
pub struct JobWriter {
    db: DatabaseConnection,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Serializes this process's writes on SQLite (see [`JobWriter::turn`]).
    lock: Arc<tokio::sync::Mutex<()>>,
    inserts: OnceLock<mpsc::UnboundedSender<Insert>>,
    /// The SQLite writer thread, when the database is a SQLite file.
    engine: Option<Engine>,
}

/// This process's turn to write on SQLite (nothing on PostgreSQL): held by
/// writers of the tables beside `jobs` (presence, files, storage charges),
/// so that they queue behind job writes instead of meeting them in SQLite's
/// busy handler.
pub struct WriteTurn<'a> {
    _guard: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl JobWriter {
    /// On SQLite every hot write (submits, admissions, settlements, claims)
    /// goes through a writer thread of its own on the database file (see
    /// `engine.rs`). An SQLite database without a file (in memory) has none
    /// and is refused.
    pub fn open(db: &DatabaseConnection) -> Result<Self, DbErr> {
        let mut shared = Shared::default();
        if db.get_database_backend() == DbBackend::Sqlite {
            let options = db.get_sqlite_connection_pool().connect_options();
            let path = options.get_filename();
            shared.engine = Some(Engine::open(path, Arc::clone(&shared.lock)).map_err(|error| {
                DbErr::Custom(format!(
                    "the job store needs an SQLite database file it can open ({}): {error}",
                    path.display()
                ))
            })?);
        }
        Ok(JobWriter {
            db: db.clone(),
            shared: Arc::new(shared),
        })
    }

    /// Waits for this process's turn to write (see [`WriteTurn`]).
    pub async fn turn(&self) -> WriteTurn<'_> {
        let guard = if self.db.get_database_backend() == DbBackend::Sqlite {
            Some(self.shared.lock.lock().await)
        } else {
            None
        };
        WriteTurn { _guard: guard }
    }

    /// Inserts one job row, committed when this returns. Concurrent inserts are
    /// grouped: one writer task writes whatever is queued as one multi-row
    /// `INSERT` (one commit, one fsync) and answers each caller after it.
    pub async fn insert(&self, row: &job::Model) -> Result<(), DbErr> {
        if let Some(engine) = &self.shared.engine {
            return engine.insert(row.clone()).await;
        }
        let row = row.clone().into_active_model().reset_all();
        let writer = self
            .shared
            .inserts
            .get_or_init(|| spawn_insert_writer(self.db.clone(), Arc::clone(&self.shared.lock)));
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
                let _turn = self.turn().await;
                job::Entity::insert(row)
                    .exec_without_returning(&self.db)
                    .await
                    .map(drop)
            }
        }
    }

    /// Inserts `row` if its owner has credit left, else `PaymentRequired` and
    /// nothing is written (see `credit.rs` for the rule and its bound).
    pub async fn admit(&self, row: &job::Model) -> Result<(), JobError> {
        // The SQLite writer thread admits in its own batches (one commit for
        // many), serialized by that thread.
        if let Some(engine) = &self.shared.engine {
            return match engine.admit(row.clone()).await? {
                Ok(()) => Ok(()),
                Err((balance, held)) => Err(JobError::PaymentRequired { balance, held }),
            };
        }
        let txn = self.db.begin().await?;
        // The account row is the per-user lock, taken by the transaction's
        // first statement, a write: it locks the row (admissions of one user
        // queue here, and a settlement's debit waits for this commit).
        let (balance, held) = crate::credit::lock_account(&txn, &row.user_id, row.created_at_ms).await?;
        if balance.saturating_sub(held) <= 0 {
            return Err(JobError::PaymentRequired { balance, held });
        }
        row.clone().into_active_model().reset_all().insert(&txn).await?;
        txn.commit().await?;
        Ok(())
    }

    /// Whether this writer can admit a job without writing it
    /// ([`JobWriter::reserve`]): only the SQLite writer thread can.
    pub fn reserves(&self) -> bool {
        self.shared.engine.is_some()
    }

    /// Admits `row` without writing it, if its owner has credit left, else
    /// `PaymentRequired`: its hold is reserved in the SQLite writer thread,
    /// which counts it in every later admission until a settlement writes
    /// the job or [`JobWriter::unreserve`] drops it (see `reserved.rs`).
    /// Exact only while this process admits every job of the database (its
    /// SQLite file's sole owner). An error without a writer thread
    /// (PostgreSQL): see [`JobWriter::reserves`].
    pub async fn reserve(&self, row: &job::Model) -> Result<(), JobError> {
        let Some(engine) = &self.shared.engine else {
            return Err(DbErr::Custom("only the SQLite writer thread admits jobs unwritten".into()).into());
        };
        match engine.reserve(&row.id, &row.user_id, row.hold_micro_usd).await? {
            Ok(()) => Ok(()),
            Err((balance, held)) => Err(JobError::PaymentRequired { balance, held }),
        }
    }

    /// Drops the reservations of jobs admitted unwritten that will never be
    /// written (lost with their scheduler); unknown ids are ignored.
    pub fn unreserve(&self, job_ids: &[String]) {
        if let Some(engine) = &self.shared.engine {
            engine.unreserve(job_ids.to_vec());
        }
    }

    /// Runs a settlement `plan` as one transaction: on the SQLite writer
    /// thread, or (on PostgreSQL) through sea-orm.
    pub async fn settle(&self, plan: Plan) -> Result<Settled, DbErr> {
        self.settle_or_return(plan).await.map_err(|refused| refused.error)
    }

    /// [`JobWriter::settle`], giving the plan back when it is not committed,
    /// so that a caller that retries needs no copy of every plan for the rare
    /// one that fails.
    pub async fn settle_or_return(&self, plan: Plan) -> Result<Settled, Refused> {
        if let Some(engine) = &self.shared.engine {
            return engine.settle(plan).await;
        }
        let settled = async {
            let txn = self.db.begin().await?;
            // Jobs of more than one owner: their accounts first, in order
            // (see `credit::lock_owners`); a plan too large to name in one
            // statement relies on PostgreSQL's deadlock check and a retry.
            let named = plan.steps.len() + plan.stores.len();
            if named > 1 && named <= LOCK_OWNERS_MOST {
                let ids: Vec<sea_orm::Value> = plan.steps.iter().map(|s| s.job_id().into()).collect();
                let list: Vec<String> = (1..=ids.len()).map(|n| format!("${n}")).collect();
                let condition = if ids.is_empty() {
                    "FALSE".to_owned()
                } else {
                    format!("id IN ({})", list.join(", "))
                };
                let users: Vec<&str> = plan.stores.iter().map(|s| s.row.user_id.as_str()).collect();
                crate::credit::lock_owners(&txn, &condition, ids, &users).await?;
            }
            let settled = plan::execute(&txn, &plan).await?;
            txn.commit().await?;
            Ok(settled)
        }
        .await;
        settled.map_err(|error| Refused {
            error,
            plan: Some(Box::new(plan)),
        })
    }
}

/// A settlement that was not committed: why, and its plan, given back unless
/// it was lost with the SQLite writer thread.
pub struct Refused {
    pub error: DbErr,
    pub plan: Option<Box<Plan>>,
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .field("plan_returned", &self.plan.is_some())
            .finish()
    }
}

/// Most jobs a settlement names in the statement that locks their owners'
/// accounts (PostgreSQL binds at most 65 535 values).
const LOCK_OWNERS_MOST: usize = 30_000;

/// Most rows of one grouped `INSERT` (28 bind values each: well under the
/// limits of both backends).
const INSERT_BATCH: usize = 256;

/// Grouped inserts in flight at once on PostgreSQL, where concurrent commits
/// share WAL flushes. SQLite writes one at a time anyway.
const POSTGRES_INSERTS_IN_FLIGHT: usize = 4;

/// Starts the task that writes submitted rows in groups (see [`JobWriter::insert`]).
fn spawn_insert_writer(db: DatabaseConnection, lock: Arc<tokio::sync::Mutex<()>>) -> mpsc::UnboundedSender<Insert> {
    let (sender, mut queue) = mpsc::unbounded_channel::<Insert>();
    let in_flight = match db.get_database_backend() {
        DbBackend::Postgres => POSTGRES_INSERTS_IN_FLIGHT,
        _ => 1,
    };
    let sqlite = db.get_database_backend() == DbBackend::Sqlite;
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
                let guard = if sqlite { Some(lock.lock().await) } else { None };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::path::{Path, PathBuf};

    /// Ways a statement on `jobs` is spelled: sea-orm on the entity, or SQL.
    const WRITES: [&str; 8] = [
        "job::entity::update",
        "job::entity::insert",
        "job::entity::delete",
        "job::activemodel",
        "table(job::entity)",
        "update jobs ",
        "insert into jobs",
        "delete from jobs",
    ];

    /// Every `.rs` file under `dir`, but build outputs.
    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "target") {
                    sources(&path, found);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }

    /// The statements on `jobs` in the non-test code of `file`.
    fn writes_in(file: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(file).unwrap().to_lowercase();
        // Unit tests set rows up as they need; only the code that ships counts.
        let shipped = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
        let shipped = shipped.split("#[cfg(test)]\n    mod ").next().unwrap_or_default();
        WRITES
            .iter()
            .filter(|pattern| shipped.contains(*pattern))
            .map(|pattern| (*pattern).to_owned())
            .collect()
    }

    /// The rule of this module: nothing outside it writes `jobs`. Test
    /// directories are left out (they arrange rows directly).
    #[test]
    fn nothing_outside_this_module_writes_jobs() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join("transition");
        let mut files = Vec::new();
        sources(&crates, &mut files);
        let mut outside = Vec::new();
        let mut inside = 0;
        for file in files {
            if file.components().any(|part| part.as_os_str() == "tests") {
                continue;
            }
            let writes = writes_in(&file);
            if file.starts_with(&here) {
                inside += writes.len();
            } else if !writes.is_empty() {
                outside.push(format!("{}: {}", file.display(), writes.join(", ")));
            }
        }
        assert!(
            inside >= 5,
            "the scan finds the statements of transition/ itself ({inside} found)"
        );
        assert!(
            outside.is_empty(),
            "writes of `jobs` outside crates/jobs/src/transition:\n{}",
            outside.join("\n")
        );
    }
}
