//! A text job's input: one typed struct ([`Input`]) that is both the parser
//! (every failure of every member reported at once, each with its place) and
//! the model's input schema ([`schema`]). [`Params::parse`] reads it, then
//! applies the rules between members and those that need the model (its
//! context length, the grammars of `response_format` and `tools`), all
//! problems joined with `"; "` in one `BadInput` message.

use std::collections::BTreeMap;

use gantry_input::{Between, Items, Real};
use gantry_worker_sdk::factory::ModelEntry;
use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::grammar;
use crate::tools::{Call, Grammar, Tool, ToolChoice, Tools};

/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 4;

/// Default `max_tokens` (lowered to what the context has room for when the
/// client does not give one).
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// Default sampling temperature.
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

/// Most choices one request may ask for.
pub const MAX_CHOICES: u64 = 8;

/// Most alternatives per token `top_logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Most tools one request may offer.
pub const MAX_TOOLS: usize = 128;

/// The context a manifest entry that states no `engine.context_tokens` gets.
const DEFAULT_CONTEXT_TOKENS: u64 = 8192;

gantry_input::bounds! {
    /// A sampling temperature.
    pub Temperature: 0.0..=2.0;
    /// A probability mass: above 0, at most 1.
    pub TopP: 0.0..=1.0, above_min;
    /// A share of the likeliest token's probability.
    pub MinP: 0.0..=1.0;
    /// OpenAI's presence and frequency penalties.
    pub Penalty: -2.0..=2.0;
    /// A bias added to a token's logit.
    pub Bias: -100.0..=100.0;
}

/// A text job's input, as a client sends it: `prompt` or `messages`, and
/// how to generate.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The text to continue (or the user message, unless raw). Give exactly
    /// one of prompt and messages.
    #[serde(default)]
    pub prompt: Option<String>,
    /// A chat: messages in order, formatted with the model's chat template.
    #[serde(default, deserialize_with = "non_empty")]
    #[schema(min_items = 1)]
    pub messages: Option<Vec<MessageInput>>,
    /// Most tokens to generate (per choice), at most the model's context
    /// length; without it 512, or less when the context has less room.
    #[serde(default)]
    #[schema(inline, default = 512)]
    pub max_tokens: Option<MaxTokens>,
    /// Sampling temperature; 0 is greedy.
    #[serde(default)]
    #[schema(inline, default = 0.7)]
    pub temperature: Option<Real<Temperature>>,
    /// Nucleus sampling mass; 1 turns it off.
    #[serde(default)]
    #[schema(inline, default = 1.0)]
    pub top_p: Option<Real<TopP>>,
    /// Sample among the k likeliest tokens; 0 turns it off.
    #[serde(default)]
    #[schema(inline, default = 0)]
    pub top_k: Option<Between<0, 2147483647>>,
    /// Drop tokens less likely than min_p times the likeliest one; 0 turns
    /// it off.
    #[serde(default)]
    #[schema(inline, default = 0.0)]
    pub min_p: Option<Real<MinP>>,
    /// Subtracted once from the logit of every token already generated.
    #[serde(default)]
    #[schema(inline, default = 0.0)]
    pub presence_penalty: Option<Real<Penalty>>,
    /// Subtracted from a token's logit for every time it was generated.
    #[serde(default)]
    #[schema(inline, default = 0.0)]
    pub frequency_penalty: Option<Real<Penalty>>,
    /// Token id (as a string of digits) to a bias added to its logit, from
    /// -100 to 100.
    #[serde(default)]
    #[schema(inline)]
    pub logit_bias: Option<BTreeMap<TokenId, Real<Bias>>>,
    /// Generation ends before any of these strings: one non-empty string, or
    /// an array of at most 4.
    #[serde(default)]
    #[schema(inline)]
    pub stop: Option<Stop>,
    /// Seed of the sampler, for repeatable output; without it, a random one.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Choices to generate; every choice's tokens are billed, the prompt once.
    #[serde(default)]
    #[schema(inline, default = 1)]
    pub n: Option<Between<1, { MAX_CHOICES }>>,
    /// Report each generated token's log-probability (the model's
    /// distribution, before sampling adjustments).
    #[serde(default)]
    #[schema(default = false)]
    pub logprobs: Option<bool>,
    /// Alternatives reported per token; needs logprobs.
    #[serde(default)]
    #[schema(inline, default = 0)]
    pub top_logprobs: Option<Between<0, { MAX_TOP_LOGPROBS }>>,
    /// The answer's format, enforced while generating by a grammar: text,
    /// any JSON object, or JSON matching a schema. A schema the grammar
    /// cannot express (pattern, not, multipleOf, ...) is refused.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call, as OpenAI describes them; calls come
    /// back in the choice's tool_calls.
    #[serde(default)]
    #[schema(inline)]
    pub tools: Option<Items<ToolInput, 0, { MAX_TOOLS }>>,
    /// auto (the default with tools): text or calls; required: calls only;
    /// a function: calls of it only; none: tools not offered. A named
    /// function must be in tools.
    #[serde(default)]
    #[schema(inline)]
    pub tool_choice: Option<ToolChoiceInput>,
    /// Several calls in one answer (as many as max_tokens leaves room for),
    /// or only 1 when false.
    #[serde(default)]
    #[schema(default = true)]
    pub parallel_tool_calls: Option<bool>,
    /// Pass the prompt as is, without the chat template (prompt only).
    #[serde(default)]
    #[schema(default = false)]
    pub raw: Option<bool>,
    /// Never end at the model's end-of-sequence tokens: generate until
    /// max_tokens, a stop string or a cancel. Not with response_format or
    /// tools.
    #[serde(default)]
    #[schema(default = false)]
    pub ignore_eos: Option<bool>,
}

