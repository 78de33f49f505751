//! OpenAI-compatible embeddings for the embedding models, on the public
//! listener: `POST /v2/{model_id}/openai/v1/embeddings`. The request becomes
//! an ordinary job of the model (queued, batched with other jobs' inputs on
//! the worker, billed per input token, visible like any other job) and its
//! vectors come back in OpenAI's `list` of `embedding` objects. Errors use
//! OpenAI's error shape, like the other OpenAI routes.
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use gantry_catalog::{ModelKind, ModelSpec};
use gantry_jobs::{Mode, NewJob};
use serde_json::{Map, Value, json};

use super::openai::{BODY_LIMIT, Refusal, api_error, finished_output, served_model};
use crate::body::read_json;
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

/// The members of an OpenAI embeddings request, all passed to the model
/// (`truncate` is Gantry's own: cut long inputs, the default, or refuse them).
const PARAMETERS: [&str; 6] = ["model", "input", "encoding_format", "dimensions", "user", "truncate"];

fn embedding_model<'a>(state: &'a AppState, caller: &Caller, model_id: &str) -> Result<&'a ModelSpec, Refusal> {
    served_model(
        state,
        caller,
        model_id,
        &[ModelKind::Embedding],
        "an embedding model; embeddings are served by embedding models only",
    )
}

/// The job input of an embeddings request: its members, checked for shape
/// here; the model checks the values (every problem listed at once).
fn job_input(body: &Value) -> Result<Map<String, Value>, Refusal> {
    let Some(fields) = body.as_object() else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
            None,
        ));
    };
    if let Some(name) = fields.keys().find(|k| !PARAMETERS.contains(&k.as_str())) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "Unrecognized request argument supplied: {name} (accepted: {})",
                PARAMETERS.join(", ")
            ),
            None,
        ));
    }
    if fields.get("input").is_none_or(Value::is_null) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "`input` is required: a string, an array of strings, or token ids",
            Some("input"),
        ));
    }
    if fields.get("model").is_some_and(|m| !m.is_string()) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "`model` must be a string",
            Some("model"),
        ));
    }
    let mut input = fields.clone();
    // The route names the model; the body's `model` is only checked for shape.
    input.remove("model");
    Ok(input)
}

/// The OpenAI answer for a completed job's output.
fn render(model_id: &str, output: &Value) -> Value {
    let data: Vec<Value> = output["embeddings"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, vector)| json!({"object": "embedding", "index": index, "embedding": vector}))
        .collect();
    let tokens = output["usage"]["input_tokens"].as_u64().unwrap_or(0);
    json!({
        "object": "list",
        "data": data,
        "model": model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "cost": output["cost"],
    })
}

/// Puts the request body's schema (as [`job_input`] and the embedding
/// models check it) into the OpenAPI document `doc`.
pub(crate) fn request_schema(doc: &mut Value) {
    let ids = json!({"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}});
    let schema = json!({
        "type": "object",
        "required": ["input"],
        "additionalProperties": false,
        "properties": {
            "model": {"type": "string", "description": "Ignored: the model is the one in the path."},
            "input": {"anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string"}},
                ids,
                {"type": "array", "minItems": 1, "maxItems": 2048, "items": ids},
            ]},
            "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1, "description": "Only the model's own length is accepted."},
            "user": {"type": "string"},
            "truncate": {"type": "boolean", "description": "An extension: cut inputs longer than the model reads (the default), or refuse them."}
        }
    });
    let body = &mut doc["paths"]["/v2/{model_id}/openai/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"];
    if !body.is_null() {
        *body = schema;
    }
}

#[utoipa::path(post, path = "/v2/{model_id}/openai/v1/embeddings", operation_id = "openaiEmbeddings",
    tag = "OpenAI-compatible",
    description = "OpenAI embeddings for an embedding model: `input` (a string, an array of up to 2048 strings, \
an array of token ids of the model's own vocabulary, or an array of such arrays), `encoding_format` (`float` or \
`base64`), `dimensions` (only the model's own length), `user`, and Gantry's `truncate` (default true: inputs \
longer than the model reads are cut; false refuses them). One vector per input, in order, L2-normalized. \
Billed per input token the model read. Errors use OpenAI's shape. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "An embedding model", example = "all-minilm-l6-v2")),
    request_body(content = Object, description = "An OpenAI embeddings request"),
    responses((status = 200, description = "`{object: \"list\", data: [{object: \"embedding\", index, embedding}], model, usage}`")))]
pub async fn embeddings(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let model_id = path.into_inner();
    let spec = match embedding_model(&state, &caller, &model_id) {
        Ok(spec) => spec,
        Err(refusal) => return refusal.response(),
    };
    let body = match read_json(&req, payload, BODY_LIMIT).await {
        Ok(body) => body,
        Err(error) => return api_error(&error),
    };
    let input = match job_input(&body) {
        Ok(input) => input,
        Err(refusal) => return refusal.response(),
    };
    let user = caller.user_id().to_string();
    let queued = match state
        .jobs
        .submit(&user, spec, NewJob::new(Value::Object(input)), Mode::Sync)
        .await
    {
        Ok(view) => view,
        Err(error) => return api_error(&ApiError::from(error)),
    };
    let bad_input = |status: StatusCode, _: &str| (status == StatusCode::BAD_REQUEST).then(|| "input".to_owned());
    match finished_output(&state, &user, &spec.id, &queued.id, bad_input).await {
        Ok(output) => HttpResponse::Ok().json(render(&model_id, &output)),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_become_model_inputs() {
        let input =
            job_input(&json!({"model": "m", "input": ["a"], "encoding_format": "base64", "truncate": false})).unwrap();
        assert_eq!(
            Value::Object(input),
            json!({"input": ["a"], "encoding_format": "base64", "truncate": false})
        );
        for (body, needle) in [
            (json!([1]), "JSON object"),
            (json!({"model": "m"}), "`input` is required"),
            (json!({"input": "a", "model": 1}), "`model` must be a string"),
            (
                json!({"input": "a", "normalize": false}),
                "Unrecognized request argument supplied: normalize",
            ),
        ] {
            let refusal = job_input(&body).err().unwrap();
            assert!(refusal.message().contains(needle), "{needle:?}: {}", refusal.message());
        }
    }

    #[test]
    fn outputs_become_openai_lists() {
        let output =
            json!({"embeddings": [[0.5, 0.25], "AAAA"], "usage": {"input_tokens": 7}, "cost": {"usd": "0.000001"}});
        let rendered = render("e", &output);
        assert_eq!(rendered["object"], "list");
        assert_eq!(
            rendered["data"][1],
            json!({"object": "embedding", "index": 1, "embedding": "AAAA"})
        );
        assert_eq!(rendered["usage"], json!({"prompt_tokens": 7, "total_tokens": 7}));
        assert_eq!(rendered["model"], "e");
    }
}
