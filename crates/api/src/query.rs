//! Reading query strings into typed structs ([`RequestQuery`]), the way
//! [`crate::body`] reads bodies: one struct is the parameters' OpenAPI
//! description (`IntoParams`), their parsing and their rules, and every
//! failure is reported at once (400, `<parameter>: <problem>`).
//!
//! A parameter's value type checks its own rule while it is read
//! ([`QueryValue`]: a time, a bounded integer, a comma-separated list of wire
//! names); rules between parameters run afterwards, once every parameter is
//! well formed ([`RequestQuery::validate`]). Unknown parameters and repeated
//! ones are failures too: a misspelt filter is an error, never a silent no-op.
//!
//! Each value type also states its schema (`PartialSchema`), which the
//! parameter shows (`#[param(inline)]`): the document says what the parser
//! reads because the same type does both.
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use actix_web::HttpRequest;
use serde::de::DeserializeOwned;
use utoipa::IntoParams;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::problem::ApiError;

/// A query string as one type: a struct that derives `Deserialize` and
/// `IntoParams` (`#[into_params(parameter_in = Query)]`), whose fields are
/// `Option`s of [`QueryValue`] types read with [`value`].
pub trait RequestQuery: DeserializeOwned + IntoParams + 'static {
    /// What a valid query becomes.
    type Valid;
    /// Rules about which parameters go together (`count` only with
    /// `include`): they hold on the names given, so they run whatever the
    /// values, beside the values' own failures.
    fn combinations(_given: &[&str], _failures: &mut Vec<String>) {}
    /// The rules between parameters; run once every parameter is well formed.
    fn validate(self, failures: &mut Vec<String>) -> Option<Self::Valid>;
}

/// Reads the request's query string as `T` ([`parse_query_str`]).
pub fn parse_query<T: RequestQuery>(req: &HttpRequest) -> Result<T::Valid, ApiError> {
    parse_query_str::<T>(req.query_string())
}

/// Parses a query string as `T`: unknown and repeated parameters, values that
/// break their type's rule and then the rules between parameters, each
/// reported (in the order the parameters were given).
pub fn parse_query_str<T: RequestQuery>(query: &str) -> Result<T::Valid, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::bad_request(format!("query string could not be parsed: {e}")))?;
    let known = names::<T>();
    let mut failures = Vec::new();
    let mut kept: Vec<(String, String)> = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        if !known.contains(&key) {
            failures.push(format!(
                "{key}: unknown query parameter (supported: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        } else if kept.iter().any(|(k, _)| *k == key) {
            failures.push(format!("{key}: given more than once"));
        } else {
            kept.push((key, value));
        }
    }
    let given: Vec<String> = kept.iter().map(|(key, _)| key.clone()).collect();
    // Read; a failing parameter is recorded, taken out, and the rest read
    // again, so that every parameter's failure is found (a query has a few).
    let parsed = loop {
        let encoded = serde_urlencoded::to_string(&kept).unwrap_or_default();
        let reader = serde_urlencoded::Deserializer::new(form_urlencoded::parse(encoded.as_bytes()));
        let err = match serde_path_to_error::deserialize::<_, T>(reader) {
            Ok(parsed) => break Some(parsed),
            Err(err) => err,
        };
        let key = err.path().iter().find_map(|segment| match segment {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            _ => None,
        });
        let message = err.into_inner().to_string();
        let at = key.as_ref().and_then(|key| kept.iter().position(|(k, _)| k == key));
        match (key, at) {
            (Some(key), Some(at)) => {
                failures.extend(message.lines().map(|line| format!("{key}: {line}")));
                kept.remove(at);
            }
            _ => {
                failures.push(message);
                break None;
            }
        }
    };
    T::combinations(&given.iter().map(String::as_str).collect::<Vec<_>>(), &mut failures);
    match parsed {
        Some(parsed) if failures.is_empty() => match parsed.validate(&mut failures) {
            Some(valid) if failures.is_empty() => Ok(valid),
            _ => Err(invalid(failures)),
        },
        _ => Err(invalid(failures)),
    }
}