/// One chat message, as OpenAI writes it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageInput {
    pub role: Role,
    /// The text; null only in an assistant message with tool_calls.
    #[serde(default)]
    #[schema(inline)]
    pub content: Option<Text>,
    /// The function calls an assistant message made, as OpenAI writes them.
    #[serde(default)]
    pub tool_calls: Option<Vec<CallInput>>,
    /// In a tool message: the call whose result this is.
    #[serde(default)]
    #[allow(dead_code)] // checked, not used: results are told apart by their order
    pub tool_call_id: Option<String>,
    /// The author's name; accepted, not used.
    #[serde(default)]
    #[allow(dead_code)] // checked, not used
    pub name: Option<String>,
}

/// A call an assistant message made. Members beyond these are ignored (as
/// OpenAI's clients may echo a streamed call's `index`).
#[derive(Debug, Deserialize, ToSchema)]
pub struct CallInput {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, rename = "type")]
    #[allow(dead_code)] // checked, not used: there is one kind
    pub kind: Option<FunctionKind>,
    pub function: CalledFunction,
}

/// The function a call named, and its arguments.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CalledFunction {
    #[schema(inline)]
    pub name: Text,
    /// The arguments object as JSON text (or the object itself); without
    /// it, no arguments.
    #[serde(default)]
    #[schema(inline)]
    pub arguments: Option<Arguments>,
}

/// The one kind of tool there is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

/// A tool offered to the model.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolInput {
    #[serde(rename = "type")]
    #[allow(dead_code)] // checked, not used: there is one kind
    pub kind: FunctionKind,
    pub function: FunctionInput,
}

/// A function the model may call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionInput {
    #[schema(inline)]
    pub name: FunctionName,
    #[serde(default)]
    pub description: Option<String>,
    // A JSON Schema is a document of its own, too free-form for a derived
    // schema: read as JSON (an object), its schema written in `schema()`.
    #[serde(default, deserialize_with = "schema_object")]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Accepted; the parameters are always enforced.
    #[serde(default)]
    #[allow(dead_code)] // checked, not used
    pub strict: Option<bool>,
}

/// `response_format`: `type`, and with `json_schema` the schema.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// text: free text; json_object: any JSON object; json_schema: JSON
    /// matching json_schema.schema.
    #[serde(rename = "type")]
    pub kind: FormatKind,
    /// With type json_schema (and only then): the schema to follow.
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// The kinds of answer `response_format` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FormatKind {
    Text,
    JsonObject,
    JsonSchema,
}

