//! An image job's input: one typed struct ([`Input`]) that is both the parser
//! (every failure reported at once, in one `BadInput` message joined with
//! `"; "`, before anything is generated or charged) and the model's input
//! schema. What depends on the model (its side, the colours a conditional
//! model draws, the difficulty levels of a terrain) is checked on the typed
//! input once its members are well formed, and filled into the schema of
//! each manifest entry ([`schema`]).

use gantry_input::{AtLeast, Between, Chars};
use gantry_manifest::ModelEntry;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny};
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// Smallest and largest side of a delivered image.
pub const MIN_SIDE: u64 = 16;
pub const MAX_SIDE: u64 = 1024;
/// Most images one job may ask for.
pub const MAX_IMAGES: u64 = 8;
/// Longest accepted prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 2000;

pub use gantry_media::image::Format;

// `difficulty` exists only for a model conditioned on one (a terrain): the
// schema of the others leaves it out, and their parse refuses it.
// `guidance_scale` is read only to say why it is refused; no schema has it.
/// An image job's input, as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Accepted for compatibility; an unconditional model draws the same
    /// whatever the prompt says.
    #[serde(default)]
    #[schema(inline)]
    pub prompt: Option<Chars<{ MAX_PROMPT_CHARS }>>,
    /// The difficulty asked for, for a model conditioned on one.
    #[serde(default)]
    #[schema(inline)]
    pub difficulty: Option<AtLeast<0>>,
    /// Not supported (the model has no text guidance to steer away from a
    /// prompt): only an empty or blank string is accepted.
    #[serde(default)]
    #[schema(inline)]
    pub negative_prompt: Option<Blank>,
    /// Side of the square image; must equal height. Drawn at the model's own
    /// side and resized (Lanczos, 3 lobes).
    #[serde(default)]
    #[schema(inline)]
    pub width: Option<Between<{ MIN_SIDE }, { MAX_SIDE }>>,
    /// Must equal width.
    #[serde(default)]
    #[schema(inline)]
    pub height: Option<Between<{ MIN_SIDE }, { MAX_SIDE }>>,
    /// Images to draw; more than one are returned as `images`.
    #[serde(default)]
    #[schema(inline, default = 1)]
    pub num_images: Option<Between<1, { MAX_IMAGES }>>,
    /// Same seed, same bytes; image i of a job uses seed + i. Picked at
    /// random (and returned) when absent.
    #[serde(default)]
    #[schema(inline)]
    pub seed: Option<AtLeast<0>>,
    /// The model draws in one step; only 1 is accepted.
    #[serde(default)]
    #[schema(inline)]
    pub num_inference_steps: Option<OneStep>,
    /// PNG, JPEG (quality 90) or lossless WebP (any case; `jpg` is jpeg).
    #[serde(default)]
    #[schema(default = "png")]
    pub output_format: Option<Format>,
    /// Refused with the reason (the model has no classifier-free guidance).
    #[serde(default)]
    #[schema(ignore)]
    pub guidance_scale: Option<NoGuidance>,
}

/// A string with nothing but white space in it: a negative prompt the model
/// can ignore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blank;

impl<'de> Deserialize<'de> for Blank {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim().is_empty() {
            Ok(Self)
        } else {
            Err(de::Error::custom(
                "this model has no text guidance to steer away from a prompt",
            ))
        }
    }
}

impl PartialSchema for Blank {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^\s*$"))
            .into()
    }
}

impl ToSchema for Blank {}

/// The number of inference steps of a one-step model: 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneStep;

impl<'de> Deserialize<'de> for OneStep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match AtLeast::<0>::deserialize(deserializer) {
            Ok(AtLeast(1)) => Ok(Self),
            _ => Err(de::Error::custom(
                "this model generates in one step; only 1 is accepted",
            )),
        }
    }
}

impl PartialSchema for OneStep {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .enum_values(Some([1]))
            .default(Some(json!(1)))
            .into()
    }
}

impl ToSchema for OneStep {}

/// Any `guidance_scale` but `null`: refused, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoGuidance;

impl<'de> Deserialize<'de> for NoGuidance {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer)?;
        Err(de::Error::custom(
            "this model is conditioned directly; it has no classifier-free guidance",
        ))
    }
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub side: u32,
    pub num_images: usize,
    /// `None`: the worker picks one (and reports it).
    pub seed: Option<u64>,
    pub format: Format,
    /// Index of the label the prompt names, for a conditional model.
    pub label: Option<usize>,
    /// The difficulty asked for, for a model conditioned on one (1 to
    /// `Abilities::difficulty_levels`); `None`: drawn from the seed.
    pub difficulty: Option<u32>,
}