/// The 400 of a query's failures.
pub fn invalid(errors: Vec<String>) -> ApiError {
    ApiError::BadRequest {
        detail: "invalid query parameters".into(),
        errors,
    }
}

/// The parameters `T` documents, in its order: built once per type (the
/// parameters' descriptions and schemas are made to read the names).
fn names<T: IntoParams + 'static>() -> Arc<[String]> {
    static NAMES: OnceLock<RwLock<HashMap<TypeId, Arc<[String]>>>> = OnceLock::new();
    let names = NAMES.get_or_init(RwLock::default);
    if let Some(known) = names.read().ok().and_then(|map| map.get(&TypeId::of::<T>()).cloned()) {
        return known;
    }
    let known: Arc<[String]> = T::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .map(|parameter| parameter.name)
        .collect();
    if let Ok(mut map) = names.write() {
        map.insert(TypeId::of::<T>(), Arc::clone(&known));
    }
    known
}

/// A parameter's value, read from its text. The error is the problem without
/// the parameter's name (`must be …`); several problems go on separate lines.
pub trait QueryValue: Sized {
    fn from_query(text: &str) -> Result<Self, String>;
}

/// For an optional parameter of a [`QueryValue`] type:
/// `#[serde(default, deserialize_with = "query::value")]`.
pub fn value<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: QueryValue,
{
    let text = <String as serde::Deserialize>::deserialize(deserializer)?;
    T::from_query(&text).map(Some).map_err(serde::de::Error::custom)
}

impl QueryValue for bool {
    fn from_query(text: &str) -> Result<Self, String> {
        match text {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("must be true or false (got '{other}')")),
        }
    }
}

impl QueryValue for String {
    /// Any text but the empty one (an empty filter is a mistake, not "all").
    fn from_query(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            Err("must not be empty".into())
        } else {
            Ok(text.to_owned())
        }
    }
}

/// An integer from `LOW` to `HIGH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Between<const LOW: u64, const HIGH: u64>(pub u64);

impl<const LOW: u64, const HIGH: u64> QueryValue for Between<LOW, HIGH> {
    fn from_query(text: &str) -> Result<Self, String> {
        match text.parse::<u64>() {
            Ok(n) if (LOW..=HIGH).contains(&n) => Ok(Self(n)),
            _ if HIGH == u64::MAX => Err(format!("must be an integer of at least {LOW} (got '{text}')")),
            _ => Err(format!("must be an integer from {LOW} to {HIGH} (got '{text}')")),
        }
    }
}

impl<const LOW: u64, const HIGH: u64> PartialSchema for Between<LOW, HIGH> {
    fn schema() -> RefOr<Schema> {
        let integer = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(LOW as f64));
        let integer = if HIGH == u64::MAX {
            integer
        } else {
            integer.maximum(Some(HIGH as f64))
        };
        integer.into()
    }
}

impl<const LOW: u64, const HIGH: u64> ToSchema for Between<LOW, HIGH> {}

/// A time in RFC 3339, as milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time(pub i64);

impl QueryValue for Time {
    fn from_query(text: &str) -> Result<Self, String> {
        gantry_billing::history::parse_rfc3339(text)
            .map(Self)
            .ok_or_else(|| format!("must be an RFC 3339 date-time such as 2026-06-01T00:00:00Z (got '{text}')"))
    }
}

impl PartialSchema for Time {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .into()
    }
}

impl ToSchema for Time {}

/// One value read by its wire name (an enum's serde name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct One<T>(pub T);

impl<T: DeserializeOwned> QueryValue for One<T> {
    fn from_query(text: &str) -> Result<Self, String> {
        let value = serde_json::Value::String(text.to_owned());
        serde_json::from_value(value.clone())
            .map(Self)
            .map_err(|e| crate::body::describe(&e.to_string(), Some(&value)))
    }
}

/// The value's own schema (an enum's names). utoipa shows a generic type's
/// schema through this (hidden) trait, which gives `PartialSchema` too.
impl<T: ToSchema> utoipa::__dev::ComposeSchema for One<T> {
    fn compose(_: Vec<RefOr<Schema>>) -> RefOr<Schema> {
        T::schema()
    }
}

