//! Shared limiter: one EVALSHA per request against Redis, using Redis's clock.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_redis::{Config, Pool, PoolConfig, PoolError, Runtime, Timeouts};
use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, timeout_at};

use crate::decision::{Decision, Policy, Window, decide};

const SCRIPT: &str = include_str!("limit.lua");

/// Settings for the Redis backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// Connection URL, e.g. `redis://127.0.0.1:6379/0`.
    pub url: String,
    /// Prefix of every key; keys are `<prefix>:{<user>}:<window>`.
    pub key_prefix: String,
    /// Budget for one whole check (connection + script), in milliseconds.
    pub timeout_ms: u64,
    /// Number of multiplexed connections requests are spread over.
    pub connections: usize,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".to_owned(),
            key_prefix: "gantry:rl".to_owned(),
            timeout_ms: 50,
            connections: 4,
        }
    }
}

/// Why one Redis check failed (only ever logged).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connection pool: {0}")]
    Pool(#[from] PoolError),
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("unexpected script reply: {0}")]
    Reply(String),
}

/// A pool object parked in a lane; `generation` identifies it so only its own failure evicts it.
struct Parked {
    generation: u64,
    conn: deadpool_redis::Connection,
}

#[derive(Default)]
struct Lane {
    parked: Mutex<Option<Parked>>,
    /// Held while refilling, so a burst of requests on an empty lane takes one connection.
    filling: tokio::sync::Mutex<()>,
}

pub(crate) struct RedisLimiter {
    pool: Pool,
    /// Checked-out pool connections reused across requests: taking a fresh pool object per
    /// request would cost a recycle PING, i.e. a second round trip.
    lanes: Box<[Lane]>,
    next_lane: AtomicUsize,
    generation: AtomicU64,
    sha: String,
    prefix: String,
    timeout: Duration,
}

