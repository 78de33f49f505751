//! The SQLite write path of the job layer: one thread owns one connection
//! (rusqlite, prepared statements cached) and runs every hot write (job
//! inserts, settlements, claims). Whatever is queued while a transaction runs
//! goes into the next one, so concurrent submits and settlements share one
//! commit, and each operation costs one hand-off to the thread and one back
//! (sqlx's SQLite driver costs one per statement and one per returned row).
//!
//! Each operation runs inside a savepoint: a failing one is rolled back alone
//! and gets its error; the others commit. Replies are sent only after the
//! commit, so a caller that hears `Ok` holds a durable write.
//!
//! The thread takes the process's write lock (the one `JobWriter::turn`
//! takes) for each transaction, so it queues behind sea-orm writes of the
//! same process instead of meeting them in SQLite's busy handler.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;

use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params};
use sea_orm::DbErr;
use tokio::sync::oneshot;

use super::Refused;
use super::plan::{Plan, Settled, Step, Usage, is_final, sqlite};
use super::reserved::Reservations;
use crate::entity::job;

/// Most operations in one transaction.
const MAX_OPS: usize = 1024;

/// One queued operation and where its result goes.
struct Op {
    work: Work,
    reply: ReplyTo,
}

enum Work {
    Insert(Box<job::Model>),
    /// Insert only if the owner has credit left (see `credit.rs`).
    Admit(Box<job::Model>),
    /// Admit a job that is not written: its hold reserved (see `reserved.rs`).
    Reserve(Box<Reserve>),
    /// These jobs will never be written: their reservations go.
    Unreserve(Vec<String>),
    Settle(Box<Plan>),
}

/// A job admitted unwritten: its id, owner and hold.
struct Reserve {
    job: String,
    user: String,
    hold: i64,
}

enum Done {
    Inserted,
    /// Reserved, or unreserved: nothing written.
    Kept,
    /// Not admitted: the owner's balance and holds.
    Refused(i64, i64),
    Settled(Settled),
}

/// An admission's outcome: inserted, or refused with (balance, held).
pub type Admission = Result<(), (i64, i64)>;

enum ReplyTo {
    Insert(oneshot::Sender<Result<(), DbErr>>),
    Admit(oneshot::Sender<Result<Admission, DbErr>>),
    Settle(oneshot::Sender<Result<Settled, Refused>>),
    /// Nobody waits for the outcome.
    Nobody,
}

impl Op {
    /// Answers the caller: a committed plan's stored final rows go with its
    /// result (see `with_stored_finals`), a refused plan goes back.
    fn answer(self, result: Result<Done, DbErr>) {
        let Op { work, reply } = self;
        match (reply, result) {
            (ReplyTo::Insert(to), Ok(_)) => drop(to.send(Ok(()))),
            (ReplyTo::Admit(to), Ok(Done::Refused(balance, held))) => drop(to.send(Ok(Err((balance, held))))),
            (ReplyTo::Admit(to), Ok(_)) => drop(to.send(Ok(Ok(())))),
            (ReplyTo::Settle(to), Ok(done)) => drop(to.send(Ok(match with_stored_finals(work, done) {
                Done::Settled(settled) => settled,
                _ => Settled::default(),
            }))),
            (ReplyTo::Nobody, Ok(_)) => {}
            (ReplyTo::Nobody, Err(error)) => tracing::warn!(%error, "SQLite writer operation failed"),
            (ReplyTo::Insert(to), Err(error)) => drop(to.send(Err(error))),
            (ReplyTo::Admit(to), Err(error)) => drop(to.send(Err(error))),
            (ReplyTo::Settle(to), Err(error)) => drop(to.send(Err(Refused {
                error,
                plan: match work {
                    Work::Settle(plan) => Some(plan),
                    _ => None,
                },
            }))),
        }
    }
}

/// Handle to the writer thread; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct Engine {
    ops: std_mpsc::Sender<Op>,
}

