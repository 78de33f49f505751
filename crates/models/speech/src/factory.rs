//! The speech models' side of the plug-in boundary: every manifest entry of
//! category `speech` (a Piper voice, or a hibari voice), and the `[speech]`
//! settings table.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{SpeechModel, SpeechOptions};

/// The speech engine (ONNX Runtime), per loaded voice: `[speech]` in the
/// configuration file, `GANTRY_SPEECH__…` in the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpeechSettings {
    /// Intra-op threads of each ONNX Runtime session; 0 means one per core.
    pub threads: usize,
    /// Sessions of a voice that synthesise at once; more jobs take turns,
    /// sentence by sentence.
    pub sessions: usize,
    /// Address ranges (CIDR) that `reference_audio` URLs may reach although
    /// they are loopback, private or reserved addresses.
    pub fetch_allow_ranges: Vec<String>,
    /// CUDA device ordinal the voices' graphs run on (ONNX Runtime's CUDA
    /// provider; needs `onnx_library` to name a GPU build of the runtime);
    /// unset means the CPU.
    pub cuda_device: Option<usize>,
}

impl Default for SpeechSettings {
    fn default() -> Self {
        let options = SpeechOptions::default();
        Self {
            threads: options.threads,
            sessions: options.sessions,
            fetch_allow_ranges: Vec::new(),
            cuda_device: None,
        }
    }
}

/// Loads a voice on the ONNX Runtime library that is one of its files: a
/// Piper voice (its `.onnx` graph and `.onnx.json` config), or with
/// `engine.architecture = "hibari"` the hibari voice `engine.voice` (its
/// graph, G2P files and registry side by side). A speaker encoder among the
/// files (`pretrained.pt`) enables voice matching (`reference_audio`).
pub struct SpeechFactory;

impl ModelFactory for SpeechFactory {
    const SETTINGS: Option<&'static str> = Some("speech");
    type Settings = SpeechSettings;
    type Model = SpeechModel;

    /// The input type's schema with the entry's voice, sample rate and
    /// voice matching filled in ([`crate::input::schema`]).
    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Speech
    }

    fn load(files: &ModelFiles<'_>, settings: &SpeechSettings) -> Result<SpeechModel, String> {
        let library = files.find("libonnxruntime.so", |name| name.starts_with("libonnxruntime.so"))?;
        let options = SpeechOptions {
            threads: settings.threads,
            sessions: settings.sessions.max(1),
            device: gantry_onnx::Device::from_cuda_device(settings.cuda_device),
        };
        let mut model = if files.engine_str("architecture") == Some("hibari") {
            let voice = files.engine_str("voice").ok_or("engine.voice names no hibari voice")?;
            let dir = files.dir();
            SpeechModel::load_hibari(files.id(), &library, &dir, voice, options)
                .map_err(|e| format!("{}: {e}", dir.display()))?
        } else {
            let graph = files.find(".onnx", |name| name.ends_with(".onnx"))?;
            let config = files.find(".onnx.json", |name| name.ends_with(".onnx.json"))?;
            SpeechModel::load(files.id(), &library, &graph, &config, options)
                .map_err(|e| format!("{}: {e}", graph.display()))?
        };
        if let Ok(encoder) = files.find("speaker encoder", |name| name == "pretrained.pt") {
            model = model
                .with_voice_matching(&encoder, &settings.fetch_allow_ranges, files.own_files())
                .map_err(|e| format!("the speaker encoder: {e}"))?;
        }
        tracing::info!(model = files.id(), voice = model.voice(), "speech model ready");
        Ok(model)
    }
}
