//! Wake-ups between processes over Redis pub/sub.
//!
//! The database is the only record of a job; these signals only tell another
//! process to look at it sooner than its own polling would:
//!
//! * `Queued(model)`: a job of `model` was queued (submitted, retried or
//!   requeued). A scheduler with free slots for it claims now instead of at
//!   its next sweep.
//! * `Final(job id)`: a `runsync` job ended. The process whose caller waits
//!   for it reads the row now instead of at its next poll.
//! * `Cancelled(job id)`: a running job was cancelled. The scheduler running
//!   it checks its rows now (as its next sweep would) and stops the attempts
//!   the database no longer gives it.
//! * `Chunk(job id, seq, output)` and `Progress(job id, message)`: a running
//!   job's stream chunk or progress message, as its worker sent it, for the
//!   live stream readers of other processes (see `live.rs`). A chunk larger
//!   than [`LIVE_CONTENT_MAX`] is sent without its content: the reader then
//!   reads it from the database once it is stored.
//! * `Resync`: the sender dropped signals (Redis was unreachable, or its
//!   outbox overflowed) and is connected again: every receiver claims for
//!   all its free slots and every waiter reads its row, as after a
//!   subscriber of its own reconnects.
//!
//! Every signal is at most a hint: a receiver acts only on what it then reads
//! from the database, and a lost signal (Redis down, a full outbox, a dropped
//! subscription) costs the latency the sweeps and polls already bound, never
//! a job. A process skips the signals it sent itself.
//!
//! On the wire, one channel (`scheduler.signal_channel`) carries text
//! messages `<origin> <kind> <argument>`, with `kind` one of `q`, `f`, `c`,
//! `r` (whose argument is `*`), `k` (argument `<job id> <seq>` or
//! `<job id> <seq> <output JSON>`) and `p` (argument `<job id> <message
//! JSON>`). Every process with signals on receives every chunk and keeps
//! those of the jobs its own readers follow.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

/// Signals waiting to be published; beyond this they are dropped (a delay, not a loss).
const OUTBOX: usize = 16_384;
/// Most signals published in one pipeline.
const BATCH: usize = 256;
/// Budget of one connect or one publish round trip.
const ROUND_TRIP: Duration = Duration::from_secs(2);
/// Resubscription backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often an idle subscriber checks that its store still exists.
const LIVENESS: Duration = Duration::from_secs(5);
/// Largest chunk output (as JSON) sent over Redis with its content.
pub const LIVE_CONTENT_MAX: usize = 64 << 10;
/// Least time between two warnings about an unreachable Redis.
const WARN_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Signal {
    Queued(String),
    Final(String),
    Cancelled(String),
    Chunk {
        job_id: String,
        seq: i64,
        /// The chunk's output as JSON; `None` when it is too large to send.
        output: Option<String>,
    },
    Progress(String, String),
    Resync,
}

impl Signal {
    /// A live chunk, with its content when it is small enough.
    pub fn chunk(job_id: &str, seq: i64, output: &serde_json::Value) -> Signal {
        let text = output.to_string();
        Signal::Chunk {
            job_id: job_id.to_string(),
            seq,
            output: (text.len() <= LIVE_CONTENT_MAX).then_some(text),
        }
    }

    /// Whether sending it twice in one batch says nothing more (a wake-up).
    fn is_hint(&self) -> bool {
        !matches!(self, Signal::Chunk { .. } | Signal::Progress(..))
    }

    fn encode(&self, origin: &str) -> String {
        let (kind, argument) = match self {
            Signal::Queued(model) => ("q", model.clone()),
            Signal::Final(job_id) => ("f", job_id.clone()),
            Signal::Cancelled(job_id) => ("c", job_id.clone()),
            Signal::Chunk {
                job_id,
                seq,
                output: Some(output),
            } => ("k", format!("{job_id} {seq} {output}")),
            Signal::Chunk {
                job_id,
                seq,
                output: None,
            } => ("k", format!("{job_id} {seq}")),
            Signal::Progress(job_id, message) => ("p", format!("{job_id} {message}")),
            Signal::Resync => ("r", "*".to_string()),
        };
        format!("{origin} {kind} {argument}")
    }

