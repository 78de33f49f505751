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
use gantry_text_output::{TextChunk, TextOutput, TokenLogprob, TokenUsage};
use serde_json::{Map, Value, json};

use crate::body::{parse_body, read_json};
use crate::handlers::live;
use crate::handlers::text_request::{ChatRequest, CompletionRequest, TextRequest, UNSUPPORTED};
use crate::middleware::Caller;
use crate::problem::{ApiError, PROBLEM_JSON};
use crate::state::AppState;

/// Largest request body of these routes.
pub(super) const BODY_LIMIT: usize = 4 * 1024 * 1024;
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
pub(super) fn error_response(status: StatusCode, message: &str, param: Option<&str>) -> HttpResponse {
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
#[derive(Debug)]
pub(super) struct Refusal {
    status: StatusCode,
    message: String,
    param: Option<String>,
}

impl Refusal {
    pub(super) fn new(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status,
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    #[cfg(test)]
    pub(super) fn message(&self) -> &str {
        &self.message
    }

    pub(super) fn response(&self) -> HttpResponse {
        error_response(self.status, &self.message, self.param.as_deref())
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

/// The model `model_id` when the caller may run models and it is of one of
/// `kinds`; otherwise the refusal, saying the model is not `what`.
pub(super) fn served_model<'a>(
    state: &'a AppState,
    caller: &Caller,
    model_id: &str,
    kinds: &[ModelKind],
    what: &str,
) -> Result<&'a ModelSpec, Refusal> {
    caller
        .require(Scope::EndpointsRun)
        .map_err(|e| Refusal::new(StatusCode::FORBIDDEN, e.to_string(), None))?;
    match state.models.get(model_id) {
        Some(spec) if kinds.contains(&spec.kind) => Ok(spec),
        Some(_) => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("model '{model_id}' is not {what}"),
            Some("model"),
        )),
        None => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("The model '{model_id}' does not exist"),
            Some("model"),
        )),
    }
}

fn text_model<'a>(state: &'a AppState, caller: &Caller, model_id: &str) -> Result<&'a ModelSpec, Refusal> {
    served_model(
        state,
        caller,
        model_id,
        &[ModelKind::Text],
        "a text model; chat and completions are served by text models only",
    )
}

/// Reads an OpenAI request body as the operation's typed request
/// ([`ChatRequest`] or [`CompletionRequest`]), every problem listed in one
/// 400: `param` names the first, in the document's order of members (unknown
/// members first, the members refused with a reason last).
fn parse(kind: Kind, mut body: Value) -> Result<TextRequest, Refusal> {
    let Some(fields) = body.as_object_mut() else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
            None,
        ));
    };
    // (member, problem)
    let mut refused: Vec<(String, String)> = Vec::new();
    for (name, reason) in UNSUPPORTED {
        if let Some(value) = fields.remove(name)
            && !value.is_null()
        {
            refused.push((name.to_owned(), reason.to_owned()));
        }
    }
    let (parsed, order) = match kind {
        Kind::Chat => (parse_body::<ChatRequest>(body, &()), members::<ChatRequest>()),
        Kind::Completion => (
            parse_body::<CompletionRequest>(body, &()),
            members::<CompletionRequest>(),
        ),
    };
    let mut failures: Vec<(String, String)> = match parsed {
        Ok(request) if refused.is_empty() => return Ok(request),
        Ok(_) => Vec::new(),
        Err(ApiError::Unprocessable(list)) => list.iter().map(|failure| member_failure(failure)).collect(),
        Err(other) => vec![(String::new(), other.to_string())],
    };
    let rank = |name: &str| order.iter().position(|m| m == name).map_or(0, |i| i + 1);
    failures.sort_by_key(|(name, _)| rank(name.split(['.', '[']).next().unwrap_or_default()));
    failures.extend(refused);
    let param = failures
        .first()
        .map(|(name, _)| name.split(['.', '[']).next().unwrap_or_default().to_owned())
        .filter(|name| !name.is_empty());
    let message: Vec<String> = failures
        .iter()
        .map(|(name, problem)| match (name.as_str(), problem.starts_with('[')) {
            ("", _) => problem.clone(),
            (_, true) => format!("{name}{problem}"),
            (_, false) => format!("{name}: {problem}"),
        })
        .collect();
    Err(Refusal::new(
        StatusCode::BAD_REQUEST,
        message.join("; "),
        param.as_deref(),
    ))
}

