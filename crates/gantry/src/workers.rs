//! The workers a process runs in itself: each bundled model's engine, loaded
//! from the models directory, reaching the scheduler over gRPC as remote
//! workers do.
use std::future::Future;
use std::time::Duration;

use gantry_catalog::ModelKind;
use gantry_manifest::{ModelEntry, ModelStatus, ModelStore, Progress};
use gantry_worker_sdk::{Credentials, WorkerConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{Settings, StartError};

pub fn worker_config(url: &str, worker_id: &str, credentials: Credentials, settings: &Settings) -> WorkerConfig {
    let mut config = WorkerConfig::new(url, worker_id, credentials);
    if let Some((name, memory)) = detect_gpu() {
        config.gpu_name = name.clone();
        config.gpu_memory_bytes = *memory;
    }
    config.slots = settings.scheduler.bundled_slots.max(1);
    config.heartbeat_interval = Duration::from_millis(settings.scheduler.heartbeat_interval_ms.max(50));
    config
}

/// The machine's first GPU as the driver names it, with its memory in bytes,
/// from `nvidia-smi` (once per process); `None` without an NVIDIA GPU or
/// driver. Workers report it in their hello: the GPU catalog's availability
/// is made of these reports.
pub fn detect_gpu() -> &'static Option<(String, u64)> {
    static GPU: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    GPU.get_or_init(|| {
        let output = std::process::Command::new("nvidia-smi")
            .args(["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let text = String::from_utf8(output.stdout).ok()?;
        let (name, memory_mib) = text.lines().next()?.split_once(',')?;
        let memory_mib: u64 = memory_mib.trim().parse().ok()?;
        Some((name.trim().to_owned(), memory_mib * 1024 * 1024))
    })
}

/// Workers running in this process; each drains (finishes what runs) on shutdown.
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Default for Workers {
    fn default() -> Self {
        Self::new()
    }
}

impl Workers {
    pub fn new() -> Self {
        Self {
            stop: watch::channel(false).0,
            tasks: Vec::new(),
        }
    }

    /// Starts the worker of `model`: the echo model, or any text model of the
    /// manifest (GGUF weights, loaded here from the models directory).
    pub fn start(&mut self, model: &str, config: WorkerConfig, settings: &Settings) -> Result<(), StartError> {
        let mut stopped = self.stop.subscribe();
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let task = match model {
            gantry_model_echo::MODEL_ID => spawn_runtime(gantry_model_echo::runtime(config), shutdown),
            text if is_text_model(settings, text) => {
                let loaded = load_text_model(settings, text)?;
                spawn_runtime(gantry_model_text::runtime(loaded, config), shutdown)
            }
            sd if is_diffusion_model(settings, sd) => {
                let loaded = load_diffusion_model(settings, sd)?;
                spawn_runtime(gantry_model_diffusion::runtime(loaded, config), shutdown)
            }
            image if is_model_of(settings, image, ModelKind::Image) => {
                let loaded = load_image_model(settings, image)?;
                spawn_runtime(gantry_model_image::runtime(loaded, config), shutdown)
            }
            speech if is_model_of(settings, speech, ModelKind::Speech) => {
                let loaded = load_speech_model(settings, speech)?;
                spawn_runtime(gantry_model_speech::runtime(loaded, config), shutdown)
            }
            video if is_model_of(settings, video, ModelKind::Video) => {
                let loaded = load_video_model(settings, video)?;
                spawn_runtime(gantry_model_video::runtime(loaded, config), shutdown)
            }
            embed if is_model_of(settings, embed, ModelKind::Embedding) => {
                let loaded = load_embedding_model(settings, embed)?;
                spawn_runtime(gantry_model_embed::runtime(loaded, config), shutdown)
            }
            heard if is_model_of(settings, heard, ModelKind::Transcription) => {
                let loaded = load_transcription_model(settings, heard)?;
                spawn_runtime(gantry_model_transcribe::runtime(loaded, config), shutdown)
            }
            other => {
                let servable: Vec<String> = std::iter::once(gantry_model_echo::MODEL_ID.to_string())
                    .chain(
                        settings
                            .manifest()
                            .models()
                            .iter()
                            .filter(|m| m.category != ModelKind::Diagnostic)
                            .map(|m| m.id.clone()),
                    )
                    .collect();
                return Err(StartError::Config(format!(
                    "no worker for model '{other}' is built into this binary (available: {})",
                    servable.join(", ")
                )));
            }
        };
        self.tasks.push(task);
        Ok(())
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

fn spawn_runtime<M: gantry_worker_sdk::Model>(
    runtime: gantry_worker_sdk::WorkerRuntime<M>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(err) = runtime.run_until(shutdown).await {
            tracing::error!(error = %err, "worker stopped");
        }
    })
}

/// Whether `model` is a text model of the manifest (served by the text engine).
pub fn is_text_model(settings: &Settings, model: &str) -> bool {
    is_model_of(settings, model, ModelKind::Text)
}

/// The manifest entry of `model` and the store its weights are in, once every
/// file is there (else the error names them and the command that fetches them).
fn ready_model(settings: &Settings, model: &str) -> Result<(&'static ModelEntry, ModelStore), StartError> {
    let entry = settings
        .manifest()
        .get(model)
        .ok_or_else(|| StartError::Config(format!("model '{model}' is not in the manifest")))?;
    let store = ModelStore::new(settings.models_dir());
    if let ModelStatus::Missing(files) = store.status(entry) {
        return Err(StartError::Config(format!(
            "the weights of '{model}' are missing ({}) in {}; fetch them with `gantry models pull {model}`",
            files.join(", "),
            settings.models_dir().display()
        )));
    }
    Ok((entry, store))
}

/// Whether `model` is in the manifest with category `kind`.
fn is_model_of(settings: &Settings, model: &str, kind: ModelKind) -> bool {
    settings
        .manifest()
        .get(model)
        .is_some_and(|entry| entry.category == kind)
}

/// Whether `model` is an image model on the Stable Diffusion pipeline
/// (`engine.architecture = "stable-diffusion"`).
fn is_diffusion_model(settings: &Settings, model: &str) -> bool {
    settings.manifest().get(model).is_some_and(|entry| {
        entry.category == ModelKind::Image
            && entry.engine.get("architecture").and_then(serde_json::Value::as_str) == Some("stable-diffusion")
    })
}

/// Loads a Stable Diffusion model from its diffusers-layout directory in
/// the models directory; `engine.variant` says which family it is.
fn load_diffusion_model(
    settings: &Settings,
    model: &str,
) -> Result<gantry_model_diffusion::DiffusionModel, StartError> {
    let (entry, store) = ready_model(settings, model)?;
    let variant = entry
        .engine
        .get("variant")
        .and_then(serde_json::Value::as_str)
        .and_then(gantry_model_diffusion::Variant::parse)
        .ok_or_else(|| {
            StartError::Config(format!(
                "model '{model}': engine.variant must be sd-1.5, sd-turbo or sdxl"
            ))
        })?;
    let options = gantry_model_diffusion::LoadOptions {
        cuda_device: settings.diffusion.cuda_device,
        half: settings.diffusion.half,
        architecture: None,
    };
    let dir = store.model_dir(model);
    let started = std::time::Instant::now();
    let loaded = gantry_model_diffusion::DiffusionModel::load(model, &dir, variant, options)
        .map_err(|e| StartError::Config(format!("cannot load '{model}': {e}")))?;
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, variant = variant.name(), "diffusion model loaded");
    Ok(loaded)
}

/// Loads an image model (a GAN generator) from the models directory: the
/// safetensors its pull converted from the published checkpoint.
fn load_image_model(settings: &Settings, model: &str) -> Result<gantry_model_image::ImageModel, StartError> {
    let (entry, store) = ready_model(settings, model)?;
    let started = std::time::Instant::now();
    let loaded = if entry.engine.get("architecture").and_then(serde_json::Value::as_str) == Some("consistency-onnx") {
        let file = |what: &str, matches: fn(&str) -> bool| {
            entry
                .files
                .iter()
                .find(|f| matches(&f.name))
                .map(|f| store.file_path(model, &f.name))
                .ok_or_else(|| StartError::Config(format!("model '{model}' names no {what} file")))
        };
        let graph = file(".onnx", |name| name.ends_with(".onnx"))?;
        let library = file("libonnxruntime.so", |name| name.starts_with("libonnxruntime.so"))?;
        let spec = gantry_model_image::TerrainSpec::from_engine(&entry.engine)
            .map_err(|e| StartError::Config(format!("model '{model}': {e}")))?;
        gantry_model_image::ImageModel::load_terrain(model, &library, &graph, 0, spec)
            .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", graph.display())))?
    } else {
        let file = entry
            .files
            .first()
            .ok_or_else(|| StartError::Config(format!("model '{model}' names no weight file")))?;
        let name = file.converted_name().unwrap_or_else(|| file.name.clone());
        let path = store.file_path(model, &name);
        let spec = gantry_model_image::GanSpec::from_engine(&entry.engine)
            .map_err(|e| StartError::Config(format!("model '{model}': {e}")))?;
        gantry_model_image::ImageModel::load(model, &path, spec)
            .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", path.display())))?
    };
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, side = loaded.native_side(), "image model loaded");
    Ok(loaded)
}

