//! The fast lane of this process's scheduler: credits that let a submit
//! write its job already claimed (or, for `runsync`, not write it at all),
//! the jobs handed over, and the jobs running unwritten. See [`Open`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::entity::job;

/// The lane (open while a scheduler of this process runs) and the jobs its
/// scheduler runs that are not written yet: id -> (user, model).
#[derive(Default)]
pub struct FastLane {
    lane: Mutex<Option<Open>>,
    unstored: Mutex<HashMap<String, (String, String)>>,
}

/// A job a submit handed to the lane's scheduler.
pub struct Handed {
    pub row: job::Model,
    /// False for a `runsync` job kept in memory until it ends or has run for
    /// `sync_store_after` (see `SchedulerConfig`): the scheduler writes it.
    pub stored: bool,
}

/// The fast lane of one scheduler instance (at most one per process): while
/// it has free slots for a model whose queue it found empty, a submit writes
/// the job `IN_PROGRESS` owned by it (attempt 1, leased) and hands the row
/// over after the commit, so no claim statement and no queue round trip are
/// needed. A job handed over that no worker can take goes back to the queue
/// like any unplaced claim; a crash before it runs requeues it when its lease
/// lapses. Credits are a hint the scheduler refreshes on every turn of its loop.
///
/// A `runsync` job that gets a credit is not even written: its caller holds no
/// id until it returns, so nobody else can ask for it, and the scheduler
/// writes its row once, final and with its charge, in one transaction (one
/// write instead of three). A job that runs longer than `sync_store_after` is
/// written as claimed by then, and goes on like any other. If the scheduler
/// dies first, the job is lost with it and never charged; its caller is told
/// (`JobError::Lost`). With credit enforced this holds only where the SQLite
/// writer thread admits every job of the database (it reserves the job's
/// hold: `transition/reserved.rs`); elsewhere such a job is written at submit.
struct Open {
    instance: String,
    lease_ms: i64,
    /// Jobs a submit may still write claimed, per model.
    credits: HashMap<String, u64>,
    /// Credits taken whose rows the scheduler has not adopted yet, per model.
    pending: HashMap<String, u64>,
    /// Jobs waiting for the scheduler.
    handed: Vec<Handed>,
}

/// A credit taken from the lane: whom to write the job as claimed by.
pub struct Credit {
    pub instance: String,
    pub lease_ms: i64,
}

impl FastLane {
    fn lock(&self) -> MutexGuard<'_, Option<Open>> {
        self.lane.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens the fast lane for scheduler `instance`; false if another
    /// scheduler of this process has it.
    pub fn open(&self, instance: &str, lease_ms: i64) -> bool {
        let mut lane = self.lock();
        if lane.is_some() {
            return false;
        }
        *lane = Some(Open {
            instance: instance.to_string(),
            lease_ms,
            credits: HashMap::new(),
            pending: HashMap::new(),
            handed: Vec::new(),
        });
        true
    }

    /// Closes `instance`'s lane; returns the jobs it had not adopted yet, or
    /// `None` if the lane is not `instance`'s.
    pub fn close(&self, instance: &str) -> Option<Vec<Handed>> {
        let mut lane = self.lock();
        match lane.take() {
            Some(open) if open.instance == instance => Some(open.handed),
            other => {
                *lane = other;
                None
            }
        }
    }

    fn lock_unstored(&self) -> MutexGuard<'_, HashMap<String, (String, String)>> {
        self.unstored.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// These jobs are written now (or final): no longer only in memory.
    pub fn stored(&self, job_ids: &[String]) {
        if job_ids.is_empty() {
            return;
        }
        let mut unstored = self.lock_unstored();
        if unstored.is_empty() {
            return;
        }
        for id in job_ids {
            unstored.remove(id);
        }
    }

    /// Whether `user`'s job `job_id` of `model` is running unwritten.
    pub fn is_unstored(&self, job_id: &str, user: &str, model: &str) -> bool {
        self.lock_unstored()
            .get(job_id)
            .is_some_and(|(u, m)| u == user && m == model)
    }

    pub fn unstored_count(&self, user: &str, model: &str) -> u64 {
        self.lock_unstored()
            .values()
            .filter(|(u, m)| u == user && m == model)
            .count() as u64
    }

    /// Sets `instance`'s credits from its free slots per model (only models
    /// whose queue it found empty), less the credits already taken.
    pub fn set_credits(&self, instance: &str, free: impl Iterator<Item = (String, u64)>) {
        let mut guard = self.lock();
        let Some(lane) = guard.as_mut().filter(|lane| lane.instance == instance) else {
            return;
        };
        lane.credits.clear();
        for (model, slots) in free {
            let taken = lane.pending.get(&model).copied().unwrap_or(0);
            let left = slots.saturating_sub(taken);
            if left > 0 {
                lane.credits.insert(model, left);
            }
        }
    }

    pub fn take_credit(&self, model: &str) -> Option<Credit> {
        let mut guard = self.lock();
        let lane = guard.as_mut()?;
        let credits = lane.credits.get_mut(model).filter(|n| **n > 0)?;
        *credits -= 1;
        *lane.pending.entry(model.to_string()).or_insert(0) += 1;
        Some(Credit {
            instance: lane.instance.clone(),
            lease_ms: lane.lease_ms,
        })
    }

    /// Credits of `instance`'s lane taken for `model` whose rows it has not
    /// adopted yet: free slots that those submits are about to fill.
    pub fn lane_taken(&self, instance: &str, model: &str) -> u64 {
        self.lock()
            .as_ref()
            .filter(|lane| lane.instance == instance)
            .and_then(|lane| lane.pending.get(model).copied())
            .unwrap_or(0)
    }

    pub fn return_credit(&self, model: &str) {
        if let Some(lane) = self.lock().as_mut()
            && let Some(pending) = lane.pending.get_mut(model)
        {
            *pending = pending.saturating_sub(1);
        }
    }

    /// Gives a job to the lane's scheduler; false (and the job dropped) if
    /// the lane closed. The caller wakes the scheduler.
    pub fn hand_over(&self, row: job::Model, stored: bool) -> bool {
        let mut guard = self.lock();
        let Some(lane) = guard.as_mut() else {
            return false;
        };
        if !stored {
            self.lock_unstored()
                .insert(row.id.clone(), (row.user_id.clone(), row.model.clone()));
        }
        lane.handed.push(Handed { row, stored });
        true
    }

    /// Jobs handed over to `instance`, to place on its workers.
    pub fn adopt(&self, instance: &str) -> Vec<Handed> {
        let mut guard = self.lock();
        let Some(lane) = guard.as_mut().filter(|lane| lane.instance == instance) else {
            return Vec::new();
        };
        let handed = std::mem::take(&mut lane.handed);
        for job in &handed {
            if let Some(pending) = lane.pending.get_mut(&job.row.model) {
                *pending = pending.saturating_sub(1);
            }
        }
        handed
    }

    /// Forgets these jobs as running unwritten (they never will be
    /// written); returns those that were.
    pub fn forget<'a>(&self, job_ids: &'a [String]) -> Vec<&'a String> {
        let mut unstored = self.lock_unstored();
        job_ids.iter().filter(|id| unstored.remove(*id).is_some()).collect()
    }

    /// The ids of every job running unwritten.
    pub fn unstored_ids(&self) -> Vec<String> {
        self.lock_unstored().keys().cloned().collect()
    }
}
