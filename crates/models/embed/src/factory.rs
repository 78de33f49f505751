//! The sentence-embedding models' side of the plug-in boundary: every
//! manifest entry of category `embedding`, and the `[embedding]` settings.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{EmbeddingModel, Options};

/// Batch size and device of the sentence-embedding models: `[embedding]`
/// in the configuration file, `GANTRY_EMBEDDING__…` in the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmbeddingSettings {
    /// Most inputs in one forward pass; inputs of concurrent jobs share
    /// batches up to this size.
    pub max_batch: usize,
    /// CUDA device ordinal to run on; unset means the CPU. Needs a binary
    /// built with the `cuda` feature.
    pub cuda_device: Option<usize>,
}

impl Default for EmbeddingSettings {
    fn default() -> Self {
        let options = Options::default();
        Self {
            max_batch: options.max_batch,
            cuda_device: options.cuda_device,
        }
    }
}

/// Loads a sentence-transformers directory (`model.safetensors`, …).
pub struct EmbeddingFactory;

impl ModelFactory for EmbeddingFactory {
    const SETTINGS: Option<&'static str> = Some("embedding");
    type Settings = EmbeddingSettings;
    type Model = EmbeddingModel;

    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Embedding
    }

    fn load(files: &ModelFiles<'_>, settings: &EmbeddingSettings) -> Result<EmbeddingModel, String> {
        let dir = files.dir();
        let options = Options {
            max_batch: settings.max_batch.max(1),
            cuda_device: settings.cuda_device,
        };
        let stated = crate::input::Sizes::from_engine(&files.entry().engine)?;
        let model = EmbeddingModel::load(files.id(), &dir, &options).map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some(stated) = stated {
            stated.check(&model.sizes())?;
        }
        Ok(model)
    }
}
