//! Settling what workers report: one batch of events becomes one plan (completions with
//! their charges, failures, retries, chunks, progress) committed in one transaction, and
//! what the commit produced is published to waiters, live readers and other processes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use gantry_dispatch::{DEADLINE_EXCEEDED, Event, Timings};
use sea_orm::DbErr;
use serde_json::Value;

use gantry_jobs::JobWriter;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::{Plan, Settled, Step, Store, Usage};
use gantry_jobs::{JobStatus, JobView, WorkerTimings};

use super::held::Running;
use super::{Core, InFlight, Outcome, Settling, stream_job, terminal_job};

impl Core {
    /// Applies a batch of events in one transaction (retried a few times on a
    /// database error). Completion and charge of a job commit together.
    pub(super) fn start_settlement(&mut self, batch: Vec<Event>) -> InFlight {
        self.demand.settlement_started();
        // Freed slots take jobs kept ready before anything is written.
        if self.demand.has_ready() {
            self.assign_ready();
        }
        let (outcome, plan) = self.plan_settlement(&batch);
        let work: Settling = if plan.is_empty() {
            Box::pin(std::future::ready(Ok(Settled::default())))
        } else {
            let writer = self.parts.writer.clone();
            // Its own task, so it makes progress while the loop is busy elsewhere.
            let task = tokio::spawn(async move {
                let mut attempt = 0u32;
                loop {
                    match writer.settle(plan.clone()).await {
                        Ok(settled) => return Ok(settled),
                        Err(error) if attempt < 2 => {
                            tracing::warn!(%error, attempt, "settling worker events failed");
                            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                            attempt += 1;
                        }
                        Err(error) => return settle_each(&writer, &plan, error).await,
                    }
                }
            });
            Box::pin(async move { task.await.unwrap_or_else(|e| Err(DbErr::Custom(e.to_string()))) })
        };
        InFlight { batch, outcome, work }
    }

