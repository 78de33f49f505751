//! Function calling: how tools are described to the model, the grammar that
//! makes its calls well formed, and the parser that reads them back out of
//! the generated text, as a whole or piece by piece while it streams.
//!
//! A call is written in one fixed layout, which the grammar enforces:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! several calls one after the other, separated by a newline. The tools are
//! listed for the model in the system message, with the layout to use. With
//! `tool_choice` `required` or a named function, the whole answer must be
//! calls (of that function); with `auto`, the grammar is lazy: the answer is
//! free text until the model writes `<tool_call>`, and from there on calls.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value, json};

use crate::grammar::{Converter, SchemaError, literal};

/// What opens a call in the generated text.
pub const OPEN: &str = "<tool_call>\n";
/// What closes one (after the call object's own closing brace).
pub const CLOSE: &str = "\n</tool_call>";

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of the arguments object.
    pub parameters: Value,
}

/// Which calls the answer may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The tools are not offered.
    None,
    /// Text, or calls.
    Auto,
    /// Calls only.
    Required,
    /// Calls of this function only.
    Named(String),
}

/// The tools of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call per answer.
    pub parallel: bool,
}

/// A grammar and, for a lazy one, the pattern that starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grammar {
    pub text: String,
    pub trigger: Option<String>,
}

impl Tools {
    /// Whether the model is told about the tools at all.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The system message text that lists the tools and the layout of a call.
    pub fn system_text(&self) -> String {
        let mut text = String::from(
            "You can call functions to help with the user's request. The functions are \
             listed here, one JSON object per line:\n<tools>\n",
        );
        for tool in self.offered() {
            let mut function = Map::new();
            function.insert("name".into(), json!(tool.name));
            if let Some(description) = &tool.description {
                function.insert("description".into(), json!(description));
            }
            function.insert("parameters".into(), tool.parameters.clone());
            text.push_str(&json!({"type": "function", "function": function}).to_string());
            text.push('\n');
        }
        text.push_str(
            "</tools>\nTo call a function, answer with its name and an arguments object that \
             follows its parameters, inside <tool_call></tool_call> tags, exactly like this:\n\
             <tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>",
        );
        match &self.choice {
            ToolChoice::Required => text.push_str("\nYou must call at least one function."),
            ToolChoice::Named(name) => {
                text.push_str(&format!("\nYou must call the function `{name}`."));
            }
            _ => {}
        }
        text
    }

    fn offered(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(|tool| match &self.choice {
            ToolChoice::Named(name) => &tool.name == name,
            _ => true,
        })
    }

    /// The grammar of the answer; `None` when tools are not offered. The
    /// error names the tool whose parameters cannot become a grammar.
    pub fn grammar(&self) -> Result<Option<Grammar>, SchemaError> {
        if !self.active() {
            return Ok(None);
        }
        let mut calls = Vec::new();
        let placeholder = Value::Null;
        let mut converter = Converter::new(&placeholder);
        for (i, tool) in self.tools.iter().enumerate() {
            if !self.offered().any(|t| t.name == tool.name) {
                continue;
            }
            converter.set_root(&tool.parameters);
            let arguments = converter
                .schema_rule(&tool.parameters, "", &format!("{}-args", tool.name))
                .map_err(|e| SchemaError {
                    at: format!("tools[{i}].function.parameters{}", e.at.trim_end_matches('/')),
                    reason: e.reason,
                })?;
            let head = format!(
                "{{\"name\": {}, \"arguments\": ",
                serde_json::to_string(&tool.name).unwrap_or_default()
            );
            let call = converter.add_rule(
                &format!("{}-call", tool.name),
                format!("{} {arguments} \"}}\"", literal(&head)),
            );
            calls.push(call);
        }
        let call = converter.add_rule("call", calls.join(" | "));
        let wrapped = format!("{} {call} {}", literal(OPEN), literal(CLOSE));
        let more = if self.parallel {
            // As many calls as the answer's tokens allow (OpenAI sets no
            // number either).
            format!(" ( \"\\n\" {wrapped} )*")
        } else {
            String::new()
        };
        let text = converter.finish(&format!("{wrapped}{more}"))?;
        let trigger = (self.choice == ToolChoice::Auto).then(|| "<tool_call>".to_owned());
        Ok(Some(Grammar { text, trigger }))
    }
}

/// One function call read from the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments object's JSON text, as the model wrote it.
    pub arguments: String,
}

