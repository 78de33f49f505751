//! A settlement: what one transaction writes, decided before any statement
//! runs. Its transitions (complete, finish, requeue, claim, and the first
//! write of a job kept in memory) are each written here in every form they
//! take: the guard, the PostgreSQL statement (run by [`execute`] through
//! sea-orm), the SQLite statement beside it ([`sqlite`], run by the writer
//! thread in `engine.rs`), and the function that applies the step to a row
//! kept only in memory (the fast lane's unwritten `runsync` jobs:
//! [`Plan::completed`] and its siblings). Every step is guarded on `(id,
//! attempt, IN_PROGRESS)`, so a stale attempt or a duplicate changes nothing.

use std::collections::HashMap;

use gantry_billing::{Charge, record_charges};
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IdenStatic, Iterable, QueryFilter, Statement,
};

use super::Retention;
use crate::entity::{chunk, file, job};
use crate::types::JobStatus;

use job::Column as J;

/// Jobs completed by one `UPDATE … FROM (VALUES …)` statement (9 bind values each).
const COMPLETE_CHUNK: usize = 224;

/// Writes of one transaction: rows of unstored jobs (see [`Store`]), stream
/// chunks, then terminal transitions (each guarded on `(id, attempt,
/// IN_PROGRESS)`, so a stale attempt or a duplicate changes nothing), the
/// charges of the completions that applied, then claims.
#[derive(Clone)]
pub struct Plan {
    pub now: i64,
    /// `expires_at_ms` of a job finishing now: sync and async retention.
    pub sync_until: i64,
    pub async_until: i64,
    /// Rows of jobs not in the database yet, written whole.
    pub stores: Vec<Store>,
    pub chunks: Vec<(String, i64, String)>,
    /// The latest progress message of running attempts: (job, attempt, JSON).
    pub progress: Vec<(String, i32, String)>,
    pub steps: Vec<Step>,
    /// Claims for this instance: (model, most jobs).
    pub claims: Vec<(String, u64)>,
    pub instance: String,
    pub lease_until: i64,
    /// How long an output file lives (its `files` row's expiry).
    pub file_lifetime_ms: i64,
}

#[derive(Clone)]
pub enum Step {
    /// COMPLETED with its output (cost included) and one ledger charge.
    Complete {
        job_id: String,
        attempt: i64,
        worker_id: String,
        output: String,
        usage: Usage,
        /// The stored output files (JSON), written with the completion.
        files: Option<String>,
        /// What the worker reported of the attempt (`WorkerTimings`, JSON).
        timings: Option<String>,
    },
    /// Another final status; `error` and `worker_id` are kept when `None`.
    Finish {
        job_id: String,
        attempt: i64,
        status: JobStatus,
        error: Option<String>,
        worker_id: Option<String>,
    },
    /// Back to the queue while attempts remain, else FAILED with `error`.
    Requeue {
        job_id: String,
        attempt: i64,
        error: String,
    },
}

impl Step {
    /// The job the step is about.
    pub fn job_id(&self) -> &str {
        match self {
            Step::Complete { job_id, .. } | Step::Finish { job_id, .. } | Step::Requeue { job_id, .. } => job_id,
        }
    }
}

/// The first write of a job the fast lane kept in memory (a `runsync` job of
/// this process, see `store::Lane`): its whole row, in whatever state it
/// reached, and its charge when it is `COMPLETED` (in the same transaction).
#[derive(Clone)]
pub struct Store {
    pub row: job::Model,
    pub charge: Option<Usage>,
}

/// A completion's billed usage.
#[derive(Clone)]
pub struct Usage {
    pub unit: String,
    pub quantity_micros: i64,
    pub amount: i64,
}

impl Usage {
    /// The ledger charge of `row` completed with this usage.
    pub fn charge(&self, row: &job::Model) -> Charge {
        Charge {
            user_id: row.user_id.clone(),
            job_id: row.id.clone(),
            model: row.model.clone(),
            unit: self.unit.clone(),
            quantity_micros: self.quantity_micros,
            amount_micro_usd: self.amount,
        }
    }
}

/// What a plan changed.
#[derive(Default)]
pub struct Settled {
    /// Rows that reached a final status.
    pub finals: Vec<job::Model>,
    /// Per claim of the plan: (model, how many were asked for, rows claimed).
    pub claims: Vec<(String, u64, Vec<job::Model>)>,
}

