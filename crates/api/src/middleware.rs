use std::future::{Ready, ready};

use actix_web::ResponseError;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::middleware::{ErrorHandlerResponse, Next};
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use gantry_auth::{Principal, Scope};
use gantry_ratelimit::{Decision, FailMode, Outcome, Policy};

use crate::problem::{ApiError, PROBLEM_JSON, problem_response};
use crate::state::{AppState, Surface};

/// Answers `404` for a path with a percent-encoded NUL (`%00`): no resource
/// has one in its name, and PostgreSQL's text cannot hold it, so it never
/// reaches a query.
pub async fn refuse_nul_in_path<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    if req.path().contains("%00") {
        let err = ApiError::NotFound(format!("no resource at {}", req.path()));
        return Ok(req.into_response(err.error_response()).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// Authenticates the bearer key of every request to a protected resource,
/// applies the caller's rate limit, and leaves the `Principal` in the request
/// extensions. Every response after authentication carries the limit headers.
pub async fn authenticate<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::internal("authenticate", &"application state missing"))?;
    // Two keys are no key: which one would the caller mean?
    if req.headers().get_all(header::AUTHORIZATION).nth(1).is_some() {
        let err = ApiError::BadRequest {
            detail: "invalid headers".into(),
            errors: vec!["Authorization: give one header, not several".into()],
        };
        return Ok(req.into_response(err.error_response()).map_into_right_body());
    }
    let header = match req.headers().get(header::AUTHORIZATION) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::Unauthorized("the Authorization header must be 'Bearer <api key>'".into()))?,
        ),
    };
    let principal = state.auth.verify_header(header).await.map_err(ApiError::from)?;
    admit(&state, req, next, principal).await
}

/// Applies the rate limit of `principal` (a key's or a console session's
/// user) on the request's listener, then calls the handler with the
/// principal in the request extensions; every response after this carries
/// the limit headers.
pub(crate) async fn admit<B: MessageBody + 'static>(
    state: &AppState,
    req: ServiceRequest,
    next: Next<B>,
    principal: Principal,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let surface = req.app_data::<Surface>().copied().unwrap_or(Surface::Management);
    let outcome = match principal.limits.exempt {
        true => None,
        false => {
            let policy = policy_for(state, &principal, surface);
            let counter = match surface {
                Surface::Management => principal.user_id.clone(),
                Surface::Public => format!("{}:public", principal.user_id),
            };
            Some(state.limiter.check(&counter, &policy).await)
        }
    };
    let listener = match surface {
        Surface::Management => "management",
        Surface::Public => "public",
    };
    let observed = gantry_telemetry::metrics();
    match &outcome {
        None => {}
        Some(Outcome::Unavailable { .. }) => observed.ratelimit_decision(listener, "unavailable"),
        Some(Outcome::Decided(decision)) if decision.allowed() => observed.ratelimit_decision(listener, "allowed"),
        Some(Outcome::Decided(_)) => observed.ratelimit_decision(listener, "limited"),
    }
    let decision = match outcome {
        None
        | Some(Outcome::Unavailable {
            fail_mode: FailMode::Open,
        }) => None,
        Some(Outcome::Unavailable {
            fail_mode: FailMode::Closed,
        }) => {
            let err = ApiError::Unavailable("rate limiting is unavailable; try again shortly".into());
            let mut response = err.error_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Ok(req.into_response(response).map_into_right_body());
        }
        Some(Outcome::Decided(decision)) => Some(decision),
    };
    if let Some(decision) = decision.filter(|d| !d.allowed()) {
        let window = decision.exceeded_window().map(|w| w.name()).unwrap_or("minute");
        let mut response =
            ApiError::TooManyRequests(format!("rate limit exceeded for the {window} window")).error_response();
        let retry_after = decision.retry_after_secs().unwrap_or(1).max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        stamp(response.headers_mut(), &decision);
        return Ok(req.into_response(response).map_into_right_body());
    }
    req.extensions_mut().insert(principal);
    let mut response = next.call(req).await?;
    if let Some(decision) = decision {
        stamp(response.headers_mut(), &decision);
    }
    Ok(response.map_into_left_body())
}

