//! The image generators' side of the plug-in boundary: image entries run
//! by this crate (a GAN generator, or the terrain model on ONNX Runtime).
//! Stable Diffusion entries belong to `gantry-model-diffusion`. No settings.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};

use crate::{GanSpec, ImageModel, TerrainSpec};

/// Loads a GAN generator from the safetensors its pull converted from the
/// published checkpoint, or with `engine.architecture = "consistency-onnx"`
/// the terrain model's graph on the ONNX Runtime library among its files.
pub struct ImageFactory;

impl ModelFactory for ImageFactory {
    const SETTINGS: Option<&'static str> = None;
    type Settings = ();
    type Model = ImageModel;

    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Image
            && entry.engine.get("architecture").and_then(|a| a.as_str()) != Some("stable-diffusion")
    }

    fn load(files: &ModelFiles<'_>, _settings: &()) -> Result<ImageModel, String> {
        let model = if files.engine_str("architecture") == Some("consistency-onnx") {
            let graph = files.find(".onnx", |name| name.ends_with(".onnx"))?;
            let library = files.find("libonnxruntime.so", |name| name.starts_with("libonnxruntime.so"))?;
            let spec = TerrainSpec::from_engine(&files.entry().engine)?;
            ImageModel::load_terrain(files.id(), &library, &graph, 0, spec)
                .map_err(|e| format!("{}: {e}", graph.display()))?
        } else {
            let file = files
                .entry()
                .files
                .first()
                .ok_or("the manifest entry names no weight file")?;
            let path = files.loaded_path(file);
            let spec = GanSpec::from_engine(&files.entry().engine)?;
            ImageModel::load(files.id(), &path, spec).map_err(|e| format!("{}: {e}", path.display()))?
        };
        tracing::info!(model = files.id(), side = model.native_side(), "image model ready");
        Ok(model)
    }
}