impl Plan {
    pub fn new(now: i64, config: &crate::SchedulerConfig, instance: &str) -> Self {
        let at = Retention::of(config, now);
        Plan {
            now,
            sync_until: at.sync_until,
            async_until: at.async_until,
            stores: Vec::new(),
            chunks: Vec::new(),
            progress: Vec::new(),
            steps: Vec::new(),
            claims: Vec::new(),
            instance: instance.to_string(),
            lease_until: now.saturating_add(crate::config::millis(config.lease)),
            file_lifetime_ms: config.file_lifetime_ms(),
        }
    }

    /// When a job finishing at this plan's time stops being kept.
    pub fn retention(&self) -> Retention {
        Retention {
            now: self.now,
            sync_until: self.sync_until,
            async_until: self.async_until,
        }
    }

    /// `expires_at_ms` of `row` finishing now.
    fn until(&self, row: &job::Model) -> i64 {
        if row.sync { self.sync_until } else { self.async_until }
    }

    // The rows below are what the guarded statements leave behind, for a
    // job that is only in memory (see [`Store`]).

    /// As [`Step::Complete`] leaves it.
    pub fn completed(
        &self,
        mut row: job::Model,
        worker_id: &str,
        output: String,
        usage: &Usage,
        files: Option<String>,
        timings: Option<String>,
    ) -> job::Model {
        row.status = JobStatus::Completed.as_str().to_string();
        row.output = Some(output);
        row.files = files;
        row.worker_timings = timings;
        row.error = None;
        row.worker_id = Some(worker_id.to_string());
        row.cost_micro_usd = Some(usage.amount);
        row.usage_unit = Some(usage.unit.clone());
        row.usage_quantity_micros = Some(usage.quantity_micros);
        row.completed_at_ms = Some(self.now);
        row.expires_at_ms = self.until(&row);
        row.lease_until_ms = None;
        row
    }

    /// As [`Step::Finish`] leaves it.
    pub fn finished(
        &self,
        mut row: job::Model,
        status: JobStatus,
        error: Option<String>,
        worker_id: Option<String>,
    ) -> job::Model {
        row.status = status.as_str().to_string();
        row.completed_at_ms = Some(self.now);
        row.expires_at_ms = self.until(&row);
        row.lease_until_ms = None;
        if error.is_some() {
            row.error = error;
        }
        if worker_id.is_some() {
            row.worker_id = worker_id;
        }
        row
    }

    /// As [`requeue_or_fail`] leaves it.
    pub fn requeued(&self, mut row: job::Model, error: &str) -> job::Model {
        if row.attempt < row.max_attempts {
            row.status = JobStatus::InQueue.as_str().to_string();
            row.retries += 1;
            row.queued_at_ms = self.now;
            row.completed_at_ms = None;
        } else {
            row.status = JobStatus::Failed.as_str().to_string();
            row.completed_at_ms = Some(self.now);
            row.expires_at_ms = self.until(&row);
        }
        row.error = Some(error.to_string());
        row.owner = None;
        row.lease_until_ms = None;
        row.run_deadline_ms = None;
        row
    }

    /// Queued again without using up an attempt: `give_back` when the attempt
    /// was never sent (no worker took it), else one more attempt allowed (the
    /// scheduler is shutting down), as `put_back` and `release` do.
    pub fn released(&self, mut row: job::Model, give_back: bool) -> job::Model {
        row.status = JobStatus::InQueue.as_str().to_string();
        if give_back {
            row.attempt -= 1;
            row.started_at_ms = None;
        } else {
            row.max_attempts += 1;
            row.queued_at_ms = self.now;
            row.worker_id = None;
        }
        row.owner = None;
        row.lease_until_ms = None;
        row.run_deadline_ms = None;
        row
    }

    /// Claimed by this plan's instance and running (leased from now).
    pub fn running(&self, mut row: job::Model, worker_id: Option<String>) -> job::Model {
        row.worker_id = worker_id;
        row.lease_until_ms = Some(self.lease_until);
        row
    }

