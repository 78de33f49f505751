//! The metrics endpoint's text: what this process observed (the telemetry
//! registry) and the facts of the database that every process reads alike.
use std::collections::BTreeMap;

use gantry_dispatch::Dispatcher;
use gantry_telemetry::{Exposition, metrics};

use crate::census::Census;
use crate::db::now_ms;
use crate::types::{JobError, JobStatus};

/// The whole exposition. `models`: every model served (a model with nothing
/// queued still reports a queue depth of 0, which autoscalers need);
/// `dispatcher`: this process's worker registry, if it runs a scheduler
/// (otherwise worker counts come from the schedulers' presence rows).
pub async fn render(census: &Census, models: &[String], dispatcher: Option<&Dispatcher>) -> Result<String, JobError> {
    let mut out = Exposition::new();
    metrics().write(&mut out);

    let kept = census.kept_jobs().await?;
    let now = now_ms();
    let mut depth: BTreeMap<&str, i64> = models.iter().map(|m| (m.as_str(), 0)).collect();
    let mut oldest: BTreeMap<&str, i64> = BTreeMap::new();
    for (model, status, count, queued) in &kept {
        if status == JobStatus::InQueue.as_str() {
            *depth.entry(model.as_str()).or_insert(0) += count;
            let age = oldest.entry(model.as_str()).or_insert(*queued);
            *age = (*age).min(*queued);
        }
    }
    out.family("gantry_queue_depth", "gauge", "Jobs waiting in the queue, by model.");
    for (model, n) in &depth {
        out.sample("gantry_queue_depth", &[("model", model)], *n as f64);
    }
    out.family(
        "gantry_queue_oldest_age_seconds",
        "gauge",
        "Age of the oldest queued job, by model (0 when none is queued).",
    );
    for model in depth.keys() {
        let age = oldest
            .get(model)
            .map_or(0.0, |queued| (now - queued).max(0) as f64 / 1000.0);
        out.sample("gantry_queue_oldest_age_seconds", &[("model", model)], age);
    }
    out.family(
        "gantry_jobs",
        "gauge",
        "Jobs kept (queued, running, or finished within their retention), by model and status.",
    );
    for (model, status, count, _) in &kept {
        out.sample("gantry_jobs", &[("model", model), ("status", status)], *count as f64);
    }

    out.family(
        "gantry_workers",
        "gauge",
        "Connected workers by model and state (idle, running, draining).",
    );
    match dispatcher {
        Some(dispatcher) => {
            let health = dispatcher.health();
            for (model, h) in &health.models {
                for (state, n) in [
                    ("idle", h.idle_workers),
                    ("running", h.running_workers),
                    ("draining", h.draining_workers),
                ] {
                    out.sample("gantry_workers", &[("model", model), ("state", state)], n as f64);
                }
            }
            out.family(
                "gantry_worker_slots",
                "gauge",
                "Worker slots by model: busy (a job runs in it) and free (it can take one now).",
            );
            for (model, h) in &health.models {
                out.sample(
                    "gantry_worker_slots",
                    &[("model", model), ("state", "busy")],
                    h.running_jobs as f64,
                );
                out.sample(
                    "gantry_worker_slots",
                    &[("model", model), ("state", "free")],
                    h.free_slots as f64,
                );
            }
        }
        None => {
            for (model, idle, running) in census.worker_census().await? {
                out.sample("gantry_workers", &[("model", &model), ("state", "idle")], idle as f64);
                out.sample(
                    "gantry_workers",
                    &[("model", &model), ("state", "running")],
                    running as f64,
                );
            }
        }
    }

    let totals = census.charged_totals().await?;
    out.family(
        "gantry_units_produced_total",
        "counter",
        "Billed units produced by completed jobs (tokens, characters, megapixels, seconds, requests), by model and unit.",
    );
    for (model, unit, quantity, _) in &totals {
        out.sample(
            "gantry_units_produced_total",
            &[("model", model), ("unit", unit)],
            *quantity as f64 / 1e6,
        );
    }
    out.family(
        "gantry_charged_usd_total",
        "counter",
        "US dollars charged for completed jobs, by model.",
    );
    let mut charged: BTreeMap<&str, i64> = BTreeMap::new();
    for (model, _, _, amount) in &totals {
        *charged.entry(model.as_str()).or_insert(0) += amount;
    }
    for (model, micro) in charged {
        out.sample("gantry_charged_usd_total", &[("model", model)], micro as f64 / 1e6);
    }
    let (files, bytes) = census.stored_files().await?;
    out.family(
        "gantry_files_stored",
        "gauge",
        "Output files kept for their URLs (until their lifetime ends).",
    );
    out.sample("gantry_files_stored", &[], files as f64);
    out.family("gantry_files_stored_bytes", "gauge", "Bytes of the output files kept.");
    out.sample("gantry_files_stored_bytes", &[], bytes as f64);
    Ok(out.finish())
}
