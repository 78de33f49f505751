//! Validation of a text-to-image job's input. Every problem is collected and
//! reported at once (joined with `"; "`) before any work is done.

use serde_json::{Map, Value};

use crate::pipeline::Variant;

/// Longest accepted prompt (and negative prompt), in characters.
pub const MAX_PROMPT_CHARS: usize = 2000;
/// Most images one job may ask for.
pub const MAX_IMAGES: u64 = 4;
/// Smallest side of an image.
pub const MIN_SIDE: u64 = 64;

const FIELDS: [&str; 9] = [
    "prompt",
    "negative_prompt",
    "width",
    "height",
    "num_images",
    "seed",
    "num_inference_steps",
    "guidance_scale",
    "output_format",
];

pub use gantry_media::image::Format;

/// What a variant accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub default_side: u64,
    pub max_side: u64,
    pub default_steps: u64,
    pub max_steps: u64,
    pub default_guidance: f64,
    /// `false`: guidance must be 0 (a distilled model).
    pub guidance: bool,
}

impl Limits {
    /// SD 1.5: 64 to 1024 a side (512 by default), 1 to 100 steps (30),
    /// guidance 0 to 20 (7.5). SD-Turbo: 64 to 1024 (512), 1 to 4 steps
    /// (1), guidance 0 only. SDXL: 64 to 1536 (1024), 1 to 100 steps (30),
    /// guidance 0 to 20 (5).
    pub fn of(variant: Variant) -> Self {
        match variant {
            Variant::V1_5 => Self {
                default_side: 512,
                max_side: 1024,
                default_steps: 30,
                max_steps: 100,
                default_guidance: 7.5,
                guidance: true,
            },
            Variant::Turbo => Self {
                default_side: 512,
                max_side: 1024,
                default_steps: 1,
                max_steps: 4,
                default_guidance: 0.0,
                guidance: false,
            },
            Variant::Xl => Self {
                default_side: 1024,
                max_side: 1536,
                default_steps: 30,
                max_steps: 100,
                default_guidance: 5.0,
                guidance: true,
            },
        }
    }
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: String,
    pub negative_prompt: String,
    pub width: u32,
    pub height: u32,
    pub num_images: usize,
    /// `None`: the worker picks one (and reports it).
    pub seed: Option<u64>,
    pub steps: usize,
    pub guidance_scale: f64,
    pub format: Format,
}

fn integer(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(53))
            .map(|f| f as u64)
    })
}

fn text(object: &Map<String, Value>, name: &str, required: bool, errors: &mut Vec<String>) -> String {
    match object.get(name) {
        None | Some(Value::Null) => {
            if required {
                errors.push(format!("{name}: required"));
            }
            String::new()
        }
        Some(Value::String(p)) if p.chars().count() > MAX_PROMPT_CHARS => {
            errors.push(format!("{name}: at most {MAX_PROMPT_CHARS} characters"));
            String::new()
        }
        Some(Value::String(p)) if required && p.trim().is_empty() => {
            errors.push(format!("{name}: must not be empty"));
            String::new()
        }
        Some(Value::String(p)) => p.clone(),
        Some(_) => {
            errors.push(format!("{name}: must be a string"));
            String::new()
        }
    }
}

