//! Validation of an image job's input. Every problem is collected, so a
//! client sees all of them in one `BadInput` message (joined with `"; "`),
//! and nothing is generated (or charged) for an input the model cannot honour.

use serde_json::Value;

/// Smallest and largest side of a delivered image.
pub const MIN_SIDE: u64 = 16;
pub const MAX_SIDE: u64 = 1024;
/// Most images one job may ask for.
pub const MAX_IMAGES: u64 = 8;
/// Longest accepted prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 2000;

const FIELDS: [&str; 10] = [
    "difficulty",
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

pub fn parse(input: &Value, model: &Abilities<'_>) -> Result<Request, String> {
    let Some(object) = input.as_object() else {
        return Err("input must be a JSON object".into());
    };
    let mut errors = Vec::new();
    for key in object.keys() {
        if !FIELDS.contains(&key.as_str()) || (key == "difficulty" && model.difficulty_levels == 0) {
            errors.push(format!("unknown field `{key}` (accepted: {})", FIELDS.join(", ")));
        }
    }
    let prompt = match object.get("prompt") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if p.chars().count() > MAX_PROMPT_CHARS => {
            errors.push(format!("prompt: at most {MAX_PROMPT_CHARS} characters"));
            None
        }
        Some(Value::String(p)) => Some(p.as_str()),
        Some(_) => {
            errors.push("prompt: must be a string".into());
            None
        }
    };
    match object.get("negative_prompt") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.trim().is_empty() => {}
        Some(_) => errors.push("negative_prompt: this model has no text guidance to steer away from a prompt".into()),
    }
    if !matches!(object.get("guidance_scale"), None | Some(Value::Null)) {
        errors.push("guidance_scale: this model is conditioned directly; it has no classifier-free guidance".into());
    }
    match object.get("num_inference_steps") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => errors.push("num_inference_steps: this model generates in one step; only 1 is accepted".into()),
    }
    let side = |name: &str, errors: &mut Vec<String>| -> Option<u64> {
        match object.get(name) {
            None | Some(Value::Null) => Some(u64::from(model.native_side)),
            Some(v) => match integer(v).filter(|n| (MIN_SIDE..=MAX_SIDE).contains(n)) {
                Some(n) => Some(n),
                None => {
                    errors.push(format!("{name}: an integer from {MIN_SIDE} to {MAX_SIDE}"));
                    None
                }
            },
        }
    };
    let width = side("width", &mut errors);
    let height = side("height", &mut errors);
    if let (Some(w), Some(h)) = (width, height)
        && w != h
    {
        errors.push(format!(
            "width and height must be equal: the model draws square images ({0}x{0} natively)",
            model.native_side
        ));
    }
    let num_images = match object.get("num_images") {
        None | Some(Value::Null) => Some(1),
        Some(v) => match integer(v).filter(|n| (1..=MAX_IMAGES).contains(n)) {
            Some(n) => Some(n as usize),
            None => {
                errors.push(format!("num_images: an integer from 1 to {MAX_IMAGES}"));
                None
            }
        },
    };
    let seed = match object.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => match integer(v) {
            Some(n) => Some(n),
            None => {
                errors.push("seed: a non-negative integer".into());
                None
            }
        },
    };
    let format = Format::from_input(object.get("output_format"), &mut errors);
    let difficulty = match object.get("difficulty") {
        None | Some(Value::Null) => None,
        Some(_) if model.difficulty_levels == 0 => None,
        Some(v) => match integer(v).filter(|d| (1..=u64::from(model.difficulty_levels)).contains(d)) {
            Some(d) => Some(d as u32),
            None => {
                errors.push(format!("difficulty: an integer from 1 to {}", model.difficulty_levels));
                None
            }
        },
    };
    let label = if model.labels.is_empty() {
        None
    } else {
        let found = prompt.map(|p| labels_in(p, model.labels)).unwrap_or_default();
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
        side: u32::try_from(width.unwrap_or_default()).unwrap_or(u32::MAX),
        num_images: num_images.unwrap_or(1),
        seed,
        format: format.unwrap_or(Format::Png),
        label,
        difficulty,
    })
}

/// A non-negative integer, also when written as a float with no fraction (`512.0`).
fn integer(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(53))
            .map(|f| f as u64)
    })
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

    #[test]
    fn defaults_fill_in() {
        let r = parse(
            &json!({"prompt": "a face"}),
            &Abilities {
                native_side: 64,
                labels: &[],
                difficulty_levels: 0,
            },
        )
        .unwrap();
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
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse(
            &json!({"width": 8, "height": 2000, "num_images": 0, "seed": -1, "output_format": "gif",
                    "guidance_scale": 7.5, "num_inference_steps": 20, "negative_prompt": "blurry", "style": "x"}),
            &Abilities {
                native_side: 64,
                labels: &[],
                difficulty_levels: 0,
            },
        )
        .unwrap_err();
        for part in [
            "unknown field `style`",
            "width:",
            "height:",
            "num_images:",
            "seed:",
            "output_format:",
            "guidance_scale:",
            "num_inference_steps:",
            "negative_prompt:",
        ] {
            assert!(err.contains(part), "{part} missing from {err}");
        }
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
        assert!(label("an eye").unwrap_err().contains("blue, gray, grayscale"));
        assert!(label("blue or grey").unwrap_err().contains("several"));
        assert!(label("bluest").is_err());
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
        assert!(
            parse(&json!({"difficulty": 0}), &terrain)
                .unwrap_err()
                .contains("1 to 100")
        );
        let gan = Abilities {
            native_side: 64,
            labels: &[],
            difficulty_levels: 0,
        };
        assert!(
            parse(&json!({"difficulty": 35}), &gan)
                .unwrap_err()
                .contains("unknown field `difficulty`")
        );
    }

    #[test]
    fn sizes_must_be_square_and_bounded() {
        let model = Abilities {
            native_side: 64,
            labels: &[],
            difficulty_levels: 0,
        };
        assert_eq!(
            parse(&json!({"width": 512, "height": 512.0}), &model).unwrap().side,
            512
        );
        assert!(
            parse(&json!({"width": 512, "height": 256}), &model)
                .unwrap_err()
                .contains("equal")
        );
    }
}
