//! The sweeper of output files: deletes files past their lifetime, and
//! objects that no committed result references (orphans).
//!
//! Each stored object of a committed result has a `files` row, written in the
//! transaction of the completion. An object without a row was stored for an
//! attempt whose result never committed: the attempt failed or was
//! cancelled after sending it (the dispatcher deletes those at once), its
//! completion was stale, or the process died in between. Objects without a
//! row are deleted once older than `files.orphan_grace_secs` (an hour by
//! default: far longer than any result takes to commit after its files).
//! Several schedulers may sweep the same store: deletes are idempotent. It is
//! one of the scheduler's duties, started beside its loop when the platform
//! stores files.

use std::time::Duration;

use gantry_files::Files;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use gantry_jobs::JobWriter;
use gantry_jobs::entity::file;
use gantry_jobs::now_ms;

/// Expired files deleted per round.
const BATCH: u64 = 256;

/// Runs until aborted.
pub async fn sweep(files: Files, db: DatabaseConnection, writer: JobWriter) {
    // Expired files are looked for every 10 s (more often for short
    // lifetimes), orphans a few times per grace period.
    let expiry_period = (files.lifetime() / 4).clamp(Duration::from_millis(250), Duration::from_secs(10));
    let orphan_period = (files.orphan_grace() / 4).clamp(Duration::from_millis(500), Duration::from_secs(900));
    let mut last_orphans: Option<tokio::time::Instant> = None;
    loop {
        match delete_expired(&files, &db, &writer, now_ms()).await {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "expired output files deleted"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "deleting expired output files failed"),
        }
        if last_orphans.is_none_or(|at| at.elapsed() >= orphan_period) {
            last_orphans = Some(tokio::time::Instant::now());
            match delete_orphans(&files, &db, now_ms()).await {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "unreferenced output files deleted"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "deleting unreferenced output files failed"),
            }
        }
        tokio::time::sleep(expiry_period.min(orphan_period)).await;
    }
}

/// Deletes the objects past their lifetime, then their rows; returns how many.
async fn delete_expired(files: &Files, db: &DatabaseConnection, writer: &JobWriter, now: i64) -> Result<usize, String> {
    let mut total = 0;
    loop {
        let keys: Vec<String> = file::Entity::find()
            .select_only()
            .column(file::Column::Key)
            .filter(file::Column::ExpiresAtMs.lte(now))
            .order_by_asc(file::Column::ExpiresAtMs)
            .limit(BATCH)
            .into_tuple()
            .all(db)
            .await
            .map_err(|e| e.to_string())?;
        if keys.is_empty() {
            return Ok(total);
        }
        // The object first: a row without its object is harmless (its URL
        // answers 404), an object without a row would be an orphan.
        files.delete(&keys).await.map_err(|e| e.to_string())?;
        {
            let _turn = writer.turn().await;
            file::Entity::delete_many()
                .filter(file::Column::Key.is_in(keys.iter().map(String::as_str)))
                .exec(db)
                .await
                .map_err(|e: DbErr| e.to_string())?;
        }
        total += keys.len();
        if keys.len() < BATCH as usize {
            return Ok(total);
        }
    }
}

/// Deletes objects older than the grace period that no `files` row names.
async fn delete_orphans(files: &Files, db: &DatabaseConnection, now: i64) -> Result<usize, String> {
    let grace = i64::try_from(files.orphan_grace().as_millis()).unwrap_or(i64::MAX);
    let old: Vec<String> = files
        .list()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|(_, modified)| now.saturating_sub(*modified) >= grace)
        .map(|(key, _)| key)
        .collect();
    let mut deleted = 0;
    for part in old.chunks(500) {
        let known: Vec<String> = file::Entity::find()
            .select_only()
            .column(file::Column::Key)
            .filter(file::Column::Key.is_in(part.iter().map(String::as_str)))
            .into_tuple()
            .all(db)
            .await
            .map_err(|e| e.to_string())?;
        let orphans: Vec<String> = part.iter().filter(|key| !known.contains(key)).cloned().collect();
        files.delete(&orphans).await.map_err(|e| e.to_string())?;
        deleted += orphans.len();
    }
    Ok(deleted)
}
