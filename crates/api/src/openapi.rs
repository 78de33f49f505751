//! The OpenAPI 3.1 document, generated from the handlers' annotations. The
//! problem responses and the security requirement are added from the route
//! table, so every operation documents the errors it can actually return.
use utoipa::OpenApi;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, HttpMethod, Ref, RefOr, Response, ResponseBuilder};

use crate::handlers::{
    billing, catalog, clusters, embeddings, files, jobs, meta, models, openai, pods, serverless, volumes,
};
use crate::problem::{PROBLEM_JSON, Problem};
use crate::routes::{Endpoint, management_endpoints, public_endpoints};

#[derive(OpenApi)]
#[openapi(
    info(title = "Gantry management API", version = "2.0.0",
        description = "The management REST API (v2) of Gantry, a self-hostable GPU inference platform. Every error is an RFC 9457 problem document."),
    paths(
        volumes::list, volumes::create, volumes::get, volumes::update, volumes::delete,
        catalog::list_data_centers, catalog::get_data_center,
        catalog::list_gpus, catalog::get_gpu, catalog::list_cpus, catalog::get_cpu,
        billing::history, billing::endpoints, billing::serverless, billing::pods, billing::clusters, billing::network_volumes, billing::balance,
        serverless::catalog_templates, serverless::list_templates, serverless::create_template, serverless::get_template,
        serverless::update_template, serverless::delete_template,
        serverless::list_registries, serverless::create_registry, serverless::delegations, serverless::get_registry,
        serverless::delete_registry,
        serverless::list_endpoints, serverless::create_endpoint, serverless::get_endpoint, serverless::update_endpoint,
        serverless::delete_endpoint, serverless::workers, serverless::releases, serverless::worker_logs,
        pods::list_pods, pods::create_pod, pods::get_pod, pods::update_pod, pods::delete_pod, pods::pod_action,
        pods::pod_logs, pods::get_ssh_keys, pods::put_ssh_keys,
        clusters::list_clusters, clusters::create_cluster, clusters::get_cluster, clusters::update_cluster,
        clusters::delete_cluster, clusters::cluster_pods,
        meta::openapi, meta::healthz, meta::readyz, meta::metrics,
    ),
    components(schemas(Problem, volumes::ListNetworkVolumesResponse, catalog::ListDataCentersResponse, billing::Balance)),
    tags((name = "Network Volumes"), (name = "Catalog"), (name = "Billing"), (name = "Templates"), (name = "Registries"), (name = "Serverless"), (name = "Pods"), (name = "Clusters"), (name = "Meta")),
)]
struct ApiDoc;

#[derive(OpenApi)]
#[openapi(
    info(title = "Gantry model endpoints", version = "2.0.0",
        description = "The public model endpoints of Gantry: run a model synchronously or asynchronously, poll, stream, cancel. Every error is an RFC 9457 problem document."),
    paths(
        models::list, jobs::run, jobs::runsync, jobs::status, jobs::stream, jobs::cancel, jobs::retry, jobs::purge_queue, jobs::health,
        openai::chat_completions, openai::completions, embeddings::embeddings, openai::models,
        files::get, files::head,
        meta::openapi, meta::healthz, meta::readyz,
    ),
    components(schemas(Problem, openai::OpenAiErrorResponse, openai::OpenAiError)),
    tags((name = "Model endpoints"), (name = "OpenAI-compatible"), (name = "Files"), (name = "Meta")),
)]
struct PublicDoc;

/// The management API's document.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    finish(ApiDoc::openapi(), &management_endpoints())
}

/// The public listener's document.
pub fn public_openapi_document() -> utoipa::openapi::OpenApi {
    finish(PublicDoc::openapi(), &public_endpoints())
}

/// The management API's document as served: [`openapi_document`] with the
/// `Last-Event-ID` header's form stated (see [`tighten_parameters`]).
pub fn openapi_json() -> serde_json::Value {
    let mut doc = serde_json::to_value(openapi_document()).unwrap_or_default();
    tighten_parameters(&mut doc);
    doc
}

