//! The public model endpoints: `/v2/{model_id}/run`, `/runsync`, status, stream,
//! cancel, retry, purge-queue and health.
use std::borrow::Cow;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::ModelSpec;
use gantry_jobs::{Follow, Frame, JobPolicy, JobStatus, JobView, Mode, NewJob};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::body::{Failures, RequestBody, present, present_object, read_body};
use crate::handlers::live;
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::query::{self, Between, RequestQuery, parse_query};
use crate::state::AppState;

/// Largest `/run` request body.
pub const RUN_BODY_LIMIT: usize = 10 * 1024 * 1024;
/// Largest `/runsync` request body.
pub const RUNSYNC_BODY_LIMIT: usize = 20 * 1024 * 1024;
const WAIT_DEFAULT_MS: u64 = 90_000;

/// `{id, status}`: what `/run` answers, and `/runsync` when the job is not done in time.
/// Exactly these two members (`additionalProperties: false`), so that a
/// finished job, which has more, is never read as one.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRef {
    pub id: String,
    pub status: JobStatus,
}

/// What `/runsync` answers: the finished job, or `{id, status}` when it is
/// not finished within the wait.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // the document's `oneOf`; the handler writes either shape itself
pub enum RunSyncReply {
    Finished(JobView),
    Waiting(JobRef),
}

/// A job request.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The model's input (a JSON object).
    #[schema(value_type = Object)]
    input: Map<String, Value>,
    /// http(s) URL that receives the final job as a POST (signed, see the docs).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = String, nullable = false, max_length = 2048)]
    webhook: Option<WebhookUrl>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    policy: Option<RunPolicy>,
}

impl RequestBody for RunRequest {
    type Context = ();
    type Valid = NewJob;

    fn validate(self, _: &(), _: &mut Failures) -> Option<NewJob> {
        let policy = self.policy.map_or_else(JobPolicy::default, |p| JobPolicy {
            execution_timeout_ms: p.execution_timeout.map(|ms| ms.0),
            ttl_ms: p.ttl.map(|ms| ms.0),
            low_priority: p.low_priority.unwrap_or(false),
        });
        Some(NewJob {
            input: Value::Object(self.input),
            webhook: self.webhook.map(|url| url.0),
            policy,
        })
    }
}

/// A `webhook` that passed every check of its shape.
struct WebhookUrl(String);

impl<'de> Deserialize<'de> for WebhookUrl {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let url = String::deserialize(deserializer)?;
        let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
        let has_host = url
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'));
        let problem = if !(scheme_ok && has_host) {
            "must be an http or https URL".to_string()
        } else if url.chars().any(char::is_control) {
            "must not contain control characters".to_string()
        } else if url.len() > WEBHOOK_MAX_LENGTH {
            format!("must be at most {WEBHOOK_MAX_LENGTH} characters")
        } else if !WEBHOOK_URL.is_match(&url) {
            "must be an http or https URL with a host name or an IPv4 address, a port, a path and a query".to_string()
        } else {
            return Ok(Self(url));
        };
        Err(serde::de::Error::custom(problem))
    }
}

/// A positive number of milliseconds. JSON has one number type: 1000 and
/// 1000.0 are the same integer.
struct Millis(u64);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        value
            .as_u64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && (1.0..=9_007_199_254_740_992.0).contains(f))
                    .map(|f| f as u64)
            })
            .filter(|&ms| ms >= 1)
            .map(Millis)
            .ok_or_else(|| serde::de::Error::custom("must be a positive integer (milliseconds)"))
    }
}

/// Longest accepted `webhook`.
pub(crate) const WEBHOOK_MAX_LENGTH: usize = 2048;

/// The shape of an accepted `webhook`, as the server checks it and the
/// document states it: http(s), a host name (its last label starting with a
/// letter) or a dotted IPv4 address, an optional port, path and query. The
/// address it leads to is checked later (webhook destinations).
pub(crate) const WEBHOOK_PATTERN: &str = concat!(
    r"^https?://",
    r"(([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    r"|((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))",
    r"(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?",
    r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)*",
    r"(\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$",
);

static WEBHOOK_URL: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(WEBHOOK_PATTERN).unwrap_or_else(|e| unreachable!("{e}")));

