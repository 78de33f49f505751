//! The workers a process runs in itself: each bundled model's engine, loaded
//! from the models directory, reaching the scheduler over gRPC as remote
//! workers do.
use std::sync::LazyLock;
use std::time::Duration;

use gantry_manifest::{Manifest, ModelEntry, ModelStatus, ModelStore, Progress};
use gantry_worker_sdk::{Credentials, Family, ModelFiles, WorkerConfig, family};
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

/// The model families this binary serves: one line per model crate. A
/// manifest entry is served by the first family that accepts it (each
/// accepts entries of its own, `families_take_every_entry_once` checks).
pub fn families() -> &'static [Box<dyn Family>] {
    static FAMILIES: LazyLock<Vec<Box<dyn Family>>> = LazyLock::new(|| {
        vec![
            family::<gantry_model_echo::EchoFactory>(),
            family::<gantry_model_text::TextFactory>(),
            family::<gantry_model_diffusion::DiffusionFactory>(),
            family::<gantry_model_image::ImageFactory>(),
            family::<gantry_model_speech::SpeechFactory>(),
            family::<gantry_model_video::VideoFactory>(),
            family::<gantry_model_embed::EmbeddingFactory>(),
            family::<gantry_model_transcribe::TranscriptionFactory>(),
        ]
    });
    &FAMILIES
}

/// `manifest` with each entry's input schema filled in by the family that
/// serves it, where the entry states none; made once per manifest.
pub fn described(manifest: &'static Manifest) -> &'static Manifest {
    type Made = std::collections::HashMap<usize, &'static Manifest>;
    static MADE: std::sync::Mutex<Option<Made>> = std::sync::Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // The manifests are `'static` and never freed: the address names one.
    let key = std::ptr::from_ref(manifest) as usize;
    made.get_or_insert_with(Made::new).entry(key).or_insert_with(|| {
        Box::leak(Box::new(manifest.with_input_schemas(|entry| {
            family_of(entry).map(|family| family.input_schema(entry))
        })))
    })
}

/// The family that serves `entry`, if this binary has one.
pub fn family_of(entry: &ModelEntry) -> Option<&'static dyn Family> {
    families().iter().find(|f| f.accepts(entry)).map(|f| &**f)
}

/// Jobs one worker of `model` runs at once where its family's settings
/// decide it (a text model's `text.max_sequences`); `None` otherwise.
pub fn model_slots(settings: &Settings, model: &str) -> Option<u32> {
    let entry = settings.manifest().get(model)?;
    let family = family_of(entry)?;
    family.slots(settings.engine(family)).ok().flatten()
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

    /// Loads `model` (an entry of the manifest whose family is built into
    /// this binary, with every file present) and starts its worker.
    /// [`StartError::Config`] when there is no such model or its files are
    /// missing; [`StartError::Load`] when it does not load.
    pub fn start(&mut self, model: &str, config: WorkerConfig, settings: &Settings) -> Result<(), StartError> {
        let manifest = settings.manifest();
        let Some((entry, family)) = manifest.get(model).and_then(|e| Some((e, family_of(e)?))) else {
            let servable: Vec<&str> = manifest
                .models()
                .iter()
                .filter(|entry| family_of(entry).is_some())
                .map(|entry| entry.id.as_str())
                .collect();
            return Err(StartError::Config(format!(
                "no worker for model '{model}' is built into this binary (available: {})",
                servable.join(", ")
            )));
        };
        if let Some(library) = &settings.onnx_library {
            gantry_onnx::prefer_library(library).map_err(|e| StartError::Config(format!("onnx_library: {e}")))?;
        }
        let store = ready_model(settings, entry)?;
        let own = || own_files(settings);
        let files = ModelFiles::new(entry, &store, &own);
        let mut stopped = self.stop.subscribe();
        let shutdown = Box::pin(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        let task = family
            .start(&files, settings.engine(family), config, shutdown)
            .map_err(|e| StartError::Load(format!("cannot load '{model}': {e}")))?;
        self.tasks.push(task);
        Ok(())
    }

    /// Drains every worker and waits until each has unloaded its model: a
    /// model's engine frees what it holds (a text model its llama.cpp
    /// context, then its weights, then llama.cpp's backend after the last
    /// one) before this returns, so nothing of it is left for the process's
    /// exit to tear down.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let count = self.tasks.len();
        for task in self.tasks {
            let _ = task.await;
        }
        if count > 0 {
            tracing::info!(workers = count, "workers stopped; their models are unloaded");
        }
    }
}

