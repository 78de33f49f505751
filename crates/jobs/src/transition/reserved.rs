//! Holds of admitted jobs that are not written yet, kept by the SQLite
//! writer thread (`engine.rs`) beside the holds the database sums.
//!
//! A `runsync` job the fast lane runs unwritten (see `lane.rs`) is admitted
//! against its owner's credit like any job, but with nothing inserted: its
//! hold is reserved here, where every later admission of the same owner
//! counts it, until the scheduler writes the job (its row then holds it, or
//! its charge is debited) or loses it. Only the writer thread reads and
//! changes them, between the statements of its transactions, so an admission
//! sees exactly the holds of the admissions and writes before it. That is
//! exact only while this thread admits every job of the database: the job
//! store reserves only when its process owns the SQLite file alone
//! (`SchedulerConfig::sole_owner`).
//!
//! Changes made inside a transaction are journaled and undone if it rolls
//! back, so a batch run again one operation at a time reserves nothing twice.

use std::collections::HashMap;

/// The reserved holds: by job, and their sum by owner.
#[derive(Default)]
pub(super) struct Reservations {
    jobs: HashMap<String, (String, i64)>,
    owners: HashMap<String, i64>,
    /// What the running transaction changed, to undo on rollback.
    journal: Vec<Change>,
}

enum Change {
    Added(String),
    Removed(String, String, i64),
}

impl Reservations {
    /// The sum of `user`'s reserved holds.
    pub fn of(&self, user: &str) -> i64 {
        self.owners.get(user).copied().unwrap_or(0)
    }

    /// Reserves `hold` for `job` of `user` (nothing if it is reserved already).
    pub fn add(&mut self, job: &str, user: &str, hold: i64) {
        if self.jobs.contains_key(job) {
            return;
        }
        self.jobs.insert(job.to_owned(), (user.to_owned(), hold));
        let sum = self.owners.entry(user.to_owned()).or_insert(0);
        *sum = sum.saturating_add(hold);
        self.journal.push(Change::Added(job.to_owned()));
    }

    /// Drops `job`'s reservation, if it has one.
    pub fn remove(&mut self, job: &str) {
        if let Some((user, hold)) = self.take(job) {
            self.journal.push(Change::Removed(job.to_owned(), user, hold));
        }
    }

    fn take(&mut self, job: &str) -> Option<(String, i64)> {
        let (user, hold) = self.jobs.remove(job)?;
        if let Some(sum) = self.owners.get_mut(&user) {
            *sum = sum.saturating_sub(hold);
            if *sum <= 0 {
                self.owners.remove(&user);
            }
        }
        Some((user, hold))
    }

    /// The transaction committed: its changes stand.
    pub fn commit(&mut self) {
        self.journal.clear();
    }

    /// The transaction rolled back: its changes are undone, last first.
    pub fn roll_back(&mut self) {
        while let Some(change) = self.journal.pop() {
            match change {
                Change::Added(job) => {
                    self.take(&job);
                }
                Change::Removed(job, user, hold) => {
                    self.jobs.insert(job, (user.clone(), hold));
                    let sum = self.owners.entry(user).or_insert(0);
                    *sum = sum.saturating_add(hold);
                }
            }
        }
    }

    /// How many jobs hold a reservation.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Reservations;

    #[test]
    fn reservations_sum_by_owner_and_a_rollback_undoes_only_its_own_changes() {
        let mut held = Reservations::default();
        held.add("a", "u", 10);
        held.add("b", "u", 5);
        held.add("c", "v", 7);
        held.add("a", "u", 10);
        held.commit();
        assert_eq!((held.of("u"), held.of("v"), held.of("w")), (15, 7, 0));

        // A transaction that adds one, removes two, then rolls back.
        held.add("d", "u", 1);
        held.remove("a");
        held.remove("c");
        held.remove("missing");
        assert_eq!((held.of("u"), held.of("v")), (6, 0));
        held.roll_back();
        assert_eq!((held.of("u"), held.of("v"), held.len()), (15, 7, 3));

        // The same, committed.
        held.remove("a");
        held.remove("b");
        held.commit();
        held.roll_back();
        assert_eq!((held.of("u"), held.of("v"), held.len()), (0, 7, 1));
    }
}
