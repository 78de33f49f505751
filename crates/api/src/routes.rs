//! The route tables. Every route is registered through here, and the OpenAPI
//! test compares these tables with the generated document.
use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{Route, web};

use crate::handlers::{
    billing, catalog, clusters, embeddings, files, jobs, meta, models, openai, pods, serverless, volumes,
    worker_protocol,
};
use crate::middleware::authenticate;
use crate::problem::ApiError;

/// One operation: a method on a path, and whether it needs an API key.
#[derive(Clone)]
pub struct Endpoint {
    pub method: Method,
    pub path: &'static str,
    pub authenticated: bool,
    route: fn() -> Route,
}

const fn open(method: Method, path: &'static str, route: fn() -> Route) -> Endpoint {
    Endpoint {
        method,
        path,
        authenticated: false,
        route,
    }
}

const fn keyed(method: Method, path: &'static str, route: fn() -> Route) -> Endpoint {
    Endpoint {
        method,
        path,
        authenticated: true,
        route,
    }
}

pub fn management_endpoints() -> Vec<Endpoint> {
    vec![
        keyed(Method::GET, "/v2/network-volumes", || web::get().to(volumes::list)),
        keyed(Method::POST, "/v2/network-volumes", || web::post().to(volumes::create)),
        keyed(Method::GET, "/v2/network-volumes/{id}", || web::get().to(volumes::get)),
        keyed(Method::PATCH, "/v2/network-volumes/{id}", || {
            web::patch().to(volumes::update)
        }),
        keyed(Method::DELETE, "/v2/network-volumes/{id}", || {
            web::delete().to(volumes::delete)
        }),
        keyed(Method::GET, "/v2/catalog/datacenters", || {
            web::get().to(catalog::list_data_centers)
        }),
        keyed(Method::GET, "/v2/catalog/datacenters/{id}", || {
            web::get().to(catalog::get_data_center)
        }),
        keyed(Method::GET, "/v2/catalog/gpus", || web::get().to(catalog::list_gpus)),
        keyed(Method::GET, "/v2/catalog/gpus/{id}", || web::get().to(catalog::get_gpu)),
        keyed(Method::GET, "/v2/catalog/cpus", || web::get().to(catalog::list_cpus)),
        keyed(Method::GET, "/v2/catalog/cpus/{id}", || web::get().to(catalog::get_cpu)),
        keyed(Method::GET, "/v2/catalog/templates", || {
            web::get().to(serverless::catalog_templates)
        }),
        keyed(Method::GET, "/v2/templates", || {
            web::get().to(serverless::list_templates)
        }),
        keyed(Method::POST, "/v2/templates", || {
            web::post().to(serverless::create_template)
        }),
        keyed(Method::GET, "/v2/templates/{id}", || {
            web::get().to(serverless::get_template)
        }),
        keyed(Method::PATCH, "/v2/templates/{id}", || {
            web::patch().to(serverless::update_template)
        }),
        keyed(Method::DELETE, "/v2/templates/{id}", || {
            web::delete().to(serverless::delete_template)
        }),
        keyed(Method::GET, "/v2/registries", || {
            web::get().to(serverless::list_registries)
        }),
        keyed(Method::POST, "/v2/registries", || {
            web::post().to(serverless::create_registry)
        }),
        keyed(Method::GET, "/v2/registries/delegations", || {
            web::get().to(serverless::delegations)
        }),
        keyed(Method::GET, "/v2/registries/{id}", || {
            web::get().to(serverless::get_registry)
        }),
        keyed(Method::DELETE, "/v2/registries/{id}", || {
            web::delete().to(serverless::delete_registry)
        }),
        keyed(Method::GET, "/v2/serverless", || {
            web::get().to(serverless::list_endpoints)
        }),
        keyed(Method::POST, "/v2/serverless", || {
            web::post().to(serverless::create_endpoint)
        }),
        keyed(Method::GET, "/v2/serverless/{id}", || {
            web::get().to(serverless::get_endpoint)
        }),
        keyed(Method::PATCH, "/v2/serverless/{id}", || {
            web::patch().to(serverless::update_endpoint)
        }),
        keyed(Method::DELETE, "/v2/serverless/{id}", || {
            web::delete().to(serverless::delete_endpoint)
        }),
        keyed(Method::GET, "/v2/serverless/{id}/workers", || {
            web::get().to(serverless::workers)
        }),
        keyed(Method::GET, "/v2/serverless/{id}/releases", || {
            web::get().to(serverless::releases)
        }),
        keyed(Method::GET, "/v2/serverless/{id}/workers/{workerId}/logs", || {
            web::get().to(serverless::worker_logs)
        }),
        keyed(Method::GET, "/v2/pods", || web::get().to(pods::list_pods)),
        keyed(Method::POST, "/v2/pods", || web::post().to(pods::create_pod)),
        keyed(Method::GET, "/v2/pods/{id}", || web::get().to(pods::get_pod)),
        keyed(Method::PATCH, "/v2/pods/{id}", || web::patch().to(pods::update_pod)),
        keyed(Method::DELETE, "/v2/pods/{id}", || web::delete().to(pods::delete_pod)),
        keyed(Method::POST, "/v2/pods/{id}/action", || {
            web::post().to(pods::pod_action)
        }),
        keyed(Method::GET, "/v2/pods/{id}/logs", || web::get().to(pods::pod_logs)),
        keyed(Method::GET, "/v2/clusters", || web::get().to(clusters::list_clusters)),
        keyed(Method::POST, "/v2/clusters", || {
            web::post().to(clusters::create_cluster)
        }),
        keyed(Method::GET, "/v2/clusters/{id}", || {
            web::get().to(clusters::get_cluster)
        }),
        keyed(Method::PATCH, "/v2/clusters/{id}", || {
            web::patch().to(clusters::update_cluster)
        }),
        keyed(Method::DELETE, "/v2/clusters/{id}", || {
            web::delete().to(clusters::delete_cluster)
        }),
        keyed(Method::GET, "/v2/clusters/{id}/pods", || {
            web::get().to(clusters::cluster_pods)
        }),
        keyed(Method::GET, "/v2/account/ssh-keys", || {
            web::get().to(pods::get_ssh_keys)
        }),
        keyed(Method::PUT, "/v2/account/ssh-keys", || {
            web::put().to(pods::put_ssh_keys)
        }),
        keyed(Method::GET, "/v2/billing", || web::get().to(billing::history)),
        keyed(Method::GET, "/v2/billing/endpoints", || {
            web::get().to(billing::endpoints)
        }),
        keyed(Method::GET, "/v2/billing/serverless", || {
            web::get().to(billing::serverless)
        }),
        keyed(Method::GET, "/v2/billing/pods", || web::get().to(billing::pods)),
        keyed(Method::GET, "/v2/billing/clusters", || web::get().to(billing::clusters)),
        keyed(Method::GET, "/v2/billing/network-volumes", || {
            web::get().to(billing::network_volumes)
        }),
        keyed(Method::GET, "/v2/billing/balance", || web::get().to(billing::balance)),
        open(Method::GET, "/v2/openapi.json", || web::get().to(meta::openapi)),
        open(Method::GET, "/healthz", || web::get().to(meta::healthz)),
        open(Method::GET, "/readyz", || web::get().to(meta::readyz)),
        open(Method::GET, "/metrics", || web::get().to(meta::metrics)),
    ]
}

