//! The text models' side of the plug-in boundary: every manifest entry of
//! category `text` (a GGUF file), and the `[text]` settings table.
use std::time::Duration;

use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{DEFAULT_STREAM_INTERVAL, EngineOptions, TextModel};

/// The text engine (llama.cpp), per loaded model: `[text]` in the
/// configuration file, `GANTRY_TEXT__…` in the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TextSettings {
    /// CPU threads of the engine; 0 means one per core.
    pub threads: usize,
    /// Threads that draw the next tokens of a step's sequences at once; 1
    /// draws them one after another on the engine's thread; 0 means as many
    /// as `threads` with layers on a GPU, else 1.
    pub sampling_threads: usize,
    /// Sequences generated together in one batch (the worker's slots).
    pub max_sequences: u32,
    /// Tokens of KV cache shared by the running sequences (the admission
    /// budget); unset means the model's manifest value.
    pub context_tokens: Option<u32>,
    /// Layers offloaded to the GPU in a CUDA build (0: none; large: all).
    pub gpu_layers: u32,
    /// Milliseconds a streamed token may wait to travel in one chunk with
    /// the tokens after it (a request's first token never waits); 0 sends
    /// every token as its own chunk.
    pub stream_interval_ms: u64,
}

impl Default for TextSettings {
    fn default() -> Self {
        Self {
            threads: 0,
            sampling_threads: 0,
            max_sequences: 16,
            context_tokens: None,
            gpu_layers: 0,
            stream_interval_ms: DEFAULT_STREAM_INTERVAL.as_millis() as u64,
        }
    }
}

/// Loads text models: the entry's first file is the GGUF weights, and
/// `engine.context_tokens` the KV cache unless `[text]` sets it.
pub struct TextFactory;

impl ModelFactory for TextFactory {
    const SETTINGS: Option<&'static str> = Some("text");
    type Settings = TextSettings;
    type Model = TextModel;

    /// The input type's schema, bounded by the entry's context length.
    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Text
    }

    fn load(files: &ModelFiles<'_>, settings: &TextSettings) -> Result<TextModel, String> {
        let file = files
            .entry()
            .files
            .first()
            .ok_or("the manifest entry names no weight file")?;
        let mut options = EngineOptions {
            threads: settings.threads,
            sampling_threads: settings.sampling_threads,
            max_sequences: settings.max_sequences.max(1),
            gpu_layers: settings.gpu_layers,
            stream_interval: Duration::from_millis(settings.stream_interval_ms),
            ..Default::default()
        };
        let from_manifest = files.engine_u64("context_tokens").and_then(|n| u32::try_from(n).ok());
        if let Some(tokens) = settings.context_tokens.or(from_manifest) {
            options.context_tokens = tokens;
        }
        let path = files.path(&file.name);
        let model = TextModel::load(files.id(), &path, options).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(model = files.id(), context = model.context_length(), "text model ready");
        Ok(model)
    }

    /// A text worker runs as many jobs as the engine batches sequences.
    fn slots(settings: &TextSettings) -> Option<u32> {
        Some(settings.max_sequences)
    }
}
