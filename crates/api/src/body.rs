//! Reading JSON request bodies into their typed structs ([`RequestBody`]),
//! every failure reported at once as `$.<field>: <problem>`.
use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

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
        .app_data::<web::Data<crate::state::AppState>>()
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

/// A request body as one type: a struct that derives `Deserialize` (with
/// `deny_unknown_fields`, so the document says `additionalProperties: false`)
/// and `ToSchema`, whose field types check their own rules while they are
/// deserialized (a `VolumeName` refuses control characters, a size its
/// range). The OpenAPI schema, the parsing and the field rules are that one
/// struct; [`parse_body`] reports every failure of every field at once.
pub trait RequestBody: DeserializeOwned + ToSchema {
    /// Properties of which at least one must be present (an update); empty
    /// when none is needed.
    const AT_LEAST_ONE_OF: &'static [&'static str] = &[];
    /// What [`RequestBody::validate`] consults besides the body (the catalog).
    type Context: ?Sized;
    /// What a valid body becomes.
    type Valid;
    /// The rules that span fields or need the platform's state; run once every
    /// field is well formed.
    fn validate(self, context: &Self::Context, failures: &mut Failures) -> Option<Self::Valid>;
}

/// Validation failures, each as `$.<field>: <problem>`.
#[derive(Debug, Default)]
pub struct Failures(Vec<String>);

impl Failures {
    /// Records a failure of `field` (a dotted path; empty for the body itself).
    pub fn fail(&mut self, field: &str, problem: impl std::fmt::Display) {
        if field.is_empty() {
            self.0.push(format!("$: {problem}"));
        } else {
            self.0.push(format!("$.{field}: {problem}"));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn into_error(self) -> ApiError {
        ApiError::Unprocessable(self.0)
    }

    /// The failures as the 422 they answer.
    pub fn into_api_error(self) -> ApiError {
        self.into_error()
    }
}

/// Reads a JSON body ([`read_json`]) and parses it as `T` ([`parse_body`]).
pub async fn read_body<T: RequestBody>(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    context: &T::Context,
) -> Result<T::Valid, ApiError> {
    parse_body::<T>(read_json(req, payload, limit).await?, context)
}

/// Parses a JSON value as the request body `T`: the body must be an object;
/// every unknown property, missing required property and field that breaks its
/// type's rules is reported (422, through [`gantry_input::read`]), and only a
/// body whose fields are all well formed goes on to [`RequestBody::validate`].
pub fn parse_body<T: RequestBody>(body: Value, context: &T::Context) -> Result<T::Valid, ApiError> {
    let none_of_them = body.as_object().is_some_and(|object| {
        !T::AT_LEAST_ONE_OF.is_empty() && !T::AT_LEAST_ONE_OF.iter().any(|name| object.contains_key(*name))
    });
    let mut failures = Failures::default();
    let parsed = match gantry_input::read::<T>(body) {
        Ok(parsed) => Some(parsed),
        Err(found) => {
            for failure in found {
                failures.fail(&failure.place(), failure.problem);
            }
            None
        }
    };
    if none_of_them {
        failures.fail(
            "",
            format!("at least one of {} is required", T::AT_LEAST_ONE_OF.join(", ")),
        );
    }
    match parsed {
        Some(parsed) if failures.is_empty() => {
            let valid = parsed.validate(context, &mut failures);
            match valid {
                Some(valid) if failures.is_empty() => Ok(valid),
                _ => Err(failures.into_error()),
            }
        }
        _ => Err(failures.into_error()),
    }
}

pub use gantry_input::{describe, present, present_object};

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::{Value, json};
    use utoipa::ToSchema;

    use super::{Failures, RequestBody, parse_body, present};
    use crate::problem::ApiError;

    /// A body with one of each kind of member.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        name: String,
        count: u32,
        #[serde(default, deserialize_with = "present")]
        #[schema(nullable = false)]
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[serde(default, deserialize_with = "present")]
        #[schema(nullable = false)]
        flag: Option<bool>,
    }

