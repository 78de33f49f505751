//! ONNX Runtime for the models that ship as ONNX graphs.
//!
//! The runtime is not linked into the binary: its shared library
//! (`libonnxruntime.so.*`, taken from the `onnxruntime` PyPI wheel and
//! fetched like a weight file) is opened by path with [`init`], once per
//! process, and every [`session`] after that runs on it. ONNX Runtime allows
//! one environment per process, so a second [`init`] with another library is
//! an error rather than a silent switch.
//!
//! ```no_run
//! # fn main() -> Result<(), gantry_onnx::OnnxError> {
//! gantry_onnx::init("models/piper-en-us-joe/libonnxruntime.so.1.32.0".as_ref())?;
//! let session = gantry_onnx::session("models/piper-en-us-joe/en_US-joe-medium.onnx".as_ref(), 1)?;
//! # drop(session);
//! # Ok(())
//! # }
//! ```
//!
//! Tensors are built from a shape and a `Vec` (`Tensor::from_array(([1, n], ids))`);
//! the `ndarray` feature of `ort` is off.
//!
//! **GPUs.** [`session_on`] with [`Device::Cuda`] registers ONNX Runtime's
//! CUDA execution provider for the session. That needs a GPU build of the
//! runtime: the `onnxruntime-gpu` wheel's libraries
//! (`scripts/fetch-onnxruntime-gpu.sh`), named with [`prefer_library`] before
//! the first [`init`], and the CUDA 13 libraries they open where it runs. A
//! provider that cannot be had is an error, never a quiet fall back to the
//! CPU. Nothing CUDA is linked into the binary: the provider is opened by
//! ONNX Runtime itself, so a CPU build of Gantry runs ONNX models on a GPU.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub use ort;
pub use ort::session::Session;
pub use ort::value::Tensor;

/// Why the runtime or a session could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The shared library could not be opened or is not a usable ONNX Runtime.
    #[error("cannot load the ONNX Runtime library {}: {reason}", path.display())]
    Library { path: PathBuf, reason: String },
    /// The runtime of this process was already loaded from another library.
    #[error("ONNX Runtime is already loaded from {} in this process; cannot load {} too", loaded.display(), wanted.display())]
    OtherLibrary { loaded: PathBuf, wanted: PathBuf },
    /// [`session`] was called before [`init`].
    #[error("ONNX Runtime is not loaded (call gantry_onnx::init first)")]
    NotInitialised,
    /// The model file could not be read or is not a valid graph.
    #[error("cannot load the ONNX model {}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },
    /// The device's execution provider could not be registered (a runtime
    /// without it, its CUDA libraries missing, or no such GPU).
    #[error("ONNX Runtime cannot run on {device} (the library {}): {reason}", library.display())]
    Provider {
        device: Device,
        library: PathBuf,
        reason: String,
    },
}

/// Where a session's nodes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    /// ONNX Runtime's CPU provider.
    #[default]
    Cpu,
    /// The CUDA execution provider on this device ordinal.
    Cuda(u32),
}

impl Device {
    /// The device of a `cuda_device` setting: unset is the CPU.
    pub fn from_cuda_device(cuda_device: Option<usize>) -> Self {
        cuda_device.map_or(Self::Cpu, |n| Self::Cuda(u32::try_from(n).unwrap_or(u32::MAX)))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("the CPU"),
            Self::Cuda(n) => write!(f, "CUDA device {n}"),
        }
    }
}

/// The process's runtime: the library it came from and its environment (or
/// why loading failed, so every caller hears the same reason).
struct Runtime {
    library: PathBuf,
    environment: Result<ort::environment::Environment, String>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// Serialises the first load, so two threads never open the library twice.
static LOADING: Mutex<()> = Mutex::new(());
/// The operator's library, which every [`init`] loads instead of the one it
/// names ([`prefer_library`]).
static PREFERRED: OnceLock<PathBuf> = OnceLock::new();

/// Makes every later [`init`] load `library` instead of the library it is
/// given (each ONNX model names the CPU runtime among its files): the
/// `onnxruntime-gpu` wheel's `libonnxruntime.so.*`, for the CUDA provider.
/// Once per process, before the first model loads; a second call with
/// another path, or a call after the runtime loaded from another library, is
/// [`OnnxError::OtherLibrary`].
pub fn prefer_library(library: &Path) -> Result<(), OnnxError> {
    let wanted = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
    let preferred = PREFERRED.get_or_init(|| wanted.clone());
    if *preferred != wanted {
        return Err(OnnxError::OtherLibrary {
            loaded: preferred.clone(),
            wanted,
        });
    }
    if let Some(runtime) = RUNTIME.get()
        && runtime.library != wanted
    {
        return Err(OnnxError::OtherLibrary {
            loaded: runtime.library.clone(),
            wanted,
        });
    }
    Ok(())
}

/// Loads ONNX Runtime from the shared library at `library` (or the one
/// [`prefer_library`] named), once per process.
///
/// Later calls with the same path return at once (with the first call's
/// result); a call with another path is [`OnnxError::OtherLibrary`].
pub fn init(library: &Path) -> Result<(), OnnxError> {
    let library = PREFERRED.get().map_or(library, PathBuf::as_path);
    let wanted = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
    let runtime = match RUNTIME.get() {
        Some(runtime) => runtime,
        None => {
            let _guard = LOADING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            RUNTIME.get_or_init(|| {
                let environment = load(&wanted);
                match &environment {
                    Ok(_) => tracing::info!("ONNX models run on {}", wanted.display()),
                    Err(reason) => tracing::error!(%reason, "ONNX Runtime did not load from {}", wanted.display()),
                }
                Runtime {
                    library: wanted.clone(),
                    environment,
                }
            })
        }
    };
    // Each model keeps its own copy of the library in its directory: a copy
    // of the release already loaded (same file name, same size) is the same
    // runtime.
    if runtime.library != wanted && !same_release(&runtime.library, &wanted) {
        return Err(OnnxError::OtherLibrary {
            loaded: runtime.library.clone(),
            wanted,
        });
    }
    runtime
        .environment
        .as_ref()
        .map(|_| ())
        .map_err(|reason| OnnxError::Library {
            path: runtime.library.clone(),
            reason: reason.clone(),
        })
}

fn same_release(a: &Path, b: &Path) -> bool {
    let size = |p: &Path| std::fs::metadata(p).ok().filter(|m| m.is_file()).map(|m| m.len());
    a.file_name() == b.file_name() && size(a).is_some() && size(a) == size(b)
}

fn load(library: &Path) -> Result<ort::environment::Environment, String> {
    if !library.is_file() {
        return Err("no such file".to_owned());
    }
    ort::init_from(library)
        .map_err(|e| e.to_string())?
        .with_name("gantry")
        .build()
        .map_err(|e| e.to_string())
}

/// The library the runtime was loaded from, once [`init`] succeeded.
pub fn loaded_library() -> Option<&'static Path> {
    RUNTIME
        .get()
        .filter(|runtime| runtime.environment.is_ok())
        .map(|runtime| runtime.library.as_path())
}

