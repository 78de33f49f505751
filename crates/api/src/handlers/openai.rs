//! OpenAI-compatible routes for text models, on the public listener:
//! `POST /v2/{model_id}/openai/v1/chat/completions`, `POST …/completions` and
//! `GET …/models`. A request becomes an ordinary job of the model (so it is
//! queued, scheduled, billed and visible like any other), and its answer is
//! rendered in OpenAI's shapes, streamed as `chat.completion.chunk` /
//! `text_completion` events ending with `data: [DONE]` when `stream` is true.
//! Errors on these routes use OpenAI's error shape (see [`openai_errors`]).
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use gantry_auth::Scope;
use gantry_catalog::{ModelKind, ModelSpec};
use gantry_jobs::{Follow, Frame, JobStatus, JobView, Mode, NewJob};
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::body::read_json;
use crate::handlers::live;
use crate::middleware::Caller;
use crate::problem::{ApiError, PROBLEM_JSON};

/// Largest request body of these routes.
const BODY_LIMIT: usize = 4 * 1024 * 1024;
/// How long a non-streaming request waits for its job.
const WAIT: Duration = Duration::from_secs(300);

/// Which OpenAI operation a request is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn object(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl-",
            Kind::Completion => "cmpl-",
        }
    }
}

/// The error body of the OpenAI-compatible routes.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = OpenAIErrorResponse)]
pub struct OpenAiErrorResponse<'a> {
    error: OpenAiError<'a>,
}

/// One error, as OpenAI's API reports it.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = OpenAIError)]
pub struct OpenAiError<'a> {
    /// What went wrong, every validation failure included.
    message: &'a str,
    /// `invalid_request_error`, `authentication_error`, `permission_error`, `rate_limit_error`, `server_error`, …
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
fn error_response(status: StatusCode, message: &str, param: Option<&str>) -> HttpResponse {
    let (kind, code) = match status.as_u16() {
        400 | 413 | 415 | 422 => ("invalid_request_error", None),
        401 => ("authentication_error", Some("invalid_api_key")),
        402 => ("insufficient_quota", Some("insufficient_quota")),
        403 => ("permission_error", None),
        404 => ("invalid_request_error", Some("model_not_found")),
        408 | 504 => ("timeout", None),
        429 => ("rate_limit_error", Some("rate_limit_exceeded")),
        _ => ("server_error", None),
    };
    let body = OpenAiErrorResponse {
        error: OpenAiError {
            message,
            kind,
            param,
            code,
        },
    };
    HttpResponse::build(status)
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(serde_json::to_string(&body).unwrap_or_default())
}

/// An error of these routes before any job exists, rendered by [`error_response`].
struct Refusal {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status,
            message: message.into(),
            param,
        }
    }

    fn response(&self) -> HttpResponse {
        error_response(self.status, &self.message, self.param)
    }
}

/// Rewrites every problem+json answer of an OpenAI route (authentication,
/// scopes, rate limits, unknown models, body limits) into OpenAI's error
/// shape, keeping its status and headers (`Retry-After`, `RateLimit`).
pub async fn openai_errors<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let http = req.request().clone();
    let res = match next.call(req).await {
        Ok(res) => res,
        // Authentication and rate limiting answer with an error: render it here.
        Err(error) => {
            let response = error.error_response().map_into_boxed_body();
            return Ok(openai_shape(ServiceResponse::new(http, response))
                .await
                .map_into_right_body());
        }
    };
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !is_problem {
        return Ok(res.map_into_left_body());
    }
    Ok(openai_shape(res).await.map_into_right_body())
}

