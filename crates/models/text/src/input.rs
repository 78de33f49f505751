//! Validation of a job's JSON input.
//!
//! Every problem found is collected, so a client sees all of them at once in
//! one `BadInput` message (joined with `"; "`).

use serde_json::{Map, Value};

/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 4;

/// Default `max_tokens` (lowered to what the context has room for when the
/// client does not give one).
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// Default sampling temperature.
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

/// Highest accepted temperature.
pub const MAX_TEMPERATURE: f64 = 2.0;

const FIELDS: [&str; 10] = [
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "raw",
    "ignore_eos",
];

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }

    fn parse(role: &str) -> Option<Self> {
        match role {
            "system" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            _ => None,
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// What to feed the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Tokenized as is (`"raw": true`).
    Raw(String),
    /// Formatted with the model's chat template, ending with the assistant's
    /// generation prompt.
    Chat(Vec<Message>),
}

/// How to pick each next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling; 1 means off.
    pub top_p: f32,
    /// 0 means off.
    pub top_k: u32,
    /// `None`: a random seed.
    pub seed: Option<u64>,
}

impl Sampling {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub prompt: Prompt,
    /// `None`: [`DEFAULT_MAX_TOKENS`], or less if the context has less room.
    pub max_tokens: Option<u32>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    /// Generate until `max_tokens` (or a stop string), never ending at the
    /// model's end-of-sequence tokens: for fixed-length benchmarks and tests.
    pub ignore_eos: bool,
}

impl Params {
    /// Validates `input`. `context_length` is the most tokens (prompt and
    /// output together) one request may use. The error lists every problem,
    /// separated by `"; "`.
    pub fn parse(input: &Value, context_length: u32) -> Result<Self, String> {
        let Some(object) = input.as_object() else {
            return Err(format!(
                "input must be a JSON object with `prompt` or `messages`, got {}",
                kind(input)
            ));
        };
        let mut errors = Vec::new();
        for key in object.keys() {
            if !FIELDS.contains(&key.as_str()) {
                errors.push(format!(
                    "unknown field `{key}` (expected one of: {})",
                    FIELDS.join(", ")
                ));
            }
        }

        let raw = match field(object, "raw") {
            None => false,
            Some(Value::Bool(raw)) => *raw,
            Some(other) => {
                errors.push(format!("`raw` must be a boolean, got {}", kind(other)));
                false
            }
        };
        let prompt = parse_prompt(object, raw, &mut errors);
        let ignore_eos = match field(object, "ignore_eos") {
            None => false,
            Some(Value::Bool(ignore)) => *ignore,
            Some(other) => {
                errors.push(format!("`ignore_eos` must be a boolean, got {}", kind(other)));
                false
            }
        };

        let max_tokens = field(object, "max_tokens").and_then(|value| match value.as_u64() {
            Some(n) if n >= 1 && n <= u64::from(context_length) => u32::try_from(n).ok(),
            _ => {
                errors.push(format!(
                    "`max_tokens` must be an integer from 1 to {context_length}, got {value}"
                ));
                None
            }
        });

        let temperature = match field(object, "temperature") {
            None => DEFAULT_TEMPERATURE,
            Some(value) => match value.as_f64() {
                Some(t) if (0.0..=MAX_TEMPERATURE).contains(&t) => t as f32,
                _ => {
                    errors.push(format!(
                        "`temperature` must be a number from 0 to {MAX_TEMPERATURE}, got {value}"
                    ));
                    DEFAULT_TEMPERATURE
                }
            },
        };

        let top_p = match field(object, "top_p") {
            None => 1.0,
            Some(value) => match value.as_f64() {
                Some(p) if p > 0.0 && p <= 1.0 => p as f32,
                _ => {
                    errors.push(format!(
                        "`top_p` must be a number greater than 0 and at most 1, got {value}"
                    ));
                    1.0
                }
            },
        };

        let top_k = match field(object, "top_k") {
            None => 0,
            Some(value) => match value.as_u64().and_then(|k| i32::try_from(k).ok()) {
                Some(k) => k.unsigned_abs(),
                None => {
                    errors.push(format!(
                        "`top_k` must be an integer from 0 (off) to {}, got {value}",
                        i32::MAX
                    ));
                    0
                }
            },
        };

        let seed = field(object, "seed").and_then(|value| {
            let seed = value.as_u64();
            if seed.is_none() {
                errors.push(format!("`seed` must be an integer from 0 to {}, got {value}", u64::MAX));
            }
            seed
        });

        let stop = parse_stop(field(object, "stop"), &mut errors);

        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(Self {
            // `parse_prompt` pushes an error whenever it returns `None`.
            prompt: prompt.unwrap_or(Prompt::Raw(String::new())),
            max_tokens,
            sampling: Sampling {
                temperature,
                top_p,
                top_k,
                seed,
            },
            stop,
            ignore_eos,
        })
    }
}