    /// The plan cut in one plan per job (its row, chunks, progress and
    /// steps) and, last, one with the claims alone: what a settlement runs
    /// when the whole plan would not commit, so that one job whose writes the
    /// database refuses fails alone and the others still settle.
    pub fn split_by_job(&self) -> Vec<(Option<String>, Plan)> {
        /// The part of `job_id`, made (empty) on first use.
        fn part<'s>(
            split: &'s mut Vec<(Option<String>, Plan)>,
            at: &mut HashMap<String, usize>,
            whole: &Plan,
            job_id: &str,
        ) -> &'s mut Plan {
            let i = *at.entry(job_id.to_owned()).or_insert_with(|| {
                split.push((Some(job_id.to_owned()), whole.clone_empty()));
                split.len() - 1
            });
            &mut split[i].1
        }
        let mut split = Vec::new();
        let mut at = HashMap::new();
        for store in &self.stores {
            part(&mut split, &mut at, self, &store.row.id)
                .stores
                .push(store.clone());
        }
        for chunk in &self.chunks {
            part(&mut split, &mut at, self, &chunk.0).chunks.push(chunk.clone());
        }
        for progress in &self.progress {
            part(&mut split, &mut at, self, &progress.0)
                .progress
                .push(progress.clone());
        }
        for step in &self.steps {
            part(&mut split, &mut at, self, step.job_id()).steps.push(step.clone());
        }
        if !self.claims.is_empty() {
            let mut claims = self.clone_empty();
            claims.claims = self.claims.clone();
            split.push((None, claims));
        }
        split
    }

    /// What to write instead of this one job's plan when the database refused
    /// it: the job `FAILED` with `error` (no output, no files, no charge), its
    /// chunks and progress left out.
    pub fn failed_instead(&self, error: &str) -> Plan {
        let error = error.replace('\0', "\\u0000");
        let mut plan = self.clone_empty();
        plan.stores = self
            .stores
            .iter()
            .map(|store| {
                let mut row = store.row.clone();
                row.output = None;
                row.files = None;
                row.cost_micro_usd = None;
                row.usage_unit = None;
                row.usage_quantity_micros = None;
                row.worker_timings = None;
                Store {
                    row: self.finished(row, JobStatus::Failed, Some(error.clone()), None),
                    charge: None,
                }
            })
            .collect();
        plan.steps = self
            .steps
            .iter()
            .map(|step| {
                let (Step::Complete { attempt, .. } | Step::Finish { attempt, .. } | Step::Requeue { attempt, .. }) =
                    step;
                Step::Finish {
                    job_id: step.job_id().to_owned(),
                    attempt: *attempt,
                    status: JobStatus::Failed,
                    error: Some(error.clone()),
                    worker_id: None,
                }
            })
            .collect();
        plan
    }

    /// This plan's times and settings, with nothing to write.
    fn clone_empty(&self) -> Plan {
        Plan {
            now: self.now,
            sync_until: self.sync_until,
            async_until: self.async_until,
            stores: Vec::new(),
            chunks: Vec::new(),
            progress: Vec::new(),
            steps: Vec::new(),
            claims: Vec::new(),
            instance: self.instance.clone(),
            lease_until: self.lease_until,
            file_lifetime_ms: self.file_lifetime_ms,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
            && self.chunks.is_empty()
            && self.progress.is_empty()
            && self.steps.is_empty()
            && self.claims.is_empty()
    }
}

/// `status = 'IN_QUEUE'`, spelled literally: the queued-jobs index
/// (`idx_jobs_queued`) is partial on that condition, and a planner matches a
/// partial index only against a literal, never a bound parameter.
pub fn queued_jobs() -> Expr {
    Expr::cust(format!("status = '{}'", JobStatus::InQueue.as_str()))
}

/// `status = 'IN_PROGRESS'`, spelled literally for the partial index of
/// running jobs (`idx_jobs_in_progress`), as [`queued_jobs`].
pub fn running_jobs() -> Expr {
    Expr::cust(format!("status = '{}'", JobStatus::InProgress.as_str()))
}

pub fn is_final(row: &job::Model) -> bool {
    JobStatus::parse(&row.status).is_some_and(JobStatus::is_final)
}

