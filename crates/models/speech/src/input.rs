//! The job input of a speech model: one typed struct that is both the parser
//! (every failure reported at once, before any work) and the model's input
//! schema, with what the manifest entry decides (its voice, sample rate,
//! whether it matches voices) filled in by [`schema`].

use gantry_input::{Failure, NonEmpty, Real};
use gantry_worker_sdk::factory::ModelEntry;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::formats::Format;

/// Longest accepted prompt, in characters (Unicode scalar values).
pub const MAX_PROMPT_CHARS: usize = 5000;

gantry_input::bounds! {
    /// Accepted range of `speed`.
    pub Speed: 0.5..=2.0;
}

/// A speech job's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The text to speak, at most 5000 characters and not only whitespace
    /// (billed per character). Split at sentence boundaries; each sentence is
    /// streamed as it is done.
    #[schema(inline)]
    pub prompt: Prompt,
    /// The model's one voice.
    #[serde(default)]
    pub voice: Option<String>,
    /// Speaking rate: 2 is twice as fast.
    #[serde(default)]
    #[schema(inline, default = 1)]
    pub speed: Option<Real<Speed>>,
    /// The file's format, mono: wav (16-bit PCM), flac (lossless, about half
    /// the size) or ogg (Vorbis, quality 0.5, about a tenth). The stream's
    /// chunks come in the same format. No mp3: its one maintained encoder is
    /// LGPL.
    #[serde(default)]
    #[schema(default = "wav")]
    pub format: Option<Format>,
    /// A recording of the speaker to sound like (voice matching): an http(s)
    /// URL the worker fetches (public addresses only, at most 20 MiB), a
    /// base64 data: URL, or base64. WAV, MP3, FLAC or Ogg Vorbis, at least
    /// 1 s of speech; the first 20 s are used. The voice's pitch, formants
    /// and spectrum are moved toward the speaker as far as a speaker encoder
    /// finds it closer; the output's voice_match says how close.
    #[serde(default)]
    #[schema(inline)]
    pub reference_audio: Option<NonEmpty>,
}

/// The text to speak: 1 to [`MAX_PROMPT_CHARS`] characters, not only
/// whitespace, without NUL characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt(pub String);

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let count = text.chars().count();
        if text.trim().is_empty() {
            return Err(de::Error::custom("must not be empty or only whitespace"));
        }
        if text.contains('\0') {
            return Err(de::Error::custom("must not contain a NUL character"));
        }
        if count > MAX_PROMPT_CHARS {
            return Err(de::Error::custom(format!(
                "must be a string of at most {MAX_PROMPT_CHARS} characters (got {count}): split longer text into several jobs"
            )));
        }
        Ok(Self(text))
    }
}

impl PartialSchema for Prompt {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_PROMPT_CHARS))
            .into()
    }
}

impl ToSchema for Prompt {}

/// A checked request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: String,
    /// Characters of the prompt: what the job bills.
    pub characters: u64,
    pub speed: f32,
    pub format: Format,
    /// A recording of the speaker to sound like (voice matching).
    pub reference_audio: Option<gantry_net::Source>,
}

/// Reads `input` as [`Input`], then the rules that need the model or more
/// than the member's type: `voice` may only be the model's one voice, and
/// `reference_audio` must be a URL, a data: URL or base64. Every problem is
/// reported, joined by `"; "`.
pub fn parse(input: &Value, voice: &str) -> Result<Request, String> {
    let read = gantry_input::read::<Input>(input.clone());
    let mut failures = match &read {
        Ok(_) => Vec::new(),
        Err(failures) => failures.iter().cloned().map(|f| explain(f, input)).collect(),
    };
    if let Some(Value::String(given)) = input.get("voice")
        && given != voice
    {
        failures.push(Failure::new(
            &[],
            format!("unknown voice '{given}': this model speaks only with voice '{voice}'"),
        ));
    }
    let reference_audio = match read.as_ref().ok().and_then(|i| i.reference_audio.as_ref()) {
        Some(text) => match gantry_net::Source::parse(text.as_str(), "reference_audio") {
            Ok(source) => Some(source),
            Err(e) => {
                failures.push(Failure::new(&[], format!("'reference_audio': {e}")));
                None
            }
        },
        None => None,
    };
    match read {
        Ok(input) if failures.is_empty() => {
            let characters = input.prompt.0.chars().count() as u64;
            Ok(Request {
                prompt: input.prompt.0,
                characters,
                speed: input.speed.map_or(1.0, |s| s.0 as f32),
                format: input.format.unwrap_or(Format::Wav),
                reference_audio,
            })
        }
        _ => Err(gantry_input::sentence(&failures)),
    }
}

