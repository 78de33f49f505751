//! Worker presence: which models this instance has workers for (`worker_presence`), the
//! GPUs they report (`worker_gpus`), and worker ids not yet written to their job rows.

use std::collections::HashMap;

use gantry_dispatch::Health;
use sea_orm::sea_query::{OnConflict, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use gantry_jobs::entity::{presence, worker_gpu};
use gantry_jobs::now_ms;

use super::Core;

/// `worker_presence` rows of any instance not refreshed for this long (and
/// at least the freshness window) are deleted, at most once per this period.
const PRESENCE_PRUNE_MS: i64 = 60_000;

impl Core {
    /// Marks every model with free slots for a claim.
    pub(super) fn fill_all_with_free_slots(&mut self, health: &Health) {
        for (model, health) in &health.models {
            if health.free_slots > 0 {
                self.to_fill.insert(model.clone());
            }
        }
    }

    /// Publishes this instance's worker counts to `worker_presence`: one row
    /// per model it has workers for (one upsert statement), its rows of models
    /// without workers any more deleted. API processes without a dispatcher
    /// read them ([`JobStore::workers`]). Once a minute it also deletes rows
    /// long stale (of crashed instances).
    pub(super) async fn publish_presence(&mut self, health: &Health) -> Result<(), DbErr> {
        use presence::Column as P;
        let now = now_ms();
        let clamp = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let counts: Vec<(&String, i32, i32)> = health
            .models
            .iter()
            .filter(|(_, h)| h.idle_workers + h.running_workers + h.draining_workers > 0)
            .map(|(model, h)| (model, clamp(h.idle_workers), clamp(h.running_workers)))
            .collect();
        let gone: Vec<&str> = self
            .presence
            .iter()
            .filter(|model| !counts.iter().any(|(m, ..)| m == model))
            .map(String::as_str)
            .collect();
        let prune_before = now.saturating_sub(self.store.config().presence_window_ms().max(PRESENCE_PRUNE_MS));
        let prune = now.saturating_sub(self.presence_pruned_ms) >= PRESENCE_PRUNE_MS;
        let writer = self.parts.writer.clone();
        let turn = writer.turn().await;
        if !counts.is_empty() {
            let mut upsert = Query::insert();
            upsert.into_table(presence::Entity).columns([
                P::SchedulerId,
                P::Model,
                P::Idle,
                P::Running,
                P::UpdatedAtMs,
            ]);
            for (model, idle, running) in &counts {
                upsert
                    .values([
                        self.instance.as_str().into(),
                        model.as_str().into(),
                        (*idle).into(),
                        (*running).into(),
                        now.into(),
                    ])
                    .map_err(|e| DbErr::Custom(e.to_string()))?;
            }
            upsert.on_conflict(
                OnConflict::columns([P::SchedulerId, P::Model])
                    .update_columns([P::Idle, P::Running, P::UpdatedAtMs])
                    .to_owned(),
            );
            self.db.execute(&upsert).await?;
        }
        if !gone.is_empty() {
            presence::Entity::delete_many()
                .filter(P::SchedulerId.eq(self.instance.as_str()))
                .filter(P::Model.is_in(gone))
                .exec(&self.db)
                .await?;
        }
        if prune {
            presence::Entity::delete_many()
                .filter(P::UpdatedAtMs.lt(prune_before))
                .exec(&self.db)
                .await?;
            worker_gpu::Entity::delete_many()
                .filter(worker_gpu::Column::UpdatedAtMs.lt(prune_before))
                .exec(&self.db)
                .await?;
        }
        self.publish_gpus(now).await?;
        drop(turn);
        if prune {
            self.presence_pruned_ms = now;
        }
        self.presence = counts.into_iter().map(|(model, ..)| model.clone()).collect();
        Ok(())
    }

    /// Publishes the GPUs this instance's workers reported in their hello
    /// (`worker_gpus`: one row per GPU name, `""` for workers without a GPU;
    /// rows of names gone deleted). The caller holds the write lock.
    pub(super) async fn publish_gpus(&mut self, now: i64) -> Result<(), DbErr> {
        use worker_gpu::Column as G;
        let mut gpus: std::collections::BTreeMap<String, (i32, i64)> = std::collections::BTreeMap::new();
        for worker in self.dispatcher.workers() {
            // Workers without a GPU are counted under the empty name (CPU capacity).
            if worker.draining {
                continue;
            }
            let entry = gpus.entry(worker.gpu_name.trim().to_owned()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(i64::try_from(worker.gpu_memory_bytes).unwrap_or(i64::MAX));
        }
        if gpus.is_empty() && !self.gpus_published {
            return Ok(());
        }
        if !gpus.is_empty() {
            let mut upsert = Query::insert();
            upsert.into_table(worker_gpu::Entity).columns([
                G::SchedulerId,
                G::GpuName,
                G::Workers,
                G::MemoryBytes,
                G::UpdatedAtMs,
            ]);
            for (name, (workers, memory)) in &gpus {
                upsert
                    .values([
                        self.instance.as_str().into(),
                        name.as_str().into(),
                        (*workers).into(),
                        (*memory).into(),
                        now.into(),
                    ])
                    .map_err(|e| DbErr::Custom(e.to_string()))?;
            }
            upsert.on_conflict(
                OnConflict::columns([G::SchedulerId, G::GpuName])
                    .update_columns([G::Workers, G::MemoryBytes, G::UpdatedAtMs])
                    .to_owned(),
            );
            self.db.execute(&upsert).await?;
        }
        worker_gpu::Entity::delete_many()
            .filter(G::SchedulerId.eq(self.instance.as_str()))
            .filter(G::GpuName.is_not_in(gpus.keys().map(String::as_str)))
            .exec(&self.db)
            .await?;
        self.gpus_published = !gpus.is_empty();
        Ok(())
    }

    /// On shutdown: deletes this instance's `worker_presence` rows, so its
    /// workers stop counting at once.
    pub(super) async fn withdraw_presence(&mut self) -> Result<(), DbErr> {
        let _turn = self.parts.writer.turn().await;
        worker_gpu::Entity::delete_many()
            .filter(worker_gpu::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        presence::Entity::delete_many()
            .filter(presence::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        self.presence.clear();
        Ok(())
    }

    /// Writes the worker ids of running jobs (one statement per worker).
    pub(super) async fn flush_workers(&mut self) -> Result<(), DbErr> {
        if self.pending_workers.is_empty() {
            return Ok(());
        }
        let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
        let running = &self.running;
        // Unstored jobs keep theirs until they are written.
        let unstored = |job_id: &str| running.get(job_id).is_some_and(|r| r.unstored.is_some());
        let flush: Vec<String> = self
            .pending_workers
            .keys()
            .filter(|id| !unstored(id))
            .cloned()
            .collect();
        for job_id in flush {
            if let Some(worker_id) = self.pending_workers.remove(&job_id) {
                by_worker.entry(worker_id).or_default().push(job_id);
            }
        }
        for (worker_id, jobs) in by_worker {
            self.parts.writer.set_worker(&jobs, &self.instance, &worker_id).await?;
        }
        Ok(())
    }
}