impl Call {
    /// OpenAI's shape: `{id, type: "function", function: {name, arguments}}`.
    pub fn to_output(&self) -> gantry_text_output::ToolCall {
        gantry_text_output::ToolCall::function(&self.id, &self.name, &self.arguments)
    }
}

/// A piece of a streamed call, in the shape of OpenAI's `delta.tool_calls`
/// items: the first of a call has `id`, `type` and `function.name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    pub index: usize,
    pub start: Option<(String, String)>,
    pub arguments: String,
}

impl CallDelta {
    pub fn to_output(&self) -> gantry_text_output::ToolCallDelta {
        let (id, name) = self.start.clone().unzip();
        gantry_text_output::ToolCallDelta {
            index: self.index,
            id,
            kind: self.start.as_ref().map(|_| "function".to_owned()),
            function: gantry_text_output::FunctionDelta {
                name,
                arguments: self.arguments.clone(),
            },
        }
    }
}

/// What one piece of generated text became.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Text for the answer's content.
    pub content: String,
    pub calls: Vec<CallDelta>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Content; a possible start of [`OPEN`] is held back.
    Content,
    /// Inside a call, before its arguments: the head read so far.
    Head,
    /// Inside a call's arguments; a possible start of the end is held back.
    Arguments,
    /// Between calls: a newline and another call, or the end.
    Between,
}

/// Splits generated text into content and calls as it arrives.
#[derive(Debug)]
pub struct CallParser {
    state: State,
    /// Text not yet given out.
    held: String,
    calls: Vec<Call>,
}

impl Default for CallParser {
    fn default() -> Self {
        Self::new()
    }
}

impl CallParser {
    pub fn new() -> Self {
        Self {
            state: State::Content,
            held: String::new(),
            calls: Vec::new(),
        }
    }

    /// The calls read so far (the last one may be unfinished).
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// Reads the next piece of text.
    pub fn push(&mut self, piece: &str) -> Parsed {
        self.held.push_str(piece);
        let mut out = Parsed::default();
        loop {
            match self.state {
                State::Content => {
                    if let Some(at) = self.held.find(OPEN) {
                        out.content.push_str(&self.held[..at]);
                        self.held.drain(..at + OPEN.len());
                        self.state = State::Head;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, OPEN);
                    let give = self.held.len() - keep;
                    out.content.push_str(&self.held[..give]);
                    self.held.drain(..give);
                    return out;
                }
                State::Head => {
                    const MARK: &str = ", \"arguments\": ";
                    let Some(at) = self.held.find(MARK) else {
                        return out;
                    };
                    let head = &self.held[..at];
                    let name = head
                        .strip_prefix("{\"name\": ")
                        .and_then(|name| serde_json::from_str::<String>(name).ok())
                        .unwrap_or_default();
                    let id = call_id();
                    out.calls.push(CallDelta {
                        index: self.calls.len(),
                        start: Some((id.clone(), name.clone())),
                        arguments: String::new(),
                    });
                    self.calls.push(Call {
                        id,
                        name,
                        arguments: String::new(),
                    });
                    self.held.drain(..at + MARK.len());
                    self.state = State::Arguments;
                }
                State::Arguments => {
                    let end = format!("}}{CLOSE}");
                    let (give, done) = match self.held.find(&end) {
                        Some(at) => (at, true),
                        None => (self.held.len() - partial_suffix(&self.held, &end), false),
                    };
                    if give > 0 {
                        let fragment = self.held[..give].to_owned();
                        self.append_arguments(&mut out, &fragment);
                        self.held.drain(..give);
                    }
                    if !done {
                        return out;
                    }
                    self.held.drain(..end.len());
                    self.state = State::Between;
                }
                State::Between => {
                    let next = format!("\n{OPEN}");
                    if self.held.starts_with(&next) {
                        self.held.drain(..next.len());
                        self.state = State::Head;
                        continue;
                    }
                    if next.starts_with(self.held.as_str()) {
                        return out;
                    }
                    // Not another call (the grammar allows none): content.
                    self.state = State::Content;
                }
            }
        }
    }

    fn append_arguments(&mut self, out: &mut Parsed, fragment: &str) {
        let index = self.calls.len() - 1;
        if let Some(call) = self.calls.last_mut() {
            call.arguments.push_str(fragment);
        }
        match out.calls.last_mut() {
            Some(delta) if delta.index == index => delta.arguments.push_str(fragment),
            _ => out.calls.push(CallDelta {
                index,
                start: None,
                arguments: fragment.to_owned(),
            }),
        }
    }