impl Engine {
    /// Opens a second connection to the database file at `path` and starts
    /// the writer thread; an error for an in-memory database (nothing to
    /// share), a file that cannot be opened, or a thread that cannot start.
    pub fn open(path: &Path, write_lock: Arc<tokio::sync::Mutex<()>>) -> Result<Engine, String> {
        if !path.is_file() {
            return Err("not a database file (an in-memory SQLite database cannot hold jobs)".into());
        }
        let conn = open_connection(path).map_err(|e| e.to_string())?;
        let (ops, queue) = std_mpsc::channel();
        let running = Arc::new(AtomicBool::new(true));
        let checkpoints = open_connection(path).map_err(|e| e.to_string()).and_then(|conn| {
            let running = Arc::clone(&running);
            std::thread::Builder::new()
                .name("gantry-sqlite-checkpoint".into())
                .spawn(move || checkpoint(&conn, &running))
                .map_err(|e| e.to_string())
        });
        if let Err(error) = checkpoints {
            // The writer's own automatic checkpoints still bound the log.
            tracing::warn!(%error, "no SQLite checkpoint thread");
        }
        let spawned = std::thread::Builder::new()
            .name("gantry-sqlite-writer".into())
            .spawn(move || {
                run(conn, queue, &write_lock);
                running.store(false, Ordering::Relaxed);
            });
        match spawned {
            Ok(_) => Ok(Engine { ops }),
            Err(error) => Err(format!("could not start the SQLite writer thread: {error}")),
        }
    }

    /// Inserts one job row; committed when this returns.
    pub async fn insert(&self, row: job::Model) -> Result<(), DbErr> {
        let (reply, done) = oneshot::channel();
        self.send(Op {
            work: Work::Insert(Box::new(row)),
            reply: ReplyTo::Insert(reply),
        })?;
        done.await.map_err(|_| stopped())?
    }

    /// Inserts one job row if its owner has credit left (balance minus the
    /// holds of their jobs in flight above zero), committed when this
    /// returns; else the balance and holds. Admissions are serialized by
    /// this thread: one in the same batch sees the rows of those before it.
    pub async fn admit(&self, row: job::Model) -> Result<Admission, DbErr> {
        let (reply, done) = oneshot::channel();
        self.send(Op {
            work: Work::Admit(Box::new(row)),
            reply: ReplyTo::Admit(reply),
        })?;
        done.await.map_err(|_| stopped())?
    }

    /// Admits `job` of `user` with `hold` without writing it, if its owner has
    /// credit left after the holds of their jobs in flight and of the jobs
    /// reserved before it; else the balance and holds (reserved included).
    /// The hold stays reserved until a settlement writes the job or
    /// [`Engine::unreserve`] drops it (see `reserved.rs`).
    pub async fn reserve(&self, job: &str, user: &str, hold: i64) -> Result<Admission, DbErr> {
        let (reply, done) = oneshot::channel();
        let reserve = Reserve {
            job: job.to_owned(),
            user: user.to_owned(),
            hold,
        };
        self.send(Op {
            work: Work::Reserve(Box::new(reserve)),
            reply: ReplyTo::Admit(reply),
        })?;
        done.await.map_err(|_| stopped())?
    }

    /// Drops the reservations of these jobs, which will never be written.
    /// Not waited for: every operation queued after it sees it done.
    pub fn unreserve(&self, jobs: Vec<String>) {
        if !jobs.is_empty() {
            // A stopped writer keeps no reservations.
            let _ = self.send(Op {
                work: Work::Unreserve(jobs),
                reply: ReplyTo::Nobody,
            });
        }
    }

    /// Runs a settlement plan in one transaction; committed when this returns,
    /// or refused with the plan given back.
    pub async fn settle(&self, plan: Plan) -> Result<Settled, Refused> {
        let (reply, done) = oneshot::channel();
        let op = Op {
            work: Work::Settle(Box::new(plan)),
            reply: ReplyTo::Settle(reply),
        };
        if let Err(std_mpsc::SendError(op)) = self.ops.send(op) {
            return Err(Refused {
                error: stopped(),
                plan: match op.work {
                    Work::Settle(plan) => Some(plan),
                    _ => None,
                },
            });
        }
        // The writer thread ended with the plan: it is lost.
        done.await.unwrap_or_else(|_| {
            Err(Refused {
                error: stopped(),
                plan: None,
            })
        })
    }

    fn send(&self, op: Op) -> Result<(), DbErr> {
        self.ops.send(op).map_err(|_| stopped())
    }
}

fn stopped() -> DbErr {
    DbErr::Custom("the SQLite writer stopped".into())
}

