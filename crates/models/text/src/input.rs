//! Validation of a job's JSON input.
//!
//! Every problem found is collected, so a client sees all of them at once in
//! one `BadInput` message (joined with `"; "`).

use serde_json::{Map, Value};

use crate::grammar;
use crate::tools::{Call, Grammar, Tool, ToolChoice, Tools};

/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 4;

/// Default `max_tokens` (lowered to what the context has room for when the
/// client does not give one).
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// Default sampling temperature.
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

/// Highest accepted temperature.
pub const MAX_TEMPERATURE: f64 = 2.0;

/// Most choices one request may ask for.
pub const MAX_CHOICES: u64 = 8;

/// Most alternatives per token `top_logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Most tools one request may offer.
pub const MAX_TOOLS: usize = 128;

const FIELDS: [&str; 21] = [
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "raw",
    "ignore_eos",
];

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }

    fn parse(role: &str) -> Option<Self> {
        match role {
            "system" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            "tool" => Some(Self::Tool),
            _ => None,
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The calls an assistant message made.
    pub tool_calls: Vec<Call>,
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
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling; 1 means off.
    pub top_p: f32,
    /// 0 means off.
    pub top_k: u32,
    /// `None`: a random seed.
    pub seed: Option<u64>,
    /// Min-p sampling; 0 means off.
    pub min_p: f32,
    /// OpenAI's presence penalty (-2 to 2; 0 is off).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty (-2 to 2; 0 is off).
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids (-100 to 100).
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: DEFAULT_TEMPERATURE,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
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
    /// Choices to generate (1 ..= [`MAX_CHOICES`]).
    pub n: u32,
    /// `Some(k)`: report each token's log-probability and the `k` likeliest
    /// alternatives.
    pub logprobs: Option<u32>,
    /// The grammar the answer must follow (`response_format` or tools).
    pub grammar: Option<Grammar>,
    /// Tools offered to the model (`None` when none are, or `tool_choice`
    /// is `none`).
    pub tools: Option<Tools>,
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

        let min_p = number_in(object, "min_p", 0.0, 1.0, 0.0, &mut errors);
        let presence_penalty = number_in(object, "presence_penalty", -2.0, 2.0, 0.0, &mut errors);
        let frequency_penalty = number_in(object, "frequency_penalty", -2.0, 2.0, 0.0, &mut errors);
        let logit_bias = parse_logit_bias(field(object, "logit_bias"), &mut errors);

        let n = match field(object, "n") {
            None => 1,
            Some(value) => match value.as_u64() {
                Some(n) if (1..=MAX_CHOICES).contains(&n) => n as u32,
                _ => {
                    errors.push(format!("`n` must be an integer from 1 to {MAX_CHOICES}, got {value}"));
                    1
                }
            },
        };

        let logprobs = match field(object, "logprobs") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(other) => {
                errors.push(format!("`logprobs` must be a boolean, got {}", kind(other)));
                false
            }
        };
        let top_logprobs = match field(object, "top_logprobs") {
            None => 0,
            Some(value) => match value.as_u64() {
                Some(k) if k <= MAX_TOP_LOGPROBS => {
                    if !logprobs && k > 0 {
                        errors.push("`top_logprobs` needs `logprobs: true`".into());
                    }
                    k as u32
                }
                _ => {
                    errors.push(format!(
                        "`top_logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {value}"
                    ));
                    0
                }
            },
        };

        let response = parse_response_format(field(object, "response_format"), &mut errors);
        let tools = parse_tools(object, &mut errors);
        let tools_grammar = match tools.as_ref().map(Tools::grammar) {
            Some(Err(error)) => {
                errors.push(format!("`{}`: {}", error.at, error.reason));
                None
            }
            Some(Ok(grammar)) => grammar,
            None => None,
        };
        let grammar = match (tools_grammar, response) {
            (None, response) => response,
            (Some(tools), None) => Some(tools),
            // Calls only: the answer's text format does not apply.
            (Some(tools), Some(_)) if tools.trigger.is_none() => Some(tools),
            (Some(_), Some(_)) => {
                errors.push(
                    "`response_format` with `tools` and `tool_choice: auto` is not supported: \
                     ask for `required` or a named function, or leave `response_format` out"
                        .into(),
                );
                None
            }
        };
        if ignore_eos && grammar.is_some() {
            errors.push("`ignore_eos` cannot be combined with `response_format` or `tools`".into());
        }
        if tools.is_some() && matches!(prompt, Some(Prompt::Raw(_))) {
            errors.push("`tools` need a chat: send `messages` (or a `prompt` without `raw`)".into());
        }

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
                min_p,
                presence_penalty,
                frequency_penalty,
                logit_bias,
            },
            stop,
            ignore_eos,
            n,
            logprobs: logprobs.then_some(top_logprobs),
            grammar,
            tools,
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
                    tool_calls: Vec::new(),
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
            if !["role", "content", "tool_calls", "tool_call_id", "name"].contains(&key.as_str()) {
                errors.push(format!(
                    "`messages[{i}]`: unknown field `{key}` (expected `role`, `content`, `tool_calls`, `tool_call_id`, `name`)"
                ));
            }
        }
        let role = match message.get("role") {
            Some(Value::String(role)) => Role::parse(role),
            _ => None,
        };
        if role.is_none() {
            errors.push(format!(
                "`messages[{i}].role` must be one of \"system\", \"user\", \"assistant\", \"tool\""
            ));
        }
        let tool_calls = match message.get("tool_calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(calls) if role == Some(Role::Assistant) => parse_calls(calls, i, errors),
            Some(_) => {
                errors.push(format!(
                    "`messages[{i}].tool_calls`: only assistant messages make calls"
                ));
                Vec::new()
            }
        };
        for key in ["tool_call_id", "name"] {
            if message.get(key).is_some_and(|v| !v.is_string() && !v.is_null()) {
                errors.push(format!("`messages[{i}].{key}` must be a string"));
            }
        }
        let content = match message.get("content") {
            Some(Value::String(content)) if !content.contains('\0') => Some(content.clone()),
            Some(Value::String(_)) => {
                errors.push(format!("`messages[{i}].content` must not contain NUL characters"));
                None
            }
            // An assistant message that only calls tools has no content.
            None | Some(Value::Null) if !tool_calls.is_empty() => Some(String::new()),
            _ => {
                errors.push(format!("`messages[{i}].content` must be a string"));
                None
            }
        };
        if let (Some(role), Some(content)) = (role, content) {
            parsed.push(Message {
                role,
                content,
                tool_calls,
            });
        }
    }
    (errors.len() == before).then_some(parsed)
}

