//! The periodic sweep: renewing this instance's leases, rechecking jobs other processes
//! cancelled, timing out runs past their deadline, requeueing jobs whose scheduler died,
//! deleting expired jobs, and refreshing PostgreSQL's statistics as the table grows (the
//! count of finished jobs is `Publish`'s, see `publish.rs`).

use std::collections::HashSet;
use std::time::Duration;

use gantry_dispatch::Event;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};

use gantry_jobs::JobStatus;
use gantry_jobs::Retention;
use gantry_jobs::Signal;
use gantry_jobs::entity::job;
use gantry_jobs::millis;
use gantry_jobs::now_ms;
use gantry_jobs::transition::plan::is_final;

use job::Column as J;

use super::Context;
use super::assign::Claim;
use super::held::{Held, Running};
use super::publish::Publish;
use super::worker_presence::Presence;

/// Expired jobs deleted per round, and rounds per sweep.
const EXPIRE_BATCH: u64 = 1000;
const EXPIRE_ROUNDS: usize = 10;

/// The sweep duty: leases, rechecks, timeouts, orphans and expiry. It owns
/// the presence duty ([`Presence`]) and the running jobs to recheck. The loop
/// calls it at each tick ([`Sweep::sweep`]), when a held job is due
/// ([`Sweep::deadlines`]), with what a wake-up asks to recheck and between
/// settlements; it tells the claim duty which models may have queued jobs,
/// has it write the worker ids and due jobs, and has `Publish` publish what
/// it ended.
pub(super) struct Sweep {
    /// The presence duty (`worker_presence.rs`), with its own state.
    presence: Presence,
    /// Running jobs another process signalled cancelled: their rows are
    /// checked between settlements (see `recheck`).
    rechecks: HashSet<String>,
    /// Held jobs that no worker ran at the last look (see [`Sweep::unrun`]).
    unrun: HashSet<String>,
}

impl Sweep {
    pub(super) fn new(presence: Presence) -> Self {
        Self {
            presence,
            rechecks: HashSet::new(),
            unrun: HashSet::new(),
        }
    }

    pub(super) async fn sweep(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        publish: &mut Publish,
    ) -> Result<(), DbErr> {
        let result = self.sweep_rows(ctx, held, claim, publish).await;
        // Claim anything left queued (submitted elsewhere, or a lost wake-up),
        // even when a step above failed (a slow or lost connection): the
        // claim is the fallback that keeps a queued job from waiting for
        // a wake-up that may never come.
        let health = ctx.dispatcher.health();
        claim.all_with_free_slots(&health, false);
        result
    }

    /// The sweep's row work: leases, timeouts, orphans, expiry, worker
    /// rows, webhook deliveries and presence, in that order; the first
    /// failure stops it until the next sweep.
    pub(super) async fn sweep_rows(
        &mut self,
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        publish: &mut Publish,
    ) -> Result<(), DbErr> {
        publish.refresh_statistics(&ctx.db).await;
        self.renew(ctx, held).await?;
        self.time_out(ctx, held, publish).await?;
        self.requeue_orphans(ctx, held, claim, publish, false).await?;
        self.expire(ctx, held).await?;
        claim.flush_workers(ctx, held).await?;
        publish.take_over(now_ms()).await?;
        let health = ctx.dispatcher.health();
        self.presence.publish(&health, &ctx.dispatcher).await
    }

    /// The jobs this instance holds as assigned that no worker runs, at this
    /// look and at the one before, with no worker event waiting in between
    /// (`events_waiting` false): a worker's result or loss is reported as an
    /// event the moment the dispatcher forgets the job, so such a job's end
    /// was lost on the way, and nothing would ever settle it while its lease
    /// is renewed. They are returned as one lost worker's jobs, for the
    /// settlement to requeue (a retry, counted against their attempts).
    /// Called between settlements only: one in flight still holds its jobs.
    pub(super) fn unrun(&mut self, ctx: &Context, held: &Held, events_waiting: bool) -> Option<Event> {
        let assigned = held.iter().filter(|(_, r)| r.assigned).map(|(id, _)| id.clone());
        let missing: HashSet<String> = ctx.dispatcher.not_running(assigned).into_iter().collect();
        let seen_before = std::mem::replace(&mut self.unrun, missing);
        if events_waiting {
            return None;
        }
        let mut lost: Vec<String> = self.unrun.intersection(&seen_before).cloned().collect();
        if lost.is_empty() {
            return None;
        }
        lost.sort();
        for job_id in &lost {
            self.unrun.remove(job_id);
        }
        tracing::error!(jobs = ?lost, "held jobs that no worker runs: their end was never reported; requeueing them");
        Some(Event::WorkerLost {
            worker_id: String::new(),
            running_job_ids: lost,
        })
    }

