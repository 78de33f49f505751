//! How a model crate plugs into the `gantry` binary.
//!
//! A model crate implements [`ModelFactory`]: which entries of the model
//! manifest it serves, the settings table its engine reads (its own type,
//! with its own defaults), and how it loads a model from the entry's files.
//! The binary lists one [`Family`] per model crate ([`family`]) and does the
//! rest from there: the settings table is read from the configuration file
//! and the environment with everything else, checked when the process
//! starts, and handed to the factory; the loaded model runs on a
//! [`WorkerRuntime`] until the process shuts down.
//!
//! ```no_run
//! use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles};
//! # use gantry_worker_sdk::{JobContext, JobError, Model, Output};
//! # struct Upper;
//! # impl Model for Upper {
//! #     fn id(&self) -> &str { "upper" }
//! #     async fn run(&self, _: serde_json::Value, _: JobContext) -> Result<Output, JobError> { unimplemented!() }
//! # }
//! # impl Upper { fn load(_: &std::path::Path, _: bool) -> Result<Self, String> { Ok(Upper) } }
//!
//! #[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
//! #[serde(default)]
//! struct UpperSettings {
//!     shout: bool,
//! }
//!
//! struct UpperFactory;
//!
//! impl ModelFactory for UpperFactory {
//!     const SETTINGS: Option<&'static str> = Some("upper");
//!     type Settings = UpperSettings;
//!     type Model = Upper;
//!
//!     fn accepts(entry: &ModelEntry) -> bool {
//!         entry.engine.get("architecture").and_then(|a| a.as_str()) == Some("upper")
//!     }
//!
//!     fn load(files: &ModelFiles<'_>, settings: &UpperSettings) -> Result<Upper, String> {
//!         Upper::load(&files.find("weights", |name| name.ends_with(".bin"))?, settings.shout)
//!     }
//!
//!     fn input_schema(_entry: &ModelEntry) -> serde_json::Value {
//!         serde_json::json!({"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
//!     }
//! }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

pub use gantry_manifest::{ModelEntry, ModelKind, ModelStore, WeightFile};
pub use gantry_net::OwnFiles;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::{Model, WorkerConfig, WorkerRuntime};

/// What a worker started by a [`Family`] waits on before it drains.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A model crate's side of the plug-in boundary (see the [module](self)).
pub trait ModelFactory: Send + Sync + 'static {
    /// The name of the settings table this family reads: `[text]` in the
    /// configuration file and `GANTRY_TEXT__…` in the environment for
    /// `Some("text")`. `None` for a family without settings.
    const SETTINGS: Option<&'static str>;
    /// The settings table. Every field should have a default
    /// (`#[serde(default)]`): an operator sets only what they change.
    type Settings: Serialize + DeserializeOwned + Default;
    /// The loaded model.
    type Model: Model;

    /// Whether this family serves the manifest entry. Every entry is served
    /// by at most one family of a binary.
    fn accepts(entry: &ModelEntry) -> bool;

    /// Loads the model from its files, which are all present and verified.
    /// The error says what is wrong (a missing engine key, an unreadable
    /// file and its path); the binary prefixes the model's id.
    fn load(files: &ModelFiles<'_>, settings: &Self::Settings) -> Result<Self::Model, String>;

    /// Jobs one worker runs at once, where the settings decide it (a text
    /// engine's batch, for example); `None` leaves the process's own number.
    fn slots(_settings: &Self::Settings) -> Option<u32> {
        None
    }

    /// The JSON Schema of a job's input for `entry`: the schema of the
    /// crate's input type (`gantry_input::schema_of`), with what the entry
    /// decides filled in (its voices, its context). The API serves it as the
    /// model's `inputSchema` and in the public OpenAPI document, and the
    /// console draws its form from it; an entry that states its own
    /// `input_schema` keeps that one.
    fn input_schema(entry: &ModelEntry) -> Value;
}

/// A model family as the binary holds it: a [`ModelFactory`] behind a
/// pointer, with its settings table as JSON. Made by [`family`].
pub trait Family: Send + Sync {
    /// The crate's name for the family, for messages (its `Model` type's name).
    fn name(&self) -> &'static str;
    /// [`ModelFactory::SETTINGS`].
    fn settings_table(&self) -> Option<&'static str>;
    /// The settings table's defaults, as JSON (`null` without a table).
    fn default_settings(&self) -> Value;
    /// Whether `table` (absent: the defaults) is a valid settings table; the
    /// error names the field at fault.
    fn check_settings(&self, table: Option<&Value>) -> Result<(), String>;
    /// [`ModelFactory::accepts`].
    fn accepts(&self, entry: &ModelEntry) -> bool;
    /// [`ModelFactory::slots`] for `table`.
    fn slots(&self, table: Option<&Value>) -> Result<Option<u32>, String>;
    /// [`ModelFactory::input_schema`].
    fn input_schema(&self, entry: &ModelEntry) -> Value;
    /// Loads the model (on the calling thread) and runs it as a worker with
    /// `config` on the current Tokio runtime until `shutdown`.
    fn start(
        &self,
        files: &ModelFiles<'_>,
        table: Option<&Value>,
        config: WorkerConfig,
        shutdown: Shutdown,
    ) -> Result<JoinHandle<()>, String>;
}