/// A problem+json response rewritten into OpenAI's error shape.
async fn openai_shape<B: MessageBody + 'static>(res: ServiceResponse<B>) -> ServiceResponse {
    let status = res.status();
    let (req, old) = res.into_parts();
    let headers = old.headers().clone();
    let body = actix_web::body::to_bytes(old.into_body()).await.unwrap_or_default();
    let problem: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut message = problem["detail"].as_str().unwrap_or("error").to_string();
    if let Some(errors) = problem["errors"].as_array().filter(|e| !e.is_empty()) {
        let list: Vec<&str> = errors.iter().filter_map(Value::as_str).collect();
        message = format!("{message}: {}", list.join("; "));
    }
    let mut new = error_response(status, &message, None);
    for (name, value) in &headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    ServiceResponse::new(req, new)
}

/// Whether a response belongs to an OpenAI route (left alone by the
/// problem+json safety net).
pub(crate) fn is_openai_path(path: &str) -> bool {
    path.contains("/openai/v1/")
}

fn text_model<'a>(state: &'a AppState, caller: &Caller, model_id: &str) -> Result<&'a ModelSpec, Refusal> {
    caller
        .require(Scope::EndpointsRun)
        .map_err(|e| Refusal::new(StatusCode::FORBIDDEN, e.to_string(), None))?;
    match state.models.get(model_id) {
        Some(spec) if spec.kind == ModelKind::Text => Ok(spec),
        Some(_) => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("model '{model_id}' is not a text model; the OpenAI routes serve text models only"),
            Some("model"),
        )),
        None => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("The model '{model_id}' does not exist"),
            Some("model"),
        )),
    }
}

/// The members both operations accept (the document's `common` properties).
const COMMON_PARAMETERS: [&str; 15] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "user",
    "stream",
    "stream_options",
];

/// OpenAI members for what the platform does not do: refused by name unless null.
const UNSUPPORTED: [&str; 5] = ["tools", "functions", "tool_choice", "response_format", "logit_bias"];

/// A validated OpenAI request: the model's job input and how to answer.
struct Request {
    input: Map<String, Value>,
    stream: bool,
    include_usage: bool,
}

