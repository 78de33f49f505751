//! `GET /v2/models` on the public listener: the models a caller can run,
//! from the catalog (prices) and the model manifest (category, description,
//! input schema), with whether a worker serves each one now.
use actix_web::{HttpResponse, web};
use gantry_auth::Scope;
use serde_json::{Value, json};

use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

#[utoipa::path(get, path = "/v2/models", operation_id = "listModels", tag = "Model endpoints",
    description = "Every model served under `/v2/{model_id}/…`: `{models: [{id, category, description, unit, \
price: {usd, per}, inputSchema, available}]}`. `price.usd` is an exact decimal string for `per` units; \
`available` is true while at least one worker serves the model. Requires `endpoints:run`.",
    responses((status = 200, description = "The models")))]
pub async fn list(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRun)?;
    let manifest = state.manifest;
    let mut models = Vec::new();
    for spec in state.models.iter() {
        let entry = manifest.get(&spec.id);
        let (idle, running) = state.worker_counts(&spec.id).await?;
        models.push(json!({
            "id": spec.id,
            "category": spec.kind,
            "description": entry.map(|e| e.description.as_str()).unwrap_or_default(),
            "unit": spec.unit,
            "price": {"usd": spec.price.usd(), "per": spec.price.per()},
            "inputSchema": entry.map(|e| e.input_schema.clone()).unwrap_or(Value::Null),
            "available": idle + running > 0,
        }));
    }
    Ok(HttpResponse::Ok().json(json!({ "models": models })))
}
