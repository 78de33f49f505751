//! Prometheus metrics. Each process keeps one registry ([`metrics`]) of what
//! it observes itself (HTTP requests, rate limit decisions, job latencies
//! settled by its scheduler); gauges that are facts of the database (queue
//! depth, jobs by state, units and dollars charged) are read when scraped
//! and written with [`Exposition`]. The output is the Prometheus text
//! format, version 0.0.4: names carry their unit, counters end in `_total`.
pub mod trace;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// The content type of [`Exposition::finish`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of the HTTP latency buckets.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Upper bounds (seconds) of the job delay and execution buckets.
const JOB_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

/// A cumulative histogram: counts per bucket, sum and count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    /// The sum in microseconds (integers add exactly and atomically).
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|bound| seconds <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = format_float(*bound);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            out.sample(&format!("{name}_bucket"), &with_le, cumulative as f64);
        }
        let count = self.count.load(Ordering::Relaxed);
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        out.sample(&format!("{name}_bucket"), &with_le, count as f64);
        out.sample(
            &format!("{name}_sum"),
            labels,
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        );
        out.sample(&format!("{name}_count"), labels, count as f64);
    }
}

/// The HTTP series of one route pattern: counts by (method, listener,
/// status) and latency by (method, listener). Keyed by the pattern so that a
/// request allocates nothing once its route has been seen.
#[derive(Default)]
struct RouteStats {
    counts: BTreeMap<(&'static str, &'static str, u16), u64>,
    latency: BTreeMap<(&'static str, &'static str), Histogram>,
}

/// A method as a static label (anything unusual is `OTHER`).
fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

/// What this process has observed.
#[derive(Default)]
pub struct Metrics {
    http: Mutex<BTreeMap<String, RouteStats>>,
    ratelimit: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    job_delay: Mutex<BTreeMap<String, Histogram>>,
    job_execution: Mutex<BTreeMap<String, Histogram>>,
    /// What workers reported of the jobs settled here, by model and phase.
    job_worker: Mutex<BTreeMap<String, BTreeMap<&'static str, Histogram>>>,
    /// A worker's jobs by model and outcome, and its run times by model.
    worker_jobs: Mutex<BTreeMap<String, BTreeMap<&'static str, u64>>>,
    worker_run: Mutex<BTreeMap<String, Histogram>>,
    /// A worker's slots by model: (busy, total).
    worker_slots: Mutex<BTreeMap<String, (u64, u64)>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `model`'s entry of `map`, made by `new` the first time: the model's name
/// is copied into the map once, not for every observation (these run once or
/// more per job).
fn by_model<'a, V>(map: &'a mut BTreeMap<String, V>, model: &str, new: impl FnOnce() -> V) -> &'a mut V {
    if !map.contains_key(model) {
        map.insert(model.to_owned(), new());
    }
    map.get_mut(model).unwrap_or_else(|| unreachable!("inserted above"))
}

/// The process-wide registry.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

impl Metrics {
    /// One HTTP request: its route pattern (`/v2/{model_id}/run`, never the
    /// raw path, so ids do not make series), method, listener, status and duration.
    pub fn http_request(&self, route: &str, method: &str, listener: &'static str, status: u16, took: Duration) {
        let method = method_label(method);
        let mut http = lock(&self.http);
        if !http.contains_key(route) {
            http.insert(route.to_string(), RouteStats::default());
        }
        if let Some(stats) = http.get_mut(route) {
            *stats.counts.entry((method, listener, status)).or_insert(0) += 1;
            stats
                .latency
                .entry((method, listener))
                .or_insert_with(|| Histogram::new(HTTP_BUCKETS))
                .observe(took);
        }
    }

    /// One rate limiter decision on `listener`: `allowed`, `limited` or `unavailable`.
    pub fn ratelimit_decision(&self, listener: &'static str, decision: &'static str) {
        *lock(&self.ratelimit).entry((listener, decision)).or_insert(0) += 1;
    }

    /// A job of `model` that ended after waiting `delay` in the queue and running `execution`.
    pub fn job_finished(&self, model: &str, delay: Option<Duration>, execution: Option<Duration>) {
        if let Some(delay) = delay {
            by_model(&mut lock(&self.job_delay), model, || Histogram::new(JOB_BUCKETS)).observe(delay);
        }
        if let Some(execution) = execution {
            by_model(&mut lock(&self.job_execution), model, || Histogram::new(JOB_BUCKETS)).observe(execution);
        }
    }

    /// The timings a worker reported with a completed job of `model`: from
    /// the assignment reaching it to the model starting (`queue`), loading
    /// done for the job (`load`), and the model's run (`run`).
    pub fn job_worker_timings(&self, model: &str, queue: Duration, load: Duration, run: Duration) {
        let mut map = lock(&self.job_worker);
        let phases = by_model(&mut map, model, BTreeMap::new);
        for (phase, took) in [("queue", queue), ("load", load), ("run", run)] {
            phases
                .entry(phase)
                .or_insert_with(|| Histogram::new(JOB_BUCKETS))
                .observe(took);
        }
    }

    /// A job that ended on a worker of this process: `completed`, `failed`
    /// or `cancelled`, after running `run` in the model.
    pub fn worker_job_finished(&self, model: &str, outcome: &'static str, run: Option<Duration>) {
        *by_model(&mut lock(&self.worker_jobs), model, BTreeMap::new)
            .entry(outcome)
            .or_insert(0) += 1;
        if let Some(run) = run {
            by_model(&mut lock(&self.worker_run), model, || Histogram::new(JOB_BUCKETS)).observe(run);
        }
    }

