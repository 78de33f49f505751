//! One test per transition of `jobs`, each run on SQLite (a migrated
//! database file, written by the writer thread) and on PostgreSQL (a fresh
//! database). Each sets up rows that its guard matches and rows it must
//! leave alone, runs the transition, and checks every column of every row
//! afterwards: against the transition's in-memory form where it has one
//! (`Plan::completed` and its siblings), else against the row built by
//! hand. Last, the rows the two backends end with must be the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gantry_migrations::MigratorTrait;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, EntityTrait, QueryOrder};

use super::JobWriter;
use super::Retention;
use super::plan::{Plan, Step, Usage};
use crate::SchedulerConfig;
use crate::entity::{chunk, job, progress};
use crate::types::{JobError, JobStatus};

/// The time every transition runs at.
const NOW: i64 = 1_000_000;
/// The TTL deadline of the jobs not finished yet.
const TTL_END: i64 = NOW + 60_000;
/// The retention end of the jobs that finished before the test.
const KEPT_UNTIL: i64 = NOW + 5_000;

/// One backend under test: its pool, a writer on it, and what keeps the
/// database alive (dropped last, after the pool and the writer).
struct Backend {
    name: &'static str,
    db: DatabaseConnection,
    writer: JobWriter,
    _keep: Box<dyn std::any::Any + Send>,
}

/// A migrated SQLite database file in WAL mode, and a fresh migrated
/// PostgreSQL database.
async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let sqlite = Database::connect(format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    sqlite.execute_unprepared("PRAGMA journal_mode=WAL").await.unwrap();
    gantry_migrations::Migrator::up(&sqlite, None).await.unwrap();
    let pg = gantry_testkit::PgDatabase::create().await;
    let postgres = Database::connect(&pg.url).await.unwrap();
    gantry_migrations::Migrator::up(&postgres, None).await.unwrap();
    vec![
        Backend {
            name: "sqlite",
            writer: JobWriter::open(&sqlite).unwrap(),
            db: sqlite,
            _keep: Box::new(dir),
        },
        Backend {
            name: "postgres",
            writer: JobWriter::open(&postgres).unwrap(),
            db: postgres,
            _keep: Box::new(pg),
        },
    ]
}

impl Backend {
    /// Inserts `rows` through the writer; they read back exactly as given.
    async fn seed(&self, rows: &[job::Model]) {
        for row in rows {
            self.writer.insert(row).await.unwrap();
        }
        let mut given = rows.to_vec();
        given.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(
            self.rows().await,
            given,
            "{}: the rows read back as inserted",
            self.name
        );
    }

    async fn row(&self, id: &str) -> job::Model {
        job::Entity::find_by_id(id)
            .one(&self.db)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no job {id}", self.name))
    }

    /// Every job, by id.
    async fn rows(&self) -> Vec<job::Model> {
        job::Entity::find()
            .order_by_asc(job::Column::Id)
            .all(&self.db)
            .await
            .unwrap()
    }

    /// One integer the query returns (column `n`).
    async fn number(&self, sql: &str) -> i64 {
        self.db
            .query_one_raw(sea_orm::Statement::from_string(self.db.get_database_backend(), sql))
            .await
            .unwrap()
            .unwrap()
            .try_get::<i64>("", "n")
            .unwrap()
    }

    /// Checks that the rows of `expected` are in the database exactly as
    /// given, and that no other job is.
    async fn holds(&self, expected: &[job::Model]) {
        let mut expected = expected.to_vec();
        expected.sort_by(|a, b| a.id.cmp(&b.id));
        let rows = self.rows().await;
        assert_eq!(
            rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            expected.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            "{}: the jobs in the database",
            self.name
        );
        for (row, want) in rows.iter().zip(&expected) {
            assert_eq!(row, want, "{}: job {}", self.name, want.id);
        }
        // The holds each account keeps (the triggers on `jobs`) are the sum
        // over its owner's queued and running jobs.
        assert_eq!(
            self.totals(
                "SELECT user_id, held_micro_usd FROM credit_accounts \
                 WHERE held_micro_usd <> 0 ORDER BY user_id"
            )
            .await,
            self.totals(
                "SELECT user_id, CAST(SUM(hold_micro_usd) AS BIGINT) FROM jobs \
                 WHERE status IN ('IN_QUEUE', 'IN_PROGRESS') GROUP BY user_id \
                 HAVING SUM(hold_micro_usd) <> 0 ORDER BY user_id"
            )
            .await,
            "{}: the accounts' holds against their jobs in flight",
            self.name
        );
    }

    /// (user, amount) rows of a query.
    async fn totals(&self, sql: &str) -> Vec<(String, i64)> {
        self.db
            .query_all_raw(sea_orm::Statement::from_string(self.db.get_database_backend(), sql))
            .await
            .unwrap()
            .iter()
            .map(|row| (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap()))
            .collect()
    }
}

/// The rows both backends ended with are the same.
fn same_on_both(ends: &[Vec<job::Model>]) {
    assert_eq!(ends.len(), 2);
    assert_eq!(ends[0], ends[1], "SQLite and PostgreSQL end with different rows");
}

fn config() -> SchedulerConfig {
    SchedulerConfig::default()
}

fn plan() -> Plan {
    Plan::new(NOW, &config(), "sched-1")
}

fn retention() -> Retention {
    Retention::of(&config(), NOW)
}

/// A queued job of user "u" on model "m", within its TTL.
fn queued(id: &str) -> job::Model {
    let mut row = job::sample(id, "m");
    row.created_at_ms = 100;
    row.queued_at_ms = 100;
    row.expires_at_ms = TTL_END;
    // Different for each job, so that a total that moves the wrong job's
    // hold does not add up.
    row.hold_micro_usd = 10 + id.len() as i64;
    row
}