    impl RequestBody for Sample {
        type Context = u32;
        type Valid = (String, u32, Option<bool>);

        fn validate(self, most: &u32, failures: &mut Failures) -> Option<Self::Valid> {
            if self.count > *most {
                failures.fail("count", format!("must be at most {most}"));
                return None;
            }
            Some((self.name, self.count, self.inner.and_then(|inner| inner.flag)))
        }
    }

    fn errors(body: Value) -> Vec<String> {
        match parse_body::<Sample>(body, &10) {
            Err(ApiError::Unprocessable(errors)) => errors,
            Err(other) => panic!("not a 422: {other:?}"),
            Ok(valid) => panic!("accepted: {valid:?}"),
        }
    }

    #[test]
    fn a_valid_body_becomes_its_valid_form() {
        let valid = parse_body::<Sample>(json!({"name": "a", "count": 3, "inner": {"flag": true}}), &10).unwrap();
        assert_eq!(valid, ("a".to_string(), 3, Some(true)));
    }

    #[test]
    fn every_failure_is_reported_at_once_and_in_the_documents_words() {
        let found = errors(json!({"name": 7, "count": -1, "inner": {"flag": "yes", "other": 1}, "extra": null}));
        assert_eq!(
            found,
            [
                "$.count: must be an integer from 0 to 4294967295 (got -1)",
                "$.extra: unknown property",
                "$.inner.flag: must be a boolean, not a string",
                "$.inner.other: unknown property",
                "$.name: must be a string, not a number",
            ]
        );
    }

    #[test]
    fn missing_members_are_all_named_and_wrong_ones_are_not_called_missing() {
        assert_eq!(
            errors(json!({})),
            [
                "$.name: required property is missing",
                "$.count: required property is missing"
            ]
        );
        assert_eq!(
            errors(json!({"name": "a", "count": 1.5})),
            ["$.count: must be an integer from 0 to 4294967295, not a fractional number"]
        );
    }

    #[test]
    fn null_is_refused_where_the_document_says_it_is_not_nullable() {
        assert_eq!(
            errors(json!({"name": "a", "count": 1, "inner": null})),
            ["$.inner: must be a JSON object, not null"]
        );
    }

    #[test]
    fn rules_beyond_the_fields_run_once_the_fields_are_well_formed() {
        assert_eq!(
            errors(json!({"name": "a", "count": 11})),
            ["$.count: must be at most 10"]
        );
        // A malformed member stops them: only the member's own failure shows.
        assert_eq!(
            errors(json!({"name": 1, "count": 11})),
            ["$.name: must be a string, not a number"]
        );
    }

    #[test]
    fn a_body_that_is_not_an_object_is_one_failure() {
        assert_eq!(errors(json!([1])), ["$: must be a JSON object, not an array"]);
    }

    /// The served documents say what the parsers accept: every request body
    /// refuses unknown members, and optional members are not nullable.
    #[test]
    fn request_schemas_refuse_unknown_members_and_null() {
        let management = crate::openapi::openapi_json();
        let public = crate::openapi::public_openapi_json();
        for (doc, name) in [
            (&management, "CreateNetworkVolumeRequest"),
            (&management, "UpdateNetworkVolumeRequest"),
            (&public, "RunRequest"),
            (&public, "RunPolicy"),
        ] {
            let schema = &doc["components"]["schemas"][name];
            assert_eq!(schema["additionalProperties"], json!(false), "{name}: {schema}");
            for (member, property) in schema["properties"].as_object().unwrap() {
                let text = property.to_string();
                assert!(!text.contains("\"null\""), "{name}.{member} is nullable: {text}");
            }
        }
        assert_eq!(
            management["components"]["schemas"]["UpdateNetworkVolumeRequest"]["minProperties"],
            json!(1)
        );
    }
}