/// Runs `plan` on `db` (a transaction, so it commits as one).
pub(super) async fn execute<C: ConnectionTrait>(db: &C, plan: &Plan) -> Result<Settled, DbErr> {
    let mut settled = Settled::default();
    store_all(db, &plan.stores, plan.now, plan.file_lifetime_ms, &mut settled).await?;
    insert_chunks(db, &plan.chunks).await?;
    upsert_progress(db, &plan.progress, plan.now).await?;
    let retention = plan.retention().expr();
    let mut completions = Vec::new();
    for step in &plan.steps {
        match step {
            Step::Complete { .. } => completions.push(step),
            Step::Finish {
                job_id,
                attempt,
                status,
                error,
                worker_id,
            } => {
                let mut update = job::Entity::update_many()
                    .col_expr(J::Status, Expr::value(status.as_str()))
                    .col_expr(J::CompletedAtMs, Expr::value(plan.now))
                    .col_expr(J::ExpiresAtMs, retention.clone())
                    .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None));
                if let Some(error) = error {
                    update = update.col_expr(J::Error, Expr::value(error.as_str()));
                }
                if let Some(worker_id) = worker_id {
                    update = update.col_expr(J::WorkerId, Expr::value(worker_id.as_str()));
                }
                let rows = update
                    .filter(J::Id.eq(job_id.as_str()))
                    .filter(J::Attempt.eq(*attempt))
                    .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                    .exec_with_returning(db)
                    .await?;
                settled.finals.extend(rows);
            }
            Step::Requeue { job_id, attempt, error } => {
                let rows = requeue_or_fail(error, plan.retention())
                    .filter(J::Id.eq(job_id.as_str()))
                    .filter(J::Attempt.eq(*attempt))
                    .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                    .exec_with_returning(db)
                    .await?;
                settled.finals.extend(rows.into_iter().filter(is_final));
            }
        }
    }
    let completed = complete_all(db, &completions, plan).await?;
    let mut charges = Vec::with_capacity(completed.len());
    let by_id: HashMap<&str, &Step> = completions
        .iter()
        .filter_map(|step| match step {
            Step::Complete { job_id, .. } => Some((job_id.as_str(), *step)),
            _ => None,
        })
        .collect();
    let mut files = Vec::new();
    for row in completed {
        if let Some(Step::Complete { usage, .. }) = by_id.get(row.id.as_str()) {
            charges.push(usage.charge(&row));
            files.extend(file::of_job(&row, plan.file_lifetime_ms));
        }
        settled.finals.push(row);
    }
    record_charges(db, &charges, plan.now).await?;
    insert_files(db, files).await?;
    for (model, limit) in &plan.claims {
        let rows = claim(db, model, *limit, plan).await?;
        settled.claims.push((model.clone(), *limit, rows));
    }
    Ok(settled)
}

/// Claims up to `limit` queued jobs of `model` for the plan's instance, normal
/// priority first, oldest first, in one statement.
///
/// On PostgreSQL the candidates are locked by an uncorrelated `ARRAY(…)`
/// subquery, which runs once before the update, and the rows to change are
/// then found by primary key:
///
/// ```sql
/// UPDATE jobs SET status = 'IN_PROGRESS', …
///  WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE model = $1 AND status = 'IN_QUEUE'
///          AND expires_at_ms > $2 ORDER BY low_priority, id LIMIT $3 FOR UPDATE SKIP LOCKED))
///    AND (status = 'IN_QUEUE') IS TRUE RETURNING <every column>
/// ```
///
/// (The outer guard is spelled `IS TRUE` so that it does not match the
/// partial index of queued jobs, which would again walk the whole queue.)
///
/// Written as `WHERE id IN (subquery)`, the planner may make the subquery
/// the inner side of a nested loop over every queued row, and it did so
/// whenever its statistics were taken while few jobs were queued (after a
/// burst of runsync jobs, say): each run of the subquery then locked the
/// next rows, so one claim took every queued job whatever its limit, and
/// took seconds. A `MATERIALIZED` CTE ran the subquery once but still
/// joined it by scanning every queued row. (SQLite claims on its writer
/// thread: `engine.rs`.)
async fn claim<C: ConnectionTrait>(db: &C, model: &str, limit: u64, plan: &Plan) -> Result<Vec<job::Model>, DbErr> {
    let values: [sea_orm::Value; 5] = [
        model.into(),
        plan.now.into(),
        i64::try_from(limit).unwrap_or(i64::MAX).into(),
        plan.instance.as_str().into(),
        plan.lease_until.into(),
    ];
    job::Entity::find()
        .from_raw_sql(Statement::from_sql_and_values(
            DbBackend::Postgres,
            postgres_claim_sql(),
            values,
        ))
        .all(db)
        .await
}

/// The claim statement on PostgreSQL (see [`claim`]): `$1` model, `$2` now,
/// `$3` limit, `$4` instance, `$5` lease end.
fn postgres_claim_sql() -> String {
    format!(
        "UPDATE jobs SET status = '{in_progress}', attempt = attempt + 1, owner = $4, lease_until_ms = $5, \
             started_at_ms = $2, worker_id = NULL, run_deadline_ms = $2 + execution_timeout_ms \
             WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE model = $1 AND status = '{queued}' \
               AND expires_at_ms > $2 ORDER BY low_priority ASC, id ASC LIMIT $3 FOR UPDATE SKIP LOCKED)) \
             AND (status = '{queued}') IS TRUE RETURNING {returning}",
        queued = JobStatus::InQueue.as_str(),
        in_progress = JobStatus::InProgress.as_str(),
        returning = every_column(),
    )
}

