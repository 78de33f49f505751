//! Reading JSON request bodies and validating them field by field, so that every
//! failure is reported at once as `$.<field>: <problem>`.
use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web;
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::problem::ApiError;

/// Reads a JSON body: a JSON content type, at most `limit` bytes, well-formed.
pub async fn read_json(req: &HttpRequest, mut payload: web::Payload, limit: usize) -> Result<Value, ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let is_json = essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"));
    if !is_json {
        let got = if content_type.is_empty() {
            "none".to_string()
        } else {
            format!("'{content_type}'")
        };
        return Err(ApiError::UnsupportedMediaType(format!(
            "request body must be application/json (Content-Type was {got})"
        )));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    // A client that stalls mid-body must not hold the connection: the whole
    // body has `http.body_timeout_ms` to arrive.
    let timeout = req
        .app_data::<web::Data<crate::app::AppState>>()
        .map_or(std::time::Duration::from_secs(10), |state| state.body_timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(next) => next,
            Err(_) => {
                return Err(ApiError::RequestTimeout(format!(
                    "the request body did not arrive within {} ms",
                    timeout.as_millis()
                )));
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("request body could not be read: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    if body.is_empty() {
        return Err(ApiError::BadRequest {
            detail: "request body is empty; a JSON object was expected".into(),
            errors: vec!["$: missing request body".into()],
        });
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest {
        detail: "request body is not valid JSON".into(),
        errors: vec![format!("$: {e}")],
    })
}

/// Walks one JSON object, collecting every failure instead of stopping at the first.
pub struct ObjectValidator<'a> {
    object: &'a Map<String, Value>,
    errors: Vec<String>,
}

impl<'a> ObjectValidator<'a> {
    /// Starts on the body root, which must be an object.
    pub fn root(value: &'a Value) -> Result<Self, ApiError> {
        match value {
            Value::Object(object) => Ok(Self {
                object,
                errors: Vec::new(),
            }),
            other => Err(ApiError::Unprocessable(vec![format!(
                "$: must be a JSON object, not {}",
                kind(other)
            )])),
        }
    }

    /// Rejects every property not in `allowed`.
    pub fn only(&mut self, allowed: &[&str]) {
        for key in self.object.keys() {
            if !allowed.contains(&key.as_str()) {
                self.errors.push(format!("$.{key}: unknown property"));
            }
        }
    }

    pub fn fail(&mut self, field: &str, problem: impl std::fmt::Display) {
        let at = if field.is_empty() {
            "$".to_string()
        } else {
            format!("$.{field}")
        };
        self.errors.push(format!("{at}: {problem}"));
    }

    /// Keeps the value if it passed, records the failure otherwise.
    pub fn check<T, E: std::fmt::Display>(&mut self, field: &str, result: Result<T, E>) -> Option<T> {
        result.map_err(|e| self.fail(field, e)).ok()
    }

    pub fn string(&mut self, field: &str, required: bool) -> Option<&'a str> {
        match self.object.get(field) {
            None => self.missing(field, required),
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => self.wrong_type(field, "a string", other),
        }
    }

    pub fn integer(&mut self, field: &str, required: bool) -> Option<i64> {
        match self.object.get(field) {
            None => self.missing(field, required),
            Some(Value::Number(n)) if n.is_i64() => n.as_i64(),
            Some(Value::Number(n)) if n.is_u64() => Some(i64::MAX),
            Some(other) => self.wrong_type(field, "an integer", other),
        }
    }

    /// A string that must be one of `allowed`, converted by `parse`.
    pub fn one_of<T>(
        &mut self,
        field: &str,
        required: bool,
        allowed: &[&str],
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let text = self.string(field, required)?;
        let parsed = parse(text);
        if parsed.is_none() {
            self.fail(field, format!("must be one of {} (got '{text}')", allowed.join(", ")));
        }
        parsed
    }

    pub fn finish(self) -> Result<(), ApiError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Unprocessable(self.errors))
        }
    }

    fn missing<T>(&mut self, field: &str, required: bool) -> Option<T> {
        if required {
            self.fail(field, "required property is missing");
        }
        None
    }

    fn wrong_type<T>(&mut self, field: &str, expected: &str, got: &Value) -> Option<T> {
        self.fail(field, format!("must be {expected}, not {}", kind(got)));
        None
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses a comma-separated query value into enum members by their wire names.
pub fn query_list<T: serde::de::DeserializeOwned>(name: &str, value: &str, errors: &mut Vec<String>) -> Vec<T> {
    if value.split(',').all(|v| v.trim().is_empty()) {
        errors.push(format!("{name}: must name at least one value"));
        return Vec::new();
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .filter_map(|v| match serde_json::from_value(Value::String(v.to_string())) {
            Ok(parsed) => Some(parsed),
            Err(_) => {
                errors.push(format!("{name}: unknown value '{v}'"));
                None
            }
        })
        .collect()
}
