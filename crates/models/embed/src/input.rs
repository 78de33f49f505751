//! An embedding job's input: one typed struct that is both the parser (every
//! failure reported at once, before any work) and the model's input schema.
//! The rules that need the loaded model (its vocabulary, its vectors'
//! length) are checked once the members are well formed.

use gantry_input::AtLeast;
use gantry_worker_sdk::factory::ModelEntry;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// Most inputs one request may embed.
pub const MAX_INPUTS: usize = 2048;

/// Longest text input, in bytes (far beyond what the model reads: a text is
/// cut to the model's length in tokens; this only bounds the tokenizer's work).
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// An embedding job's input, as a client sends it (OpenAI's embeddings
/// request, with Gantry's `truncate`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// What to embed: one string, a list of up to 2048 strings, a list of
    /// token ids of the model's WordPiece vocabulary, or a list of up to 2048
    /// such lists. Each input gets one vector, in order. A text is at most
    /// 1 MiB (1048576 bytes of UTF-8).
    #[schema(inline)]
    pub input: Given,
    /// float: arrays of numbers; base64: each vector as the base64 of its
    /// little-endian 32-bit floats.
    #[serde(default)]
    #[schema(default = "float")]
    pub encoding_format: Option<Encoding>,
    /// Only the model's own length is accepted; vectors cannot be shortened.
    #[serde(default)]
    #[schema(inline)]
    pub dimensions: Option<AtLeast<1>>,
    /// Cut inputs longer than the model reads to that length; false refuses
    /// them instead.
    #[serde(default)]
    #[schema(default = true, nullable = false)]
    pub truncate: Option<bool>,
    /// Accepted for OpenAI compatibility; ignored (the route names the model).
    #[serde(default)]
    #[schema(nullable = false)]
    pub model: Option<String>,
    /// Accepted for OpenAI compatibility; ignored.
    #[serde(default)]
    #[schema(nullable = false)]
    pub user: Option<String>,
}

/// What to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inputs {
    Texts(Vec<String>),
    /// Token ids of the model's own vocabulary, without `[CLS]`/`[SEP]`.
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Inputs::Texts(texts) => texts.len(),
            Inputs::Tokens(tokens) => tokens.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `input` as given, in one of its four forms: the texts, or the lists of
/// token ids as they were written (each id is checked against the model's
/// vocabulary by [`parse`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Given {
    Texts(Vec<String>),
    Tokens(Vec<Vec<Value>>),
}

const SHAPE: &str = "must be a string, an array of strings, an array of token ids or an array of arrays of token ids";

impl Given {
    /// The form of `value`; the error is the member's problem.
    fn of(value: Value) -> Result<Self, String> {
        let items = match value {
            // A null input is no input.
            Value::Null => return Err("required property is missing".into()),
            Value::String(text) => return Ok(Given::Texts(vec![text])),
            Value::Array(items) => items,
            _ => return Err(SHAPE.into()),
        };
        if items.is_empty() {
            return Err("must not be an empty array".into());
        }
        let given = if items.iter().all(Value::is_string) {
            Given::Texts(
                items
                    .into_iter()
                    .filter_map(|item| match item {
                        Value::String(text) => Some(text),
                        _ => None,
                    })
                    .collect(),
            )
        } else if items.iter().all(Value::is_number) {
            // One list of ids: one input.
            Given::Tokens(vec![items])
        } else if items.iter().all(Value::is_array) {
            Given::Tokens(
                items
                    .into_iter()
                    .filter_map(|item| match item {
                        Value::Array(ids) => Some(ids),
                        _ => None,
                    })
                    .collect(),
            )
        } else {
            return Err(SHAPE.into());
        };
        let count = match &given {
            Given::Texts(texts) => texts.len(),
            Given::Tokens(lists) => lists.len(),
        };
        if count > MAX_INPUTS {
            return Err(format!("may hold at most {MAX_INPUTS} inputs (got {count})"));
        }
        Ok(given)
    }
}

impl<'de> Deserialize<'de> for Given {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Given::of(Value::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

impl PartialSchema for Given {
    fn schema() -> RefOr<Schema> {
        let text = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_TEXT_BYTES))
        };
        let ids = || {
            ArrayBuilder::new()
                .items(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)))
                .min_items(Some(1))
        };
        AnyOfBuilder::new()
            .item(text())
            .item(
                ArrayBuilder::new()
                    .items(text())
                    .min_items(Some(1))
                    .max_items(Some(MAX_INPUTS)),
            )
            .item(ids())
            .item(
                ArrayBuilder::new()
                    .items(ids())
                    .min_items(Some(1))
                    .max_items(Some(MAX_INPUTS)),
            )
            .into()
    }
}