/// A failure with a hint where the schema's words alone would leave the
/// client guessing: why there is no mp3.
fn explain(mut failure: Failure, input: &Value) -> Failure {
    if failure.path == ["format"] && input.get("format").and_then(Value::as_str) == Some("mp3") {
        failure.problem.push_str(
            ": mp3 is not produced, as its one maintained encoder (LAME) is LGPL: use 'ogg' for a small file or 'flac' for a lossless one",
        );
    }
    failure
}

/// The input schema the API serves for `entry`: [`Input`]'s, with the
/// entry's voice (a hibari voice's `engine.voice`, a Piper voice's name from
/// its `.onnx` file), its sample rate, its engine's words, and
/// `reference_audio` only where the entry has a speaker encoder
/// (`pretrained.pt`).
pub fn schema(entry: &ModelEntry) -> Value {
    let mut schema = gantry_input::schema_of::<Input>();
    let hibari = entry.engine.get("architecture").and_then(Value::as_str) == Some("hibari");
    let graph = entry
        .files
        .iter()
        .map(|f| f.name.as_str())
        .find(|n| n.ends_with(".onnx"));
    // As the factory loads them: a hibari voice by `engine.voice`, a Piper
    // voice by its config's dataset, which the file is named after.
    let (voice, rate) = if hibari {
        let voice = entry.engine.get("voice").and_then(Value::as_str).map(str::to_owned);
        (voice, Some(crate::vocoder::SAMPLE_RATE))
    } else {
        let voice = graph.map(|g| crate::voice_name_from_file(std::path::Path::new(g)));
        (voice, graph.and_then(piper_sample_rate))
    };
    let properties = &mut schema["properties"];

    if hibari {
        append(
            &mut properties["prompt"],
            " Numbers, dates, money and abbreviations are read out.",
        );
    }
    if let Some(voice) = voice {
        let words = if hibari { hibari_voice_words(&voice) } else { None };
        let description = match words {
            Some(words) => format!("The model's one voice ({words})."),
            None => "The model's one voice.".to_owned(),
        };
        properties["voice"] = json!({
            "type": "string",
            "enum": [voice],
            "default": voice,
            "description": description,
        });
    }
    if !hibari {
        let speed = &mut properties["speed"]["description"];
        if let Some(text) = speed.as_str() {
            *speed = json!(format!(
                "{} (the voice's length scale divided by it).",
                text.trim_end_matches('.')
            ));
        }
    }
    let format = &mut properties["format"]["description"];
    if let Some(text) = format.as_str() {
        let at = match rate {
            Some(rate) => format!("mono at {rate} Hz"),
            None => "mono at the voice's sample rate".to_owned(),
        };
        *format = json!(text.replacen("mono", &at, 1));
    }
    if !entry.files.iter().any(|f| f.name == "pretrained.pt")
        && let Some(properties) = properties.as_object_mut()
    {
        properties.remove("reference_audio");
    }
    schema
}

/// Adds `words` to the end of a property's description.
fn append(property: &mut Value, words: &str) {
    if let Some(text) = property["description"].as_str() {
        property["description"] = json!(format!("{text}{words}"));
    }
}

/// The sample rate of a Piper voice by its quality, the last part of its
/// file name (`en_US-joe-medium.onnx`: 22050 Hz).
fn piper_sample_rate(graph: &str) -> Option<u32> {
    let stem = graph.strip_suffix(".onnx")?;
    match stem.rsplit('-').next()? {
        "x_low" | "low" => Some(16_000),
        "medium" | "high" => Some(22_050),
        _ => None,
    }
}