/// Every column of `jobs`, quoted, for `RETURNING`.
fn every_column() -> String {
    job::Column::iter()
        .map(|c| format!("\"{}\"", c.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// COMPLETED for a batch of results, each guarded on (id, attempt,
/// IN_PROGRESS), in one statement per `COMPLETE_CHUNK` jobs:
///
/// ```sql
/// WITH b (b_id, b_attempt, …) AS (VALUES (?, ?, …), …)
/// UPDATE jobs SET status = 'COMPLETED', output = b.b_output, …
///   FROM b WHERE jobs.id = b.b_id AND jobs.attempt = b.b_attempt AND (jobs.status = 'IN_PROGRESS') IS TRUE
/// RETURNING <every column>
/// ```
///
/// Returns the rows that changed (a stale attempt changes nothing).
async fn complete_all<C: ConnectionTrait>(
    db: &C,
    completions: &[&Step],
    plan: &Plan,
) -> Result<Vec<job::Model>, DbErr> {
    let backend = DbBackend::Postgres;
    let returning = every_column();
    let mut changed = Vec::with_capacity(completions.len());
    for part in completions.chunks(COMPLETE_CHUNK) {
        let mut sql = String::with_capacity(256 + part.len() * 128 + returning.len());
        let mut values: Vec<sea_orm::Value> = Vec::with_capacity(part.len() * 9);
        sql.push_str(
            "WITH b (b_id, b_attempt, b_output, b_worker, b_cost, b_unit, b_quantity, b_files, b_timings) AS (VALUES ",
        );
        for (i, step) in part.iter().enumerate() {
            let Step::Complete {
                job_id,
                attempt,
                worker_id,
                output,
                usage,
                files,
                timings,
            } = step
            else {
                continue;
            };
            if i > 0 {
                sql.push_str(", ");
            }
            let row: [(sea_orm::Value, &str); 9] = [
                (job_id.as_str().into(), "TEXT"),
                ((*attempt).into(), "INTEGER"),
                (output.as_str().into(), "TEXT"),
                (worker_id.as_str().into(), "TEXT"),
                (usage.amount.into(), "BIGINT"),
                (usage.unit.as_str().into(), "TEXT"),
                (usage.quantity_micros.into(), "BIGINT"),
                (files.clone().into(), "TEXT"),
                (timings.clone().into(), "TEXT"),
            ];
            sql.push('(');
            for (k, (value, ty)) in row.into_iter().enumerate() {
                if k > 0 {
                    sql.push_str(", ");
                }
                values.push(value);
                sql.push_str(&format!("CAST(${} AS {ty})", values.len()));
            }
            sql.push(')');
        }
        sql.push_str(&format!(
            ") UPDATE jobs SET status = '{completed}', output = b.b_output, error = NULL, worker_id = b.b_worker, \
             cost_micro_usd = b.b_cost, usage_unit = b.b_unit, usage_quantity_micros = b.b_quantity, \
             completed_at_ms = {now}, expires_at_ms = CASE WHEN sync THEN {sync_until} ELSE {async_until} END, \
             lease_until_ms = NULL, files = b.b_files, worker_timings = b.b_timings \
             FROM b WHERE jobs.id = b.b_id AND jobs.attempt = b.b_attempt \
             AND (jobs.status = '{in_progress}') IS TRUE \
             RETURNING {returning}",
            completed = JobStatus::Completed.as_str(),
            in_progress = JobStatus::InProgress.as_str(),
            now = plan.now,
            sync_until = plan.sync_until,
            async_until = plan.async_until,
        ));
        let rows = job::Entity::find()
            .from_raw_sql(Statement::from_sql_and_values(backend, sql, values))
            .all(db)
            .await?;
        changed.extend(rows);
    }
    Ok(changed)
}

/// Back to IN_QUEUE while attempts remain, else FAILED with `error`. The
/// caller adds the filters.
pub(super) fn requeue_or_fail(error: &str, at: Retention) -> sea_orm::UpdateMany<job::Entity> {
    let Retention {
        now,
        sync_until,
        async_until,
    } = at;
    let more = "attempt < max_attempts";
    job::Entity::update_many()
        .col_expr(
            J::Status,
            Expr::cust(format!("CASE WHEN {more} THEN 'IN_QUEUE' ELSE 'FAILED' END")),
        )
        .col_expr(J::Error, Expr::value(error))
        .col_expr(
            J::Retries,
            Expr::cust(format!("CASE WHEN {more} THEN retries + 1 ELSE retries END")),
        )
        .col_expr(
            J::QueuedAtMs,
            Expr::cust(format!("CASE WHEN {more} THEN {now} ELSE queued_at_ms END")),
        )
        .col_expr(
            J::CompletedAtMs,
            Expr::cust(format!("CASE WHEN {more} THEN NULL ELSE {now} END")),
        )
        .col_expr(
            J::ExpiresAtMs,
            Expr::cust(format!(
                "CASE WHEN {more} THEN expires_at_ms WHEN sync THEN {sync_until} ELSE {async_until} END"
            )),
        )
        .col_expr(J::Owner, Expr::value(Option::<String>::None))
        .col_expr(J::LeaseUntilMs, Expr::value(Option::<i64>::None))
        .col_expr(J::RunDeadlineMs, Expr::value(Option::<i64>::None))
}

/// Writes the rows of unstored jobs (one statement) and the charges of the
/// completed ones; final rows go to `settled.finals`.
async fn store_all<C: ConnectionTrait>(
    db: &C,
    stores: &[Store],
    now: i64,
    file_lifetime_ms: i64,
    settled: &mut Settled,
) -> Result<(), DbErr> {
    use sea_orm::{ActiveModelTrait, IntoActiveModel};
    if stores.is_empty() {
        return Ok(());
    }
    let rows = stores.iter().map(|s| s.row.clone().into_active_model().reset_all());
    job::Entity::insert_many(rows).exec_without_returning(db).await?;
    let charges: Vec<Charge> = stores
        .iter()
        .filter_map(|s| Some(s.charge.as_ref()?.charge(&s.row)))
        .collect();
    record_charges(db, &charges, now).await?;
    let files = stores
        .iter()
        .filter(|s| s.charge.is_some())
        .flat_map(|s| file::of_job(&s.row, file_lifetime_ms))
        .collect();
    insert_files(db, files).await?;
    settled
        .finals
        .extend(stores.iter().filter(|s| is_final(&s.row)).map(|s| s.row.clone()));
    Ok(())
}

/// Records the stored objects that committed results reference.
async fn insert_files<C: ConnectionTrait>(db: &C, files: Vec<file::Model>) -> Result<(), DbErr> {
    use sea_orm::IntoActiveModel;
    if files.is_empty() {
        return Ok(());
    }
    file::Entity::insert_many(files.into_iter().map(IntoActiveModel::into_active_model))
        .on_conflict(OnConflict::column(file::Column::Key).do_nothing().to_owned())
        .exec_without_returning(db)
        .await?;
    Ok(())
}

/// Keeps the latest progress message of each running attempt (one row per job).
async fn upsert_progress<C: ConnectionTrait>(
    db: &C,
    progress: &[(String, i32, String)],
    now: i64,
) -> Result<(), DbErr> {
    use crate::entity::progress::{Column as P, Entity as ProgressEntity};
    if progress.is_empty() {
        return Ok(());
    }
    let mut insert = Query::insert();
    insert
        .into_table(ProgressEntity)
        .columns([P::JobId, P::Attempt, P::Message, P::UpdatedAtMs]);
    for (job_id, attempt, message) in progress {
        insert
            .values([
                job_id.as_str().into(),
                (*attempt).into(),
                message.as_str().into(),
                now.into(),
            ])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    insert.on_conflict(
        OnConflict::column(P::JobId)
            .update_columns([P::Attempt, P::Message, P::UpdatedAtMs])
            .to_owned(),
    );
    db.execute(&insert).await?;
    Ok(())
}

/// Stores chunks, skipping sequence numbers already stored by an earlier attempt.
async fn insert_chunks<C: ConnectionTrait>(db: &C, chunks: &[(String, i64, String)]) -> Result<(), DbErr> {
    if chunks.is_empty() {
        return Ok(());
    }
    let mut insert = Query::insert();
    insert
        .into_table(chunk::Entity)
        .columns([chunk::Column::JobId, chunk::Column::Seq, chunk::Column::Output]);
    for (job_id, seq, output) in chunks {
        insert
            .values([job_id.as_str().into(), (*seq).into(), output.as_str().into()])
            .map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    insert.on_conflict(
        OnConflict::columns([chunk::Column::JobId, chunk::Column::Seq])
            .do_nothing()
            .to_owned(),
    );
    db.execute(&insert).await?;
    Ok(())
}

/// The SQLite form of each statement of a settlement, beside the
/// PostgreSQL forms above (same guards, same columns; `?n` parameters, and
/// SQLite's `WHERE id IN (…)` claim, which has no planner trap to avoid).
/// Built once per process; the writer thread caches them prepared.
pub(super) mod sqlite {
    use std::sync::LazyLock;

    use crate::types::JobStatus;

    /// Every column of `jobs`, in the order of `job::Model`'s fields.
    pub const COLUMNS: &str = "id, user_id, model, status, input, output, error, webhook, low_priority, sync, \
        execution_timeout_ms, ttl_ms, attempt, max_attempts, retries, worker_id, owner, lease_until_ms, \
        run_deadline_ms, created_at_ms, queued_at_ms, started_at_ms, completed_at_ms, expires_at_ms, \
        cost_micro_usd, usage_unit, usage_quantity_micros, chunks_read, webhook_due_ms, trace_context, files, \
        hold_micro_usd, worker_timings";

    /// A whole row (a submit, or the first write of an unstored job).
    pub static INSERT_JOB: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
             ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33)"
        )
    });

    /// `Step::Complete`: ?1 id, ?2 attempt, ?3 output, ?4 worker, ?5 cost,
    /// ?6 unit, ?7 quantity, ?8 now, ?9/?10 sync/async retention, ?11 files,
    /// ?12 worker timings.
    pub static COMPLETE_JOB: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET status = '{completed}', output = ?3, error = NULL, worker_id = ?4, \
             cost_micro_usd = ?5, usage_unit = ?6, usage_quantity_micros = ?7, completed_at_ms = ?8, \
             expires_at_ms = CASE WHEN sync THEN ?9 ELSE ?10 END, lease_until_ms = NULL, files = ?11, \
             worker_timings = ?12 WHERE id = ?1 AND attempt = ?2 AND status = '{in_progress}' RETURNING {COLUMNS}",
            completed = JobStatus::Completed.as_str(),
            in_progress = JobStatus::InProgress.as_str(),
        )
    });

    /// `Step::Finish`: ?1 id, ?2 attempt, ?3 status, ?4 now, ?5/?6
    /// retention, ?7 error and ?8 worker (kept when NULL).
    pub static FINISH_JOB: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET status = ?3, completed_at_ms = ?4, \
             expires_at_ms = CASE WHEN sync THEN ?5 ELSE ?6 END, lease_until_ms = NULL, \
             error = COALESCE(?7, error), worker_id = COALESCE(?8, worker_id) \
             WHERE id = ?1 AND attempt = ?2 AND status = '{in_progress}' RETURNING {COLUMNS}",
            in_progress = JobStatus::InProgress.as_str(),
        )
    });

    /// `Step::Requeue` (as `requeue_or_fail`): ?1 id, ?2 attempt, ?3 error,
    /// ?4 now, ?5/?6 retention.
    pub static REQUEUE_JOB: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET \
             status = CASE WHEN attempt < max_attempts THEN '{queued}' ELSE '{failed}' END, error = ?3, \
             retries = CASE WHEN attempt < max_attempts THEN retries + 1 ELSE retries END, \
             queued_at_ms = CASE WHEN attempt < max_attempts THEN ?4 ELSE queued_at_ms END, \
             completed_at_ms = CASE WHEN attempt < max_attempts THEN NULL ELSE ?4 END, \
             expires_at_ms = CASE WHEN attempt < max_attempts THEN expires_at_ms \
               WHEN sync THEN ?5 ELSE ?6 END, \
             owner = NULL, lease_until_ms = NULL, run_deadline_ms = NULL \
             WHERE id = ?1 AND attempt = ?2 AND status = '{in_progress}' RETURNING {COLUMNS}",
            queued = JobStatus::InQueue.as_str(),
            failed = JobStatus::Failed.as_str(),
            in_progress = JobStatus::InProgress.as_str(),
        )
    });

    /// A claim (as `postgres_claim_sql`): ?1 model, ?2 instance, ?3 lease
    /// end, ?4 now, ?5 limit.
    pub static CLAIM_JOBS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET status = '{in_progress}', attempt = attempt + 1, owner = ?2, lease_until_ms = ?3, \
             started_at_ms = ?4, worker_id = NULL, run_deadline_ms = ?4 + execution_timeout_ms \
             WHERE id IN (SELECT id FROM jobs WHERE model = ?1 AND status = '{queued}' AND expires_at_ms > ?4 \
               ORDER BY low_priority ASC, id ASC LIMIT ?5) \
             AND status = '{queued}' RETURNING {COLUMNS}",
            queued = JobStatus::InQueue.as_str(),
            in_progress = JobStatus::InProgress.as_str(),
        )
    });

    /// Stream chunks, skipping sequence numbers an earlier attempt stored.
    pub const INSERT_CHUNK: &str =
        "INSERT INTO job_chunks (job_id, seq, output) VALUES (?1, ?2, ?3) ON CONFLICT (job_id, seq) DO NOTHING";

    /// The latest progress message of a running attempt.
    pub const UPSERT_PROGRESS: &str = "INSERT INTO job_progress (job_id, attempt, message, updated_at_ms) \
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt, \
         message = excluded.message, updated_at_ms = excluded.updated_at_ms";

    /// The stored objects of a completed job.
    pub const INSERT_FILE: &str = "INSERT INTO files (key, job_id, user_id, media_type, size, created_at_ms, \
         expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (key) DO NOTHING";
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use gantry_migrations::MigratorTrait;
    use sea_orm::{Database, PaginatorTrait};

    /// The claim on PostgreSQL with statistics taken while every job was
    /// finished (as after a burst of runsync jobs): with a long queue the
    /// planner then thinks the queued-jobs index holds about one row. Each
    /// claim must still take exactly its limit, oldest first, in one pass.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_claim_takes_its_limit_whatever_the_statistics() {
        let pg = gantry_testkit::PgDatabase::create().await;
        let db = Database::connect(&pg.url).await.unwrap();
        gantry_migrations::Migrator::up(&db, None).await.unwrap();
        // No autovacuum: the statistics stay those of the empty queue.
        db.execute_unprepared("ALTER TABLE jobs SET (autovacuum_enabled = false)")
            .await
            .unwrap();
        let insert = |prefix: &'static str, status: JobStatus, count: usize| {
            let db = db.clone();
            async move {
                for start in (0..count).step_by(500) {
                    let rows = (start..start + 500).map(|i| {
                        let mut row = job::sample(&format!("{prefix}-{i:05}"), "m");
                        row.status = status.as_str().into();
                        job::ActiveModel::from(row)
                    });
                    job::Entity::insert_many(rows).exec(&db).await.unwrap();
                }
            }
        };
        insert("done", JobStatus::Completed, 20_000).await;
        db.execute_unprepared("ANALYZE jobs").await.unwrap();
        insert("job", JobStatus::InQueue, 3_000).await;

        // The rows to update are found by primary key, not by walking the queue.
        let explain = format!(
            "EXPLAIN {}",
            postgres_claim_sql()
                .replace("$1", "'m'")
                .replace("$2", "10")
                .replace("$3", "64")
                .replace("$4", "'s'")
                .replace("$5", "20")
        );
        let plan_text: Vec<String> = db
            .query_all_raw(Statement::from_string(DbBackend::Postgres, explain))
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get_by_index::<String>(0).unwrap())
            .collect();
        assert!(
            plan_text.iter().any(|line| line.contains("jobs_pkey")),
            "claim plan: {plan_text:#?}"
        );

        let config = crate::SchedulerConfig::default();
        for round in 0..3 {
            let mut plan = Plan::new(10, &config, "sched-1");
            plan.claims.push(("m".into(), 64));
            let settled = execute(&db, &plan).await.unwrap();
            let mut claimed: Vec<String> = settled.claims[0].2.iter().map(|r| r.id.clone()).collect();
            claimed.sort();
            let expected: Vec<String> = (round * 64..(round + 1) * 64).map(|i| format!("job-{i:05}")).collect();
            assert_eq!(
                claimed.len(),
                64,
                "round {round}: claimed {} for a limit of 64",
                claimed.len()
            );
            assert_eq!(claimed, expected, "round {round}: the 64 oldest");
            let running = job::Entity::find()
                .filter(J::Status.eq(JobStatus::InProgress.as_str()))
                .count(&db)
                .await
                .unwrap();
            assert_eq!(running, (round + 1) * 64, "nothing claimed beyond the limits");
        }
    }
}