/// A field, treating JSON `null` like an absent field.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).filter(|value| !value.is_null())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_prompt(object: &Map<String, Value>, raw: bool, errors: &mut Vec<String>) -> Option<Prompt> {
    match (field(object, "prompt"), field(object, "messages")) {
        (None, None) => {
            errors.push("one of `prompt` (a string) or `messages` (an array) is required".into());
            None
        }
        (Some(_), Some(_)) => {
            errors.push("give either `prompt` or `messages`, not both".into());
            None
        }
        (Some(prompt), None) => {
            let Value::String(text) = prompt else {
                errors.push(format!("`prompt` must be a string, got {}", kind(prompt)));
                return None;
            };
            if raw {
                Some(Prompt::Raw(text.clone()))
            } else if text.contains('\0') {
                errors.push("`prompt` must not contain NUL characters (unless `raw` is true)".into());
                None
            } else {
                Some(Prompt::Chat(vec![Message {
                    role: Role::User,
                    content: text.clone(),
                }]))
            }
        }
        (None, Some(messages)) => {
            if raw {
                errors.push("`raw` applies only to `prompt`; `messages` always use the chat template".into());
            }
            parse_messages(messages, errors).map(Prompt::Chat)
        }
    }
}

fn parse_messages(messages: &Value, errors: &mut Vec<String>) -> Option<Vec<Message>> {
    let Value::Array(items) = messages else {
        errors.push(format!(
            "`messages` must be an array of {{\"role\", \"content\"}} objects, got {}",
            kind(messages)
        ));
        return None;
    };
    if items.is_empty() {
        errors.push("`messages` must not be empty".into());
        return None;
    }
    let before = errors.len();
    let mut parsed = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(message) = item else {
            errors.push(format!(
                "`messages[{i}]` must be an object with `role` and `content`, got {}",
                kind(item)
            ));
            continue;
        };
        for key in message.keys() {
            if key != "role" && key != "content" {
                errors.push(format!(
                    "`messages[{i}]`: unknown field `{key}` (expected `role` and `content`)"
                ));
            }
        }
        let role = match message.get("role") {
            Some(Value::String(role)) => Role::parse(role),
            _ => None,
        };
        if role.is_none() {
            errors.push(format!(
                "`messages[{i}].role` must be one of \"system\", \"user\", \"assistant\""
            ));
        }
        let content = match message.get("content") {
            Some(Value::String(content)) if !content.contains('\0') => Some(content.clone()),
            Some(Value::String(_)) => {
                errors.push(format!("`messages[{i}].content` must not contain NUL characters"));
                None
            }
            _ => {
                errors.push(format!("`messages[{i}].content` must be a string"));
                None
            }
        };
        if let (Some(role), Some(content)) = (role, content) {
            parsed.push(Message { role, content });
        }
    }
    (errors.len() == before).then_some(parsed)
}