/// Turns an OpenAI request body into the text model's input, collecting
/// every problem. Fields OpenAI defines that do not change the result at
/// their default values (`n: 1`, `presence_penalty: 0`, `user`, …) are
/// accepted; asking for what the platform does not do (`n: 3`, tools,
/// logprobs) is an error rather than a silently different answer.
fn parse(kind: Kind, body: &Value) -> Result<Request, Refusal> {
    let Some(fields) = body.as_object() else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
            None,
        ));
    };
    let mut errors: Vec<String> = Vec::new();
    // What the document lists, and the members refused with a reason below;
    // any other is refused as unknown (`additionalProperties: false`).
    let own: &[&str] = match kind {
        Kind::Chat => &["messages"],
        Kind::Completion => &["prompt", "echo", "suffix", "best_of"],
    };
    for name in fields.keys() {
        if !own.contains(&name.as_str())
            && !COMMON_PARAMETERS.contains(&name.as_str())
            && !UNSUPPORTED.contains(&name.as_str())
        {
            errors.push(format!("{name}: unknown parameter"));
        }
    }
    let mut input = Map::new();
    match kind {
        Kind::Chat => match fields.get("messages") {
            Some(Value::Array(list)) if !list.is_empty() => {
                let mut messages = Vec::with_capacity(list.len());
                for (i, message) in list.iter().enumerate() {
                    match chat_message(message) {
                        Ok(m) => messages.push(m),
                        Err(e) => errors.push(format!("messages[{i}]: {e}")),
                    }
                }
                input.insert("messages".into(), Value::Array(messages));
            }
            _ => errors.push("messages: required, a non-empty array of messages".into()),
        },
        Kind::Completion => {
            let prompt = match fields.get("prompt") {
                Some(Value::String(text)) => Some(text.clone()),
                Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
                    list[0].as_str().map(str::to_string)
                }
                Some(Value::Array(_)) => {
                    errors.push("prompt: one prompt per request (a string, or an array of one string)".into());
                    None
                }
                _ => {
                    errors.push("prompt: required, a string".into());
                    None
                }
            };
            if let Some(prompt) = prompt {
                input.insert("prompt".into(), Value::String(prompt));
                input.insert("raw".into(), Value::Bool(true));
            }
            for (name, default) in [("echo", json!(false)), ("suffix", Value::Null), ("best_of", json!(1))] {
                if let Some(value) = fields.get(name)
                    && *value != default
                    && !value.is_null()
                {
                    errors.push(format!("{name}: not supported"));
                }
            }
        }
    }
    let tokens = fields
        .get("max_completion_tokens")
        .filter(|v| !v.is_null())
        .or_else(|| fields.get("max_tokens").filter(|v| !v.is_null()));
    if let Some(value) = tokens {
        match value.as_u64() {
            Some(n) if n >= 1 => {
                input.insert("max_tokens".into(), json!(n));
            }
            _ => errors.push("max_tokens: must be a positive integer".into()),
        }
    }
    for (name, accepts, range) in [
        (
            "temperature",
            (|t| (0.0..=2.0).contains(&t)) as fn(f64) -> bool,
            "from 0 to 2",
        ),
        ("top_p", |p| p > 0.0 && p <= 1.0, "greater than 0 and at most 1"),
    ] {
        match fields.get(name) {
            None | Some(Value::Null) => {}
            Some(value) if value.as_f64().is_some_and(accepts) => {
                input.insert(name.into(), value.clone());
            }
            Some(_) => errors.push(format!("{name}: must be a number {range}")),
        }
    }
    for name in ["top_k", "seed"] {
        match fields.get(name) {
            None | Some(Value::Null) => {}
            // JSON has one number type: 40 and 40.0 are the same integer.
            Some(value) => match value.as_u64().or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(f))
                    .map(|f| f as u64)
            }) {
                Some(n) => {
                    input.insert(name.into(), n.into());
                }
                None => errors.push(format!("{name}: must be a non-negative integer")),
            },
        }
    }
    match fields.get("stop") {
        None | Some(Value::Null) => {}
        Some(value @ (Value::String(_) | Value::Array(_))) => {
            input.insert("stop".into(), value.clone());
        }
        Some(_) => errors.push("stop: must be a string or an array of strings".into()),
    }
    match fields.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => errors.push("n: only 1 choice per request is supported".into()),
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(value) = fields.get(name)
            && !value.is_null()
            && value.as_f64() != Some(0.0)
        {
            errors.push(format!("{name}: not supported (only 0)"));
        }
    }
    for name in UNSUPPORTED {
        if fields.get(name).is_some_and(|v| !v.is_null()) {
            errors.push(format!("{name}: not supported"));
        }
    }
    if let Some(value) = fields.get("logprobs")
        && !value.is_null()
        && *value != json!(false)
    {
        errors.push("logprobs: not supported".into());
    }
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push("stream: must be a boolean".into());
            false
        }
    };
    let include_usage = match fields.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => match options.get("include_usage") {
            _ if options.keys().any(|k| k != "include_usage") => {
                errors.push("stream_options: only include_usage is supported".into());
                false
            }
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                errors.push("stream_options.include_usage: must be a boolean".into());
                false
            }
        },
        Some(_) => {
            errors.push("stream_options: must be an object".into());
            false
        }
    };
    if !errors.is_empty() {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, errors.join("; "), None));
    }
    Ok(Request {
        input,
        stream,
        include_usage,
    })
}

/// One chat message in the model's input shape: `{role, content}`, with
/// `developer` read as `system` and content parts of type `text` joined.
fn chat_message(message: &Value) -> Result<Value, String> {
    let role = match message.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some(other) => {
            return Err(format!(
                "role '{other}' is not supported (system, developer, user, assistant)"
            ));
        }
        None => return Err("role: required".into()),
    };
    let content = match message.get("content") {
        Some(Value::String(text)) => text.clone(),
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
            text
        }
        _ => return Err("content: required, a string".into()),
    };
    Ok(json!({ "role": role, "content": content }))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The OpenAI usage object from the job's output `usage`.
