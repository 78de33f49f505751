//! Log-probabilities of generated tokens, in OpenAI's shape.
//!
//! They are the model's own distribution at each step: the log-softmax of
//! the raw logits, before the sampler's biases, penalties, grammar,
//! truncation and temperature change it.

use crate::llama::{Token, Weights};

/// One alternative token.
#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A generated token's log-probability and the likeliest alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub chosen: Alternative,
    /// Likeliest first.
    pub top: Vec<Alternative>,
}

impl TokenLogprob {
    /// From the logits of the step that sampled `token`, with the `top`
    /// likeliest tokens.
    pub fn of(model: &Weights, logits: &[f32], token: Token, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let log_z = f64::from(max) + sum.ln();
        let logprob = |id: usize| (f64::from(logits[id]) - log_z) as f32;
        // The `top` largest, kept sorted (top is small: at most 20).
        let mut best: Vec<usize> = Vec::with_capacity(top + 1);
        if top > 0 {
            for (id, &logit) in logits.iter().enumerate() {
                if best.len() == top && logits[best[top - 1]] >= logit {
                    continue;
                }
                let at = best.partition_point(|&b| logits[b] >= logit);
                best.insert(at, id);
                best.truncate(top);
            }
        }
        let alternative = |id: usize| {
            let mut bytes = Vec::new();
            model.piece(Token::try_from(id).unwrap_or(0), false, &mut bytes);
            Alternative {
                token: String::from_utf8_lossy(&bytes).into_owned(),
                bytes,
                logprob: logprob(id),
            }
        };
        let chosen = usize::try_from(token).ok().filter(|&t| t < logits.len());
        Self {
            chosen: chosen.map_or_else(
                || Alternative {
                    token: String::new(),
                    bytes: Vec::new(),
                    logprob: f32::NEG_INFINITY,
                },
                alternative,
            ),
            top: best.into_iter().map(alternative).collect(),
        }
    }

    /// OpenAI's chat shape: `{token, logprob, bytes, top_logprobs: [...]}`.
    pub fn to_output(&self) -> gantry_text_output::TokenLogprob {
        let one = |a: &Alternative| gantry_text_output::Alternative {
            token: a.token.clone(),
            logprob: finite(a.logprob),
            bytes: a.bytes.clone(),
        };
        let chosen = one(&self.chosen);
        gantry_text_output::TokenLogprob {
            token: chosen.token,
            logprob: chosen.logprob,
            bytes: chosen.bytes,
            top_logprobs: self.top.iter().map(one).collect(),
        }
    }
}

/// JSON has no infinities: the lowest finite value stands for minus infinity.
fn finite(x: f32) -> f64 {
    if x.is_finite() { f64::from(x) } else { -9999.0 }
}