    /// Applies a committed settlement: forgets the settled jobs, wakes their
    /// waiters, and places what it claimed.
    pub(super) async fn finish_settlement(
        &mut self,
        batch: Vec<Event>,
        mut outcome: Outcome,
        done: Result<Settled, DbErr>,
    ) {
        match done {
            Ok(settled) => {
                // What the workers reported of the completed jobs that
                // committed: metrics by model, and attributes of their spans.
                let reported: HashMap<&str, &Timings> = batch
                    .iter()
                    .filter_map(|event| match event {
                        Event::Completed { job_id, timings, .. } => Some((job_id.as_str(), timings)),
                        _ => None,
                    })
                    .collect();
                let observed = gantry_telemetry::metrics();
                for row in &settled.finals {
                    if let Some(t) = reported.get(row.id.as_str()) {
                        observed.job_worker_timings(
                            &row.model,
                            Duration::from_nanos(t.queue_ns),
                            Duration::from_nanos(t.load_ns),
                            Duration::from_nanos(t.run_ns),
                        );
                    }
                }
                // One span per job whose final status committed, in its
                // trace, and one for the batch (a trace of its own) linking
                // the jobs it settled in one transaction.
                if gantry_telemetry::trace::enabled() && !settled.finals.is_empty() {
                    let batch = tracing::info_span!(parent: None, "settlement", jobs = settled.finals.len());
                    for row in &settled.finals {
                        let span = tracing::info_span!(
                            "job.settle",
                            job_id = %row.id,
                            status = %row.status,
                            worker.queue_ms = tracing::field::Empty,
                            worker.load_ms = tracing::field::Empty,
                            worker.run_ms = tracing::field::Empty,
                        );
                        if let Some(t) = reported.get(row.id.as_str()) {
                            span.record("worker.queue_ms", millis(t.queue_ns));
                            span.record("worker.load_ms", millis(t.load_ns));
                            span.record("worker.run_ms", millis(t.run_ns));
                        }
                        gantry_telemetry::trace::set_parent(&span, row.trace_context.as_deref());
                        gantry_telemetry::trace::add_link(&batch, row.trace_context.as_deref());
                    }
                }
                outcome.finals = settled.finals;
                outcome.claims = settled.claims;
                // Chunks and progress are stored: readers of this process
                // that were missing one (a gap) can read it now.
                self.parts.live.stored(batch.iter().filter_map(stream_job));
            }
            Err(error) => {
                tracing::warn!(%error, "giving up on settling worker events");
                // Jobs that ended only in memory (never written) are lost.
                let lost: Vec<String> = outcome
                    .settled
                    .iter()
                    .filter(|id| self.held.get(id).is_some_and(|r| !r.is_stored()))
                    .cloned()
                    .collect();
                for job_id in &lost {
                    self.held.release(job_id);
                }
                self.parts.outcomes.lose(&lost);
                // Left IN_PROGRESS in the database: forget them here so their
                // lease lapses and a sweep requeues them.
                for event in &batch {
                    if let Some(job_id) = terminal_job(event) {
                        self.held.release(job_id);
                    }
                }
                return;
            }
        }
        for job_id in &outcome.stored {
            if let Some(running) = self.held.get_mut(job_id) {
                running.unstored = None;
            }
        }
        self.parts.lane.stored(&outcome.stored);
        for job_id in batch.iter().filter_map(stream_job) {
            if let Some(running) = self.held.get_mut(job_id) {
                running.streamed = true;
            }
        }
        // Announced to other processes: the end of a `runsync` job (its
        // caller may wait there) and of a job that streamed (a reader may
        // follow it there).
        let mut streamed = HashSet::new();
        for job_id in &outcome.settled {
            if self.held.release(job_id).is_some_and(|running| running.streamed) {
                streamed.insert(job_id.clone());
            }
        }
        for model in outcome.refill {
            // Requeued: another process's scheduler may have a free slot first.
            self.parts.outcomes.signal(Signal::Queued(model.clone()));
            self.demand.queued(model);
        }
        self.publish(&outcome.finals, |row| row.sync || streamed.contains(&row.id));
        for event in batch {
            if let Event::CapacityAvailable { model } = event {
                self.demand.slot_freed(model);
            }
        }
        // Place what the transaction claimed; a model whose queue may hold
        // more stays marked for filling.
        for (model, want, rows) in outcome.claims {
            match self.place(&model, want, rows).await {
                Ok(more) => self.demand.settled_claim(&model, more),
                Err(error) => tracing::warn!(%model, %error, "assigning claimed jobs failed"),
            }
        }
        // Jobs queued while the claim was being committed may not have been
        // seen by it: claim again rather than wait for a sweep.
        self.demand.settlement_finished();
    }

    /// Models to claim for in the settlement transaction of `batch`: those
    /// marked for filling, those whose slots it freed (unless their queue was
    /// found empty), and those it requeues jobs of.
    pub(super) fn claim_models(&self, batch: &[Event], refill: &HashSet<String>) -> Vec<String> {
        let freed = batch.iter().filter_map(|event| match event {
            Event::CapacityAvailable { model } => Some(model),
            _ => None,
        });
        let mut models = self.demand.claim_models(freed);
        for model in refill {
            if !models.contains(model) {
                models.push(model.clone());
            }
        }
        models
    }

