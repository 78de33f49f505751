//! The inputs of the video models: one typed struct per kind of model
//! ([`WalkInput`], [`ImagesInput`]), each both the parser (every failure
//! reported at once, before any work; a job with any of them fails for good
//! without being charged) and that model's input schema.

use gantry_input::{Between, Chars, Items, Real};
use gantry_manifest::ModelEntry;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

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
/// The side of a latent walk's video when none is given (or the faces' own,
/// if larger).
pub const DEFAULT_WALK_SIDE: u32 = 256;

gantry_input::bounds! {
    /// Seconds of video.
    pub Seconds: 1.0..=20.0;
    /// Seconds from one face of a latent walk to the next.
    pub FacePace: 0.25..=5.0;
}

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

// The input of a latent walk (`engine.keyframes = "dcgan"`).
/// A face-morphing video's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WalkInput {
    /// Accepted for compatibility; the faces are unconditional.
    #[serde(default)]
    #[schema(inline)]
    pub prompt: Option<Chars<2000>>,
    /// Same seed, same bytes. Picked at random (and returned) when absent.
    #[serde(default)]
    #[schema(value_type = u64)]
    pub seed: Option<u64>,
    /// Seconds of video; the frames are round(duration x fps). Billed per
    /// started block of the seconds the model's price is for.
    #[serde(default)]
    #[schema(inline, default = 4.0)]
    pub duration: Option<Real<Seconds>>,
    /// Frames per second.
    #[serde(default)]
    #[schema(inline, default = 24)]
    pub fps: Option<Between<{ MIN_FPS }, { MAX_FPS }>>,
    /// Side of the square video; must equal height. Faces are drawn at the
    /// generator's own side (64x64 for DigiFace-1M's DCGAN) and resized
    /// (Lanczos, 3 lobes).
    #[serde(default)]
    #[schema(inline, default = 256)]
    pub width: Option<Side>,
    /// Must equal width; when absent, it is width.
    #[serde(default)]
    #[schema(inline, default = 256)]
    pub height: Option<Side>,
    /// Seconds from one face of the walk to the next.
    #[serde(default)]
    #[schema(inline, default = 1.0)]
    pub seconds_per_face: Option<Real<FacePace>>,
}

// The input of an image-to-video model (`engine.keyframes = "images"`).
/// An image-to-video job's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImagesInput {
    /// The keyframes, evenly spaced: the first is the first frame, the last
    /// the last frame.
    #[schema(inline)]
    pub images: Items<Keyframe, { MIN_IMAGES }, { MAX_IMAGES }>,
    /// Seconds of video; the frames are round(duration x fps). Billed per
    /// started block of the seconds the model's price is for.
    #[serde(default)]
    #[schema(inline, default = 4.0)]
    pub duration: Option<Real<Seconds>>,
    /// Frames per second.
    #[serde(default)]
    #[schema(inline, default = 24)]
    pub fps: Option<Between<{ MIN_FPS }, { MAX_FPS }>>,
    /// With height: the video's size (images are resized to it, Lanczos 3
    /// lobes, without keeping their aspect). Default: the first image's
    /// size, fitted into 512x512 and rounded to multiples of 16. Give both
    /// or neither.
    #[serde(default)]
    #[schema(inline)]
    pub width: Option<Side>,
    /// With width.
    #[serde(default)]
    #[schema(inline)]
    pub height: Option<Side>,
}

/// An http(s) URL, a data: URL (base64) or plain base64 of a PNG, JPEG or
/// WebP image (at most 20 MiB, 4096 pixels a side).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
pub struct Keyframe(pub String);

/// A side of a video: whole macroblocks, from 64 to 512 pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side(pub u32);

impl<'de> Deserialize<'de> for Side {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        match Between::<{ MIN_SIDE }, { MAX_SIDE }>::deserialize(&value) {
            Ok(Between(n)) if n % SIDE_MULTIPLE == 0 => Ok(Self(n as u32)),
            _ => Err(de::Error::custom(format!(
                "must be a multiple of {SIDE_MULTIPLE} from {MIN_SIDE} to {MAX_SIDE} (got {value})"
            ))),
        }
    }
}

impl PartialSchema for Side {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(MIN_SIDE))
            .maximum(Some(MAX_SIDE))
            .multiple_of(Some(SIDE_MULTIPLE))
            .into()
    }
}

impl ToSchema for Side {}

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

/// The input schema the API serves for the video model of `entry`: a latent
/// walk's for `engine.keyframes = "dcgan"`, else an image-to-video one's.
pub fn schema(entry: &ModelEntry) -> Value {
    let mut schema = match entry.engine.get("keyframes").and_then(Value::as_str) {
        Some("dcgan") => gantry_input::schema_of::<WalkInput>(),
        _ => gantry_input::schema_of::<ImagesInput>(),
    };
    schema["properties"]["duration"]["description"] = Value::String(format!(
        "Seconds of video; the frames are round(duration x fps). Billed per started {} s block.",
        entry.price.per()
    ));
    schema
}