fn db_err(error: rusqlite::Error) -> DbErr {
    DbErr::Custom(format!("sqlite: {error}"))
}

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // The same settings as the sea-orm pool's connections (WAL is a property
    // of the file, set by the pool).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // 64 MiB of page cache: this connection is the process's only writer, so
    // its cache stays valid between transactions.
    conn.pragma_update(None, "cache_size", -65_536)?;
    // Checkpoints normally run on their own thread (see `checkpoint`); this
    // one only steps in if that thread falls far behind.
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Pages in the write-ahead log after which the writer checkpoints itself.
const WRITER_AUTOCHECKPOINT: i64 = 20_000;

/// How often the checkpoint thread copies the log into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Copies committed pages from the log into the database file (`PASSIVE`:
/// never waits for, nor blocks, the writer or readers), so the writer's
/// commits only append to the log. Ends when the writer thread has ended.
fn checkpoint(conn: &Connection, running: &AtomicBool) {
    while running.load(Ordering::Relaxed) {
        std::thread::sleep(CHECKPOINT_EVERY);
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(%error, "checkpoint failed; trying again");
        }
    }
}

fn run(mut conn: Connection, queue: std_mpsc::Receiver<Op>, write_lock: &tokio::sync::Mutex<()>) {
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_OPS);
    let mut reserved = Reservations::default();
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < MAX_OPS {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let guard = write_lock.blocking_lock();
        commit_batch(&mut conn, &mut reserved, std::mem::take(&mut batch));
        drop(guard);
    }
}

/// Runs the batch in one transaction. If an operation fails, the
/// transaction is rolled back and each operation is run again in one of its
/// own, so that only the failing one fails (no savepoints: a savepoint makes
/// SQLite journal every page it touches a second time).
fn commit_batch(conn: &mut Connection, reserved: &mut Reservations, ops: Vec<Op>) {
    let works: Vec<&Work> = ops.iter().map(|op| &op.work).collect();
    match run_all(conn, reserved, &works) {
        Ok(results) => {
            for (op, result) in ops.into_iter().zip(results) {
                op.answer(Ok(result));
            }
        }
        Err(error) if ops.len() == 1 => {
            for op in ops {
                op.answer(Err(copy(&error)));
            }
        }
        Err(_) => {
            for op in ops {
                let result = run_all(conn, reserved, &[&op.work]).map(|mut done| done.remove(0));
                op.answer(result);
            }
        }
    }
}

/// Puts the final rows a committed plan stored whole (see `settle`) in front
/// of the finals its steps returned, moved rather than copied.
fn with_stored_finals(work: Work, done: Done) -> Done {
    match (work, done) {
        (Work::Settle(plan), Done::Settled(mut settled)) if !plan.stores.is_empty() => {
            let plan = *plan;
            let mut finals: Vec<job::Model> = plan.stores.into_iter().map(|s| s.row).filter(is_final).collect();
            finals.append(&mut settled.finals);
            settled.finals = finals;
            Done::Settled(settled)
        }
        (_, done) => done,
    }
}

/// One transaction for `works`; all commit, or none does (the
/// reservations it changed included).
fn run_all(conn: &mut Connection, reserved: &mut Reservations, works: &[&Work]) -> Result<Vec<Done>, DbErr> {
    let result = run_all_once(conn, reserved, works);
    match result {
        Ok(_) => reserved.commit(),
        Err(_) => reserved.roll_back(),
    }
    result
}

fn run_all_once(conn: &mut Connection, reserved: &mut Reservations, works: &[&Work]) -> Result<Vec<Done>, DbErr> {
    let txn = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(db_err)?;
    let mut done = Vec::with_capacity(works.len());
    {
        let mut statements = Statements::new(&txn);
        for work in works {
            done.push(
                match work {
                    Work::Insert(row) => statements.insert(row).map(|()| Done::Inserted),
                    Work::Admit(row) => statements.admit(row, reserved.of(&row.user_id)),
                    Work::Reserve(job) => statements.reserve(job, reserved),
                    Work::Unreserve(jobs) => {
                        jobs.iter().for_each(|job| reserved.remove(job));
                        Ok(Done::Kept)
                    }
                    Work::Settle(plan) => settle(&mut statements, plan).map(|settled| {
                        // Written now: their rows hold them, or they are final.
                        plan.stores.iter().for_each(|store| reserved.remove(&store.row.id));
                        Done::Settled(settled)
                    }),
                }
                .map_err(db_err)?,
            );
        }
    }
    txn.commit().map_err(db_err)?;
    Ok(done)
}

