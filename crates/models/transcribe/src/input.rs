//! A transcription job's input, checked field by field: every failure is
//! reported at once, before any work.
use gantry_net::Source;
use serde_json::Value;

/// Languages the loaded model can transcribe (tiny.en: English only).
pub const LANGUAGES: &[&str] = &["en"];

/// A valid request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub audio: Source,
    pub language: &'static str,
}

/// Checks `input`: exactly one of `audio_url` (http(s) or data: URL) and
/// `audio` (base64), an optional `language`, nothing else.
pub fn parse(input: &Value) -> Result<Request, String> {
    let Some(map) = input.as_object() else {
        return Err("the input must be a JSON object with audio_url or audio".into());
    };
    let mut errors = Vec::new();
    for key in map.keys() {
        if !matches!(key.as_str(), "audio_url" | "audio" | "language") {
            errors.push(format!("unknown field '{key}' (accepted: audio_url, audio, language)"));
        }
    }
    let mut field = |key: &str, allow_url: bool| match map.get(key) {
        None => None,
        Some(Value::String(text)) => {
            let parsed = Source::parse(text, "audio").and_then(|source| match source {
                Source::Url(_) if !allow_url => Err("give a URL as audio_url; audio takes base64".into()),
                other => Ok(other),
            });
            match parsed {
                Ok(source) => Some(source),
                Err(e) => {
                    errors.push(format!("{key}: {e}"));
                    None
                }
            }
        }
        Some(_) => {
            errors.push(format!("{key} must be a string"));
            None
        }
    };
    let url = field("audio_url", true);
    let inline = field("audio", false);
    let both = map.contains_key("audio_url") && map.contains_key("audio");
    let neither = !map.contains_key("audio_url") && !map.contains_key("audio");
    if both {
        errors.push("give either audio_url or audio, not both".into());
    }
    if neither {
        errors.push("audio_url or audio is required: the audio to transcribe".into());
    }
    let language = match map.get("language") {
        None | Some(Value::Null) => Some(LANGUAGES[0]),
        Some(Value::String(code)) => {
            let found = LANGUAGES.iter().copied().find(|l| l.eq_ignore_ascii_case(code.trim()));
            if found.is_none() {
                errors.push(format!(
                    "language '{code}' is not supported by this model (supported: {})",
                    LANGUAGES.join(", ")
                ));
            }
            found
        }
        Some(_) => {
            errors.push("language must be a string such as \"en\"".into());
            None
        }
    };
    match (url.or(inline), language) {
        (Some(audio), Some(language)) if errors.is_empty() => Ok(Request { audio, language }),
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
        let r = parse(&json!({"audio": "UklGRg==", "language": "EN"})).unwrap();
        assert_eq!(r.audio, Source::Bytes(b"RIFF".to_vec()));
        let r = parse(&json!({"audio_url": "data:audio/wav;base64,UklGRg=="})).unwrap();
        assert_eq!(r.audio, Source::Bytes(b"RIFF".to_vec()));
    }

    #[test]
    fn every_failure_is_reported_at_once() {
        let err = parse(&json!({"audio": "%%%", "language": "fr", "prompt": "x"})).unwrap_err();
        for part in [
            "unknown field 'prompt'",
            "audio: not an http(s) URL",
            "language 'fr' is not supported",
        ] {
            assert!(err.contains(part), "{part} missing from: {err}");
        }
        let err = parse(&json!({})).unwrap_err();
        assert!(err.contains("audio_url or audio is required"), "{err}");
        let err = parse(&json!({"audio_url": "https://a/b.wav", "audio": "UklGRg=="})).unwrap_err();
        assert!(err.contains("not both"), "{err}");
        let err = parse(&json!({"audio": "https://a/b.wav"})).unwrap_err();
        assert!(err.contains("give a URL as audio_url"), "{err}");
        let err = parse(&json!({"audio_url": 3, "language": 1})).unwrap_err();
        assert!(
            err.contains("audio_url must be a string") && err.contains("language must be"),
            "{err}"
        );
        assert!(parse(&json!("audio")).is_err());
    }
}