/// What the model can do, for validation.
pub struct Abilities<'a> {
    /// Side of the generator's output.
    pub native_side: u32,
    /// The labels of a conditional model (empty: unconditional), each with
    /// the words in a prompt that name it.
    pub labels: &'a [(String, Vec<String>)],
    /// Levels of a model conditioned on a difficulty (0: none; the field is
    /// refused).
    pub difficulty_levels: u32,
}

/// Reads `input` as [`Input`], then the rules that need the model: a square
/// size (its own side where none is given), a difficulty only where the
/// model takes one and within its levels, and for a conditional model a
/// prompt that names exactly one of its labels.
pub fn parse(input: &Value, model: &Abilities<'_>) -> Result<Request, String> {
    let input: Input = gantry_input::read(input.clone()).map_err(|failures| gantry_input::sentence(&failures))?;
    let mut errors = Vec::new();
    let native = u64::from(model.native_side);
    let width = input.width.map_or(native, |w| w.0);
    let height = input.height.map_or(native, |h| h.0);
    if width != height {
        errors.push(format!(
            "width and height must be equal: the model draws square images ({0}x{0} natively)",
            model.native_side
        ));
    }
    let levels = model.difficulty_levels;
    let difficulty = match input.difficulty {
        None => None,
        Some(_) if levels == 0 => {
            errors.push("difficulty: unknown property".into());
            None
        }
        Some(AtLeast(d)) => match u32::try_from(d).ok().filter(|d| (1..=levels).contains(d)) {
            Some(d) => Some(d),
            None => {
                errors.push(format!("difficulty: must be an integer from 1 to {levels} (got {d})"));
                None
            }
        },
    };
    let label = if model.labels.is_empty() {
        None
    } else {
        let found = input
            .prompt
            .as_ref()
            .map(|p| labels_in(p.as_str(), model.labels))
            .unwrap_or_default();
        match found.as_slice() {
            [one] => Some(*one),
            [] => {
                let words: Vec<&str> = model.labels.iter().map(|(name, _)| name.as_str()).collect();
                errors.push(format!(
                    "prompt: must name one of the colours this model draws: {}",
                    words.join(", ")
                ));
                None
            }
            several => {
                let names: Vec<&str> = several.iter().map(|i| model.labels[*i].0.as_str()).collect();
                errors.push(format!(
                    "prompt: names several colours ({}); name one",
                    names.join(", ")
                ));
                None
            }
        }
    };
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(Request {
        side: u32::try_from(width).unwrap_or(u32::MAX),
        num_images: input.num_images.map_or(1, |n| n.0 as usize),
        seed: input.seed.map(|s| s.0),
        format: input.output_format.unwrap_or(Format::Png),
        label,
        difficulty,
    })
}

/// The input schema the API serves for the image model of `entry`: that of
/// [`Input`] with what the entry decides. A terrain (`architecture =
/// "consistency-onnx"`) draws 128x128 heightfields for a difficulty of 1 to
/// `engine.levels`; a GAN draws at the side its id ends with (`-64`), and a
/// conditional one (`engine.labels`) needs a prompt naming a label.
pub fn schema(entry: &ModelEntry) -> Value {
    let terrain = entry.engine.get("architecture").and_then(Value::as_str) == Some("consistency-onnx");
    if terrain {
        let levels = crate::TerrainSpec::from_engine(&entry.engine).map_or(0, |spec| spec.levels);
        let model = Abilities {
            native_side: crate::terrain::SIDE as u32,
            labels: &[],
            difficulty_levels: levels,
        };
        let mut schema = schema_for(&model);
        let properties = &mut schema["properties"];
        properties["prompt"]["description"] =
            json!("Accepted for compatibility; the model is conditioned on `difficulty`, not on text.");
        properties["width"]["description"] = json!(format!(
            "Side of the square heightfield; must equal height. {}",
            drawn_at(model.native_side)
        ));
        properties["num_images"]["description"] =
            json!("Heightfields to draw; more than one are returned as `images`.");
        properties["num_inference_steps"]["description"] =
            json!("The consistency model draws in one step; only 1 is accepted.");
        properties["output_format"]["description"] =
            json!("16-bit grey PNG, or 8-bit grey JPEG (quality 90) or lossless WebP (any case; `jpg` is jpeg).");
        return schema;
    }
    let (labels, side) = crate::GanSpec::from_engine(&entry.engine)
        .map(|spec| (spec.labels, spec.side))
        .unwrap_or_default();
    schema_for(&Abilities {
        native_side: side.unwrap_or(0),
        labels: &labels,
        difficulty_levels: 0,
    })
}

