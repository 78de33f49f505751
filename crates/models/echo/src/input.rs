//! The echo's input: any JSON value, echoed back unchanged. When it is an
//! object, its steering members are read into [`Input`], one typed struct
//! that is both their parser (every failure reported at once) and the
//! model's input schema; any other member is left alone.
use std::fmt;

use gantry_input::Between;
use gantry_worker_sdk::JobError;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::MAX_STREAM_CHUNKS;

/// Any JSON object; these optional members steer the echo, and are echoed
/// back too. The file is written first, then `fail` is checked, then the
/// sleep, then the chunks. Every other member is only echoed.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct Input {
    /// Fail as bad input (never retried): true, or a string that becomes the
    /// error message; false does not fail.
    #[serde(default)]
    #[schema(inline)]
    pub fail: Option<Fail>,
    /// Report progress {"sleeping_ms": n}, then sleep this long (ms); a
    /// cancel or deadline ends the sleep at once.
    #[serde(default)]
    #[schema(nullable = false)]
    pub sleep_ms: Option<u64>,
    /// Emit this many stream chunks {"chunk": i} before finishing.
    #[serde(default)]
    #[schema(inline)]
    pub stream: Option<Between<0, { MAX_STREAM_CHUNKS }>>,
    /// Pause this long (ms) between two chunks; a cancel ends the pause.
    #[serde(default)]
    #[schema(nullable = false)]
    pub stream_interval_ms: Option<u64>,
    /// Each chunk also carries sent_at_us, the wall-clock time it was sent
    /// in microseconds since the Unix epoch (to measure delivery latency).
    #[serde(default)]
    #[schema(default = false, nullable = false)]
    pub timestamps: Option<bool>,
    /// Return an output file of `text` repeated `repeat` times (at most 256
    /// MiB); the output gets its expiring URL as `file_url`.
    #[serde(default, deserialize_with = "object_or_null")]
    #[schema(inline)]
    pub file: Option<FileInput>,
}

// The `file` member (its description is the member's).
#[derive(Debug, Deserialize, ToSchema)]
pub struct FileInput {
    /// The file's text, repeated.
    pub text: String,
    /// How many times the text is written.
    #[serde(default)]
    #[schema(default = 1, nullable = false)]
    pub repeat: Option<u64>,
    /// The file's media type.
    #[serde(default)]
    #[schema(default = "text/plain", nullable = false)]
    pub media_type: Option<String>,
}

/// `fail`: a flag, or the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    Flag(bool),
    Message(String),
}

impl<'de> Deserialize<'de> for Fail {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FlagOrText;
        impl Visitor<'_> for FlagOrText {
            type Value = Fail;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a boolean")
            }

            fn visit_bool<E: de::Error>(self, flag: bool) -> Result<Fail, E> {
                Ok(Fail::Flag(flag))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Fail, E> {
                Ok(Fail::Message(text.to_owned()))
            }
        }
        deserializer.deserialize_any(FlagOrText)
    }
}

impl PartialSchema for Fail {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Boolean]))
            .into()
    }
}

impl ToSchema for Fail {}

/// An optional object member: null is absent, and only a JSON object is
/// read (never an array taken field by field, which serde's derived structs
/// accept).
fn object_or_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOrNull<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOrNull<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    deserializer.deserialize_any(ObjectOrNull(std::marker::PhantomData))
}

/// The echo's input schema: open to any member, with the steering ones
/// typed.
pub fn schema() -> Value {
    gantry_input::schema_of::<Input>()
}

/// What the steering members ask for, checked.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Options {
    pub fail: Option<String>,
    pub sleep_ms: u64,
    pub stream: u64,
    pub stream_interval_ms: u64,
    pub timestamps: bool,
    pub file: Option<FileOption>,
}

/// `file`: an output file of `text` repeated `repeat` times, whose URL the
/// output gets as `file_url`.
#[derive(Debug, PartialEq)]
pub(crate) struct FileOption {
    pub text: String,
    pub repeat: u64,
    pub media_type: String,
}