/// A number field within `low ..= high`, or `default` when absent.
fn number_in(
    object: &Map<String, Value>,
    name: &str,
    low: f64,
    high: f64,
    default: f32,
    errors: &mut Vec<String>,
) -> f32 {
    match field(object, name) {
        None => default,
        Some(value) => match value.as_f64() {
            Some(x) if (low..=high).contains(&x) => x as f32,
            _ => {
                errors.push(format!("`{name}` must be a number from {low} to {high}, got {value}"));
                default
            }
        },
    }
}

/// `logit_bias`: `{"<token id>": bias}`, bias from -100 to 100.
fn parse_logit_bias(value: Option<&Value>, errors: &mut Vec<String>) -> Vec<(i32, f32)> {
    let Some(value) = value else {
        return Vec::new();
    };
    let Value::Object(map) = value else {
        errors.push(format!(
            "`logit_bias` must be an object mapping token ids to numbers, got {}",
            kind(value)
        ));
        return Vec::new();
    };
    let mut biases = Vec::with_capacity(map.len());
    for (token, bias) in map {
        match (token.parse::<i32>().ok().filter(|t| *t >= 0), bias.as_f64()) {
            (Some(token), Some(bias)) if (-100.0..=100.0).contains(&bias) => biases.push((token, bias as f32)),
            (None, _) => errors.push(format!("`logit_bias`: `{token}` is not a token id")),
            _ => errors.push(format!("`logit_bias.{token}` must be a number from -100 to 100")),
        }
    }
    biases
}

