//! The RunPod worker protocol, for the containers of users' serverless
//! endpoints: an unmodified runpod-python worker takes jobs here, posts
//! their results and streamed output, pings, and learns which jobs to stop.
//!
//! Only worker containers call these routes (with the per-worker token the
//! fleet gave them as `RUNPOD_AI_API_KEY`, sent as the raw `Authorization`
//! value), so they are not in the public OpenAPI document. Every answer is
//! one the SDK handles calmly: a take it cannot be given a job for is 204,
//! and a take it must not repeat soon is 429 (the SDK sleeps 5 s); any other
//! status would make it retry at once, in a tight loop.
use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use gantry_containers::Fleet;
use gantry_dispatch::{PolledWorker, Report};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::problem::{ApiError, problem_response};
use crate::state::AppState;

/// The longest a take or a stop waits for something to hand out (the SDK
/// gives each call 90 s).
const LONG_POLL: Duration = Duration::from_secs(20);
/// Largest body of a result or a streamed piece.
const RESULT_LIMIT: usize = 20 * 1024 * 1024;
/// Most jobs of one batch take.
const BATCH_MAX: u32 = 64;

#[derive(Deserialize)]
struct TakeQuery {
    batch_size: Option<u32>,
}

/// A take the worker must not repeat at once: 429, which the SDK answers by
/// sleeping 5 s (any other error would make it retry immediately).
fn back_off(reason: &str) -> HttpResponse {
    let mut response = problem_response(
        actix_web::http::StatusCode::TOO_MANY_REQUESTS,
        reason.to_owned(),
        Vec::new(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
    response
}

/// The fleet and the worker's session, if the caller is that worker.
async fn session(
    state: &AppState,
    req: &HttpRequest,
    endpoint_id: &str,
    worker_id: &str,
) -> Result<(std::sync::Arc<Fleet>, PolledWorker), &'static str> {
    let Some(fleet) = state.fleet.clone() else {
        return Err("this process runs no serverless workers");
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !fleet.verify_worker(endpoint_id, worker_id, presented) {
        return Err("the worker token is missing or wrong");
    }
    let Some(session) = fleet.session(endpoint_id, worker_id).await else {
        return Err("this worker has been stopped");
    };
    Ok((fleet, session))
}

fn job_json(job: gantry_dispatch::TakenJob) -> Value {
    let input: Value = serde_json::from_str(&job.input_json).unwrap_or(Value::Null);
    json!({"id": job.job_id, "input": input})
}

/// `GET /v2/{endpoint}/job-take/{worker}`: one job, or 204.
pub async fn take(state: web::Data<AppState>, path: web::Path<(String, String)>, req: HttpRequest) -> HttpResponse {
    let (endpoint_id, worker_id) = path.into_inner();
    let (_, session) = match session(&state, &req, &endpoint_id, &worker_id).await {
        Ok(found) => found,
        Err(reason) => return back_off(reason),
    };
    match session.take(1, LONG_POLL).await {
        Ok(mut jobs) if !jobs.is_empty() => HttpResponse::Ok().json(job_json(jobs.remove(0))),
        Ok(_) => HttpResponse::NoContent().finish(),
        Err(_) => back_off("the worker's session ended; it is registered again on its next call"),
    }
}

/// `GET /v2/{endpoint}/job-take-batch/{worker}?batch_size=N`: up to N jobs, or 204.
pub async fn take_batch(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> HttpResponse {
    let (endpoint_id, worker_id) = path.into_inner();
    let (_, session) = match session(&state, &req, &endpoint_id, &worker_id).await {
        Ok(found) => found,
        Err(reason) => return back_off(reason),
    };
    let size = serde_urlencoded::from_str::<TakeQuery>(req.query_string())
        .ok()
        .and_then(|q| q.batch_size)
        .unwrap_or(1)
        .clamp(1, BATCH_MAX);
    match session.take(size, LONG_POLL).await {
        Ok(jobs) if !jobs.is_empty() => HttpResponse::Ok().json(Value::Array(jobs.into_iter().map(job_json).collect())),
        Ok(_) => HttpResponse::NoContent().finish(),
        Err(_) => back_off("the worker's session ended; it is registered again on its next call"),
    }
}

/// `GET /v2/{endpoint}/job-stop/{worker}`: `{"jobsToStop": [...]}`, or 204.
pub async fn stop(state: web::Data<AppState>, path: web::Path<(String, String)>, req: HttpRequest) -> HttpResponse {
    let (endpoint_id, worker_id) = path.into_inner();
    let (_, session) = match session(&state, &req, &endpoint_id, &worker_id).await {
        Ok(found) => found,
        Err(reason) => return back_off(reason),
    };
    match session.stops(LONG_POLL).await {
        Ok(ids) if !ids.is_empty() => HttpResponse::Ok().json(json!({"jobsToStop": ids})),
        Ok(_) => HttpResponse::NoContent().finish(),
        Err(_) => back_off("the worker's session ended"),
    }
}

#[derive(Deserialize)]
struct PingQuery {
    status: Option<String>,
    check: Option<String>,
    reason: Option<String>,
}

/// `GET /v2/{endpoint}/ping/{worker}`: renews the worker's lease (and with
/// it its jobs'); an unhealthy report is kept on the worker.
pub async fn ping(state: web::Data<AppState>, path: web::Path<(String, String)>, req: HttpRequest) -> HttpResponse {
    let (endpoint_id, worker_id) = path.into_inner();
    let (fleet, session) = match session(&state, &req, &endpoint_id, &worker_id).await {
        Ok(found) => found,
        Err(reason) => return problem_response(actix_web::http::StatusCode::UNAUTHORIZED, reason.into(), Vec::new()),
    };
    let _ = session.touch();
    // Parsed leniently: the ping's only duty is the lease.
    let query: Option<PingQuery> = serde_urlencoded::from_str(req.query_string()).ok();
    if let Some(query) = query
        && query.status.as_deref() == Some("unhealthy")
    {
        let reason = format!(
            "the worker reported itself unhealthy: {} {}",
            query.check.unwrap_or_default(),
            query.reason.unwrap_or_default()
        );
        let _ = fleet.service().note_worker(&worker_id, reason.trim()).await;
    }
    HttpResponse::Ok().json(json!({}))
}

/// Reads a body as JSON whatever its content type (the SDK sends JSON as
/// `application/x-www-form-urlencoded`).
async fn json_body(mut payload: web::Payload) -> Result<Value, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("request body could not be read: {e}")))?;
        if body.len() + chunk.len() > RESULT_LIMIT {
            return Err(ApiError::PayloadTooLarge(RESULT_LIMIT));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

/// What a `job-done` body reports.
fn report_of(body: Value) -> Report {
    let status = body.get("status").and_then(Value::as_str);
    if status == Some("IN_PROGRESS") {
        return Report::Progress(body.get("output").cloned().unwrap_or(Value::Null));
    }
    match body.get("error") {
        Some(Value::String(error)) => Report::Error(error.clone()),
        Some(Value::Null) | None => Report::Output(body.get("output").cloned().unwrap_or(Value::Null)),
        Some(other) => Report::Error(other.to_string()),
    }
}

/// What a worker posts about one of its jobs: `job-done` or `job-stream`.
enum Post {
    Done,
    Stream,
}

/// Reads a worker's post about a job and hands it to its session. A post
/// about a job the worker no longer holds (repeated, or late) is answered
/// 200 and changes nothing, so the SDK's retries never settle a job twice.
async fn posted(
    state: &AppState,
    path: (String, String, String),
    req: &HttpRequest,
    payload: web::Payload,
    post: Post,
) -> Result<HttpResponse, ApiError> {
    let (endpoint_id, worker_id, job_id) = path;
    let (_, session) = session(state, req, &endpoint_id, &worker_id)
        .await
        .map_err(|reason| ApiError::Unauthorized(reason.into()))?;
    let body = json_body(payload).await?;
    let accepted = match post {
        Post::Done => session.report(&job_id, report_of(body)).await,
        Post::Stream => {
            let output = body.get("output").cloned().unwrap_or(body);
            session.stream(&job_id, output).await
        }
    }
    .map_err(|_| ApiError::Unavailable("the worker's session ended; the job was requeued".into()))?;
    Ok(HttpResponse::Ok().json(json!({"accepted": accepted})))
}

/// `POST /v2/{endpoint}/job-done/{worker}/{job}`: the job's result, its
/// error, or (`status: IN_PROGRESS`) its progress.
pub async fn done(
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    posted(&state, path.into_inner(), &req, payload, Post::Done).await
}

/// `POST /v2/{endpoint}/job-stream/{worker}/{job}`: one streamed piece.
pub async fn stream(
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    posted(&state, path.into_inner(), &req, payload, Post::Stream).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_done_bodies() {
        assert_eq!(
            report_of(json!({"output": {"doubled": 42}})),
            Report::Output(json!({"doubled": 42}))
        );
        assert_eq!(
            report_of(json!({"status": "IN_PROGRESS", "output": "half"})),
            Report::Progress(json!("half"))
        );
        assert_eq!(report_of(json!({"error": "boom"})), Report::Error("boom".into()));
        assert_eq!(
            report_of(json!({"output": {"ok": true}, "stopPod": true})),
            Report::Output(json!({"ok": true}))
        );
        assert_eq!(report_of(json!({})), Report::Output(Value::Null));
    }
}
