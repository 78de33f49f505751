//! Per-user request rate limiting for Gantry: minute/hour/day quotas, decided in memory or in
//! Redis, rendered as `RateLimit-Policy` / `RateLimit` header values. Transport-agnostic: the
//! HTTP layer calls [`RateLimiter::check`] and maps the [`Outcome`] to a response.
//! See `docs/rate-limits.md` for the algorithm and its edge accuracy.

pub use decision::{Decision, Policy, Window, WindowStatus};
pub use memory::Clock;
pub use redis_backend::RedisConfig;

/// What the caller does when the backend cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Admit the request, without rate-limit headers.
    #[default]
    Open,
    /// Refuse the request (HTTP 503).
    Closed,
}

/// Result of [`RateLimiter::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend decided; send its headers, and 429 when not allowed.
    Decided(Decision),
    /// The backend was down or too slow; act on `fail_mode`.
    Unavailable { fail_mode: FailMode },
}

impl Outcome {
    /// Whether the request should proceed.
    pub fn admit(&self) -> bool {
        match self {
            Outcome::Decided(d) => d.allowed(),
            Outcome::Unavailable { fail_mode } => *fail_mode == FailMode::Open,
        }
    }
}

/// Construction errors (checks themselves never fail: see [`Outcome::Unavailable`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid rate limiter configuration: {0}")]
    Config(String),
}

/// The limiter handed to the HTTP layer; cheap to share behind an `Arc`.
pub struct RateLimiter {
    backend: Backend,
    fail_mode: FailMode,
    health: Health,
}

impl RateLimiter {
    /// Process-local limiter using the system clock.
    pub fn in_memory() -> Self {
        Self::in_memory_with_clock(Arc::new(memory::SystemClock))
    }

    /// Process-local limiter reading time from `clock`.
    pub fn in_memory_with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_backend(Backend::Memory(MemoryLimiter::new(clock)), FailMode::Open)
    }

    /// Limiter shared through Redis. Fails only on invalid configuration; an unreachable Redis
    /// is logged and treated like any outage (`fail_mode` applies until it comes back).
    pub async fn redis(config: &RedisConfig, fail_mode: FailMode) -> Result<Self, Error> {
        let limiter = RedisLimiter::new(config).map_err(Error::Config)?;
        if let Err(error) = limiter.preload().await {
            warn!(%error, "rate limiter: could not load the Redis script at startup");
        }
        Ok(Self::with_backend(Backend::Redis(limiter), fail_mode))
    }

    /// Counts one request by `user` against `policy` (admitted only if every window has room).
    pub async fn check(&self, user: &str, policy: &Policy) -> Outcome {
        let result = match &self.backend {
            Backend::Memory(m) => Ok(m.check(user, policy)),
            Backend::Redis(r) => r.check(user, policy).await,
        };
        match result {
            Ok(decision) => {
                self.health.succeeded();
                Outcome::Decided(decision)
            }
            Err(error) => {
                self.health.failed(&error, self.fail_mode);
                Outcome::Unavailable {
                    fail_mode: self.fail_mode,
                }
            }
        }
    }

    /// Users with live in-memory counters (`None` for Redis); for metrics.
    pub fn tracked_users(&self) -> Option<usize> {
        match &self.backend {
            Backend::Memory(m) => Some(m.tracked_users()),
            Backend::Redis(_) => None,
        }
    }

    fn with_backend(backend: Backend, fail_mode: FailMode) -> Self {
        RateLimiter {
            backend,
            fail_mode,
            health: Health::new(),
        }
    }
}

mod decision;
mod memory;
mod redis_backend;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use memory::MemoryLimiter;
use redis_backend::{BackendError, RedisLimiter};

enum Backend {
    Memory(MemoryLimiter),
    Redis(RedisLimiter),
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
        };
        f.debug_struct("RateLimiter")
            .field("backend", &backend)
            .field("fail_mode", &self.fail_mode)
            .finish_non_exhaustive()
    }
}

/// One warning per this many milliseconds at most, so an outage doesn't flood the logs.
const WARN_EVERY_MS: u64 = 10_000;
const NEVER: u64 = u64::MAX;

/// Tracks backend failures for rate-limited logging.
struct Health {
    started: Instant,
    last_warn_ms: AtomicU64,
    suppressed: AtomicU64,
    degraded: AtomicBool,
}

impl Health {
    fn new() -> Self {
        Health {
            started: Instant::now(),
            last_warn_ms: AtomicU64::new(NEVER),
            suppressed: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
        }
    }

    fn failed(&self, error: &BackendError, fail_mode: FailMode) {
        self.degraded.store(true, Ordering::Relaxed);
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NEVER - 1);
        let last = self.last_warn_ms.load(Ordering::Relaxed);
        let due = last == NEVER || now.saturating_sub(last) >= WARN_EVERY_MS;
        // The CAS elects one warning per period even when many requests fail at once.
        if due
            && self
                .last_warn_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            warn!(%error, ?fail_mode, suppressed, "rate limiter backend unavailable");
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn succeeded(&self) {
        // Plain load first: the common healthy path stays a read-only atomic access.
        if self.degraded.load(Ordering::Relaxed) && self.degraded.swap(false, Ordering::Relaxed) {
            info!("rate limiter backend recovered");
        }
    }
}