fn usage_of(output: &Value) -> Value {
    let input = output["usage"]["input"].as_u64().unwrap_or(0);
    let generated = output["usage"]["output"].as_u64().unwrap_or(0);
    json!({"prompt_tokens": input, "completion_tokens": generated, "total_tokens": input + generated})
}

/// The error of a job that did not complete, as an HTTP status and message.
fn failure_of(view: &JobView) -> (StatusCode, String) {
    let error = view.error.clone().unwrap_or_default();
    match view.status {
        JobStatus::Failed if error.starts_with("bad input") => (StatusCode::BAD_REQUEST, error),
        JobStatus::TimedOut => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("the generation timed out: {error}"),
        ),
        JobStatus::Cancelled => (StatusCode::CONFLICT, "the generation was cancelled".into()),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the generation failed: {error}"),
        ),
    }
}

async fn complete(
    kind: Kind,
    state: web::Data<AppState>,
    caller: Caller,
    model_id: String,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let spec = match text_model(&state, &caller, &model_id) {
        Ok(spec) => spec,
        Err(refusal) => return refusal.response(),
    };
    let body = match read_json(&req, payload, BODY_LIMIT).await {
        Ok(body) => body,
        Err(error) => return api_error(&error),
    };
    let request = match parse(kind, &body) {
        Ok(request) => request,
        Err(refusal) => return refusal.response(),
    };
    let user = caller.user_id().to_string();
    let mode = if request.stream { Mode::Async } else { Mode::Sync };
    let job = NewJob::new(Value::Object(request.input));
    let queued = match state.jobs.submit(&user, spec, job, mode).await {
        Ok(view) => view,
        Err(error) => return api_error(&ApiError::from(error)),
    };
    let id = format!("{}{}", kind.id_prefix(), queued.id);
    let created = unix_now();
    if request.stream {
        let frames = state.jobs.follow(Follow {
            user,
            model: model_id.clone(),
            job_id: queued.id,
            from: 0,
            cancel_on_disconnect: true,
        });
        return live::sse_response(
            frames,
            stream_renderer(kind, id, model_id, created, request.include_usage),
        );
    }
    let view = match state.jobs.wait(&user, &spec.id, &queued.id, WAIT).await {
        Ok(view) => view,
        Err(error) => return api_error(&ApiError::from(error)),
    };
    if !view.status.is_final() {
        return error_response(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("no answer within {} s; the job {} goes on", WAIT.as_secs(), view.id),
            None,
        );
    }
    if view.status != JobStatus::Completed {
        let (status, message) = failure_of(&view);
        return error_response(status, &message, None);
    }
    let output = view.output.clone().unwrap_or(Value::Null);
    let choice = &output["choices"][0];
    let text = choice["text"].as_str().unwrap_or_default();
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    let choice = match kind {
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": null,
        }),
        Kind::Completion => json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": null}),
    };
    HttpResponse::Ok().json(json!({
        "id": id,
        "object": kind.object(false),
        "created": created,
        "model": model_id,
        "choices": [choice],
        "usage": usage_of(&output),
        "system_fingerprint": null,
        "cost": output["cost"],
    }))
}