fn copy(error: &DbErr) -> DbErr {
    DbErr::Custom(error.to_string())
}

/// The statements one transaction runs again and again (an insert and a
/// charge per job, a completion per job), each looked up in rusqlite's cache
/// once per transaction instead of once per job (the lookup hashes the whole
/// SQL text).
struct Statements<'c> {
    conn: &'c Connection,
    insert: Option<CachedStatement<'c>>,
    charge: Option<CachedStatement<'c>>,
    complete: Option<CachedStatement<'c>>,
}

impl<'c> Statements<'c> {
    fn new(conn: &'c Connection) -> Self {
        Statements {
            conn,
            insert: None,
            charge: None,
            complete: None,
        }
    }

    fn prepared<'s>(
        conn: &'c Connection,
        slot: &'s mut Option<CachedStatement<'c>>,
        sql: &str,
    ) -> rusqlite::Result<&'s mut CachedStatement<'c>> {
        Ok(match slot {
            Some(statement) => statement,
            empty @ None => empty.insert(conn.prepare_cached(sql)?),
        })
    }

    fn insert(&mut self, row: &job::Model) -> rusqlite::Result<()> {
        let statement = Self::prepared(self.conn, &mut self.insert, &sqlite::INSERT_JOB)?;
        statement.execute(params![
            row.id,
            row.user_id,
            row.model,
            row.status,
            row.input,
            row.output,
            row.error,
            row.webhook,
            row.low_priority,
            row.sync,
            row.execution_timeout_ms,
            row.ttl_ms,
            row.attempt,
            row.max_attempts,
            row.retries,
            row.worker_id,
            row.owner,
            row.lease_until_ms,
            row.run_deadline_ms,
            row.created_at_ms,
            row.queued_at_ms,
            row.started_at_ms,
            row.completed_at_ms,
            row.expires_at_ms,
            row.cost_micro_usd,
            row.usage_unit,
            row.usage_quantity_micros,
            row.chunks_read,
            row.webhook_due_ms,
            row.trace_context,
            row.files,
            row.hold_micro_usd,
            row.worker_timings,
        ])?;
        Ok(())
    }

    /// `user`'s balance and the holds of their jobs in flight, which the
    /// triggers on `jobs` sum in the account row (see credit.rs), plus
    /// `reserved`: the holds of their jobs admitted unwritten.
    fn standing(&self, user: &str, reserved: i64) -> rusqlite::Result<(i64, i64)> {
        let (balance, held): (i64, i64) = self
            .conn
            .prepare_cached("SELECT balance_micro_usd, held_micro_usd FROM credit_accounts WHERE user_id = ?1")?
            .query_row(params![user], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
            .unwrap_or((0, 0));
        Ok((balance, held.saturating_add(reserved)))
    }

    /// `row` inserted if its owner has credit left, else `Refused`.
    fn admit(&mut self, row: &job::Model, reserved: i64) -> rusqlite::Result<Done> {
        let (balance, held) = self.standing(&row.user_id, reserved)?;
        if balance.saturating_sub(held) <= 0 {
            return Ok(Done::Refused(balance, held));
        }
        self.insert(row)?;
        Ok(Done::Inserted)
    }

    /// `job`'s hold reserved if its owner has credit left, else `Refused`.
    fn reserve(&mut self, job: &Reserve, reserved: &mut Reservations) -> rusqlite::Result<Done> {
        let (balance, held) = self.standing(&job.user, reserved.of(&job.user))?;
        if balance.saturating_sub(held) <= 0 {
            return Ok(Done::Refused(balance, held));
        }
        reserved.add(&job.job, &job.user, job.hold);
        Ok(Done::Kept)
    }

    /// The `files` rows of a completed job (none when it has no files).
    fn files(&mut self, row: &job::Model, lifetime_ms: i64) -> rusqlite::Result<()> {
        if row.files.is_none() {
            return Ok(());
        }
        let mut statement = self.conn.prepare_cached(sqlite::INSERT_FILE)?;
        for file in crate::entity::file::of_job(row, lifetime_ms) {
            statement.execute(params![
                file.key,
                file.job_id,
                file.user_id,
                file.media_type,
                file.size,
                file.created_at_ms,
                file.expires_at_ms
            ])?;
        }
        Ok(())
    }

    /// The ledger entry of a completed job (at most one per job), and the
    /// debit of its owner's balance when the entry is new: billing's
    /// statements (`gantry_billing::RECORD_ONE_SQL`, `credit::ADJUST_ONE_SQL`),
    /// run in this transaction.
    fn charge(&mut self, row: &job::Model, usage: &Usage, now: i64) -> rusqlite::Result<()> {
        let statement = Self::prepared(self.conn, &mut self.charge, gantry_billing::RECORD_ONE_SQL)?;
        let written = statement.execute(params![
            gantry_billing::entry_id(&row.id),
            row.user_id,
            row.id,
            row.model,
            usage.unit,
            usage.quantity_micros,
            usage.amount,
            now
        ])?;
        if written == 1 {
            let mut debit = self.conn.prepare_cached(gantry_billing::credit::ADJUST_ONE_SQL)?;
            debit.execute(params![row.user_id, -usage.amount, now])?;
        }
        Ok(())
    }
}