/// `response_format.json_schema`, as OpenAI writes it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `name`, `description` and `strict`: checked, not used
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    // A JSON Schema document (an object or a boolean): read as JSON, its
    // schema written in `schema()`.
    #[serde(default, deserialize_with = "schema_document")]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    /// Accepted; the schema is always enforced.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[schema(rename_all = "lowercase")]
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
}

/// Read by name, so that a role of another type is called not a string
/// (serde's derive would say "string or map").
impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let role = String::deserialize(deserializer)?;
        [Self::System, Self::User, Self::Assistant, Self::Tool]
            .into_iter()
            .find(|r| r.as_str() == role)
            .ok_or_else(|| D::Error::custom(format!("must be one of system, user, assistant, tool (got '{role}')")))
    }
}

// --- member types that check their own rule and state it -------------------

/// `max_tokens`: an integer from 1; the model's context length, its upper
/// bound, is checked once the input is read (and filled into the schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxTokens(pub u32);

impl<'de> Deserialize<'de> for MaxTokens {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Between::<1, { u32::MAX as u64 }>::deserialize(deserializer) {
            Ok(Between(n)) => Ok(Self(n as u32)),
            Err(_) => Err(D::Error::custom(
                "must be an integer from 1 to the model's context length",
            )),
        }
    }
}

impl PartialSchema for MaxTokens {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1.0))
            .into()
    }
}

impl ToSchema for MaxTokens {}

/// A string without NUL characters (the chat template and the tokenizer
/// read C strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.contains('\0') {
            return Err(D::Error::custom("must not contain NUL characters"));
        }
        Ok(Self(text))
    }
}

impl PartialSchema for Text {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).into()
    }
}

impl ToSchema for Text {}

/// A call's arguments: the object's JSON text, or the object itself (kept
/// as its text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arguments(pub String);

impl<'de> Deserialize<'de> for Arguments {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) if text.contains('\0') => Err(D::Error::custom("must not contain NUL characters")),
            Value::String(text) => Ok(Self(text)),
            object @ Value::Object(_) => Ok(Self(object.to_string())),
            other => Err(D::Error::custom(format!(
                "must be a string (the arguments object as JSON text) or an object, not {}",
                gantry_input::kind(&other)
            ))),
        }
    }
}

impl PartialSchema for Arguments {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::Array(vec![Type::String, Type::Object]))
            .into()
    }
}

impl ToSchema for Arguments {}

/// A function's name: 1 to 64 letters, digits, underscores or dashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionName(pub String);

impl<'de> Deserialize<'de> for FunctionName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        let fits =
            (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !fits {
            return Err(D::Error::custom(format!(
                "must be 1 to 64 letters, digits, underscores or dashes (got '{name}')"
            )));
        }
        Ok(Self(name))
    }
}

impl PartialSchema for FunctionName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Za-z0-9_-]{1,64}$"))
            .into()
    }
}

impl ToSchema for FunctionName {}

/// A `logit_bias` key: a token id, written as a string of digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokenId(pub i32);

impl<'de> Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = String::deserialize(deserializer)?;
        match key.parse::<i32>() {
            Ok(id) if id >= 0 => Ok(Self(id)),
            _ => Err(D::Error::custom("the key must be a token id, a string of digits")),
        }
    }
}

impl PartialSchema for TokenId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[0-9]{1,10}$"))
            .into()
    }
}

impl ToSchema for TokenId {}

/// `stop`: one non-empty string, or an array of at most
/// [`MAX_STOP_STRINGS`] of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop(pub Vec<String>);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) if !text.is_empty() => Ok(Self(vec![text])),
            Value::Array(items)
                if items.len() <= MAX_STOP_STRINGS
                    && items.iter().all(|s| s.as_str().is_some_and(|s| !s.is_empty())) =>
            {
                Ok(Self(
                    items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                ))
            }
            _ => Err(D::Error::custom(
                "must be a non-empty string or an array of at most 4 non-empty strings",
            )),
        }
    }
}

