use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use gantry_auth::VerifyError;
use gantry_containers::ContainerError;
use gantry_jobs::JobError;
use gantry_volumes::VolumeError;
use serde::Serialize;
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document; the body of every 4xx and 5xx response.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
#[schema(as = ErrorResponse)]
pub struct Problem {
    /// Short human-readable summary
    #[schema(example = "Not Found")]
    pub title: String,
    /// HTTP status code
    #[schema(example = 404)]
    pub status: u16,
    /// Human-readable explanation
    #[schema(example = "network volume not found")]
    pub detail: String,
    /// Individual request-validation failures, one string each (`<location>: <problem>`).
    pub errors: Vec<String>,
}

/// Every error a client can see, with its one mapping to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    PaymentRequired(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{detail}")]
    BadRequest { detail: String, errors: Vec<String> },
    #[error("request validation failed")]
    Unprocessable(Vec<String>),
    #[error("the requested method is not allowed for this path")]
    MethodNotAllowed { allow: String },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    #[error("{0}")]
    RequestTimeout(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    NotImplemented(String),
    /// The cause is logged where it happened; clients see nothing of it.
    #[error("internal server error")]
    Internal,
}

impl ApiError {
    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::BadRequest {
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// Logs an unexpected failure and hides it from the client.
    pub fn internal(context: &str, err: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %err, "{context}");
        ApiError::Internal
    }

    fn errors(&self) -> &[String] {
        match self {
            ApiError::BadRequest { errors, .. } | ApiError::Unprocessable(errors) => errors,
            _ => &[],
        }
    }
}

// ---- every service error's mapping to HTTP, in one place ----

impl From<VerifyError> for ApiError {
    fn from(err: VerifyError) -> Self {
        match err {
            VerifyError::Unavailable => ApiError::Unavailable(err.to_string()),
            other => ApiError::Unauthorized(other.to_string()),
        }
    }
}

impl From<JobError> for ApiError {
    fn from(err: JobError) -> Self {
        match err {
            JobError::NotFound => ApiError::NotFound("job not found".into()),
            JobError::Invalid(message) => ApiError::Unprocessable(vec![message]),
            JobError::InvalidInput(errors) => ApiError::Unprocessable(errors),
            JobError::NotRetryable(_) => ApiError::Conflict(err.to_string()),
            JobError::Lost => ApiError::Unavailable(err.to_string()),
            JobError::PaymentRequired { .. } => ApiError::PaymentRequired(err.to_string()),
            JobError::Database(db) => ApiError::internal("job storage failed", &db),
        }
    }
}

impl From<VolumeError> for ApiError {
    fn from(err: VolumeError) -> Self {
        match err {
            VolumeError::NotFound => ApiError::NotFound("network volume not found".into()),
            VolumeError::SizeDecrease { current, .. } => ApiError::BadRequest {
                detail: err.to_string(),
                errors: vec![format!("$.size: must not be smaller than the current size ({current})")],
            },
            VolumeError::EmptyUpdate => ApiError::Unprocessable(vec![format!("$: {err}")]),
            VolumeError::Database(db) => ApiError::internal("network volume storage failed", &db),
        }
    }
}

impl From<ContainerError> for ApiError {
    fn from(err: ContainerError) -> Self {
        match err {
            ContainerError::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            ContainerError::InUse(detail) => ApiError::Conflict(detail),
            ContainerError::Database(db) => ApiError::internal("container storage failed", &db),
            other => ApiError::internal("container storage failed", &other),
        }
    }
}

/// A database error outside a service (the billing history's reads).
impl From<sea_orm::DbErr> for ApiError {
    fn from(err: sea_orm::DbErr) -> Self {
        ApiError::internal("storage failed", &err)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let mut response = problem_response(status, self.to_string(), self.errors().to_vec());
        if let ApiError::MethodNotAllowed { allow } = self
            && let Ok(value) = HeaderValue::from_str(allow)
        {
            response.headers_mut().insert(header::ALLOW, value);
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body was never read: the connection cannot be reused.
            response
                .head_mut()
                .set_connection_type(actix_web::http::ConnectionType::Close);
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub fn problem_response(status: StatusCode, detail: String, errors: Vec<String>) -> HttpResponse {
    let problem = Problem {
        title: status.canonical_reason().unwrap_or("Error").to_string(),
        status: status.as_u16(),
        detail,
        errors,
    };
    let body = serde_json::to_vec(&problem).unwrap_or_default();
    HttpResponse::build(status).content_type(PROBLEM_JSON).body(body)
}

/// Whether a path is one of the OpenAI routes, which answer in OpenAI's
/// error shape: the problem+json safety net leaves their errors alone, and
/// their OpenAPI entries document that shape.
pub(crate) fn is_openai_path(path: &str) -> bool {
    path.contains("/openai/v1/")
}
