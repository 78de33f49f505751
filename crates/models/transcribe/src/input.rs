//! A transcription job's input: one typed struct that is both the parser
//! (every failure reported at once, before any work) and the model's input
//! schema.
use gantry_input::NonEmpty;
use gantry_net::Source;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// A transcription job's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The audio to transcribe: an http(s) URL the worker fetches (public
    /// addresses only, at most 100 MiB) or a base64 data: URL. WAV, MP3, FLAC
    /// or Ogg Vorbis, any sample rate, mono or more channels (mixed down); at
    /// most 1800 s. Give exactly one of audio_url and audio.
    #[serde(default)]
    #[schema(inline)]
    pub audio_url: Option<NonEmpty>,
    /// The audio file itself, base64-encoded; same formats and limits as
    /// audio_url.
    #[serde(default)]
    #[schema(inline)]
    pub audio: Option<NonEmpty>,
    /// The spoken language; this model knows English only.
    #[serde(default)]
    #[schema(default = "en")]
    pub language: Option<Language>,
}

/// The languages the loaded model can transcribe (tiny.en: English only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, ToSchema)]
pub enum Language {
    #[default]
    #[serde(rename = "en")]
    En,
}

impl Language {
    pub fn code(self) -> &'static str {
        match self {
            Self::En => "en",
        }
    }
}

/// A valid request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub audio: Source,
    pub language: &'static str,
}

/// The input schema the API serves for a transcription model.
pub fn schema() -> Value {
    gantry_input::schema_of::<Input>()
}

/// Reads `input` as [`Input`], then the rules between its members: exactly
/// one of `audio_url` (http(s) or data: URL) and `audio` (base64).
pub fn parse(input: &Value) -> Result<Request, String> {
    let input: Input = gantry_input::read(input.clone()).map_err(|failures| gantry_input::sentence(&failures))?;
    let mut errors = Vec::new();
    let source = |key: &str, text: &NonEmpty, allow_url: bool, errors: &mut Vec<String>| {
        let parsed = Source::parse(text.as_str(), "audio").and_then(|source| match source {
            Source::Url(_) if !allow_url => Err("give a URL as audio_url; audio takes base64".into()),
            other => Ok(other),
        });
        parsed.map_err(|e| errors.push(format!("{key}: {e}"))).ok()
    };
    let url = input
        .audio_url
        .as_ref()
        .and_then(|text| source("audio_url", text, true, &mut errors));
    let inline = input
        .audio
        .as_ref()
        .and_then(|text| source("audio", text, false, &mut errors));
    match (&input.audio_url, &input.audio) {
        (Some(_), Some(_)) => errors.push("give either audio_url or audio, not both".into()),
        (None, None) => errors.push("audio_url or audio is required: the audio to transcribe".into()),
        _ => {}
    }
    match url.or(inline) {
        Some(audio) if errors.is_empty() => Ok(Request {
            audio,
            language: input.language.unwrap_or_default().code(),
        }),
        _ => Err(errors.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_url_or_base64_and_a_language() {
        let r = parse(&json!({"audio_url": "https://example.com/a.mp3"})).unwrap();
        assert_eq!(r.audio, Source::Url("https://example.com/a.mp3".into()));
        assert_eq!(r.language, "en");
        let r = parse(&json!({"audio": "UklGRg==", "language": "en"})).unwrap();
        assert_eq!(r.audio, Source::Bytes(b"RIFF".to_vec()));
        let r = parse(&json!({"audio_url": "data:audio/wav;base64,UklGRg==", "language": null})).unwrap();
        assert_eq!(r.audio, Source::Bytes(b"RIFF".to_vec()));
    }

    #[test]
    fn every_failure_is_reported_at_once() {
        let err = parse(&json!({"audio": "", "language": "fr", "prompt": "x"})).unwrap_err();
        for part in [
            "prompt: unknown property",
            "audio: must not be empty",
            "language: must be one of en (got 'fr')",
        ] {
            assert!(err.contains(part), "{part} missing from: {err}");
        }
        let err = parse(&json!({})).unwrap_err();
        assert!(err.contains("audio_url or audio is required"), "{err}");
        let err = parse(&json!({"audio_url": "https://a/b.wav", "audio": "UklGRg=="})).unwrap_err();
        assert!(err.contains("not both"), "{err}");
        let err = parse(&json!({"audio": "https://a/b.wav"})).unwrap_err();
        assert!(err.contains("give a URL as audio_url"), "{err}");
        let err = parse(&json!({"audio": "%%%"})).unwrap_err();
        assert!(err.contains("audio: not an http(s) URL"), "{err}");
        let err = parse(&json!({"audio_url": 3, "language": 1})).unwrap_err();
        assert!(
            err.contains("audio_url: must be a string, not a number") && err.contains("language: must be"),
            "{err}"
        );
        assert!(parse(&json!("audio")).is_err());
    }

    #[test]
    fn the_schema_is_the_input_type() {
        let schema = schema();
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["properties"]["language"]["enum"], json!(["en"]));
        assert_eq!(schema["properties"]["language"]["default"], json!("en"));
        assert_eq!(schema["properties"]["audio_url"]["minLength"], json!(1));
        assert_eq!(schema["properties"]["audio_url"]["type"], json!("string"));
        let description = schema["properties"]["audio"]["description"].as_str().unwrap();
        assert!(
            description.starts_with("The audio file itself, base64-encoded"),
            "{schema}"
        );
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }
}
