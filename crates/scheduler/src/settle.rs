//! Settling what workers report: one batch of events becomes one plan (completions with
//! their charges, failures, retries, chunks, progress) committed in one transaction, and
//! what the commit produced is published to waiters, live readers and other processes.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use gantry_dispatch::{DEADLINE_EXCEEDED, Event, Timings};
use sea_orm::DbErr;
use serde_json::Value;
use tokio::sync::mpsc;

use gantry_jobs::JobWriter;
use gantry_jobs::Refused;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::{Plan, Settled, Step, Store, Usage};
use gantry_jobs::{JobStatus, WorkerTimings};

use super::Context;
use super::assign::Claim;
use super::held::{Held, Running};
use super::publish::Publish;

/// Most events settled in one transaction.
const EVENT_BATCH: usize = 256;
/// How long a batch of only stream chunks and progress messages waits to be
/// stored together with later events: live readers already have them (see
/// `live.rs`), so a token stream costs one transaction per this period, not
/// one per token. A terminal event stores them at once, before itself.
const STREAM_COALESCE: Duration = Duration::from_millis(25);

/// The settlement duty: turns the events workers report into batches, each
/// settled in one transaction, and applies what it committed. It owns the
/// settlement being committed and the stream events waiting to be stored
/// with what comes next. The loop hands it each event that arrives
/// ([`Settle::offer`]), the end of its coalescing wait
/// ([`Settle::store_deferred`]) and of its commit ([`Settle::finish`]),
/// and has it [`Settle::drain`] at shutdown; it tells the claim duty what the
/// settlement freed and claimed, and has `Publish` publish what ended.
#[derive(Default)]
pub(super) struct Settle {
    /// The settlement being committed. The loop does not wait for it: it
    /// goes on placing handed-over jobs, cancelling and sweeping meanwhile.
    flight: Option<InFlight>,
    /// Chunks and progress waiting to be stored with what comes next (see
    /// `STREAM_COALESCE`), and when they are stored at the latest.
    deferred: Vec<Event>,
    deferred_until: Option<tokio::time::Instant>,
}

/// What one settled batch produced, applied after its commit.
#[derive(Default)]
struct Outcome {
    finals: Vec<job::Model>,
    settled: Vec<String>,
    refill: HashSet<String>,
    /// Jobs claimed in the same transaction: (model, how many were asked for, rows).
    claims: Vec<(String, u64, Vec<job::Model>)>,
    /// Unstored jobs the plan writes.
    stored: Vec<String>,
}

/// A settlement being committed.
type Settling = Pin<Box<dyn Future<Output = Result<Settled, DbErr>> + Send>>;

struct InFlight {
    batch: Vec<Event>,
    outcome: Outcome,
    work: Settling,
}

impl Settle {
    /// Whether a settlement is being committed.
    pub(super) fn in_flight(&self) -> bool {
        self.flight.is_some()
    }

    /// When the stream events waiting for company are stored at the latest.
    pub(super) fn stream_due(&self) -> Option<tokio::time::Instant> {
        self.deferred_until
    }

    /// The in-flight settlement's result (pending for ever if there is none).
    pub(super) async fn settling(&mut self) -> Result<Settled, DbErr> {
        match &mut self.flight {
            Some(flight) => (&mut flight.work).await,
            None => std::future::pending().await,
        }
    }