    /// What settling `batch` writes (see `plan.rs`), and the bookkeeping to
    /// apply once it is committed.
    pub(super) fn plan_settlement(&self, batch: &[Event]) -> (Outcome, Plan) {
        let mut plan = Plan::new(now_ms(), self.store.config(), &self.instance);
        let mut outcome = Outcome::default();
        // Jobs already settled earlier in this batch (duplicates are ignored).
        let mut done: HashSet<&str> = HashSet::new();
        // Unstored jobs this plan writes as running (they streamed a chunk):
        // later events of the batch update that row like any other.
        let mut written: HashSet<&str> = HashSet::new();
        // Where each job's progress message is in `plan.progress` (the
        // batch's latest one wins: one write per job per batch).
        let mut progress_at: HashMap<&str, usize> = HashMap::new();
        for event in batch {
            let current = |job_id: &str, attempt: u32| {
                self.held
                    .get(job_id)
                    .filter(|r| i64::from(r.attempt) == i64::from(attempt) && !done.contains(job_id))
            };
            // The in-memory row of an unstored job, if it still is.
            let unstored = |running: &Running, job_id: &str| {
                running
                    .unstored
                    .as_deref()
                    .filter(|_| !written.contains(job_id))
                    .cloned()
            };
            match event {
                Event::Chunk {
                    job_id,
                    attempt,
                    seq,
                    output,
                    ..
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    // Chunks are read by job id: write the job first.
                    if let Some(row) = unstored(running, job_id) {
                        let worker = self.held.unwritten_worker(job_id);
                        plan.stores.push(Store {
                            row: plan.running(row, worker),
                            charge: None,
                        });
                        outcome.stored.push(job_id.clone());
                        written.insert(job_id);
                    }
                    let seq = i64::try_from(*seq).unwrap_or(i64::MAX);
                    plan.chunks.push((job_id.clone(), seq, output.to_string()));
                }
                Event::Completed {
                    job_id,
                    attempt,
                    worker_id,
                    output,
                    usage,
                    files,
                    timings,
                } => {
                    // The files are kept until their URLs expire: that stay is
                    // charged with the job, beside the model's usage.
                    let kept_bytes = files.iter().map(|file| file.size).fold(0u64, u64::saturating_add);
                    let config = self.store.config();
                    let kept = config.storage_prices.kept_files(kept_bytes, config.file_lifetime_ms());
                    let files = (!files.is_empty()).then(|| serde_json::to_string(files).unwrap_or_default());
                    let timings = WorkerTimings::from_nanos(timings.queue_ns, timings.load_ns, timings.run_ns)
                        .map(|t| t.stored());
                    let Some(running) = current(job_id, *attempt) else {
                        tracing::debug!(%job_id, attempt, "ignoring a result for an attempt not running here");
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    // A user's endpoint is priced by its workers' time, not per job.
                    let endpoint = gantry_catalog::is_endpoint_id(&running.model)
                        .then(|| gantry_catalog::ModelSpec::endpoint(running.model.clone()));
                    let priced = match self.catalog.get(&running.model).or(endpoint.as_ref()) {
                        Some(spec) => gantry_billing::cost(usage.quantity_micros, &usage.unit, spec)
                            .map_err(|e| format!("cannot bill the result: {e}")),
                        None => Err(format!("model {:?} is not in the catalog", running.model)),
                    };
                    let priced = priced.and_then(|amount| {
                        Ok(Usage {
                            unit: usage.unit.clone(),
                            quantity_micros: usage.quantity_micros,
                            amount: amount
                                .checked_add(kept)
                                .ok_or_else(|| "cannot bill the result: its cost does not fit in 64 bits".to_owned())?,
                        })
                    });
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        plan.stores.push(match priced {
                            Ok(usage) => Store {
                                row: plan.completed(
                                    row,
                                    worker_id,
                                    if endpoint.is_some() {
                                        // A user's output is theirs, unchanged.
                                        output.to_string()
                                    } else {
                                        output_with_cost(output, usage.amount)
                                    },
                                    &usage,
                                    files,
                                    timings,
                                ),
                                charge: Some(usage),
                            },
                            Err(error) => Store {
                                row: plan.finished(row, JobStatus::Failed, Some(error), Some(worker_id.clone())),
                                charge: None,
                            },
                        });
                        continue;
                    }
                    plan.steps.push(match priced {
                        Ok(usage) => Step::Complete {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            worker_id: worker_id.clone(),
                            output: if endpoint.is_some() {
                                // A user's output is theirs, unchanged.
                                output.to_string()
                            } else {
                                output_with_cost(output, usage.amount)
                            },
                            usage,
                            files,
                            timings,
                        },
                        Err(error) => Step::Finish {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            status: JobStatus::Failed,
                            error: Some(error),
                            worker_id: Some(worker_id.clone()),
                        },
                    });
                }
                Event::Failed {
                    job_id,
                    attempt,
                    worker_id,
                    error,
                    retryable,
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    let status = if error == DEADLINE_EXCEEDED {
                        JobStatus::TimedOut
                    } else {
                        JobStatus::Failed
                    };
                    if *retryable {
                        outcome.refill.insert(running.model.clone());
                    }
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        let row = if *retryable {
                            plan.requeued(row, error)
                        } else {
                            plan.finished(row, status, Some(error.clone()), Some(worker_id.clone()))
                        };
                        plan.stores.push(Store { row, charge: None });
                    } else if *retryable {
                        plan.steps.push(Step::Requeue {
                            job_id: job_id.clone(),
                            attempt: i64::from(running.attempt),
                            error: error.clone(),
                        });
                    } else {
                        plan.steps.push(Step::Finish {
                            job_id: job_id.clone(),
                            attempt: i64::from(*attempt),
                            status,
                            error: Some(error.clone()),
                            worker_id: Some(worker_id.clone()),
                        });
                    }
                }
                Event::Cancelled { job_id, attempt, .. } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    let row = unstored(running, job_id);
                    done.insert(job_id);
                    outcome.settled.push(job_id.clone());
                    if let Some(row) = row {
                        outcome.stored.push(job_id.clone());
                        plan.stores.push(Store {
                            row: plan.finished(row, JobStatus::Cancelled, None, None),
                            charge: None,
                        });
                        continue;
                    }
                    // Normally already CANCELLED (or TIMED_OUT) in the database.
                    plan.steps.push(Step::Finish {
                        job_id: job_id.clone(),
                        attempt: i64::from(*attempt),
                        status: JobStatus::Cancelled,
                        error: None,
                        worker_id: None,
                    });
                }
                Event::WorkerLost { running_job_ids, .. } => {
                    for job_id in running_job_ids {
                        let Some(running) = self.held.get(job_id).filter(|_| !done.contains(job_id.as_str())) else {
                            continue;
                        };
                        let row = unstored(running, job_id);
                        done.insert(job_id);
                        outcome.settled.push(job_id.clone());
                        outcome.refill.insert(running.model.clone());
                        if let Some(row) = row {
                            outcome.stored.push(job_id.clone());
                            plan.stores.push(Store {
                                row: plan.requeued(row, "worker lost"),
                                charge: None,
                            });
                            continue;
                        }
                        plan.steps.push(Step::Requeue {
                            job_id: job_id.clone(),
                            attempt: i64::from(running.attempt),
                            error: "worker lost".into(),
                        });
                    }
                }
                Event::Progress {
                    job_id,
                    attempt,
                    message,
                    ..
                } => {
                    let Some(running) = current(job_id, *attempt) else {
                        continue;
                    };
                    // A job not written yet has no row to show progress on.
                    if unstored(running, job_id).is_some() {
                        continue;
                    }
                    let text = message.to_string();
                    match progress_at.get(job_id.as_str()) {
                        Some(&i) => plan.progress[i].2 = text,
                        None => {
                            progress_at.insert(job_id.as_str(), plan.progress.len());
                            plan.progress
                                .push((job_id.clone(), i32::try_from(*attempt).unwrap_or(i32::MAX), text));
                        }
                    }
                }
                Event::CapacityAvailable { .. } => {}
            }
        }
        // The slots these results freed: claim their next jobs in the same
        // commit (one write lock and one commit fewer per round). They are
        // assigned after the commit.
        for model in self.claim_models(batch, &outcome.refill) {
            let want = self.want(&model);
            if want > 0 {
                plan.claims.push((model, want));
            }
        }
        (outcome, plan)
    }

    /// Wakes in-process waiters and sends webhooks for jobs that just ended.
    /// `announce` says which of them other processes are told about (when
    /// Redis signals are configured): those a caller or reader may follow
    /// there. The rare bulk endings (timeouts, orphans) announce all.
    pub(super) fn publish(&mut self, finals: &[job::Model], announce: impl Fn(&job::Model) -> bool) {
        self.statistics.finished(finals.len());
        if finals.is_empty() {
            return;
        }
        let now = now_ms();
        let observed = gantry_telemetry::metrics();
        for row in finals {
            let ms = |from: i64, to: Option<i64>| {
                to.map(|to| std::time::Duration::from_millis(u64::try_from(to - from).unwrap_or(0)))
            };
            let delay = row
                .started_at_ms
                .and_then(|started| ms(row.queued_at_ms, Some(started)));
            let execution = row.started_at_ms.and_then(|started| ms(started, row.completed_at_ms));
            observed.job_finished(&row.model, delay, execution);
        }
        let views: Vec<JobView> = finals.iter().map(|row| JobView::of(row, now)).collect();
        self.parts.outcomes.finished(&views, |i| announce(&finals[i]));
        for (row, view) in finals.iter().zip(views) {
            if let Some(url) = row.webhook.clone() {
                self.webhooks.send(url, row.user_id.clone(), view, row.completed_at_ms);
            }
        }
    }

    // ---- claiming and assigning ----

    /// Runs `plan` now, waiting for its commit (see `JobWriter::settle`).
    pub(super) async fn run_plan(&self, plan: Plan) -> Result<Settled, DbErr> {
        self.parts.writer.settle(plan).await
    }
}