/// Loads a video model: RIFE from the safetensors its pull converted from
/// `flownet.pkl`, and for a latent walk the GAN's converted checkpoint.
fn load_video_model(settings: &Settings, model: &str) -> Result<gantry_model_video::VideoModel, StartError> {
    let (entry, store) = ready_model(settings, model)?;
    let converted = |stem: &str| {
        entry
            .files
            .iter()
            .find(|f| f.name.starts_with(stem))
            .map(|f| store.file_path(model, &f.converted_name().unwrap_or_else(|| f.name.clone())))
            .ok_or_else(|| StartError::Config(format!("model '{model}' names no {stem} file")))
    };
    let config = |e: String| StartError::Config(format!("model '{model}': {e}"));
    let rife = converted("flownet")?;
    let threads = settings
        .video
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));
    let options = gantry_model_video::Options {
        threads,
        block_seconds: u64::try_from(entry.price.per()).unwrap_or(1),
        fetch_allow_ranges: settings.video.fetch_allow_ranges.clone(),
        own_files: own_files(settings),
    };
    let started = std::time::Instant::now();
    let loaded = match entry.engine.get("keyframes").and_then(serde_json::Value::as_str) {
        Some("dcgan") => {
            let prefix = entry
                .engine
                .get("tensor_prefix")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| config("its engine table names no tensor_prefix".into()))?;
            let latent = entry
                .engine
                .get("latent")
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| config("its engine table names no latent size".into()))?;
            let generator = entry
                .files
                .iter()
                .find(|f| !f.name.starts_with("flownet"))
                .map(|f| store.file_path(model, &f.converted_name().unwrap_or_else(|| f.name.clone())))
                .ok_or_else(|| config("it names no generator file".into()))?;
            gantry_model_video::VideoModel::load_faces(model, &rife, &generator, prefix, latent as usize, &options)
        }
        Some("images") => gantry_model_video::VideoModel::load_interpolate(model, &rife, &options),
        other => return Err(config(format!("unknown keyframes source {other:?} (dcgan or images)"))),
    }
    .map_err(|e| StartError::Config(format!("cannot load '{model}': {e}")))?;
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, threads, "video model loaded");
    Ok(loaded)
}