fn job_of(row: &Row<'_>) -> rusqlite::Result<job::Model> {
    Ok(job::Model {
        id: row.get(0)?,
        user_id: row.get(1)?,
        model: row.get(2)?,
        status: row.get(3)?,
        input: row.get(4)?,
        output: row.get(5)?,
        error: row.get(6)?,
        webhook: row.get(7)?,
        low_priority: row.get(8)?,
        sync: row.get(9)?,
        execution_timeout_ms: row.get(10)?,
        ttl_ms: row.get(11)?,
        attempt: row.get(12)?,
        max_attempts: row.get(13)?,
        retries: row.get(14)?,
        worker_id: row.get(15)?,
        owner: row.get(16)?,
        lease_until_ms: row.get(17)?,
        run_deadline_ms: row.get(18)?,
        created_at_ms: row.get(19)?,
        queued_at_ms: row.get(20)?,
        started_at_ms: row.get(21)?,
        completed_at_ms: row.get(22)?,
        expires_at_ms: row.get(23)?,
        cost_micro_usd: row.get(24)?,
        usage_unit: row.get(25)?,
        usage_quantity_micros: row.get(26)?,
        chunks_read: row.get(27)?,
        webhook_due_ms: row.get(28)?,
        trace_context: row.get(29)?,
        files: row.get(30)?,
        hold_micro_usd: row.get(31)?,
        worker_timings: row.get(32)?,
    })
}

