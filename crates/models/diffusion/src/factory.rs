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

    /// The input type's schema with the bounds and defaults of the entry's
    /// `engine.variant` (an entry that states its own schema keeps it).
    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        let variant = entry
            .engine
            .get("variant")
            .and_then(|v| v.as_str())
            .and_then(Variant::parse);
        crate::input::schema(variant)
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

#[cfg(test)]
mod tests {
    use gantry_manifest::Manifest;

    use super::*;

    fn entry(variant: &str) -> ModelEntry {
        let toml = format!(
            r#"
[[models]]
id = "sd"
category = "image"
unit = "megapixels"
hold = {{ units = 1 }}
price = {{ micro_usd = 1, per = 1 }}
description = "a test entry"
license = "MIT"
engine = {{ architecture = "stable-diffusion", variant = "{variant}" }}
"#
        );
        Manifest::from_toml(&toml).expect("manifest").models()[0].clone()
    }

    #[test]
    fn the_schema_is_the_entrys_variants() {
        let turbo = entry("sd-turbo");
        assert!(DiffusionFactory::accepts(&turbo));
        let schema = DiffusionFactory::input_schema(&turbo);
        assert_eq!(schema["required"], serde_json::json!(["prompt"]));
        assert_eq!(schema["properties"]["num_inference_steps"]["maximum"], 4);
        let xl = DiffusionFactory::input_schema(&entry("sdxl"));
        assert_eq!(xl["properties"]["width"]["maximum"], 1536);
        // A variant no model has: the type's schema, without a variant's bounds.
        let unknown = DiffusionFactory::input_schema(&entry("sd-9"));
        assert_eq!(unknown["properties"]["prompt"]["maxLength"], 2000);
        assert!(unknown["properties"]["width"].get("maximum").is_none());
    }
}