    /// A held job is due (see `Held::next_due`): writes the unstored jobs
    /// due (see `Claim::store_due`), then ends those past their deadline.
    pub(super) async fn deadlines(&self, ctx: &Context, held: &mut Held, claim: &Claim, publish: &mut Publish) {
        if let Err(error) = claim.store_due(ctx, held).await {
            tracing::warn!(%error, "writing running jobs failed");
        }
        let now = now_ms();
        let timed_out = held.any_overdue(now);
        if timed_out && let Err(error) = self.time_out(ctx, held, publish).await {
            tracing::warn!(%error, "timeout sweep failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Notes running jobs another process signalled cancelled (those held
    /// with a written row), to recheck between settlements.
    pub(super) fn recheck_soon(&mut self, ids: HashSet<String>, held: &Held) {
        self.rechecks.extend(
            ids.into_iter()
                .filter(|id| held.get(id).is_some_and(Running::is_stored)),
        );
    }

    /// Rechecks the jobs noted by [`Sweep::recheck_soon`], if any.
    pub(super) async fn recheck_signalled(&mut self, ctx: &Context, held: &mut Held) {
        if !self.rechecks.is_empty() {
            let ids: Vec<String> = self.rechecks.drain().collect();
            if let Err(error) = self.recheck(ctx, held, ids).await {
                tracing::warn!(%error, "checking cancelled jobs failed");
            }
        }
    }

    /// On shutdown: withdraws this instance's worker presence (see
    /// [`Presence::withdraw`]).
    pub(super) async fn withdraw(&mut self) -> Result<(), DbErr> {
        self.presence.withdraw().await
    }

    /// Renews this instance's lease on the jobs it runs, and learns which of
    /// them ended elsewhere (cancelled, timed out, expired, requeued): those
    /// are stopped on their workers.
    pub(super) async fn renew(&self, ctx: &Context, held: &mut Held) -> Result<(), DbErr> {
        if held.is_empty() {
            return Ok(());
        }
        // Unstored jobs have no row to renew (nor can anything end them elsewhere).
        let ids = held.stored_where(|_| true);
        self.recheck(ctx, held, ids).await
    }

    /// Renews the leases of these running jobs, and stops those whose rows
    /// are no longer this instance's running attempt (cancelled, timed out or
    /// requeued elsewhere). The sweep does it for every running job; a
    /// cancel signalled by another process does it for that job at once.
    pub(super) async fn recheck(&self, ctx: &Context, held: &mut Held, ids: Vec<String>) -> Result<(), DbErr> {
        let lease_until = now_ms().saturating_add(millis(ctx.store.config().lease));
        let alive: HashSet<(String, i32)> = ctx
            .parts
            .writer
            .renew(&ids, &ctx.instance, lease_until)
            .await?
            .into_iter()
            .collect();
        let gone: Vec<String> = ids
            .into_iter()
            .filter(|id| {
                held.get(id)
                    .is_some_and(|r| r.is_stored() && !alive.contains(&(id.clone(), r.attempt)))
            })
            .collect();
        for job_id in gone {
            held.release(&job_id);
            ctx.dispatcher.cancel(&job_id, "job ended");
        }
        Ok(())
    }

    /// Ends every running job (of any scheduler) past its execution timeout.
    pub(super) async fn time_out(&self, ctx: &Context, held: &mut Held, publish: &mut Publish) -> Result<(), DbErr> {
        let now = now_ms();
        let rows = ctx
            .parts
            .writer
            .time_out(Retention::of(ctx.store.config(), now))
            .await?;
        // Every job of ours that is due has now ended: timed out by this
        // statement, or already finished elsewhere. Stop them all (but those
        // not written yet: they are written first, see `store_due`).
        let due = held.stored_where(|r| r.deadline_ms <= now);
        for job_id in due {
            held.release(&job_id);
            ctx.dispatcher.cancel(&job_id, "execution timeout");
        }
        publish.publish(ctx, &rows, |_| true);
        Ok(())
    }

    /// Requeues running jobs whose scheduler's lease lapsed (it crashed or lost
    /// the database), or fails them once out of attempts; with `all`, every
    /// running job, leased or not (at the start of the database's sole owner).
    pub(super) async fn requeue_orphans(
        &self,
        ctx: &Context,
        held: &mut Held,
        claim: &mut Claim,
        publish: &mut Publish,
        all: bool,
    ) -> Result<(), DbErr> {
        let now = now_ms();
        let lapsed = if all { i64::MAX } else { now };
        let rows = ctx
            .parts
            .writer
            .requeue_orphans(Retention::of(ctx.store.config(), now), lapsed)
            .await?;
        if all && !rows.is_empty() {
            tracing::info!(jobs = rows.len(), "requeued the jobs a previous process left running");
        }
        let mut requeued = HashSet::new();
        for row in &rows {
            if held.release(&row.id).is_some() {
                ctx.dispatcher.cancel(&row.id, "lease lapsed");
            }
            claim.queued(row.model.clone());
            if row.status == JobStatus::InQueue.as_str() && requeued.insert(row.model.as_str()) {
                ctx.parts.outcomes.signal(Signal::Queued(row.model.clone()));
            }
        }
        let finals: Vec<job::Model> = rows.into_iter().filter(is_final).collect();
        publish.publish(ctx, &finals, |_| true);
        Ok(())
    }

    /// Deletes jobs past their TTL (queued or running) or their result
    /// retention (finished), with their chunks.
    pub(super) async fn expire(&self, ctx: &Context, held: &mut Held) -> Result<(), DbErr> {
        // A few rounds per sweep, so a backlog shrinks at high throughput.
        for _ in 0..EXPIRE_ROUNDS {
            if self.expire_some(ctx, held).await? < EXPIRE_BATCH {
                break;
            }
        }
        Ok(())
    }

    /// Deletes up to `EXPIRE_BATCH` expired jobs; returns how many were found.
    pub(super) async fn expire_some(&self, ctx: &Context, held: &mut Held) -> Result<u64, DbErr> {
        let now = now_ms();
        let doomed: Vec<String> = job::Entity::find()
            .select_only()
            .column(J::Id)
            .filter(J::ExpiresAtMs.lte(now))
            .limit(EXPIRE_BATCH)
            .into_tuple()
            .all(&ctx.db)
            .await?;
        let found = doomed.len() as u64;
        // A job retried since it was listed is kept (the writer's guard).
        for job_id in ctx.parts.writer.expire(&doomed, now).await? {
            if held.release(&job_id).is_some() {
                ctx.dispatcher.cancel(&job_id, "ttl expired");
            }
        }
        Ok(found)
    }
}