/// Largest echo file (text × repeat), in bytes. The file streams to the
/// scheduler as it is made, so this bounds the worker's time, not its
/// memory; the platform's own bounds on output files
/// (`files.max_file_bytes`, `files.max_job_bytes`) apply on top.
pub(crate) const MAX_FILE_BYTES: u64 = 256 << 20;

/// The steering members' names, as [`Input`] reads them.
const STEERING: [&str; 6] = ["fail", "sleep_ms", "stream", "stream_interval_ms", "timestamps", "file"];

impl Options {
    /// Reads the steering members of `input` (a value other than an object
    /// steers nothing), then the rule between the file's members.
    pub fn parse(input: &Value) -> Result<Self, JobError> {
        let Some(object) = input.as_object() else {
            return Ok(Self::default());
        };
        // Only the steering members are read: the rest is never looked at.
        let steering: Map<String, Value> = STEERING
            .iter()
            .filter_map(|&name| object.get(name).map(|value| (name.to_owned(), value.clone())))
            .collect();
        if steering.is_empty() {
            // Nothing to steer (the usual case): nothing to read.
            return Ok(Self::default());
        }
        let input: Input = gantry_input::read(Value::Object(steering))
            .map_err(|failures| JobError::BadInput(gantry_input::sentence(&failures)))?;
        let file = match input.file {
            None => None,
            Some(file) => {
                let repeat = file.repeat.unwrap_or(1);
                if (file.text.len() as u64).saturating_mul(repeat) > MAX_FILE_BYTES {
                    return Err(JobError::bad_input(format!(
                        "file: may be at most {MAX_FILE_BYTES} bytes (text repeated repeat times)"
                    )));
                }
                Some(FileOption {
                    text: file.text,
                    repeat,
                    media_type: file.media_type.unwrap_or_else(|| "text/plain".to_owned()),
                })
            }
        };
        Ok(Self {
            fail: match input.fail {
                None | Some(Fail::Flag(false)) => None,
                Some(Fail::Flag(true)) => Some("failure requested by the input".to_owned()),
                Some(Fail::Message(message)) => Some(message),
            },
            sleep_ms: input.sleep_ms.unwrap_or(0),
            stream: input.stream.map_or(0, |Between(n)| n),
            stream_interval_ms: input.stream_interval_ms.unwrap_or(0),
            timestamps: input.timestamps.unwrap_or(false),
            file,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn problem(input: Value) -> String {
        match Options::parse(&input) {
            Err(JobError::BadInput(message)) => message,
            other => panic!("{input} gave {other:?}"),
        }
    }

    #[test]
    fn options_are_optional_and_validated() {
        assert_eq!(Options::parse(&json!("text")).unwrap(), Options::default());
        assert_eq!(Options::parse(&json!([1, {"fail": true}])).unwrap(), Options::default());
        // Any other member is echoed, never read.
        assert_eq!(
            Options::parse(&json!({"a": 1, "prompt": {"deep": [null]}})).unwrap(),
            Options::default()
        );
        assert_eq!(
            Options::parse(
                &json!({"fail": true, "sleep_ms": 5, "stream": 2, "stream_interval_ms": 7, "timestamps": true})
            )
            .unwrap(),
            Options {
                fail: Some("failure requested by the input".into()),
                sleep_ms: 5,
                stream: 2,
                stream_interval_ms: 7,
                timestamps: true,
                file: None,
            }
        );
        assert_eq!(
            Options::parse(&json!({"fail": "boom"})).unwrap().fail.as_deref(),
            Some("boom")
        );
        assert_eq!(Options::parse(&json!({"fail": false})).unwrap().fail, None);
        // Null is absent.
        assert_eq!(
            Options::parse(&json!({"fail": null, "sleep_ms": null, "stream": null, "file": null})).unwrap(),
            Options::default()
        );
        assert_eq!(
            Options::parse(&json!({"file": {"text": "ab", "extra": 1}}))
                .unwrap()
                .file,
            Some(FileOption {
                text: "ab".into(),
                repeat: 1,
                media_type: "text/plain".into(),
            })
        );
        assert_eq!(
            Options::parse(&json!({"file": {"text": "ab", "repeat": 3, "media_type": "text/csv"}}))
                .unwrap()
                .file
                .map(|file| (file.repeat, file.media_type)),
            Some((3, "text/csv".to_owned()))
        );
    }

    #[test]
    fn every_wrong_steering_member_is_named() {
        let mut found: Vec<String> = problem(json!({
            "fail": 3, "sleep_ms": -1, "stream": MAX_STREAM_CHUNKS + 1,
            "stream_interval_ms": 1.5, "timestamps": "yes", "other": "kept"
        }))
        .split("; ")
        .map(str::to_owned)
        .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "fail: must be a string or a boolean, not a number",
                "sleep_ms: must be an integer from 0 to 18446744073709551615 (got -1)",
                "stream: must be an integer from 0 to 10000 (got 10001)",
                "stream_interval_ms: must be an integer from 0 to 18446744073709551615, not a fractional number",
                "timestamps: must be a boolean, not a string",
            ]
        );
        assert_eq!(
            problem(json!({"stream": "x"})),
            "stream: must be an integer from 0 to 10000, not a string"
        );
        assert_eq!(problem(json!({"file": {}})), "file.text: required property is missing");
        assert_eq!(
            problem(json!({"file": ["x", 2]})),
            "file: must be a JSON object, not an array"
        );
        let mut found: Vec<String> = problem(json!({"file": {"text": 1, "repeat": -2, "media_type": 5}}))
            .split("; ")
            .map(str::to_owned)
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "file.media_type: must be a string, not a number",
                "file.repeat: must be an integer from 0 to 18446744073709551615 (got -2)",
                "file.text: must be a string, not a number",
            ]
        );
        assert_eq!(
            problem(json!({"file": {"text": "xx", "repeat": MAX_FILE_BYTES}})),
            "file: may be at most 268435456 bytes (text repeated repeat times)"
        );
    }

    #[test]
    fn the_schema_states_the_steering_members_and_stays_open() {
        let schema = schema();
        assert_eq!(schema["type"], json!("object"));
        // Any object is echoed: unknown members are not refused.
        assert!(
            schema
                .get("additionalProperties")
                .is_none_or(|open| open == &json!(true)),
            "{schema}"
        );
        assert!(schema.get("required").is_none_or(|r| r == &json!([])), "{schema}");
        assert!(
            schema["description"].as_str().unwrap().starts_with("Any JSON object"),
            "{schema}"
        );
        let properties = &schema["properties"];
        assert_eq!(properties["fail"]["type"], json!(["string", "boolean"]), "{schema}");
        assert!(
            properties["fail"]["description"]
                .as_str()
                .unwrap()
                .contains("error message")
        );
        assert_eq!(properties["sleep_ms"]["type"], json!("integer"), "{schema}");
        assert_eq!(properties["sleep_ms"]["minimum"], json!(0), "{schema}");
        assert_eq!(properties["stream"]["type"], json!("integer"));
        assert_eq!(properties["stream"]["minimum"], json!(0));
        assert_eq!(properties["stream"]["maximum"], json!(10000));
        assert!(
            properties["stream"]["description"]
                .as_str()
                .unwrap()
                .contains("stream chunks")
        );
        assert_eq!(properties["stream_interval_ms"]["minimum"], json!(0));
        assert_eq!(properties["timestamps"]["type"], json!("boolean"));
        let file = &properties["file"];
        assert_eq!(file["type"], json!("object"), "{schema}");
        assert_eq!(file["required"], json!(["text"]));
        assert!(file.get("additionalProperties").is_none_or(|open| open == &json!(true)));
        let description = file["description"].as_str().unwrap();
        assert!(
            description.contains("at most 256") && description.contains("file_url"),
            "{description}"
        );
        assert_eq!(file["properties"]["text"]["type"], json!("string"));
        assert_eq!(file["properties"]["repeat"]["type"], json!("integer"));
        assert_eq!(file["properties"]["repeat"]["minimum"], json!(0));
        assert_eq!(file["properties"]["media_type"]["type"], json!("string"));
        assert_eq!(file["properties"]["media_type"]["default"], json!("text/plain"));
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }
}
