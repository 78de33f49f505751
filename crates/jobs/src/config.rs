use std::time::Duration;

use gantry_net::AddressPolicy;

/// Settings of the job layer, shared by [`crate::JobStore`] and [`crate::Scheduler`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Dispatches a job may get before a crash or a lost worker fails it. Default 3.
    pub max_attempts: u32,
    /// `executionTimeout` when the request names none. Default 10 min.
    pub default_execution_timeout: Duration,
    /// `ttl` (queue plus run) when the request names none. Default 24 h.
    pub default_ttl: Duration,
    /// Largest accepted `executionTimeout` and `ttl`. Default 7 days.
    pub max_timeout: Duration,
    /// How long finished results of `/run` (async) jobs are kept. Default 30 min.
    pub async_retention: Duration,
    /// How long finished results of `/runsync` jobs are kept. Default 1 min.
    pub sync_retention: Duration,
    /// A scheduler's hold on the jobs it runs; another scheduler requeues them
    /// once it lapses. Default 30 s.
    pub lease: Duration,
    /// Period of the sweeps (lease renewal, timeouts, expiry, claiming what is
    /// left queued). Default 1 s.
    pub sweep_interval: Duration,
    /// Most jobs claimed by one statement. Default 64.
    pub claim_batch: u32,
    /// Jobs a scheduler keeps claimed beyond its workers' free slots, per
    /// model, so that a freed slot gets its next job without waiting for the
    /// database. They are leased like running jobs (a crash requeues them)
    /// and read as `IN_PROGRESS` while they wait. The cost: a job claimed
    /// ahead runs before any job queued after its claim (even one of higher
    /// priority), and its `delayTime` ends at the claim. Claimed only while
    /// some slot is free. Default 0 (off).
    pub claim_ahead: u32,
    /// A `runsync` job that the fast lane hands to the scheduler of its own
    /// process is kept in memory while it runs and written once, when it
    /// ends (with its charge), or when it has run this long, whichever comes
    /// first (earlier if its `executionTimeout` or `ttl` ends sooner). Its
    /// caller holds no id before then: `runsync` waits at least 1 s. Until it
    /// is written the job is in no other process's health counts, and if this
    /// process dies meanwhile the job is gone and was never charged (its
    /// caller's request fails with it). Zero writes every job at submit.
    /// Default 200 ms; at most 500 ms.
    pub sync_store_after: Duration,
    /// This process is the only one using the database (the embedded SQLite
    /// file, whose lock it holds): a job left `IN_PROGRESS` when the
    /// scheduler starts was run by a process that died, so it is requeued at
    /// once instead of after its lease lapses. Default false.
    pub sole_owner: bool,
    /// The destinations a job's `webhook` may name (an address literal is
    /// judged at submit, a name when it is delivered). The webhooks crate's
    /// settings give it (`gantry_webhooks::WebhookConfig::policy`); default:
    /// public addresses only.
    pub webhook_destinations: AddressPolicy,
    /// Where output files are stored, and how their URLs are made. Without
    /// it a job whose worker sends files fails. Default none.
    pub files: Option<gantry_files::Files>,
    /// A job is admitted only while its owner has credit: balance minus the
    /// holds of their queued and running jobs above zero (`402` otherwise).
    /// Default false.
    pub require_credit: bool,
    /// Monthly prices of network volume storage per GB, by tier.
    pub storage_prices: gantry_billing::storage::StoragePrices,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            default_execution_timeout: Duration::from_secs(600),
            default_ttl: Duration::from_secs(24 * 3600),
            max_timeout: Duration::from_secs(7 * 24 * 3600),
            async_retention: Duration::from_secs(30 * 60),
            sync_retention: Duration::from_secs(60),
            lease: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(1),
            claim_batch: 64,
            claim_ahead: 0,
            sync_store_after: Duration::from_millis(200),
            sole_owner: false,
            webhook_destinations: AddressPolicy::default(),
            files: None,
            require_credit: false,
            storage_prices: gantry_billing::storage::StoragePrices::default(),
        }
    }
}

impl SchedulerConfig {
    /// How recent a scheduler's `worker_presence` rows must be to count:
    /// three sweeps, at least 3 s. Rows of a crashed scheduler stop counting
    /// after this.
    pub fn presence_window_ms(&self) -> i64 {
        millis(self.sweep_interval.saturating_mul(3)).max(3_000)
    }

    /// [`Self::sync_store_after`] in ms, at most 500.
    pub fn sync_store_after_ms(&self) -> i64 {
        millis(self.sync_store_after).min(MAX_SYNC_STORE_AFTER_MS)
    }

    /// How long an output file lives: the file store's lifetime (7 days
    /// without a store).
    pub fn file_lifetime_ms(&self) -> i64 {
        millis(
            self.files
                .as_ref()
                .map_or(Duration::from_secs(7 * 24 * 3600), gantry_files::Files::lifetime),
        )
    }

    pub fn retention_ms(&self, sync: bool) -> i64 {
        millis(if sync {
            self.sync_retention
        } else {
            self.async_retention
        })
    }
}

/// Well under the shortest `runsync` wait (1 s), so a caller that gets an id
/// back can always read the job.
const MAX_SYNC_STORE_AFTER_MS: i64 = 500;

pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