/// Loads a speech model from the models directory, run on the ONNX Runtime
/// library that is one of its files: a Piper voice (its `.onnx` graph and
/// `.onnx.json` config), or, with `engine.architecture = "hibari"`, the
/// hibari voice `engine.voice` (its graph, G2P files and registry side by side).
fn load_speech_model(settings: &Settings, model: &str) -> Result<gantry_model_speech::SpeechModel, StartError> {
    let (entry, store) = ready_model(settings, model)?;
    let file = |what: &str, matches: fn(&str) -> bool| {
        entry
            .files
            .iter()
            .find(|f| matches(&f.name))
            .map(|f| store.file_path(model, &f.name))
            .ok_or_else(|| StartError::Config(format!("model '{model}' names no {what} file")))
    };
    let library = file("libonnxruntime.so", |name| name.starts_with("libonnxruntime.so"))?;
    let options = gantry_model_speech::SpeechOptions {
        threads: settings.speech.threads,
        sessions: settings.speech.sessions.max(1),
    };
    let started = std::time::Instant::now();
    let engine = |key: &str| entry.engine.get(key).and_then(serde_json::Value::as_str);
    let mut loaded = if engine("architecture") == Some("hibari") {
        let voice = engine("voice")
            .ok_or_else(|| StartError::Config(format!("model '{model}': engine.voice names no hibari voice")))?;
        let dir = library
            .parent()
            .ok_or_else(|| StartError::Config(format!("model '{model}': no directory for its files")))?;
        gantry_model_speech::SpeechModel::load_hibari(model, &library, dir, voice, options)
            .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", dir.display())))?
    } else {
        let graph = file(".onnx", |name| name.ends_with(".onnx"))?;
        let config = file(".onnx.json", |name| name.ends_with(".onnx.json"))?;
        gantry_model_speech::SpeechModel::load(model, &library, &graph, &config, options)
            .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", graph.display())))?
    };
    // A speaker encoder among the files enables voice matching (`reference_audio`).
    if let Some(encoder) = entry.files.iter().find(|f| f.name == "pretrained.pt") {
        let path = store.file_path(model, &encoder.converted_name().unwrap_or_else(|| encoder.name.clone()));
        loaded = loaded
            .with_voice_matching(&path, &settings.speech.fetch_allow_ranges, own_files(settings))
            .map_err(|e| StartError::Config(format!("cannot load the speaker encoder of '{model}': {e}")))?;
    }
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, voice = loaded.voice(), "speech model loaded");
    Ok(loaded)
}