/// The [`Family`] of factory `F`.
pub fn family<F: ModelFactory>() -> Box<dyn Family> {
    Box::new(Plugin::<F>(PhantomData))
}

struct Plugin<F>(PhantomData<fn() -> F>);

impl<F: ModelFactory> Plugin<F> {
    fn settings(table: Option<&Value>) -> Result<F::Settings, String> {
        match (F::SETTINGS, table) {
            (Some(name), Some(table)) => {
                serde_json::from_value(table.clone()).map_err(|e| format!("the settings table [{name}]: {e}"))
            }
            _ => Ok(F::Settings::default()),
        }
    }
}

impl<F: ModelFactory> Family for Plugin<F> {
    fn name(&self) -> &'static str {
        let full = std::any::type_name::<F::Model>();
        full.rsplit("::").next().unwrap_or(full)
    }

    fn settings_table(&self) -> Option<&'static str> {
        F::SETTINGS
    }

    fn default_settings(&self) -> Value {
        match F::SETTINGS {
            Some(_) => serde_json::to_value(F::Settings::default()).unwrap_or(Value::Null),
            None => Value::Null,
        }
    }

    fn check_settings(&self, table: Option<&Value>) -> Result<(), String> {
        Self::settings(table).map(drop)
    }

    fn accepts(&self, entry: &ModelEntry) -> bool {
        F::accepts(entry)
    }

    fn slots(&self, table: Option<&Value>) -> Result<Option<u32>, String> {
        Ok(F::slots(&Self::settings(table)?).map(|n| n.max(1)))
    }

    fn input_schema(&self, entry: &ModelEntry) -> Value {
        F::input_schema(entry)
    }

    fn start(
        &self,
        files: &ModelFiles<'_>,
        table: Option<&Value>,
        config: WorkerConfig,
        shutdown: Shutdown,
    ) -> Result<JoinHandle<()>, String> {
        let settings = Self::settings(table)?;
        let started = std::time::Instant::now();
        let model = F::load(files, &settings)?;
        tracing::info!(
            model = files.id(),
            family = self.name(),
            ms = started.elapsed().as_millis() as u64,
            "model loaded"
        );
        let runtime = WorkerRuntime::new(model, config);
        Ok(tokio::spawn(async move {
            if let Err(err) = runtime.run_until(shutdown).await {
                tracing::error!(error = %err, "worker stopped");
            }
        }))
    }
}

/// Where a model's files are, with its manifest entry: what
/// [`ModelFactory::load`] reads.
pub struct ModelFiles<'a> {
    entry: &'a ModelEntry,
    store: &'a ModelStore,
    own_files: &'a (dyn Fn() -> Option<Arc<dyn OwnFiles>> + Sync),
}

impl<'a> ModelFiles<'a> {
    /// The files of `entry` in `store`. `own_files` opens the platform's
    /// file store for models that read the URLs of files other jobs made
    /// ([`ModelFiles::own_files`]); it is called only when a model asks.
    pub fn new(
        entry: &'a ModelEntry,
        store: &'a ModelStore,
        own_files: &'a (dyn Fn() -> Option<Arc<dyn OwnFiles>> + Sync),
    ) -> Self {
        Self {
            entry,
            store,
            own_files,
        }
    }

