//! Webhook deliveries: the final view of a job, POSTed to the URL its request
//! named, over `http://` or `https://`.
//!
//! TLS is rustls with the ring provider (already in the tree for sqlx). The
//! trusted roots are the system's (`/etc/ssl/certs`, or `SSL_CERT_FILE` /
//! `SSL_CERT_DIR`), plus those of [`WebhookConfig::ca_file`]; a
//! system without any (a slim container image without `ca-certificates`)
//! falls back to the Mozilla roots compiled into `webpki-roots`.
//!
//! Each delivery is signed with its owner's secret ([`signing`]: the
//! Standard Webhooks scheme, one secret per user in `webhook_secrets`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use tokio::task::JoinSet;

use gantry_jobs::JobWriter;
use gantry_jobs::entity::job;
use gantry_jobs::now_ms;
use gantry_jobs::{JobStatus, JobView, SchedulerError};
use gantry_net::{AddressPolicy, error_chain};

use job::Column as J;

pub mod signing;
pub use signing::webhook_secret;

/// The outbox's settings (`[scheduler] webhook_*` in the platform's settings).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WebhookConfig {
    /// Deliveries tried per job. Default 3.
    pub attempts: u32,
    /// Timeout of one request. Default 10 s.
    pub timeout: Duration,
    /// A PEM file of extra root certificates trusted for `https://`
    /// webhooks, on top of the system's (for receivers behind a private CA).
    /// Default none.
    pub ca_file: Option<PathBuf>,
    /// Address ranges (CIDR) webhooks may reach although they are loopback,
    /// private or otherwise special-purpose (refused by default: see
    /// gantry-net). Default none.
    pub allow_ranges: Vec<String>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            attempts: 3,
            timeout: Duration::from_secs(10),
            ca_file: None,
            allow_ranges: Vec::new(),
        }
    }
}

impl WebhookConfig {
    /// Checks what can be wrong before anything starts: the client must
    /// build (`ca_file` readable and holding certificates, the ranges valid).
    pub fn check(&self) -> Result<(), SchedulerError> {
        self.client().map(drop)
    }

    /// The client every delivery of one scheduler goes through: only
    /// permitted addresses are ever connected to (gantry-net), and a
    /// redirect could lead anywhere, so none is followed.
    pub fn client(&self) -> Result<reqwest::Client, SchedulerError> {
        let fail = |e: String| SchedulerError::Webhooks(e);
        let tls = gantry_net::tls_config(self.ca_file.as_deref()).map_err(|e| fail(format!("webhook_ca_file {e}")))?;
        gantry_net::client(Arc::new(self.policy()?), self.timeout, tls).map_err(fail)
    }

    /// The destinations webhooks may reach (what the job store checks a
    /// `webhook` against at submit, too: `SchedulerConfig::webhook_destinations`).
    pub fn policy(&self) -> Result<AddressPolicy, SchedulerError> {
        AddressPolicy::new(&self.allow_ranges)
            .map_err(|e| SchedulerError::Webhooks(format!("webhook_allow_ranges: {e}")))
    }

    /// The longest one delivery can take: every attempt timing out, plus the
    /// pauses between attempts (0.5 s, 1 s, 2 s …).
    pub fn window(&self) -> Duration {
        let attempts = self.attempts.max(1);
        let pauses: Duration = (1..attempts).map(pause_after).sum();
        self.timeout * attempts + pauses
    }
}

/// The pause after failed attempt `attempt` (from 1): 0.5 s, 1 s, 2 s …
fn pause_after(attempt: u32) -> Duration {
    Duration::from_millis(500) * 2u32.pow(attempt - 1)
}

/// A scheduler's webhook deliveries. The process that finishes a job sends
/// its delivery at once ([`Deliveries::send`]); the row's `webhook_due_ms`
/// stays set until the delivery ended, so if that process dies first, any
/// scheduler's sweep takes the delivery over ([`Deliveries::take_over`]).
/// Delivery is therefore at least once: a receiver may see a job twice
/// (after a crash between its answer and the row's update), and should
/// treat the job id as the delivery's identity.
pub struct Deliveries {
    client: reqwest::Client,
    policy: Arc<AddressPolicy>,
    db: DatabaseConnection,
    /// Where the delivery marks of `jobs` are written.
    writer: JobWriter,
    attempts: u32,
    window: Duration,
    /// Puts the URLs of output files into the delivered output.
    files: Option<gantry_files::Files>,
    /// Deliveries running: aborted with the scheduler (a crash loses them
    /// only until another sweep takes them over).
    running: JoinSet<()>,
}

impl Deliveries {
    /// `files`: the store whose URLs go into the delivered outputs.
    pub fn new(
        config: &WebhookConfig,
        files: Option<gantry_files::Files>,
        db: DatabaseConnection,
        writer: JobWriter,
    ) -> Result<Self, SchedulerError> {
        Ok(Deliveries {
            client: config.client()?,
            policy: Arc::new(config.policy()?),
            db,
            writer,
            attempts: config.attempts.max(1),
            window: config.window(),
            files,
            running: JoinSet::new(),
        })
    }

