//! The request bodies of the OpenAI text routes as types: [`ChatRequest`]
//! and [`CompletionRequest`] are the documents' schemas (`ToSchema`), their
//! parsers (through [`crate::body::parse_body`], every failure at once) and
//! their rules (each member's type checks its range while it is read). A
//! valid body becomes a [`TextRequest`]: the text model's job input, and how
//! to answer.
//!
//! What the model checks itself with its own grammar and knowledge
//! (`response_format`, `tools`, `tool_choice`) is typed as JSON here and
//! passed on; its refusal comes back as a 400 naming the member.
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use crate::body::{Failures, RequestBody};

/// Most log-probability alternatives the legacy `logprobs` may ask for (OpenAI's limit).
pub(super) const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// OpenAI members for what the platform does not do, each refused by name
/// (unless null) with the reason. They are not in the documents.
pub(super) const UNSUPPORTED: [(&str, &str); 5] = [
    ("functions", "the deprecated `functions` are not supported; use `tools`"),
    (
        "function_call",
        "the deprecated `function_call` is not supported; use `tool_choice`",
    ),
    ("audio", "audio output is not supported: these are text models"),
    ("modalities", "only text output is supported"),
    ("prediction", "predicted outputs are not supported"),
];

/// A valid OpenAI request: the model's job input and how to answer.
#[derive(Debug)]
pub(super) struct TextRequest {
    pub input: Map<String, Value>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Declares a request type: its own members, then the members both
/// operations take (one list, so the two documents cannot drift apart).
macro_rules! text_request {
    ($(#[$meta:meta])* $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        #[derive(Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $name {
            $($own)*
            /// Ignored: the model is the one in the path.
            #[serde(default)]
            #[allow(dead_code)] // accepted, not used
            model: Option<String>,
            #[serde(default, deserialize_with = "positive")]
            #[schema(value_type = Option<u64>, minimum = 1)]
            max_tokens: Option<u64>,
            #[serde(default, deserialize_with = "positive")]
            #[schema(value_type = Option<u64>, minimum = 1)]
            max_completion_tokens: Option<u64>,
            #[serde(default, deserialize_with = "temperature")]
            #[schema(value_type = Option<f64>, minimum = 0, maximum = 2)]
            temperature: Option<Value>,
            #[serde(default, deserialize_with = "top_p")]
            #[schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 1)]
            top_p: Option<Value>,
            /// An extension: sample among the k likeliest tokens.
            #[serde(default, deserialize_with = "natural")]
            #[schema(value_type = Option<u64>, minimum = 0)]
            top_k: Option<u64>,
            /// An extension: drop tokens less likely than `min_p` times the likeliest one.
            #[serde(default, deserialize_with = "min_p")]
            #[schema(value_type = Option<f64>, minimum = 0, maximum = 1)]
            min_p: Option<Value>,
            #[serde(default, deserialize_with = "natural")]
            #[schema(value_type = Option<u64>, minimum = 0)]
            seed: Option<u64>,
            #[serde(default, deserialize_with = "stop")]
            #[schema(value_type = Object)] // shape: written_schemas()
            stop: Option<Value>,
            /// Choices to generate; every choice's tokens are billed, the prompt once.
            #[serde(default, deserialize_with = "choices")]
            #[schema(value_type = Option<u64>, minimum = 1, maximum = 8)]
            n: Option<u64>,
            #[serde(default, deserialize_with = "penalty")]
            #[schema(value_type = Option<f64>, minimum = -2, maximum = 2)]
            presence_penalty: Option<Value>,
            #[serde(default, deserialize_with = "penalty")]
            #[schema(value_type = Option<f64>, minimum = -2, maximum = 2)]
            frequency_penalty: Option<Value>,
            /// Token id (a string of digits) to a bias from -100 to 100.
            #[serde(default, deserialize_with = "logit_bias")]
            #[schema(value_type = Object)] // shape: written_schemas()
            logit_bias: Option<Value>,
            /// Accepted and not used.
            #[serde(default)]
            #[allow(dead_code)] // accepted, not used
            user: Option<String>,
            #[serde(default)]
            stream: Option<bool>,
            #[serde(default)]
            #[schema(inline)]
            stream_options: Option<StreamOptions>,
            /// Accepted and not used: every request is a job, kept as jobs are.
            #[serde(default)]
            #[allow(dead_code)] // accepted, not used
            store: Option<bool>,
            /// Accepted and not used.
            #[serde(default)]
            #[schema(value_type = Option<Object>)]
            #[allow(dead_code)] // accepted, not used
            metadata: Option<Map<String, Value>>,
        }

    };
}

/// The common members, taken out of either request type.
struct Common {
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    top_k: Option<u64>,
    min_p: Option<Value>,
    seed: Option<u64>,
    stop: Option<Value>,
    n: Option<u64>,
    presence_penalty: Option<Value>,
    frequency_penalty: Option<Value>,
    logit_bias: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

/// The members both operations take, into the model's input; whether to
/// stream, and whether the stream ends with the usage.
fn apply_common(common: Common, input: &mut Map<String, Value>) -> (bool, bool) {
    if let Some(n) = common.max_completion_tokens.or(common.max_tokens) {
        input.insert("max_tokens".into(), n.into());
    }
    for (name, value) in [
        ("temperature", common.temperature),
        ("top_p", common.top_p),
        ("min_p", common.min_p),
        ("presence_penalty", common.presence_penalty),
        ("frequency_penalty", common.frequency_penalty),
        ("stop", common.stop),
        ("logit_bias", common.logit_bias),
    ] {
        if let Some(value) = value {
            input.insert(name.into(), value);
        }
    }
    for (name, value) in [("top_k", common.top_k), ("seed", common.seed), ("n", common.n)] {
        if let Some(value) = value {
            input.insert(name.into(), value.into());
        }
    }
    let include_usage = common.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    (common.stream.unwrap_or(false), include_usage)
}

/// Takes the common members out of a request (the rest stays for its own use).
macro_rules! common_of {
    ($body:expr) => {
        Common {
            max_tokens: $body.max_tokens,
            max_completion_tokens: $body.max_completion_tokens,
            temperature: $body.temperature,
            top_p: $body.top_p,
            top_k: $body.top_k,
            min_p: $body.min_p,
            seed: $body.seed,
            stop: $body.stop,
            n: $body.n,
            presence_penalty: $body.presence_penalty,
            frequency_penalty: $body.frequency_penalty,
            logit_bias: $body.logit_bias,
            stream: $body.stream,
            stream_options: $body.stream_options,
        }
    };
}

text_request! {
    /// An OpenAI chat completion request.
    ChatRequest {
        #[serde(deserialize_with = "messages")]
        #[schema(value_type = Object)] // shape: written_schemas()
        messages: Vec<Value>,
        /// Each generated token's log-probability under the model (before sampling adjustments).
        #[serde(default)]
        logprobs: Option<bool>,
        /// Alternatives per token; needs `logprobs: true`.
        #[serde(default, deserialize_with = "top_logprobs")]
        #[schema(value_type = Option<u64>, minimum = 0, maximum = 20)]
        top_logprobs: Option<u64>,
        #[serde(default)]
        #[schema(value_type = Object)] // shape: written_schemas()
        response_format: Option<Value>,
        #[serde(default)]
        #[schema(value_type = Object)] // shape: written_schemas()
        tools: Option<Value>,
        /// `auto` (the default with tools): text or calls; `required`: calls; a function: calls of it;
        /// `none`: the tools are not offered. A named function must be in `tools`.
        #[serde(default)]
        #[schema(value_type = Object)] // shape: written_schemas()
        tool_choice: Option<Value>,
        /// As many calls in one answer as `max_tokens` leaves room for (the default), or 1 when false.
        #[serde(default)]
        parallel_tool_calls: Option<bool>,
    }
}

text_request! {
    /// An OpenAI (legacy) completion request.
    CompletionRequest {
        #[serde(deserialize_with = "prompt")]
        #[schema(value_type = Object)] // shape: written_schemas()
        prompt: String,
        /// Log-probabilities of the generated tokens with this many alternatives each.
        #[serde(default, deserialize_with = "completion_logprobs")]
        #[schema(value_type = Option<u64>, minimum = 0, maximum = 5)]
        logprobs: Option<u64>,
        /// Only false: the prompt is never repeated.
        #[serde(default, deserialize_with = "echo")]
        #[schema(value_type = Object)] // shape: written_schemas()
        #[allow(dead_code)] // read for its rule only
        echo: Option<bool>,
        /// Not supported: no fill-in-the-middle.
        #[serde(default, deserialize_with = "suffix")]
        #[schema(value_type = Object)] // shape: written_schemas()
        #[allow(dead_code)] // read for its rule only
        suffix: Option<String>,
        #[serde(default, deserialize_with = "best_of")]
        #[schema(value_type = Object)] // shape: written_schemas()
        #[allow(dead_code)] // read for its rule only
        best_of: Option<u64>,
    }
}

/// `stream_options`: only `include_usage`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

impl RequestBody for ChatRequest {
    type Context = ();
    type Valid = TextRequest;

