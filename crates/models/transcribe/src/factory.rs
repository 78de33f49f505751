//! The speech-to-text models' side of the plug-in boundary: every manifest
//! entry of category `transcription`, and the `[transcription]` settings.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{Options, TranscriptionModel};

/// Threads per job and where audio URLs may go: `[transcription]` in the
/// configuration file, `GANTRY_TRANSCRIPTION__…` in the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TranscriptionSettings {
    /// Threads one transcription uses (the encoder's matrix products); unset
    /// or 0 means one per core.
    pub threads: Option<usize>,
    /// Address ranges (CIDR) that `audio_url` may reach although they are
    /// loopback, private or reserved addresses.
    pub fetch_allow_ranges: Vec<String>,
    /// CUDA device ordinal Whisper runs on, with candle's CUDA backend (a
    /// binary built with the `cuda` feature). Unset means the CPU, on this
    /// crate's kernels.
    pub cuda_device: Option<usize>,
}

/// Loads Whisper: the CTranslate2 `model.bin`, its `tokenizer.json` and
/// `config.json`, side by side.
pub struct TranscriptionFactory;

impl ModelFactory for TranscriptionFactory {
    const SETTINGS: Option<&'static str> = Some("transcription");
    type Settings = TranscriptionSettings;
    type Model = TranscriptionModel;

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Transcription
    }

    fn load(files: &ModelFiles<'_>, settings: &TranscriptionSettings) -> Result<TranscriptionModel, String> {
        let dir = files.dir();
        let backend = crate::engine::Backend::for_cuda_device(settings.cuda_device).map_err(|e| e.to_string())?;
        let options = Options {
            threads: settings.threads.unwrap_or(0),
            fetch_allow_ranges: settings.fetch_allow_ranges.clone(),
            own_files: files.own_files(),
            backend,
        };
        TranscriptionModel::load(files.id(), &dir, &options).map_err(|e| format!("{}: {e}", dir.display()))
    }

    fn input_schema(_entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema()
    }
}
