//! The echo model's side of the plug-in boundary: the manifest entry
//! `gantry-echo`; it has no settings and nothing to load.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles};

use crate::{EchoModel, MODEL_ID};

/// Serves the entry `gantry-echo`.
pub struct EchoFactory;

impl ModelFactory for EchoFactory {
    const SETTINGS: Option<&'static str> = None;
    type Settings = ();
    type Model = EchoModel;

    fn input_schema(_entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema()
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.id == MODEL_ID
    }

    fn load(_files: &ModelFiles<'_>, _settings: &()) -> Result<EchoModel, String> {
        Ok(EchoModel)
    }
}
