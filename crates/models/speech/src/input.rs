//! The job input of a speech model.

use serde_json::Value;

use crate::formats::Format;

/// Longest accepted prompt, in characters (Unicode scalar values).
pub const MAX_PROMPT_CHARS: usize = 5000;
/// Accepted range of `speed`.
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.5..=2.0;

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

/// Checks `input` against the model's one voice; every problem is reported,
/// joined by `"; "`.
pub fn parse(input: &Value, voice: &str) -> Result<Request, String> {
    let Some(object) = input.as_object() else {
        return Err("the input must be a JSON object".to_owned());
    };
    let mut problems = Vec::new();
    for key in object.keys() {
        if !matches!(
            key.as_str(),
            "prompt" | "voice" | "speed" | "format" | "reference_audio"
        ) {
            problems.push(format!(
                "unknown field '{key}' (accepted: prompt, voice, speed, format, reference_audio)"
            ));
        }
    }
    let field = |name: &str| object.get(name).filter(|v| !v.is_null());

    let mut prompt = String::new();
    match field("prompt") {
        None => problems.push("'prompt' is required: the text to speak".to_owned()),
        Some(Value::String(text)) => {
            let count = text.chars().count();
            if text.trim().is_empty() {
                problems.push("'prompt' is empty: give the text to speak".to_owned());
            } else if text.contains('\0') {
                problems.push("'prompt' contains a NUL character".to_owned());
            } else if count > MAX_PROMPT_CHARS {
                problems.push(format!(
                    "'prompt' is {count} characters long; at most {MAX_PROMPT_CHARS} are accepted (split longer text into several jobs)"
                ));
            } else {
                prompt = text.clone();
            }
        }
        Some(_) => problems.push("'prompt' must be a string".to_owned()),
    }
    match field("voice") {
        None => {}
        Some(Value::String(v)) if v == voice => {}
        Some(Value::String(v)) => problems.push(format!(
            "unknown voice '{v}': this model speaks only with voice '{voice}'"
        )),
        Some(_) => problems.push(format!("'voice' must be a string (this model's voice is '{voice}')")),
    }
    let mut speed = 1.0f32;
    match field("speed") {
        None => {}
        Some(Value::Number(n)) => match n.as_f64() {
            Some(s) if SPEED_RANGE.contains(&s) => speed = s as f32,
            _ => problems.push(format!(
                "'speed' must be from {} to {}, got {n}",
                SPEED_RANGE.start(),
                SPEED_RANGE.end()
            )),
        },
        Some(_) => problems.push("'speed' must be a number".to_owned()),
    }
    let mut format = Format::Wav;
    match field("format") {
        None => {}
        Some(Value::String(f)) => match Format::parse(f) {
            Some(known) => format = known,
            None if f == "mp3" => problems.push(
                "format 'mp3' is not produced (its one maintained encoder, LAME, is LGPL); use 'ogg' for a small file or 'flac' for a lossless one".to_owned(),
            ),
            None => problems.push(format!(
                "unsupported format '{f}' (accepted: {})",
                Format::NAMES.join(", ")
            )),
        },
        Some(_) => problems.push(format!("'format' must be a string: one of {}", Format::NAMES.join(", "))),
    }
    let reference_audio = match field("reference_audio") {
        None => None,
        Some(Value::String(text)) => match gantry_net::Source::parse(text, "reference_audio") {
            Ok(source) => Some(source),
            Err(e) => {
                problems.push(format!("'reference_audio': {e}"));
                None
            }
        },
        Some(_) => {
            problems.push(
                "'reference_audio' must be a string: an http(s) URL, a data: URL or base64 of a WAV, MP3, FLAC or Ogg file"
                    .to_owned(),
            );
            None
        }
    };
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let characters = prompt.chars().count() as u64;
    Ok(Request {
        prompt,
        characters,
        speed,
        format,
        reference_audio,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_and_accepted_values() {
        let r = parse(&json!({"prompt": "Héllo"}), "joe").unwrap();
        assert_eq!((r.prompt.as_str(), r.characters, r.speed), ("Héllo", 5, 1.0));
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
            &json!({"prompt": "x", "voice": null, "speed": 0.5, "format": null}),
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
        assert_eq!(parse(&json!({"prompt": "x"}), "joe").unwrap().reference_audio, None);
        let err = parse(&json!({"prompt": "x", "reference_audio": "@@"}), "joe").unwrap_err();
        assert!(err.contains("'reference_audio': not an http(s) URL"), "{err}");
        let err = parse(&json!({"prompt": "x", "reference_audio": 3}), "joe").unwrap_err();
        assert!(err.contains("'reference_audio' must be a string"), "{err}");
    }

    #[test]
    fn every_problem_is_reported() {
        let err = parse(
            &json!({"prompt": "", "voice": "amy", "speed": 9, "format": "mp3", "pitch": 1}),
            "joe",
        )
        .unwrap_err();
        for needle in [
            "'pitch'",
            "'prompt' is empty",
            "unknown voice 'amy'",
            "'speed' must be from 0.5 to 2",
            "'mp3'",
        ] {
            assert!(err.contains(needle), "{needle} in {err}");
        }
        assert!(parse(&json!({}), "joe").unwrap_err().contains("'prompt' is required"));
        assert!(parse(&json!("text"), "joe").unwrap_err().contains("JSON object"));
        assert!(parse(&json!({"prompt": "  \n"}), "joe").is_err());
        assert!(parse(&json!({"prompt": 3}), "joe").is_err());
        assert!(parse(&json!({"prompt": "a\u{0}b"}), "joe").unwrap_err().contains("NUL"));
        assert!(parse(&json!({"prompt": "x", "speed": "fast"}), "joe").is_err());
        assert!(parse(&json!({"prompt": "x", "speed": 0.49}), "joe").is_err());
        assert!(
            parse(&json!({"prompt": "x", "format": "aiff"}), "joe")
                .unwrap_err()
                .contains("accepted: wav, flac, ogg")
        );
        assert!(
            parse(&json!({"prompt": "x", "format": "mp3"}), "joe")
                .unwrap_err()
                .contains("LGPL")
        );
        let too_long = "é".repeat(MAX_PROMPT_CHARS + 1);
        assert!(
            parse(&json!({"prompt": too_long}), "joe")
                .unwrap_err()
                .contains("5001 characters")
        );
    }
}