/// Renders the frames of a streaming request as OpenAI chunks.
fn stream_renderer(
    kind: Kind,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
) -> impl FnMut(Frame) -> Option<String> {
    let mut first = true;
    move |frame| {
        let chunk = |choice: Value| {
            let mut chunk = json!({
                "id": id,
                "object": kind.object(true),
                "created": created,
                "model": model,
                "choices": [choice],
                "system_fingerprint": null,
            });
            if include_usage {
                chunk["usage"] = Value::Null;
            }
            chunk
        };
        let piece = |text: &str, finish: Value, role: bool| match kind {
            Kind::Chat => {
                let mut delta = json!({ "content": text });
                if role {
                    delta["role"] = json!("assistant");
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Completion => json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": null}),
        };
        let data = |value: &Value| live::event(None, None, &value.to_string());
        match frame {
            Frame::Chunk { output, .. } => {
                // A text model's chunk holds the pieces made since its last
                // one: they become one delta.
                let pieces = output["tokens"].as_array().map(Vec::as_slice).unwrap_or_default();
                let joined: String = pieces.iter().filter_map(Value::as_str).collect();
                let text = data(&chunk(piece(&joined, Value::Null, first)));
                first = false;
                Some(text)
            }
            Frame::KeepAlive => Some(": keep-alive\n\n".into()),
            Frame::Progress(_) => None,
            Frame::Final(view) => {
                let mut text = String::new();
                if view.status == JobStatus::Completed {
                    let output = view.output.clone().unwrap_or(Value::Null);
                    let finish = output["choices"][0]["finish_reason"].as_str().unwrap_or("stop");
                    text.push_str(&data(&chunk(piece("", json!(finish), first))));
                    if include_usage {
                        let mut last = chunk(Value::Null);
                        last["choices"] = json!([]);
                        last["usage"] = usage_of(&output);
                        last["cost"] = output["cost"].clone();
                        text.push_str(&data(&last));
                    }
                } else {
                    let (status, message) = failure_of(&view);
                    let error = error_body(status, &message);
                    text.push_str(&data(&error));
                }
                text.push_str(&live::event(None, None, "[DONE]"));
                Some(text)
            }
            Frame::Failed(error) => {
                let mut text = data(&error_body(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()));
                text.push_str(&live::event(None, None, "[DONE]"));
                Some(text)
            }
        }
    }
}

fn error_body(status: StatusCode, message: &str) -> Value {
    let kind = if status == StatusCode::BAD_REQUEST {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

fn api_error(error: &ApiError) -> HttpResponse {
    let status = error.status_code();
    let mut message = error.to_string();
    if let ApiError::BadRequest { errors, .. } | ApiError::Unprocessable(errors) = error
        && !errors.is_empty()
    {
        message = format!("{message}: {}", errors.join("; "));
    }
    let mut response = error_response(status, &message, None);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[utoipa::path(post, path = "/v2/{model_id}/openai/v1/chat/completions", operation_id = "openaiChatCompletions",
    tag = "OpenAI-compatible",
    description = "OpenAI chat completions for a text model: `messages` formatted with the model's chat template; \
`max_tokens` (or `max_completion_tokens`), `temperature`, `top_p`, `top_k`, `stop`, `seed`, `stream`, \
`stream_options.include_usage`. With `stream: true`, Server-Sent Events of `chat.completion.chunk` objects \
ending with `data: [DONE]`; closing the stream cancels the generation. Errors use OpenAI's shape \
`{error: {message, type, param, code}}`. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text model", example = "smollm2-135m-instruct")),
    request_body(content = Object, description = "An OpenAI chat completion request"),
    responses((status = 200, description = "A `chat.completion`, or an event stream of chunks")))]
pub async fn chat_completions(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    complete(Kind::Chat, state, caller, path.into_inner(), req, payload).await
}

#[utoipa::path(post, path = "/v2/{model_id}/openai/v1/completions", operation_id = "openaiCompletions",
    tag = "OpenAI-compatible",
    description = "OpenAI (legacy) text completions: the `prompt` is continued as is, without a chat template. \
Same parameters, streaming and errors as chat completions. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text model", example = "smollm2-135m-instruct")),
    request_body(content = Object, description = "An OpenAI completion request"),
    responses((status = 200, description = "A `text_completion`, or an event stream of them")))]
pub async fn completions(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    complete(Kind::Completion, state, caller, path.into_inner(), req, payload).await
}

#[utoipa::path(get, path = "/v2/{model_id}/openai/v1/models", operation_id = "openaiModels",
    tag = "OpenAI-compatible",
    description = "The model of this route in OpenAI's list shape. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text model", example = "smollm2-135m-instruct")),
    responses((status = 200, description = "`{object: \"list\", data: [{id, object: \"model\", created, owned_by}]}`")))]
