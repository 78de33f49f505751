//! A text-to-image job's input: one typed struct that is both the parser
//! (every failure reported at once, before any work) and the model's input
//! schema. What depends on the variant (the largest side, the most steps,
//! guidance at all) is checked once the members are well formed, and filled
//! into the schema of an entry from its `engine.variant`.

use gantry_input::{AtLeast, Between, Chars, Real};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

pub use gantry_media::image::Format;

use crate::pipeline::Variant;

/// Longest accepted prompt (and negative prompt), in characters.
pub const MAX_PROMPT_CHARS: usize = 2000;
/// Most images one job may ask for.
pub const MAX_IMAGES: u64 = 4;
/// Smallest side of an image.
pub const MIN_SIDE: u64 = 64;
/// Largest seed: 2^53 - 1, a number the caller can send back exactly.
pub const MAX_SEED: u64 = (1 << 53) - 1;

gantry_input::bounds! {
    /// Classifier-free guidance, where a variant takes it.
    pub Guidance: 0.0..=20.0;
}

/// A text-to-image job's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// What to draw; not blank.
    #[schema(inline)]
    pub prompt: Chars<{ MAX_PROMPT_CHARS }>,
    /// What the images should not show: the other side of classifier-free
    /// guidance (used when guidance_scale is above 1). Empty by default.
    #[serde(default)]
    #[schema(inline)]
    pub negative_prompt: Option<Chars<{ MAX_PROMPT_CHARS }>>,
    /// Width of each image in pixels, a multiple of 8.
    #[serde(default)]
    #[schema(inline)]
    pub width: Option<AtLeast<{ MIN_SIDE }>>,
    /// Height of each image in pixels, a multiple of 8.
    #[serde(default)]
    #[schema(inline)]
    pub height: Option<AtLeast<{ MIN_SIDE }>>,
    /// How many images to make, each from its own noise; every delivered
    /// pixel is billed.
    #[serde(default)]
    #[schema(inline, default = 1)]
    pub num_images: Option<Between<1, { MAX_IMAGES }>>,
    /// The seed: image i starts from the noise of seed + i, so the same seed
    /// and input give the same images. A random one when absent; the output
    /// reports it.
    #[serde(default)]
    #[schema(inline)]
    pub seed: Option<Between<0, { MAX_SEED }>>,
    /// Denoising steps: more are slower and finer.
    #[serde(default)]
    #[schema(inline)]
    pub num_inference_steps: Option<AtLeast<1>>,
    /// How closely the images follow the prompt (classifier-free guidance);
    /// at 1 or below it is off.
    #[serde(default)]
    #[schema(inline)]
    pub guidance_scale: Option<Real<Guidance>>,
    /// PNG, JPEG (quality 90) or lossless WebP; jpg is taken for jpeg, in
    /// any case.
    #[serde(default)]
    #[schema(inline, default = "png")]
    pub output_format: Option<Format>,
}

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

/// The input schema the API serves for a model of `variant` (the entry's
/// `engine.variant`): the input type's, with the variant's bounds and
/// defaults; without a variant, the type's alone.
pub fn schema(variant: Option<Variant>) -> Value {
    let mut schema = gantry_input::schema_of::<Input>();
    let properties = &mut schema["properties"];
    for side in ["width", "height"] {
        properties[side]["multipleOf"] = json!(8);
    }
    let Some(variant) = variant else {
        return schema;
    };
    let limits = Limits::of(variant);
    let properties = &mut schema["properties"];
    for side in ["width", "height"] {
        properties[side]["maximum"] = json!(limits.max_side);
        properties[side]["default"] = json!(limits.default_side);
    }
    properties["num_inference_steps"]["maximum"] = json!(limits.max_steps);
    properties["num_inference_steps"]["default"] = json!(limits.default_steps);
    let guidance = &mut properties["guidance_scale"];
    if limits.guidance {
        guidance["default"] = json!(limits.default_guidance);
    } else {
        guidance["maximum"] = json!(0);
        guidance["default"] = json!(0);
        guidance["description"] = json!("This distilled model runs without guidance: only 0 is accepted.");
    }
    schema
}