    /// The sender and the signal; `None` for anything else.
    fn decode(text: &str) -> Option<(&str, Signal)> {
        let mut parts = text.splitn(3, ' ');
        let (origin, kind, argument) = (parts.next()?, parts.next()?, parts.next()?);
        if origin.is_empty() || argument.is_empty() {
            return None;
        }
        let signal = match kind {
            "q" => Signal::Queued(argument.to_string()),
            "f" => Signal::Final(argument.to_string()),
            "c" => Signal::Cancelled(argument.to_string()),
            "k" => {
                let mut parts = argument.splitn(3, ' ');
                let job_id = parts.next().filter(|id| !id.is_empty())?.to_string();
                let seq = parts.next()?.parse().ok().filter(|seq: &i64| *seq >= 0)?;
                let output = parts.next().map(str::to_string);
                Signal::Chunk { job_id, seq, output }
            }
            "p" => {
                let (job_id, message) = argument.split_once(' ')?;
                if job_id.is_empty() {
                    return None;
                }
                Signal::Progress(job_id.to_string(), message.to_string())
            }
            "r" => Signal::Resync,
            _ => return None,
        };
        Some((origin, signal))
    }
}

/// What hears the signals of other processes (the job store's hub): each
/// signal as it arrives, and a resync after a gap in the subscription, when
/// signals may have been missed.
pub trait Listener: Send + Sync + 'static {
    fn apply(&self, signal: Signal);
    fn resync(&self);
}

/// The sending half, owned by the store's hub. Dropping it ends the publisher.
pub struct Signals {
    outbox: mpsc::Sender<Signal>,
    /// Set when a signal is dropped; the publisher then sends `Resync`.
    dropped: Arc<AtomicBool>,
}

impl Signals {
    /// Starts the publisher and the subscriber on the current Tokio runtime.
    /// Fails only on a malformed URL; an unreachable server is retried in the
    /// background.
    pub fn start(url: &str, channel: &str, hub: Weak<dyn Listener>) -> Result<Signals, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis_url: {e}"))?;
        let origin = {
            use rand::RngExt;
            let n: u64 = rand::rng().random();
            format!("{n:016x}")
        };
        let (outbox, pending) = mpsc::channel(OUTBOX);
        let dropped = Arc::new(AtomicBool::new(false));
        let publisher = Publisher {
            client: client.clone(),
            channel: channel.to_string(),
            origin: origin.clone(),
            dropped: Arc::clone(&dropped),
        };
        tokio::spawn(publisher.run(pending));
        tokio::spawn(subscribe(client, channel.to_string(), origin, hub));
        Ok(Signals { outbox, dropped })
    }

    /// Queues a signal for publication; never waits.
    pub fn send(&self, signal: Signal) {
        // A full outbox means Redis is slow or gone: drop it (a delay, not a
        // loss), and have the others resync once it is reachable again.
        if self.outbox.try_send(signal).is_err() {
            self.dropped.store(true, Ordering::Release);
        }
    }
}

/// Warns at most once per `WARN_EVERY`.
struct Throttle(Option<Instant>);

impl Throttle {
    fn ready(&mut self) -> bool {
        let now = Instant::now();
        if self.0.is_some_and(|last| now.duration_since(last) < WARN_EVERY) {
            return false;
        }
        self.0 = Some(now);
        true
    }
}

struct Publisher {
    client: redis::Client,
    channel: String,
    origin: String,
    dropped: Arc<AtomicBool>,
}

