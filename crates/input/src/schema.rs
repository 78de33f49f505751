//! [`schema_of`]: a type's JSON Schema, whole.
use std::collections::HashMap;

use serde_json::Value;
use utoipa::ToSchema;

/// The JSON Schema of `T` as one document, in the plain form a form builder
/// reads (the console draws its "try it" forms from it):
/// - the schemas of the types it names (`$ref` to `#/components/schemas/…`
///   in an OpenAPI document) are written in place, so it stands alone;
/// - an optional member is described by its absence from `required`: the
///   `null` alternative utoipa gives an `Option` is left out (the readers
///   take `null` as absent all the same);
/// - a member's own words (its description, default) are merged into its
///   type's schema rather than wrapped beside it in an `allOf`, and a
///   description's lines are joined into one (a blank line still parts
///   paragraphs), as a doc comment's line breaks are only its wrapping.
pub fn schema_of<T: ToSchema>() -> Value {
    let mut named = Vec::new();
    T::schemas(&mut named);
    let named: HashMap<String, Value> = named
        .into_iter()
        .map(|(name, schema)| (name, serde_json::to_value(schema).unwrap_or(Value::Null)))
        .collect();
    let mut root = serde_json::to_value(T::schema()).unwrap_or(Value::Null);
    write_in_place(&mut root, &named, 0);
    plain(&mut root);
    root
}

/// Words about a member rather than rules on its value.
const ANNOTATIONS: [&str; 6] = ["description", "default", "example", "examples", "title", "deprecated"];

/// Simplifies the two wrappers utoipa writes (see [`schema_of`]), everywhere.
fn plain(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for member in object.values_mut() {
                plain(member);
            }
            // `type: [T, "null"]`: T; `[T, U, "null"]`: `[T, U]`.
            if let Some(Value::Array(types)) = object.get_mut("type")
                && types.iter().any(|t| t == "null")
            {
                types.retain(|t| t != "null");
                if let [only] = types.as_slice() {
                    let only = only.clone();
                    object.insert("type".into(), only);
                }
            }
            if let Some(Value::String(text)) = object.get_mut("description") {
                *text = text
                    .split("\n\n")
                    .map(|paragraph| paragraph.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            // `oneOf: [X, {type: null}]`: X.
            if let Some(Value::Array(choices)) = object.get("oneOf")
                && choices.len() == 2
                && let Some(other) = choices.iter().position(|c| c == &serde_json::json!({"type": "null"}))
            {
                let Some(Value::Array(mut choices)) = object.remove("oneOf") else {
                    return;
                };
                merge(object, choices.swap_remove(1 - other));
            }
            // `allOf: [X, {description, type: object}]`: X with the words.
            if let Some(Value::Array(parts)) = object.get("allOf")
                && parts.len() == 2
                && let Some(words) = parts.iter().position(|p| {
                    p.as_object().is_some_and(|p| {
                        p.iter()
                            .all(|(key, v)| ANNOTATIONS.contains(&key.as_str()) || (key == "type" && v == "object"))
                    })
                })
            {
                let Some(Value::Array(mut parts)) = object.remove("allOf") else {
                    return;
                };
                let mut words = parts.swap_remove(words);
                if let Some(words) = words.as_object_mut() {
                    words.remove("type");
                }
                let body = parts.remove(0);
                merge(object, body);
                merge(object, words);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(plain),
        _ => {}
    }
}

/// Adds `from`'s members to `into`, keeping those `into` already has.
fn merge(into: &mut serde_json::Map<String, Value>, from: Value) {
    if let Value::Object(from) = from {
        for (key, member) in from {
            into.entry(key).or_insert(member);
        }
    }
}

/// Replaces each `$ref` to a named schema by that schema (its own members
/// beside the `$ref`, such as a description, kept). A type that names itself
/// stops after a few levels with its `$ref` left as it is.
fn write_in_place(value: &mut Value, named: &HashMap<String, Value>, depth: usize) {
    match value {
        Value::Object(object) => {
            let target = object
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .and_then(|name| named.get(name));
            if let Some(target) = target.filter(|_| depth < 8) {
                let mut whole = target.clone();
                for (key, member) in object.iter().filter(|(key, _)| *key != "$ref") {
                    whole[key] = member.clone();
                }
                *value = whole;
                write_in_place(value, named, depth + 1);
                return;
            }
            for member in object.values_mut() {
                write_in_place(member, named, depth);
            }
        }
        Value::Array(items) => {
            for item in items {
                write_in_place(item, named, depth);
            }
        }
        _ => {}
    }
}