/// The schema of [`Input`] for `model` (a `native_side` of 0: unknown, no
/// default size).
pub fn schema_for(model: &Abilities<'_>) -> Value {
    let mut schema = gantry_input::schema_of::<Input>();
    let Some(properties) = schema["properties"].as_object_mut() else {
        return schema;
    };
    if model.native_side > 0 {
        let side = model.native_side;
        properties["width"]["default"] = json!(side);
        properties["height"]["default"] = json!(side);
        properties["width"]["description"] = json!(format!(
            "Side of the square image; must equal height. {}",
            drawn_at(side)
        ));
    }
    if model.difficulty_levels == 0 {
        properties.remove("difficulty");
    } else {
        let difficulty = &mut properties["difficulty"];
        difficulty["minimum"] = json!(1);
        difficulty["maximum"] = json!(model.difficulty_levels);
        difficulty["description"] = json!(format!(
            "How rough the terrain is, 1 (gentle) to {} (rugged). Drawn from the seed when absent, and returned.",
            model.difficulty_levels
        ));
    }
    if !model.labels.is_empty() {
        let names: Vec<String> = model
            .labels
            .iter()
            .map(|(name, words)| {
                let others: Vec<&str> = words
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !w.eq_ignore_ascii_case(name))
                    .collect();
                if others.is_empty() {
                    name.clone()
                } else {
                    format!("{name} ({})", others.join(", "))
                }
            })
            .collect();
        let listed = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        properties["prompt"]["description"] = json!(format!(
            "Must name exactly one of the colours this model draws (whole words, any case): {listed}."
        ));
        schema["required"] = json!(["prompt"]);
    }
    schema
}

fn drawn_at(side: u32) -> String {
    format!("Drawn at {side}x{side} and resized (Lanczos, 3 lobes).")
}