impl<T: ToSchema> ToSchema for One<T> {}

/// A comma-separated list of at least one value, each read by its wire name
/// (an enum's serde name); every unknown value is its own failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T> Default for List<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: DeserializeOwned> QueryValue for List<T> {
    fn from_query(text: &str) -> Result<Self, String> {
        let mut values = Vec::new();
        let mut problems = Vec::new();
        for item in text.split(',').map(str::trim).filter(|v| !v.is_empty()) {
            match serde_json::from_value(serde_json::Value::String(item.to_owned())) {
                Ok(parsed) => values.push(parsed),
                Err(_) => problems.push(format!("unknown value '{item}'")),
            }
        }
        if values.is_empty() && problems.is_empty() {
            problems.push("must name at least one value".into());
        }
        if problems.is_empty() {
            Ok(Self(values))
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// A list is documented as one of its values (an enum's names), which is
/// what a client that sends one sends; the parameter's description says that
/// several may be given, comma-separated. (A pattern would state the list,
/// but not the spaces and empty items the parser forgives.)
impl<T: ToSchema> utoipa::__dev::ComposeSchema for List<T> {
    fn compose(_: Vec<RefOr<Schema>>) -> RefOr<Schema> {
        T::schema()
    }
}

impl<T: ToSchema> ToSchema for List<T> {}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use utoipa::{IntoParams, ToSchema};

    use super::{Between, List, One, RequestQuery, Time, parse_query_str};
    use crate::problem::ApiError;

    #[derive(Debug, Deserialize, ToSchema, PartialEq, Eq)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    enum Color {
        Red,
        Green,
    }

    #[derive(Debug, Deserialize, IntoParams)]
    #[serde(rename_all = "camelCase")]
    #[into_params(parameter_in = Query)]
    struct Sample {
        #[serde(default, deserialize_with = "super::value")]
        #[param(inline)]
        count: Option<Between<1, 10>>,
        #[serde(default, deserialize_with = "super::value")]
        #[param(inline)]
        colors: Option<List<Color>>,
        #[serde(default, deserialize_with = "super::value")]
        #[param(inline)]
        start_time: Option<Time>,
        #[serde(default, deserialize_with = "super::value")]
        on: Option<bool>,
        #[serde(default, deserialize_with = "super::value")]
        #[param(inline)]
        color: Option<One<Color>>,
    }

    impl RequestQuery for Sample {
        type Valid = Self;

        fn combinations(given: &[&str], failures: &mut Vec<String>) {
            if given.contains(&"color") && given.contains(&"colors") {
                failures.push("color: not with colors".into());
            }
        }

        fn validate(self, failures: &mut Vec<String>) -> Option<Self> {
            if self.on == Some(true) && self.count.is_none() {
                failures.push("count: required with on=true".into());
                return None;
            }
            Some(self)
        }
    }

    fn errors(query: &str) -> Vec<String> {
        match parse_query_str::<Sample>(query) {
            Err(ApiError::BadRequest { errors, .. }) => errors,
            Err(other) => panic!("not a 400: {other:?}"),
            Ok(valid) => panic!("accepted: {valid:?}"),
        }
    }

    #[test]
    fn a_valid_query_is_read_into_its_types() {
        let parsed =
            parse_query_str::<Sample>("count=3&colors=RED,%20GREEN&startTime=2026-01-01T00:00:00Z&on=true").unwrap();
        assert_eq!(parsed.count, Some(Between(3)));
        assert_eq!(parsed.colors, Some(List(vec![Color::Red, Color::Green])));
        assert_eq!(parsed.start_time, Some(Time(1_767_225_600_000)));
        let empty = parse_query_str::<Sample>("").unwrap();
        assert!(empty.count.is_none() && empty.colors.is_none() && empty.on.is_none());
        assert_eq!(
            parse_query_str::<Sample>("color=GREEN").unwrap().color,
            Some(One(Color::Green))
        );
    }

    #[test]
    fn every_failure_is_listed_in_the_order_given() {
        assert_eq!(
            errors("count=0&colors=RED,BLUE,PINK&shade=dark&startTime=yesterday&on=maybe&count=2"),
            [
                "shade: unknown query parameter (supported: count, colors, startTime, on, color)",
                "count: given more than once",
                "count: must be an integer from 1 to 10 (got '0')",
                "colors: unknown value 'BLUE'",
                "colors: unknown value 'PINK'",
                "startTime: must be an RFC 3339 date-time such as 2026-06-01T00:00:00Z (got 'yesterday')",
                "on: must be true or false (got 'maybe')",
            ]
        );
        assert_eq!(errors("colors=,"), ["colors: must name at least one value"]);
        assert_eq!(errors("color=BLUE"), ["color: must be one of RED, GREEN (got 'BLUE')"]);
    }

    #[test]
    fn rules_between_parameters_run_once_each_is_well_formed() {
        assert_eq!(errors("on=true"), ["count: required with on=true"]);
        assert_eq!(errors("on=true&colors=BLUE"), ["colors: unknown value 'BLUE'"]);
        // Which names go together holds whatever the values.
        assert_eq!(
            errors("colors=BLUE&color=RED"),
            ["colors: unknown value 'BLUE'", "color: not with colors"]
        );
    }

    #[test]
    fn the_document_names_what_the_parser_reads() {
        let parameters = Sample::into_params(|| None);
        let names: Vec<&str> = parameters.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["count", "colors", "startTime", "on", "color"]);
        let count = serde_json::to_value(&parameters[0]).unwrap();
        assert_eq!(count["in"], "query");
        assert_eq!(count["schema"]["minimum"], 1);
        assert_eq!(count["schema"]["maximum"], 10);
    }

    /// The served documents show each value type's schema, not a bare type:
    /// a route's parameters say what its parser accepts.
    #[test]
    fn the_served_parameters_carry_their_value_types_schemas() {
        let management = crate::openapi::openapi_json();
        let public = crate::openapi::public_openapi_json();
        let parameter = |doc: &serde_json::Value, path: &str, method: &str, name: &str| {
            doc["paths"][path][method]["parameters"]
                .as_array()
                .and_then(|list| list.iter().find(|p| p["name"] == name && p["in"] == "query"))
                .unwrap_or_else(|| panic!("{path}: no {name}"))["schema"]
                .clone()
        };
        let bucket = parameter(&management, "/v2/billing", "get", "bucketSize");
        assert_eq!(
            bucket["enum"],
            serde_json::json!(["hour", "day", "week", "month", "year"])
        );
        let last_n = parameter(&management, "/v2/billing/pods", "get", "lastN");
        assert_eq!(
            (last_n["minimum"].clone(), last_n["maximum"].clone()),
            (1.into(), 10_000.into())
        );
        assert_eq!(
            parameter(&management, "/v2/billing", "get", "startTime")["format"],
            "date-time"
        );
        let regions = parameter(&management, "/v2/catalog/datacenters", "get", "regions");
        assert!(
            regions["enum"].as_array().is_some_and(|v| v.contains(&"EUROPE".into())),
            "{regions}"
        );
        let codes = parameter(&management, "/v2/catalog/gpus", "get", "countryCodes");
        assert_eq!(codes["pattern"], "^[A-Z]{2}(,[A-Z]{2})*$");
        let tail = parameter(&management, "/v2/pods/{id}/logs", "get", "tail");
        assert_eq!(
            (tail["minimum"].clone(), tail["maximum"].clone()),
            (0.into(), 5_000.into())
        );
        let source = parameter(
            &management,
            "/v2/serverless/{id}/workers/{workerId}/logs",
            "get",
            "source",
        );
        assert_eq!(source["enum"], serde_json::json!(["container", "system", "all"]));
        let wait = parameter(&public, "/v2/{model_id}/runsync", "post", "wait");
        assert_eq!(
            (wait["minimum"].clone(), wait["maximum"].clone()),
            (1_000.into(), 300_000.into())
        );
    }
}
