//! Wake-ups of this process's scheduler: what the store (or a signal from
//! another process) found for it to do since it last looked. Collected only
//! while a scheduler is attached.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// What a scheduler is woken for.
#[derive(Default)]
pub struct Pending {
    pub models: HashSet<String>,
    /// Jobs cancelled in this process: stop them.
    pub cancels: Vec<String>,
    /// Jobs another process signalled cancelled: stop them if their rows agree.
    pub rechecks: HashSet<String>,
    /// Signals may have been missed: claim for every model with free slots.
    pub refill_all: bool,
}

#[derive(Default)]
pub struct Wakeups {
    pending: Mutex<Pending>,
    /// Notified whenever something is added (and for jobs handed over).
    pub notify: Notify,
    /// Schedulers attached (see [`Attached`]). Without one, nothing takes
    /// what `pending` collects, so nothing is collected.
    schedulers: AtomicUsize,
}

impl Wakeups {
    fn lock_pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn has_scheduler(&self) -> bool {
        self.schedulers.load(Ordering::Acquire) > 0
    }

    /// Jobs of `model` were queued: claim them.
    pub fn queued(&self, model: &str) {
        if !self.has_scheduler() {
            return;
        }
        let mut pending = self.lock_pending();
        if !pending.models.contains(model) {
            pending.models.insert(model.to_string());
        }
        drop(pending);
        self.notify.notify_one();
    }

    pub fn cancel(&self, job_id: &str) {
        if !self.has_scheduler() {
            return;
        }
        self.lock_pending().cancels.push(job_id.to_string());
        self.notify.notify_one();
    }

    /// Another process cancelled `job_id`: stop it if its row agrees.
    pub fn recheck(&self, job_id: String) {
        if self.has_scheduler() {
            self.lock_pending().rechecks.insert(job_id);
            self.notify.notify_one();
        }
    }

    /// Signals may have been missed: claim for every model with free slots.
    pub fn refill_all(&self) {
        if self.has_scheduler() {
            self.lock_pending().refill_all = true;
            self.notify.notify_one();
        }
    }

    /// The cancels collected since the last call, and only those: a
    /// scheduler about to hand jobs kept ready to freed slots takes them first,
    /// so none it was told of is handed out.
    pub fn take_cancels(&self) -> Vec<String> {
        std::mem::take(&mut self.lock_pending().cancels)
    }

    /// What was collected since the last call.
    pub fn take(&self) -> Pending {
        std::mem::take(&mut *self.lock_pending())
    }
}

/// Counts a scheduler on its wake-ups for as long as it lives: held by the
/// scheduler's loop, so it is released however the loop ends (stopped, or
/// aborted when its `Scheduler` is dropped).
pub struct Attached(Arc<Wakeups>);

impl Attached {
    pub fn new(wakeups: &Arc<Wakeups>) -> Self {
        wakeups.schedulers.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(wakeups))
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.schedulers.fetch_sub(1, Ordering::AcqRel);
    }
}