    /// The slots of this process's worker of `model`: how many run a job now, of how many.
    pub fn worker_slots(&self, model: &str, busy: u64, total: u64) {
        *by_model(&mut lock(&self.worker_slots), model, || (0, 0)) = (busy, total);
    }

    /// Writes everything observed so far.
    pub fn write(&self, out: &mut Exposition) {
        out.family(
            "gantry_http_requests_total",
            "counter",
            "HTTP requests answered, by route pattern, method, listener and status.",
        );
        let http = lock(&self.http);
        for (route, stats) in http.iter() {
            for ((method, listener, status), n) in &stats.counts {
                let status = status.to_string();
                out.sample(
                    "gantry_http_requests_total",
                    &[
                        ("route", route),
                        ("method", method),
                        ("listener", listener),
                        ("status", &status),
                    ],
                    *n as f64,
                );
            }
        }
        out.family(
            "gantry_http_request_duration_seconds",
            "histogram",
            "Time to answer an HTTP request (to the response head), by route pattern.",
        );
        for (route, stats) in http.iter() {
            for ((method, listener), histogram) in &stats.latency {
                histogram.write(
                    out,
                    "gantry_http_request_duration_seconds",
                    &[("route", route), ("method", method), ("listener", listener)],
                );
            }
        }
        drop(http);
        out.family(
            "gantry_ratelimit_decisions_total",
            "counter",
            "Rate limiter decisions by listener: allowed, limited (429), unavailable (the limiter could not decide).",
        );
        for ((listener, decision), n) in lock(&self.ratelimit).iter() {
            out.sample(
                "gantry_ratelimit_decisions_total",
                &[("listener", listener), ("decision", decision)],
                *n as f64,
            );
        }
        for (name, help, map) in [
            (
                "gantry_job_delay_seconds",
                "Time jobs waited in the queue before a worker started them, by model (jobs settled by this process).",
                &self.job_delay,
            ),
            (
                "gantry_job_execution_seconds",
                "Time jobs ran on a worker, by model (jobs settled by this process).",
                &self.job_execution,
            ),
        ] {
            out.family(name, "histogram", help);
            for (model, histogram) in lock(map).iter() {
                histogram.write(out, name, &[("model", model)]);
            }
        }
        out.family(
            "gantry_job_worker_seconds",
            "histogram",
            "What workers reported of the jobs settled by this process, by model and phase: queue (the assignment \
             reaching the worker to the model starting), load (loading done for the job), run (in the model).",
        );
        for (model, phases) in lock(&self.job_worker).iter() {
            for (phase, histogram) in phases {
                histogram.write(out, "gantry_job_worker_seconds", &[("model", model), ("phase", phase)]);
            }
        }
        out.family(
            "gantry_worker_jobs_total",
            "counter",
            "Jobs that ended on this process's workers, by model and outcome (completed, failed, cancelled).",
        );
        for (model, outcomes) in lock(&self.worker_jobs).iter() {
            for (outcome, n) in outcomes {
                out.sample(
                    "gantry_worker_jobs_total",
                    &[("model", model), ("outcome", outcome)],
                    *n as f64,
                );
            }
        }
        out.family(
            "gantry_worker_job_run_seconds",
            "histogram",
            "Time jobs spent in the model on this process's workers, by model.",
        );
        for (model, histogram) in lock(&self.worker_run).iter() {
            histogram.write(out, "gantry_worker_job_run_seconds", &[("model", model)]);
        }
        out.family(
            "gantry_worker_slots",
            "gauge",
            "Slots of this process's workers, by model and state (busy, free).",
        );
        for (model, (busy, total)) in lock(&self.worker_slots).iter() {
            out.sample(
                "gantry_worker_slots",
                &[("model", model), ("state", "busy")],
                *busy as f64,
            );
            out.sample(
                "gantry_worker_slots",
                &[("model", model), ("state", "free")],
                total.saturating_sub(*busy) as f64,
            );
        }
    }
}

/// A Prometheus text exposition being written.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// `# HELP` and `# TYPE` of a family; its samples follow.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// One sample; label values are escaped as the format requires.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.text, "{label}=\"{escaped}\"");
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", format_float(value));
    }

    pub fn finish(self) -> String {
        self.text
    }
}

fn format_float(value: f64) -> String {
    if value.is_infinite() {
        if value > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labels_escaped() {
        let histogram = Histogram::new(&[0.1, 1.0]);
        histogram.observe(Duration::from_millis(50));
        histogram.observe(Duration::from_millis(500));
        histogram.observe(Duration::from_secs(5));
        let mut out = Exposition::new();
        out.family("x_seconds", "histogram", "test");
        histogram.write(&mut out, "x_seconds", &[("model", "a\"b")]);
        let text = out.finish();
        assert!(
            text.contains("x_seconds_bucket{model=\"a\\\"b\",le=\"0.1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model=\"a\\\"b\",le=\"1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model=\"a\\\"b\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("x_seconds_sum{model=\"a\\\"b\"} 5.55\n"), "{text}");
        assert!(text.contains("x_seconds_count{model=\"a\\\"b\"} 3\n"), "{text}");
    }
}