/// The labels a prompt names, each once, in label order. A phrase matches
/// whole words, case-insensitively; a longer phrase that matches ("black and
/// white") hides the shorter words inside it.
fn labels_in(prompt: &str, labels: &[(String, Vec<String>)]) -> Vec<usize> {
    let words: Vec<String> = prompt
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut used = vec![false; words.len()];
    let mut phrases: Vec<(usize, Vec<&str>)> = labels
        .iter()
        .enumerate()
        .flat_map(|(i, (_, names))| names.iter().map(move |n| (i, n.split(' ').collect())))
        .collect();
    // Longest phrases first.
    phrases.sort_by_key(|(_, words)| std::cmp::Reverse(words.len()));
    let mut found = Vec::new();
    for (label, phrase) in phrases {
        for start in 0..words.len() {
            let end = start + phrase.len();
            if end <= words.len()
                && !used[start..end].iter().any(|u| *u)
                && words[start..end].iter().zip(&phrase).all(|(a, b)| a == b)
            {
                used[start..end].iter_mut().for_each(|u| *u = true);
                if !found.contains(&label) {
                    found.push(label);
                }
            }
        }
    }
    found.sort_unstable();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn colours() -> Vec<(String, Vec<String>)> {
        [
            ("blue", vec!["blue"]),
            ("gray", vec!["gray", "grey"]),
            (
                "grayscale",
                vec!["grayscale", "greyscale", "black and white", "monochrome"],
            ),
        ]
        .into_iter()
        .map(|(n, w)| (n.to_owned(), w.into_iter().map(str::to_owned).collect()))
        .collect()
    }

    const FACES: Abilities<'static> = Abilities {
        native_side: 64,
        labels: &[],
        difficulty_levels: 0,
    };

    #[test]
    fn defaults_fill_in() {
        let r = parse(&json!({"prompt": "a face"}), &FACES).unwrap();
        assert_eq!(
            r,
            Request {
                side: 64,
                num_images: 1,
                seed: None,
                format: Format::Png,
                label: None,
                difficulty: None,
            }
        );
        let r = parse(
            &json!({"prompt": null, "negative_prompt": " ", "num_inference_steps": 1, "guidance_scale": null,
                    "seed": 7.0, "num_images": 2, "output_format": "JPG"}),
            &FACES,
        )
        .unwrap();
        assert_eq!((r.seed, r.num_images, r.format), (Some(7), 2, Format::Jpeg));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse(
            &json!({"width": 8, "height": 2000, "num_images": 0, "seed": -1, "output_format": "gif",
                    "guidance_scale": 7.5, "num_inference_steps": 20, "negative_prompt": "blurry", "style": "x",
                    "prompt": "x".repeat(2001)}),
            &FACES,
        )
        .unwrap_err();
        for part in [
            "style: unknown property",
            "width: must be an integer from 16 to 1024 (got 8)",
            "height: must be an integer from 16 to 1024 (got 2000)",
            "num_images: must be an integer from 1 to 8 (got 0)",
            "seed: must be an integer of at least 0 (got -1)",
            "output_format: must be one of png, jpeg, webp (got 'gif')",
            "guidance_scale: this model is conditioned directly; it has no classifier-free guidance",
            "num_inference_steps: this model generates in one step; only 1 is accepted",
            "negative_prompt: this model has no text guidance to steer away from a prompt",
            "prompt: must be a string of at most 2000 characters (got 2001)",
        ] {
            assert!(err.contains(part), "{part} missing from {err}");
        }
        assert_eq!(err.matches(": ").count(), 10, "{err}");
        let err = parse(&json!({"prompt": 3, "output_format": 1, "negative_prompt": 2}), &FACES).unwrap_err();
        for part in [
            "prompt: must be a string, not a number",
            "output_format: must be a string, not a number",
            "negative_prompt: must be a string, not a number",
        ] {
            assert!(err.contains(part), "{part} missing from {err}");
        }
        assert_eq!(
            parse(&json!([1]), &FACES).unwrap_err(),
            "must be a JSON object, not an array"
        );
    }

    #[test]
    fn the_colour_comes_from_the_prompt() {
        let labels = colours();
        let model = Abilities {
            native_side: 128,
            labels: &labels,
            difficulty_levels: 0,
        };
        let label = |p: &str| parse(&json!({"prompt": p}), &model).map(|r| r.label);
        assert_eq!(label("A Grey eye, close up"), Ok(Some(1)));
        assert_eq!(label("black and white photo of an eye"), Ok(Some(2)));
        assert_eq!(label("blue-eyed"), Ok(Some(0)));
        assert_eq!(
            label("an eye").unwrap_err(),
            "prompt: must name one of the colours this model draws: blue, gray, grayscale"
        );
        assert!(
            label("blue or grey")
                .unwrap_err()
                .contains("names several colours (blue, gray)")
        );
        assert!(label("bluest").is_err());
        let err = parse(&json!({}), &model).unwrap_err();
        assert!(err.contains("must name one of the colours"), "{err}");
    }

    #[test]
    fn a_difficulty_only_where_the_model_takes_one() {
        let terrain = Abilities {
            native_side: 128,
            labels: &[],
            difficulty_levels: 100,
        };
        assert_eq!(
            parse(&json!({"difficulty": 35}), &terrain).unwrap().difficulty,
            Some(35)
        );
        assert_eq!(
            parse(&json!({"difficulty": 0}), &terrain).unwrap_err(),
            "difficulty: must be an integer from 1 to 100 (got 0)"
        );
        assert!(
            parse(&json!({"difficulty": "hard"}), &terrain)
                .unwrap_err()
                .starts_with("difficulty: must be an integer of at least 0, not a string")
        );
        assert_eq!(
            parse(&json!({"difficulty": 35}), &FACES).unwrap_err(),
            "difficulty: unknown property"
        );
    }

    #[test]
    fn sizes_must_be_square_and_bounded() {
        assert_eq!(
            parse(&json!({"width": 512, "height": 512.0}), &FACES).unwrap().side,
            512
        );
        assert_eq!(
            parse(&json!({"width": 512, "height": 256}), &FACES).unwrap_err(),
            "width and height must be equal: the model draws square images (64x64 natively)"
        );
        // An absent side is the model's own.
        assert!(parse(&json!({"width": 512}), &FACES).unwrap_err().contains("equal"));
    }

    fn builtin(id: &str) -> Value {
        use gantry_worker_sdk::factory::ModelFactory;
        let entry = gantry_manifest::Manifest::builtin().get(id).unwrap();
        assert!(crate::ImageFactory::accepts(entry), "{id}");
        let schema = schema(entry);
        assert_eq!(crate::ImageFactory::input_schema(entry), schema);
        schema
    }

    /// The facts every image entry's schema states (those of the schemas
    /// the manifest entries once had written out).
    fn common(schema: &Value, side: u64) {
        assert_eq!(schema["type"], json!("object"));
        assert_eq!(schema["additionalProperties"], json!(false));
        let p = &schema["properties"];
        assert_eq!(p["prompt"]["type"], json!("string"));
        assert_eq!(p["prompt"]["maxLength"], json!(2000));
        assert_eq!(p["negative_prompt"]["type"], json!("string"));
        assert_eq!(p["negative_prompt"]["pattern"], json!(r"^\s*$"));
        for side_name in ["width", "height"] {
            let member = &p[side_name];
            assert_eq!(member["type"], json!("integer"), "{side_name}");
            assert_eq!(
                (&member["minimum"], &member["maximum"], &member["default"]),
                (&json!(16), &json!(1024), &json!(side)),
                "{side_name}"
            );
        }
        assert!(
            p["width"]["description"]
                .as_str()
                .unwrap()
                .contains("must equal height")
        );
        assert!(
            p["width"]["description"]
                .as_str()
                .unwrap()
                .contains(&format!("Drawn at {side}x{side} and resized (Lanczos, 3 lobes)")),
            "{schema}"
        );
        assert_eq!(p["height"]["description"], json!("Must equal width."));
        assert_eq!(
            (
                &p["num_images"]["minimum"],
                &p["num_images"]["maximum"],
                &p["num_images"]["default"]
            ),
            (&json!(1), &json!(8), &json!(1))
        );
        assert!(
            p["num_images"]["description"]
                .as_str()
                .unwrap()
                .contains("returned as `images`")
        );
        assert_eq!(p["seed"]["type"], json!("integer"));
        assert_eq!(p["seed"]["minimum"], json!(0));
        assert!(p["seed"]["description"].as_str().unwrap().contains("seed + i"));
        assert_eq!(p["num_inference_steps"]["enum"], json!([1]));
        assert_eq!(p["output_format"]["enum"], json!(["png", "jpeg", "webp"]));
        assert_eq!(p["output_format"]["default"], json!("png"));
        assert!(
            p["output_format"]["description"]
                .as_str()
                .unwrap()
                .contains("quality 90")
        );
        assert!(p.get("guidance_scale").is_none(), "{schema}");
        let whole = schema.to_string();
        assert!(!whole.contains("$ref") && !whole.contains("oneOf"), "{whole}");
    }

    #[test]
    fn the_faces_schema_states_the_old_facts() {
        let schema = builtin("dcgan-faces-64");
        common(&schema, 64);
        let mut names: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(
            names,
            [
                "height",
                "negative_prompt",
                "num_images",
                "num_inference_steps",
                "output_format",
                "prompt",
                "seed",
                "width",
            ]
        );
        assert!(schema.get("required").is_none_or(|r| r == &json!([])), "{schema}");
        assert!(
            schema["properties"]["prompt"]["description"]
                .as_str()
                .unwrap()
                .starts_with("Accepted for compatibility")
        );
    }

    #[test]
    fn the_eyes_schema_needs_a_prompt_naming_a_colour() {
        let schema = builtin("eyes-128");
        common(&schema, 128);
        assert_eq!(schema["required"], json!(["prompt"]));
        assert!(schema["properties"].get("difficulty").is_none());
        assert_eq!(
            schema["properties"]["prompt"]["description"],
            json!(
                "Must name exactly one of the colours this model draws (whole words, any case): amber, blue, \
                 brown, gray (grey), grayscale (greyscale, black and white, monochrome), green, hazel or red."
            )
        );
    }

    #[test]
    fn the_terrain_schema_has_a_difficulty() {
        let schema = builtin("terrain-128");
        common(&schema, 128);
        let p = &schema["properties"];
        assert_eq!(p["difficulty"]["type"], json!("integer"));
        assert_eq!(
            (&p["difficulty"]["minimum"], &p["difficulty"]["maximum"]),
            (&json!(1), &json!(100))
        );
        assert!(
            p["difficulty"]["description"]
                .as_str()
                .unwrap()
                .contains("Drawn from the seed when absent")
        );
        assert_eq!(p.as_object().unwrap().len(), 9, "{schema}");
        assert!(
            p["output_format"]["description"]
                .as_str()
                .unwrap()
                .starts_with("16-bit grey PNG")
        );
        assert!(schema.get("required").is_none_or(|r| r == &json!([])), "{schema}");
    }
}
