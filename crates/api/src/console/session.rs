//! The console's session cookie, its CSRF token, and the sign-in throttle.
use std::future::Future;
use std::pin::Pin;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError, web};
use gantry_auth::{ConsoleSession, Principal, ScopeSet};

use crate::problem::ApiError;
use crate::state::AppState;

/// The session's token (HttpOnly: no script reads it).
pub const SESSION_COOKIE: &str = "gantry_session";
/// The sign-in and sign-up forms' token, echoed in the form (login CSRF).
pub const FORM_COOKIE: &str = "gantry_form";
/// The header `console.js` sends the session's CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The value of cookie `name` in the request, if sent once.
pub fn cookie(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_owned())
}

/// Whether the browser reached us over TLS (directly or through a proxy that says so).
pub fn over_tls(req: &HttpRequest) -> bool {
    req.connection_info().scheme() == "https"
}

/// A `Set-Cookie` value: scoped to `/console`, HttpOnly, SameSite=Strict,
/// Secure over TLS; `max_age` 0 deletes it.
pub fn set_cookie(req: &HttpRequest, name: &str, value: &str, max_age_secs: i64) -> String {
    let secure = if over_tls(req) { "; Secure" } else { "" };
    format!("{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}")
}

/// Constant-time comparison of two tokens.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn live_session(state: &AppState, req: &HttpRequest) -> Result<Option<ConsoleSession>, ApiError> {
    let Some(token) = cookie(req, SESSION_COOKIE) else {
        return Ok(None);
    };
    state
        .auth
        .session(&token)
        .await
        .map_err(|e| ApiError::internal("console session lookup", &e))
}

/// What a console session may do through the API: everything on its own
/// user's resources, as a key with every scope would; the operator's pages
/// need the admin role besides.
pub fn principal_of(session: &ConsoleSession) -> Principal {
    Principal {
        user_id: session.user.id.clone(),
        key_id: format!("console:{}", &session.id[..12.min(session.id.len())]),
        scopes: ScopeSet::all(),
        limits: session.user.limits,
    }
}

/// Authenticates a `/console/api/…` request by its session cookie, checks
/// the CSRF token of a request that changes something, then applies the
/// user's rate limit like a keyed request (`middleware::admit`).
pub async fn api_authenticate<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::internal("console", &"application state missing"))?;
    let Some(session) = live_session(&state, req.request()).await? else {
        let err = ApiError::Unauthorized("sign in to the console first (no live session)".into());
        return Ok(req.into_response(err.error_response()).map_into_right_body());
    };
    let safe = matches!(*req.method(), Method::GET | Method::HEAD);
    let csrf_ok = req
        .headers()
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|sent| same_token(sent, &session.csrf));
    if !safe && !csrf_ok {
        let err = ApiError::Forbidden("missing or wrong CSRF token (X-CSRF-Token)".into());
        return Ok(req.into_response(err.error_response()).map_into_right_body());
    }
    let principal = principal_of(&session);
    req.extensions_mut().insert(session);
    crate::middleware::admit(&state, req, next, principal).await
}

/// The signed-in session of a page request. Without one the browser is sent
/// to the sign-in form, which brings it back here afterwards.
pub struct Signed(pub ConsoleSession);

/// A page request without a live session.
#[derive(Debug)]
pub enum PageError {
    SignIn { back_to: String },
    Api(ApiError),
}

impl std::fmt::Display for PageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageError::SignIn { .. } => f.write_str("sign in first"),
            PageError::Api(err) => write!(f, "{err}"),
        }
    }
}

impl From<ApiError> for PageError {
    fn from(err: ApiError) -> Self {
        PageError::Api(err)
    }
}

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        match self {
            PageError::SignIn { .. } => StatusCode::SEE_OTHER,
            PageError::Api(err) => err.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            PageError::SignIn { back_to } => {
                let location = format!("/console/sign-in?next={}", super::html::url_encode(back_to));
                HttpResponse::SeeOther()
                    .insert_header((header::LOCATION, location))
                    .finish()
            }
            // `security_headers` turns a page's problem+json into the error page.
            PageError::Api(err) => err.error_response(),
        }
    }
}

impl FromRequest for Signed {
    type Error = PageError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, PageError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            if let Some(session) = req.extensions().get::<ConsoleSession>().cloned() {
                return Ok(Signed(session));
            }
            let state = req
                .app_data::<web::Data<AppState>>()
                .cloned()
                .ok_or_else(|| ApiError::internal("console", &"application state missing"))?;
            match live_session(&state, &req).await? {
                Some(session) => Ok(Signed(session)),
                None => Err(PageError::SignIn {
                    back_to: match req.query_string() {
                        "" => req.path().to_owned(),
                        query => format!("{}?{query}", req.path()),
                    },
                }),
            }
        })
    }
}

/// Counts a sign-in attempt against the account and the client address;
/// `Err(seconds)` when either is over its limit.
pub async fn throttle(state: &AppState, req: &HttpRequest, email: &str) -> Result<(), u64> {
    let policy = state.console.sign_in_policy;
    let address = req
        .peer_addr()
        .map_or_else(|| "unknown".to_owned(), |a| a.ip().to_string());
    let email = email.trim().to_ascii_lowercase();
    for counter in [
        format!("console-sign-in:account:{email}"),
        format!("console-sign-in:address:{address}"),
    ] {
        if let gantry_ratelimit::Outcome::Decided(decision) = state.limiter.check(&counter, &policy).await
            && !decision.allowed()
        {
            return Err(decision.retry_after_secs().unwrap_or(60).max(1));
        }
    }
    Ok(())
}
