//! Live output of running jobs, for the stream readers of this process.
//!
//! The database stays the record of a job's chunks: they are stored with the
//! scheduler's settlement batches, and a reader that joins late, reconnects
//! with `Last-Event-ID`, or falls behind reads them there. What this module
//! adds is the path that skips the database while a reader keeps up:
//!
//! * In the process whose scheduler runs the job, the dispatcher hands every
//!   accepted chunk and progress message to [`LiveJobs`] the moment it
//!   arrives from the worker, before it is queued for settlement.
//! * Other processes receive the same items as Redis signals (see
//!   `signals.rs`), when signals are configured.
//!
//! Only jobs that have a reader in this process are kept, and each keeps a
//! bounded window of chunks ([`MAX_CHUNKS`], [`MAX_BYTES`]). A reader takes
//! the contiguous run of chunks after its own position from memory. When the
//! chunk it needs next is known to exist but is not held (it came before the
//! reader subscribed, it was trimmed, a Redis message was lost, or it was too
//! large to send over Redis), the reader has a *gap* and reads the database
//! once the chunk is stored. Whether the job has ended is always read from
//! the database, so the final event follows every stored chunk.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::Notify;

/// Most chunks held per watched job; older ones are dropped first.
const MAX_CHUNKS: usize = 4096;
/// Most bytes (roughly, as JSON) of chunks held per watched job.
const MAX_BYTES: usize = 16 << 20;

/// The watched jobs of one process, by id.
#[derive(Default)]
pub struct LiveJobs {
    jobs: Mutex<HashMap<String, Arc<Live>>>,
}

/// One watched job: what its readers have not all taken yet.
#[derive(Default)]
struct Live {
    notify: Notify,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    chunks: BTreeMap<i64, Value>,
    bytes: usize,
    /// Highest sequence number known to exist (held or not), if any.
    known: Option<i64>,
    progress: Option<Value>,
    progress_rev: u64,
    /// Bumped when the job may have ended (or signals about it were missed).
    ended_rev: u64,
    /// Bumped when chunks of the job were stored.
    stored_rev: u64,
}

impl LiveJobs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self, job_id: &str) -> Option<Arc<Live>> {
        let jobs = self.lock();
        if jobs.is_empty() {
            None
        } else {
            jobs.get(job_id).cloned()
        }
    }

    /// Subscribes a reader to `job_id`.
    pub fn watch(self: &Arc<Self>, job_id: &str) -> LiveStream {
        let live = Arc::clone(self.lock().entry(job_id.to_string()).or_default());
        LiveStream {
            jobs: Arc::clone(self),
            job_id: job_id.to_string(),
            live,
        }
    }

    /// Chunk `seq` of `job_id` was produced; `output` is `None` when only its
    /// existence is known (its content comes from the database).
    pub fn chunk(&self, job_id: &str, seq: i64, output: Option<&Value>) {
        let Some(live) = self.get(job_id) else {
            return;
        };
        {
            let mut state = live.lock();
            state.known = Some(state.known.map_or(seq, |known| known.max(seq)));
            if let Some(output) = output
                && !state.chunks.contains_key(&seq)
            {
                state.bytes += approximate_size(output);
                state.chunks.insert(seq, output.clone());
                while state.chunks.len() > MAX_CHUNKS || (state.bytes > MAX_BYTES && state.chunks.len() > 1) {
                    if let Some((_, dropped)) = state.chunks.pop_first() {
                        state.bytes = state.bytes.saturating_sub(approximate_size(&dropped));
                    }
                }
            }
        }
        live.notify.notify_waiters();
    }

    /// The job's latest progress message.
    pub fn progress(&self, job_id: &str, message: &Value) {
        if let Some(live) = self.get(job_id) {
            {
                let mut state = live.lock();
                state.progress = Some(message.clone());
                state.progress_rev += 1;
            }
            live.notify.notify_waiters();
        }
    }

    /// Chunks or progress of these jobs were stored.
    pub fn stored<'a>(&self, job_ids: impl Iterator<Item = &'a str>) {
        self.bump(job_ids, |state| state.stored_rev += 1);
    }

    /// These jobs may have ended: their readers read the database.
    pub fn ended<'a>(&self, job_ids: impl Iterator<Item = &'a str>) {
        self.bump(job_ids, |state| state.ended_rev += 1);
    }

    /// Signals may have been missed: every reader reads the database.
    pub fn ended_all(&self) {
        let all: Vec<Arc<Live>> = self.lock().values().cloned().collect();
        for live in all {
            live.lock().ended_rev += 1;
            live.notify.notify_waiters();
        }
    }

    fn bump<'a>(&self, job_ids: impl Iterator<Item = &'a str>, change: impl Fn(&mut State)) {
        let woken: Vec<Arc<Live>> = {
            let jobs = self.lock();
            if jobs.is_empty() {
                return;
            }
            job_ids.filter_map(|id| jobs.get(id).cloned()).collect()
        };
        for live in woken {
            change(&mut live.lock());
            live.notify.notify_waiters();
        }
    }
}

impl Live {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A rough size of a JSON value, for the per-job memory bound.
fn approximate_size(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len() + 2,
        Value::Array(items) => 2 + items.iter().map(approximate_size).sum::<usize>(),
        Value::Object(fields) => {
            2 + fields
                .iter()
                .map(|(key, value)| key.len() + 4 + approximate_size(value))
                .sum::<usize>()
        }
        _ => 8,
    }
}