    fn validate(self, _: &(), _: &mut Failures) -> Option<TextRequest> {
        let mut input = Map::new();
        input.insert("messages".into(), Value::Array(self.messages));
        // Passed on as they are: the model checks them and names them when it refuses.
        let own = [
            ("logprobs", self.logprobs.map(Value::Bool)),
            ("top_logprobs", self.top_logprobs.map(Value::from)),
            // `{"type": "text"}` is what the model does anyway.
            (
                "response_format",
                self.response_format.filter(|f| *f != json!({"type": "text"})),
            ),
            ("tools", self.tools),
            ("tool_choice", self.tool_choice),
            ("parallel_tool_calls", self.parallel_tool_calls.map(Value::Bool)),
        ];
        let (stream, include_usage) = apply_common(common_of!(self), &mut input);
        input.extend(
            own.into_iter()
                .filter_map(|(name, value)| Some((name.to_owned(), value?))),
        );
        Some(TextRequest {
            input,
            stream,
            include_usage,
        })
    }
}

impl RequestBody for CompletionRequest {
    type Context = ();
    type Valid = TextRequest;

    fn validate(self, _: &(), _: &mut Failures) -> Option<TextRequest> {
        let mut input = Map::new();
        input.insert("prompt".into(), Value::String(self.prompt));
        input.insert("raw".into(), Value::Bool(true));
        // The legacy `logprobs` is the number of alternatives.
        let logprobs = self.logprobs;
        let (stream, include_usage) = apply_common(common_of!(self), &mut input);
        if let Some(k) = logprobs {
            input.insert("logprobs".into(), Value::Bool(true));
            input.insert("top_logprobs".into(), k.into());
        }
        Some(TextRequest {
            input,
            stream,
            include_usage,
        })
    }
}

// --- the members' rules, each checked while the member is read ------------

/// A member's value, or `None` for null.
fn nullable<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Ok(Option::<Value>::deserialize(deserializer)?.filter(|v| !v.is_null()))
}

/// An integer from `low` to `high`; JSON has one number type, so 40 and
/// 40.0 are the same integer.
fn integer<'de, D: Deserializer<'de>>(
    deserializer: D,
    low: u64,
    high: u64,
    rule: &str,
) -> Result<Option<u64>, D::Error> {
    let Some(value) = nullable(deserializer)? else {
        return Ok(None);
    };
    let n = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(f))
            .map(|f| f as u64)
    });
    match n {
        Some(n) if (low..=high).contains(&n) => Ok(Some(n)),
        _ => Err(D::Error::custom(rule)),
    }
}

fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    integer(d, 1, u64::MAX, "must be a positive integer")
}

fn natural<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    integer(d, 0, u64::MAX, "must be a non-negative integer")
}

fn choices<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    integer(d, 1, 8, "must be an integer from 1 to 8")
}

fn top_logprobs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    integer(d, 0, 20, "must be an integer from 0 to 20")
}

fn completion_logprobs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    integer(d, 0, MAX_COMPLETION_LOGPROBS, "must be an integer from 0 to 5")
}

/// A number that `accepts` allows; kept as the JSON number it was.
fn number<'de, D: Deserializer<'de>>(
    deserializer: D,
    accepts: fn(f64) -> bool,
    range: &str,
) -> Result<Option<Value>, D::Error> {
    match nullable(deserializer)? {
        None => Ok(None),
        Some(value) if value.as_f64().is_some_and(accepts) => Ok(Some(value)),
        Some(_) => Err(D::Error::custom(format!("must be a number {range}"))),
    }
}

fn temperature<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    number(d, |t| (0.0..=2.0).contains(&t), "from 0 to 2")
}

fn top_p<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    number(d, |p| p > 0.0 && p <= 1.0, "greater than 0 and at most 1")
}

fn min_p<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    number(d, |p| (0.0..=1.0).contains(&p), "from 0 to 1")
}

fn penalty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    number(d, |p| (-2.0..=2.0).contains(&p), "from -2 to 2")
}