/// Settles `plan` job by job, after it failed whole with `error`: a job whose
/// own writes the database refuses (a value it cannot store) is written
/// `FAILED` instead, alone, and every other job of the batch settles as
/// planned. Fails with `error` only when nothing could be written (the
/// database is unreachable): the batch is then given up as before.
async fn settle_each(writer: &JobWriter, plan: &Plan, error: DbErr) -> Result<Settled, DbErr> {
    let mut settled = Settled::default();
    let mut committed = false;
    for (job_id, part) in plan.split_by_job() {
        let refused = match writer.settle(part.clone()).await {
            Ok(done) => {
                committed = true;
                settled.finals.extend(done.finals);
                settled.claims.extend(done.claims);
                continue;
            }
            Err(refused) => refused,
        };
        let Some(job_id) = job_id else {
            tracing::warn!(error = %refused, "claiming jobs failed");
            continue;
        };
        tracing::error!(%job_id, error = %refused, "the database refused a job's result; the job fails alone");
        let instead = part.failed_instead(&format!("the job's result could not be stored: {refused}"));
        match writer.settle(instead).await {
            Ok(done) => {
                committed = true;
                settled.finals.extend(done.finals);
            }
            Err(again) => tracing::warn!(%job_id, error = %again, "failing the job failed too"),
        }
    }
    if committed { Ok(settled) } else { Err(error) }
}

/// The stored output: an object gets `"cost"` (USD); anything else is stored
/// as the model returned it (the cost is in the ledger).
fn output_with_cost(output: &Value, amount: i64) -> String {
    match output {
        Value::Object(map) => {
            let cost = serde_json::Number::from_f64(gantry_billing::usd(amount)).map_or(Value::Null, Value::Number);
            let mut map = map.clone();
            map.insert("cost".into(), cost);
            Value::Object(map).to_string()
        }
        other => other.to_string(),
    }
}

/// Nanoseconds as fractional milliseconds, for span attributes.
fn millis(ns: u64) -> f64 {
    ns as f64 / 1e6
}
