//! What the claim duty (`assign.rs`) knows about the queues: which models to
//! claim for, which were found empty, and the jobs claimed ahead of free
//! slots. `Claim` owns it; settlement and the sweep tell it what they saw
//! through `Claim`'s methods, which forward to the methods below; none of
//! them reads or writes its sets directly.

use std::collections::{HashMap, HashSet, VecDeque};

use gantry_dispatch::{Assignment, Health};

/// What to do with the next job kept ready (see [`Demand::assign_ready`]).
pub(super) enum Placed {
    /// A worker took it, or it is no longer to be run: next one.
    Gone,
    /// No slot of its model is free: keep it and the rest.
    NoRoom,
}

#[derive(Default)]
pub(super) struct Demand {
    /// Models to claim for at the next chance.
    to_fill: HashSet<String>,
    /// Models whose last claim found the queue empty: a freed slot alone does
    /// not trigger a claim for them (a submit, a requeue or a sweep does).
    drained: HashSet<String>,
    /// Models whose queue was signalled while a settlement (and its claims)
    /// was being committed: that claim may have missed the new jobs, so its
    /// finding an empty queue must not drop them.
    signalled_in_flight: HashSet<String>,
    /// Jobs claimed ahead of free slots, per model, oldest first (see
    /// `SchedulerConfig::claim_ahead`). Also in the loop's running jobs, not
    /// assigned.
    ready: HashMap<String, VecDeque<Assignment>>,
}

impl Demand {
    /// Jobs of `model` may be queued (a submit, a requeue, a put-back): claim
    /// for it, whatever the last claim found.
    pub(super) fn queued(&mut self, model: String) {
        self.drained.remove(&model);
        self.to_fill.insert(model);
    }

    /// [`Demand::queued`] for a wake-up from a submit; `settling`: a
    /// settlement is being committed, whose claim may not see the new jobs.
    pub(super) fn signalled(&mut self, model: String, settling: bool) {
        if settling {
            self.signalled_in_flight.insert(model.clone());
        }
        self.queued(model);
    }

    /// Every model with a free slot is to be claimed for (a wake-up that
    /// names no model); `settling`: every model marked is claimed for again
    /// once the settlement being committed is done.
    pub(super) fn all_with_free_slots(&mut self, health: &Health, settling: bool) {
        for (model, health) in &health.models {
            if health.free_slots > 0 {
                self.to_fill.insert(model.clone());
            }
        }
        if settling {
            self.signalled_in_flight.extend(self.to_fill.iter().cloned());
        }
    }

    /// A slot of `model` was freed: claim for it unless its queue was found
    /// empty.
    pub(super) fn slot_freed(&mut self, model: String) {
        if !self.drained.contains(&model) {
            self.to_fill.insert(model);
        }
    }

    /// What a claim of `model` found: `empty` when it got fewer jobs than it
    /// asked for.
    pub(super) fn claimed(&mut self, model: &str, empty: bool) {
        if empty {
            self.drained.insert(model.to_string());
        } else {
            self.drained.remove(model);
        }
    }

    /// Jobs of `model` went back to the queue unclaimed: its queue is not
    /// empty, though nothing need claim for it before a slot frees.
    pub(super) fn put_back(&mut self, model: &str) {
        self.drained.remove(model);
    }

    /// A claim committed with a settlement was placed; `more`: the queue may
    /// hold more for free slots, so the model stays marked.
    pub(super) fn settled_claim(&mut self, model: &str, more: bool) {
        if !more {
            self.to_fill.remove(model);
        }
    }

    /// A settlement starts committing: wake-ups from now on are noted.
    pub(super) fn settlement_started(&mut self) {
        self.signalled_in_flight.clear();
    }

    /// The settlement committed: what was signalled meanwhile is claimed for
    /// again rather than left for a sweep.
    pub(super) fn settlement_finished(&mut self) {
        for model in std::mem::take(&mut self.signalled_in_flight) {
            self.queued(model);
        }
    }

    /// The models to claim for now, unmarked.
    pub(super) fn take_wanted(&mut self) -> Vec<String> {
        self.to_fill.drain().collect()
    }