    /// Delivers the final view of a job this scheduler just finished (not
    /// for a cancel, which the client asked for: that only clears the row).
    /// `finished_at` is the row's `completed_at_ms` as it finished: the
    /// delivery is marked done only if the job has not been retried since
    /// (a retry's outcome gets its own).
    pub fn send(&mut self, url: String, user_id: String, view: JobView, finished_at: Option<i64>) {
        while self.running.try_join_next().is_some() {}
        let (client, policy, db, writer, attempts, files) = (
            self.client.clone(),
            Arc::clone(&self.policy),
            self.db.clone(),
            self.writer.clone(),
            self.attempts,
            self.files.clone(),
        );
        self.running.spawn(async move {
            let view = view.linked(files.as_ref()).await;
            if view.status != JobStatus::Cancelled {
                match crate::signing::secret_for(&db, &user_id).await {
                    Ok(secret) => {
                        let message_id = format!("msg_{}_{}", view.id, finished_at.unwrap_or_default());
                        let delivery = Delivery {
                            url: &url,
                            message_id: &message_id,
                            secret: &secret,
                        };
                        deliver(&client, &policy, &delivery, &view, attempts).await;
                    }
                    // The row stays pending: a sweep delivers it later.
                    Err(error) => {
                        tracing::warn!(job_id = %view.id, %error, "webhook secret unavailable; delivery postponed");
                        return;
                    }
                }
            }
            if let Err(error) = writer.delivered(&view.id, finished_at).await {
                // The row stays pending: a sweep delivers it again later.
                tracing::warn!(job_id = %view.id, %error, "could not record a webhook delivery");
            }
        });
    }

    /// Takes over deliveries still pending well after their job finished
    /// (their finisher died or stopped before delivering), oldest first, a
    /// batch per sweep. Each is held for one [`window`] by a guarded update,
    /// so two sweeps never both take it; a holder that dies lets it go
    /// again after that.
    pub async fn take_over(&mut self, now: i64) -> Result<(), DbErr> {
        let window = i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX);
        let finished_before = now.saturating_sub(window.saturating_add(TAKE_OVER_MARGIN_MS));
        let rows = job::Entity::find()
            .filter(Expr::cust("webhook_due_ms IS NOT NULL"))
            .filter(J::CompletedAtMs.lte(finished_before))
            .filter(J::WebhookDueMs.lte(now))
            .order_by_asc(J::CompletedAtMs)
            .limit(TAKE_OVER_BATCH)
            .all(&self.db)
            .await?;
        for row in rows {
            let (Some(url), Some(due)) = (row.webhook.clone(), row.webhook_due_ms) else {
                continue;
            };
            let taken = self
                .writer
                .hold_delivery(&row.id, due, now.saturating_add(window))
                .await?;
            if !taken {
                continue;
            }
            if row.status != JobStatus::Cancelled.as_str() {
                tracing::info!(job_id = %row.id, "taking over a webhook delivery its finisher did not complete");
            }
            self.send(url, row.user_id.clone(), JobView::of(&row, now), row.completed_at_ms);
        }
        Ok(())
    }
}

/// Finished jobs whose delivery is this much older than a [`window`] are
/// taken over (the finisher's own attempts are over by then).
const TAKE_OVER_MARGIN_MS: i64 = 2_000;
/// Deliveries taken over per sweep.
const TAKE_OVER_BATCH: u64 = 64;

/// Where one delivery goes and how it is signed.
struct Delivery<'a> {
    url: &'a str,
    /// `webhook-id`: the same on every attempt of the delivery, so a
    /// receiver can drop duplicates.
    message_id: &'a str,
    secret: &'a str,
}

/// POSTs `view` to the delivery's URL, signed, `attempts` times at most
/// (0.5 s, then 1 s, 2 s … apart) until the receiver answers 2xx.
async fn deliver(
    client: &reqwest::Client,
    policy: &AddressPolicy,
    delivery: &Delivery<'_>,
    view: &JobView,
    attempts: u32,
) {
    let url = delivery.url;
    let refused = match reqwest::Url::parse(url) {
        Ok(parsed) => policy.check_url(&parsed).err(),
        Err(error) => Some(format!("invalid URL: {error}")),
    };
    if let Some(reason) = refused {
        tracing::warn!(job_id = %view.id, %reason, "webhook not delivered");
        return;
    }
    let body = match serde_json::to_vec(view) {
        Ok(body) => body,
        Err(error) => {
            tracing::error!(job_id = %view.id, %error, "webhook body not serializable");
            return;
        }
    };
    for attempt in 1..=attempts {
        // Each attempt is signed at its own time (receivers reject stale timestamps).
        let timestamp = now_ms().div_euclid(1000);
        let signature = crate::signing::signature(delivery.secret, delivery.message_id, timestamp, &body);
        let request = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", delivery.message_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.clone());
        match request.send().await {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => {
                tracing::warn!(job_id = %view.id, status = %response.status(), attempt, "webhook refused")
            }
            Err(error) => tracing::warn!(job_id = %view.id, error = %error_chain(&error), attempt, "webhook failed"),
        }
        if attempt < attempts {
            tokio::time::sleep(pause_after(attempt)).await;
        }
    }
}
