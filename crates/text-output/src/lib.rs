//! What a text model's job returns, as types: the job's output
//! ([`TextOutput`]) and each of its stream chunks ([`TextChunk`]).
//!
//! The text model crate writes these and the OpenAI-compatible routes read
//! them, so the two agree by construction rather than by field names in two
//! places. The JSON is the job's `output` in `/status` and `/runsync` and
//! the `output` of its `/stream` chunks, documented in docs/models.md.
use serde::{Deserialize, Serialize};

/// A text job's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextOutput {
    /// One per choice asked for (`n`), in order.
    pub choices: Vec<Choice>,
    pub usage: TokenUsage,
}

/// Tokens read and written: what the job is billed for, together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// The prompt's tokens.
    pub input: u64,
    /// The generated tokens of every choice.
    pub output: u64,
}

impl TokenUsage {
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

/// One finished answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub index: usize,
    /// The answer's text in the pieces it was generated in.
    pub tokens: Vec<String>,
    /// The pieces joined.
    pub text: String,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
    /// The functions the model called (when tools were offered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Each generated token's log-probability, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// A function call, in OpenAI's shape: `{id, type: "function", function: {name, arguments}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

impl ToolCall {
    /// A call of function `name` with `arguments` (a JSON object's text).
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments object's JSON text, as the model wrote it.
    pub arguments: String,
}

/// A generated token's log-probability with the most likely alternatives,
/// in the shape of OpenAI's chat `logprobs.content` items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    /// Natural log; JSON has no infinities, so -9999 stands for minus infinity.
    pub logprob: f64,
    /// The token's UTF-8 bytes (a token may be part of a character).
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<Alternative>,
}

/// One of the most likely tokens at a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// What one choice made since its last chunk: a stream chunk's `output`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextChunk {
    /// The choice (absent for 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub index: usize,
    /// Pieces of the answer's text, in order.
    pub tokens: Vec<String>,
    /// Pieces of function calls, in the shape of OpenAI's `delta.tool_calls` items.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
    /// The log-probabilities of the tokens of this chunk, when asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A piece of a streamed call: the first piece of a call has `id`, `type`
/// and `function.name`; the rest carry more of `function.arguments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_output_reads_back_from_its_json_in_the_documented_shape() {
        let output = TextOutput {
            choices: vec![Choice {
                index: 0,
                tokens: vec!["Hel".into(), "lo".into()],
                text: "Hello".into(),
                finish_reason: "tool_calls".into(),
                tool_calls: vec![ToolCall::function("call_1", "f", "{}")],
                logprobs: Some(vec![TokenLogprob {
                    token: "Hel".into(),
                    logprob: -0.5,
                    bytes: b"Hel".to_vec(),
                    top_logprobs: vec![Alternative {
                        token: "Hi".into(),
                        logprob: -1.0,
                        bytes: b"Hi".to_vec(),
                    }],
                }]),
            }],
            usage: TokenUsage { input: 3, output: 2 },
        };
        let value = serde_json::to_value(&output).unwrap();
        assert_eq!(
            value,
            json!({"choices": [{"index": 0, "tokens": ["Hel", "lo"], "text": "Hello", "finish_reason": "tool_calls",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                "logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108],
                    "top_logprobs": [{"token": "Hi", "logprob": -1.0, "bytes": [72, 105]}]}]}],
                "usage": {"input": 3, "output": 2}})
        );
        assert_eq!(serde_json::from_value::<TextOutput>(value).unwrap(), output);
        assert_eq!(output.usage.total(), 5);
    }

    #[test]
    fn a_chunk_leaves_out_what_it_does_not_carry() {
        let first = TextChunk {
            tokens: vec!["a".into()],
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&first).unwrap(), json!({"tokens": ["a"]}));
        let call = TextChunk {
            index: 2,
            tokens: Vec::new(),
            tool_calls: vec![ToolCallDelta {
                index: 0,
                id: None,
                kind: None,
                function: FunctionDelta {
                    name: None,
                    arguments: "{\"x\"".into(),
                },
            }],
            logprobs: Vec::new(),
        };
        let value = serde_json::to_value(&call).unwrap();
        assert_eq!(
            value,
            json!({"index": 2, "tokens": [], "tool_calls": [{"index": 0, "function": {"arguments": "{\"x\""}}]})
        );
        assert_eq!(serde_json::from_value::<TextChunk>(value).unwrap(), call);
    }
}