    /// The models a settlement claims for: those marked, and those whose
    /// slots it frees (`freed`) unless their queue was found empty.
    pub(super) fn claim_models<'a>(&self, freed: impl Iterator<Item = &'a String>) -> Vec<String> {
        let mut models: Vec<String> = self.to_fill.iter().cloned().collect();
        for model in freed {
            if !self.drained.contains(model) && !models.contains(model) {
                models.push(model.clone());
            }
        }
        models
    }

    /// Whether the fast lane may take `model`'s free slots: its queue was
    /// found empty and no job is kept ready for it.
    pub(super) fn lane_may_take(&self, model: &str) -> bool {
        self.drained.contains(model) && !self.ready.contains_key(model)
    }

    /// Jobs kept ready for `model`.
    pub(super) fn ready_count(&self, model: &str) -> u64 {
        self.ready.get(model).map_or(0, |queue| queue.len() as u64)
    }

    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Keeps a claimed job for `model`'s next free slot.
    pub(super) fn keep_ready(&mut self, model: String, assignment: Assignment) {
        self.ready.entry(model).or_default().push_back(assignment);
    }

    /// Offers the jobs kept ready, oldest first per model, to `place` until it
    /// finds no room for a model.
    pub(super) fn assign_ready(&mut self, mut place: impl FnMut(&Assignment) -> Placed) {
        for queue in self.ready.values_mut() {
            while let Some(next) = queue.front() {
                match place(next) {
                    Placed::Gone => {
                        queue.pop_front();
                    }
                    Placed::NoRoom => break,
                }
            }
        }
        self.ready.retain(|_, queue| !queue.is_empty());
    }

    /// Forgets the jobs kept ready (the instance hands them all back).
    pub(super) fn clear_ready(&mut self) {
        self.ready.clear();
    }
}

#[cfg(test)]
mod tests {
    use gantry_dispatch::{Assignment, Health, ModelHealth};

    use super::{Demand, Placed};

    fn wanted(demand: &mut Demand) -> Vec<String> {
        let mut models = demand.take_wanted();
        models.sort();
        models
    }

    #[test]
    fn a_model_found_empty_is_claimed_again_for_new_jobs_not_for_freed_slots() {
        let mut demand = Demand::default();
        demand.claimed("echo", true);
        demand.slot_freed("echo".into());
        assert!(wanted(&mut demand).is_empty(), "its queue was found empty");
        assert!(demand.lane_may_take("echo"));
        demand.queued("echo".into());
        assert_eq!(wanted(&mut demand), ["echo"]);
        assert!(!demand.lane_may_take("echo"), "its queue may hold jobs again");
        demand.slot_freed("echo".into());
        assert_eq!(wanted(&mut demand), ["echo"]);
        // Jobs put back unclaimed: not empty, but nothing to claim before a slot frees.
        demand.claimed("echo", true);
        demand.put_back("echo");
        assert!(wanted(&mut demand).is_empty());
        assert!(!demand.lane_may_take("echo"));
    }

    #[test]
    fn what_is_signalled_during_a_settlement_is_claimed_for_after_it() {
        let mut demand = Demand::default();
        demand.settlement_started();
        demand.signalled("echo".into(), true);
        // The settlement's claim found the queue empty and unmarked it...
        demand.claimed("echo", true);
        demand.settled_claim("echo", false);
        assert!(demand.claim_models(std::iter::empty()).is_empty());
        // ...but the signal came while it committed: claim again.
        demand.settlement_finished();
        assert_eq!(wanted(&mut demand), ["echo"]);
        // Without a settlement in flight nothing is kept for later.
        demand.settlement_started();
        demand.signalled("text".into(), false);
        demand.settled_claim("text", false);
        demand.settlement_finished();
        assert!(wanted(&mut demand).is_empty());
    }

    #[test]
    fn a_wake_up_for_all_marks_the_models_with_free_slots() {
        let mut demand = Demand::default();
        let health = Health {
            models: [
                ("busy".to_string(), ModelHealth::default()),
                (
                    "echo".to_string(),
                    ModelHealth {
                        free_slots: 2,
                        ..ModelHealth::default()
                    },
                ),
            ]
            .into(),
        };
        demand.queued("text".into());
        demand.all_with_free_slots(&health, true);
        let freed = ["busy".to_string(), "image".to_string()];
        let mut models = demand.claim_models(freed.iter());
        models.sort();
        assert_eq!(models, ["busy", "echo", "image", "text"]);
        // Every model marked then is claimed for again after the settlement.
        demand.settled_claim("echo", false);
        demand.settled_claim("text", false);
        demand.settlement_finished();
        assert_eq!(wanted(&mut demand), ["echo", "text"]);
    }

    #[test]
    fn jobs_kept_ready_are_offered_oldest_first_until_a_model_has_no_room() {
        let mut demand = Demand::default();
        for id in ["a", "b", "c"] {
            demand.keep_ready("echo".into(), Assignment::new(id, 1, "echo", serde_json::json!({})));
        }
        assert_eq!(demand.ready_count("echo"), 3);
        demand.claimed("echo", true);
        assert!(!demand.lane_may_take("echo"), "jobs wait for its slots");
        let mut offered = Vec::new();
        demand.assign_ready(|next| {
            offered.push(next.job_id.clone());
            if next.job_id == "b" {
                Placed::NoRoom
            } else {
                Placed::Gone
            }
        });
        assert_eq!(offered, ["a", "b"]);
        assert_eq!(demand.ready_count("echo"), 2);
        demand.assign_ready(|_| Placed::Gone);
        assert!(!demand.has_ready());
        assert!(demand.lane_may_take("echo"));
    }
}