    /// The end of the text: what was held back comes out (as content, or as
    /// the arguments of an unfinished call).
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Content | State::Between => out.content = held,
            State::Head => {}
            State::Arguments => {
                if !held.is_empty() {
                    self.append_arguments(&mut out, &held);
                }
            }
        }
        out
    }
}

/// The length of the longest end of `text` that is a proper start of `mark`.
fn partial_suffix(text: &str, mark: &str) -> usize {
    (1..mark.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && mark.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// A fresh call id: `call_` and 24 letters and digits.
fn call_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut bits = 0u128;
    for part in 0..2u8 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(count);
        hasher.write_u8(part);
        bits = (bits << 64) | u128::from(hasher.finish());
    }
    let mut id = String::from("call_");
    for _ in 0..24 {
        id.push(char::from(ALPHABET[(bits % ALPHABET.len() as u128) as usize]));
        bits /= ALPHABET.len() as u128;
    }
    id
}

/// How an assistant message's calls are written back into the prompt.
pub fn render_calls(calls: &[Call]) -> String {
    calls
        .iter()
        .map(|call| {
            let arguments: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!(call.arguments));
            format!(
                "{OPEN}{{\"name\": {}, \"arguments\": {arguments}}}{CLOSE}",
                json!(call.name)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How a tool's result is written into the prompt.
pub fn render_result(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(pieces: &[&str]) -> (String, Vec<Call>, Vec<CallDelta>) {
        let mut parser = CallParser::new();
        let mut content = String::new();
        let mut deltas = Vec::new();
        for piece in pieces {
            let out = parser.push(piece);
            content.push_str(&out.content);
            deltas.extend(out.calls);
        }
        let out = parser.finish();
        content.push_str(&out.content);
        deltas.extend(out.calls);
        (content, parser.calls().to_vec(), deltas)
    }

    #[test]
    fn calls_are_read_back_from_pieces_of_any_size() {
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": {\"n\": \"Paris\"}}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        for size in [1, 2, 3, 7, 1000] {
            let chars: Vec<char> = text.chars().collect();
            let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (content, calls, deltas) = parse_all(&refs);
            assert_eq!(content, "Let me check.", "size {size}");
            assert_eq!(calls.len(), 2);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, r#"{"city": {"n": "Paris"}}"#);
            assert_eq!(calls[1].name, "b");
            assert_eq!(calls[1].arguments, "{}");
            assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
            // the deltas assemble into the calls, as the SDK assembles them
            let mut assembled = vec![String::new(); 2];
            for delta in &deltas {
                assembled[delta.index].push_str(&delta.arguments);
            }
            assert_eq!(assembled, [calls[0].arguments.clone(), calls[1].arguments.clone()]);
            assert_eq!(deltas.iter().filter(|d| d.start.is_some()).count(), 2);
        }
    }

    #[test]
    fn parallel_calls_are_not_capped() {
        let tools = |parallel| Tools {
            tools: vec![Tool {
                name: "f".into(),
                description: None,
                parameters: serde_json::json!({"type": "object", "properties": {}}),
            }],
            choice: ToolChoice::Required,
            parallel,
        };
        let root = |parallel| {
            let text = tools(parallel).grammar().unwrap().unwrap().text;
            text.lines().find(|l| l.starts_with("root ::=")).unwrap().to_owned()
        };
        // One call, then any number more (OpenAI sets no limit); one alone without.
        let many = root(true);
        assert!(many.ends_with(")*"), "{many}");
        assert!(!many.contains('{'), "a bounded repetition: {many}");
        let one = root(false);
        assert!(!one.contains('*') && !one.contains('{'), "{one}");
    }

    #[test]
    fn text_without_calls_is_content() {
        let (content, calls, _) = parse_all(&["Hello <tool", " world <", "b>"]);
        assert_eq!(content, "Hello <tool world <b>");
        assert!(calls.is_empty());
    }

    #[test]
    fn written_calls_read_back_the_same() {
        let calls = vec![Call {
            id: "call_1".into(),
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
        }];
        let text = render_calls(&calls);
        let (_, read, _) = parse_all(&[&text]);
        assert_eq!(read[0].name, "f");
        assert_eq!(
            serde_json::from_str::<Value>(&read[0].arguments).unwrap(),
            json!({"a": 1})
        );
    }
}