fn stop<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match nullable(d)? {
        None => Ok(None),
        Some(value @ Value::String(_)) => Ok(Some(value)),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok(Some(Value::Array(items))),
        Some(_) => Err(D::Error::custom("must be a string or an array of strings")),
    }
}

fn logit_bias<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match nullable(d)? {
        None => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value)),
        Some(_) => Err(D::Error::custom("must be an object mapping token ids to biases")),
    }
}

/// `messages`: a non-empty array, each message in the model's input shape.
fn messages<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    let list = match Value::deserialize(d)? {
        Value::Array(list) if !list.is_empty() => list,
        _ => return Err(D::Error::custom("required, a non-empty array of messages")),
    };
    let mut messages = Vec::with_capacity(list.len());
    let mut problems = Vec::new();
    for (i, message) in list.iter().enumerate() {
        match chat_message(message) {
            Ok(m) => messages.push(m),
            Err(e) => problems.push(format!("[{i}]: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(messages)
    } else {
        Err(D::Error::custom(problems.join("; ")))
    }
}

/// One chat message in the model's input shape: `{role, content}`, with
/// `developer` read as `system` and content parts of type `text` joined.
fn chat_message(message: &Value) -> Result<Value, String> {
    let role = match message.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some("tool") => "tool",
        Some(other) => {
            return Err(format!(
                "role '{other}' is not supported (system, developer, user, assistant, tool)"
            ));
        }
        None => return Err("role: required".into()),
    };
    let tool_calls = message.get("tool_calls").filter(|v| !v.is_null());
    let content = match message.get("content") {
        Some(Value::String(text)) => Value::String(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(piece)) => text.push_str(piece),
                    _ => return Err("content: only text parts are supported".into()),
                }
            }
            Value::String(text)
        }
        // An assistant message that only calls tools has no content.
        None | Some(Value::Null) if role == "assistant" && tool_calls.is_some() => Value::Null,
        _ => return Err("content: required, a string".into()),
    };
    let mut out = json!({ "role": role, "content": content });
    if let Some(calls) = tool_calls {
        out["tool_calls"] = calls.clone();
    }
    if role == "tool"
        && let Some(id) = message.get("tool_call_id").filter(|v| v.is_string())
    {
        out["tool_call_id"] = id.clone();
    }
    Ok(out)
}

/// `prompt`: one prompt, a string or an array of one string.
fn prompt<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(text) => Ok(text),
        Value::Array(mut list) if list.len() == 1 && list[0].is_string() => match list.pop() {
            Some(Value::String(text)) => Ok(text),
            _ => Err(D::Error::custom("required, a string")),
        },
        Value::Array(_) => Err(D::Error::custom(
            "one prompt per request (a string, or an array of one string)",
        )),
        _ => Err(D::Error::custom("required, a string")),
    }
}

/// Members accepted only at the value that changes nothing.
fn echo<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    match nullable(d)? {
        None | Some(Value::Bool(false)) => Ok(None),
        Some(_) => Err(D::Error::custom("not supported: the answer never repeats the prompt")),
    }
}

fn suffix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match nullable(d)? {
        None => Ok(None),
        Some(Value::String(text)) if text.is_empty() => Ok(None),
        Some(_) => Err(D::Error::custom(
            "not supported: these models do not fill in text between a prompt and a suffix",
        )),
    }
}

fn best_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match nullable(d)? {
        None => Ok(None),
        Some(value) if value == json!(1) => Ok(Some(1)),
        Some(_) => Err(D::Error::custom("not supported (only 1); ask for `n` choices instead")),
    }
}

// --- the members' schemas where a derive cannot say them ---------------------

/// The members whose shapes a derive cannot state (one of several forms,
/// JSON Schema documents of their own, values accepted only at their
/// neutral setting), as JSON Schema, per operation's path. The typed
/// requests list these members (so the names, what is required and
/// `additionalProperties` come from the types); the documents take their
/// shapes from here (the `openapi` module sets them), and a test checks
/// that both name the same members.
pub(crate) fn written_schemas() -> [(&'static str, Vec<(&'static str, Value)>); 2] {
    let common = || vec![("stop", stop_schema()), ("logit_bias", logit_bias_schema())];
    let mut chat = common();
    chat.extend([
        ("messages", messages_schema()),
        ("response_format", response_format_schema()),
        ("tools", tools_schema()),
        ("tool_choice", tool_choice_schema()),
    ]);
    let mut completion = common();
    completion.extend([
        ("prompt", prompt_schema()),
        ("echo", echo_schema()),
        ("suffix", suffix_schema()),
        ("best_of", best_of_schema()),
    ]);
    [
        ("/v2/{model_id}/openai/v1/chat/completions", chat),
        ("/v2/{model_id}/openai/v1/completions", completion),
    ]
}

