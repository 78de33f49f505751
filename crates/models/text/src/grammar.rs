//! JSON Schema to GBNF, the grammar language of llama.cpp's grammar sampler.
//!
//! A schema becomes a set of GBNF rules whose language is JSON text that
//! parses and validates against the schema. The sampler masks every token
//! that would leave that language, so a generation that ends (rather than
//! running into `max_tokens`) is such a text.
//!
//! What is enforced:
//!
//! * `type` (one or a list): `object`, `array`, `string`, `number`,
//!   `integer`, `boolean`, `null`; no `type` and no other constraint: any
//!   JSON value;
//! * `properties` with `required` (properties are written in the order the
//!   schema lists them; optional ones may be left out; no other property is
//!   ever written, which satisfies any `additionalProperties`); an object
//!   without `properties`: any members, of the `additionalProperties` schema
//!   when it is one;
//! * `items`, `prefixItems`, `minItems`, `maxItems`;
//! * `minLength`, `maxLength`, `format` `date`, `time`, `date-time` and
//!   `uuid` (other formats are annotations and are not enforced);
//! * `minimum`/`maximum` (and the exclusive forms) for integers whose range
//!   has at most 256 values or that are only bounded below by a number
//!   from -1 up; for numbers, a lower bound of 0 or above and no upper bound;
//! * `enum`, `const`, `anyOf`, `oneOf` (as `anyOf`: a value matching more
//!   than one branch is possible when branches overlap), `allOf` of one
//!   schema, `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion
//!   included), `nullable: true`.
//!
//! Keywords that only annotate (`title`, `description`, `default`,
//! `examples`, ...) are ignored. A keyword that constrains values in a way
//! this converter does not enforce (`pattern`, `not`, `if`, `multipleOf`,
//! `uniqueItems: true`, ...) is an error naming its place in the schema,
//! rather than a grammar that could produce a non-matching value.
//!
//! Whitespace between tokens is bounded (nothing, a space, or a newline and
//! up to 16 spaces or tabs), and numbers have at most 16 digits before and
//! after the point, so a small model cannot loop forever on blanks or digits.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Deepest nesting of schemas followed (against stack exhaustion).
const MAX_DEPTH: usize = 64;
/// Largest grammar produced, in bytes.
const MAX_GRAMMAR_BYTES: usize = 512 * 1024;
/// Widest integer range written out value by value.
const MAX_ENUMERATED_RANGE: i64 = 256;
/// Largest `minLength`, `maxLength`, `minItems`, `maxItems` accepted.
const MAX_REPEAT: u64 = 4096;

/// Why a schema cannot become a grammar: where (a JSON pointer into the
/// schema) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub at: String,
    pub reason: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.at.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "at {}: {}", self.at, self.reason)
        }
    }
}