/// Checks a job's input against what `variant` accepts.
pub fn parse(input: &Value, variant: Variant) -> Result<Request, String> {
    let limits = Limits::of(variant);
    let Some(object) = input.as_object() else {
        return Err("input must be a JSON object".into());
    };
    let mut errors = Vec::new();
    for key in object.keys() {
        if !FIELDS.contains(&key.as_str()) {
            errors.push(format!("unknown field `{key}` (accepted: {})", FIELDS.join(", ")));
        }
    }
    let prompt = text(object, "prompt", true, &mut errors);
    let negative_prompt = text(object, "negative_prompt", false, &mut errors);
    let side = |name: &str, errors: &mut Vec<String>| -> u32 {
        match object.get(name) {
            None | Some(Value::Null) => limits.default_side as u32,
            Some(v) => match integer(v).filter(|n| (MIN_SIDE..=limits.max_side).contains(n) && n.is_multiple_of(8)) {
                Some(n) => n as u32,
                None => {
                    errors.push(format!(
                        "{name}: a multiple of 8 from {MIN_SIDE} to {}",
                        limits.max_side
                    ));
                    0
                }
            },
        }
    };
    let width = side("width", &mut errors);
    let height = side("height", &mut errors);
    let num_images = match object.get("num_images") {
        None | Some(Value::Null) => 1,
        Some(v) => match integer(v).filter(|n| (1..=MAX_IMAGES).contains(n)) {
            Some(n) => n as usize,
            None => {
                errors.push(format!("num_images: an integer from 1 to {MAX_IMAGES}"));
                0
            }
        },
    };
    let seed = match object.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => match integer(v) {
            Some(n) => Some(n),
            None => {
                errors.push("seed: a non-negative integer below 2^53".into());
                None
            }
        },
    };
    let steps = match object.get("num_inference_steps") {
        None | Some(Value::Null) => limits.default_steps as usize,
        Some(v) => match integer(v).filter(|n| (1..=limits.max_steps).contains(n)) {
            Some(n) => n as usize,
            None => {
                errors.push(format!(
                    "num_inference_steps: an integer from 1 to {}",
                    limits.max_steps
                ));
                0
            }
        },
    };
    let guidance_scale = match object.get("guidance_scale") {
        None | Some(Value::Null) => limits.default_guidance,
        Some(v) => match v.as_f64() {
            Some(g) if !limits.guidance && g != 0.0 => {
                errors.push("guidance_scale: this distilled model runs without guidance; only 0 is accepted".into());
                0.0
            }
            Some(g) if (0.0..=20.0).contains(&g) => g,
            _ => {
                errors.push("guidance_scale: a number from 0 to 20".into());
                0.0
            }
        },
    };
    let format = Format::from_input(object.get("output_format"), &mut errors).unwrap_or(Format::Png);
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(Request {
        prompt,
        negative_prompt,
        width,
        height,
        num_images,
        seed,
        steps,
        guidance_scale,
        format,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_per_variant() {
        let r = parse(&json!({"prompt": "a cat"}), Variant::V1_5).unwrap();
        assert_eq!(
            (r.width, r.height, r.steps, r.guidance_scale, r.num_images),
            (512, 512, 30, 7.5, 1)
        );
        let r = parse(&json!({"prompt": "a cat"}), Variant::Turbo).unwrap();
        assert_eq!((r.width, r.steps, r.guidance_scale), (512, 1, 0.0));
        let r = parse(&json!({"prompt": "a cat"}), Variant::Xl).unwrap();
        assert_eq!((r.width, r.height, r.steps, r.guidance_scale), (1024, 1024, 30, 5.0));
        assert_eq!(r.format, Format::Png);
        assert_eq!(r.seed, None);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let input = json!({
            "width": 100, "height": 4096, "num_images": 9, "seed": -1,
            "num_inference_steps": 0, "guidance_scale": 21, "output_format": "gif", "colour": 1
        });
        let e = parse(&input, Variant::V1_5).unwrap_err();
        for part in [
            "prompt: required",
            "width:",
            "height:",
            "num_images:",
            "seed:",
            "num_inference_steps:",
            "guidance_scale:",
            "output_format:",
            "unknown field `colour`",
        ] {
            assert!(e.contains(part), "{part} missing from {e}");
        }
        assert_eq!(e.matches("; ").count(), 8, "{e}");
        let long = "x".repeat(MAX_PROMPT_CHARS + 1);
        assert!(
            parse(&json!({"prompt": long}), Variant::V1_5)
                .unwrap_err()
                .contains("at most 2000")
        );
    }

    #[test]
    fn turbo_limits() {
        let e = parse(
            &json!({"prompt": "a", "num_inference_steps": 5, "guidance_scale": 1.5}),
            Variant::Turbo,
        )
        .unwrap_err();
        assert!(e.contains("from 1 to 4") && e.contains("only 0"), "{e}");
        let r = parse(&json!({"prompt": "a", "num_inference_steps": 4, "guidance_scale": 0, "width": 64, "height": 96, "output_format": "webp", "seed": 7}), Variant::Turbo).unwrap();
        assert_eq!(
            (r.steps, r.width, r.height, r.format, r.seed),
            (4, 64, 96, Format::Webp, Some(7))
        );
        assert!(parse(&json!({"prompt": "a", "width": 1536}), Variant::Xl).is_ok());
        assert!(parse(&json!({"prompt": "a", "width": 1536}), Variant::V1_5).is_err());
    }
}
