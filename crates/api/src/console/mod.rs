//! The web console, served on the management listener under `/console`:
//! people sign in with a password and use the same services the REST API
//! uses (see `docs/console.md`).
//!
//! - Pages are rendered here, on the server, from the services; everything a
//!   user typed is escaped (`html::esc`). A page needs a signed-in session
//!   (`Signed`), or it sends the browser to the sign-in form.
//! - What a page changes goes through `/console/api/…`, authenticated by the
//!   session cookie and a CSRF token (`session::api_authenticate`):
//!   `/console/api/manage/…` and `/console/api/models/…` are the REST API's
//!   and the model endpoints' own handlers (their validation, their errors,
//!   the caller's rate limits); keys and the operator's actions are the
//!   console's own.
//! - A small script (`assets/console.js`, no build step) sends those
//!   requests; the pages are plain HTML forms and tables besides.

use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::{Next, from_fn};
use actix_web::{body::MessageBody, dev::ServiceRequest, dev::ServiceResponse, web};

use crate::routes::Endpoint;
use crate::state::Surface;

mod actions;
mod html;
mod pages;
mod session;

/// The Content-Security-Policy of every console response: scripts and styles
/// only from the console itself (no inline script), no framing, forms and
/// requests only to this origin. Generated images, audio and video come from
/// the public listener, whose origin may differ.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob: http: https:; \
media-src 'self' blob: http: https:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    let is_asset = req.path().starts_with("/console/assets/");
    let is_page = !is_asset && !req.path().starts_with("/console/api/");
    let res = next.call(req).await?;
    // A page that failed (a 403, a 404, a 500 from a service) answers as a
    // page for people; the console's API keeps problem+json.
    let problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(crate::problem::PROBLEM_JSON.as_bytes()));
    let mut res = if is_page && problem {
        let status = res.status();
        let detail = match res.response().error() {
            Some(err) if status.is_client_error() => err.to_string(),
            _ => "Something went wrong on our side; it has been logged.".to_owned(),
        };
        let retry_after = res.headers().get(header::RETRY_AFTER).cloned();
        let (req, _) = res.into_parts();
        let mut page = html::error_page_with(status, &detail);
        if let Some(value) = retry_after {
            page.headers_mut().insert(header::RETRY_AFTER, value);
        }
        ServiceResponse::new(req, page)
    } else {
        res.map_into_boxed_body()
    };
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if !is_asset {
        // Pages carry balances, keys once, CSRF tokens: never stored by a cache.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(res)
}

/// Registers `/console`: the pages, the console's own API, and the REST API
/// and model endpoints mirrored under `/console/api/manage` and
/// `/console/api/models` for the session (only their keyed operations; the
/// OpenAI-compatible routes stay with API keys).
pub fn register(cfg: &mut web::ServiceConfig, management: &[Endpoint], public: &[Endpoint]) {
    let mirror = |endpoints: &[Endpoint]| -> Vec<Endpoint> {
        endpoints
            .iter()
            .filter(|e| e.authenticated && !crate::problem::is_openai_path(e.path))
            .cloned()
            .collect()
    };
    let (management, public) = (mirror(management), mirror(public));
    cfg.service(
        web::scope("/console")
            .wrap(from_fn(security_headers))
            .route("", web::get().to(pages::overview))
            .route("/", web::get().to(pages::overview))
            .route("/assets/{name}", web::get().to(pages::asset))
            .route("/sign-in", web::get().to(pages::sign_in_form))
            .route("/sign-in", web::post().to(actions::sign_in))
            .route("/sign-up", web::get().to(pages::sign_up_form))
            .route("/sign-up", web::post().to(actions::sign_up))
            .route("/sign-out", web::post().to(actions::sign_out))
            .route("/sign-out-everywhere", web::post().to(actions::sign_out_everywhere))
            .route("/keys", web::get().to(pages::keys))
            .route("/volumes", web::get().to(pages::volumes))
            .route("/billing", web::get().to(pages::billing))
            .route("/billing.csv", web::get().to(pages::billing_csv))
            .route("/playground", web::get().to(pages::playground_index))
            .route("/playground/{model}", web::get().to(pages::playground))
            .route("/jobs", web::get().to(pages::jobs))
            .route("/jobs/{model}/{job}", web::get().to(pages::job))
            .route("/templates", web::get().to(pages::templates))
            .route("/endpoints", web::get().to(pages::endpoints))
            .route("/endpoints/{id}", web::get().to(pages::endpoint))
            .route("/endpoints/{id}/workers/{worker}", web::get().to(pages::worker))
            .route("/pods", web::get().to(pages::pods))
            .route("/pods/{id}", web::get().to(pages::pod))
            .route("/admin", web::get().to(pages::admin))
            .service(
                web::scope("/api/manage")
                    .wrap(from_fn(session::api_authenticate))
                    .configure(move |c| crate::routes::register_for_session(c, &management)),
            )
            .service(
                web::scope("/api/models")
                    .app_data(Surface::Public)
                    .wrap(from_fn(session::api_authenticate))
                    .configure(move |c| crate::routes::register_for_session(c, &public)),
            )
            .service(
                web::scope("/api")
                    .wrap(from_fn(session::api_authenticate))
                    .route("/keys", web::post().to(actions::create_key))
                    .route("/keys/{id}", web::delete().to(actions::revoke_key))
                    .route("/admin/credit", web::post().to(actions::admin_credit))
                    .route("/admin/limits", web::post().to(actions::admin_limits))
                    .route("/admin/role", web::post().to(actions::admin_role)),
            )
            .default_service(web::to(pages::not_found)),
    );
}
