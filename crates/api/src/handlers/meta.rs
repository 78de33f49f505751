use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::problem::ApiError;
use crate::state::{AppState, Surface};

#[utoipa::path(get, path = "/v2/openapi.json", operation_id = "getOpenApiDocument", tag = "Meta",
    description = "This document.", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn openapi(state: web::Data<AppState>, req: actix_web::HttpRequest) -> HttpResponse {
    let document = match req.app_data::<Surface>() {
        Some(Surface::Public) => state.openapi_public.clone(),
        _ => state.openapi.clone(),
    };
    HttpResponse::Ok().content_type("application/json").body(document)
}

#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "Meta",
    description = "Liveness: answers while the process runs.", security(()),
    responses((status = 200, description = "Alive")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "Meta",
    description = "Readiness: 200 once the database answers, 503 otherwise.", security(()),
    responses((status = 200, description = "Ready")))]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.db.ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness check: database unavailable");
        ApiError::Unavailable("database unavailable".into())
    })?;
    Ok(HttpResponse::Ok().json(json!({"status": "ready"})))
}

#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "Meta",
    description = "Prometheus metrics (text format 0.0.4): HTTP requests and latency by route, rate limiter decisions, \
queue depth and oldest queued job per model, jobs by model and status, job delay and execution histograms, \
workers and slots by model, units produced and USD charged per model, the serverless reconciler's looks and wake-ups. No key needed; see docs/operations.md.", security(()),
    responses((status = 200, description = "The metrics", content_type = "text/plain")))]
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let models: Vec<String> = state.models.iter().map(|m| m.id.clone()).collect();
    let dispatcher = state.dispatcher.as_ref();
    let mut text = gantry_jobs::render_metrics(&state.census, &models, dispatcher).await?;
    if let Some(fleet) = &state.fleet {
        let mut out = gantry_telemetry::Exposition::new();
        fleet.write_metrics(&mut out);
        text.push_str(&out.finish());
    }
    Ok(HttpResponse::Ok()
        .content_type(gantry_telemetry::CONTENT_TYPE)
        .body(text))
}