/// A body failure (`$.member.path: problem`) as (member path, problem), in
/// OpenAI's words for an unknown member.
pub(super) fn member_failure(failure: &str) -> (String, String) {
    let rest = failure
        .strip_prefix("$.")
        .or_else(|| failure.strip_prefix("$"))
        .unwrap_or(failure);
    let (path, problem) = rest.split_once(": ").unwrap_or(("", rest));
    let path = path.to_owned();
    let problem = if problem == "unknown property" && !path.contains('.') {
        "unknown parameter".to_owned()
    } else {
        problem.to_owned()
    };
    (path, problem)
}

/// The members a request type documents, in its order.
pub(super) fn members<T: utoipa::ToSchema>() -> Vec<String> {
    use utoipa::openapi::{RefOr, schema::Schema};
    match T::schema() {
        RefOr::T(Schema::Object(object)) => object.properties.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The OpenAI usage object from a text job's usage.
fn usage_of(usage: TokenUsage) -> Value {
    json!({"prompt_tokens": usage.input, "completion_tokens": usage.output, "total_tokens": usage.total()})
}

/// The error of a job that did not complete, as an HTTP status and message.
/// Waits (up to [`WAIT`]) for the job `job_id` of `model` to end and returns
/// its output. A job that goes on past the wait, or that did not complete,
/// is the error response instead; `param` names the field a failure's
/// status and message point at.
pub(super) async fn finished_output(
    state: &AppState,
    user: &str,
    model: &str,
    job_id: &str,
    param: impl FnOnce(StatusCode, &str) -> Option<String>,
) -> Result<Value, HttpResponse> {
    let view = state
        .jobs
        .wait(user, model, job_id, WAIT)
        .await
        .map_err(|error| api_error(&ApiError::from(error)))?;
    if !view.status.is_final() {
        return Err(error_response(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("no answer within {} s; the job {} goes on", WAIT.as_secs(), view.id),
            None,
        ));
    }
    if view.status != JobStatus::Completed {
        let (status, message) = failure_of(&view);
        return Err(error_response(status, &message, param(status, &message).as_deref()));
    }
    Ok(view.output.unwrap_or(Value::Null))
}

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
    let request = match parse(kind, body) {
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
        let mut frames = state.jobs.follow(Follow {
            user,
            model: model_id.clone(),
            job_id: queued.id,
            from: 0,
            cancel_on_disconnect: true,
        });
        // A request the model refuses (a schema it cannot enforce, a prompt
        // too long) fails at once: answer that as an error, not as a stream.
        let first = frames.recv().await;
        if let Some(Frame::Final(view)) = &first
            && view.status != JobStatus::Completed
        {
            let (status, message) = failure_of(view);
            return error_response(status, &message, param_of(&message).as_deref());
        }
        let (tx, rest) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut next = first;
            while let Some(frame) = next {
                if tx.send(frame).await.is_err() {
                    // The client left: dropping `frames` cancels the job.
                    return;
                }
                next = frames.recv().await;
            }
        });
        return live::sse_response(
            rest,
            stream_renderer(kind, id, model_id, created, request.include_usage),
        );
    }
    let output = match finished_output(&state, &user, &spec.id, &queued.id, |_, message| param_of(message)).await {
        Ok(output) => output,
        Err(response) => return response,
    };
    let text: TextOutput = match serde_json::from_value(output.clone()) {
        Ok(text) => text,
        Err(error) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the model's output is not a text model's output: {error}"),
                None,
            );
        }
    };
    let choices: Vec<Value> = text
        .choices
        .iter()
        .enumerate()
        .map(|(i, choice)| match kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": choice.text, "refusal": null});
                if !choice.tool_calls.is_empty() {
                    message["tool_calls"] = json!(choice.tool_calls);
                    if choice.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": i, "message": message, "finish_reason": choice.finish_reason,
                    "logprobs": chat_logprobs(choice.logprobs.as_deref())})
            }
            Kind::Completion => json!({"index": i, "text": choice.text, "finish_reason": choice.finish_reason,
                "logprobs": completion_logprobs(choice.logprobs.as_deref(), 0)}),
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "id": id,
        "object": kind.object(false),
        "created": created,
        "model": model_id,
        "choices": choices,
        "usage": usage_of(text.usage),
        "system_fingerprint": null,
        "cost": output["cost"],
    }))
}