pub fn public_endpoints() -> Vec<Endpoint> {
    vec![
        keyed(Method::GET, "/v2/models", || web::get().to(models::list)),
        keyed(Method::POST, "/v2/{model_id}/run", || web::post().to(jobs::run)),
        keyed(Method::POST, "/v2/{model_id}/runsync", || web::post().to(jobs::runsync)),
        keyed(Method::GET, "/v2/{model_id}/status/{job_id}", || {
            web::get().to(jobs::status)
        }),
        keyed(Method::GET, "/v2/{model_id}/stream/{job_id}", || {
            web::get().to(jobs::stream)
        }),
        keyed(Method::POST, "/v2/{model_id}/cancel/{job_id}", || {
            web::post().to(jobs::cancel)
        }),
        keyed(Method::POST, "/v2/{model_id}/retry/{job_id}", || {
            web::post().to(jobs::retry)
        }),
        keyed(Method::POST, "/v2/{model_id}/purge-queue", || {
            web::post().to(jobs::purge_queue)
        }),
        keyed(Method::GET, "/v2/{model_id}/health", || web::get().to(jobs::health)),
        keyed(Method::POST, "/v2/{model_id}/openai/v1/chat/completions", || {
            web::post().to(openai::chat_completions)
        }),
        keyed(Method::POST, "/v2/{model_id}/openai/v1/completions", || {
            web::post().to(openai::completions)
        }),
        keyed(Method::POST, "/v2/{model_id}/openai/v1/embeddings", || {
            web::post().to(embeddings::embeddings)
        }),
        keyed(Method::GET, "/v2/{model_id}/openai/v1/models", || {
            web::get().to(openai::models)
        }),
        open(Method::GET, "/files/jobs/{job_id}/{attempt}/{name}", || {
            web::get().to(files::get)
        }),
        open(Method::HEAD, "/files/jobs/{job_id}/{attempt}/{name}", || {
            web::head().to(files::head)
        }),
        open(Method::GET, "/v2/openapi.json", || web::get().to(meta::openapi)),
        open(Method::GET, "/healthz", || web::get().to(meta::healthz)),
        open(Method::GET, "/readyz", || web::get().to(meta::readyz)),
    ]
}