impl PartialSchema for Stop {
    fn schema() -> RefOr<Schema> {
        let text = || ObjectBuilder::new().schema_type(Type::String).min_length(Some(1));
        OneOfBuilder::new()
            .item(text())
            .item(ArrayBuilder::new().items(text()).max_items(Some(MAX_STOP_STRINGS)))
            .into()
    }
}

impl ToSchema for Stop {}

/// `tool_choice`: `none`, `auto`, `required`, or
/// `{"type": "function", "function": {"name": …}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoiceInput {
    None,
    Auto,
    Required,
    Function(String),
}

impl<'de> Deserialize<'de> for ToolChoiceInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(choice) => match choice.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                _ => Err(D::Error::custom(format!(
                    "must be one of none, auto, required (got '{choice}') or a function"
                ))),
            },
            Value::Object(choice) => choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| choice.get("type").and_then(Value::as_str) == Some("function"))
                .map(|name| Self::Function(name.to_owned()))
                .ok_or_else(|| {
                    D::Error::custom(r#"must be {"type": "function", "function": {"name": ...}} when an object"#)
                }),
            other => Err(D::Error::custom(format!(
                "must be a string or an object, not {}",
                gantry_input::kind(&other)
            ))),
        }
    }
}

impl PartialSchema for ToolChoiceInput {
    fn schema() -> RefOr<Schema> {
        let function = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["function"])),
            )
            .property(
                "function",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .property("name", ObjectBuilder::new().schema_type(Type::String))
                    .required("name"),
            )
            .required("type")
            .required("function");
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["none", "auto", "required"])),
            )
            .item(function)
            .into()
    }
}

impl ToSchema for ToolChoiceInput {}

/// `messages`: absent (or null), or an array of at least one message.
fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<MessageInput>>, D::Error> {
    match Option::<Vec<MessageInput>>::deserialize(deserializer)? {
        Some(messages) if messages.is_empty() => Err(D::Error::custom("must not be empty")),
        messages => Ok(messages),
    }
}

/// A tool's `parameters`: a JSON Schema object.
fn schema_object<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None => Ok(None),
        Some(schema @ Value::Object(_)) => Ok(Some(schema)),
        Some(other) => Err(D::Error::custom(format!(
            "must be a JSON Schema object, not {}",
            gantry_input::kind(&other)
        ))),
    }
}

/// `json_schema.schema`: a JSON Schema, an object or a boolean.
fn schema_document<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None => Ok(None),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(schema)),
        Some(other) => Err(D::Error::custom(format!(
            "must be a JSON Schema (an object or a boolean), not {}",
            gantry_input::kind(&other)
        ))),
    }
}

// --- the schema ----------------------------------------------------------

/// What the grammars enforce of a JSON Schema, said where one is given.
const SCHEMA_SUPPORT: &str = "Supported: type (or a list), properties, required, items, prefixItems, \
minItems, maxItems, enum, const, anyOf, oneOf, allOf of one schema, $ref into $defs or definitions, \
minLength, maxLength, formats date, time, date-time and uuid, small integer ranges. Anything else that \
constrains values (pattern, not, multipleOf, ...) is refused.";