/// Chat's `logprobs` from the model's entries: `{content, refusal}`, or
/// null when none were asked for.
fn chat_logprobs(entries: Option<&[TokenLogprob]>) -> Value {
    match entries {
        Some(list) => json!({"content": list, "refusal": null}),
        None => Value::Null,
    }
}

/// The legacy operation's `logprobs`: parallel lists of tokens, their
/// log-probabilities, the alternatives as `{token: logprob}` and each
/// token's offset in the text (from `offset` on).
fn completion_logprobs(entries: Option<&[TokenLogprob]>, offset: usize) -> Value {
    let Some(list) = entries else {
        return Value::Null;
    };
    let mut tokens = Vec::with_capacity(list.len());
    let mut logprobs = Vec::with_capacity(list.len());
    let mut top = Vec::with_capacity(list.len());
    let mut offsets = Vec::with_capacity(list.len());
    let mut at = offset;
    for entry in list {
        tokens.push(json!(entry.token));
        logprobs.push(json!(entry.logprob));
        let alternatives: Map<String, Value> = entry
            .top_logprobs
            .iter()
            .map(|a| (a.token.clone(), json!(a.logprob)))
            .collect();
        top.push(Value::Object(alternatives));
        offsets.push(json!(at));
        at += entry.token.len();
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// The OpenAI parameter a model's refusal names: a member's failure starts
/// with its place (`tools.0.function.name: must be ...`, as the model's input
/// reader writes them), a rule between members quotes the member first
/// (`` `response_format.json_schema.schema` cannot be ... ``).
fn param_of(message: &str) -> Option<String> {
    const PARAMETERS: [&str; 19] = [
        "messages",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ];
    let message = message.strip_prefix("bad input: ").unwrap_or(message);
    let placed = message.split_once(": ").map(|(place, _)| place);
    let quoted = message.split('`').nth(1);
    [placed, quoted]
        .into_iter()
        .flatten()
        .filter_map(|place| place.split(['.', '[', ' ', '/']).next())
        .find(|name| PARAMETERS.contains(name))
        .map(str::to_owned)
}

/// Renders the frames of a streaming request as OpenAI chunks.
fn stream_renderer(
    kind: Kind,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
) -> impl FnMut(Frame) -> Option<String> {
    // Which choices have had their first delta (it carries the role), and
    // how much text each has had (the legacy logprobs' offsets).
    let mut started: Vec<bool> = Vec::new();
    let mut offsets: Vec<usize> = Vec::new();
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
        let data = |value: &Value| live::event(None, None, &value.to_string());
        match frame {
            Frame::Chunk { output, .. } => {
                // A text model's chunk holds what one choice made since its
                // last one: it becomes one delta. A chunk of another shape
                // carries nothing.
                let output: TextChunk = serde_json::from_value(output).unwrap_or_default();
                let index = output.index;
                if started.len() <= index {
                    started.resize(index + 1, false);
                    offsets.resize(index + 1, 0);
                }
                let joined: String = output.tokens.concat();
                let logprobs = (!output.logprobs.is_empty()).then_some(output.logprobs.as_slice());
                let choice = match kind {
                    Kind::Chat => {
                        let mut delta = json!({});
                        if !started[index] {
                            delta["role"] = json!("assistant");
                        }
                        let calls = !output.tool_calls.is_empty();
                        if !joined.is_empty() || !calls {
                            delta["content"] = json!(joined);
                        }
                        if calls {
                            delta["tool_calls"] = json!(output.tool_calls);
                        }
                        json!({"index": index, "delta": delta, "finish_reason": null,
                            "logprobs": chat_logprobs(logprobs)})
                    }
                    Kind::Completion => {
                        let logprobs = completion_logprobs(logprobs, offsets[index]);
                        json!({"index": index, "text": joined, "finish_reason": null, "logprobs": logprobs})
                    }
                };
                started[index] = true;
                offsets[index] += joined.len();
                Some(data(&chunk(choice)))
            }
            Frame::KeepAlive => Some(": keep-alive\n\n".into()),
            Frame::Progress(_) => None,
            Frame::Final(view) => {
                let mut text = String::new();
                if view.status == JobStatus::Completed {
                    let output = view.output.clone().unwrap_or(Value::Null);
                    let cost = output["cost"].clone();
                    let typed: Option<TextOutput> = serde_json::from_value(output).ok();
                    let (choices, usage) = typed.map(|t| (t.choices, t.usage)).unwrap_or_default();
                    for (index, choice) in choices.iter().enumerate() {
                        let finish = choice.finish_reason.as_str();
                        let last = match kind {
                            Kind::Chat => {
                                let mut delta = json!({});
                                if !started.get(index).copied().unwrap_or(false) {
                                    delta["role"] = json!("assistant");
                                    delta["content"] = json!("");
                                }
                                json!({"index": index, "delta": delta, "finish_reason": finish, "logprobs": null})
                            }
                            Kind::Completion => {
                                json!({"index": index, "text": "", "finish_reason": finish, "logprobs": null})
                            }
                        };
                        text.push_str(&data(&chunk(last)));
                    }
                    if include_usage {
                        let mut last = chunk(Value::Null);
                        last["choices"] = json!([]);
                        last["usage"] = usage_of(usage);
                        last["cost"] = cost;
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

pub(super) fn api_error(error: &ApiError) -> HttpResponse {
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
    description = "OpenAI chat completions for a text model: `messages` (tool results and assistant `tool_calls` \
included) formatted with the model's chat template; `max_tokens` (or `max_completion_tokens`), `temperature`, \
`top_p`, `top_k`, `min_p`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `stop`, `seed`, `n` (up to 8), \
`logprobs` with `top_logprobs`, `response_format` (`text`, `json_object`, `json_schema` enforced by a grammar while \
generating; a schema the grammar cannot express is refused with 400), `tools` with `tool_choice` and \
`parallel_tool_calls` (calls in `message.tool_calls`, `finish_reason: tool_calls`), `stream`, \
`stream_options.include_usage`. With `stream: true`, Server-Sent Events of `chat.completion.chunk` objects \
(tool calls as `delta.tool_calls` fragments) ending with `data: [DONE]`; closing the stream cancels the \
generation. Errors use OpenAI's shape `{error: {message, type, param, code}}`. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text model", example = "smollm2-135m-instruct")),
    request_body(content = inline(ChatRequest), description = "An OpenAI chat completion request"),
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
The sampling parameters, `n`, streaming and errors of chat completions; `logprobs` is the number of alternatives \
(0 to 5) in the legacy shape. `echo`, `suffix` and `best_of` above 1 are refused. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text model", example = "smollm2-135m-instruct")),
    request_body(content = inline(CompletionRequest), description = "An OpenAI completion request"),
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
    description = "The model of this route (a text or embedding model) in OpenAI's list shape. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "A text or embedding model", example = "smollm2-135m-instruct")),
    responses((status = 200, description = "`{object: \"list\", data: [{id, object: \"model\", created, owned_by}]}`")))]
pub async fn models(state: web::Data<AppState>, caller: Caller, path: web::Path<String>) -> HttpResponse {
    let kinds = [ModelKind::Text, ModelKind::Embedding];
    match served_model(&state, &caller, &path, &kinds, "a text or embedding model") {
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
            "stream": true, "stream_options": {"include_usage": true}, "response_format": {"type": "text"},
            "presence_penalty": 0.5, "logprobs": true, "top_logprobs": 2
        });
        let Ok(request) = parse(Kind::Chat, body.clone()) else {
            panic!("valid request refused")
        };
        assert!(request.stream && request.include_usage);
        assert_eq!(
            Value::Object(request.input),
            json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                "max_tokens": 5, "temperature": 0, "seed": 7, "stop": ["\n"], "n": 1, "presence_penalty": 0.5,
                "logprobs": true, "top_logprobs": 2})
        );
    }

    #[test]
    fn completions_are_raw_and_every_problem_is_listed() {
        let Ok(request) = parse(
            Kind::Completion,
            json!({"prompt": ["Once"], "max_completion_tokens": 3}),
        ) else {
            panic!("valid request refused")
        };
        assert_eq!(
            Value::Object(request.input),
            json!({"prompt": "Once", "raw": true, "max_tokens": 3})
        );
        let Err(refusal) = parse(
            Kind::Chat,
            json!({"messages": [], "n": -2, "max_tokens": 0, "functions": []}),
        ) else {
            panic!("invalid request accepted")
        };
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        assert_eq!(refusal.param.as_deref(), Some("messages"));
        for field in ["messages", "n:", "max_tokens", "functions: the deprecated"] {
            assert!(refusal.message.contains(field), "{field} in {}", refusal.message);
        }
        // the legacy operation: logprobs is a count; echo and suffix are refused by name
        let Ok(request) = parse(Kind::Completion, json!({"prompt": "a", "logprobs": 2, "n": 2})) else {
            panic!("valid request refused")
        };
        assert_eq!(
            Value::Object(request.input),
            json!({"prompt": "a", "raw": true, "logprobs": true, "top_logprobs": 2, "n": 2})
        );
        for (body, param) in [
            (json!({"prompt": "a", "echo": true}), "echo"),
            (json!({"prompt": "a", "suffix": "end"}), "suffix"),
            (json!({"prompt": "a", "logprobs": 6}), "logprobs"),
        ] {
            let Err(refusal) = parse(Kind::Completion, body.clone()) else {
                panic!("accepted: {body}")
            };
            assert_eq!(refusal.param.as_deref(), Some(param), "{}", refusal.message);
        }
        // tools and response formats go to the model as they are
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let Ok(request) = parse(
            Kind::Chat,
            json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "done"}],
                "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}),
        ) else {
            panic!("valid request refused")
        };
        assert_eq!(request.input["tools"], tools);
        assert_eq!(request.input["messages"][2]["role"], "tool");
        assert_eq!(request.input["messages"][1]["content"], Value::Null);
        assert_eq!(request.input["response_format"], json!({"type": "json_object"}));
        assert_eq!(
            param_of("bad input: `response_format.json_schema.schema` cannot be enforced").as_deref(),
            Some("response_format")
        );
        assert_eq!(
            param_of("bad input: `tools[0].function.parameters/x`: no").as_deref(),
            Some("tools")
        );
        assert_eq!(param_of("bad input: the prompt is 9000 tokens"), None);
        assert_eq!(
            param_of("bad input: tools.0.function.name: must be 1 to 64 letters").as_deref(),
            Some("tools")
        );
        assert_eq!(
            param_of("bad input: messages.0.role: must be one of system, user (got 'bot'); n: x").as_deref(),
            Some("messages")
        );
        assert_eq!(param_of("bad input: must be a JSON object, not a string"), None);
    }

    /// The parser refuses what the document refuses: unknown members, and
    /// sampling values out of the documented ranges.
    #[test]
    fn what_the_document_refuses_is_refused() {
        let refused = |kind, body: Value| match parse(kind, body.clone()) {
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
                json!({"prompt": "x", "echo": false, "suffix": null, "best_of": 1, "temperature": 2, "top_p": 1})
            )
            .is_ok()
        );
        let message = refused(
            Kind::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 3}),
        );
        assert!(
            message.contains("presence_penalty: must be a number from -2 to 2"),
            "{message}"
        );

        // And the document says so: it refuses unknown members, and every
        // member it lists is read (null, as OpenAI's clients send, included).
        let doc = crate::openapi::public_openapi_json();
        for (path, kind, required) in [
            (
                "/v2/{model_id}/openai/v1/chat/completions",
                Kind::Chat,
                json!({"messages": [{"role": "user", "content": "hi"}]}),
            ),
            (
                "/v2/{model_id}/openai/v1/completions",
                Kind::Completion,
                json!({"prompt": "x"}),
            ),
        ] {
            let schema = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
            assert_eq!(schema["additionalProperties"], json!(false), "{path}");
            let properties = schema["properties"].as_object().unwrap();
            assert!(properties.len() > 20, "{path}: {schema}");
            for name in properties.keys().filter(|name| required.get(name.as_str()).is_none()) {
                let mut body = required.clone();
                body[name.as_str()] = Value::Null;
                assert!(parse(kind, body).is_ok(), "{path}: {name}: null refused");
            }
            let mut body = required.clone();
            body["undocumented"] = json!(1);
            assert_eq!(parse(kind, body).unwrap_err().param.as_deref(), Some("undocumented"));
        }
    }
}
