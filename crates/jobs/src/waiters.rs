//! The in-process waiters of final results: a `wait` (a `runsync` request,
//! `?wait=`) registers here and is woken with the job's final view by this
//! process's scheduler, or told to read the row again (another process
//! settled it). `submit` parks a waiter for the `wait` that follows it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::entity::job;
use crate::types::JobView;

/// Waiters by job id: (waiter id, where to send the final view).
type ByJob = HashMap<String, Vec<(u64, oneshot::Sender<Wake>)>>;

/// What a waiter is woken with.
pub enum Wake {
    /// The job's final view, from a scheduler of this process.
    Final(Box<JobView>),
    /// Read the row now: it changed in another process (a Redis signal), or
    /// signals may have been missed (resubscribed).
    Reread,
}

/// A waiter registered by `submit` for the `wait` that follows it.
struct Parked {
    user: String,
    model: String,
    since: Instant,
    waiter: Waiter,
    /// Written claimed by this process's scheduler (the fast lane): its
    /// result is announced in-process, so `wait` polls only as a safety net.
    local: bool,
}

/// Parked waiters older than this were abandoned (their `wait` never came).
const PARKED_MAX_AGE: Duration = Duration::from_secs(60);

/// Every waiter of this process, by job.
#[derive(Default)]
pub struct Waiters {
    by_job: Mutex<ByJob>,
    next: AtomicU64,
    parked: Mutex<HashMap<String, Parked>>,
}

impl Waiters {
    pub fn lock(&self) -> MutexGuard<'_, ByJob> {
        self.by_job.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn register(self: &Arc<Self>, job_id: &str) -> Waiter {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.lock().entry(job_id.to_string()).or_default().push((id, sender));
        Waiter {
            waiters: Arc::clone(self),
            job_id: job_id.to_string(),
            id,
            receiver: Some(receiver),
        }
    }

    /// Wakes the waiters of `job_id` (of every job if `None`) to read the row.
    pub fn reread(&self, job_id: Option<&str>) {
        let woken: Vec<_> = {
            let mut waiters = self.lock();
            match job_id {
                Some(job_id) => waiters.remove(job_id).into_iter().flatten().collect(),
                None => waiters.drain().flat_map(|(_, list)| list).collect(),
            }
        };
        for (_, sender) in woken {
            let _ = sender.send(Wake::Reread);
        }
    }

    /// Wakes the waiters of each final view; returns the indices of the
    /// views nobody here waited for (none when `want_unwaited` is false and
    /// nobody waits at all).
    pub fn finish(&self, views: &[JobView], want_unwaited: bool) -> Vec<usize> {
        // Taken under the lock, woken after it: a wake-up can be a system
        // call (another thread's runtime), and the HTTP workers register and
        // drop waiters under this lock for every request.
        let mut woken = Vec::with_capacity(views.len());
        let mut unwaited = Vec::new();
        {
            let mut waiters = self.lock();
            if waiters.is_empty() && !want_unwaited {
                return unwaited;
            }
            for (i, view) in views.iter().enumerate() {
                match waiters.remove(&view.id) {
                    Some(list) => woken.push((view, list)),
                    None => unwaited.push(i),
                }
            }
        }
        for (view, list) in woken {
            for (_, sender) in list {
                let _ = sender.send(Wake::Final(Box::new(view.clone())));
            }
        }
        unwaited
    }

    /// Drops the waiters of these jobs unwoken, which `wait` reports as
    /// `JobError::Lost`.
    pub fn abandon<'a>(&self, job_ids: impl Iterator<Item = &'a String>) {
        let dropped: Vec<_> = {
            let mut waiters = self.lock();
            job_ids.filter_map(|id| waiters.remove(id)).collect()
        };
        drop(dropped);
    }

    fn lock_parked(&self) -> MutexGuard<'_, HashMap<String, Parked>> {
        self.parked.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a waiter for a job about to be inserted, kept for `take_parked`.
    pub fn park(self: &Arc<Self>, row: &job::Model, local: bool) {
        let waiter = self.register(&row.id);
        let now = Instant::now();
        let mut parked = self.lock_parked();
        let mut abandoned = Vec::new();
        if parked.len() >= 1024 {
            let stale: Vec<String> = parked
                .iter()
                .filter(|(_, p)| now.duration_since(p.since) > PARKED_MAX_AGE)
                .map(|(id, _)| id.clone())
                .collect();
            for id in stale {
                abandoned.extend(parked.remove(&id));
            }
        }
        parked.insert(
            row.id.clone(),
            Parked {
                user: row.user_id.clone(),
                model: row.model.clone(),
                since: now,
                waiter,
                local,
            },
        );
        drop(parked);
        // Dropping a waiter takes the waiters lock: not under the parked lock.
        drop(abandoned);
    }

    pub fn unpark(&self, job_id: &str) {
        let parked = self.lock_parked().remove(job_id);
        drop(parked);
    }

    /// The waiter `submit` parked for this job, if this caller may have it.
    pub fn take_parked(&self, job_id: &str, user: &str, model: &str) -> Option<(Waiter, bool)> {
        let mut parked = self.lock_parked();
        let entry = parked.get(job_id)?;
        if entry.user != user || entry.model != model {
            return None;
        }
        let entry = parked.remove(job_id)?;
        drop(parked);
        Some((entry.waiter, entry.local))
    }
}

/// A registered waiter; unregisters itself when dropped.
pub struct Waiter {
    waiters: Arc<Waiters>,
    job_id: String,
    id: u64,
    receiver: Option<oneshot::Receiver<Wake>>,
}

impl Waiter {
    pub fn is_open(&self) -> bool {
        self.receiver.is_some()
    }

    /// What woke it; `None` (and closed for good) if the sender went away.
    pub async fn receiver(&mut self) -> Option<Wake> {
        let receiver = self.receiver.as_mut()?;
        let result = receiver.await.ok();
        self.receiver = None;
        result
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // Woken (or its sender dropped): whoever did that took the sender
        // out of the map already, so there is nothing to unregister and no
        // need to take the lock every HTTP worker shares.
        if self.receiver.is_none() {
            return;
        }
        let mut waiters = self.waiters.lock();
        if let Some(list) = waiters.get_mut(&self.job_id) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                waiters.remove(&self.job_id);
            }
        }
    }
}