/// The input schema of `entry`: [`Input`]'s, with the entry's context length
/// as `max_tokens`' bound, the choice between `prompt` and `messages`, and
/// the members that are JSON Schema documents themselves.
pub fn schema(entry: &ModelEntry) -> Value {
    let context = entry
        .engine
        .get("context_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_CONTEXT_TOKENS);
    let mut schema = gantry_input::schema_of::<Input>();
    schema["oneOf"] = json!([{"required": ["prompt"]}, {"required": ["messages"]}]);
    let properties = &mut schema["properties"];
    properties["max_tokens"]["maximum"] = json!(context);
    // `type` decides whether `json_schema` is given.
    properties["response_format"]["oneOf"] = json!([
        {"properties": {"type": {"enum": ["text", "json_object"]}}, "not": {"required": ["json_schema"]}},
        {"properties": {"type": {"const": "json_schema"}}, "required": ["json_schema"]}
    ]);
    properties["response_format"]["properties"]["json_schema"]["properties"]["schema"] = json!({
        "type": ["object", "boolean"],
        "description": format!("The JSON Schema the answer must match, enforced while generating; \
    without it, any JSON object. {SCHEMA_SUPPORT}")
    });
    properties["tools"]["items"]["properties"]["function"]["properties"]["parameters"] = json!({
        "type": "object",
        "description": format!("A JSON Schema of the arguments object; without it, \
    {{\"type\": \"object\", \"properties\": {{}}}}. {SCHEMA_SUPPORT}")
    });
    schema
}

// --- the validated request ------------------------------------------------

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
    /// Reads `input` as [`Input`], then the rules between its members and
    /// those that need the model. `context_length` is the most tokens (prompt
    /// and output together) one request may use. The error lists every
    /// problem, separated by `"; "`.
    pub fn parse(input: &Value, context_length: u32) -> Result<Self, String> {
        let input: Input = gantry_input::read(input.clone()).map_err(|failures| gantry_input::sentence(&failures))?;
        let mut errors: Vec<String> = Vec::new();
        let raw = input.raw.unwrap_or(false);
        let ignore_eos = input.ignore_eos.unwrap_or(false);
        let prompt = match (input.prompt, input.messages) {
            (None, None) => {
                errors.push("one of `prompt` (a string) or `messages` (an array) is required".into());
                None
            }
            (Some(_), Some(_)) => {
                errors.push("give either `prompt` or `messages`, not both".into());
                None
            }
            (Some(text), None) if raw => Some(Prompt::Raw(text)),
            (Some(text), None) if text.contains('\0') => {
                errors.push("`prompt` must not contain NUL characters (unless `raw` is true)".into());
                None
            }
            (Some(text), None) => Some(Prompt::Chat(vec![Message {
                role: Role::User,
                content: text,
                tool_calls: Vec::new(),
            }])),
            (None, Some(messages)) => {
                if raw {
                    errors.push("`raw` applies only to `prompt`; `messages` always use the chat template".into());
                }
                Some(Prompt::Chat(chat(messages, &mut errors)))
            }
        };

        let max_tokens = input.max_tokens.map(|n| n.0);
        if let Some(n) = max_tokens.filter(|n| *n > context_length) {
            errors.push(format!(
                "`max_tokens` must be an integer from 1 to {context_length}, got {n}"
            ));
        }
        let logprobs = input.logprobs.unwrap_or(false);
        let top_logprobs = input.top_logprobs.map_or(0, |k| k.0 as u32);
        if !logprobs && top_logprobs > 0 {
            errors.push("`top_logprobs` needs `logprobs: true`".into());
        }

        let response = input
            .response_format
            .and_then(|format| response_grammar(format, &mut errors));
        let tools = offered_tools(
            input.tools.map(|tools| tools.0).unwrap_or_default(),
            input.tool_choice,
            input.parallel_tool_calls.unwrap_or(true),
            &mut errors,
        );
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

        let (Some(prompt), true) = (prompt, errors.is_empty()) else {
            return Err(errors.join("; "));
        };
        let real = |value: Option<f64>, default: f32| value.map_or(default, |x| x as f32);
        Ok(Self {
            prompt,
            max_tokens,
            sampling: Sampling {
                temperature: real(input.temperature.map(|t| t.0), DEFAULT_TEMPERATURE),
                top_p: real(input.top_p.map(|p| p.0), 1.0),
                top_k: input.top_k.map_or(0, |k| k.0 as u32),
                seed: input.seed,
                min_p: real(input.min_p.map(|p| p.0), 0.0),
                presence_penalty: real(input.presence_penalty.map(|p| p.0), 0.0),
                frequency_penalty: real(input.frequency_penalty.map(|p| p.0), 0.0),
                logit_bias: input
                    .logit_bias
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(token, bias)| (token.0, bias.0 as f32))
                    .collect(),
            },
            stop: input.stop.map(|stop| stop.0).unwrap_or_default(),
            ignore_eos,
            n: input.n.map_or(1, |n| n.0 as u32),
            logprobs: logprobs.then_some(top_logprobs),
            grammar,
            tools,
        })
    }
}

