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

    // The input schema is still the manifest entry's own (to be made from the input type).
    fn input_schema(_entry: &ModelEntry) -> serde_json::Value {
        serde_json::Value::Null
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.id == MODEL_ID
    }

    fn load(_files: &ModelFiles<'_>, _settings: &()) -> Result<EchoModel, String> {
        Ok(EchoModel)
    }
}