    /// The model's id.
    pub fn id(&self) -> &'a str {
        &self.entry.id
    }

    /// The model's manifest entry.
    pub fn entry(&self) -> &'a ModelEntry {
        self.entry
    }

    /// The string at `key` of the entry's `engine` table.
    pub fn engine_str(&self, key: &str) -> Option<&'a str> {
        self.entry.engine.get(key).and_then(Value::as_str)
    }

    /// The unsigned integer at `key` of the entry's `engine` table.
    pub fn engine_u64(&self, key: &str) -> Option<u64> {
        self.entry.engine.get(key).and_then(Value::as_u64)
    }

    /// The directory the model's files are in.
    pub fn dir(&self) -> PathBuf {
        self.store.model_dir(&self.entry.id)
    }

    /// The path of the file `name` in the model's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.store.file_path(&self.entry.id, name)
    }

    /// The path the model loads for `file`: its converted form where the
    /// manifest converts it (a PyTorch checkpoint), else the file itself.
    pub fn loaded_path(&self, file: &WeightFile) -> PathBuf {
        self.path(&file.converted_name().unwrap_or_else(|| file.name.clone()))
    }

    /// [`ModelFiles::loaded_path`] of the first file whose name `matches`;
    /// the error says the entry names no `what` file.
    pub fn find(&self, what: &str, matches: impl Fn(&str) -> bool) -> Result<PathBuf, String> {
        self.entry
            .files
            .iter()
            .find(|file| matches(&file.name))
            .map(|file| self.loaded_path(file))
            .ok_or_else(|| format!("the manifest entry names no {what} file"))
    }

    /// The platform's file store, for models that read the URLs of files
    /// other jobs made from it rather than over HTTP; `None` when it cannot
    /// be opened (such URLs are then fetched like any other).
    pub fn own_files(&self) -> Option<Arc<dyn OwnFiles>> {
        (self.own_files)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobContext, JobError, Output, Usage};

    struct Fixed(String);

    impl Model for Fixed {
        fn id(&self) -> &str {
            &self.0
        }

        async fn run(&self, _input: Value, _ctx: JobContext) -> Result<Output, JobError> {
            Ok(Output::new(Value::Null, Usage::whole("requests", 1)))
        }
    }

    #[derive(Debug, Default, PartialEq, Serialize, serde::Deserialize)]
    #[serde(default)]
    struct FixedSettings {
        batch: u32,
        name: Option<String>,
    }

    struct FixedFactory;

    impl ModelFactory for FixedFactory {
        const SETTINGS: Option<&'static str> = Some("fixed");
        type Settings = FixedSettings;
        type Model = Fixed;

        fn accepts(entry: &ModelEntry) -> bool {
            entry.id.starts_with("fixed")
        }

        fn load(files: &ModelFiles<'_>, settings: &FixedSettings) -> Result<Fixed, String> {
            let path = files.find("weights", |name| name.ends_with(".bin"))?;
            Ok(Fixed(format!("{}:{}", path.display(), settings.batch)))
        }

        fn slots(settings: &FixedSettings) -> Option<u32> {
            Some(settings.batch)
        }

        fn input_schema(_entry: &ModelEntry) -> Value {
            serde_json::json!({"type": "object"})
        }
    }

    fn entry(toml: &str) -> ModelEntry {
        let manifest = gantry_manifest::Manifest::from_toml(toml).expect("manifest");
        manifest.models()[0].clone()
    }

    const ENTRY: &str = r#"
[[models]]
id = "fixed-1"
category = "diagnostic"
unit = "requests"
price = { micro_usd = 1, per = 1 }
description = "a test entry"
license = "MIT"
input_schema = '{"type": "object"}'
engine = { architecture = "fixed", layers = 3 }
"#;

    #[test]
    fn a_family_reads_its_own_table_and_refuses_a_bad_one() {
        let fixed = family::<FixedFactory>();
        assert_eq!(fixed.name(), "Fixed");
        assert_eq!(fixed.settings_table(), Some("fixed"));
        assert_eq!(fixed.default_settings(), serde_json::json!({"batch": 0, "name": null}));
        assert!(fixed.check_settings(None).is_ok());
        assert!(fixed.check_settings(Some(&serde_json::json!({"batch": 4}))).is_ok());
        let error = fixed
            .check_settings(Some(&serde_json::json!({"batch": "four"})))
            .expect_err("a string is not a batch");
        assert!(error.starts_with("the settings table [fixed]: invalid type"), "{error}");
        // Slots come from the table, and are never 0.
        assert_eq!(fixed.slots(Some(&serde_json::json!({"batch": 6}))), Ok(Some(6)));
        assert_eq!(fixed.slots(None), Ok(Some(1)));
        assert!(fixed.accepts(&entry(ENTRY)));
    }

    #[test]
    fn files_name_what_the_entry_lacks_and_read_its_engine_table() {
        let entry = entry(ENTRY);
        let store = ModelStore::new("/models");
        let own = || None;
        let files = ModelFiles::new(&entry, &store, &own);
        assert_eq!(files.id(), "fixed-1");
        assert_eq!(files.engine_str("architecture"), Some("fixed"));
        assert_eq!(files.engine_u64("layers"), Some(3));
        assert_eq!(files.engine_u64("architecture"), None);
        assert_eq!(files.dir(), store.model_dir("fixed-1"));
        assert!(files.own_files().is_none());
        let error = FixedFactory::load(&files, &FixedSettings::default())
            .err()
            .expect("no weights named");
        assert_eq!(error, "the manifest entry names no weights file");
    }
}