/// States the `Last-Event-ID` header's form. (Query parameters state their
/// own: each is a typed field of its route's query struct, `crate::query`.)
fn tighten_parameters(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(serde_json::Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for operation in item.values_mut() {
            let Some(parameters) = operation
                .get_mut("parameters")
                .and_then(serde_json::Value::as_array_mut)
            else {
                continue;
            };
            for parameter in parameters {
                if parameter["in"] == "header" && parameter["name"] == "Last-Event-ID" {
                    // A chunk sequence number, or a log line's time in
                    // nanoseconds, as the events' `id` carry it.
                    let digits = if path.ends_with("/logs") { 19 } else { 18 };
                    parameter["schema"] =
                        serde_json::json!({"type": "string", "pattern": format!("^[0-9]{{1,{digits}}}$")});
                }
            }
        }
    }
}

/// The public listener's document as served: [`public_openapi_document`]
/// with the input schema of every model of the manifest (`ModelInput.<id>`),
/// which a job's `input` is one of.
pub fn public_openapi_json() -> serde_json::Value {
    public_openapi_json_with(gantry_manifest::Manifest::builtin())
}

/// [`public_openapi_json`] for the models of `manifest`.
pub fn public_openapi_json_with(manifest: &gantry_manifest::Manifest) -> serde_json::Value {
    let mut doc = serde_json::to_value(public_openapi_document()).unwrap_or_default();
    let mut refs = Vec::new();
    for model in manifest.models() {
        if !model.input_schema.is_object() {
            continue;
        }
        let name = format!("ModelInput.{}", model.id);
        let mut schema = model.input_schema.clone();
        if schema.get("description").is_none() {
            schema["description"] = serde_json::json!(format!("The input of `{}`: {}", model.id, model.description));
        }
        doc["components"]["schemas"][&name] = schema;
        refs.push(serde_json::json!({ "$ref": format!("#/components/schemas/{name}") }));
    }
    if !refs.is_empty() {
        let input = &mut doc["components"]["schemas"]["RunRequest"]["properties"]["input"];
        // Any JSON object is accepted: the model checks it against its own
        // schema (`ModelInput.<id>`, listed here) and a bad input ends the
        // job FAILED with the reason, never retried, never charged.
        *input = serde_json::json!({
            "type": "object",
            "description": "The model's input: a JSON object as the model's own schema describes it \
        (`ModelInput.<model_id>` in this document's components). The endpoint accepts any object; an input the model \
        refuses ends the job `FAILED` with the reason (never retried, never charged).",
            "x-model-inputs": refs,
        });
    }
    doc["components"]["schemas"]["RunRequest"]["properties"]["webhook"]["pattern"] =
        serde_json::json!(crate::handlers::jobs::WEBHOOK_PATTERN);
    tighten_parameters(&mut doc);
    openai_member_schemas(&mut doc);
    embeddings::request_schema(&mut doc);
    doc
}

fn finish(mut doc: utoipa::openapi::OpenApi, endpoints: &[Endpoint]) -> utoipa::openapi::OpenApi {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearerAuth",
        SecurityScheme::Http(
            Http::builder()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("Gantry API key (gk_…)")
                .build(),
        ),
    );
    for endpoint in endpoints {
        if let Some(op) = operation(&mut doc.paths.paths.get_mut(endpoint.path), endpoint) {
            decorate(op, endpoint);
        }
    }
    doc
}

/// The OpenAI request members whose shapes are written as JSON Schema
/// (`handlers::text_request::written_schemas`), set into the typed bodies.
fn openai_member_schemas(doc: &mut serde_json::Value) {
    for (path, members) in crate::handlers::written_schemas() {
        // Only where the document has the route (indexing would add it).
        if doc["paths"].get(path).is_none() {
            continue;
        }
        let properties =
            &mut doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"];
        for (member, schema) in members {
            properties[member] = schema;
        }
    }
}

fn operation<'a>(item: &'a mut Option<&mut PathItem>, endpoint: &Endpoint) -> Option<&'a mut Operation> {
    let item = item.as_mut()?;
    match method_of(endpoint)? {
        HttpMethod::Get => item.get.as_mut(),
        HttpMethod::Post => item.post.as_mut(),
        HttpMethod::Patch => item.patch.as_mut(),
        HttpMethod::Delete => item.delete.as_mut(),
        HttpMethod::Put => item.put.as_mut(),
        _ => None,
    }
}