/// The chat of `messages`: only assistant messages make calls, and a message
/// has content unless it makes calls.
fn chat(messages: Vec<MessageInput>, errors: &mut Vec<String>) -> Vec<Message> {
    let mut chat = Vec::with_capacity(messages.len());
    for (i, message) in messages.into_iter().enumerate() {
        let tool_calls: Vec<Call> = match message.tool_calls {
            None => Vec::new(),
            Some(calls) if message.role == Role::Assistant => calls
                .into_iter()
                .map(|call| Call {
                    id: call.id.unwrap_or_default(),
                    name: call.function.name.0,
                    arguments: call.function.arguments.map_or_else(|| "{}".to_owned(), |a| a.0),
                })
                .collect(),
            Some(_) => {
                errors.push(format!(
                    "`messages[{i}].tool_calls`: only assistant messages make calls"
                ));
                Vec::new()
            }
        };
        let content = match message.content {
            Some(text) => text.0,
            // An assistant message that only calls tools has no content.
            None if !tool_calls.is_empty() => String::new(),
            None => {
                errors.push(format!("`messages[{i}].content` must be a string"));
                continue;
            }
        };
        chat.push(Message {
            role: message.role,
            content,
            tool_calls,
        });
    }
    chat
}

/// `response_format`'s grammar, if the answer's text has one: `json_schema`
/// comes with type `json_schema` only, and its schema must be one the
/// grammar can express.
fn response_grammar(format: ResponseFormat, errors: &mut Vec<String>) -> Option<Grammar> {
    let plain = |text: String| Grammar { text, trigger: None };
    match (format.kind, format.json_schema) {
        (FormatKind::Text, None) => None,
        (FormatKind::JsonObject, None) => Some(plain(grammar::any_object_gbnf())),
        (FormatKind::Text | FormatKind::JsonObject, Some(_)) => {
            errors.push("`response_format`: unknown field `json_schema`".into());
            None
        }
        (FormatKind::JsonSchema, None) => {
            errors.push("`response_format.json_schema` must be an object with `name` and `schema`".into());
            None
        }
        (FormatKind::JsonSchema, Some(spec)) => {
            let converted = match &spec.schema {
                Some(schema) => grammar::schema_to_gbnf(schema),
                None => Ok(grammar::any_object_gbnf()),
            };
            converted
                .map_err(|error| {
                    errors.push(format!(
                        "`response_format.json_schema.schema` cannot be enforced: {error}"
                    ));
                })
                .ok()
                .map(plain)
        }
    }
}

/// The tools offered: `None` when there are none or `tool_choice` is
/// `none`. Names are unique, a named choice is one of them, and `auto` or
/// `required` need some.
fn offered_tools(
    given: Vec<ToolInput>,
    choice: Option<ToolChoiceInput>,
    parallel: bool,
    errors: &mut Vec<String>,
) -> Option<Tools> {
    let mut tools: Vec<Tool> = Vec::with_capacity(given.len());
    for (i, tool) in given.into_iter().enumerate() {
        let function = tool.function;
        if tools.iter().any(|t| t.name == function.name.0) {
            errors.push(format!("`tools[{i}]`: the name `{}` is used twice", function.name.0));
            continue;
        }
        tools.push(Tool {
            name: function.name.0,
            description: function.description,
            parameters: function
                .parameters
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    let asked = choice.is_some();
    let choice = match choice {
        None if tools.is_empty() => ToolChoice::None,
        None | Some(ToolChoiceInput::Auto) => ToolChoice::Auto,
        Some(ToolChoiceInput::None) => ToolChoice::None,
        Some(ToolChoiceInput::Required) => ToolChoice::Required,
        Some(ToolChoiceInput::Function(name)) if tools.iter().any(|t| t.name == name) => ToolChoice::Named(name),
        Some(ToolChoiceInput::Function(name)) => {
            errors.push(format!("`tool_choice` names `{name}`, which is not in `tools`"));
            ToolChoice::None
        }
    };
    if asked && tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Auto) {
        errors.push("`tool_choice` needs `tools`".into());
    }
    let tools = Tools {
        tools,
        choice,
        parallel,
    };
    tools.active().then_some(tools)
}

#[cfg(test)]
mod tests;