fn stop_schema() -> Value {
    json!({"oneOf": [
        {"type": "null"},
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4}
    ]})
}

fn logit_bias_schema() -> Value {
    json!({"type": ["object", "null"], "description": "Token id (a string of digits) to a bias from -100 to 100.",
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})
}

fn messages_schema() -> Value {
    let function_call = json!({"type": "object", "required": ["function"], "properties": {
        "id": {"type": "string"}, "type": {"const": "function"},
        "function": {"type": "object", "required": ["name", "arguments"], "properties": {
            "name": {"type": "string"}, "arguments": {"type": "string", "description": "The arguments object as JSON text."}}}}});
    json!({
        "type": "array", "minItems": 1,
        "items": {"type": "object", "required": ["role"], "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"oneOf": [
                {"type": "string"},
                {"type": "null", "description": "Only in an assistant message with `tool_calls`."},
                {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}
            ]},
            "tool_calls": {"type": "array", "items": function_call, "description": "The calls an assistant message made."},
            "tool_call_id": {"type": "string", "description": "In a `tool` message: the call it answers."}
        }}
    })
}

fn response_format_schema() -> Value {
    json!({"oneOf": [
        {"type": "null"},
        {"type": "object", "required": ["type"], "additionalProperties": false,
            "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"], "additionalProperties": false, "properties": {
            "type": {"const": "json_schema"},
            "json_schema": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "schema": {"type": "object", "description": "A JSON Schema, enforced while generating. Supported: \
    type (or a list), properties, required, items, prefixItems, minItems, maxItems, enum, const, anyOf, oneOf, allOf of \
    one schema, $ref into $defs or definitions, minLength, maxLength, formats date, time, date-time and uuid, small integer \
    ranges. Anything else that constrains values (pattern, not, multipleOf, ...) is refused with 400."},
                "strict": {"type": ["boolean", "null"], "description": "Accepted; the schema is always enforced."}
            }}
        }}
    ]})
}

fn tools_schema() -> Value {
    json!({"type": ["array", "null"], "maxItems": 128, "items": {
    "type": "object", "required": ["type", "function"], "additionalProperties": false, "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "additionalProperties": false, "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "description": {"type": "string"},
            "parameters": {"type": "object", "description": "A JSON Schema of the arguments (the same support as `response_format`)."},
            "strict": {"type": ["boolean", "null"]}
        }}
    }}})
}

fn tool_choice_schema() -> Value {
    json!({"oneOf": [
        {"type": "null"},
        {"enum": ["none", "auto", "required"]},
        {"type": "object", "required": ["type", "function"], "properties": {
            "type": {"const": "function"},
            "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
        }}
    ], "description": "`auto` (the default with tools): text or calls; `required`: calls; a function: calls of it; \
`none`: the tools are not offered. A named function must be in `tools`."})
}

fn prompt_schema() -> Value {
    json!({"oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1}
    ]})
}

fn echo_schema() -> Value {
    json!({"enum": [false, null], "description": "Only false: the prompt is never repeated."})
}

fn suffix_schema() -> Value {
    json!({"enum": ["", null], "description": "Not supported: no fill-in-the-middle."})
}

fn best_of_schema() -> Value {
    json!({"enum": [1, null]})
}

#[cfg(test)]
mod tests {
    use super::{ChatRequest, CompletionRequest, written_schemas};
    use crate::handlers::openai::members;

    /// Every written shape belongs to a member the type reads, and the
    /// served documents show it.
    #[test]
    fn the_written_shapes_are_of_members_the_types_read() {
        let doc = crate::openapi::public_openapi_json();
        for ((path, written), read) in written_schemas()
            .into_iter()
            .zip([members::<ChatRequest>(), members::<CompletionRequest>()])
        {
            let served = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
            for (member, schema) in written {
                assert!(read.iter().any(|m| m == member), "{path}: {member} is not read");
                assert_eq!(served["properties"][member], schema, "{path}: {member}");
            }
        }
    }
}
