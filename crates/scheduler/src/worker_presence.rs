//! The presence duty: which models this instance has workers for
//! (`worker_presence`) and the GPUs they report (`worker_gpus`), published
//! at each sweep and withdrawn at shutdown. It owns its state; the sweep
//! duty (`sweep.rs`) owns it and calls [`Presence::publish`], and
//! [`Presence::withdraw`] when the loop has it withdraw at shutdown.

use std::collections::HashSet;

use gantry_dispatch::{Dispatcher, Health};
use sea_orm::sea_query::{OnConflict, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter};

use gantry_jobs::JobWriter;
use gantry_jobs::entity::{presence, worker_gpu};
use gantry_jobs::now_ms;

/// `worker_presence` rows of any instance not refreshed for this long (and
/// at least the freshness window) are deleted, at most once per this period.
const PRESENCE_PRUNE_MS: i64 = 60_000;

/// What this instance has published about its workers.
pub(super) struct Presence {
    instance: String,
    db: DatabaseConnection,
    /// The rows are written in the job writer's turn.
    writer: JobWriter,
    /// How long rows of other instances count (prunes after it).
    window_ms: i64,
    /// Models this instance has `worker_presence` rows for.
    models: HashSet<String>,
    /// Whether `worker_gpus` holds rows of this instance.
    gpus_published: bool,
    /// When this instance last pruned long-stale rows.
    pruned_ms: i64,
}

impl Presence {
    pub(super) fn new(instance: &str, db: DatabaseConnection, writer: JobWriter, window_ms: i64) -> Self {
        Self {
            instance: instance.to_owned(),
            db,
            writer,
            window_ms,
            models: HashSet::new(),
            gpus_published: false,
            pruned_ms: 0,
        }
    }

    /// Publishes this instance's worker counts to `worker_presence`: one row
    /// per model it has workers for (one upsert statement), its rows of models
    /// without workers any more deleted. API processes without a dispatcher
    /// read them (`Census::workers`). Once a minute it also deletes rows
    /// long stale (of crashed instances).
    pub(super) async fn publish(&mut self, health: &Health, dispatcher: &Dispatcher) -> Result<(), DbErr> {
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
            .models
            .iter()
            .filter(|model| !counts.iter().any(|(m, ..)| m == model))
            .map(String::as_str)
            .collect();
        let prune_before = now.saturating_sub(self.window_ms.max(PRESENCE_PRUNE_MS));
        let prune = now.saturating_sub(self.pruned_ms) >= PRESENCE_PRUNE_MS;
        let writer = self.writer.clone();
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
        self.publish_gpus(now, dispatcher).await?;
        drop(turn);
        if prune {
            self.pruned_ms = now;
        }
        self.models = counts.into_iter().map(|(model, ..)| model.clone()).collect();
        Ok(())
    }

    /// Publishes the GPUs this instance's workers reported in their hello
    /// (`worker_gpus`: one row per GPU name, `""` for workers without a GPU;
    /// rows of names gone deleted). The caller holds the write lock.
    async fn publish_gpus(&mut self, now: i64, dispatcher: &Dispatcher) -> Result<(), DbErr> {
        use worker_gpu::Column as G;
        let mut gpus: std::collections::BTreeMap<String, (i32, i64)> = std::collections::BTreeMap::new();
        for worker in dispatcher.workers() {
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
    pub(super) async fn withdraw(&mut self) -> Result<(), DbErr> {
        let _turn = self.writer.turn().await;
        worker_gpu::Entity::delete_many()
            .filter(worker_gpu::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        presence::Entity::delete_many()
            .filter(presence::Column::SchedulerId.eq(self.instance.as_str()))
            .exec(&self.db)
            .await?;
        self.models.clear();
        Ok(())
    }
}
