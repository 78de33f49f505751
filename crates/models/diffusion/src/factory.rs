//! The Stable Diffusion models' side of the plug-in boundary: image entries
//! with `engine.architecture = "stable-diffusion"`, and the `[diffusion]`
//! settings table.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{DiffusionModel, LoadOptions, Variant};

/// Where the Stable Diffusion models run: `[diffusion]` in the
/// configuration file, `GANTRY_DIFFUSION__…` in the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiffusionSettings {
    /// CUDA device ordinal to run on; unset means the CPU. Needs a binary
    /// built with the `cuda` feature.
    pub cuda_device: Option<usize>,
    /// Half-precision (F16) weights and arithmetic: half the memory, for GPUs.
    pub half: bool,
}

/// Loads a diffusers-layout directory; `engine.variant` says which family.
pub struct DiffusionFactory;

impl ModelFactory for DiffusionFactory {
    const SETTINGS: Option<&'static str> = Some("diffusion");
    type Settings = DiffusionSettings;
    type Model = DiffusionModel;

    // The input schema is still the manifest entry's own (to be made from the input type).
    fn input_schema(_entry: &ModelEntry) -> serde_json::Value {
        serde_json::Value::Null
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Image
            && entry.engine.get("architecture").and_then(|a| a.as_str()) == Some("stable-diffusion")
    }

    fn load(files: &ModelFiles<'_>, settings: &DiffusionSettings) -> Result<DiffusionModel, String> {
        let variant = files
            .engine_str("variant")
            .and_then(Variant::parse)
            .ok_or("engine.variant must be sd-1.5, sd-turbo or sdxl")?;
        let options = LoadOptions {
            cuda_device: settings.cuda_device,
            half: settings.half,
            architecture: None,
        };
        let model = DiffusionModel::load(files.id(), &files.dir(), variant, options).map_err(|e| e.to_string())?;
        tracing::info!(model = files.id(), variant = variant.name(), "diffusion model ready");
        Ok(model)
    }
}
