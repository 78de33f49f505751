//! Embedded limiter: epoch-aligned fixed windows in sharded, mutex-guarded hash maps.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::decision::{Decision, Policy, Window, admits, decide};

/// Source of wall-clock time for the in-memory limiter (injectable for tests).
pub trait Clock: Send + Sync {
    /// Time elapsed since the UNIX epoch.
    fn now(&self) -> Duration;
}

/// The real wall clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        // A clock before 1970 is broken; treating it as the epoch keeps us panic-free.
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
    }
}

/// Power of two well above the core count, so two threads rarely contend on one lock.
const SHARDS: usize = 64;

/// Small backward steps (a thread that read the clock just before another) are absorbed.
const BACKWARD_TOLERANCE_US: u64 = 1_000_000;

#[derive(Clone, Copy)]
struct Slot {
    /// Index of the window this count belongs to; a different index means the count is stale.
    window: u64,
    count: u64,
}

type Counters = [Slot; 3];

#[derive(Default)]
struct Shard {
    /// Day index the entries belong to: once the day changes every entry is stale.
    day: u64,
    /// Latest time seen by this shard, to keep decisions monotonic under racing threads.
    last_us: u64,
    users: HashMap<Box<str>, Counters>,
}

pub(crate) struct MemoryLimiter {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

/// Our critical sections cannot leave a shard half-updated, so a poisoned lock is still usable.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryLimiter {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryLimiter {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            clock,
        }
    }

    pub(crate) fn check(&self, user: &str, policy: &Policy) -> Decision {
        let clock_us = u64::try_from(self.clock.now().as_micros()).unwrap_or(u64::MAX);
        let shard = &self.shards[(self.hasher.hash_one(user) as usize) % SHARDS];
        let mut guard = lock(shard);

        let now_us = if clock_us < guard.last_us && guard.last_us - clock_us < BACKWARD_TOLERANCE_US {
            guard.last_us
        } else {
            clock_us
        };
        guard.last_us = now_us;
        let idx = Window::ALL.map(|w| w.index_at(now_us));

        // Every window nests inside the day, so a new day makes the whole shard stale.
        let stale = if guard.day != idx[2] {
            guard.day = idx[2];
            Some(std::mem::take(&mut guard.users))
        } else {
            None
        };

        let counts = match guard.users.get_mut(user) {
            Some(slots) => {
                let counts = [0, 1, 2].map(|i| if slots[i].window == idx[i] { slots[i].count } else { 0 });
                if admits(policy, counts) {
                    for i in 0..3 {
                        slots[i] = Slot {
                            window: idx[i],
                            count: counts[i] + 1,
                        };
                    }
                }
                counts
            }
            None => {
                let counts = [0; 3];
                if admits(policy, counts) {
                    let slots = [0, 1, 2].map(|i| Slot {
                        window: idx[i],
                        count: 1,
                    });
                    guard.users.insert(user.into(), slots);
                }
                counts
            }
        };
        drop(guard);
        // Free yesterday's entries outside the lock.
        drop(stale);
        decide(policy, now_us, counts)
    }

    pub(crate) fn tracked_users(&self) -> usize {
        self.shards.iter().map(|s| lock(s).users.len()).sum()
    }
}