pub(crate) fn method_of(endpoint: &Endpoint) -> Option<HttpMethod> {
    Some(match endpoint.method.as_str() {
        "GET" => HttpMethod::Get,
        "POST" => HttpMethod::Post,
        "PATCH" => HttpMethod::Patch,
        "DELETE" => HttpMethod::Delete,
        "PUT" => HttpMethod::Put,
        _ => return None,
    })
}

fn problem(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(PROBLEM_JSON, Content::new(Some(Ref::from_schema_name("ErrorResponse"))))
        .build()
}

/// The OpenAI-compatible routes answer errors in OpenAI's shape.
fn openai_error(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            Content::new(Some(Ref::from_schema_name("OpenAIErrorResponse"))),
        )
        .build()
}

fn decorate(op: &mut Operation, endpoint: &Endpoint) {
    let openai = crate::problem::is_openai_path(endpoint.path);
    let mut add = |status: &str, description: &str| {
        op.responses.responses.entry(status.to_string()).or_insert_with(|| {
            if openai {
                openai_error(description).into()
            } else {
                problem(description).into()
            }
        });
    };
    if endpoint.authenticated {
        add(
            "401",
            "The bearer key is missing, malformed, unknown, revoked or expired.",
        );
        add("403", "The key is valid but lacks the scope this operation needs.");
        add("405", "Method not allowed on this path; `Allow` lists the methods.");
        if endpoint.path.contains('{') {
            add("404", "Not found, or not the caller's.");
        }
        // Every route that queues a job admits it against the caller's credit.
        let queues = endpoint.path.ends_with("/run")
            || endpoint.path.ends_with("/runsync")
            || endpoint.path.contains("/retry/")
            || endpoint.path.ends_with("/completions");
        if endpoint.path.contains("/retry/") {
            add("409", "The job is not FAILED or TIMED_OUT: only those can be retried.");
        }
        if openai && endpoint.path.ends_with("/completions") {
            add(
                "409",
                "The generation's job was cancelled (through the job routes) before it finished.",
            );
            add("504", "The generation ran past its execution timeout.");
        }
        if endpoint.path.starts_with("/v2/{model_id}/") && queues {
            add(
                "402",
                "No credit left: the balance minus what the caller's queued and running jobs may cost is not above zero. Nothing was queued.",
            );
        }
        if op.request_body.is_some() {
            add(
                "400",
                "Malformed JSON, or a request that conflicts with the resource's rules.",
            );
            add("413", "The request body exceeds the limit.");
            add("415", "The request body is not application/json.");
            add("422", "Validation failed; `errors` lists every failure.");
        } else if endpoint.path.starts_with("/v2/catalog") || endpoint.path.starts_with("/v2/billing") {
            add("400", "Invalid query parameters; `errors` lists every failure.");
        }
        add(
            "429",
            "A rate limit window is exhausted; `detail` names it and `Retry-After` says when to retry.",
        );
        add("500", "Internal error; nothing internal is disclosed.");
        op.security = Some(vec![SecurityRequirement::new("bearerAuth", Vec::<String>::new())]);
        for (status, response) in op.responses.responses.iter_mut() {
            if let RefOr::T(response) = response
                && status != "401"
            {
                add_rate_limit_headers(response, status == "429");
            }
        }
    }
}

/// Every authenticated response carries the limit headers (exempt users excepted).
fn add_rate_limit_headers(response: &mut Response, with_retry_after: bool) {
    let string_header = |description: &str| {
        HeaderBuilder::new()
            .schema(Some(
                utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::Type::String),
            ))
            .description(Some(description))
            .build()
            .into()
    };
    response.headers.insert(
        "RateLimit-Policy".into(),
        string_header("Quota per window: `\"minute\";q=600;w=60, \"hour\";q=20000;w=3600, \"day\";q=200000;w=86400`"),
    );
    response.headers.insert(
        "RateLimit".into(),
        string_header("Remaining requests and seconds to reset per window: `\"minute\";r=599;t=42, …`"),
    );
    if with_retry_after {
        let header = HeaderBuilder::new()
            .schema(Some(
                utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::Type::Integer),
            ))
            .description(Some("Seconds until the exceeded window's quota returns"))
            .build();
        response.headers.insert("Retry-After".into(), header.into());
    }
}
