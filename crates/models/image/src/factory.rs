//! The image generators' side of the plug-in boundary: image entries run
//! by this crate (a GAN generator, or the terrain model on ONNX Runtime).
//! Stable Diffusion entries belong to `gantry-model-diffusion`. Settings:
//! `[image]`, the device of the GAN generators.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{Backend, GanSpec, ImageModel, TerrainSpec};

/// Where the GAN generators run: `[image]` in the configuration file,
/// `GANTRY_IMAGE__…` in the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageSettings {
    /// CUDA device ordinal the image models run on: the GAN generators on
    /// candle's CUDA backend (a binary built with the `cuda` feature), the
    /// terrain model on ONNX Runtime's CUDA provider (`onnx_library` naming
    /// a GPU build of the runtime). Unset means the CPU: the GANs on this
    /// crate's kernels, the terrain on ONNX Runtime's CPU provider.
    pub cuda_device: Option<usize>,
}

/// Loads a GAN generator from the safetensors its pull converted from the
/// published checkpoint, or with `engine.architecture = "consistency-onnx"`
/// the terrain model's graph on the ONNX Runtime library among its files.
pub struct ImageFactory;

impl ModelFactory for ImageFactory {
    const SETTINGS: Option<&'static str> = Some("image");
    type Settings = ImageSettings;
    type Model = ImageModel;

    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Image
            && entry.engine.get("architecture").and_then(|a| a.as_str()) != Some("stable-diffusion")
    }

    fn load(files: &ModelFiles<'_>, settings: &ImageSettings) -> Result<ImageModel, String> {
        let model = if files.engine_str("architecture") == Some("consistency-onnx") {
            let graph = files.find(".onnx", |name| name.ends_with(".onnx"))?;
            let library = files.find("libonnxruntime.so", |name| name.starts_with("libonnxruntime.so"))?;
            let spec = TerrainSpec::from_engine(&files.entry().engine)?;
            let device = gantry_onnx::Device::from_cuda_device(settings.cuda_device);
            ImageModel::load_terrain(files.id(), &library, &graph, 0, device, spec)
                .map_err(|e| format!("{}: {e}", graph.display()))?
        } else {
            let file = files
                .entry()
                .files
                .first()
                .ok_or("the manifest entry names no weight file")?;
            let path = files.loaded_path(file);
            let spec = GanSpec::from_engine(&files.entry().engine)?;
            let backend = Backend::for_cuda_device(settings.cuda_device).map_err(|e| e.to_string())?;
            ImageModel::load(files.id(), &path, spec, &backend).map_err(|e| format!("{}: {e}", path.display()))?
        };
        tracing::info!(model = files.id(), side = model.native_side(), backend = %model.backend_name(), "image model ready");
        Ok(model)
    }
}