/// A session of the graph in `model`, running each node on up to `threads`
/// threads (intra-op; 0 lets ONNX Runtime pick one per core). Graph
/// optimisations are ONNX Runtime's default (all).
///
/// `Session::run` takes `&mut self`: share a session behind a lock, or keep
/// one per concurrent caller.
pub fn session(model: &Path, threads: usize) -> Result<Session, OnnxError> {
    session_on(model, threads, Device::Cpu)
}

/// As [`session`], with the graph's nodes on `device`: for
/// [`Device::Cuda`], the CUDA execution provider is registered first (nodes
/// it lacks run on the CPU provider, as ONNX Runtime places them), and its
/// failure to register is [`OnnxError::Provider`].
pub fn session_on(model: &Path, threads: usize, device: Device) -> Result<Session, OnnxError> {
    let environment = match RUNTIME.get().map(|runtime| &runtime.environment) {
        Some(Ok(environment)) => environment,
        Some(Err(reason)) => {
            return Err(OnnxError::Library {
                path: RUNTIME.get().map(|r| r.library.clone()).unwrap_or_default(),
                reason: reason.clone(),
            });
        }
        None => return Err(OnnxError::NotInitialised),
    };
    let failed = |reason: String| OnnxError::Model {
        path: model.to_path_buf(),
        reason,
    };
    if !model.is_file() {
        return Err(failed("no such file".to_owned()));
    }
    let mut builder = Session::builder(environment)
        .map_err(|e| failed(e.to_string()))?
        .with_intra_threads(threads)
        .map_err(|e| failed(e.to_string()))?;
    if let Device::Cuda(ordinal) = device {
        let library = || RUNTIME.get().map(|r| r.library.clone()).unwrap_or_default();
        // A CPU build of the runtime (the one every ONNX model ships with)
        // lists no CUDA provider: say what to do about it.
        if !<ort::ep::CUDA as ort::ep::ExecutionProvider>::is_available().unwrap_or(false) {
            return Err(OnnxError::Provider {
                device,
                library: library(),
                reason: "this ONNX Runtime build has no CUDA provider; set onnx_library to its GPU build \
                         (scripts/fetch-onnxruntime-gpu.sh prints the path)"
                    .to_owned(),
            });
        }
        let provider = ort::ep::CUDA::default()
            .with_device_id(i32::try_from(ordinal).unwrap_or(i32::MAX))
            .build()
            .error_on_failure();
        builder = builder
            .with_execution_providers([provider])
            .map_err(|e| OnnxError::Provider {
                device,
                library: library(),
                reason: e.to_string(),
            })?;
    }
    builder.commit_from_file(model).map_err(|e| failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_the_same_release_is_the_same_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        for (d, bytes) in [(&a, &b"12345"[..]), (&b, b"54321"), (&c, b"123")] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("libonnxruntime.so.1.32.0"), bytes).unwrap();
        }
        std::fs::write(a.join("libother.so"), b"12345").unwrap();
        let lib = |d: &Path| d.join("libonnxruntime.so.1.32.0");
        assert!(same_release(&lib(&a), &lib(&b)));
        assert!(!same_release(&lib(&a), &lib(&c)), "another size");
        assert!(!same_release(&lib(&a), &a.join("libother.so")), "another name");
        assert!(!same_release(
            &lib(&a),
            &dir.path().join("missing/libonnxruntime.so.1.32.0")
        ));
    }

    #[test]
    fn a_session_needs_the_runtime_and_a_missing_library_is_reported() {
        // One process, one runtime: these run in order in one test.
        let err = session(Path::new("/nonexistent/model.onnx"), 1).unwrap_err();
        assert_eq!(err, OnnxError::NotInitialised);

        let missing = Path::new("/nonexistent/libonnxruntime.so");
        let err = init(missing).unwrap_err();
        assert!(
            matches!(&err, OnnxError::Library { reason, .. } if reason == "no such file"),
            "{err}"
        );
        // The first result sticks; another path is refused.
        assert_eq!(init(missing).unwrap_err(), err);
        let other = init(Path::new("/nonexistent/other.so")).unwrap_err();
        assert!(matches!(other, OnnxError::OtherLibrary { .. }), "{other}");
        assert!(loaded_library().is_none());
    }
}