    /// An event arrived (`first`): it and those already waiting in `events`
    /// make up the next batch, settled now or, when it holds only chunks and
    /// progress, with whatever arrives in the next few ms.
    pub(super) fn offer(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        first: Event,
        events: &mut mpsc::Receiver<Event>,
    ) {
        let mut batch = std::mem::take(&mut self.deferred);
        batch.push(first);
        while batch.len() < EVENT_BATCH {
            match events.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        if batch.len() < EVENT_BATCH && batch.iter().all(|event| stream_job(event).is_some()) {
            // Readers have these live already: store them
            // with whatever arrives in the next few ms.
            self.deferred = batch;
            self.deferred_until
                .get_or_insert_with(|| tokio::time::Instant::now() + STREAM_COALESCE);
        } else {
            self.deferred_until = None;
            self.flight = Some(Self::start(ctx, held, claim, batch));
        }
    }

    /// The stream events waited long enough for company: settles them now.
    pub(super) fn store_deferred(&mut self, ctx: &Context, held: &mut Held, claim: &mut Claim) {
        self.deferred_until = None;
        self.flight = Some(Self::start(ctx, held, claim, std::mem::take(&mut self.deferred)));
    }

    /// The settlement in flight committed (or gave up): applies `done`.
    pub(super) async fn finish(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        publish: &mut Publish,
        done: Result<Settled, DbErr>,
    ) {
        if let Some(InFlight { batch, outcome, .. }) = self.flight.take() {
            Self::finish_settlement(ctx, held, claim, publish, batch, outcome, done).await;
        }
    }

    /// On shutdown: waits for the settlement in flight, then settles the
    /// events still waiting.
    pub(super) async fn drain(&mut self, ctx: &Context, held: &mut Held, claim: &mut Claim, publish: &mut Publish) {
        if let Some(InFlight { batch, outcome, work }) = self.flight.take() {
            let done = work.await;
            Self::finish_settlement(ctx, held, claim, publish, batch, outcome, done).await;
        }
        if !self.deferred.is_empty() {
            let InFlight { batch, outcome, work } = Self::start(ctx, held, claim, std::mem::take(&mut self.deferred));
            let done = work.await;
            Self::finish_settlement(ctx, held, claim, publish, batch, outcome, done).await;
        }
    }

    /// Applies a batch of events in one transaction (retried a few times on a
    /// database error). Completion and charge of a job commit together.
    fn start(ctx: &Context, held: &mut Held, claim: &mut Claim, batch: Vec<Event>) -> InFlight {
        claim.settlement_started(ctx, held);
        let (outcome, plan) = plan_settlement(ctx, held, claim, &batch);
        let work: Settling = if plan.is_empty() {
            Box::pin(std::future::ready(Ok(Settled::default())))
        } else {
            let writer = ctx.parts.writer.clone();
            // Its own task, so it makes progress while the loop is busy elsewhere.
            let task = tokio::spawn(async move {
                let mut attempt = 0u32;
                let mut plan = plan;
                loop {
                    // A refused plan comes back, so none is copied for a retry.
                    match writer.settle_or_return(plan).await {
                        Ok(settled) => return Ok(settled),
                        Err(Refused {
                            error,
                            plan: Some(back),
                        }) if attempt < 2 => {
                            tracing::warn!(%error, attempt, "settling worker events failed");
                            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                            attempt += 1;
                            plan = *back;
                        }
                        Err(Refused {
                            error,
                            plan: Some(back),
                        }) => return settle_each(&writer, &back, error).await,
                        // Lost with the SQLite writer thread: nothing can be written.
                        Err(Refused { error, plan: None }) => return Err(error),
                    }
                }
            });
            Box::pin(async move { task.await.unwrap_or_else(|e| Err(DbErr::Custom(e.to_string()))) })
        };
        InFlight { batch, outcome, work }
    }

    /// Applies a committed settlement: forgets the settled jobs, wakes their
    /// waiters, and places what it claimed.
    async fn finish_settlement(
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        publish: &mut Publish,
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
                ctx.parts.live.stored(batch.iter().filter_map(stream_job));
            }
            Err(error) => {
                tracing::warn!(%error, "giving up on settling worker events");
                // Jobs that ended only in memory (never written) are lost.
                let lost: Vec<String> = outcome
                    .settled
                    .iter()
                    .filter(|id| held.get(id).is_some_and(|r| !r.is_stored()))
                    .cloned()
                    .collect();
                for job_id in &lost {
                    held.release(job_id);
                }
                ctx.parts.outcomes.lose(&lost);
                // Left IN_PROGRESS in the database: forget them here so their
                // lease lapses and a sweep requeues them. That includes the
                // jobs of a lost worker: held, they would be renewed for ever
                // with nothing running them.
                for event in &batch {
                    for job_id in ended_jobs(event) {
                        held.release(job_id);
                    }
                }
                return;
            }
        }
        for job_id in &outcome.stored {
            if let Some(running) = held.get_mut(job_id) {
                running.unstored = None;
            }
        }
        ctx.parts.lane.stored(&outcome.stored);
        for job_id in batch.iter().filter_map(stream_job) {
            if let Some(running) = held.get_mut(job_id) {
                running.streamed = true;
            }
        }
        // Announced to other processes: the end of a `runsync` job (its
        // caller may wait there) and of a job that streamed (a reader may
        // follow it there).
        let mut streamed = HashSet::new();
        for job_id in &outcome.settled {
            if held.release(job_id).is_some_and(|running| running.streamed) {
                streamed.insert(job_id.clone());
            }
        }
        for model in outcome.refill {
            // Requeued: another process's scheduler may have a free slot first.
            ctx.parts.outcomes.signal(Signal::Queued(model.clone()));
            claim.queued(model);
        }
        publish.publish(ctx, &outcome.finals, |row| row.sync || streamed.contains(&row.id));
        for event in batch {
            if let Event::CapacityAvailable { model } = event {
                claim.slot_freed(model);
            }
        }
        // Place what the transaction claimed; a model whose queue may hold
        // more stays marked for filling.
        for (model, want, rows) in outcome.claims {
            match claim.place(ctx, held, publish, &model, want, rows).await {
                Ok(more) => claim.settled_claim(&model, more),
                Err(error) => tracing::warn!(%model, %error, "assigning claimed jobs failed"),
            }
        }
        // Jobs queued while the claim was being committed may not have been
        // seen by it: claim again rather than wait for a sweep.
        claim.settlement_finished();
    }
}