/// The store `entry`'s weights are in, once every file is there (else the
/// error names them and the command that fetches them).
fn ready_model(settings: &Settings, entry: &ModelEntry) -> Result<ModelStore, StartError> {
    let store = ModelStore::new(settings.models_dir());
    if let ModelStatus::Missing(files) = store.status(entry) {
        let model = &entry.id;
        return Err(StartError::Config(format!(
            "the weights of '{model}' are missing ({}) in {}; fetch them with `gantry models pull {model}`",
            files.join(", "),
            settings.models_dir().display()
        )));
    }
    Ok(store)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_take_every_entry_once() {
        for entry in gantry_manifest::Manifest::builtin().models() {
            let takers: Vec<&str> = families()
                .iter()
                .filter(|f| f.accepts(entry))
                .map(|f| f.name())
                .collect();
            assert_eq!(takers.len(), 1, "{} is taken by {takers:?}", entry.id);
        }
        // An operator's Stable Diffusion entry goes to diffusion, not to the GAN crate.
        let mut sd = gantry_manifest::Manifest::builtin()
            .get("dcgan-faces-64")
            .unwrap()
            .clone();
        sd.engine.insert("architecture".into(), "stable-diffusion".into());
        assert_eq!(family_of(&sd).map(|f| f.name()), Some("DiffusionModel"));
    }

    /// What `GET /v2/models`, the public OpenAPI document and the console
    /// show: each built-in model's input schema, made by its family from
    /// the family's input type, a standalone JSON Schema of an object.
    #[test]
    fn every_builtin_model_has_its_familys_input_schema() {
        let builtin = gantry_manifest::Manifest::builtin();
        let described = described(builtin);
        assert!(std::ptr::eq(described, super::described(builtin)), "made once");
        for entry in described.models() {
            let schema = &entry.input_schema;
            assert_eq!(schema["type"], "object", "{}: {schema}", entry.id);
            assert!(schema["properties"].is_object(), "{}: {schema}", entry.id);
            assert!(!schema.to_string().contains("\"$ref\":"), "{}: {schema}", entry.id);
            let family = family_of(entry).unwrap();
            assert_eq!(schema, &family.input_schema(entry), "{}", entry.id);
        }
    }

    #[test]
    fn each_family_reads_its_own_table_from_the_file_and_refuses_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gantry.toml");
        std::fs::write(&path, "[text]\nmax_sequences = 4\n\n[video]\nthreads = 2\n").unwrap();
        let settings = Settings::load(Some(&path)).unwrap();
        assert_eq!(model_slots(&settings, "smollm2-135m-instruct"), Some(4));
        // Fields the file leaves out keep the crate's defaults.
        assert_eq!(settings.engines["text"]["stream_interval_ms"], 50);
        assert_eq!(settings.engines["video"]["threads"], 2);
        // Families without a slot rule leave the process's number.
        assert_eq!(model_slots(&settings, "gantry-echo"), None);
        assert_eq!(Settings::default().engines["text"]["max_sequences"], 16);

        std::fs::write(&path, "[speech]\nthreads = \"many\"\n").unwrap();
        let error = Settings::load(Some(&path)).unwrap_err().to_string();
        assert!(error.contains("[speech]") && error.contains("invalid type"), "{error}");
    }
}
