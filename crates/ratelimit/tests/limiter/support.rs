//! Test fixtures: a private redis-server child process and a manual clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use gantry_testkit::RedisServer;

use gantry_ratelimit::Clock;

/// Redis's own clock in microseconds since the epoch.
pub async fn redis_now_us(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

/// Seconds until the window of `len` seconds containing `now_us` ends (rounded up).
pub fn reset_secs(now_us: u64, len: u64) -> u64 {
    let len_us = len * 1_000_000;
    (len_us - now_us % len_us).div_ceil(1_000_000)
}

/// Start of a UTC day (2023-11-14), so hand-computed window offsets are simple.
pub const DAY0: u64 = 19_675 * 86_400;

/// A clock that only moves when told to.
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn at_micros(us: u64) -> Arc<Self> {
        Arc::new(ManualClock(AtomicU64::new(us)))
    }

    pub fn at_secs(secs: u64) -> Arc<Self> {
        Self::at_micros(secs * 1_000_000)
    }

    pub fn set_micros(&self, us: u64) {
        self.0.store(us, Ordering::SeqCst);
    }

    pub fn micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    pub fn advance_micros(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.micros())
    }
}