fn lock(lane: &Lane) -> MutexGuard<'_, Option<Parked>> {
    lane.parked.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RedisLimiter {
    /// Builds the pool (no I/O); fails only on an invalid configuration.
    pub(crate) fn new(config: &RedisConfig) -> Result<Self, String> {
        if config.timeout_ms == 0 {
            return Err("timeout_ms must be positive".to_owned());
        }
        let lanes = config.connections.max(1);
        let timeout = Duration::from_millis(config.timeout_ms);
        let mut pool_config = PoolConfig::new(lanes * 2);
        pool_config.timeouts = Timeouts {
            wait: Some(timeout),
            create: Some(timeout),
            recycle: Some(timeout),
        };
        let mut cfg = Config::from_url(config.url.clone());
        cfg.pool = Some(pool_config);
        let pool = cfg
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| format!("redis pool: {e}"))?;
        Ok(RedisLimiter {
            pool,
            lanes: (0..lanes).map(|_| Lane::default()).collect(),
            next_lane: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            sha: redis::Script::new(SCRIPT).get_hash().to_owned(),
            prefix: config.key_prefix.clone(),
            timeout,
        })
    }

    /// Loads the script ahead of the first request (it is reloaded on NOSCRIPT anyway).
    pub(crate) async fn preload(&self) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.timeout;
        let lane = self.pick_lane();
        let (generation, mut conn) = self.lane_conn(lane, deadline).await?;
        match timeout_at(deadline, self.load_script(&mut conn)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.evict(lane, generation);
                Err(e)
            }
            Err(_) => {
                self.evict(lane, generation);
                Err(BackendError::Timeout(self.timeout))
            }
        }
    }

    pub(crate) async fn check(&self, user: &str, policy: &Policy) -> Result<Decision, BackendError> {
        let deadline = Instant::now() + self.timeout;
        let lane = self.pick_lane();
        let (generation, mut conn) = self.lane_conn(lane, deadline).await?;
        let keys = self.keys(user);
        let reply = match timeout_at(deadline, self.eval(&mut conn, &keys, policy)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                // Any failure may mean a dead socket: start over from the pool next time.
                self.evict(lane, generation);
                return Err(e);
            }
            Err(_) => {
                self.evict(lane, generation);
                return Err(BackendError::Timeout(self.timeout));
            }
        };
        let [secs, micros, minute, hour, day] =
            <[i64; 5]>::try_from(reply).map_err(|r| BackendError::Reply(format!("{} items", r.len())))?;
        let nonneg = |v: i64| u64::try_from(v).map_err(|_| BackendError::Reply(v.to_string()));
        let now_us = nonneg(secs)?.saturating_mul(1_000_000).saturating_add(nonneg(micros)?);
        Ok(decide(policy, now_us, [nonneg(minute)?, nonneg(hour)?, nonneg(day)?]))
    }

    fn pick_lane(&self) -> usize {
        self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// A connection for `lane`, taking one from the pool only when the lane is empty.
    async fn lane_conn(&self, lane: usize, deadline: Instant) -> Result<(u64, MultiplexedConnection), BackendError> {
        let lane = &self.lanes[lane];
        if let Some(parked) = lock(lane).as_ref() {
            return Ok((parked.generation, (*parked.conn).clone()));
        }
        let _filling = timeout_at(deadline, lane.filling.lock())
            .await
            .map_err(|_| BackendError::Timeout(self.timeout))?;
        // Whoever held the fill lock before us may have parked a connection already.
        if let Some(parked) = lock(lane).as_ref() {
            return Ok((parked.generation, (*parked.conn).clone()));
        }
        let fresh = timeout_at(deadline, self.pool.get())
            .await
            .map_err(|_| BackendError::Timeout(self.timeout))??;
        let mut slot = lock(lane);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let conn = (*fresh).clone();
        *slot = Some(Parked {
            generation,
            conn: fresh,
        });
        Ok((generation, conn))
    }

    /// Drops the lane's connection if it is still the one that failed.
    fn evict(&self, lane: usize, generation: u64) {
        let failed = {
            let mut slot = lock(&self.lanes[lane]);
            if slot.as_ref().is_some_and(|p| p.generation == generation) {
                slot.take()
            } else {
                None
            }
        };
        if let Some(parked) = failed {
            // Detach from the pool so a dead socket is never handed out again.
            drop(deadpool_redis::Connection::take(parked.conn));
        }
    }

    async fn load_script(&self, conn: &mut MultiplexedConnection) -> Result<(), BackendError> {
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query_async(conn).await?;
        if sha.eq_ignore_ascii_case(&self.sha) {
            Ok(())
        } else {
            Err(BackendError::Reply(format!("SCRIPT LOAD returned {sha}")))
        }
    }

    async fn eval(
        &self,
        conn: &mut MultiplexedConnection,
        keys: &[String; 3],
        policy: &Policy,
    ) -> Result<Vec<i64>, BackendError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len()).arg(&keys[..]);
        for window in Window::ALL {
            cmd.arg(policy.quota(window)).arg(window.secs());
        }
        match cmd.query_async::<Vec<i64>>(conn).await {
            // A restarted or flushed Redis forgets scripts: load it again and retry once.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.load_script(conn).await?;
                Ok(cmd.query_async(conn).await?)
            }
            other => Ok(other?),
        }
    }

    fn keys(&self, user: &str) -> [String; 3] {
        let tag = hash_tag(user);
        Window::ALL.map(|w| format!("{}:{{{}}}:{}", self.prefix, tag, w.name()))
    }
}

/// Makes `user` safe inside `{...}`: braces (which would cut the tag short) and `%` are
/// percent-escaped, and the empty id becomes `%` (never produced otherwise), because an
/// empty tag would make Redis Cluster hash each key separately.
fn hash_tag(user: &str) -> Cow<'_, str> {
    if user.is_empty() {
        return Cow::Borrowed("%");
    }
    if !user.contains(['{', '}', '%']) {
        return Cow::Borrowed(user);
    }
    let mut out = String::with_capacity(user.len() + 8);
    for c in user.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn hash_tags_are_never_empty_and_never_contain_braces() {
        assert_eq!(hash_tag("alice"), "alice");
        assert_eq!(hash_tag(""), "%");
        assert_eq!(hash_tag("}{%"), "%7D%7B%25");
        assert_ne!(hash_tag("%"), hash_tag(""));
    }
}
