//! The HTTP facade. Routing, extractors, problem+json and headers live here;
//! business rules live in the service crates.
mod app;
mod body;
mod connection;
mod console;
mod handlers;
mod middleware;
mod openapi;
mod problem;
mod routes;

pub use actix_web::dev::ServerHandle;
pub use app::{
    AppState, Application, HttpConfig, ListenError, Services, Surface, metrics_server, process_metrics_server,
};
pub use console::ConsoleConfig;
pub use openapi::{openapi_document, openapi_json, public_openapi_document, public_openapi_json};
pub use problem::{ApiError, Problem};
pub use routes::{Endpoint, management_endpoints, public_endpoints};
