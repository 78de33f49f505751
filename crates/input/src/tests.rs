use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::{AtLeast, Between, Chars, Failure, Items, Real, read, schema_of, sentence};

crate::bounds! {
    Scale: 0.0..=2.0, above_min;
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Sample {
    /// What to draw.
    #[schema(inline)]
    prompt: Chars<10>,
    #[serde(default)]
    #[schema(inline)]
    count: Option<Between<1, 8>>,
    #[serde(default)]
    #[schema(inline)]
    scale: Option<Real<Scale>>,
    #[serde(default)]
    style: Option<Style>,
    #[serde(default)]
    parts: Vec<Part>,
    #[serde(default)]
    tags: Option<Items<Chars<3>, 1, 2>>,
}

#[derive(Debug, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Style {
    Plain,
    Bold,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Part {
    name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Outer {
    /// What the inner object
    /// says, in two lines.
    inner: Inner,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Inner {
    #[schema(inline)]
    size: Between<1, 4>,
}

#[test]
fn a_nested_member_that_breaks_its_rule_is_not_also_called_missing() {
    let outer: Outer = read(json!({"inner": {"size": 2}, "note": "n"})).unwrap();
    assert_eq!((outer.inner.size, outer.note.as_deref()), (Between(2), Some("n")));
    let failures = read::<Outer>(json!({"inner": {"size": 9}})).unwrap_err();
    assert_eq!(
        sentence(&failures),
        "inner.size: must be an integer from 1 to 4 (got 9)"
    );
    let schema = schema_of::<Outer>();
    assert_eq!(schema["properties"]["note"]["type"], json!("string"), "{schema}");
    assert_eq!(
        schema["properties"]["inner"]["description"],
        json!("What the inner object says, in two lines."),
        "{schema}"
    );
}

fn failures(body: Value) -> Vec<String> {
    match read::<Sample>(body) {
        Ok(sample) => panic!("accepted: {sample:?}"),
        Err(failures) => failures.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_well_formed_object_is_read() {
    let sample: Sample =
        read(json!({"prompt": "cat", "count": 3.0, "scale": 0.5, "style": "bold", "parts": [{"name": "a"}]})).unwrap();
    assert_eq!(sample.prompt.as_str(), "cat");
    assert_eq!(sample.count, Some(Between(3)));
    assert_eq!(sample.scale.map(|s| s.0), Some(0.5));
    assert_eq!(sample.style, Some(Style::Bold));
    assert_eq!(sample.parts[0].name, "a");
    let sample: Sample = read(json!({"prompt": "", "count": null, "tags": ["abc"]})).unwrap();
    assert_eq!(sample.tags.unwrap().0[0].as_str(), "abc");
    assert_eq!(sample.count, None);
}

#[test]
fn every_failure_is_reported_once_with_its_place() {
    let mut found = failures(json!({
        "prompt": "much too long a prompt",
        "count": 9,
        "scale": 0,
        "style": "italic",
        "parts": [{"name": "a"}, {"name": 1}],
        "extra": true,
        "tags": ["a", "b", "c"],
    }));
    // In the order the object's members are read, which depends on
    // serde_json's features in the build; each failure is there once.
    found.sort();
    assert_eq!(
        found,
        [
            "count: must be an integer from 1 to 8 (got 9)",
            "extra: unknown property",
            "parts.1.name: must be a string, not a number",
            "prompt: must be a string of at most 10 characters (got 22)",
            "scale: must be a number above 0 and at most 2 (got 0)",
            "style: must be one of plain, bold (got 'italic')",
            "tags: must be an array of 1 to 2 entries (got 3)",
        ]
    );
}

#[test]
fn a_wrong_member_is_not_also_called_missing_and_every_missing_one_is_named() {
    assert_eq!(failures(json!({})), ["prompt: required property is missing"]);
    assert_eq!(
        failures(json!({"prompt": 5})),
        ["prompt: must be a string, not a number"]
    );
    assert_eq!(
        failures(json!({"prompt": "a", "count": -1, "parts": [{}]})),
        [
            "count: must be an integer from 1 to 8 (got -1)",
            "parts.0.name: required property is missing"
        ]
    );
    assert_eq!(failures(json!([1])), ["must be a JSON object, not an array"]);
    assert_eq!(
        sentence(&[Failure::new(&["a"], "x"), Failure::new(&[], "y")]),
        "a: x; y"
    );
}

#[test]
fn the_schema_states_the_rules_the_reader_applies() {
    let schema = schema_of::<Sample>();
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(schema["required"], json!(["prompt"]));
    let properties = &schema["properties"];
    assert_eq!(properties["prompt"]["maxLength"], json!(10));
    assert_eq!(properties["prompt"]["description"], json!("What to draw."));
    assert_eq!(properties["prompt"]["type"], json!("string"));
    // An optional member is described by its absence from `required`: its
    // schema is what it must be when given.
    assert_eq!(properties["count"]["minimum"], json!(1));
    assert_eq!(properties["count"]["maximum"], json!(8));
    assert_eq!(properties["scale"]["exclusiveMinimum"], json!(0));
    assert_eq!(properties["scale"]["maximum"], json!(2));
    assert_eq!(properties["style"]["enum"], json!(["plain", "bold"]));
    // Named types are written in place: the schema stands alone.
    let whole = schema.to_string();
    assert!(!whole.contains("$ref"), "{whole}");
    assert!(!whole.contains("oneOf") && !whole.contains("allOf"), "{whole}");
    assert_eq!(
        properties["tags"],
        json!({"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string", "maxLength": 3}})
    );
    assert_eq!(properties["parts"]["items"]["required"], json!(["name"]), "{whole}");
}

#[derive(Debug, Deserialize, ToSchema)]
struct Steps {
    #[schema(inline)]
    steps: AtLeast<1>,
}

#[test]
fn at_least_has_no_maximum_of_its_own() {
    let steps: Steps = read(json!({"steps": 4000.0})).unwrap();
    assert_eq!(steps.steps, AtLeast(4000));
    let failures = read::<Steps>(json!({"steps": 0})).unwrap_err();
    assert_eq!(sentence(&failures), "steps: must be an integer of at least 1 (got 0)");
    let failures = read::<Steps>(json!({"steps": 1.5})).unwrap_err();
    assert_eq!(sentence(&failures), "steps: must be an integer of at least 1 (got 1.5)");
    let schema = schema_of::<Steps>();
    assert_eq!(schema["properties"]["steps"]["minimum"], json!(1));
    assert!(schema["properties"]["steps"].get("maximum").is_none(), "{schema}");
}

#[test]
fn an_integer_of_the_wrong_type_says_its_range() {
    let failures = read::<Sample>(json!({"prompt": "a", "count": "3"})).unwrap_err();
    assert_eq!(
        sentence(&failures),
        "count: must be an integer from 1 to 8, not a string"
    );
    let failures = read::<Steps>(json!({"steps": true})).unwrap_err();
    assert_eq!(
        sentence(&failures),
        "steps: must be an integer of at least 1, not a boolean"
    );
}