/// `response_format`: the grammar its JSON answer must follow, if any.
fn parse_response_format(value: Option<&Value>, errors: &mut Vec<String>) -> Option<Grammar> {
    let value = value?;
    let plain = |text: String| Grammar { text, trigger: None };
    let Value::Object(format) = value else {
        errors.push(format!("`response_format` must be an object, got {}", kind(value)));
        return None;
    };
    let allowed: &[&str] = match format.get("type").and_then(Value::as_str) {
        Some("text") => &["type"],
        Some("json_object") => &["type"],
        Some("json_schema") => &["type", "json_schema"],
        _ => {
            errors.push("`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"".into());
            return None;
        }
    };
    if let Some(key) = format.keys().find(|k| !allowed.contains(&k.as_str())) {
        errors.push(format!("`response_format`: unknown field `{key}`"));
        return None;
    }
    match format.get("type").and_then(Value::as_str) {
        Some("json_object") => Some(plain(grammar::any_object_gbnf())),
        Some("json_schema") => {
            let Some(Value::Object(spec)) = format.get("json_schema") else {
                errors.push("`response_format.json_schema` must be an object with `name` and `schema`".into());
                return None;
            };
            for (key, value) in spec {
                let fits = match key.as_str() {
                    "name" | "description" => value.is_string(),
                    "strict" => value.is_boolean() || value.is_null(),
                    "schema" => value.is_object() || value.is_boolean(),
                    _ => {
                        errors.push(format!("`response_format.json_schema`: unknown field `{key}`"));
                        return None;
                    }
                };
                if !fits {
                    errors.push(format!("`response_format.json_schema.{key}` has the wrong type"));
                    return None;
                }
            }
            let converted = match spec.get("schema") {
                Some(schema) => grammar::schema_to_gbnf(schema),
                None => Ok(grammar::any_object_gbnf()),
            };
            match converted {
                Ok(text) => Some(plain(text)),
                Err(error) => {
                    errors.push(format!(
                        "`response_format.json_schema.schema` cannot be enforced: {error}"
                    ));
                    None
                }
            }
        }
        _ => None,
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: the tools offered,
/// `None` when there are none or `tool_choice` is `none`.
fn parse_tools(object: &Map<String, Value>, errors: &mut Vec<String>) -> Option<Tools> {
    let parallel = match field(object, "parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            errors.push(format!("`parallel_tool_calls` must be a boolean, got {}", kind(other)));
            true
        }
    };
    let mut tools = Vec::new();
    match field(object, "tools") {
        None => {}
        Some(Value::Array(list)) if list.len() <= MAX_TOOLS => {
            for (i, item) in list.iter().enumerate() {
                match parse_tool(item) {
                    Ok(tool) if tools.iter().any(|t: &Tool| t.name == tool.name) => {
                        errors.push(format!("`tools[{i}]`: the name `{}` is used twice", tool.name));
                    }
                    Ok(tool) => tools.push(tool),
                    Err(error) => errors.push(format!("`tools[{i}]`: {error}")),
                }
            }
        }
        Some(_) => errors.push(format!(
            "`tools` must be an array of at most {MAX_TOOLS} {{\"type\": \"function\", \"function\": {{...}}}} objects"
        )),
    }
    let choice = match field(object, "tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                errors.push("`tool_choice` must be \"none\", \"auto\", \"required\" or a function".into());
                ToolChoice::None
            }
        },
        Some(Value::Object(choice)) => {
            let name = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| choice.get("type").and_then(Value::as_str) == Some("function"));
            match name {
                Some(name) if tools.iter().any(|t| t.name == name) => ToolChoice::Named(name.to_owned()),
                Some(name) => {
                    errors.push(format!("`tool_choice` names `{name}`, which is not in `tools`"));
                    ToolChoice::None
                }
                None => {
                    errors.push(
                        "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": ...}} when an object"
                            .into(),
                    );
                    ToolChoice::None
                }
            }
        }
        Some(other) => {
            errors.push(format!(
                "`tool_choice` must be a string or an object, got {}",
                kind(other)
            ));
            ToolChoice::None
        }
    };
    if tools.is_empty()
        && matches!(choice, ToolChoice::Required | ToolChoice::Auto)
        && field(object, "tool_choice").is_some()
    {
        errors.push("`tool_choice` needs `tools`".into());
    }
    let tools = Tools {
        tools,
        choice,
        parallel,
    };
    tools.active().then_some(tools)
}

