use std::future::{Ready, ready};

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::{ErrorHandlerResponse, Next};
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use gantry_auth::{Principal, Scope};

use crate::app::AppState;
use crate::problem::{ApiError, PROBLEM_JSON, problem_response};

/// Authenticates the bearer key of every request to a protected resource and
/// leaves the `Principal` in the request extensions.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::internal("authenticate", &"application state missing"))?;
    let header = match req.headers().get(header::AUTHORIZATION) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::Unauthorized("the Authorization header must be 'Bearer <api key>'".into()))?,
        ),
    };
    let principal = state.auth.verify_header(header).await.map_err(ApiError::from)?;
    req.extensions_mut().insert(principal);
    next.call(req).await
}

/// The authenticated caller of a protected handler.
pub struct Caller(pub Principal);

impl Caller {
    pub fn require(&self, scope: Scope) -> Result<&Principal, ApiError> {
        if self.0.has(scope) {
            Ok(&self.0)
        } else {
            Err(ApiError::Forbidden(format!("this API key lacks the '{scope}' scope")))
        }
    }

    pub fn user_id(&self) -> &str {
        &self.0.user_id
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let principal = req.extensions().get::<Principal>().cloned();
        // A handler that needs a caller but sits outside `authenticate` is a wiring bug.
        ready(
            principal
                .map(Caller)
                .ok_or_else(|| ApiError::internal("caller", &"no principal on request")),
        )
    }
}

/// The safety net: any 4xx/5xx that is not already problem+json (say, from the
/// framework itself) is rewritten into one, so clients only ever see one error shape.
pub fn ensure_problem<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let detail = match res.response().error() {
        Some(err) if status.is_client_error() => err.to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let (req, old) = res.into_parts();
    let mut new = problem_response(status, detail, Vec::new());
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(req, new).map_into_right_body(),
    ))
}