/// The RunPod worker protocol on the public listener: called only by the
/// containers of users' endpoints, each with its own worker token (not an
/// API key), so not in the public OpenAPI document
/// (`handlers/worker_protocol.rs`).
pub fn worker_protocol_endpoints() -> Vec<Endpoint> {
    vec![
        open(Method::GET, "/v2/{endpoint_id}/job-take/{worker_id}", || {
            web::get().to(worker_protocol::take)
        }),
        open(Method::GET, "/v2/{endpoint_id}/job-take-batch/{worker_id}", || {
            web::get().to(worker_protocol::take_batch)
        }),
        open(Method::GET, "/v2/{endpoint_id}/job-stop/{worker_id}", || {
            web::get().to(worker_protocol::stop)
        }),
        open(Method::GET, "/v2/{endpoint_id}/ping/{worker_id}", || {
            web::get().to(worker_protocol::ping)
        }),
        open(Method::POST, "/v2/{endpoint_id}/job-done/{worker_id}/{job_id}", || {
            web::post().to(worker_protocol::done)
        }),
        open(
            Method::POST,
            "/v2/{endpoint_id}/job-stream/{worker_id}/{job_id}",
            || web::post().to(worker_protocol::stream),
        ),
    ]
}

/// Registers a table: one resource per path, a 405 with `Allow` for other methods,
/// and `authenticate` around every keyed resource (its 405 included).
pub fn register(cfg: &mut web::ServiceConfig, endpoints: &[Endpoint]) {
    register_with(cfg, endpoints, true);
}

/// Registers a table for the console's session (its scope authenticates by
/// the session cookie instead of a key; see `console::session`).
pub fn register_for_session(cfg: &mut web::ServiceConfig, endpoints: &[Endpoint]) {
    register_with(cfg, endpoints, false);
}

fn register_with(cfg: &mut web::ServiceConfig, endpoints: &[Endpoint], bearer: bool) {
    let mut paths: Vec<&'static str> = Vec::new();
    for endpoint in endpoints {
        if !paths.contains(&endpoint.path) {
            paths.push(endpoint.path);
        }
    }
    for path in paths {
        let ops: Vec<&Endpoint> = endpoints.iter().filter(|e| e.path == path).collect();
        let allow = ops.iter().map(|e| e.method.as_str()).collect::<Vec<_>>().join(", ");
        let mut resource = web::resource(path).default_service(web::to(move || {
            let allow = allow.clone();
            async move { Err::<actix_web::HttpResponse, _>(ApiError::MethodNotAllowed { allow }) }
        }));
        for op in &ops {
            resource = resource.route((op.route)());
        }
        if !bearer {
            cfg.service(resource);
        } else if crate::problem::is_openai_path(path) {
            // OpenAI clients read OpenAI's error shape, authentication's included.
            cfg.service(
                resource
                    .wrap(from_fn(authenticate))
                    .wrap(from_fn(openai::openai_errors)),
            );
        } else if ops.iter().any(|e| e.authenticated) {
            cfg.service(resource.wrap(from_fn(authenticate)));
        } else {
            cfg.service(resource);
        }
    }
}

pub async fn not_found(req: actix_web::HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "no route for {} {}",
        req.method(),
        req.path()
    )))
}