fn parse_stop(stop: Option<&Value>, errors: &mut Vec<String>) -> Vec<String> {
    const SHAPE: &str = "`stop` must be a non-empty string or an array of at most 4 non-empty strings";
    match stop {
        None => Vec::new(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(items))
            if items.len() <= MAX_STOP_STRINGS
                && items.iter().all(|item| item.as_str().is_some_and(|s| !s.is_empty())) =>
        {
            items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(_) => {
            errors.push(SHAPE.into());
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(input: Value) -> Result<Params, String> {
        Params::parse(&input, 2048)
    }

    #[test]
    fn prompt_defaults() {
        let params = parse(json!({"prompt": "hi"})).unwrap();
        assert_eq!(
            params,
            Params {
                prompt: Prompt::Chat(vec![Message {
                    role: Role::User,
                    content: "hi".into()
                }]),
                max_tokens: None,
                sampling: Sampling {
                    temperature: DEFAULT_TEMPERATURE,
                    top_p: 1.0,
                    top_k: 0,
                    seed: None
                },
                stop: vec![],
                ignore_eos: false,
            }
        );
    }

    #[test]
    fn all_fields() {
        let params = parse(json!({
            "prompt": "Once", "raw": true, "max_tokens": 7, "temperature": 0, "top_p": 0.5,
            "top_k": 40, "stop": ["\n", "END"], "seed": u64::MAX
        }))
        .unwrap();
        assert_eq!(params.prompt, Prompt::Raw("Once".into()));
        assert_eq!(params.max_tokens, Some(7));
        assert_eq!(
            params.sampling,
            Sampling {
                temperature: 0.0,
                top_p: 0.5,
                top_k: 40,
                seed: Some(u64::MAX)
            }
        );
        assert!(params.sampling.is_greedy());
        assert_eq!(params.stop, vec!["\n".to_owned(), "END".to_owned()]);
        assert_eq!(
            parse(json!({"prompt": "a", "stop": "x"})).unwrap().stop,
            vec!["x".to_owned()]
        );
        assert!(parse(json!({"prompt": "a", "stop": []})).unwrap().stop.is_empty());
        assert!(parse(json!({"prompt": "a", "ignore_eos": true})).unwrap().ignore_eos);
        assert_eq!(
            parse(json!({"prompt": "a", "ignore_eos": 1})).unwrap_err(),
            "`ignore_eos` must be a boolean, got a number"
        );
        // null reads as absent
        assert_eq!(
            parse(json!({"prompt": "a", "seed": null, "stop": null, "max_tokens": null})).unwrap(),
            parse(json!({"prompt": "a"})).unwrap()
        );
    }

    #[test]
    fn messages() {
        let params = parse(json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": ""},
        ]}))
        .unwrap();
        let Prompt::Chat(messages) = params.prompt else {
            panic!("not a chat");
        };
        assert_eq!(
            messages.iter().map(|m| m.role).collect::<Vec<_>>(),
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert_eq!(messages[0].content, "Be brief.");
    }

    #[test]
    fn every_problem_is_reported() {
        let error = parse(json!({
            "prompt": 3, "max_tokens": 0, "temperature": 2.5, "top_p": 0, "top_k": -1,
            "stop": ["a", ""], "seed": -4, "raw": "yes", "extra": 1
        }))
        .unwrap_err();
        let parts: Vec<&str> = error.split("; ").collect();
        assert_eq!(parts.len(), 9, "{error}");
        for needle in [
            "unknown field `extra`",
            "`raw` must be a boolean",
            "`prompt` must be a string",
            "`max_tokens` must be an integer from 1 to 2048",
            "`temperature`",
            "`top_p`",
            "`top_k`",
            "`seed`",
            "`stop`",
        ] {
            assert!(error.contains(needle), "{needle} missing from {error}");
        }
    }

    #[test]
    fn bad_inputs() {
        for (input, needle) in [
            (json!("hello"), "must be a JSON object"),
            (json!({}), "one of `prompt`"),
            (json!({"prompt": "a", "messages": []}), "not both"),
            (json!({"messages": []}), "must not be empty"),
            (json!({"messages": "hi"}), "`messages` must be an array"),
            (json!({"messages": [1]}), "`messages[0]` must be an object"),
            (
                json!({"messages": [{"role": "bot", "content": "x"}]}),
                "`messages[0].role`",
            ),
            (json!({"messages": [{"role": "user"}]}), "`messages[0].content`"),
            (
                json!({"messages": [{"role": "user", "content": "x", "name": "n"}]}),
                "unknown field `name`",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "raw": true}),
                "`raw` applies only",
            ),
            (json!({"prompt": "a", "max_tokens": 2049}), "`max_tokens`"),
            (json!({"prompt": "a", "max_tokens": 1.5}), "`max_tokens`"),
            (json!({"prompt": "a", "temperature": "hot"}), "`temperature`"),
            (json!({"prompt": "a", "top_p": 1.01}), "`top_p`"),
            (json!({"prompt": "a", "top_k": 1u64 << 40}), "`top_k`"),
            (json!({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}), "`stop`"),
            (json!({"prompt": "a", "stop": ""}), "`stop`"),
            (json!({"prompt": "a", "stop": [1]}), "`stop`"),
            (json!({"prompt": "a", "seed": 1.5}), "`seed`"),
            (json!({"prompt": "a\u{0}b"}), "`prompt` must not contain NUL"),
            (
                json!({"messages": [{"role": "user", "content": "a\u{0}"}]}),
                "`messages[0].content` must not contain NUL",
            ),
        ] {
            let error = parse(input.clone()).unwrap_err();
            assert!(error.contains(needle), "{input}: {error}");
        }
    }
}
