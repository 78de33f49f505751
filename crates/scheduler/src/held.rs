//! The jobs this instance holds: assigned to a worker (or kept ready for a
//! slot) and not yet settled, each with what the loop must know of it, and
//! the worker ids not yet written to their rows. Every duty reads and changes
//! them through these methods; a job let go takes its unwritten worker id
//! with it.

use std::collections::HashMap;

use gantry_jobs::entity::job;

/// A job this instance has assigned and not yet settled.
pub(super) struct Running {
    pub(super) attempt: i32,
    pub(super) model: String,
    pub(super) deadline_ms: i64,
    /// False while it waits in `Demand`'s ready queue for a free slot.
    pub(super) assigned: bool,
    /// The whole row of a job not written yet (a `runsync` job of the fast
    /// lane, see `store::Lane`), and when it is to be written if still running.
    pub(super) unstored: Option<Box<job::Model>>,
    pub(super) store_at: i64,
    /// It sent a chunk or progress: readers may follow it from other
    /// processes, so its end is announced to them (see `publish`).
    pub(super) streamed: bool,
}

impl Running {
    /// When the loop must look at this job: its deadline, or when to write it.
    pub(super) fn due_at(&self) -> i64 {
        if self.unstored.is_some() {
            self.store_at.min(self.deadline_ms)
        } else {
            self.deadline_ms
        }
    }

    /// Its row is written (it can be renewed, timed out, ended elsewhere).
    pub(super) fn is_stored(&self) -> bool {
        self.unstored.is_none()
    }
}

#[derive(Default)]
pub(super) struct Held {
    jobs: HashMap<String, Running>,
    /// Worker ids not yet written to their job rows (written at the next
    /// sweep, unless the job settles first and writes it itself).
    workers: HashMap<String, String>,
}

impl Held {
    pub(super) fn hold(&mut self, job_id: String, running: Running) {
        self.jobs.insert(job_id, running);
    }

    /// The job went to `worker_id`; the id is written to its row later.
    pub(super) fn assigned_to(&mut self, job_id: String, worker_id: String) {
        self.workers.insert(job_id, worker_id);
    }

    pub(super) fn get(&self, job_id: &str) -> Option<&Running> {
        self.jobs.get(job_id)
    }

    pub(super) fn get_mut(&mut self, job_id: &str) -> Option<&mut Running> {
        self.jobs.get_mut(job_id)
    }

    /// Lets the job go (settled, ended elsewhere, handed back), with its
    /// unwritten worker id; what was held of it, if anything.
    pub(super) fn release(&mut self, job_id: &str) -> Option<Running> {
        self.workers.remove(job_id);
        self.jobs.remove(job_id)
    }

    /// Lets every job go, for the instance's shutdown.
    pub(super) fn release_all(&mut self) -> HashMap<String, Running> {
        self.workers.clear();
        std::mem::take(&mut self.jobs)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Running)> {
        self.jobs.iter()
    }

    /// The ids of the held jobs whose rows are written and that `matches`.
    pub(super) fn stored_where(&self, matches: impl Fn(&Running) -> bool) -> Vec<String> {
        self.jobs
            .iter()
            .filter(|(_, r)| r.is_stored() && matches(r))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether a held job whose row is written is past its deadline at `now`.
    pub(super) fn any_overdue(&self, now: i64) -> bool {
        self.jobs.values().any(|r| r.is_stored() && r.deadline_ms <= now)
    }

    /// The worker of a job whose id is not written yet.
    pub(super) fn unwritten_worker(&self, job_id: &str) -> Option<String> {
        self.workers.get(job_id).cloned()
    }

    /// When the loop must next look at a held job (see [`Running::due_at`]).
    pub(super) fn next_due(&self) -> Option<i64> {
        self.jobs.values().map(Running::due_at).min()
    }

    /// The worker ids to write now, by worker: those of stored jobs (a job
    /// not written yet keeps its id until it is).
    pub(super) fn take_workers_to_write(&mut self) -> HashMap<String, Vec<String>> {
        let jobs = &self.jobs;
        let ready: Vec<String> = self
            .workers
            .keys()
            .filter(|id| jobs.get(id.as_str()).is_none_or(Running::is_stored))
            .cloned()
            .collect();
        let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
        for job_id in ready {
            if let Some(worker_id) = self.workers.remove(&job_id) {
                by_worker.entry(worker_id).or_default().push(job_id);
            }
        }
        by_worker
    }
}

#[cfg(test)]
mod tests {
    use super::{Held, Running};

    fn running(deadline_ms: i64, stored: bool) -> Running {
        Running {
            attempt: 1,
            model: "echo".into(),
            deadline_ms,
            assigned: true,
            unstored: (!stored).then(|| Box::new(gantry_jobs::entity::job::sample("sync", "echo"))),
            store_at: 50,
            streamed: false,
        }
    }

    #[test]
    fn a_released_job_takes_its_unwritten_worker_id_with_it() {
        let mut held = Held::default();
        held.hold("a".into(), running(100, true));
        held.hold("b".into(), running(200, true));
        held.assigned_to("a".into(), "w1".into());
        held.assigned_to("b".into(), "w1".into());
        assert!(held.release("a").is_some());
        assert_eq!(held.unwritten_worker("a"), None);
        assert_eq!(held.take_workers_to_write().remove("w1"), Some(vec!["b".to_string()]));
        assert!(held.take_workers_to_write().is_empty(), "written once");
        assert!(held.release("a").is_none());
    }

    #[test]
    fn an_unstored_job_keeps_its_worker_id_and_is_due_when_it_is_to_be_written() {
        let mut held = Held::default();
        held.hold("sync".into(), running(1_000, false));
        held.hold("stored".into(), running(300, true));
        held.assigned_to("sync".into(), "w1".into());
        assert!(held.take_workers_to_write().is_empty());
        assert_eq!(held.unwritten_worker("sync").as_deref(), Some("w1"));
        // Written at 50, before its deadline; the stored one at its deadline.
        assert_eq!(held.next_due(), Some(50));
        assert_eq!(held.stored_where(|_| true), ["stored"]);
        assert!(!held.any_overdue(299) && held.any_overdue(300));
        // Never overdue while unstored: it is written first.
        held.release("stored");
        assert!(!held.any_overdue(5_000));
        assert_eq!(held.release_all().len(), 1);
        assert!(held.is_empty() && held.unwritten_worker("sync").is_none());
    }
}