/// Per-job policy.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RunPolicy {
    /// Longest the job may run, in ms (default 600000).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = u64, nullable = false, minimum = 1, maximum = 604800000)]
    execution_timeout: Option<Millis>,
    /// Longest the job may live, queue plus run, in ms (default 24 h).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = u64, nullable = false, minimum = 1, maximum = 604800000)]
    ttl: Option<Millis>,
    /// Dispatch after the jobs without it.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    low_priority: Option<bool>,
}

/// What a job route's `{model_id}` names: a model of the catalog, or one of
/// the caller's serverless endpoints (another user's is not found).
pub(crate) struct Target<'a> {
    pub spec: Cow<'a, ModelSpec>,
    /// The endpoint's per-job timeout, ms (none for a model).
    pub timeout_ms: Option<u64>,
}

pub(crate) async fn model<'a>(state: &'a AppState, caller: &Caller, model_id: &str) -> Result<Target<'a>, ApiError> {
    caller.require(Scope::EndpointsRun)?;
    if let Some(spec) = state.models.get(model_id) {
        return Ok(Target {
            spec: Cow::Borrowed(spec),
            timeout_ms: None,
        });
    }
    if gantry_catalog::is_endpoint_id(model_id) {
        match state.containers.get_endpoint(caller.user_id(), model_id).await {
            Ok(endpoint) => {
                return Ok(Target {
                    spec: Cow::Owned(ModelSpec::endpoint(model_id)),
                    timeout_ms: Some(endpoint.spec.timeout),
                });
            }
            Err(gantry_containers::ContainerError::NotFound(_)) => {}
            Err(other) => return Err(other.into()),
        }
    }
    Err(ApiError::NotFound(format!("model '{model_id}' not found")))
}

/// An endpoint's job runs at most its endpoint's `timeout` unless the request says otherwise;
/// and the endpoint's workers scale for it at once.
fn for_target(target: &Target<'_>, mut job: NewJob) -> NewJob {
    if job.policy.execution_timeout_ms.is_none() {
        job.policy.execution_timeout_ms = target.timeout_ms;
    }
    job
}

/// For a job of a user's endpoint, its fleet if the job needs the reconciler
/// to look once it is queued (no worker of the endpoint waits to take it);
/// asked before the job is submitted.
fn needs_look<'s>(state: &'s AppState, target: &Target<'_>) -> Option<&'s gantry_containers::Fleet> {
    let fleet = state.fleet.as_deref()?;
    (target.timeout_ms.is_some() && fleet.needs_look_for_job(&target.spec.id)).then_some(fleet)
}

fn queued(fleet: Option<&gantry_containers::Fleet>) {
    if let Some(fleet) = fleet {
        fleet.job_queued();
    }
}

/// The query of `runsync`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WaitQuery {
    /// Longest wait in ms, 1000 to 300000
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    wait: Option<Between<1_000, 300_000>>,
}

impl RequestQuery for WaitQuery {
    type Valid = Duration;

    fn validate(self, _: &mut Vec<String>) -> Option<Duration> {
        Some(Duration::from_millis(self.wait.map_or(WAIT_DEFAULT_MS, |w| w.0)))
    }
}

fn job_ref(view: &JobView) -> HttpResponse {
    HttpResponse::Ok().json(JobRef {
        id: view.id.clone(),
        status: view.status,
    })
}

#[utoipa::path(post, path = "/v2/{model_id}/run", operation_id = "run", tag = "Model endpoints",
    description = "Queues a job and answers at once with its id. Requires `endpoints:run`. Bodies over 10 MB: 413.",
    params(("model_id" = String, Path, description = "Model identifier", example = "gantry-echo")),
    request_body = RunRequest,
    responses((status = 200, description = "Queued", body = JobRef)))]
pub async fn run(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let target = model(&state, &caller, &path).await?;
    let job = for_target(
        &target,
        read_body::<RunRequest>(&req, payload, RUN_BODY_LIMIT, &()).await?,
    );
    let look = needs_look(&state, &target);
    let view = state
        .jobs
        .submit(caller.user_id(), &target.spec, job, Mode::Async)
        .await?;
    queued(look);
    Ok(job_ref(&view))
}