/// Reads `input` as [`Input`], then what `variant` accepts: its largest
/// side, its most steps, and whether it takes guidance.
pub fn parse(input: &Value, variant: Variant) -> Result<Request, String> {
    let limits = Limits::of(variant);
    let input: Input = gantry_input::read(input.clone()).map_err(|failures| gantry_input::sentence(&failures))?;
    let mut errors = Vec::new();
    if input.prompt.as_str().trim().is_empty() {
        errors.push("prompt: must not be empty".to_owned());
    }
    let mut side = |name: &str, given: Option<AtLeast<{ MIN_SIDE }>>| match given {
        None => limits.default_side as u32,
        Some(AtLeast(n)) if n <= limits.max_side && n.is_multiple_of(8) => n as u32,
        Some(AtLeast(n)) => {
            errors.push(format!(
                "{name}: must be a multiple of 8 from {MIN_SIDE} to {} (got {n})",
                limits.max_side
            ));
            0
        }
    };
    let width = side("width", input.width);
    let height = side("height", input.height);
    let steps = match input.num_inference_steps {
        None => limits.default_steps as usize,
        Some(AtLeast(n)) if n <= limits.max_steps => n as usize,
        Some(AtLeast(n)) => {
            errors.push(format!(
                "num_inference_steps: must be an integer from 1 to {} (got {n})",
                limits.max_steps
            ));
            0
        }
    };
    let guidance_scale = match input.guidance_scale {
        None => limits.default_guidance,
        Some(g) if !limits.guidance && g.0 != 0.0 => {
            errors.push("guidance_scale: this distilled model runs without guidance; only 0 is accepted".into());
            0.0
        }
        Some(g) => g.0,
    };
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(Request {
        prompt: input.prompt.0,
        negative_prompt: input.negative_prompt.map(|text| text.0).unwrap_or_default(),
        width,
        height,
        num_images: input.num_images.map_or(1, |Between(n)| n as usize),
        seed: input.seed.map(|Between(seed)| seed),
        steps,
        guidance_scale,
        format: input.output_format.unwrap_or(Format::Png),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sorted(message: String) -> Vec<String> {
        let mut parts: Vec<String> = message.split("; ").map(str::to_owned).collect();
        parts.sort();
        parts
    }

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
        assert_eq!(r.negative_prompt, "");
        // Null is absent; whole floats are integers; the format in any case.
        let r = parse(
            &json!({"prompt": "a cat", "negative_prompt": "dogs", "width": 256.0, "height": null, "seed": 9007199254740991u64,
                    "num_images": 2, "guidance_scale": 3, "output_format": "JPG"}),
            Variant::V1_5,
        )
        .unwrap();
        assert_eq!(
            (r.width, r.height, r.seed, r.num_images, r.guidance_scale, r.format),
            (256, 512, Some(MAX_SEED), 2, 3.0, Format::Jpeg)
        );
        assert_eq!((r.prompt.as_str(), r.negative_prompt.as_str()), ("a cat", "dogs"));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let input = json!({
            "width": 10, "height": 4096.5, "num_images": 9, "seed": -1,
            "num_inference_steps": 0, "guidance_scale": 21, "output_format": "gif", "colour": 1
        });
        let e = parse(&input, Variant::V1_5).unwrap_err();
        assert_eq!(
            sorted(e),
            [
                "colour: unknown property",
                "guidance_scale: must be a number from 0 to 20 (got 21)",
                "height: must be an integer of at least 64 (got 4096.5)",
                "num_images: must be an integer from 1 to 4 (got 9)",
                "num_inference_steps: must be an integer of at least 1 (got 0)",
                "output_format: must be one of png, jpeg, webp (got 'gif')",
                "prompt: required property is missing",
                "seed: must be an integer from 0 to 9007199254740991 (got -1)",
                "width: must be an integer of at least 64 (got 10)",
            ]
        );
        let long = "x".repeat(MAX_PROMPT_CHARS + 1);
        assert_eq!(
            sorted(
                parse(
                    &json!({"prompt": long, "negative_prompt": 3, "output_format": 1}),
                    Variant::V1_5
                )
                .unwrap_err()
            ),
            [
                "negative_prompt: must be a string, not a number",
                "output_format: must be a string, not a number",
                "prompt: must be a string of at most 2000 characters (got 2001)",
            ]
        );
        // The variant's rules, once the members are well formed.
        assert_eq!(
            sorted(
                parse(
                    &json!({"prompt": "  ", "width": 1100, "height": 100, "num_inference_steps": 101}),
                    Variant::V1_5
                )
                .unwrap_err()
            ),
            [
                "height: must be a multiple of 8 from 64 to 1024 (got 100)",
                "num_inference_steps: must be an integer from 1 to 100 (got 101)",
                "prompt: must not be empty",
                "width: must be a multiple of 8 from 64 to 1024 (got 1100)",
            ]
        );
        assert_eq!(
            parse(&json!({"prompt": null}), Variant::V1_5).unwrap_err(),
            "prompt: must be a string, not null"
        );
        assert_eq!(
            parse(&json!("a cat"), Variant::V1_5).unwrap_err(),
            "must be a JSON object, not a string"
        );
    }

    #[test]
    fn turbo_limits() {
        let e = parse(
            &json!({"prompt": "a", "num_inference_steps": 5, "guidance_scale": 1.5}),
            Variant::Turbo,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "num_inference_steps: must be an integer from 1 to 4 (got 5); \
             guidance_scale: this distilled model runs without guidance; only 0 is accepted"
        );
        let r = parse(&json!({"prompt": "a", "num_inference_steps": 4, "guidance_scale": 0, "width": 64, "height": 96, "output_format": "webp", "seed": 7}), Variant::Turbo).unwrap();
        assert_eq!(
            (r.steps, r.width, r.height, r.format, r.seed),
            (4, 64, 96, Format::Webp, Some(7))
        );
        assert!(parse(&json!({"prompt": "a", "width": 1536}), Variant::Xl).is_ok());
        assert!(parse(&json!({"prompt": "a", "width": 1536}), Variant::V1_5).is_err());
    }

    #[test]
    fn the_schema_states_what_each_variant_accepts() {
        let v15 = schema(Some(Variant::V1_5));
        assert_eq!(v15["type"], json!("object"));
        assert_eq!(v15["required"], json!(["prompt"]));
        assert_eq!(v15["additionalProperties"], json!(false));
        let properties = &v15["properties"];
        let mut names: Vec<&str> = properties.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "guidance_scale",
                "height",
                "negative_prompt",
                "num_images",
                "num_inference_steps",
                "output_format",
                "prompt",
                "seed",
                "width"
            ]
        );
        assert_eq!(properties["prompt"]["maxLength"], json!(2000), "{v15}");
        assert_eq!(properties["prompt"]["type"], json!("string"));
        assert!(
            properties["prompt"]["description"]
                .as_str()
                .unwrap()
                .starts_with("What to draw")
        );
        assert_eq!(properties["negative_prompt"]["maxLength"], json!(2000));
        for side in ["width", "height"] {
            assert_eq!(properties[side]["type"], json!("integer"));
            assert_eq!(properties[side]["minimum"], json!(64));
            assert_eq!(properties[side]["maximum"], json!(1024));
            assert_eq!(properties[side]["multipleOf"], json!(8), "{v15}");
            assert_eq!(properties[side]["default"], json!(512));
        }
        assert_eq!(properties["num_images"]["minimum"], json!(1));
        assert_eq!(properties["num_images"]["maximum"], json!(4));
        assert_eq!(properties["num_images"]["default"], json!(1));
        assert_eq!(properties["seed"]["minimum"], json!(0));
        assert_eq!(properties["seed"]["maximum"], json!(MAX_SEED));
        let steps = &properties["num_inference_steps"];
        assert_eq!(
            (&steps["minimum"], &steps["maximum"], &steps["default"]),
            (&json!(1), &json!(100), &json!(30))
        );
        let guidance = &properties["guidance_scale"];
        assert_eq!(guidance["type"], json!("number"));
        assert_eq!(
            (&guidance["minimum"], &guidance["maximum"]),
            (&json!(0), &json!(20)),
            "{v15}"
        );
        assert_eq!(guidance["default"], json!(7.5));
        assert_eq!(properties["output_format"]["enum"], json!(["png", "jpeg", "webp"]));
        assert_eq!(properties["output_format"]["default"], json!("png"));
        assert!(!v15.to_string().contains("$ref"), "{v15}");

        let turbo = schema(Some(Variant::Turbo));
        let properties = &turbo["properties"];
        assert_eq!(properties["width"]["maximum"], json!(1024));
        assert_eq!(properties["num_inference_steps"]["maximum"], json!(4));
        assert_eq!(properties["num_inference_steps"]["default"], json!(1));
        assert_eq!(properties["guidance_scale"]["maximum"], json!(0));
        assert!(
            properties["guidance_scale"]["description"]
                .as_str()
                .unwrap()
                .contains("only 0")
        );
        let xl = schema(Some(Variant::Xl));
        assert_eq!(xl["properties"]["width"]["maximum"], json!(1536));
        assert_eq!(xl["properties"]["height"]["default"], json!(1024));
        assert_eq!(xl["properties"]["guidance_scale"]["default"], json!(5.0));
        // Without a variant: the type's own bounds, no variant's defaults.
        let plain = schema(None);
        assert_eq!(plain["properties"]["width"]["minimum"], json!(64));
        assert!(plain["properties"]["width"].get("maximum").is_none());
        assert_eq!(plain["properties"]["width"]["multipleOf"], json!(8));
        assert_eq!(plain["required"], json!(["prompt"]));
    }
}
