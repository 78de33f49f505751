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

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openai::{BODY_LIMIT, Refusal, api_error, finished_output, member_failure, members, served_model};
use crate::body::{Failures, RequestBody, parse_body, read_json};
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

/// An OpenAI embeddings request. Its members are passed to the model, which
/// checks the values against itself (token ids in its vocabulary, its
/// length for `dimensions`); `truncate` is Gantry's own.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EmbeddingsRequest {
    /// Ignored: the model is the one in the path.
    #[serde(default)]
    #[allow(dead_code)] // accepted, not used
    model: Option<String>,
    #[serde(deserialize_with = "input")]
    #[schema(value_type = Object)] // shape: INPUT_SCHEMA
    input: Value,
    #[serde(default)]
    #[schema(inline)]
    encoding_format: Option<EncodingFormat>,
    /// Only the model's own length is accepted.
    #[serde(default)]
    #[schema(minimum = 1)]
    dimensions: Option<u64>,
    #[serde(default)]
    user: Option<String>,
    /// An extension: cut inputs longer than the model reads (the default), or refuse them.
    #[serde(default)]
    truncate: Option<bool>,
}

#[derive(Deserialize, Serialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum EncodingFormat {
    Float,
    Base64,
}

/// `input` is required and not null; its forms are the model's to check.
fn input<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Err(serde::de::Error::custom(INPUT_REQUIRED)),
        value => Ok(value),
    }
}

const INPUT_REQUIRED: &str = "`input` is required: a string, an array of strings, or token ids";

impl RequestBody for EmbeddingsRequest {
    type Context = ();
    type Valid = Map<String, Value>;

    fn validate(self, _: &(), _: &mut Failures) -> Option<Self::Valid> {
        // The route names the model: the body's `model` is not passed on.
        let mut input = Map::new();
        input.insert("input".into(), self.input);
        let members = [
            ("encoding_format", self.encoding_format.map(|f| json!(f))),
            ("dimensions", self.dimensions.map(Value::from)),
            ("user", self.user.map(Value::String)),
            ("truncate", self.truncate.map(Value::Bool)),
        ];
        input.extend(
            members
                .into_iter()
                .filter_map(|(name, value)| Some((name.to_owned(), value?))),
        );
        Some(input)
    }
}

/// `input`'s forms, for the document.
fn input_schema() -> Value {
    let ids = json!({"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}});
    json!({"anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string"}},
        ids,
        {"type": "array", "minItems": 1, "maxItems": 2048, "items": ids},
    ]})
}

fn embedding_model<'a>(state: &'a AppState, caller: &Caller, model_id: &str) -> Result<&'a ModelSpec, Refusal> {
    served_model(
        state,
        caller,
        model_id,
        &[ModelKind::Embedding],
        "an embedding model; embeddings are served by embedding models only",
    )
}

/// The job input of an embeddings request, in OpenAI's words when it is
/// refused: the first problem, naming its member.
fn job_input(body: Value) -> Result<Map<String, Value>, Refusal> {
    if !body.is_object() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
            None,
        ));
    }
    let failures = match parse_body::<EmbeddingsRequest>(body, &()) {
        Ok(input) => return Ok(input),
        Err(ApiError::Unprocessable(failures)) => failures,
        Err(other) => return Err(Refusal::new(StatusCode::BAD_REQUEST, other.to_string(), None)),
    };
    let accepted = members::<EmbeddingsRequest>().join(", ");
    let (param, messages): (Vec<String>, Vec<String>) = failures
        .iter()
        .map(|failure| {
            let (member, problem) = member_failure(failure);
            let message = match problem.as_str() {
                "unknown parameter" => {
                    format!("Unrecognized request argument supplied: {member} (accepted: {accepted})")
                }
                "required property is missing" if member == "input" => INPUT_REQUIRED.to_owned(),
                _ if problem.starts_with('`') => problem,
                _ => format!("`{member}` {problem}"),
            };
            (member.split('.').next().unwrap_or_default().to_owned(), message)
        })
        .unzip();
    // An unknown member has no parameter to name, as OpenAI answers it.
    let first = param
        .first()
        .filter(|_| !messages[0].starts_with("Unrecognized"))
        .cloned();
    Err(Refusal::new(
        StatusCode::BAD_REQUEST,
        messages.join("; "),
        first.as_deref(),
    ))
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

/// Sets `input`'s forms into the typed request body of the document `doc`.
pub(crate) fn request_schema(doc: &mut Value) {
    // Only where the document has the route (indexing would add it).
    if doc["paths"].get("/v2/{model_id}/openai/v1/embeddings").is_none() {
        return;
    }
    let properties = &mut doc["paths"]["/v2/{model_id}/openai/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"]["properties"];
    properties["input"] = input_schema();
}

#[utoipa::path(post, path = "/v2/{model_id}/openai/v1/embeddings", operation_id = "openaiEmbeddings",
    tag = "OpenAI-compatible",
    description = "OpenAI embeddings for an embedding model: `input` (a string, an array of up to 2048 strings, \
an array of token ids of the model's own vocabulary, or an array of such arrays), `encoding_format` (`float` or \
`base64`), `dimensions` (only the model's own length), `user`, and Gantry's `truncate` (default true: inputs \
longer than the model reads are cut; false refuses them). One vector per input, in order, L2-normalized. \
Billed per input token the model read. Errors use OpenAI's shape. Requires `endpoints:run`.",
    params(("model_id" = String, Path, description = "An embedding model", example = "all-minilm-l6-v2")),
    request_body(content = inline(EmbeddingsRequest), description = "An OpenAI embeddings request"),
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
    let input = match job_input(body) {
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
            job_input(json!({"model": "m", "input": ["a"], "encoding_format": "base64", "truncate": false})).unwrap();
        assert_eq!(
            Value::Object(input),
            json!({"input": ["a"], "encoding_format": "base64", "truncate": false})
        );
        for (body, needle) in [
            (json!([1]), "JSON object"),
            (json!({"model": "m"}), "`input` is required"),
            (json!({"input": "a", "model": 1}), "`model` must be a string"),
            (json!({"input": null}), "`input` is required"),
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "`encoding_format` must be one of float, base64",
            ),
            (
                json!({"input": "a", "normalize": false}),
                "Unrecognized request argument supplied: normalize",
            ),
        ] {
            let refusal = job_input(body).err().unwrap();
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