#[utoipa::path(post, path = "/v2/{model_id}/runsync", operation_id = "runSync", tag = "Model endpoints",
    description = "Runs a job and waits for it, up to `wait` ms (default 90000, 1000 to 300000). A finished job is returned whole; otherwise `{id, status}` to poll. Requires `endpoints:run`. Bodies over 20 MB: 413.",
    params(("model_id" = String, Path, description = "Model identifier", example = "gantry-echo"),
        WaitQuery),
    request_body = RunRequest,
    responses((status = 200, description = "The finished job, or `{id, status}`", body = RunSyncReply)))]
pub async fn runsync(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let target = model(&state, &caller, &path).await?;
    let wait = parse_query::<WaitQuery>(&req)?;
    let job = for_target(
        &target,
        read_body::<RunRequest>(&req, payload, RUNSYNC_BODY_LIMIT, &()).await?,
    );
    let user = caller.user_id();
    let look = needs_look(&state, &target);
    let submitted = state.jobs.submit(user, &target.spec, job, Mode::Sync).await?;
    queued(look);
    let view = state.jobs.wait(user, &target.spec.id, &submitted.id, wait).await?;
    if view.status.is_final() {
        Ok(HttpResponse::Ok().json(view))
    } else {
        Ok(job_ref(&view))
    }
}

#[utoipa::path(get, path = "/v2/{model_id}/status/{job_id}", operation_id = "status", tag = "Model endpoints",
    description = "The job as it is now. Requires `endpoints:run`.",
    params(("model_id" = String, Path), ("job_id" = String, Path)),
    responses((status = 200, description = "The job", body = JobView)))]
pub async fn status(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (model_id, job_id) = path.into_inner();
    model(&state, &caller, &model_id).await?;
    Ok(HttpResponse::Ok().json(state.jobs.get(caller.user_id(), &model_id, &job_id).await?))
}

#[utoipa::path(get, path = "/v2/{model_id}/stream/{job_id}", operation_id = "stream", tag = "Model endpoints",
    description = "The job's status and the stream chunks not read before, in order: `{status, stream: [{output}]}`, \
with `progress` (the worker's latest progress message) while the job runs and its worker reported one. \
With `Accept: text/event-stream`, Server-Sent Events instead: one `chunk` event per chunk as it is produced \
(`id` = its sequence number, data `{\"output\": …}`), a `progress` event (data `{\"progress\": …}`, no `id`) \
whenever the progress message changes, then one `status` event whose data is the final job, then the \
stream ends. A reader that reconnects with `Last-Event-ID` gets exactly the chunks after it. SSE readers keep \
their own position and do not consume chunks from the JSON form. Requires `endpoints:run`.",
    params(("model_id" = String, Path), ("job_id" = String, Path),
        ("Last-Event-ID" = Option<String>, Header, description = "SSE: resume after this chunk (a chunk sequence number)")),
    responses((status = 200, description = "Status and unread chunks (JSON), or an event stream (`text/event-stream`)"),
        (status = 400, description = "`Last-Event-ID` is not a chunk sequence number", body = crate::problem::Problem,
            content_type = "application/problem+json")))]
pub async fn stream(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (model_id, job_id) = path.into_inner();
    model(&state, &caller, &model_id).await?;
    // A malformed Last-Event-ID is refused in either form.
    let from = live::resume_from(&req).map_err(|e| ApiError::BadRequest {
        detail: "invalid headers".into(),
        errors: vec![e],
    })?;
    if live::wants_sse(&req) {
        // Unknown or foreign jobs are a 404 before the stream starts.
        state.jobs.get(caller.user_id(), &model_id, &job_id).await?;
        let frames = state.jobs.follow(Follow {
            user: caller.user_id().to_string(),
            model: model_id,
            job_id,
            from,
            cancel_on_disconnect: false,
        });
        return Ok(live::sse_response(frames, |frame| match frame {
            Frame::Chunk { seq, output } => Some(live::event(
                Some(seq),
                Some("chunk"),
                &json!({ "output": output }).to_string(),
            )),
            Frame::Progress(message) => Some(live::event(
                None,
                Some("progress"),
                &json!({ "progress": message }).to_string(),
            )),
            Frame::KeepAlive => Some(": keep-alive\n\n".to_string()),
            Frame::Final(view) => Some(live::event(
                None,
                Some("status"),
                &serde_json::to_string(&view).unwrap_or_default(),
            )),
            Frame::Failed(error) => Some(live::event(
                None,
                Some("error"),
                &json!({ "error": error.to_string() }).to_string(),
            )),
        }));
    }
    let view = state.jobs.read_stream(caller.user_id(), &model_id, &job_id).await?;
    let stream: Vec<Value> = view
        .chunks
        .into_iter()
        .map(|output| json!({ "output": output }))
        .collect();
    let mut body = json!({ "status": view.status, "stream": stream });
    if let Some(progress) = view.progress {
        body["progress"] = progress;
    }
    Ok(HttpResponse::Ok().json(body))
}