/// A reader's subscription to one job (see [`crate::JobStore::watch_stream`]).
/// Create the `notified()` future before taking or reading, so that nothing
/// arriving in between is missed.
pub struct LiveStream {
    jobs: Arc<LiveJobs>,
    job_id: String,
    live: Arc<Live>,
}

/// A reader's position: the next chunk it wants, and what it has seen.
#[derive(Debug, Clone)]
pub struct Cursor {
    /// Sequence number of the next chunk to deliver.
    pub next: i64,
    progress_rev: u64,
    ended_rev: u64,
    stored_rev: u64,
}

/// What [`LiveStream::take`] found for a reader.
#[derive(Debug, Default)]
pub struct Taken {
    /// The chunks from the reader's position on, contiguous, in order.
    pub chunks: Vec<(i64, Value)>,
    /// The latest progress message, if it changed since the last take.
    pub progress: Option<Value>,
    /// The job may have ended: read it from the database.
    pub ended: bool,
    /// The next chunk exists but is not held here: read it from the database
    /// once it is stored.
    pub gap: bool,
    /// Chunks or progress were stored since the last take.
    pub stored: bool,
    /// The feed has carried a chunk or progress of the job since the reader
    /// subscribed. Until it has, what was sent before the subscription may
    /// be stored after the reader's first read: read again when it is.
    pub fed: bool,
}

impl LiveStream {
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.live.notify.notified()
    }

    /// A cursor at chunk `from` that has seen everything so far.
    pub fn cursor(&self, from: i64) -> Cursor {
        let state = self.live.lock();
        Cursor {
            next: from,
            progress_rev: state.progress_rev,
            ended_rev: state.ended_rev,
            stored_rev: state.stored_rev,
        }
    }

    /// Takes what arrived for `cursor` since its last take, and moves it on.
    pub fn take(&self, cursor: &mut Cursor) -> Taken {
        let state = self.live.lock();
        let mut taken = Taken::default();
        for (seq, output) in state.chunks.range(cursor.next..) {
            if *seq != cursor.next {
                break;
            }
            taken.chunks.push((*seq, output.clone()));
            cursor.next += 1;
        }
        taken.gap = state.known.is_some_and(|known| known >= cursor.next);
        taken.fed = state.known.is_some() || state.progress_rev > 0;
        if state.progress_rev != cursor.progress_rev {
            cursor.progress_rev = state.progress_rev;
            taken.progress.clone_from(&state.progress);
        }
        taken.ended = std::mem::replace(&mut cursor.ended_rev, state.ended_rev) != state.ended_rev;
        taken.stored = std::mem::replace(&mut cursor.stored_rev, state.stored_rev) != state.stored_rev;
        taken
    }
}

impl Drop for LiveStream {
    fn drop(&mut self) {
        let mut jobs = self.jobs.lock();
        // The map's reference and this one: no other reader of the job is left.
        if Arc::strong_count(&self.live) <= 2 {
            jobs.remove(&self.job_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_reader_takes_each_chunk_once_in_order_and_sees_gaps() {
        let jobs = Arc::new(LiveJobs::default());
        // Nobody watches: nothing is kept.
        jobs.chunk("j", 0, Some(&json!("a")));
        let stream = jobs.watch("j");
        let mut cursor = stream.cursor(0);
        assert!(stream.take(&mut cursor).chunks.is_empty());
        // Chunk 1 arrives before chunk 0 is known here: a gap until 0 is read.
        jobs.chunk("j", 1, Some(&json!("b")));
        let taken = stream.take(&mut cursor);
        assert!(taken.chunks.is_empty() && taken.gap);
        cursor.next = 1; // chunk 0 was read from the database
        jobs.chunk("j", 2, Some(&json!("c")));
        jobs.chunk("j", 2, Some(&json!("other attempt")));
        let taken = stream.take(&mut cursor);
        assert_eq!(taken.chunks, vec![(1, json!("b")), (2, json!("c"))]);
        assert!(!taken.gap);
        assert_eq!(cursor.next, 3);
        // Known without its content (too large for a signal): a gap.
        jobs.chunk("j", 3, None);
        assert!(stream.take(&mut cursor).gap);
        // Progress and revisions are reported once.
        jobs.progress("j", &json!({"step": 1}));
        jobs.ended(["j"].into_iter());
        let taken = stream.take(&mut cursor);
        assert_eq!(taken.progress, Some(json!({"step": 1})));
        assert!(taken.ended && !taken.stored);
        let taken = stream.take(&mut cursor);
        assert!(taken.progress.is_none() && !taken.ended);
        // The last reader gone, the job is forgotten.
        drop(stream);
        assert!(jobs.lock().is_empty());
    }

    #[test]
    fn a_watched_job_keeps_a_bounded_window() {
        let jobs = Arc::new(LiveJobs::default());
        let stream = jobs.watch("j");
        for seq in 0..(MAX_CHUNKS as i64 + 10) {
            jobs.chunk("j", seq, Some(&json!(seq)));
        }
        let mut cursor = stream.cursor(0);
        // The first ten were dropped: the reader must read them elsewhere.
        let taken = stream.take(&mut cursor);
        assert!(taken.chunks.is_empty() && taken.gap);
        cursor.next = 10;
        assert_eq!(stream.take(&mut cursor).chunks.len(), MAX_CHUNKS);
        let big = json!("x".repeat(MAX_BYTES / 2 + 1));
        jobs.chunk("j", 5000, Some(&big));
        jobs.chunk("j", 5001, Some(&big));
        let state = stream.live.lock();
        assert_eq!(state.chunks.keys().copied().collect::<Vec<_>>(), vec![5001]);
    }
}