pub async fn models(state: web::Data<AppState>, caller: Caller, path: web::Path<String>) -> HttpResponse {
    match text_model(&state, &caller, &path) {
        Ok(spec) => HttpResponse::Ok().json(json!({
            "object": "list",
            "data": [{"id": spec.id, "object": "model", "created": 0, "owned_by": "gantry"}],
        })),
        Err(refusal) => refusal.response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_requests_become_model_inputs() {
        let body = json!({
            "model": "x", "messages": [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 5, "temperature": 0, "seed": 7, "stop": ["\n"], "n": 1, "user": "u",
            "stream": true, "stream_options": {"include_usage": true}
        });
        let Ok(request) = parse(Kind::Chat, &body) else {
            panic!("valid request refused")
        };
        assert!(request.stream && request.include_usage);
        assert_eq!(
            Value::Object(request.input),
            json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                "max_tokens": 5, "temperature": 0, "seed": 7, "stop": ["\n"]})
        );
    }

    #[test]
    fn completions_are_raw_and_every_problem_is_listed() {
        let Ok(request) = parse(
            Kind::Completion,
            &json!({"prompt": ["Once"], "max_completion_tokens": 3}),
        ) else {
            panic!("valid request refused")
        };
        assert_eq!(
            Value::Object(request.input),
            json!({"prompt": "Once", "raw": true, "max_tokens": 3})
        );
        let Err(refusal) = parse(
            Kind::Chat,
            &json!({"messages": [], "n": 2, "max_tokens": 0, "tools": []}),
        ) else {
            panic!("invalid request accepted")
        };
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        for field in ["messages", "n:", "max_tokens", "tools"] {
            assert!(refusal.message.contains(field), "{field} in {}", refusal.message);
        }
    }

    /// The parser refuses what the document refuses: unknown members, and
    /// sampling values out of the documented ranges.
    #[test]
    fn what_the_document_refuses_is_refused() {
        let refused = |kind, body: Value| match parse(kind, &body) {
            Err(refusal) => refusal.message,
            Ok(_) => panic!("accepted: {body}"),
        };
        let message = refused(
            Kind::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "prompt": "x", "tempreature": 1}),
        );
        assert!(message.contains("prompt: unknown parameter"), "{message}");
        assert!(message.contains("tempreature: unknown parameter"), "{message}");
        let message = refused(Kind::Completion, json!({"prompt": "x", "temperature": 2.5, "top_p": 0}));
        assert!(
            message.contains("temperature: must be a number from 0 to 2"),
            "{message}"
        );
        assert!(
            message.contains("top_p: must be a number greater than 0 and at most 1"),
            "{message}"
        );
        let message = refused(
            Kind::Completion,
            json!({"prompt": "x", "stream_options": {"include_usage": true, "x": 1}}),
        );
        assert!(message.contains("stream_options"), "{message}");
        // The completion-only members at their neutral values are accepted.
        assert!(
            parse(
                Kind::Completion,
                &json!({"prompt": "x", "echo": false, "suffix": null, "best_of": 1, "temperature": 2, "top_p": 1})
            )
            .is_ok()
        );

        // And the document says so.
        let doc = crate::openapi::public_openapi_json();
        for (path, own) in [
            ("/v2/{model_id}/openai/v1/chat/completions", &["messages"][..]),
            (
                "/v2/{model_id}/openai/v1/completions",
                &["prompt", "echo", "suffix", "best_of"][..],
            ),
        ] {
            let schema = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
            assert_eq!(schema["additionalProperties"], json!(false));
            let mut documented: Vec<&str> = schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            let mut accepted: Vec<&str> = own.iter().chain(COMMON_PARAMETERS.iter()).copied().collect();
            documented.sort_unstable();
            accepted.sort_unstable();
            assert_eq!(documented, accepted, "{path}");
        }
    }
}