#[utoipa::path(post, path = "/v2/{model_id}/cancel/{job_id}", operation_id = "cancel", tag = "Model endpoints",
    description = "Cancels a queued or running job; a finished job is returned unchanged. Requires `endpoints:run`.",
    params(("model_id" = String, Path), ("job_id" = String, Path)),
    responses((status = 200, description = "`{id, status}`", body = JobRef)))]
pub async fn cancel(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (model_id, job_id) = path.into_inner();
    model(&state, &caller, &model_id).await?;
    Ok(job_ref(&state.jobs.cancel(caller.user_id(), &model_id, &job_id).await?))
}

#[utoipa::path(post, path = "/v2/{model_id}/retry/{job_id}", operation_id = "retry", tag = "Model endpoints",
    description = "Queues a FAILED or TIMED_OUT job again, with the same id and input; other states: 409. Requires `endpoints:run`.",
    params(("model_id" = String, Path), ("job_id" = String, Path)),
    responses((status = 200, description = "`{id, status}`", body = JobRef)))]
pub async fn retry(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (model_id, job_id) = path.into_inner();
    model(&state, &caller, &model_id).await?;
    Ok(job_ref(&state.jobs.retry(caller.user_id(), &model_id, &job_id).await?))
}

#[utoipa::path(post, path = "/v2/{model_id}/purge-queue", operation_id = "purgeQueue", tag = "Model endpoints",
    description = "Removes the caller's queued jobs of this model: `{removed, status}`. Requires `endpoints:run`.",
    params(("model_id" = String, Path)),
    responses((status = 200, description = "How many were removed")))]
pub async fn purge_queue(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    model(&state, &caller, &path).await?;
    let removed = state.jobs.purge_queue(caller.user_id(), &path).await?;
    Ok(HttpResponse::Ok().json(json!({ "removed": removed, "status": "completed" })))
}

#[utoipa::path(get, path = "/v2/{model_id}/health", operation_id = "health", tag = "Model endpoints",
    description = "The caller's own job counts on the model, and the model's workers: `{jobs: {completed, failed, inProgress, inQueue, retried}, workers: {idle, running}}`; for a serverless endpoint of the caller's, its workers by status as its workers list sums them (`{running, idle, initializing, throttled, unhealthy, total}`, with `throttledReason` while any wait for GPUs). Other users' jobs are never counted; the worker counts are the model's, shared by every caller. Requires `endpoints:run`.",
    params(("model_id" = String, Path)),
    responses((status = 200, description = "Counts")))]
pub async fn health(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let target = model(&state, &caller, &path).await?;
    let jobs = state.jobs.health(caller.user_id(), &path).await?;
    let workers = match (&state.fleet, target.timeout_ms) {
        // A user's endpoint: what every replica publishes of its workers.
        (Some(fleet), Some(_)) => {
            let endpoint = state.containers.get_endpoint(caller.user_id(), &path).await?;
            let views = fleet.worker_views(&endpoint.id).await?;
            serde_json::to_value(super::serverless::WorkerSummary::of(&endpoint, &views)).unwrap_or_default()
        }
        _ => {
            let (idle, running) = state.worker_counts(&path).await?;
            json!({ "idle": idle, "running": running })
        }
    };
    Ok(HttpResponse::Ok().json(json!({ "jobs": jobs, "workers": workers })))
}