/// The shared rules every grammar may use, by name.
const PRIMITIVES: &[(&str, &str)] = &[
    ("ws", r#"| " " | "\n" [ \t]{0,16}"#),
    ("char", r#"[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex-char )"#),
    // \u escapes that are not surrogates: strict JSON parsers refuse a lone one.
    (
        "hex-char",
        "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}",
    ),
    ("string", r#""\"" char* "\"""#),
    ("digits", "[0-9]{1,16}"),
    ("natural", r#""0" | [1-9] [0-9]{0,15}"#),
    ("integer", r#""-"? natural"#),
    ("fraction", r#""." digits"#),
    ("exponent", r#"[eE] [+-]? [0-9]{1,3}"#),
    ("number", "integer fraction? exponent?"),
    ("unsigned-number", "natural fraction? exponent?"),
    ("boolean", r#""true" | "false""#),
    ("null", r#""null""#),
    ("value", "object | array | string | number | boolean | null"),
    (
        "object",
        r#""{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}""#,
    ),
    ("array", r#""[" ws ( value ws ( "," ws value ws )* )? "]""#),
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )"#,
    ),
    (
        "time",
        r#"( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
    ),
    ("date-time", r#"date "T" time"#),
    (
        "uuid",
        r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#,
    ),
];

/// Rules a primitive needs besides itself.
fn primitive_needs(name: &str) -> &'static [&'static str] {
    match name {
        "char" => &["hex-char"],
        "string" => &["char"],
        "natural" => &[],
        "integer" => &["natural"],
        "fraction" => &["digits"],
        "number" => &["integer", "fraction", "exponent"],
        "unsigned-number" => &["natural", "fraction", "exponent"],
        "value" => &["object", "array", "string", "number", "boolean", "null"],
        "object" => &["ws", "string", "value"],
        "array" => &["ws", "value"],
        "date-time" => &["date", "time"],
        _ => &[],
    }
}

/// Annotations and keywords that need nothing enforced.
const IGNORED: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "example",
    "$schema",
    "$id",
    "$comment",
    "$anchor",
    "deprecated",
    "readOnly",
    "writeOnly",
    "discriminator",
    "format",
    "contentEncoding",
    "contentMediaType",
    "strict",
    "$defs",
    "definitions",
    // Only declared properties are ever written, so extra ones never appear.
    "additionalProperties",
    "unevaluatedProperties",
];

/// Keywords the converter reads.
const HANDLED: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "nullable",
];

/// The GBNF grammar (root rule `root`) of JSON texts matching `schema`.
pub fn schema_to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    let mut converter = Converter::new(schema);
    let root = converter.visit(schema, "", "root", 0)?;
    converter.finish(&root)
}

/// The GBNF grammar of any JSON object (`response_format: json_object`).
pub fn any_object_gbnf() -> String {
    let mut converter = Converter::new(&Value::Null);
    converter.need("object");
    converter.finish("object").unwrap_or_else(|_| unreachable_grammar())
}

fn unreachable_grammar() -> String {
    String::from("root ::= \"{}\"\n")
}

/// A GBNF string literal for `text`.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A builder of rules for one grammar; [`crate::tools`] uses it to wrap
/// argument schemas in a tool call's layout.
pub struct Converter<'s> {
    root: &'s Value,
    /// Rules in the order they were made: name -> body.
    rules: BTreeMap<String, String>,
    order: Vec<String>,
    /// `$ref` targets already given a rule.
    refs: HashMap<String, String>,
    /// Primitive rules needed.
    primitives: Vec<&'static str>,
}

impl<'s> Converter<'s> {
    /// A converter resolving `$ref`s against `root`.
    pub fn new(root: &'s Value) -> Self {
        Self {
            root,
            rules: BTreeMap::new(),
            order: Vec::new(),
            refs: HashMap::new(),
            primitives: Vec::new(),
        }
    }

    /// Resolves `$ref`s against `root` from now on.
    pub fn set_root(&mut self, root: &'s Value) {
        self.root = root;
        self.refs.clear();
    }

    /// Adds a rule for the values of `schema` (reached at `at`, a JSON pointer)
    /// and returns its name, derived from `hint`.
    pub fn schema_rule(&mut self, schema: &Value, at: &str, hint: &str) -> Result<String, SchemaError> {
        self.rule_at(schema, at, hint, 0)
    }

    fn rule_at(&mut self, schema: &Value, at: &str, hint: &str, depth: usize) -> Result<String, SchemaError> {
        let body = self.visit(schema, at, hint, depth)?;
        Ok(self.add_rule(hint, body))
    }

    /// Adds a rule `hint ::= body` (with a fresh name) and returns its name.
    pub fn add_rule(&mut self, hint: &str, body: String) -> String {
        let base = sanitize(hint);
        let mut name = base.clone();
        let mut n = 1;
        while self.rules.contains_key(&name) || PRIMITIVES.iter().any(|(p, _)| *p == name) || name == "root" {
            n += 1;
            name = format!("{base}-{n}");
        }
        self.rules.insert(name.clone(), body);
        self.order.push(name.clone());
        name
    }

    /// Makes sure primitive rule `name` is part of the grammar.
    pub fn need(&mut self, name: &str) {
        let Some(&(found, _)) = PRIMITIVES.iter().find(|(p, _)| *p == name) else {
            return;
        };
        if self.primitives.contains(&found) {
            return;
        }
        self.primitives.push(found);
        for dep in primitive_needs(found) {
            self.need(dep);
        }
    }

    /// The whole grammar, with `root ::= root_body`.
    pub fn finish(self, root_body: &str) -> Result<String, SchemaError> {
        let mut out = format!("root ::= {root_body}\n");
        for name in &self.order {
            let _ = writeln!(out, "{name} ::= {}", self.rules[name]);
        }
        for (name, body) in PRIMITIVES {
            if self.primitives.contains(name) {
                let _ = writeln!(out, "{name} ::= {body}");
            }
        }
        if out.len() > MAX_GRAMMAR_BYTES {
            return Err(SchemaError {
                at: String::new(),
                reason: format!(
                    "the schema makes a grammar of {} bytes, more than the {MAX_GRAMMAR_BYTES} allowed",
                    out.len()
                ),
            });
        }
        Ok(out)
    }

    /// The body of a rule for `schema`.
    fn visit(&mut self, schema: &Value, at: &str, hint: &str, depth: usize) -> Result<String, SchemaError> {
        let error = |reason: String| SchemaError {
            at: if at.is_empty() { "/".into() } else { at.into() },
            reason,
        };
        if depth > MAX_DEPTH {
            return Err(error(format!("the schema nests deeper than {MAX_DEPTH} levels")));
        }
        let object = match schema {
            Value::Bool(true) => {
                self.need("value");
                return Ok("value".into());
            }
            Value::Bool(false) => return Err(error("the schema `false` matches no value".into())),
            Value::Object(object) => object,
            other => return Err(error(format!("a schema must be an object or a boolean, not {other}"))),
        };
        for key in object.keys() {
            if !IGNORED.contains(&key.as_str()) && !HANDLED.contains(&key.as_str()) {
                return Err(error(format!(
                    "the keyword `{key}` is not supported in structured output"
                )));
            }
        }
        if object.get("nullable") == Some(&Value::Bool(true)) {
            let mut rest = object.clone();
            rest.remove("nullable");
            let inner = self.visit(&Value::Object(rest), at, hint, depth + 1)?;
            self.need("null");
            return Ok(format!("( {inner} ) | null"));
        }
        if let Some(reference) = object.get("$ref") {
            let Some(reference) = reference.as_str() else {
                return Err(error("`$ref` must be a string".into()));
            };
            if object.keys().any(|k| HANDLED.contains(&k.as_str()) && k != "$ref") {
                return Err(error("`$ref` next to other constraints is not supported".into()));
            }
            return self.reference(reference, at, depth);
        }
        if let Some(value) = object.get("const") {
            return Ok(json_literal(value));
        }
        if let Some(values) = object.get("enum") {
            let Some(values) = values.as_array().filter(|v| !v.is_empty()) else {
                return Err(error("`enum` must be a non-empty array".into()));
            };
            let alternatives: Vec<String> = values.iter().map(json_literal).collect();
            return Ok(alternatives.join(" | "));
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(branches) = object.get(keyword) {
                let Some(branches) = branches.as_array().filter(|b| !b.is_empty()) else {
                    return Err(error(format!("`{keyword}` must be a non-empty array")));
                };
                let mut alternatives = Vec::with_capacity(branches.len());
                for (i, branch) in branches.iter().enumerate() {
                    let branch = merge_siblings(object, branch, keyword);
                    let body = self.visit(&branch, &format!("{at}/{keyword}/{i}"), hint, depth + 1)?;
                    alternatives.push(self.add_rule(&format!("{hint}-{i}"), body));
                }
                return Ok(alternatives.join(" | "));
            }
        }
        if let Some(all) = object.get("allOf") {
            match all.as_array().map(Vec::as_slice) {
                Some([only]) => {
                    let branch = merge_siblings(object, only, "allOf");
                    return self.visit(&branch, &format!("{at}/allOf/0"), hint, depth + 1);
                }
                _ => return Err(error("`allOf` is supported with exactly one schema".into())),
            }
        }
        let types: Vec<&str> = match object.get("type") {
            None => Vec::new(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) if !list.is_empty() => {
                let mut types = Vec::with_capacity(list.len());
                for t in list {
                    match t.as_str() {
                        Some(t) => types.push(t),
                        None => return Err(error("`type` must be a string or a list of strings".into())),
                    }
                }
                types
            }
            Some(_) => return Err(error("`type` must be a string or a non-empty list of strings".into())),
        };
        let types = if types.is_empty() {
            // Typeless: what the other keywords imply, or any value.
            if object.contains_key("properties") {
                vec!["object"]
            } else if object.contains_key("items") || object.contains_key("prefixItems") {
                vec!["array"]
            } else {
                self.need("value");
                return Ok("value".into());
            }
        } else {
            types
        };
        let mut alternatives = Vec::with_capacity(types.len());
        for kind in types {
            let body = match kind {
                "object" => self.object(object, at, hint, depth)?,
                "array" => self.array(object, at, hint, depth)?,
                "string" => self.string(object, at)?,
                "integer" => self.integer(object, at)?,
                "number" => self.number(object, at)?,
                "boolean" => {
                    self.need("boolean");
                    "boolean".into()
                }
                "null" => {
                    self.need("null");
                    "null".into()
                }
                other => return Err(error(format!("unknown type `{other}`"))),
            };
            alternatives.push(body);
        }
        Ok(if alternatives.len() == 1 {
            alternatives.remove(0)
        } else {
            alternatives
                .iter()
                .map(|a| format!("( {a} )"))
                .collect::<Vec<_>>()
                .join(" | ")
        })
    }

    fn reference(&mut self, reference: &str, at: &str, depth: usize) -> Result<String, SchemaError> {
        if let Some(name) = self.refs.get(reference) {
            return Ok(name.clone());
        }
        let error = |reason: String| SchemaError { at: at.into(), reason };
        let target = if reference == "#" {
            Some(self.root)
        } else if let Some(pointer) = reference.strip_prefix('#') {
            self.root.pointer(pointer)
        } else {
            return Err(error(format!(
                "`$ref` {reference:?}: only references inside the schema (`#/$defs/...`) are supported"
            )));
        };
        let Some(target) = target else {
            return Err(error(format!("`$ref` {reference:?} points to nothing")));
        };
        let hint = reference
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty() && *s != "#")
            .unwrap_or("ref");
        // Named before it is visited, so that recursion ends at the name.
        let name = self.add_rule(hint, String::new());
        self.refs.insert(reference.to_owned(), name.clone());
        let body = self.visit(target, reference, &name, depth + 1)?;
        self.rules.insert(name.clone(), body);
        Ok(name)
    }

    fn object(
        &mut self,
        object: &Map<String, Value>,
        at: &str,
        hint: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let error = |reason: String| SchemaError { at: at.into(), reason };
        let required: Vec<&str> = match object.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(error("`required` must be an array of names".into())),
        };
        let properties = match object.get("properties") {
            None => None,
            Some(Value::Object(properties)) => Some(properties),
            Some(_) => return Err(error("`properties` must be an object".into())),
        };
        let Some(properties) = properties.filter(|p| !p.is_empty()) else {
            if let Some(name) = required.first() {
                return Err(error(format!(
                    "`required` names `{name}`, which `properties` does not describe"
                )));
            }
            // Free-form members, of the `additionalProperties` schema if given.
            return match object.get("additionalProperties") {
                Some(schema @ Value::Object(_)) => {
                    let value = self.rule_at(
                        schema,
                        &format!("{at}/additionalProperties"),
                        &format!("{hint}-value"),
                        depth + 1,
                    )?;
                    self.need("ws");
                    self.need("string");
                    Ok(format!(
                        r#""{{" ws ( string ws ":" ws {value} ws ( "," ws string ws ":" ws {value} ws )* )? "}}""#
                    ))
                }
                Some(Value::Bool(false)) => Ok(r#""{" ws "}""#.to_owned()).inspect(|_| self.need("ws")),
                _ => {
                    self.need("object");
                    Ok("object".into())
                }
            };
        };
        for name in &required {
            if !properties.contains_key(*name) {
                return Err(error(format!(
                    "`required` names `{name}`, which `properties` does not describe"
                )));
            }
        }
        self.need("ws");
        // One rule per member: `"name" ws ":" ws value`.
        let mut members = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let value = self.rule_at(
                schema,
                &format!("{at}/properties/{}", pointer_escape(name)),
                &format!("{hint}-{name}"),
                depth + 1,
            )?;
            let key = literal(&serde_json::to_string(name).unwrap_or_default());
            let member = self.add_rule(&format!("{hint}-{name}-kv"), format!(r#"{key} ws ":" ws {value}"#));
            members.push((member, required.contains(&name.as_str())));
        }
        // tail(i, after_first): members i.. in order, each optional one
        // possibly left out, with commas only between written members.
        let mut tails: Vec<[Option<String>; 2]> = vec![[None, None]; members.len() + 1];
        let empty = String::from(r#""""#);
        tails[members.len()] = [Some(empty.clone()), Some(empty.clone())];
        for i in (0..members.len()).rev() {
            for after_first in [false, true] {
                let (member, required) = &members[i];
                let next = tails[i + 1][1].clone().unwrap_or_else(|| empty.clone());
                let comma = if after_first { r#""," ws "# } else { "" };
                let written = format!("{comma}{member} ws {next}");
                let body = if *required {
                    written
                } else {
                    let skipped = tails[i + 1][usize::from(after_first)]
                        .clone()
                        .unwrap_or_else(|| empty.clone());
                    format!("( {written} ) | {skipped}")
                };
                let name = self.add_rule(&format!("{hint}-rest-{i}-{}", u8::from(after_first)), body);
                tails[i][usize::from(after_first)] = Some(name);
            }
        }
        let first = tails[0][0].clone().unwrap_or(empty);
        Ok(format!(r#""{{" ws {first} "}}""#))
    }

    fn array(
        &mut self,
        object: &Map<String, Value>,
        at: &str,
        hint: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let error = |reason: String| SchemaError { at: at.into(), reason };
        let min = bound(object, "minItems", at)?.unwrap_or(0);
        let max = bound(object, "maxItems", at)?;
        if max.is_some_and(|max| max < min) {
            return Err(error("`maxItems` is below `minItems`".into()));
        }
        self.need("ws");
        let prefix: Vec<&Value> = match object.get("prefixItems") {
            None => Vec::new(),
            Some(Value::Array(items)) => items.iter().collect(),
            Some(_) => return Err(error("`prefixItems` must be an array of schemas".into())),
        };
        let mut prefix_rules = Vec::with_capacity(prefix.len());
        for (i, item) in prefix.iter().enumerate() {
            prefix_rules.push(self.rule_at(
                item,
                &format!("{at}/prefixItems/{i}"),
                &format!("{hint}-{i}"),
                depth + 1,
            )?);
        }
        let rest = match object.get("items") {
            None | Some(Value::Bool(true)) => {
                self.need("value");
                Some("value".to_owned())
            }
            Some(Value::Bool(false)) => None,
            Some(schema) => Some(self.rule_at(schema, &format!("{at}/items"), &format!("{hint}-item"), depth + 1)?),
        };
        if !prefix_rules.is_empty() {
            // A tuple: the prefix items, each required up to `minItems`.
            let n = prefix_rules.len() as u64;
            if rest.is_some() && max.is_none_or(|max| max > n) {
                return Err(error(
                    "`prefixItems` followed by more items is not supported; set `items: false`".into(),
                ));
            }
            let upto = max.map_or(n, |max| max.min(n));
            if min > upto {
                return Err(error("`minItems` is more than the tuple allows".into()));
            }
            let mut body = String::from(r#""""#);
            for i in (0..upto as usize).rev() {
                let comma = if i == 0 { "" } else { r#""," ws "# };
                let written = format!("{comma}{} ws {body}", prefix_rules[i]);
                body = if (i as u64) < min {
                    written
                } else {
                    format!("( {written} )?")
                };
            }
            return Ok(format!(r#""[" ws {body} "]""#));
        }
        let Some(item) = rest else {
            if min > 0 {
                return Err(error("`items: false` with `minItems` above 0 matches nothing".into()));
            }
            return Ok(r#""[" ws "]""#.into());
        };
        let more = format!(r#""," ws {item} ws"#);
        let repeated = |low: u64, high: Option<u64>| match high {
            Some(0) => String::new(),
            Some(high) if low == high => format!(" ( {more} ){{{low}}}"),
            Some(high) => format!(" ( {more} ){{{low},{high}}}"),
            None if low == 0 => format!(" ( {more} )*"),
            None => format!(" ( {more} ){{{low},}}"),
        };
        let body = match (min, max) {
            (_, Some(0)) => String::from(r#""""#),
            (0, max) => format!("( {item} ws{} )?", repeated(0, max.map(|m| m - 1))),
            (min, max) => format!("{item} ws{}", repeated(min - 1, max.map(|m| m - 1))),
        };
        Ok(format!(r#""[" ws {body} "]""#))
    }

    fn string(&mut self, object: &Map<String, Value>, at: &str) -> Result<String, SchemaError> {
        let min = bound(object, "minLength", at)?.unwrap_or(0);
        let max = bound(object, "maxLength", at)?;
        if max.is_some_and(|max| max < min) {
            return Err(SchemaError {
                at: at.into(),
                reason: "`maxLength` is below `minLength`".into(),
            });
        }
        let format = object.get("format").and_then(Value::as_str);
        if let Some(format @ ("date" | "time" | "date-time" | "uuid")) = format {
            self.need(format);
            return Ok(format!(r#""\"" {format} "\"""#));
        }
        if min == 0 && max.is_none() {
            self.need("string");
            return Ok("string".into());
        }
        self.need("char");
        let repeat = match max {
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(format!(r#""\"" char{repeat} "\"""#))
    }

    fn integer(&mut self, object: &Map<String, Value>, at: &str) -> Result<String, SchemaError> {
        let (low, high) = integer_bounds(object, at)?;
        match (low, high) {
            (None, None) => {
                self.need("integer");
                Ok("integer".into())
            }
            (Some(low), Some(high)) if high < low => Err(SchemaError {
                at: at.into(),
                reason: "the integer range is empty".into(),
            }),
            (Some(low), Some(high)) if high - low < MAX_ENUMERATED_RANGE => {
                let values: Vec<String> = (low..=high).map(|v| literal(&v.to_string())).collect();
                Ok(values.join(" | "))
            }
            (Some(low), None) if low >= 0 => {
                self.need("natural");
                if low == 0 {
                    return Ok("natural".into());
                }
                // The values from `low` up to the last one of its number of
                // digits one by one, then any number with more digits.
                let digits = low.to_string().len();
                let last = 10i64.pow(digits as u32) - 1;
                if last - low >= 4 * MAX_ENUMERATED_RANGE {
                    return Err(SchemaError {
                        at: at.into(),
                        reason: format!("an integer `minimum` of {low} without a close `maximum` is not supported"),
                    });
                }
                let values: Vec<String> = (low..=last).map(|v| literal(&v.to_string())).collect();
                Ok(format!("{} | [1-9] [0-9]{{{digits},15}}", values.join(" | ")))
            }
            _ => Err(SchemaError {
                at: at.into(),
                reason: format!(
                    "integer bounds are supported as a range of at most {MAX_ENUMERATED_RANGE} values, or a lower bound from -1 up"
                ),
            }),
        }
    }

    fn number(&mut self, object: &Map<String, Value>, at: &str) -> Result<String, SchemaError> {
        let number = |key: &str| object.get(key).and_then(Value::as_f64);
        let unbounded_above = number("maximum").is_none() && number("exclusiveMaximum").is_none();
        match (number("minimum"), number("exclusiveMinimum")) {
            (None, None) if unbounded_above => {
                self.need("number");
                Ok("number".into())
            }
            (Some(low), None) if low == 0.0 && unbounded_above => {
                self.need("unsigned-number");
                Ok("unsigned-number".into())
            }
            (Some(low), None) if low > 0.0 && unbounded_above => Err(SchemaError {
                at: at.into(),
                reason: "a number `minimum` above 0 is not supported (0 is)".into(),
            }),
            _ => Err(SchemaError {
                at: at.into(),
                reason: "bounds on a `number` are supported only as `minimum: 0` (use an integer range, or none)"
                    .into(),
            }),
        }
    }
}

/// The integer bounds of `object`, inclusive.
fn integer_bounds(object: &Map<String, Value>, at: &str) -> Result<(Option<i64>, Option<i64>), SchemaError> {
    let read = |key: &str| -> Result<Option<f64>, SchemaError> {
        match object.get(key) {
            None => Ok(None),
            Some(value) => value.as_f64().map(Some).ok_or_else(|| SchemaError {
                at: at.into(),
                reason: format!("`{key}` must be a number"),
            }),
        }
    };
    let limit = 1e15;
    let clamp = |v: f64| v.clamp(-limit, limit);
    let mut low = read("minimum")?.map(|v| clamp(v).ceil() as i64);
    if let Some(v) = read("exclusiveMinimum")? {
        let v = clamp(v).floor() as i64 + 1;
        low = Some(low.map_or(v, |l| l.max(v)));
    }
    let mut high = read("maximum")?.map(|v| clamp(v).floor() as i64);
    if let Some(v) = read("exclusiveMaximum")? {
        let v = clamp(v).ceil() as i64 - 1;
        high = Some(high.map_or(v, |h| h.min(v)));
    }
    Ok((low, high))
}

/// A non-negative integer keyword (`minItems`, ...).
fn bound(object: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>, SchemaError> {
    match object.get(key) {
        None => Ok(None),
        Some(value) => match value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }) {
            Some(n) if n <= MAX_REPEAT => Ok(Some(n)),
            Some(_) => Err(SchemaError {
                at: at.into(),
                reason: format!("`{key}` above {MAX_REPEAT} is not supported"),
            }),
            None => Err(SchemaError {
                at: at.into(),
                reason: format!("`{key}` must be a non-negative integer"),
            }),
        },
    }
}

/// The branch of an `anyOf`/`oneOf`/`allOf` with its parent's other
/// constraints (a `type` next to `anyOf`, say) folded in; the branch's own
/// keywords win.
fn merge_siblings(parent: &Map<String, Value>, branch: &Value, keyword: &str) -> Value {
    let Value::Object(branch) = branch else {
        return branch.clone();
    };
    let mut merged = branch.clone();
    for (key, value) in parent {
        if key == keyword || IGNORED.contains(&key.as_str()) || key == "nullable" {
            continue;
        }
        // `$ref` branches stand alone: their target carries the constraints.
        if merged.contains_key("$ref") {
            break;
        }
        merged.entry(key.clone()).or_insert_with(|| value.clone());
    }
    Value::Object(merged)
}

/// The GBNF literal of a JSON value, compactly written.
fn json_literal(value: &Value) -> String {
    literal(&serde_json::to_string(value).unwrap_or_default())
}

/// A rule name: letters, digits and dashes.
fn sanitize(hint: &str) -> String {
    let mut name: String = hint
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    name.truncate(48);
    let trimmed = name.trim_matches('-');
    if trimmed.is_empty() {
        "rule".into()
    } else {
        trimmed.to_owned()
    }
}

fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn literals_escape_what_gbnf_needs() {
        assert_eq!(literal(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(literal("x\ny\u{1}"), r#""x\ny\x01""#);
        assert_eq!(json_literal(&json!("hi")), r#""\"hi\"""#);
    }

    #[test]
    fn object_members_are_in_order_with_optional_ones() {
        let grammar = schema_to_gbnf(&json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"]
        }))
        .unwrap();
        assert!(grammar.starts_with("root ::= \"{\" ws "), "{grammar}");
        assert!(grammar.contains(r#""\"a\"" ws ":" ws"#), "{grammar}");
    }

    #[test]
    fn unsupported_keywords_are_named_with_their_place() {
        let error = schema_to_gbnf(&json!({
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}
        }))
        .unwrap_err();
        assert_eq!(error.at, "/properties/code");
        assert!(error.reason.contains("`pattern`"), "{error}");
        for (schema, needle) in [
            (json!({"type": "objekt"}), "unknown type"),
            (json!({"$ref": "http://example.com/s.json"}), "only references inside"),
            (json!({"$ref": "#/$defs/Missing"}), "points to nothing"),
            (json!({"type": "number", "maximum": 3.5}), "bounds on a `number`"),
            (
                json!({"type": "integer", "minimum": 0, "maximum": 100000}),
                "integer bounds",
            ),
            (json!({"allOf": [{}, {}]}), "`allOf`"),
            (json!({"type": "array", "minItems": 3, "maxItems": 1}), "`maxItems`"),
            (json!({"not": {}}), "`not`"),
            (json!(false), "matches no value"),
            (json!(3), "must be an object"),
        ] {
            let error = schema_to_gbnf(&schema).unwrap_err();
            assert!(error.to_string().contains(needle), "{schema}: {error}");
        }
    }

    #[test]
    fn deep_recursion_is_refused_not_overflowed() {
        let mut schema = json!({"type": "string"});
        for _ in 0..200 {
            schema = json!({"type": "array", "items": schema});
        }
        let error = schema_to_gbnf(&schema).unwrap_err();
        assert!(error.reason.contains("deeper"), "{error}");
    }
}