/// The platform's file store, for models that read the URLs of files other
/// jobs made from it rather than over HTTP (a loopback address in the
/// embedded default, which fetches refuse). `None` (with a warning) when it
/// cannot be opened: such URLs are then fetched like any other.
fn own_files(settings: &Settings) -> Option<std::sync::Arc<dyn gantry_net::OwnFiles>> {
    match settings.open_files() {
        Ok(files) => Some(std::sync::Arc::new(files)),
        Err(error) => {
            tracing::warn!(%error, "the file store cannot be opened: the platform's own file URLs are fetched over HTTP");
            None
        }
    }
}

/// Loads a speech-to-text model (Whisper) from the models directory: the
/// CTranslate2 `model.bin`, its `tokenizer.json` and `config.json`, side by side.
fn load_transcription_model(
    settings: &Settings,
    model: &str,
) -> Result<gantry_model_transcribe::TranscriptionModel, StartError> {
    let (_, store) = ready_model(settings, model)?;
    let weights = store.file_path(model, "model.bin");
    let dir = weights
        .parent()
        .ok_or_else(|| StartError::Config(format!("model '{model}': no directory for {}", weights.display())))?;
    let options = gantry_model_transcribe::Options {
        threads: settings.transcription.threads.unwrap_or(0),
        fetch_allow_ranges: settings.transcription.fetch_allow_ranges.clone(),
        own_files: own_files(settings),
    };
    let started = std::time::Instant::now();
    let loaded = gantry_model_transcribe::TranscriptionModel::load(model, dir, &options)
        .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", dir.display())))?;
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, "transcription model loaded");
    Ok(loaded)
}

/// Loads a sentence-embedding model from the models directory: the
/// sentence-transformers files side by side (`model.safetensors`, …).
fn load_embedding_model(settings: &Settings, model: &str) -> Result<gantry_model_embed::EmbeddingModel, StartError> {
    let (_, store) = ready_model(settings, model)?;
    let weights = store.file_path(model, "model.safetensors");
    let dir = weights
        .parent()
        .ok_or_else(|| StartError::Config(format!("model '{model}': no directory for {}", weights.display())))?;
    let options = gantry_model_embed::Options {
        max_batch: settings.embedding.max_batch.max(1),
        cuda_device: settings.embedding.cuda_device,
    };
    let started = std::time::Instant::now();
    let loaded = gantry_model_embed::EmbeddingModel::load(model, dir, &options)
        .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", dir.display())))?;
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, "embedding model loaded");
    Ok(loaded)
}

/// Loads a text model's weights from the models directory.
fn load_text_model(settings: &Settings, model: &str) -> Result<gantry_model_text::TextModel, StartError> {
    let (entry, store) = ready_model(settings, model)?;
    let file = entry
        .files
        .first()
        .ok_or_else(|| StartError::Config(format!("model '{model}' names no weight file")))?;
    let mut options = gantry_model_text::EngineOptions {
        threads: settings.text.threads,
        max_sequences: settings.text.max_sequences.max(1),
        gpu_layers: settings.text.gpu_layers,
        stream_interval: std::time::Duration::from_millis(settings.text.stream_interval_ms),
        ..Default::default()
    };
    let from_manifest = entry
        .engine
        .get("context_tokens")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    if let Some(tokens) = settings.text.context_tokens.or(from_manifest) {
        options.context_tokens = tokens;
    }
    let path = store.file_path(model, &file.name);
    let started = std::time::Instant::now();
    let loaded = gantry_model_text::TextModel::load(model, &path, options)
        .map_err(|e| StartError::Config(format!("cannot load '{model}' from {}: {e}", path.display())))?;
    tracing::info!(%model, ms = started.elapsed().as_millis() as u64, context = loaded.context_length(), "text model loaded");
    Ok(loaded)
}

/// Whether `model`'s weights are present, fetching them first when
/// `pull_on_start` allows. False (with the reason logged) when they are not.
pub async fn ensure_weights(settings: &Settings, model: &str) -> bool {
    let manifest = settings.manifest();
    let Some(entry) = manifest.get(model).filter(|entry| !entry.files.is_empty()) else {
        return true;
    };
    let store = ModelStore::new(settings.models_dir());
    let ModelStatus::Missing(files) = store.status(entry) else {
        return true;
    };
    let dir = settings.models_dir();
    if !settings.pull_on_start {
        tracing::warn!(%model, missing = %files.join(", "), "not serving {model}: its weights are missing in {}; fetch them with `gantry models pull {model}`", dir.display());
        return false;
    }
    tracing::info!(%model, "fetching the weights of {model} into {}", dir.display());
    let entry = entry.clone();
    let pulled = tokio::task::spawn_blocking(move || store.pull(&entry, &Progress::new(true))).await;
    match pulled {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::error!(%model, "not serving {model}: its weights could not be fetched ({error}); fetch them with `gantry models pull {model}`");
            false
        }
        Err(error) => {
            tracing::error!(%model, %error, "not serving {model}: fetching its weights failed");
            false
        }
    }
}