fn parse_tool(item: &Value) -> Result<Tool, String> {
    let Some(object) = item.as_object() else {
        return Err("must be an object".into());
    };
    if object.get("type").and_then(Value::as_str) != Some("function") {
        return Err("`type` must be \"function\"".into());
    }
    if let Some(key) = object.keys().find(|k| *k != "type" && *k != "function") {
        return Err(format!("unknown field `{key}`"));
    }
    let Some(function) = object.get("function").and_then(Value::as_object) else {
        return Err("`function` must be an object with `name`".into());
    };
    if let Some(key) = function
        .keys()
        .find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
    {
        return Err(format!("`function`: unknown field `{key}`"));
    }
    let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err("`function.name` must be 1 to 64 letters, digits, underscores or dashes".into());
    }
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err("`function.description` must be a string".into()),
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => return Err("`function.parameters` must be a JSON Schema object".into()),
    };
    Ok(Tool {
        name: name.to_owned(),
        description,
        parameters,
    })
}

/// An assistant message's `tool_calls`, in OpenAI's shape.
fn parse_calls(calls: &Value, i: usize, errors: &mut Vec<String>) -> Vec<Call> {
    let Some(list) = calls.as_array() else {
        errors.push(format!("`messages[{i}].tool_calls` must be an array"));
        return Vec::new();
    };
    let mut parsed = Vec::with_capacity(list.len());
    for (j, call) in list.iter().enumerate() {
        let function = call.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let arguments = function.and_then(|f| f.get("arguments"));
        let arguments = match arguments {
            Some(Value::String(text)) => Some(text.clone()),
            Some(object @ Value::Object(_)) => Some(object.to_string()),
            None | Some(Value::Null) => Some("{}".to_owned()),
            Some(_) => None,
        };
        match (name, arguments) {
            (Some(name), Some(arguments)) if !name.contains('\0') && !arguments.contains('\0') => parsed.push(Call {
                id: call.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
                name: name.to_owned(),
                arguments,
            }),
            _ => errors.push(format!(
                "`messages[{i}].tool_calls[{j}]` must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"
            )),
        }
    }
    parsed
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
                    content: "hi".into(),
                    tool_calls: vec![],
                }]),
                max_tokens: None,
                sampling: Sampling::default(),
                stop: vec![],
                ignore_eos: false,
                n: 1,
                logprobs: None,
                grammar: None,
                tools: None,
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
                seed: Some(u64::MAX),
                ..Sampling::default()
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
                json!({"messages": [{"role": "user", "content": "x", "nam": "n"}]}),
                "unknown field `nam`",
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

    #[test]
    fn openai_sampling_fields() {
        let params = parse(json!({
            "prompt": "a", "min_p": 0.05, "presence_penalty": 1.5, "frequency_penalty": -0.5,
            "logit_bias": {"42": -100, "7": 3.5}, "n": 3, "logprobs": true, "top_logprobs": 2
        }))
        .unwrap();
        assert_eq!(params.sampling.min_p, 0.05);
        assert_eq!(params.sampling.presence_penalty, 1.5);
        assert_eq!(params.sampling.frequency_penalty, -0.5);
        let mut biases = params.sampling.logit_bias.clone();
        biases.sort_by_key(|b| b.0);
        assert_eq!(biases, [(7, 3.5), (42, -100.0)]);
        assert_eq!((params.n, params.logprobs), (3, Some(2)));
        assert_eq!(
            parse(json!({"prompt": "a", "logprobs": true})).unwrap().logprobs,
            Some(0)
        );
        assert_eq!(parse(json!({"prompt": "a", "logprobs": false})).unwrap().logprobs, None);
        for (input, needle) in [
            (json!({"prompt": "a", "n": 9}), "`n`"),
            (json!({"prompt": "a", "n": 0}), "`n`"),
            (json!({"prompt": "a", "min_p": 1.5}), "`min_p`"),
            (json!({"prompt": "a", "presence_penalty": 2.5}), "`presence_penalty`"),
            (json!({"prompt": "a", "frequency_penalty": "x"}), "`frequency_penalty`"),
            (json!({"prompt": "a", "logit_bias": {"x": 1}}), "`logit_bias`"),
            (json!({"prompt": "a", "logit_bias": {"1": 101}}), "`logit_bias.1`"),
            (json!({"prompt": "a", "top_logprobs": 2}), "needs `logprobs: true`"),
            (
                json!({"prompt": "a", "logprobs": true, "top_logprobs": 21}),
                "`top_logprobs`",
            ),
        ] {
            let error = parse(input.clone()).unwrap_err();
            assert!(error.contains(needle), "{input}: {error}");
        }
    }

    #[test]
    fn response_formats() {
        assert!(
            parse(json!({"prompt": "a", "response_format": {"type": "text"}}))
                .unwrap()
                .grammar
                .is_none()
        );
        let object = parse(json!({"prompt": "a", "response_format": {"type": "json_object"}})).unwrap();
        assert!(object.grammar.unwrap().text.starts_with("root ::= object"));
        let schema = parse(json!({"prompt": "a", "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "strict": true, "schema": {"type": "object",
                "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}))
        .unwrap();
        assert!(schema.grammar.unwrap().trigger.is_none());
        for (format, needle) in [
            (json!("json"), "`response_format` must be an object"),
            (json!({"type": "yaml"}), "`response_format.type`"),
            (json!({"type": "json_schema"}), "`response_format.json_schema` must be"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}),
                "`response_format.json_schema.schema` cannot be enforced: at /: the keyword `pattern`",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "shema": {}}}),
                "unknown field `shema`",
            ),
        ] {
            let error = parse(json!({"prompt": "a", "response_format": format})).unwrap_err();
            assert!(error.contains(needle), "{format}: {error}");
        }
        let error =
            parse(json!({"prompt": "a", "ignore_eos": true, "response_format": {"type": "json_object"}})).unwrap_err();
        assert!(error.contains("`ignore_eos` cannot be combined"), "{error}");
    }

    #[test]
    fn tools_and_tool_messages() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        let params = parse(json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ], "tools": tools, "tool_choice": "required"}))
        .unwrap();
        let Prompt::Chat(messages) = &params.prompt else {
            panic!("not a chat")
        };
        assert_eq!(messages[1].tool_calls[0].name, "get_weather");
        assert_eq!(messages[2].role, Role::Tool);
        assert_eq!(params.tools.as_ref().unwrap().choice, ToolChoice::Required);
        assert!(params.grammar.as_ref().unwrap().trigger.is_none());
        // auto is lazy; none offers nothing
        let auto = parse(json!({"prompt": "a", "tools": tools})).unwrap();
        assert_eq!(auto.grammar.unwrap().trigger.as_deref(), Some("<tool_call>"));
        let none = parse(json!({"prompt": "a", "tools": tools, "tool_choice": "none"})).unwrap();
        assert!(none.tools.is_none() && none.grammar.is_none());
        let named = parse(json!({"prompt": "a", "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
        .unwrap();
        assert_eq!(named.tools.unwrap().choice, ToolChoice::Named("get_weather".into()));
        for (input, needle) in [
            (
                json!({"prompt": "a", "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "not in `tools`",
            ),
            (
                json!({"prompt": "a", "tool_choice": "required"}),
                "`tool_choice` needs `tools`",
            ),
            (
                json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "`tools[0]`",
            ),
            (
                json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "x"}}}}}]}),
                "`tools[0].function.parameters/properties/x`",
            ),
            (
                json!({"prompt": "a", "raw": true, "tools": tools}),
                "`tools` need a chat",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}),
                "only assistant messages",
            ),
        ] {
            let error = parse(input.clone()).unwrap_err();
            assert!(error.contains(needle), "{input}: {error}");
        }
    }
}