/// The plan's statements, in the order `plan::execute` runs them.
fn settle(statements: &mut Statements<'_>, plan: &Plan) -> rusqlite::Result<Settled> {
    let conn = statements.conn;
    let mut settled = Settled::default();
    for store in &plan.stores {
        statements.insert(&store.row)?;
        if let Some(usage) = &store.charge {
            statements.charge(&store.row, usage, plan.now)?;
            statements.files(&store.row, plan.file_lifetime_ms)?;
        }
        // Its final row joins `settled.finals` after the commit
        // (`with_stored_finals`), moved out of the plan.
    }
    if !plan.chunks.is_empty() {
        let mut statement = conn.prepare_cached(sqlite::INSERT_CHUNK)?;
        for (job_id, seq, output) in &plan.chunks {
            statement.execute(params![job_id, seq, output])?;
        }
    }
    if !plan.progress.is_empty() {
        let mut statement = conn.prepare_cached(sqlite::UPSERT_PROGRESS)?;
        for (job_id, attempt, message) in &plan.progress {
            statement.execute(params![job_id, attempt, message, plan.now])?;
        }
    }
    for step in &plan.steps {
        match step {
            Step::Complete {
                job_id,
                attempt,
                worker_id,
                output,
                usage,
                files,
                timings,
            } => {
                let complete = Statements::prepared(conn, &mut statements.complete, &sqlite::COMPLETE_JOB)?;
                let row = complete
                    .query_row(
                        params![
                            job_id,
                            attempt,
                            output,
                            worker_id,
                            usage.amount,
                            usage.unit,
                            usage.quantity_micros,
                            plan.now,
                            plan.sync_until,
                            plan.async_until,
                            files,
                            timings
                        ],
                        job_of,
                    )
                    .optional()?;
                let Some(row) = row else { continue };
                statements.charge(&row, usage, plan.now)?;
                statements.files(&row, plan.file_lifetime_ms)?;
                settled.finals.push(row);
            }
            Step::Finish {
                job_id,
                attempt,
                status,
                error,
                worker_id,
            } => {
                let mut finish = conn.prepare_cached(&sqlite::FINISH_JOB)?;
                let row = finish
                    .query_row(
                        params![
                            job_id,
                            attempt,
                            status.as_str(),
                            plan.now,
                            plan.sync_until,
                            plan.async_until,
                            error,
                            worker_id
                        ],
                        job_of,
                    )
                    .optional()?;
                settled.finals.extend(row);
            }
            Step::Requeue { job_id, attempt, error } => {
                let mut requeue = conn.prepare_cached(&sqlite::REQUEUE_JOB)?;
                let row = requeue
                    .query_row(
                        params![job_id, attempt, error, plan.now, plan.sync_until, plan.async_until],
                        job_of,
                    )
                    .optional()?;
                settled.finals.extend(row.filter(is_final));
            }
        }
    }
    for (model, limit) in &plan.claims {
        let mut claim = conn.prepare_cached(&sqlite::CLAIM_JOBS)?;
        let most = i64::try_from(*limit).unwrap_or(i64::MAX);
        let rows = claim
            .query_map(params![model, plan.instance, plan.lease_until, plan.now, most], job_of)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        settled.claims.push((model.clone(), *limit, rows));
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use gantry_migrations::MigratorTrait;
    use sea_orm::{ConnectionTrait, Database, EntityTrait, PaginatorTrait};

    fn row(id: &str) -> job::Model {
        job::sample(id, "m")
    }

    /// A migrated SQLite file in WAL mode (kept while the directory lives),
    /// its sea-orm pool, and a writer on it.
    async fn migrated_engine() -> (tempfile::TempDir, sea_orm::DatabaseConnection, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let db = Database::connect(format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        db.execute_unprepared("PRAGMA journal_mode=WAL").await.unwrap();
        gantry_migrations::Migrator::up(&db, None).await.unwrap();
        let engine = Engine::open(&path, Arc::new(tokio::sync::Mutex::new(()))).expect("engine");
        (dir, db, engine)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_operation_fails_alone_and_the_rest_commit() {
        let (_dir, db, engine) = migrated_engine().await;
        engine.insert(row("a")).await.unwrap();

        // Sent together, so they usually share a transaction; either way the
        // duplicate fails and the others are committed.
        let (b, dup, c) = tokio::join!(
            engine.insert(row("b")),
            engine.insert(row("a")),
            engine.insert(row("c"))
        );
        b.unwrap();
        c.unwrap();
        assert!(dup.is_err(), "a duplicate id is refused");
        assert_eq!(job::Entity::find().count(&db).await.unwrap(), 3);

        // A claim and a completion as one plan, seen by the sea-orm pool.
        let config = crate::SchedulerConfig::default();
        let mut plan = Plan::new(10, &config, "sched-1");
        plan.claims.push(("m".into(), 2));
        let settled = engine.settle(plan).await.unwrap();
        let claimed: Vec<&str> = settled.claims[0].2.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(claimed, ["a", "b"], "oldest first, at most the limit");
        let mut plan = Plan::new(20, &config, "sched-1");
        plan.steps.push(Step::Complete {
            job_id: "a".into(),
            attempt: 1,
            worker_id: "w".into(),
            output: "{}".into(),
            usage: Usage {
                unit: "request".into(),
                quantity_micros: 1_000_000,
                amount: 10,
            },
            files: Some(r#"[{"pointer":"/image_url","key":"jobs/a/1/0.png","media_type":"image/png","size":3,"created_ms":20}]"#.into()),
            timings: None,
        });
        // A stale attempt changes nothing, charges nothing and records no file.
        plan.steps.push(Step::Complete {
            job_id: "b".into(),
            attempt: 7,
            worker_id: "w".into(),
            output: "{}".into(),
            usage: Usage {
                unit: "request".into(),
                quantity_micros: 1_000_000,
                amount: 10,
            },
            files: Some(r#"[{"pointer":"/image_url","key":"jobs/b/7/0.png","media_type":"image/png","size":3,"created_ms":20}]"#.into()),
            timings: None,
        });
        let settled = engine.settle(plan).await.unwrap();
        assert_eq!(settled.finals.len(), 1);
        assert_eq!(settled.finals[0].status, "COMPLETED");
        let a = job::Entity::find_by_id("a").one(&db).await.unwrap().unwrap();
        assert_eq!((a.status.as_str(), a.cost_micro_usd), ("COMPLETED", Some(10)));
        let b = job::Entity::find_by_id("b").one(&db).await.unwrap().unwrap();
        assert_eq!(b.status, "IN_PROGRESS");
        let charges = db
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Sqlite,
                "SELECT COUNT(*) AS n FROM ledger_entries",
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(charges.try_get::<i64>("", "n").unwrap(), 1);
        let files = crate::entity::file::Entity::find().all(&db).await.unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].key.as_str(), files[0].job_id.as_str()),
            ("jobs/a/1/0.png", "a")
        );
        assert_eq!(files[0].expires_at_ms, 20 + 7 * 24 * 3600 * 1000);
        assert!(a.files.is_some_and(|f| f.contains("jobs/a/1/0.png")));
    }

    /// What the writer thread spends per `runsync` job written once (final
    /// row and charge), in batches of the size the benchmark's settlements
    /// have at 64 connections. Single-threaded, so far steadier than the
    /// whole-platform benchmark; for comparing write-path changes by hand:
    /// `cargo test -p gantry-scheduler --profile fastrel --lib writer_cost -- --ignored --nocapture`.
    #[tokio::test(flavor = "current_thread")]
    #[ignore = "cost probe; run by hand"]
    async fn writer_cost_per_job() {
        const PER_PLAN: usize = 21;
        const PLANS: usize = 3000;
        let (_dir, _db, engine) = migrated_engine().await;
        let config = crate::SchedulerConfig::default();
        let start = crate::db::now_ms();
        let mut n = 0u64;
        let mut timed = std::time::Duration::ZERO;
        let cpu_before = writer_cpu_seconds();
        for round in 0..PLANS {
            let now = start + i64::try_from(round).unwrap();
            let mut plan = Plan::new(now, &config, "sched-4e72be40568dc358");
            for _ in 0..PER_PLAN {
                n += 1;
                let mut row = job::sample(&crate::db::new_job_id(now), "gantry-echo");
                row.user_id = "usr_9ftzrejvyplsdjhd".into();
                row.input = r#"{"prompt":"hello from the benchmark"}"#.into();
                row.sync = true;
                row.attempt = 1;
                row.owner = Some(plan.instance.clone());
                row.started_at_ms = Some(now);
                row.lease_until_ms = Some(now + 30_000);
                row.run_deadline_ms = Some(now + 600_000);
                let usage = Usage {
                    unit: "requests".into(),
                    quantity_micros: 1_000_000,
                    amount: 10,
                };
                let output = r#"{"cost":0.00001,"prompt":"hello from the benchmark"}"#.to_string();
                let row = plan.completed(row, "gantry-echo-bundled-22712", output, &usage, None, None);
                plan.stores.push(crate::transition::plan::Store {
                    row,
                    charge: Some(usage),
                });
            }
            let began = std::time::Instant::now();
            let settled = engine.settle(plan).await.unwrap();
            timed += began.elapsed();
            assert_eq!(settled.finals.len(), PER_PLAN);
        }
        let cpu = writer_cpu_seconds() - cpu_before;
        println!(
            "writer: {n} jobs in plans of {PER_PLAN}: {:.2} us per job (wall), {:.2} us of the writer thread's CPU",
            timed.as_secs_f64() * 1e6 / n as f64,
            cpu * 1e6 / n as f64
        );
    }

    /// CPU time (user and system) of this process's `gantry-sqlite-writer` thread, from /proc.
    fn writer_cpu_seconds() -> f64 {
        let mut total = 0.0;
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("gantry-sqlite-w") {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
            let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
            let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
            total += ticks / 100.0;
        }
        total
    }
}
