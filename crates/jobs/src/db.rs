//! What the job layer's modules share: the clock, job ids and the webhook column's
//! pending rule. A leaf: it imports nothing of this crate. (The SQLite write lock is the job writer's own:
//! `transition/mod.rs`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngExt;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A UUIDv7-shaped id: 48 bits of Unix ms, a 12-bit counter that keeps ids of
/// this process strictly increasing, and 62 random bits. Ids sort by creation
/// (FIFO order in the claim query).
pub fn new_job_id(now: i64) -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let floor = (u64::try_from(now).unwrap_or(0) & 0xffff_ffff_ffff) << 12;
    let mut last = LAST.load(Ordering::Relaxed);
    let stamp = loop {
        let next = floor.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(seen) => last = seen,
        }
    };
    let ms = (stamp >> 12) & 0xffff_ffff_ffff;
    let counter = stamp & 0xfff;
    let random: u64 = rand::rng().random();
    format!(
        "{:08x}-{:04x}-7{:03x}-{:04x}-{:012x}",
        ms >> 16,
        ms & 0xffff,
        counter,
        0x8000 | ((random >> 48) & 0x3fff),
        random & 0xffff_ffff_ffff
    )
}

/// `webhook_due_ms` of a job submitted or retried now: pending (0) when it
/// has a webhook.
pub fn pending_if_any() -> sea_orm::sea_query::Expr {
    sea_orm::sea_query::Expr::cust("CASE WHEN webhook IS NULL THEN NULL ELSE 0 END")
}