fn policy_for(state: &AppState, principal: &Principal, surface: Surface) -> Policy {
    let base = match surface {
        Surface::Management => state.policies.0,
        Surface::Public => state.policies.1,
    };
    let limits = principal.limits;
    Policy::new(
        limits.minute.unwrap_or(base.minute),
        limits.hour.unwrap_or(base.hour),
        limits.day.unwrap_or(base.day),
    )
}

fn stamp(headers: &mut HeaderMap, decision: &Decision) {
    for (name, value) in [
        (RATELIMIT_POLICY, decision.policy_header()),
        (RATELIMIT, decision.ratelimit_header()),
    ] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

const RATELIMIT_POLICY: &str = "ratelimit-policy";
const RATELIMIT: &str = "ratelimit";

/// The authenticated caller of a protected handler.
pub struct Caller(pub Principal);

impl Caller {
    pub fn require(&self, scope: Scope) -> Result<&Principal, ApiError> {
        if self.0.has(scope) {
            Ok(&self.0)
        } else {
            Err(ApiError::Forbidden(format!("this API key lacks the '{scope}' scope")))
        }
    }

    pub fn user_id(&self) -> &str {
        &self.0.user_id
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let principal = req.extensions().get::<Principal>().cloned();
        // A handler that needs a caller but sits outside `authenticate` is a wiring bug.
        ready(
            principal
                .map(Caller)
                .ok_or_else(|| ApiError::internal("caller", &"no principal on request")),
        )
    }
}

/// The safety net: any 4xx/5xx that is not already problem+json (say, from the
/// framework itself) is rewritten into one, so clients only ever see one error shape.
pub fn ensure_problem<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    // The console's pages answer in HTML, for people.
    let is_page = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    if is_problem || is_page || crate::problem::is_openai_path(res.request().path()) {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let detail = match res.response().error() {
        Some(err) if status.is_client_error() => err.to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let (req, old) = res.into_parts();
    let mut new = problem_response(status, detail, Vec::new());
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(req, new).map_into_right_body(),
    ))
}

/// Counts every request of a listener and its latency, by route pattern
/// (`/v2/{model_id}/run`, never the raw path) and status.
pub async fn observe<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    let started = std::time::Instant::now();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".to_string());
    let method = req.method().clone();
    let listener = match req.app_data::<Surface>().copied().unwrap_or(Surface::Management) {
        Surface::Management => "management",
        Surface::Public => "public",
    };
    // Every log line of the request carries its id (the caller's
    // `X-Request-Id` when it sends a sane one), and the response returns it.
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(new_request_id, str::to_string);
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        otel.name = %format_args!("{} {route}", method.as_str()),
        otel.kind = "server",
        http.request.method = method.as_str(),
        http.route = %route,
    );
    // A caller's W3C `traceparent` makes this request part of its trace; its
    // log lines name the trace.
    let traceparent = req.headers().get("traceparent").and_then(|v| v.to_str().ok());
    gantry_telemetry::trace::set_parent(&span, traceparent);
    if let Some(trace_id) = gantry_telemetry::trace::trace_id_of(&span, traceparent) {
        span.record("trace_id", trace_id.as_str());
    }
    let access = span.clone();
    let mut result = tracing::Instrument::instrument(next.call(req), span).await;
    if let Ok(res) = &mut result
        && let Ok(value) = header::HeaderValue::from_str(&request_id)
    {
        res.headers_mut().insert(HeaderName::from_static("x-request-id"), value);
    }
    let status = match &result {
        Ok(res) => res.status().as_u16(),
        Err(error) => error.as_response_error().status_code().as_u16(),
    };
    let took = started.elapsed();
    gantry_telemetry::metrics().http_request(&route, method.as_str(), listener, status, took);
    // The access log, at debug level: one line per request, in its span.
    access.in_scope(|| tracing::debug!(status, took_us = took.as_micros() as u64, "request answered"));
    result
}

/// A new request id: 16 random bytes in hex.
fn new_request_id() -> String {
    use rand::RngExt;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes: [u8; 16] = rand::rng().random();
    let mut id = String::with_capacity(32);
    for b in bytes {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}