/// Models to claim for in the settlement transaction of `batch`: those
/// marked for filling, those whose slots it freed (unless their queue was
/// found empty), and those it requeues jobs of.
fn claim_models(claim: &Claim, batch: &[Event], refill: &HashSet<String>) -> Vec<String> {
    let freed = batch.iter().filter_map(|event| match event {
        Event::CapacityAvailable { model } => Some(model),
        _ => None,
    });
    let mut models = claim.claim_models(freed);
    for model in refill {
        if !models.contains(model) {
            models.push(model.clone());
        }
    }
    models
}

/// What settling `batch` writes (see `plan.rs`), and the bookkeeping to
/// apply once it is committed.
fn plan_settlement(ctx: &Context, held: &Held, claim: &Claim, batch: &[Event]) -> (Outcome, Plan) {
    let mut plan = Plan::new(now_ms(), ctx.store.config(), &ctx.instance);
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
            held.get(job_id)
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
                    let worker = held.unwritten_worker(job_id);
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
                let config = ctx.store.config();
                let kept = config.storage_prices.kept_files(kept_bytes, config.file_lifetime_ms());
                let files = (!files.is_empty()).then(|| serde_json::to_string(files).unwrap_or_default());
                let timings =
                    WorkerTimings::from_nanos(timings.queue_ns, timings.load_ns, timings.run_ns).map(|t| t.stored());
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
                let priced = match ctx.catalog.get(&running.model).or(endpoint.as_ref()) {
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
                    let Some(running) = held.get(job_id).filter(|_| !done.contains(job_id.as_str())) else {
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
    for model in claim_models(claim, batch, &outcome.refill) {
        let want = claim.want(ctx, &model);
        if want > 0 {
            plan.claims.push((model, want));
        }
    }
    (outcome, plan)
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

/// The job of a chunk or progress message: output that live readers get
/// before it is stored, so storing it can wait a little for company.
fn stream_job(event: &Event) -> Option<&str> {
    match event {
        Event::Chunk { job_id, .. } | Event::Progress { job_id, .. } => Some(job_id),
        _ => None,
    }
}

/// The jobs whose run `event` says is over on its worker: the one a result,
/// failure or cancellation ends, or every job a lost worker held.
fn ended_jobs(event: &Event) -> Vec<&str> {
    match event {
        Event::Completed { job_id, .. } | Event::Failed { job_id, .. } | Event::Cancelled { job_id, .. } => {
            vec![job_id.as_str()]
        }
        Event::WorkerLost { running_job_ids, .. } => running_job_ids.iter().map(String::as_str).collect(),
        _ => Vec::new(),
    }
}