/// Attempt `attempt` of a job, running on worker "w0" for scheduler "sched-1".
fn running(id: &str, attempt: i32) -> job::Model {
    let mut row = queued(id);
    row.status = JobStatus::InProgress.as_str().into();
    row.attempt = attempt;
    row.owner = Some("sched-1".into());
    row.worker_id = Some("w0".into());
    row.started_at_ms = Some(NOW - 500);
    row.lease_until_ms = Some(NOW + 20_000);
    row.run_deadline_ms = Some(NOW + 500);
    row
}

/// A job that finished with `status` before the test (attempt 1 of
/// "sched-1"), kept until `KEPT_UNTIL`.
fn finished(id: &str, status: JobStatus) -> job::Model {
    let mut row = running(id, 1);
    row.status = status.as_str().into();
    row.completed_at_ms = Some(NOW - 100);
    row.expires_at_ms = KEPT_UNTIL;
    row.lease_until_ms = None;
    row
}

fn usage(amount: i64) -> Usage {
    Usage {
        unit: "requests".into(),
        quantity_micros: 1_000_000,
        amount,
    }
}

fn complete(job_id: &str, attempt: i64, output: &str, amount: i64) -> Step {
    Step::Complete {
        job_id: job_id.into(),
        attempt,
        worker_id: "w1".into(),
        output: output.into(),
        usage: usage(amount),
        files: None,
        timings: Some(r#"{"queueMs":1,"loadMs":2,"runMs":3}"#.into()),
    }
}

fn ids(rows: &[job::Model]) -> Vec<&str> {
    let mut ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_string()).collect()
}

// ---- settlement steps, against their in-memory forms ----

