//! The inputs of the video models, validated before any work: every
//! failure is collected into one message, and a job with any of them fails
//! for good without being charged.

use serde_json::{Map, Value};

/// Bounds shared by the video models.
pub const MIN_SECONDS: f64 = 1.0;
pub const MAX_SECONDS: f64 = 20.0;
pub const MIN_FPS: u64 = 8;
pub const MAX_FPS: u64 = 30;
pub const MIN_SIDE: u64 = 64;
pub const MAX_SIDE: u64 = 512;
/// Sides are whole H.264 macroblocks.
pub const SIDE_MULTIPLE: u64 = 16;
pub const MIN_IMAGES: usize = 2;
pub const MAX_IMAGES: usize = 16;
pub const DEFAULT_SECONDS: f64 = 4.0;
pub const DEFAULT_FPS: u64 = 24;

/// What kind of request a model takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `faces-morph-video`: keyframes from a GAN's latent walk.
    LatentWalk { native_side: u32 },
    /// `interpolate-video`: keyframes from the caller's images.
    Images,
}

/// Where a keyframe image comes from: a URL fetched by the worker, or the
/// file's bytes (from a `data:` URL or plain base64).
pub type ImageSource = gantry_net::Source;

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub fps: u32,
    /// Frames of the video: `round(duration × fps)`, at least 2.
    pub frames: usize,
    /// The width and height; `None` for images: the first image's size.
    pub size: Option<(u32, u32)>,
    pub seed: Option<u64>,
    /// Latent walk: seconds between two faces.
    pub seconds_per_face: f64,
    pub images: Vec<ImageSource>,
}

impl Request {
    /// The duration as delivered: frames ÷ fps.
    pub fn duration(&self) -> f64 {
        self.frames as f64 / f64::from(self.fps)
    }
}

pub fn parse(input: &Value, kind: Kind) -> Result<Request, String> {
    let Some(map) = input.as_object() else {
        return Err("input must be a JSON object".into());
    };
    let mut errors = Vec::new();
    let allowed: &[&str] = match kind {
        Kind::LatentWalk { .. } => &[
            "prompt",
            "seed",
            "duration",
            "fps",
            "width",
            "height",
            "seconds_per_face",
        ],
        Kind::Images => &["images", "duration", "fps", "width", "height"],
    };
    for key in map.keys() {
        if !allowed.contains(&key.as_str()) {
            errors.push(format!(
                "unknown input field '{key}' (accepted: {})",
                allowed.join(", ")
            ));
        }
    }
    let seconds = number(map, "duration", MIN_SECONDS, MAX_SECONDS, &mut errors).unwrap_or(DEFAULT_SECONDS);
    let fps = integer(map, "fps", MIN_FPS, MAX_FPS, &mut errors).unwrap_or(DEFAULT_FPS) as u32;
    let width = side(map, "width", &mut errors);
    let height = side(map, "height", &mut errors);
    let mut seed = None;
    let mut seconds_per_face = 1.0;
    let mut images = Vec::new();
    let size = match kind {
        Kind::LatentWalk { native_side } => {
            if let Some(prompt) = map.get("prompt")
                && prompt.as_str().is_none_or(|p| p.chars().count() > 2000)
            {
                errors.push("prompt must be a string of at most 2000 characters".into());
            }
            seed = integer(map, "seed", 0, u64::MAX, &mut errors);
            seconds_per_face = number(map, "seconds_per_face", 0.25, 5.0, &mut errors).unwrap_or(1.0);
            let w = width.unwrap_or(256.max(native_side));
            let h = height.unwrap_or(w);
            if w != h {
                errors.push(format!(
                    "width and height must be equal: the faces are square (got {w}x{h})"
                ));
            }
            Some((w, h))
        }
        Kind::Images => {
            match map.get("images") {
                Some(Value::Array(list)) if (MIN_IMAGES..=MAX_IMAGES).contains(&list.len()) => {
                    for (i, item) in list.iter().enumerate() {
                        match item.as_str().map(|text| ImageSource::parse(text, "image")) {
                            Some(Ok(source)) => images.push(source),
                            Some(Err(e)) => errors.push(format!("images[{i}]: {e}")),
                            None => errors.push(format!("images[{i}] must be a string: a URL or base64")),
                        }
                    }
                }
                Some(Value::Array(list)) => errors.push(format!(
                    "images must hold {MIN_IMAGES} to {MAX_IMAGES} images (got {})",
                    list.len()
                )),
                Some(_) => errors.push("images must be an array of URLs or base64 strings".into()),
                None => errors.push("images is required: 2 to 16 images (URLs or base64)".into()),
            }
            match (width, height) {
                (Some(w), Some(h)) => Some((w, h)),
                (None, None) => None,
                _ => {
                    errors.push("give both width and height, or neither (the first image's size)".into());
                    None
                }
            }
        }
    };
    let frames = ((seconds * f64::from(fps)).round() as usize).max(2);
    if errors.is_empty() {
        Ok(Request {
            fps,
            frames,
            size,
            seed,
            seconds_per_face,
            images,
        })
    } else {
        Err(errors.join("; "))
    }
}