impl ToSchema for Given {}

/// How vectors are written in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Arrays of JSON numbers.
    #[default]
    Float,
    /// Base64 of the little-endian 32-bit floats (OpenAI's `base64`).
    Base64,
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub inputs: Inputs,
    pub encoding: Encoding,
    /// Cut inputs longer than the model reads (true), or refuse them.
    pub truncate: bool,
}

/// A model's sizes as its manifest entry states them (`engine = {
/// dimensions, vocab_size, max_tokens }`), so that the schema can say them
/// before the files are read; the loaded model checks them against its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Length of each vector.
    pub dimensions: usize,
    /// Token ids run from 0 to this less 1.
    pub vocab_size: usize,
    /// Most tokens one sequence holds, `[CLS]` and `[SEP]` included.
    pub max_tokens: usize,
}

impl Sizes {
    /// The sizes of an engine table: all three keys, or none (`None`).
    pub fn from_engine(engine: &serde_json::Map<String, Value>) -> Result<Option<Sizes>, String> {
        const KEYS: [&str; 3] = ["dimensions", "vocab_size", "max_tokens"];
        let read: Vec<Option<usize>> = KEYS
            .iter()
            .map(|key| {
                engine
                    .get(*key)
                    .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
            })
            .map(|v| v.map(|n| n.filter(|n| *n > 2).unwrap_or(0)))
            .collect();
        match read.as_slice() {
            [None, None, None] => Ok(None),
            [Some(dimensions), Some(vocab_size), Some(max_tokens)]
                if *dimensions > 0 && *vocab_size > 0 && *max_tokens > 0 =>
            {
                Ok(Some(Sizes {
                    dimensions: *dimensions,
                    vocab_size: *vocab_size,
                    max_tokens: *max_tokens,
                }))
            }
            _ => Err(format!(
                "engine: give all of {} as integers above 2, or none",
                KEYS.join(", ")
            )),
        }
    }

    /// Whether a loaded model has these sizes; the error names each that
    /// differs.
    pub fn check(&self, loaded: &Sizes) -> Result<(), String> {
        let mut differ = Vec::new();
        for (key, stated, found) in [
            ("dimensions", self.dimensions, loaded.dimensions),
            ("vocab_size", self.vocab_size, loaded.vocab_size),
            ("max_tokens", self.max_tokens, loaded.max_tokens),
        ] {
            if stated != found {
                differ.push(format!("engine.{key} is {stated}, but the files say {found}"));
            }
        }
        if differ.is_empty() {
            Ok(())
        } else {
            Err(differ.join("; "))
        }
    }
}

/// The input schema the API serves for the embedding model `entry`: the
/// input type's, with the model's sizes where they are known.
pub fn schema(entry: &ModelEntry) -> Value {
    let mut schema = gantry_input::schema_of::<Input>();
    if let Ok(Some(sizes)) = Sizes::from_engine(&entry.engine) {
        let properties = &mut schema["properties"];
        let last_id = json!(sizes.vocab_size - 1);
        properties["input"]["anyOf"][2]["items"]["maximum"] = last_id.clone();
        properties["input"]["anyOf"][3]["items"]["items"]["maximum"] = last_id;
        properties["dimensions"]["description"] = json!(format!(
            "Only {}, this model's length, is accepted; vectors cannot be shortened.",
            sizes.dimensions
        ));
        properties["truncate"]["description"] = json!(format!(
            "Cut inputs longer than {} tokens (the model's {} less [CLS] and [SEP]) to that length; false refuses them instead.",
            sizes.max_tokens - 2,
            sizes.max_tokens
        ));
    }
    schema
}