/// `Step::Complete` leaves what `Plan::completed` builds, charges the job
/// once (ledger entry and debit) and records its files; a stale attempt, a
/// job no longer running and a repeated completion change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_writes_what_plan_completed_builds() {
    let files =
        r#"[{"pointer":"/image_url","key":"jobs/a/1/0.png","media_type":"image/png","size":3,"created_ms":20}]"#;
    let mut ends = Vec::new();
    for b in backends().await {
        let a = running("a", 1);
        let mut s = running("s", 2);
        s.sync = true;
        s.error = Some("an earlier attempt failed".into());
        let stale = running("stale", 2);
        let cancelled = finished("cancelled", JobStatus::Cancelled);
        b.seed(&[a.clone(), s.clone(), stale.clone(), cancelled.clone()]).await;

        let plan = plan();
        let mut steps = vec![
            complete("a", 1, r#"{"out":"a"}"#, 10),
            complete("s", 2, r#"{"out":"s"}"#, 7),
            complete("stale", 1, r#"{"out":"stale"}"#, 5),
            complete("cancelled", 1, r#"{"out":"late"}"#, 5),
        ];
        if let Step::Complete { files: f, .. } = &mut steps[0] {
            *f = Some(files.into());
        }
        let mut settle = plan.clone();
        settle.steps = steps;
        let settled = b.writer.settle(settle).await.unwrap();
        assert_eq!(ids(&settled.finals), ["a", "s"], "{}: the rows completed", b.name);

        let timings = Some(r#"{"queueMs":1,"loadMs":2,"runMs":3}"#.to_string());
        let want_a = plan.completed(
            a,
            "w1",
            r#"{"out":"a"}"#.into(),
            &usage(10),
            Some(files.into()),
            timings.clone(),
        );
        let want_s = plan.completed(s, "w1", r#"{"out":"s"}"#.into(), &usage(7), None, timings);
        assert_eq!(want_s.expires_at_ms, plan.sync_until);
        assert_eq!(want_a.expires_at_ms, plan.async_until);
        b.holds(&[want_a.clone(), want_s.clone(), stale.clone(), cancelled.clone()])
            .await;
        for row in &settled.finals {
            assert_eq!(
                row,
                &b.row(&row.id).await,
                "{}: the returned row is the stored one",
                b.name
            );
        }

        // The same completion again (a duplicate result) changes nothing.
        let mut again = Plan::new(NOW + 1, &config(), "sched-1");
        again.steps.push(complete("a", 1, r#"{"out":"twice"}"#, 10));
        let settled = b.writer.settle(again).await.unwrap();
        assert!(settled.finals.is_empty(), "{}: a repeated completion", b.name);
        b.holds(&[want_a, want_s, stale, cancelled]).await;

        let ledger = (
            b.number("SELECT COUNT(*) AS n FROM ledger_entries").await,
            b.number("SELECT CAST(COALESCE(SUM(amount_micro_usd), 0) AS BIGINT) AS n FROM ledger_entries")
                .await,
            b.number("SELECT balance_micro_usd AS n FROM credit_accounts WHERE user_id = 'u'")
                .await,
        );
        assert_eq!(ledger, (2, 17, -17), "{}: one charge per completed job", b.name);
        let stored: Vec<(String, String)> = crate::entity::file::Entity::find()
            .all(&b.db)
            .await
            .unwrap()
            .into_iter()
            .map(|f| (f.key, f.job_id))
            .collect();
        assert_eq!(stored, [("jobs/a/1/0.png".to_string(), "a".to_string())], "{}", b.name);
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `Step::Finish` leaves what `Plan::finished` builds: an error and a worker
/// given are written, `None` keeps the old ones; a stale attempt and a job
/// not running change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_writes_what_plan_finished_builds() {
    let mut ends = Vec::new();
    for b in backends().await {
        let given = running("given", 1);
        let mut kept = running("kept", 2);
        kept.sync = true;
        kept.error = Some("the old error".into());
        let stale = running("stale", 2);
        let mut requeued = queued("requeued");
        requeued.attempt = 1;
        b.seed(&[given.clone(), kept.clone(), stale.clone(), requeued.clone()])
            .await;

        let mut plan = plan();
        plan.steps = vec![
            Step::Finish {
                job_id: "given".into(),
                attempt: 1,
                status: JobStatus::Cancelled,
                error: Some("cancelled by the worker".into()),
                worker_id: Some("w1".into()),
            },
            Step::Finish {
                job_id: "kept".into(),
                attempt: 2,
                status: JobStatus::Failed,
                error: None,
                worker_id: None,
            },
            Step::Finish {
                job_id: "stale".into(),
                attempt: 1,
                status: JobStatus::Failed,
                error: Some("stale".into()),
                worker_id: None,
            },
            Step::Finish {
                job_id: "requeued".into(),
                attempt: 1,
                status: JobStatus::Failed,
                error: Some("not running".into()),
                worker_id: None,
            },
        ];
        let settled = b.writer.settle(plan.clone()).await.unwrap();
        assert_eq!(ids(&settled.finals), ["given", "kept"], "{}", b.name);

        let want_given = plan.finished(
            given,
            JobStatus::Cancelled,
            Some("cancelled by the worker".into()),
            Some("w1".into()),
        );
        let want_kept = plan.finished(kept, JobStatus::Failed, None, None);
        assert_eq!(want_given.error.as_deref(), Some("cancelled by the worker"));
        assert_eq!(
            (want_kept.error.as_deref(), want_kept.worker_id.as_deref()),
            (Some("the old error"), Some("w0"))
        );
        b.holds(&[want_given, want_kept, stale, requeued]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `Step::Requeue` with attempts left: back to IN_QUEUE, one more retry, as
/// `Plan::requeued` builds; not a final row. A stale attempt changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_with_attempts_left_queues_the_job_again() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut more = running("more", 1);
        more.retries = 1;
        let stale = running("stale", 2);
        b.seed(&[more.clone(), stale.clone()]).await;

        let mut plan = plan();
        for (id, attempt) in [("more", 1), ("stale", 1)] {
            plan.steps.push(Step::Requeue {
                job_id: id.into(),
                attempt,
                error: "worker lost".into(),
            });
        }
        let settled = b.writer.settle(plan.clone()).await.unwrap();
        assert!(settled.finals.is_empty(), "{}: a requeued job is not final", b.name);

        let want = plan.requeued(more, "worker lost");
        assert_eq!(
            (
                want.status.as_str(),
                want.retries,
                want.queued_at_ms,
                want.expires_at_ms
            ),
            ("IN_QUEUE", 2, NOW, TTL_END)
        );
        assert_eq!(
            (want.owner.as_deref(), want.lease_until_ms, want.run_deadline_ms),
            (None, None, None)
        );
        b.holds(&[want, stale]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `Step::Requeue` out of attempts: FAILED with the error and the retention
/// of its mode, as `Plan::requeued` builds; a final row. A job not running
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_out_of_attempts_fails_the_job() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut spent = running("spent", 3);
        spent.sync = true;
        let done = finished("done", JobStatus::Completed);
        b.seed(&[spent.clone(), done.clone()]).await;

        let mut plan = plan();
        for id in ["spent", "done"] {
            plan.steps.push(Step::Requeue {
                job_id: id.into(),
                attempt: if id == "spent" { 3 } else { 1 },
                error: "worker lost".into(),
            });
        }
        let settled = b.writer.settle(plan.clone()).await.unwrap();
        assert_eq!(ids(&settled.finals), ["spent"], "{}", b.name);

        let want = plan.requeued(spent, "worker lost");
        assert_eq!(
            (
                want.status.as_str(),
                want.retries,
                want.completed_at_ms,
                want.expires_at_ms
            ),
            ("FAILED", 0, Some(NOW), plan.sync_until)
        );
        assert_eq!(settled.finals[0], want, "{}: the returned row", b.name);
        b.holds(&[want, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// A claim takes queued, unexpired jobs of its model, normal priority first
/// and then by id, up to its limit: IN_PROGRESS, the next attempt, owned and
/// leased by the plan's instance, started now, no worker yet, and a run
/// deadline of now plus the job's execution timeout (the lease as
/// `Plan::running` sets it). Other models, expired, running and finished
/// jobs are not taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_takes_queued_jobs_of_its_model() {
    let mut ends = Vec::new();
    for b in backends().await {
        // Requeued after a lost attempt: the old worker is cleared.
        let mut c1 = queued("c1");
        c1.attempt = 1;
        c1.retries = 1;
        c1.worker_id = Some("w-old".into());
        c1.error = Some("worker lost".into());
        let mut c2 = queued("c2");
        c2.execution_timeout_ms = 7_000;
        let mut c0_low = queued("c0-low");
        c0_low.low_priority = true;
        let mut other = queued("other");
        other.model = "n".into();
        let mut expired = queued("expired");
        expired.expires_at_ms = NOW;
        let busy = running("busy", 1);
        let done = finished("done", JobStatus::Completed);
        let all = [c1.clone(), c2.clone(), c0_low.clone(), other, expired, busy, done];
        b.seed(&all).await;

        let mut plan = plan();
        plan.claims.push(("m".into(), 2));
        let settled = b.writer.settle(plan.clone()).await.unwrap();
        assert_eq!(settled.claims.len(), 1);
        let (model, limit, claimed) = &settled.claims[0];
        assert_eq!((model.as_str(), *limit), ("m", 2));
        assert_eq!(
            ids(claimed),
            ["c1", "c2"],
            "{}: normal priority first, then by id",
            b.name
        );

        let claimed_as = |mut row: job::Model| {
            row.status = JobStatus::InProgress.as_str().into();
            row.attempt += 1;
            row.owner = Some("sched-1".into());
            row.started_at_ms = Some(NOW);
            row.run_deadline_ms = Some(NOW + row.execution_timeout_ms);
            plan.running(row, None)
        };
        let want: Vec<job::Model> = [c1, c2].into_iter().map(claimed_as).collect();
        assert_eq!(want[0].lease_until_ms, Some(NOW + 30_000));
        assert_eq!(want[0].worker_id, None);
        for row in claimed {
            let stored = b.row(&row.id).await;
            assert_eq!(row, &stored, "{}: the returned row is the stored one", b.name);
            assert!(want.contains(&stored), "{}: {stored:#?}", b.name);
        }

        // A second claim takes what is left of the model: the low-priority job.
        let mut again = plan.clone();
        again.claims = vec![("m".into(), 10)];
        let settled = b.writer.settle(again).await.unwrap();
        assert_eq!(ids(&settled.claims[0].2), ["c0-low"], "{}", b.name);
        let mut expected: Vec<job::Model> = all[3..].to_vec();
        expected.extend(want);
        expected.push(claimed_as(c0_low));
        b.holds(&expected).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

// ---- guarded transitions ----

/// `cancel`: the caller's queued or running job, unexpired, becomes
/// CANCELLED, finished now with its mode's retention, lease and run deadline
/// cleared (owner and worker kept). Another user's or model's job, a final
/// one and an expired one are not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_the_callers_queued_or_running_job() {
    let at = retention();
    let mut ends = Vec::new();
    for b in backends().await {
        let q = queued("q");
        let mut r = running("r", 1);
        r.sync = true;
        let done = finished("done", JobStatus::Completed);
        let mut theirs = queued("theirs");
        theirs.user_id = "v".into();
        let mut elsewhere = queued("elsewhere");
        elsewhere.model = "n".into();
        let mut expired = queued("expired");
        expired.expires_at_ms = NOW;
        let untouched = [done, theirs, elsewhere, expired];
        let mut all = vec![q.clone(), r.clone()];
        all.extend(untouched.iter().cloned());
        b.seed(&all).await;

        let mut want = Vec::new();
        for (row, until) in [(q, at.async_until), (r, at.sync_until)] {
            let mut w = row;
            w.status = JobStatus::Cancelled.as_str().into();
            w.completed_at_ms = Some(NOW);
            w.expires_at_ms = until;
            w.lease_until_ms = None;
            w.run_deadline_ms = None;
            let changed = b.writer.cancel("u", "m", &w.id, at).await.unwrap();
            assert_eq!(changed.as_ref(), Some(&w), "{}: cancel {}", b.name, w.id);
            want.push(w);
        }
        assert_eq!(want[1].owner.as_deref(), Some("sched-1"));
        for row in &untouched {
            let changed = b.writer.cancel("u", "m", &row.id, at).await.unwrap();
            assert_eq!(changed, None, "{}: cancel {}", b.name, row.id);
        }
        // Cancelling again finds nothing to change.
        assert_eq!(b.writer.cancel("u", "m", "q", at).await.unwrap(), None);
        want.extend(untouched);
        b.holds(&want).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `retry`: the caller's FAILED or TIMED_OUT job goes back to IN_QUEUE with
/// its outcome cleared (output, error, timings, worker, owner, start and
/// end), queued now with a fresh TTL, one more retry, `attempts` more
/// attempts than it used, and a new delivery due when it has a webhook.
/// A completed job, another user's and an expired one are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_queues_a_failed_or_timed_out_job_again() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut failed = finished("failed", JobStatus::Failed);
        failed.attempt = 3;
        failed.retries = 2;
        failed.output = Some(r#"{"partial":true}"#.into());
        failed.error = Some("boom".into());
        failed.worker_timings = Some(r#"{"queueMs":1,"loadMs":2,"runMs":3}"#.into());
        failed.webhook = Some("https://example.com/hook".into());
        failed.run_deadline_ms = None;
        let mut timed_out = finished("timed-out", JobStatus::TimedOut);
        timed_out.error = Some("execution timeout exceeded".into());
        timed_out.webhook_due_ms = Some(5);
        let done = finished("done", JobStatus::Completed);
        let mut theirs = finished("theirs", JobStatus::Failed);
        theirs.user_id = "v".into();
        let mut expired = finished("expired", JobStatus::Failed);
        expired.expires_at_ms = NOW;
        let untouched = [done, theirs, expired];
        let mut all = vec![failed.clone(), timed_out.clone()];
        all.extend(untouched.iter().cloned());
        b.seed(&all).await;

        let mut want = Vec::new();
        for (row, due) in [(failed, Some(0)), (timed_out, None)] {
            let mut w = row;
            w.status = JobStatus::InQueue.as_str().into();
            w.output = None;
            w.error = None;
            w.worker_timings = None;
            w.worker_id = None;
            w.owner = None;
            w.started_at_ms = None;
            w.completed_at_ms = None;
            w.queued_at_ms = NOW;
            w.expires_at_ms = NOW + w.ttl_ms;
            w.retries += 1;
            w.max_attempts = w.attempt + 2;
            w.webhook_due_ms = due;
            let changed = b.writer.retry("u", "m", &w.id, NOW, 2).await.unwrap();
            assert_eq!(changed.as_ref(), Some(&w), "{}: retry {}", b.name, w.id);
            want.push(w);
        }
        assert_eq!((want[0].retries, want[0].max_attempts), (3, 5));
        for row in &untouched {
            let changed = b.writer.retry("u", "m", &row.id, NOW, 2).await.unwrap();
            assert_eq!(changed, None, "{}: retry {}", b.name, row.id);
        }
        // Queued now: a second retry finds nothing to change.
        assert_eq!(b.writer.retry("u", "m", "failed", NOW, 2).await.unwrap(), None);
        want.extend(untouched);
        b.holds(&want).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `advance_cursor`: moves `chunks_read` only from where the caller saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_cursor_moves_only_from_the_cursor_seen() {
    let mut ends = Vec::new();
    for b in backends().await {
        let a = running("a", 1);
        let other = running("other", 1);
        b.seed(&[a.clone(), other.clone()]).await;

        let w = &b.writer;
        let moves = [
            w.advance_cursor("a", 0, 3).await.unwrap(),
            w.advance_cursor("a", 0, 5).await.unwrap(),
            w.advance_cursor("a", 3, 5).await.unwrap(),
            w.advance_cursor("missing", 0, 1).await.unwrap(),
        ];
        assert_eq!(moves, [true, false, true, false], "{}", b.name);
        let mut want = a;
        want.chunks_read = 5;
        b.holds(&[want, other]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `purge_queue`: CANCELLED for every queued, unexpired job of the user on
/// the model, with its mode's retention; running jobs, other users' and
/// models' jobs, expired and final ones are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_queue_cancels_the_users_queued_jobs() {
    let at = retention();
    let mut ends = Vec::new();
    for b in backends().await {
        let q1 = queued("q1");
        let mut q2 = queued("q2");
        q2.sync = true;
        q2.low_priority = true;
        let r = running("r", 1);
        let mut theirs = queued("theirs");
        theirs.user_id = "v".into();
        let mut elsewhere = queued("elsewhere");
        elsewhere.model = "n".into();
        let mut expired = queued("expired");
        expired.expires_at_ms = NOW;
        let done = finished("done", JobStatus::Failed);
        let untouched = [r, theirs, elsewhere, expired, done];
        let mut all = vec![q1.clone(), q2.clone()];
        all.extend(untouched.iter().cloned());
        b.seed(&all).await;

        assert_eq!(b.writer.purge_queue("u", "m", at).await.unwrap(), 2, "{}", b.name);
        let mut want: Vec<job::Model> = [(q1, at.async_until), (q2, at.sync_until)]
            .into_iter()
            .map(|(mut w, until)| {
                w.status = JobStatus::Cancelled.as_str().into();
                w.completed_at_ms = Some(NOW);
                w.expires_at_ms = until;
                w
            })
            .collect();
        want.extend(untouched);
        b.holds(&want).await;
        assert_eq!(b.writer.purge_queue("u", "m", at).await.unwrap(), 0, "{}", b.name);
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `renew`: new lease end for the owner's running jobs only; returns their
/// (id, attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_the_leases_of_the_owners_running_jobs() {
    let mut ends = Vec::new();
    for b in backends().await {
        let r1 = running("r1", 1);
        let r2 = running("r2", 2);
        let mut theirs = running("theirs", 1);
        theirs.owner = Some("sched-2".into());
        // A completed job keeps its owner, and is not renewed.
        let done = finished("done", JobStatus::Completed);
        b.seed(&[r1.clone(), r2.clone(), theirs.clone(), done.clone()]).await;

        let asked = strings(&["r1", "r2", "theirs", "done", "missing"]);
        let mut renewed = b.writer.renew(&asked, "sched-1", NOW + 90_000).await.unwrap();
        renewed.sort();
        assert_eq!(renewed, [("r1".to_string(), 1), ("r2".to_string(), 2)], "{}", b.name);
        let want: Vec<job::Model> = [r1, r2]
            .into_iter()
            .map(|mut w| {
                w.lease_until_ms = Some(NOW + 90_000);
                w
            })
            .collect();
        b.holds(&[want[0].clone(), want[1].clone(), theirs, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `time_out`: TIMED_OUT for every running job (of any owner) whose run
/// deadline is now or past, with the error, finished now, its mode's
/// retention and no lease (owner, worker and deadline kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_out_ends_running_jobs_past_their_deadline() {
    let at = retention();
    let mut ends = Vec::new();
    for b in backends().await {
        let mut late = running("late", 1);
        late.run_deadline_ms = Some(NOW);
        let mut theirs = running("theirs", 2);
        theirs.owner = Some("sched-2".into());
        theirs.sync = true;
        theirs.run_deadline_ms = Some(NOW - 1_000);
        let mut early = running("early", 1);
        early.run_deadline_ms = Some(NOW + 1);
        // A completion keeps the run deadline: a final job is not timed out.
        let mut done = finished("done", JobStatus::Completed);
        done.run_deadline_ms = Some(NOW - 10);
        b.seed(&[late.clone(), theirs.clone(), early.clone(), done.clone()])
            .await;

        let mut changed = b.writer.time_out(at).await.unwrap();
        changed.sort_by(|a, b| a.id.cmp(&b.id));
        let want: Vec<job::Model> = [(late, at.async_until), (theirs, at.sync_until)]
            .into_iter()
            .map(|(mut w, until)| {
                w.status = JobStatus::TimedOut.as_str().into();
                w.error = Some("execution timeout exceeded".into());
                w.completed_at_ms = Some(NOW);
                w.expires_at_ms = until;
                w.lease_until_ms = None;
                w
            })
            .collect();
        assert_eq!(changed, want, "{}: the returned rows", b.name);
        b.holds(&[want[0].clone(), want[1].clone(), early, done]).await;
        assert!(b.writer.time_out(at).await.unwrap().is_empty(), "{}", b.name);
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `requeue_orphans`: running jobs whose lease ended before `lapsed` are
/// requeued (or FAILED "scheduler lost" when out of attempts), as
/// `Plan::requeued` builds; a lease ending at `lapsed` or later, and jobs not
/// running, are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_orphans_matches_plan_requeued() {
    let at = retention();
    let lapsed = NOW - 1_000;
    let mut ends = Vec::new();
    for b in backends().await {
        let mut lost = running("lost", 1);
        lost.lease_until_ms = Some(lapsed - 1);
        let mut spent = running("spent", 3);
        spent.owner = Some("sched-2".into());
        spent.sync = true;
        spent.lease_until_ms = Some(lapsed - 5_000);
        let mut alive = running("alive", 1);
        alive.lease_until_ms = Some(lapsed);
        let q = queued("q");
        let done = finished("done", JobStatus::Failed);
        b.seed(&[lost.clone(), spent.clone(), alive.clone(), q.clone(), done.clone()])
            .await;

        let mut changed = b.writer.requeue_orphans(at, lapsed).await.unwrap();
        changed.sort_by(|a, b| a.id.cmp(&b.id));
        let plan = plan();
        let want_lost = plan.requeued(lost, "scheduler lost");
        let want_spent = plan.requeued(spent, "scheduler lost");
        assert_eq!(
            (want_lost.status.as_str(), want_spent.status.as_str()),
            ("IN_QUEUE", "FAILED")
        );
        assert_eq!(
            changed,
            [want_lost.clone(), want_spent.clone()],
            "{}: the returned rows",
            b.name
        );
        b.holds(&[want_lost, want_spent, alive, q, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// A job, its chunks and its progress row.
async fn seed_with_output(b: &Backend, rows: &[job::Model]) {
    b.seed(rows).await;
    for row in rows {
        for seq in 0..2 {
            chunk::Entity::insert(chunk::ActiveModel::from(chunk::Model {
                job_id: row.id.clone(),
                seq,
                output: format!("chunk {seq}"),
            }))
            .exec_without_returning(&b.db)
            .await
            .unwrap();
        }
        progress::Entity::insert(progress::ActiveModel::from(progress::Model {
            job_id: row.id.clone(),
            attempt: row.attempt,
            message: "{}".into(),
            updated_at_ms: 1,
        }))
        .exec_without_returning(&b.db)
        .await
        .unwrap();
    }
}

/// The jobs that have chunks, and those that have a progress row.
async fn output_of(b: &Backend) -> (Vec<String>, Vec<String>) {
    let chunks = chunk::Entity::find()
        .order_by_asc(chunk::Column::JobId)
        .order_by_asc(chunk::Column::Seq)
        .all(&b.db)
        .await
        .unwrap();
    let progress = progress::Entity::find()
        .order_by_asc(progress::Column::JobId)
        .all(&b.db)
        .await
        .unwrap();
    let mut chunked: Vec<String> = chunks.into_iter().map(|c| c.job_id).collect();
    chunked.dedup();
    (chunked, progress.into_iter().map(|p| p.job_id).collect())
}

/// `expire`: deletes the named jobs whose retention ended (now or before)
/// with their chunks and progress; jobs not named stay with theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_deletes_expired_jobs_with_their_output() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut old = finished("old", JobStatus::Completed);
        old.expires_at_ms = NOW;
        let mut older = finished("older", JobStatus::Failed);
        older.expires_at_ms = NOW - 1;
        let mut unnamed = finished("unnamed", JobStatus::Completed);
        unnamed.expires_at_ms = NOW - 1;
        seed_with_output(&b, &[old, older, unnamed.clone()]).await;

        b.writer
            .expire(&strings(&["old", "older", "missing"]), NOW)
            .await
            .unwrap();
        b.holds(&[unnamed]).await;
        assert_eq!(
            output_of(&b).await,
            (strings(&["unnamed"]), strings(&["unnamed"])),
            "{}: chunks and progress left",
            b.name
        );
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `expire` of a job whose retention has not ended (retried since it was
/// listed) keeps the job, and with it its chunks and progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_keeps_an_unexpired_job_with_its_output() {
    let mut ends = Vec::new();
    let mut outputs = Vec::new();
    for b in backends().await {
        let mut kept = queued("kept");
        kept.expires_at_ms = NOW + 1;
        seed_with_output(&b, std::slice::from_ref(&kept)).await;

        b.writer.expire(&strings(&["kept"]), NOW).await.unwrap();
        b.holds(std::slice::from_ref(&kept)).await;
        outputs.push((b.name, output_of(&b).await));
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
    let kept = (strings(&["kept"]), strings(&["kept"]));
    assert_eq!(
        outputs,
        [("sqlite", kept.clone()), ("postgres", kept)],
        "the jobs with chunks, and with progress, after the expiry"
    );
}

/// `put_back`: the owner's just-claimed jobs go back to the queue with the
/// attempt given back, as `Plan::released(row, true)` builds; other owners'
/// and final jobs are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_back_matches_plan_released_giving_the_attempt_back() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut a = running("a", 2);
        a.worker_id = None;
        a.retries = 1;
        let mut theirs = running("theirs", 1);
        theirs.owner = Some("sched-2".into());
        let done = finished("done", JobStatus::Completed);
        b.seed(&[a.clone(), theirs.clone(), done.clone()]).await;

        b.writer
            .put_back(&strings(&["a", "theirs", "done"]), "sched-1")
            .await
            .unwrap();
        let want = plan().released(a, true);
        assert_eq!(
            (want.status.as_str(), want.attempt, want.started_at_ms),
            ("IN_QUEUE", 1, None)
        );
        b.holds(&[want, theirs, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `release`: every running job of the owner goes back to the queue with
/// one more attempt allowed, as `Plan::released(row, false)` builds; other
/// owners' jobs and final jobs of the owner are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_matches_plan_released_allowing_one_more_attempt() {
    let mut ends = Vec::new();
    for b in backends().await {
        let a = running("a", 1);
        let mut s = running("s", 3);
        s.sync = true;
        let mut theirs = running("theirs", 1);
        theirs.owner = Some("sched-2".into());
        let q = queued("q");
        let done = finished("done", JobStatus::Completed);
        b.seed(&[a.clone(), s.clone(), theirs.clone(), q.clone(), done.clone()])
            .await;

        b.writer.release("sched-1", NOW).await.unwrap();
        let plan = plan();
        let want_a = plan.released(a, false);
        let want_s = plan.released(s, false);
        assert_eq!(
            (
                want_s.status.as_str(),
                want_s.attempt,
                want_s.max_attempts,
                want_s.queued_at_ms
            ),
            ("IN_QUEUE", 3, 4, NOW)
        );
        assert_eq!(want_a.worker_id, None);
        b.holds(&[want_a, want_s, theirs, q, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `set_worker`: records the worker of the owner's running jobs, as
/// `Plan::running` builds (for a job leased by the plan); other owners' and
/// final jobs are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_worker_matches_plan_running() {
    let plan = plan();
    let mut ends = Vec::new();
    for b in backends().await {
        let mut a = running("a", 1);
        a.worker_id = None;
        a.lease_until_ms = Some(plan.lease_until);
        let mut theirs = running("theirs", 1);
        theirs.owner = Some("sched-2".into());
        let done = finished("done", JobStatus::Completed);
        b.seed(&[a.clone(), theirs.clone(), done.clone()]).await;

        b.writer
            .set_worker(&strings(&["a", "theirs", "done"]), "sched-1", "w9")
            .await
            .unwrap();
        let want = plan.running(a, Some("w9".into()));
        b.holds(&[want, theirs, done]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `hold_delivery`: takes a pending delivery only while it is still due
/// when the caller saw it; a job without a pending delivery is not taken
/// for a due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_delivery_takes_a_delivery_once() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut a = finished("a", JobStatus::Completed);
        a.webhook = Some("https://example.com/hook".into());
        a.webhook_due_ms = Some(0);
        let mut c = a.clone();
        c.id = "c".into();
        let none = finished("none", JobStatus::Completed);
        b.seed(&[a.clone(), c.clone(), none.clone()]).await;

        let w = &b.writer;
        let held = [
            w.hold_delivery("a", 0, NOW + 10_000).await.unwrap(),
            w.hold_delivery("a", 0, NOW + 20_000).await.unwrap(),
            w.hold_delivery("none", 0, NOW + 10_000).await.unwrap(),
            w.hold_delivery("a", NOW + 10_000, NOW + 30_000).await.unwrap(),
        ];
        assert_eq!(held, [true, false, false, true], "{}", b.name);
        let mut want = a;
        want.webhook_due_ms = Some(NOW + 30_000);
        b.holds(&[want, c, none]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `delivered`: ends the delivery of the outcome that finished at
/// `finished_at`; a job finished again since (after a retry) keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_ends_the_delivery_of_that_outcome_only() {
    let mut ends = Vec::new();
    for b in backends().await {
        let mut a = finished("a", JobStatus::Completed);
        a.webhook = Some("https://example.com/hook".into());
        a.webhook_due_ms = Some(NOW + 10_000);
        let mut again = a.clone();
        again.id = "again".into();
        again.webhook_due_ms = Some(0);
        again.completed_at_ms = Some(NOW - 10);
        b.seed(&[a.clone(), again.clone()]).await;

        b.writer.delivered("a", a.completed_at_ms).await.unwrap();
        b.writer.delivered("again", Some(NOW - 100)).await.unwrap();
        b.writer.delivered("again", None).await.unwrap();
        let mut want = a;
        want.webhook_due_ms = None;
        b.holds(&[want, again]).await;
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `admit`: inserts while the owner's balance exceeds the holds of their
/// queued and running jobs, else refuses with both and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_inserts_only_with_credit_left() {
    let mut ends = Vec::new();
    for b in backends().await {
        b.db.execute_unprepared(
            "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms) VALUES ('u', 100, 0)",
        )
        .await
        .unwrap();
        let done = finished("done", JobStatus::Completed);
        b.seed(std::slice::from_ref(&done)).await;
        let mut first = queued("first");
        first.hold_micro_usd = 60;
        let mut second = queued("second");
        second.hold_micro_usd = 60;
        let third = queued("third");
        let mut broke = queued("broke");
        broke.user_id = "v".into();

        b.writer.admit(&first).await.unwrap();
        b.writer.admit(&second).await.unwrap();
        let refused = b.writer.admit(&third).await;
        assert!(
            matches!(
                refused,
                Err(JobError::PaymentRequired {
                    balance: 100,
                    held: 120
                })
            ),
            "{}: {refused:?}",
            b.name
        );
        let refused = b.writer.admit(&broke).await;
        assert!(
            matches!(refused, Err(JobError::PaymentRequired { balance: 0, held: 0 })),
            "{}: {refused:?}",
            b.name
        );
        b.holds(&[done, first, second]).await;
        assert_eq!(
            b.number("SELECT COUNT(*) AS n FROM credit_accounts").await,
            1,
            "{}: a refusal writes no account",
            b.name
        );
        ends.push(b.rows().await);
    }
    same_on_both(&ends);
}

/// `reserve` (SQLite only: its writer thread is the one place that admits
/// every job of a file it owns alone): a job admitted unwritten holds its
/// credit in memory, counted by every later admission or reservation of its
/// owner, until a settlement writes it (a final row debited, or a running
/// row whose hold the triggers count) or it is unreserved. PostgreSQL's
/// writer has no thread to keep them: it refuses, and the store writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_holds_credit_unwritten_until_the_job_is_written_or_lost() {
    for b in backends().await {
        let mut one = running("one", 1);
        one.hold_micro_usd = 60;
        if b.name == "postgres" {
            assert!(!b.writer.reserves());
            assert!(matches!(b.writer.reserve(&one).await, Err(JobError::Database(_))));
            b.writer.unreserve(&["one".to_owned()]);
            b.holds(&[]).await;
            continue;
        }
        assert!(b.writer.reserves());
        b.db.execute_unprepared(
            "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms) VALUES ('u', 100, 0)",
        )
        .await
        .unwrap();
        let refused = |r: Result<(), JobError>| match r {
            Err(JobError::PaymentRequired { balance, held }) => (balance, held),
            other => panic!("not refused: {other:?}"),
        };

        // 100 of credit: a reservation of 60, then a written job of 60.
        b.writer.reserve(&one).await.unwrap();
        let mut queued_60 = queued("queued");
        queued_60.hold_micro_usd = 60;
        b.writer.admit(&queued_60).await.unwrap();
        // Nothing is left: both kinds of admission count both holds.
        let mut two = running("two", 1);
        two.hold_micro_usd = 5;
        assert_eq!(refused(b.writer.reserve(&two).await), (100, 120));
        assert_eq!(refused(b.writer.admit(&queued("more")).await), (100, 120));
        // Reserving the same job again changes nothing.
        assert_eq!(refused(b.writer.reserve(&one).await), (100, 120));
        b.holds(std::slice::from_ref(&queued_60)).await;

        // A lost job's reservation goes (an unknown id is ignored).
        b.writer.unreserve(&["one".to_owned(), "unknown".to_owned()]);
        b.writer.reserve(&two).await.unwrap();
        let mut three = running("three", 1);
        three.hold_micro_usd = 40;
        b.writer.reserve(&three).await.unwrap();
        assert_eq!(refused(b.writer.reserve(&one).await), (100, 105));

        // "two" is written final with its charge: its reservation goes and
        // the balance pays its cost; "three" is written running: its row
        // holds it now, counted once.
        let mut settle = plan();
        let row = settle.completed(two.clone(), "w0", "out".into(), &usage(4), None, None);
        settle.stores.push(super::plan::Store {
            row: row.clone(),
            charge: Some(usage(4)),
        });
        let running_three = settle.running(three.clone(), Some("w0".into()));
        settle.stores.push(super::plan::Store {
            row: running_three.clone(),
            charge: None,
        });
        b.writer.settle(settle).await.unwrap();
        b.holds(&[queued_60.clone(), row, running_three]).await;
        // 96 of balance, 100 held by rows (counted once), nothing reserved.
        assert_eq!(refused(b.writer.reserve(&one).await), (96, 100));
        assert_eq!(
            b.number("SELECT balance_micro_usd AS n FROM credit_accounts WHERE user_id = 'u'")
                .await,
            96
        );
    }
}

/// One integer a PostgreSQL query returns (column `n`).
async fn pg_number(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "n")
        .unwrap()
}

/// How many sessions of this database wait for a lock now (PostgreSQL).
async fn waiting_for_locks(db: &DatabaseConnection) -> i64 {
    let sql = "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
               AND wait_event_type = 'Lock'";
    pg_number(db, sql).await
}

/// Two settlements on PostgreSQL that finish jobs of the same two users in
/// opposite orders, made to meet: a third transaction holds user a's
/// account row while the first (a's job, then b's) and the second (b's,
/// then a's) start, each waiting for a lock. Each finish releases its job's
/// hold, whose trigger updates its owner's account row; taken in the order
/// of the jobs, the first would get a's row and want b's, which the second
/// took and holds while it wants a's: PostgreSQL would abort one as a
/// deadlock. The settlements take their owners' rows in user order first,
/// so the second waits for the first, and both commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_of_the_same_users_in_opposite_orders_do_not_deadlock() {
    let pg = gantry_testkit::PgDatabase::create().await;
    let db = Database::connect(&pg.url).await.unwrap();
    gantry_migrations::Migrator::up(&db, None).await.unwrap();
    let writer = JobWriter::open(&db).unwrap();
    let job = |id: &str, user: &str| {
        let mut row = running(id, 1);
        row.user_id = user.into();
        row
    };
    let rows = [job("a1", "a"), job("a2", "a"), job("b1", "b"), job("b2", "b")];
    for row in &rows {
        writer.insert(row).await.unwrap();
    }
    let fail = |id: &str| Step::Finish {
        job_id: id.into(),
        attempt: 1,
        status: JobStatus::Failed,
        error: Some("failed".into()),
        worker_id: None,
    };
    let settle = |order: [&str; 2]| {
        let writer = writer.clone();
        let mut plan = plan();
        plan.steps = order.iter().map(|id| fail(id)).collect();
        tokio::spawn(async move { writer.settle(plan).await })
    };
    let until_waiting = |n: i64| {
        let db = &db;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while waiting_for_locks(db).await < n {
                assert!(std::time::Instant::now() < deadline, "{n} never waited for a lock");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };

    use sea_orm::TransactionTrait;
    let blocker = db.begin().await.unwrap();
    blocker
        .execute_unprepared("SELECT 1 FROM credit_accounts WHERE user_id = 'a' FOR UPDATE")
        .await
        .unwrap();
    let first = settle(["a1", "b1"]);
    until_waiting(1).await;
    let second = settle(["b2", "a2"]);
    until_waiting(2).await;
    blocker.commit().await.unwrap();

    for (name, settlement) in [("first", first), ("second", second)] {
        let settled = settlement.await.unwrap();
        assert!(settled.is_ok(), "the {name} settlement: {:?}", settled.err());
    }
    let statuses: Vec<String> = job::Entity::find()
        .order_by_asc(job::Column::Id)
        .all(&db)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.status)
        .collect();
    assert_eq!(statuses, ["FAILED"; 4]);
    let held = pg_number(
        &db,
        "SELECT CAST(SUM(held_micro_usd) AS BIGINT) AS n FROM credit_accounts",
    )
    .await;
    assert_eq!(held, 0, "every hold released once");
}