/// Reads `input` as the input type of `kind`, then the rules between its
/// members: a latent walk's video is square; an image-to-video one has both
/// sides or neither, and each image is a URL or base64.
pub fn parse(input: &Value, kind: Kind) -> Result<Request, String> {
    let sentence = |failures: Vec<gantry_input::Failure>| gantry_input::sentence(&failures);
    let mut errors = Vec::new();
    let mut request = Request {
        fps: 0,
        frames: 0,
        size: None,
        seed: None,
        seconds_per_face: 1.0,
        images: Vec::new(),
    };
    let (seconds, fps) = match kind {
        Kind::LatentWalk { native_side } => {
            let input: WalkInput = gantry_input::read(input.clone()).map_err(sentence)?;
            let w = input.width.map_or(DEFAULT_WALK_SIDE.max(native_side), |w| w.0);
            let h = input.height.map_or(w, |h| h.0);
            if w != h {
                errors.push(format!(
                    "width and height must be equal: the faces are square (got {w}x{h})"
                ));
            }
            request.size = Some((w, h));
            request.seed = input.seed;
            request.seconds_per_face = input.seconds_per_face.map_or(1.0, |s| s.0);
            (input.duration, input.fps)
        }
        Kind::Images => {
            let input: ImagesInput = gantry_input::read(input.clone()).map_err(sentence)?;
            for (i, Keyframe(text)) in input.images.0.iter().enumerate() {
                match ImageSource::parse(text, "image") {
                    Ok(source) => request.images.push(source),
                    Err(e) => errors.push(format!("images.{i}: {e}")),
                }
            }
            request.size = match (input.width, input.height) {
                (Some(w), Some(h)) => Some((w.0, h.0)),
                (None, None) => None,
                _ => {
                    errors.push("give both width and height, or neither (the first image's size)".into());
                    None
                }
            };
            (input.duration, input.fps)
        }
    };
    request.fps = fps.map_or(DEFAULT_FPS, |f| f.0) as u32;
    let seconds = seconds.map_or(DEFAULT_SECONDS, |s| s.0);
    request.frames = ((seconds * f64::from(request.fps)).round() as usize).max(2);
    if errors.is_empty() {
        Ok(request)
    } else {
        Err(errors.join("; "))
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
        assert!((r.seconds_per_face - 1.0).abs() < 1e-9);
        let r = parse(
            &json!({"duration": 2.5, "fps": 10, "width": 128, "height": 128, "seed": 7, "seconds_per_face": 0.5}),
            WALK,
        )
        .unwrap();
        assert_eq!((r.frames, r.size, r.seed), (25, Some((128, 128)), Some(7)));
        assert!((r.seconds_per_face - 0.5).abs() < 1e-9);
        // An absent height is the width.
        assert_eq!(parse(&json!({"width": 128}), WALK).unwrap().size, Some((128, 128)));
    }

    #[test]
    fn every_failure_is_reported_at_once() {
        let err = parse(
            &json!({"duration": 0, "fps": 100, "width": 100, "height": 64, "colour": "red",
                    "seed": -1, "seconds_per_face": 6, "prompt": 1}),
            WALK,
        )
        .unwrap_err();
        for part in [
            "colour: unknown property",
            "duration: must be a number from 1 to 20 (got 0)",
            "fps: must be an integer from 8 to 30 (got 100)",
            "width: must be a multiple of 16 from 64 to 512 (got 100)",
            "seed: must be an integer from 0 to 18446744073709551615 (got -1)",
            "seconds_per_face: must be a number from 0.25 to 5 (got 6)",
            "prompt: must be a string, not a number",
        ] {
            assert!(err.contains(part), "{part} missing from {err}");
        }
        let err = parse(&json!({"width": 128, "height": 64}), WALK).unwrap_err();
        assert_eq!(err, "width and height must be equal: the faces are square (got 128x64)");
        let err = parse(&json!({"images": ["iVBORw0K", "iVBORw0K"]}), WALK).unwrap_err();
        assert_eq!(err, "images: unknown property");
        assert_eq!(
            parse(&json!("x"), WALK).unwrap_err(),
            "must be a JSON object, not a string"
        );
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
        let err = parse(&json!({"images": ["ftp://x", "%%%"]}), Kind::Images).unwrap_err();
        assert!(err.starts_with("images.0: ") && err.contains("; images.1: "), "{err}");
        let err = parse(&json!({"images": ["iVBORw0K", 3]}), Kind::Images).unwrap_err();
        assert_eq!(err, "images.1: must be a string, not a number");
        let err = parse(&json!({"images": ["iVBORw0K"]}), Kind::Images).unwrap_err();
        assert_eq!(err, "images: must be an array of 2 to 16 entries (got 1)");
        let err = parse(&json!({}), Kind::Images).unwrap_err();
        assert_eq!(err, "images: required property is missing");
        let err = parse(&json!({"images": ["iVBORw0K", "iVBORw0K"], "width": 64}), Kind::Images).unwrap_err();
        assert!(err.contains("both width and height"), "{err}");
        let err = parse(&json!({"images": ["iVBORw0K", "iVBORw0K"], "seed": 1}), Kind::Images).unwrap_err();
        assert_eq!(err, "seed: unknown property");
        let r = parse(
            &json!({"images": ["iVBORw0K", "iVBORw0K"], "width": 320, "height": 96.0, "fps": 8}),
            Kind::Images,
        )
        .unwrap();
        assert_eq!((r.size, r.frames), (Some((320, 96)), 32));
    }

    fn builtin(id: &str) -> Value {
        use gantry_worker_sdk::factory::ModelFactory;
        let entry = gantry_manifest::Manifest::builtin().get(id).unwrap();
        assert!(crate::VideoFactory::accepts(entry), "{id}");
        let schema = schema(entry);
        assert_eq!(crate::VideoFactory::input_schema(entry), schema);
        schema
    }

    /// A number member's minimum, maximum and default.
    fn numbers(member: &Value) -> [Option<f64>; 3] {
        ["minimum", "maximum", "default"].map(|key| member[key].as_f64())
    }

    /// The facts both entries' schemas state (those of the schemas the
    /// manifest entries once had written out).
    fn common(schema: &Value) {
        assert_eq!(schema["type"], json!("object"));
        assert_eq!(schema["additionalProperties"], json!(false));
        let p = &schema["properties"];
        assert_eq!(p["duration"]["type"], json!("number"));
        assert_eq!(numbers(&p["duration"]), [Some(1.0), Some(20.0), Some(4.0)]);
        assert!(
            p["duration"]["description"]
                .as_str()
                .unwrap()
                .contains("round(duration x fps)")
        );
        assert!(
            p["duration"]["description"]
                .as_str()
                .unwrap()
                .ends_with("Billed per started 5 s block."),
            "{schema}"
        );
        assert_eq!(p["fps"]["type"], json!("integer"));
        assert_eq!(
            (&p["fps"]["minimum"], &p["fps"]["maximum"], &p["fps"]["default"]),
            (&json!(8), &json!(30), &json!(24))
        );
        for side in ["width", "height"] {
            let member = &p[side];
            assert_eq!(member["type"], json!("integer"), "{side}");
            assert_eq!(
                (&member["minimum"], &member["maximum"], &member["multipleOf"]),
                (&json!(64), &json!(512), &json!(16)),
                "{side}"
            );
        }
        let whole = schema.to_string();
        assert!(!whole.contains("$ref") && !whole.contains("oneOf"), "{whole}");
    }

    #[test]
    fn the_latent_walk_schema_states_the_old_facts() {
        let schema = builtin("faces-morph-video");
        common(&schema);
        let p = &schema["properties"];
        let mut names: Vec<&String> = p.as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(
            names,
            [
                "duration",
                "fps",
                "height",
                "prompt",
                "seconds_per_face",
                "seed",
                "width"
            ]
        );
        assert!(schema.get("required").is_none_or(|r| r == &json!([])), "{schema}");
        assert_eq!(p["prompt"]["type"], json!("string"));
        assert_eq!(p["prompt"]["maxLength"], json!(2000));
        assert_eq!(p["seed"]["type"], json!("integer"));
        assert_eq!(p["seed"]["minimum"], json!(0));
        assert_eq!(
            (&p["width"]["default"], &p["height"]["default"]),
            (&json!(256), &json!(256))
        );
        assert!(
            p["width"]["description"]
                .as_str()
                .unwrap()
                .contains("must equal height")
        );
        assert_eq!(numbers(&p["seconds_per_face"]), [Some(0.25), Some(5.0), Some(1.0)]);
    }

    #[test]
    fn the_image_to_video_schema_needs_images() {
        let schema = builtin("interpolate-video");
        common(&schema);
        let p = &schema["properties"];
        let mut names: Vec<&String> = p.as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(names, ["duration", "fps", "height", "images", "width"]);
        assert_eq!(schema["required"], json!(["images"]));
        let images = &p["images"];
        assert_eq!(images["type"], json!("array"));
        assert_eq!((&images["minItems"], &images["maxItems"]), (&json!(2), &json!(16)));
        assert_eq!(images["items"]["type"], json!("string"));
        let item = images["items"]["description"].as_str().unwrap();
        assert!(item.contains("data: URL") && item.contains("20 MiB"), "{schema}");
        assert!(
            images["description"]
                .as_str()
                .unwrap()
                .starts_with("The keyframes, evenly spaced")
        );
        assert!(p["width"].get("default").is_none(), "{schema}");
        assert!(
            p["width"]["description"]
                .as_str()
                .unwrap()
                .contains("the first image's")
        );
    }
}