fn number(map: &Map<String, Value>, key: &str, min: f64, max: f64, errors: &mut Vec<String>) -> Option<f64> {
    let value = map.get(key)?;
    match value.as_f64() {
        Some(n) if n.is_finite() && (min..=max).contains(&n) => Some(n),
        _ => {
            errors.push(format!("{key} must be a number from {min} to {max} (got {value})"));
            None
        }
    }
}

fn integer(map: &Map<String, Value>, key: &str, min: u64, max: u64, errors: &mut Vec<String>) -> Option<u64> {
    let value = map.get(key)?;
    match value.as_u64() {
        Some(n) if (min..=max).contains(&n) => Some(n),
        _ => {
            errors.push(format!("{key} must be an integer from {min} to {max} (got {value})"));
            None
        }
    }
}

fn side(map: &Map<String, Value>, key: &str, errors: &mut Vec<String>) -> Option<u32> {
    let value = map.get(key)?;
    match value.as_u64() {
        Some(n) if (MIN_SIDE..=MAX_SIDE).contains(&n) && n % SIDE_MULTIPLE == 0 => Some(n as u32),
        _ => {
            errors.push(format!(
                "{key} must be a multiple of {SIDE_MULTIPLE} from {MIN_SIDE} to {MAX_SIDE} (got {value})"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const WALK: Kind = Kind::LatentWalk { native_side: 64 };

    #[test]
    fn defaults_fill_a_bare_request() {
        let r = parse(&json!({}), WALK).unwrap();
        assert_eq!((r.fps, r.frames, r.size, r.seed), (24, 96, Some((256, 256)), None));
        assert!((r.duration() - 4.0).abs() < 1e-9);
        let r = parse(
            &json!({"duration": 2.5, "fps": 10, "width": 128, "height": 128, "seed": 7}),
            WALK,
        )
        .unwrap();
        assert_eq!((r.frames, r.size, r.seed), (25, Some((128, 128)), Some(7)));
    }

    #[test]
    fn every_failure_is_reported_at_once() {
        let err = parse(
            &json!({"duration": 0, "fps": 100, "width": 100, "height": 64, "colour": "red"}),
            WALK,
        )
        .unwrap_err();
        for part in [
            "unknown input field 'colour'",
            "duration must be",
            "fps must be",
            "width must be a multiple of 16",
        ] {
            assert!(err.contains(part), "{err}");
        }
        let err = parse(&json!({"width": 128, "height": 64}), WALK).unwrap_err();
        assert!(err.contains("must be equal"), "{err}");
    }

    #[test]
    fn images_are_urls_data_urls_or_base64() {
        let r = parse(
            &json!({"images": ["https://example.com/a.png", "data:image/png;base64,iVBORw0K", "iVBORw0K"]}),
            Kind::Images,
        )
        .unwrap();
        assert_eq!(r.images[0], ImageSource::Url("https://example.com/a.png".into()));
        assert_eq!(r.images[1], r.images[2]);
        assert_eq!(r.size, None);
        let err = parse(&json!({"images": ["ftp://x", 3]}), Kind::Images).unwrap_err();
        assert!(
            err.contains("images[0]") && err.contains("images[1] must be a string"),
            "{err}"
        );
        let err = parse(&json!({"images": ["iVBORw0K"]}), Kind::Images).unwrap_err();
        assert!(err.contains("2 to 16"), "{err}");
        let err = parse(&json!({"images": ["iVBORw0K", "iVBORw0K"], "width": 64}), Kind::Images).unwrap_err();
        assert!(err.contains("both width and height"), "{err}");
        assert!(parse(&json!({"images": ["iVBORw0K", "iVBORw0K"], "seed": 1}), Kind::Images).is_err());
    }
}