impl Publisher {
    /// Publishes what the outbox holds, one pipeline per batch, until the hub
    /// goes. Batches that cannot be sent are dropped; the first batch sent
    /// after that starts with `Resync`.
    async fn run(self, mut pending: mpsc::Receiver<Signal>) {
        let mut connection: Option<redis::aio::MultiplexedConnection> = None;
        let mut backoff = BACKOFF_MIN;
        let mut retry_at = Instant::now();
        let mut warn = Throttle(None);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            // While signals are owed a `Resync`, reconnect on the backoff's
            // schedule even if nothing new is sent.
            let owed = connection.is_none() && self.dropped.load(Ordering::Acquire);
            tokio::select! {
                received = pending.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        return;
                    }
                }
                () = tokio::time::sleep_until(retry_at.into()), if owed => {}
            }
            if connection.is_none() && Instant::now() >= retry_at {
                let error = match tokio::time::timeout(ROUND_TRIP, self.client.get_multiplexed_async_connection()).await
                {
                    Ok(Ok(made)) => {
                        connection = Some(made);
                        backoff = BACKOFF_MIN;
                        None
                    }
                    Ok(Err(error)) => Some(error.to_string()),
                    Err(_) => Some("timed out".to_string()),
                };
                if let Some(error) = error {
                    retry_at = Instant::now() + backoff;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    if warn.ready() {
                        tracing::warn!(%error, "cannot publish job signals to Redis; other processes fall back to polling");
                    }
                }
            }
            let Some(conn) = connection.as_mut() else {
                if !batch.is_empty() {
                    batch.clear();
                    self.dropped.store(true, Ordering::Release);
                }
                continue;
            };
            if batch.is_empty() && !self.dropped.load(Ordering::Acquire) {
                continue;
            }
            let mut seen = HashSet::with_capacity(batch.len() + 1);
            let mut pipe = redis::pipe();
            if self.dropped.swap(false, Ordering::AcqRel) {
                pipe.publish(&self.channel, Signal::Resync.encode(&self.origin))
                    .ignore();
            }
            for signal in batch.drain(..) {
                if !signal.is_hint() || seen.insert(signal.clone()) {
                    pipe.publish(&self.channel, signal.encode(&self.origin)).ignore();
                }
            }
            let sent = tokio::time::timeout(ROUND_TRIP, pipe.query_async::<()>(conn)).await;
            if !matches!(sent, Ok(Ok(()))) {
                connection = None;
                self.dropped.store(true, Ordering::Release);
                if warn.ready() {
                    tracing::warn!("publishing job signals to Redis failed; reconnecting");
                }
            }
        }
    }
}

/// Holds the subscription, resubscribing with backoff, until the hub goes.
async fn subscribe(client: redis::Client, channel: String, origin: String, hub: Weak<dyn Listener>) {
    let mut backoff = BACKOFF_MIN;
    let mut warn = Throttle(None);
    let mut liveness = tokio::time::interval(LIVENESS);
    liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        let subscribed = tokio::time::timeout(ROUND_TRIP, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        match subscribed {
            Ok(Ok(pubsub)) => {
                backoff = BACKOFF_MIN;
                tracing::debug!(%channel, "subscribed to job signals");
                // Whatever was sent while we were not listening is lost: look
                // at every waited-for job once now.
                match hub.upgrade() {
                    Some(hub) => hub.resync(),
                    None => return,
                }
                let mut messages = pubsub.into_on_message();
                loop {
                    let message = tokio::select! {
                        message = messages.next() => message,
                        _ = liveness.tick() => {
                            if hub.strong_count() == 0 {
                                return;
                            }
                            continue;
                        }
                    };
                    let Some(message) = message else { break };
                    let Ok(text) = message.get_payload::<String>() else {
                        continue;
                    };
                    let Some((from, signal)) = Signal::decode(&text) else {
                        continue;
                    };
                    if from == origin {
                        continue;
                    }
                    match hub.upgrade() {
                        Some(hub) => hub.apply(signal),
                        None => return,
                    }
                }
                if warn.ready() {
                    tracing::warn!(%channel, "lost the Redis subscription to job signals; resubscribing");
                }
            }
            outcome => {
                if warn.ready() {
                    let error = match outcome {
                        Ok(Err(error)) => error.to_string(),
                        _ => "timed out".to_string(),
                    };
                    tracing::warn!(%error, "cannot subscribe to job signals on Redis; polling only until it answers");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_round_trip_and_junk_is_ignored() {
        for signal in [
            Signal::Queued("gantry-echo".into()),
            Signal::Final("job_123".into()),
            Signal::Cancelled("job_456".into()),
            Signal::Queued("a model with spaces".into()),
            Signal::Chunk {
                job_id: "job_7".into(),
                seq: 3,
                output: Some(r#"{"text":"a b"}"#.into()),
            },
            Signal::Chunk {
                job_id: "job_7".into(),
                seq: 4,
                output: None,
            },
            Signal::Progress("job_7".into(), r#"{"step": 2}"#.into()),
            Signal::Resync,
        ] {
            let text = signal.encode("abc");
            assert_eq!(Signal::decode(&text), Some(("abc", signal)));
        }
        assert_eq!(
            Signal::chunk("j", 0, &serde_json::json!("x".repeat(LIVE_CONTENT_MAX))),
            Signal::Chunk {
                job_id: "j".into(),
                seq: 0,
                output: None
            }
        );
        for junk in [
            "",
            "abc",
            "abc q",
            "abc q ",
            "abc x job",
            " q model",
            "abc k job",
            "abc k job -1",
            "abc k job x {}",
            "abc p job",
        ] {
            assert_eq!(Signal::decode(junk), None, "{junk:?}");
        }
    }
}
