//! A read cache of volume lists, for deployments where this process is the only
//! writer of the volumes table (embedded SQLite, guarded by a lock file).
//!
//! Coherence: every write bumps the owner's generation after it commits; a list
//! read from the database is cached under the generation seen before the read,
//! and an entry whose generation is behind is never served.
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::model::NetworkVolume;

const MAX_ENTRIES: usize = 50_000;

#[derive(Default)]
pub(crate) struct ListCache {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    generations: HashMap<String, u64>,
    lists: HashMap<String, (u64, Arc<Vec<NetworkVolume>>)>,
}

impl ListCache {
    /// The cached list if current, else the generation to cache a fresh read under.
    pub(crate) fn get(&self, owner: &str) -> Result<Arc<Vec<NetworkVolume>>, u64> {
        let Ok(state) = self.state.read() else {
            return Err(u64::MAX);
        };
        let generation = state.generations.get(owner).copied().unwrap_or(0);
        match state.lists.get(owner) {
            Some((at, list)) if *at == generation => Ok(list.clone()),
            _ => Err(generation),
        }
    }

    pub(crate) fn put(&self, owner: &str, generation: u64, list: Arc<Vec<NetworkVolume>>) {
        let Ok(mut state) = self.state.write() else { return };
        if state.generations.get(owner).copied().unwrap_or(0) != generation {
            return; // a write committed while the list was being read
        }
        if state.lists.len() >= MAX_ENTRIES {
            state.lists.clear();
        }
        state.lists.insert(owner.to_string(), (generation, list));
    }

    /// Called after a write of `owner`'s volumes has committed.
    pub(crate) fn invalidate(&self, owner: &str) {
        if let Ok(mut state) = self.state.write() {
            *state.generations.entry(owner.to_string()).or_insert(0) += 1;
            state.lists.remove(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(name: &str) -> Arc<Vec<NetworkVolume>> {
        Arc::new(vec![NetworkVolume {
            id: "v".into(),
            name: name.into(),
            size: 10,
            data_center: "X".into(),
            volume_type: gantry_catalog::VolumeType::Standard,
        }])
    }

    #[test]
    fn a_read_that_raced_a_write_is_never_served() {
        let cache = ListCache::default();
        let generation = cache.get("u").err().unwrap_or_default();
        cache.invalidate("u"); // a write commits while the old list is being read
        cache.put("u", generation, list("old"));
        assert!(cache.get("u").is_err(), "the stale read was not cached");
        let generation = cache.get("u").err().unwrap_or_default();
        cache.put("u", generation, list("new"));
        assert_eq!(cache.get("u").ok().map(|l| l[0].name.clone()), Some("new".into()));
        cache.invalidate("u");
        assert!(cache.get("u").is_err(), "a write drops the entry");
        assert!(cache.get("someone-else").is_err());
    }
}
