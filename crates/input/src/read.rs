//! [`read`]: a JSON object into its typed struct, every failure at once.
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

/// One member that is missing, unknown or breaks its type's rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The member's place: object keys and array indexes, outermost first;
    /// empty for the whole object.
    pub path: Vec<String>,
    /// What is wrong, in the schema's words (`must be an integer from 1 to 8
    /// (got 9)`, `unknown property`, `required property is missing`).
    pub problem: String,
}

impl Failure {
    pub fn new(path: &[&str], problem: impl Into<String>) -> Self {
        Self {
            path: path.iter().map(|part| (*part).to_string()).collect(),
            problem: problem.into(),
        }
    }

    /// The place as dotted words (`messages.0.role`); empty for the object.
    pub fn place(&self) -> String {
        self.path.join(".")
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.problem)
        } else {
            write!(f, "{}: {}", self.place(), self.problem)
        }
    }
}

/// The failures as one sentence for a job's error: `place: problem` joined
/// with `; `, as the models have always reported a bad input.
pub fn sentence(failures: &[Failure]) -> String {
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Reads `body` as `T`. The body must be a JSON object; every unknown
/// member, missing required member and member that breaks its type's rule
/// is reported, in that order of discovery, and `T` is returned only when
/// there is none.
///
/// A failure names its place; the offending member is taken out and the rest
/// is read again, so each failure is found once and a wrong member is never
/// also called missing (an object has a handful of members, so the passes
/// are few).
pub fn read<T: DeserializeOwned + ToSchema>(mut body: Value) -> Result<T, Vec<Failure>> {
    if !body.is_object() {
        return Err(vec![Failure {
            path: Vec::new(),
            problem: format!("must be a JSON object, not {}", kind(&body)),
        }]);
    }
    let mut failures = Vec::new();
    // Members taken out after a failure: not missing, only wrong.
    let mut removed: Vec<Vec<String>> = Vec::new();
    loop {
        let err = match serde_path_to_error::deserialize::<_, T>(&body) {
            Ok(parsed) if failures.is_empty() => return Ok(parsed),
            Ok(_) => return Err(failures),
            Err(err) => err,
        };
        let mut path: Vec<String> = err
            .path()
            .iter()
            .filter_map(|segment| match segment {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                _ => None,
            })
            .collect();
        let message = err.into_inner().to_string();
        if message.starts_with("missing field") {
            if path.is_empty() {
                // Serde names the first missing field only: name them all.
                for name in missing_required::<T>(&body) {
                    if !removed.iter().any(|path| path.len() == 1 && path[0] == name) {
                        failures.push(Failure {
                            path: vec![name],
                            problem: "required property is missing".into(),
                        });
                    }
                }
            } else if let Some(name) = backticked(&message).into_iter().next() {
                path.push(name);
                if !removed.contains(&path) {
                    failures.push(Failure {
                        path,
                        problem: "required property is missing".into(),
                    });
                }
            }
            return Err(failures);
        }
        if let Some(name) = backticked(&message)
            .into_iter()
            .next()
            .filter(|_| message.starts_with("unknown field"))
        {
            if path.last() != Some(&name) {
                path.push(name);
            }
            failures.push(Failure {
                path: path.clone(),
                problem: "unknown property".into(),
            });
        } else {
            let problem = describe(&message, member(&body, &path));
            failures.push(Failure {
                path: path.clone(),
                problem,
            });
        }
        match remove(&mut body, &path) {
            Some(gone) => removed.push(gone),
            None => return Err(failures),
        }
    }
}

/// The required properties of `T` that `body` lacks, in the schema's order.
fn missing_required<T: ToSchema>(body: &Value) -> Vec<String> {
    use utoipa::openapi::{RefOr, schema::Schema};
    match T::schema() {
        RefOr::T(Schema::Object(schema)) => schema
            .required
            .into_iter()
            .filter(|name| body.get(name.as_str()).is_none())
            .collect(),
        _ => Vec::new(),
    }
}

/// The words serde quotes in backticks, in order.
fn backticked(message: &str) -> Vec<String> {
    message.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// Serde's wording of a member's failure in the schema's terms; a message of
/// the member's own type (`must be …`) is kept as it is.
pub fn describe(message: &str, value: Option<&Value>) -> String {
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let expected = rest.rsplit_once(", expected ").map_or("another type", |(_, e)| e);
        let got = value.map_or("another type", kind);
        return format!("must be {}, not {got}", plain_type(expected));
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let expected = rest.rsplit_once(", expected ").map_or("another value", |(_, e)| e);
        let got = value.map_or_else(String::new, |v| format!(" (got {v})"));
        return format!("must be {}{got}", plain_type(expected));
    }
    if message.starts_with("unknown variant") {
        let words = backticked(message);
        if let Some((got, allowed)) = words.split_first() {
            return format!("must be one of {} (got '{got}')", allowed.join(", "));
        }
    }
    message.to_string()
}

/// Serde's name of an expected type as a schema says it.
fn plain_type(expected: &str) -> &str {
    match expected {
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "u8" => "an integer from 0 to 255",
        "u16" => "an integer from 0 to 65535",
        "u32" => "an integer from 0 to 4294967295",
        "u64" | "usize" => "an integer from 0 to 18446744073709551615",
        "f32" | "f64" => "a number",
        "a map" => "a JSON object",
        "a sequence" => "an array",
        // An enum of names (serde also takes a one-member map for a variant).
        "string or map" => "a string",
        other if other.starts_with("struct ") => "a JSON object",
        other => other,
    }
}

/// The member of `body` at `path`.
fn member<'a>(body: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(body, |value, key| match value {
        Value::Object(object) => object.get(key),
        Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// Takes the member at `path` out of `body` and says which place went: a
/// failure inside an array takes the whole array with it (taking out one
/// entry would move the later ones, and an entry's member taken out would
/// then be missing); `None` when there is nothing to take.
fn remove(body: &mut Value, path: &[String]) -> Option<Vec<String>> {
    let mut place = path.to_vec();
    let mut value = &*body;
    for (depth, key) in path.iter().enumerate() {
        match value {
            Value::Object(object) => value = object.get(key)?,
            Value::Array(_) => {
                place.truncate(depth);
                break;
            }
            _ => return None,
        }
    }
    let (last, parents) = place.split_last()?;
    let parent = parents
        .iter()
        .try_fold(&mut *body, |value, key| value.get_mut(key.as_str()))?;
    parent.as_object_mut()?.remove(last)?;
    Some(place)
}

/// For an optional member that may be absent but not `null`:
/// `#[serde(default, deserialize_with = "present")]`.
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// [`present`] for a nested struct: only a JSON object, never an array read
/// field by field in declaration order (which serde's derived structs accept).
pub fn present_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct Object<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(Object(std::marker::PhantomData)).map(Some)
}

/// A JSON value's kind, as a failure names what it got.
pub fn kind(value: &Value) -> &'static str {
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