/// Reads `input` as [`Input`], then the rules that need the model (vectors
/// `dimensions` long, a vocabulary of `vocab_size` ids) and the length of
/// each text.
pub fn parse(input: &Value, dimensions: usize, vocab_size: usize) -> Result<Request, String> {
    let input: Input = gantry_input::read(input.clone()).map_err(|failures| gantry_input::sentence(&failures))?;
    let mut errors = Vec::new();
    let inputs = match input.input {
        Given::Texts(texts) => {
            for (i, text) in texts.iter().enumerate() {
                if text.len() > MAX_TEXT_BYTES {
                    errors.push(format!("input[{i}] is longer than {MAX_TEXT_BYTES} bytes"));
                }
            }
            Inputs::Texts(texts)
        }
        Given::Tokens(lists) => Inputs::Tokens(token_ids(&lists, vocab_size, &mut errors)),
    };
    if let Some(AtLeast(asked)) = input.dimensions
        && asked != dimensions as u64
    {
        errors.push(format!(
            "dimensions: this model's vectors have {dimensions} dimensions and cannot be shortened (asked for {asked})"
        ));
    }
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(Request {
        inputs,
        encoding: input.encoding_format.unwrap_or_default(),
        truncate: input.truncate.unwrap_or(true),
    })
}

/// The ids of each list, which must be a non-empty list of ids below
/// `vocab_size`; the first wrong id of a list is reported.
fn token_ids(lists: &[Vec<Value>], vocab_size: usize, errors: &mut Vec<String>) -> Vec<Vec<u32>> {
    let mut out = Vec::with_capacity(lists.len());
    for (i, list) in lists.iter().enumerate() {
        if list.is_empty() {
            errors.push(format!("input[{i}]: an empty list of token ids"));
            continue;
        }
        let ids: Result<Vec<u32>, &Value> = list
            .iter()
            .map(|value| {
                value
                    .as_u64()
                    .filter(|&id| (id as usize) < vocab_size)
                    .map(|id| id as u32)
                    .ok_or(value)
            })
            .collect();
        match ids {
            Ok(ids) => out.push(ids),
            Err(value) => errors.push(format!(
                "input[{i}]: {value} is not a token id of this model (0 to {})",
                vocab_size - 1
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_input_shape_is_read() {
        let texts = parse(&json!({"input": "hi"}), 384, 100).unwrap();
        assert_eq!(texts.inputs, Inputs::Texts(vec!["hi".into()]));
        assert_eq!((texts.encoding, texts.truncate), (Encoding::Float, true));
        let many = parse(&json!({"input": ["a", ""], "encoding_format": "base64", "truncate": false, "dimensions": 384, "model": "m", "user": "u"}), 384, 100).unwrap();
        assert_eq!(many.inputs, Inputs::Texts(vec!["a".into(), String::new()]));
        assert_eq!((many.encoding, many.truncate), (Encoding::Base64, false));
        assert_eq!(
            parse(&json!({"input": [1, 2, 3]}), 384, 100).unwrap().inputs,
            Inputs::Tokens(vec![vec![1, 2, 3]])
        );
        assert_eq!(
            parse(&json!({"input": [[1], [2, 99]]}), 384, 100).unwrap().inputs,
            Inputs::Tokens(vec![vec![1], vec![2, 99]])
        );
        // Null optional members are absent; a whole float is an integer.
        let nulls = parse(
            &json!({"input": "x", "encoding_format": null, "truncate": null, "dimensions": 384.0, "user": null}),
            384,
            100,
        )
        .unwrap();
        assert_eq!((nulls.encoding, nulls.truncate), (Encoding::Float, true));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        // The members' own rules, all at once.
        let mut found: Vec<String> = parse(
            &json!({"input": [[1], [100], []], "encoding_format": "int8", "dimensions": 0, "truncate": "yes", "model": 1, "extra": 1}),
            384,
            100,
        )
        .unwrap_err()
        .split("; ")
        .map(str::to_owned)
        .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "dimensions: must be an integer of at least 1 (got 0)",
                "encoding_format: must be one of float, base64 (got 'int8')",
                "extra: unknown property",
                "model: must be a string, not a number",
                "truncate: must be a boolean, not a string",
            ]
        );
        // The model's rules, once the members are well formed.
        let err = parse(
            &json!({"input": [[1], [100], [], [2, "a"]], "dimensions": 256}),
            384,
            100,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "input[1]: 100 is not a token id of this model (0 to 99); input[2]: an empty list of token ids; \
             input[3]: \"a\" is not a token id of this model (0 to 99); \
             dimensions: this model's vectors have 384 dimensions and cannot be shortened (asked for 256)"
        );
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let err = parse(&json!({"input": ["a", long]}), 384, 100).unwrap_err();
        assert_eq!(err, "input[1] is longer than 1048576 bytes");
        for (input, needle) in [
            (json!({}), "input: required property is missing"),
            (json!({"input": null}), "input: required property is missing"),
            (json!({"input": []}), "input: must not be an empty array"),
            (json!({"input": ["a", 1]}), "input: must be a string, an array"),
            (json!({"input": 5}), "input: must be a string, an array"),
            (json!({"input": [1.5]}), "input[0]: 1.5 is not a token id"),
            (json!({"input": [-1]}), "input[0]: -1 is not a token id"),
            (
                json!({"input": vec!["x"; MAX_INPUTS + 1]}),
                "input: may hold at most 2048 inputs (got 2049)",
            ),
            (
                json!({"input": "x", "dimensions": -3}),
                "dimensions: must be an integer of at least 1 (got -3)",
            ),
            (json!("text"), "must be a JSON object, not a string"),
            (json!({"input": "x", "encoding_format": 1}), "encoding_format: must be"),
        ] {
            let err = parse(&input, 384, 100).unwrap_err();
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        // A wrong input is not also called missing.
        assert_eq!(
            parse(&json!({"text": "x"}), 384, 100).unwrap_err(),
            "text: unknown property; input: required property is missing"
        );
    }

    #[test]
    fn sizes_are_stated_whole_or_not_at_all_and_checked_against_the_files() {
        let engine = |v: Value| v.as_object().unwrap().clone();
        let stated = Sizes::from_engine(&engine(
            json!({"dimensions": 384, "vocab_size": 30522, "max_tokens": 256}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(Sizes::from_engine(&engine(json!({}))).unwrap(), None);
        for partial in [
            json!({"dimensions": 384}),
            json!({"dimensions": "x", "vocab_size": 1, "max_tokens": 3}),
        ] {
            assert!(Sizes::from_engine(&engine(partial)).is_err());
        }
        assert_eq!(stated.check(&stated), Ok(()));
        let other = Sizes {
            dimensions: 768,
            max_tokens: 512,
            ..stated
        };
        assert_eq!(
            stated.check(&other).unwrap_err(),
            "engine.dimensions is 384, but the files say 768; engine.max_tokens is 256, but the files say 512"
        );
    }

    #[test]
    fn the_schema_of_the_builtin_model_states_its_sizes() {
        let entry = gantry_manifest::Manifest::builtin()
            .get("all-minilm-l6-v2")
            .expect("the built-in embedding model");
        let schema = schema(entry);
        assert_eq!(schema["type"], json!("object"));
        assert_eq!(schema["required"], json!(["input"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        let properties = &schema["properties"];
        let mut names: Vec<&str> = properties.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["dimensions", "encoding_format", "input", "model", "truncate", "user"]
        );
        let forms = properties["input"]["anyOf"].as_array().unwrap();
        assert_eq!(forms[0], json!({"type": "string", "maxLength": 1048576}), "{schema}");
        assert_eq!(
            forms[1],
            json!({"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string", "maxLength": 1048576}})
        );
        assert_eq!(
            forms[2],
            json!({"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 30521}})
        );
        assert_eq!(
            forms[3],
            json!({"type": "array", "minItems": 1, "maxItems": 2048,
                   "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 30521}}})
        );
        let description = properties["input"]["description"].as_str().unwrap();
        assert!(description.starts_with("What to embed: one string"), "{description}");
        assert_eq!(properties["encoding_format"]["enum"], json!(["float", "base64"]));
        assert_eq!(properties["encoding_format"]["default"], json!("float"));
        assert!(
            properties["encoding_format"]["description"]
                .as_str()
                .unwrap()
                .contains("little-endian 32-bit floats")
        );
        assert_eq!(properties["dimensions"]["type"], json!("integer"));
        assert_eq!(properties["dimensions"]["minimum"], json!(1));
        assert!(
            properties["dimensions"]["description"]
                .as_str()
                .unwrap()
                .starts_with("Only 384, this model's length")
        );
        assert_eq!(properties["truncate"]["type"], json!("boolean"));
        assert_eq!(properties["truncate"]["default"], json!(true));
        assert!(
            properties["truncate"]["description"]
                .as_str()
                .unwrap()
                .contains("longer than 254 tokens (the model's 256 less [CLS] and [SEP])")
        );
        for name in ["model", "user"] {
            assert_eq!(properties[name]["type"], json!("string"));
            assert!(properties[name]["description"].as_str().unwrap().contains("OpenAI"));
        }
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }
}
