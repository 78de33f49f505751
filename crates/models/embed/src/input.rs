//! Validation of an embedding job's JSON input. Every problem is collected
//! and reported at once.
use serde_json::{Map, Value};

/// Most inputs one request may embed.
pub const MAX_INPUTS: usize = 2048;

/// Longest text input, in bytes (far beyond what the model reads: a text is
/// cut to the model's length in tokens; this only bounds the tokenizer's work).
pub const MAX_TEXT_BYTES: usize = 1 << 20;

const FIELDS: [&str; 6] = ["input", "encoding_format", "dimensions", "truncate", "model", "user"];

/// What to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inputs {
    Texts(Vec<String>),
    /// Token ids of the model's own vocabulary, without `[CLS]`/`[SEP]`.
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Inputs::Texts(texts) => texts.len(),
            Inputs::Tokens(tokens) => tokens.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How vectors are written in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Arrays of JSON numbers.
    Float,
    /// Base64 of the little-endian 32-bit floats (OpenAI's `base64`).
    Base64,
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub inputs: Inputs,
    pub encoding: Encoding,
    /// Cut inputs longer than the model reads (true), or refuse them.
    pub truncate: bool,
}

/// Parses `input` for a model with `dimensions`-long vectors and a
/// vocabulary of `vocab_size` ids.
pub fn parse(input: &Value, dimensions: usize, vocab_size: usize) -> Result<Request, String> {
    let Some(fields) = input.as_object() else {
        return Err("the input must be a JSON object".into());
    };
    let mut errors = Vec::new();
    for name in fields.keys() {
        if !FIELDS.contains(&name.as_str()) {
            errors.push(format!("unknown field `{name}` (accepted: {})", FIELDS.join(", ")));
        }
    }
    let inputs = parse_inputs(fields, vocab_size, &mut errors);
    let encoding = match fields.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(_) => {
            errors.push("`encoding_format` must be \"float\" or \"base64\"".into());
            Encoding::Float
        }
    };
    match fields.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(value) if value.as_u64() == Some(dimensions as u64) => {}
        Some(value) if value.as_u64().is_some_and(|n| n > 0) => errors.push(format!(
            "`dimensions`: this model's vectors have {dimensions} dimensions and cannot be shortened (asked for {value})"
        )),
        Some(_) => errors.push("`dimensions` must be a positive integer".into()),
    }
    let truncate = match fields.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push("`truncate` must be a boolean".into());
            true
        }
    };
    for name in ["model", "user"] {
        if let Some(value) = fields.get(name)
            && !value.is_string()
            && !value.is_null()
        {
            errors.push(format!("`{name}` must be a string"));
        }
    }
    match inputs {
        Some(inputs) if errors.is_empty() => Ok(Request {
            inputs,
            encoding,
            truncate,
        }),
        _ => Err(errors.join("; ")),
    }
}

fn parse_inputs(fields: &Map<String, Value>, vocab_size: usize, errors: &mut Vec<String>) -> Option<Inputs> {
    let shape =
        "`input` must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
    let items = match fields.get("input") {
        None | Some(Value::Null) => {
            errors.push("`input` is required".into());
            return None;
        }
        Some(Value::String(text)) => return check_texts(vec![text.clone()], errors),
        Some(Value::Array(items)) => items,
        Some(_) => {
            errors.push(shape.into());
            return None;
        }
    };
    if items.is_empty() {
        errors.push("`input` must not be an empty array".into());
        return None;
    }
    if items.iter().all(Value::is_string) {
        let texts = items.iter().filter_map(Value::as_str).map(str::to_owned).collect();
        return check_texts(texts, errors);
    }
    if items.iter().all(Value::is_number) {
        return check_tokens(vec![items], vocab_size, errors);
    }
    if items.iter().all(Value::is_array) {
        let lists: Vec<&Vec<Value>> = items.iter().filter_map(Value::as_array).collect();
        return check_tokens(lists, vocab_size, errors);
    }
    errors.push(shape.into());
    None
}

fn check_count(count: usize, errors: &mut Vec<String>) -> bool {
    if count > MAX_INPUTS {
        errors.push(format!("`input` may hold at most {MAX_INPUTS} inputs (got {count})"));
        return false;
    }
    true
}

fn check_texts(texts: Vec<String>, errors: &mut Vec<String>) -> Option<Inputs> {
    let mut ok = check_count(texts.len(), errors);
    for (i, text) in texts.iter().enumerate() {
        if text.len() > MAX_TEXT_BYTES {
            errors.push(format!("`input[{i}]` is longer than {MAX_TEXT_BYTES} bytes"));
            ok = false;
        }
    }
    ok.then_some(Inputs::Texts(texts))
}

fn check_tokens(lists: Vec<&Vec<Value>>, vocab_size: usize, errors: &mut Vec<String>) -> Option<Inputs> {
    let mut ok = check_count(lists.len(), errors);
    let mut out = Vec::with_capacity(lists.len());
    for (i, list) in lists.iter().enumerate() {
        if list.is_empty() {
            errors.push(format!("`input[{i}]`: an empty list of token ids"));
            ok = false;
            continue;
        }
        let mut ids = Vec::with_capacity(list.len());
        for value in *list {
            match value.as_u64().filter(|&id| (id as usize) < vocab_size) {
                Some(id) => ids.push(id as u32),
                None => {
                    errors.push(format!(
                        "`input[{i}]`: {value} is not a token id of this model (0 to {})",
                        vocab_size - 1
                    ));
                    ok = false;
                    break;
                }
            }
        }
        out.push(ids);
    }
    ok.then_some(Inputs::Tokens(out))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_input_shape_is_read() {
        let texts = parse(&json!({"input": "hi"}), 384, 100).unwrap();
        assert_eq!(texts.inputs, Inputs::Texts(vec!["hi".into()]));
        assert_eq!((texts.encoding, texts.truncate), (Encoding::Float, true));
        let many = parse(&json!({"input": ["a", ""], "encoding_format": "base64", "truncate": false, "dimensions": 384, "model": "m", "user": "u"}), 384, 100).unwrap();
        assert_eq!(many.inputs, Inputs::Texts(vec!["a".into(), String::new()]));
        assert_eq!((many.encoding, many.truncate), (Encoding::Base64, false));
        assert_eq!(
            parse(&json!({"input": [1, 2, 3]}), 384, 100).unwrap().inputs,
            Inputs::Tokens(vec![vec![1, 2, 3]])
        );
        assert_eq!(
            parse(&json!({"input": [[1], [2, 99]]}), 384, 100).unwrap().inputs,
            Inputs::Tokens(vec![vec![1], vec![2, 99]])
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse(
            &json!({"input": [[1], [100], []], "encoding_format": "int8", "dimensions": 256, "truncate": "yes", "extra": 1}),
            384,
            100,
        )
        .unwrap_err();
        for needle in [
            "unknown field `extra`",
            "`input[1]`: 100 is not a token id of this model (0 to 99)",
            "`input[2]`: an empty list",
            "`encoding_format` must be",
            "cannot be shortened (asked for 256)",
            "`truncate` must be a boolean",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        for (input, needle) in [
            (json!({}), "`input` is required"),
            (json!({"input": []}), "empty array"),
            (json!({"input": ["a", 1]}), "must be a string, an array"),
            (json!({"input": 5}), "must be a string, an array"),
            (json!({"input": [1.5]}), "1.5 is not a token id"),
            (json!({"input": vec!["x"; MAX_INPUTS + 1]}), "at most 2048 inputs"),
            (json!("text"), "must be a JSON object"),
        ] {
            let err = parse(&input, 384, 100).unwrap_err();
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }
}