/// What a hibari voice is, by its name in the registry (Kokoro's voice it
/// was distilled from).
fn hibari_voice_words(voice: &str) -> Option<&'static str> {
    match voice {
        "heart" => Some("Kokoro's af_heart, American English, female"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_and_accepted_values() {
        let r = parse(&json!({"prompt": "Héllo"}), "joe").unwrap();
        assert_eq!((r.prompt.as_str(), r.characters, r.speed), ("Héllo", 5, 1.0));
        assert_eq!((r.format, r.reference_audio), (Format::Wav, None));
        let r = parse(
            &json!({"prompt": "x", "voice": "joe", "speed": 2, "format": "wav"}),
            "joe",
        )
        .unwrap();
        assert_eq!((r.speed, r.format), (2.0, Format::Wav));
        let r = parse(&json!({"prompt": "x", "format": "ogg"}), "joe").unwrap();
        assert_eq!(r.format, Format::Ogg);
        let r = parse(&json!({"prompt": "x", "format": "flac"}), "joe").unwrap();
        assert_eq!(r.format, Format::Flac);
        let r = parse(
            &json!({"prompt": "x", "voice": null, "speed": 0.5, "format": null, "reference_audio": null}),
            "joe",
        )
        .unwrap();
        assert_eq!(r.speed, 0.5);
        let longest = "a".repeat(MAX_PROMPT_CHARS);
        assert_eq!(parse(&json!({"prompt": longest}), "joe").unwrap().characters, 5000);
    }

    #[test]
    fn a_reference_recording_is_a_url_or_the_file() {
        let r = parse(
            &json!({"prompt": "x", "reference_audio": "https://example.com/me.wav"}),
            "joe",
        )
        .unwrap();
        assert_eq!(
            r.reference_audio,
            Some(gantry_net::Source::Url("https://example.com/me.wav".into()))
        );
        let r = parse(&json!({"prompt": "x", "reference_audio": "UklGRg=="}), "joe").unwrap();
        assert_eq!(r.reference_audio, Some(gantry_net::Source::Bytes(b"RIFF".to_vec())));
        let err = parse(&json!({"prompt": "x", "reference_audio": "@@"}), "joe").unwrap_err();
        assert!(err.starts_with("'reference_audio': not an http(s) URL"), "{err}");
        let err = parse(&json!({"prompt": "x", "reference_audio": 3}), "joe").unwrap_err();
        assert_eq!(err, "reference_audio: must be a string, not a number");
        let err = parse(&json!({"prompt": "x", "reference_audio": ""}), "joe").unwrap_err();
        assert_eq!(err, "reference_audio: must not be empty");
    }

    #[test]
    fn every_problem_is_reported() {
        let err = parse(
            &json!({"prompt": "", "voice": "amy", "speed": 9, "format": "mp3", "pitch": 1}),
            "joe",
        )
        .unwrap_err();
        for needle in [
            "pitch: unknown property",
            "prompt: must not be empty or only whitespace",
            "unknown voice 'amy': this model speaks only with voice 'joe'",
            "speed: must be a number from 0.5 to 2 (got 9)",
            "format: must be one of wav, flac, ogg (got 'mp3'): mp3 is not produced",
            "LGPL",
        ] {
            assert!(err.contains(needle), "{needle} in {err}");
        }
        assert_eq!(err.matches("; ").count(), 4, "{err}");
        let failure = |input: Value| parse(&input, "joe").unwrap_err();
        assert_eq!(failure(json!({})), "prompt: required property is missing");
        assert_eq!(failure(json!("text")), "must be a JSON object, not a string");
        assert_eq!(
            failure(json!({"prompt": "  \n"})),
            "prompt: must not be empty or only whitespace"
        );
        assert_eq!(failure(json!({"prompt": 3})), "prompt: must be a string, not a number");
        assert_eq!(
            failure(json!({"prompt": "a\u{0}b"})),
            "prompt: must not contain a NUL character"
        );
        assert_eq!(
            failure(json!({"prompt": "x", "speed": "fast"})),
            "speed: must be a number, not a string"
        );
        assert_eq!(
            failure(json!({"prompt": "x", "speed": 0.49})),
            "speed: must be a number from 0.5 to 2 (got 0.49)"
        );
        assert_eq!(
            failure(json!({"prompt": "x", "voice": 1})),
            "voice: must be a string, not a number"
        );
        assert_eq!(
            failure(json!({"prompt": "x", "format": "aiff"})),
            "format: must be one of wav, flac, ogg (got 'aiff')"
        );
        let too_long = "é".repeat(MAX_PROMPT_CHARS + 1);
        assert_eq!(
            failure(json!({"prompt": too_long})),
            "prompt: must be a string of at most 5000 characters (got 5001): split longer text into several jobs"
        );
    }

    fn entry(id: &str) -> ModelEntry {
        gantry_manifest::Manifest::builtin()
            .get(id)
            .unwrap_or_else(|| panic!("{id} is a built-in entry"))
            .clone()
    }

    /// The properties' names, sorted.
    fn names(properties: &Value) -> Vec<&str> {
        let mut names: Vec<&str> = properties.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The facts every speech entry's schema states, as the hand-written
    /// schemas of the manifest did.
    fn common(schema: &Value) {
        assert_eq!(schema["type"], json!("object"));
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["required"], json!(["prompt"]));
        let p = &schema["properties"];
        assert_eq!(p["prompt"]["type"], json!("string"));
        assert_eq!(p["prompt"]["minLength"], json!(1));
        assert_eq!(p["prompt"]["maxLength"], json!(5000));
        let prompt = p["prompt"]["description"].as_str().unwrap();
        for words in [
            "at most 5000 characters",
            "billed per character",
            "each sentence is streamed",
        ] {
            assert!(prompt.contains(words), "{words} in {prompt}");
        }
        assert_eq!(p["speed"]["type"], json!("number"));
        assert_eq!(p["speed"]["minimum"], json!(0.5));
        assert_eq!(p["speed"]["maximum"], json!(2));
        assert_eq!(p["speed"]["default"], json!(1));
        assert!(
            p["speed"]["description"]
                .as_str()
                .unwrap()
                .starts_with("Speaking rate: 2 is twice as fast")
        );
        assert_eq!(p["format"]["enum"], json!(["wav", "flac", "ogg"]));
        assert_eq!(p["format"]["default"], json!("wav"));
        let format = p["format"]["description"].as_str().unwrap();
        for words in [
            "wav (16-bit PCM)",
            "flac (lossless, about half the size)",
            "quality 0.5",
            "LGPL",
        ] {
            assert!(format.contains(words), "{words} in {format}");
        }
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }

    #[test]
    fn the_piper_schema_states_its_voice_rate_and_voice_matching() {
        let schema = schema(&entry("piper-en-us-joe"));
        common(&schema);
        let p = &schema["properties"];
        assert_eq!(names(p), ["format", "prompt", "reference_audio", "speed", "voice"]);
        assert_eq!(
            p["voice"],
            json!({"type": "string", "enum": ["joe"], "default": "joe", "description": "The model's one voice."})
        );
        assert!(
            p["speed"]["description"]
                .as_str()
                .unwrap()
                .contains("length scale divided by it")
        );
        assert!(
            p["format"]["description"]
                .as_str()
                .unwrap()
                .contains("mono at 22050 Hz")
        );
        assert_eq!(p["reference_audio"]["type"], json!("string"));
        assert_eq!(p["reference_audio"]["minLength"], json!(1));
        let reference = p["reference_audio"]["description"].as_str().unwrap();
        for words in [
            "http(s) URL",
            "at most 20 MiB",
            "data: URL",
            "at least 1 s",
            "first 20 s",
            "voice_match",
        ] {
            assert!(reference.contains(words), "{words} in {reference}");
        }
        assert_eq!(piper_sample_rate("de_DE-thorsten-low.onnx"), Some(16_000));
        assert_eq!(piper_sample_rate("voice.onnx"), None);
        // The schema's voice is the one the loaded voice answers to.
        assert!(parse(&json!({"prompt": "x", "voice": p["voice"]["default"]}), "joe").is_ok());
    }

    #[test]
    fn the_hibari_schema_states_its_voice_from_the_entry() {
        let mut hibari = entry("kokoro-hibari");
        let first = schema(&hibari);
        common(&first);
        let p = &first["properties"];
        assert_eq!(
            names(p),
            ["format", "prompt", "speed", "voice"],
            "no speaker encoder: no reference_audio"
        );
        assert_eq!(p["voice"]["enum"], json!(["heart"]));
        assert_eq!(p["voice"]["default"], json!("heart"));
        assert_eq!(
            p["voice"]["description"],
            json!("The model's one voice (Kokoro's af_heart, American English, female).")
        );
        assert!(
            p["prompt"]["description"]
                .as_str()
                .unwrap()
                .contains("Numbers, dates, money and abbreviations are read out")
        );
        assert!(
            p["format"]["description"]
                .as_str()
                .unwrap()
                .contains("mono at 24000 Hz")
        );
        assert!(!p["speed"]["description"].as_str().unwrap().contains("length scale"));
        // Another voice of the registry named by the entry is the schema's.
        hibari.engine.insert("voice".into(), json!("bella"));
        let p = &schema(&hibari)["properties"];
        assert_eq!(p["voice"]["enum"], json!(["bella"]));
        assert_eq!(p["voice"]["description"], json!("The model's one voice."));
    }
}
