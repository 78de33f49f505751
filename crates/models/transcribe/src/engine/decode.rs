//! Greedy decoding of one window with Whisper's logit rules, in the order
//! CTranslate2 applies them (`WhisperReplica::generate`, `GreedySearch`,
//! `ApplyTimestampRules`).
use std::sync::atomic::{AtomicBool, Ordering};

use super::EngineError;
use super::model::N_TEXT_CTX;
use super::tokenizer::Specials;

/// What decoding needs of a Whisper: a fresh self-attention cache, and the
/// decoder over tokens after those cached. Each backend has its own keys and
/// values (`Cross`, `Cache`): host buffers, or tensors on a device.
pub trait Net {
    /// One window's cross-attention keys and values, by layer.
    type Cross;
    /// The self-attention keys and values decoded so far.
    type Cache;
    /// The vocabulary's size (the logits' length).
    fn vocab(&self) -> usize;
    fn new_cache(&self) -> Result<Self::Cache, EngineError>;
    /// Runs the decoder over `tokens`, appended after the positions already
    /// cached, and writes the logits of the last one into `logits` if given.
    fn decode(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
        cross: &Self::Cross,
        logits: Option<&mut [f32]>,
        threads: usize,
    ) -> Result<(), EngineError>;
}

/// The logit rules of a transcription.
#[derive(Debug)]
pub struct Rules<'a> {
    pub specials: Specials,
    /// The last timestamp token.
    pub timestamp_end: u32,
    /// The latest timestamp the first token may be.
    pub max_initial_timestamp: u32,
    /// Never sampled.
    pub suppress: &'a [u32],
    /// Not sampled first (`suppress_blank`).
    pub suppress_begin: &'a [u32],
}

/// The outcome of decoding one window.
#[derive(Debug)]
pub struct Decoded {
    /// Sampled tokens, without the end of text.
    pub tokens: Vec<u32>,
    /// Sum of the sampled tokens' log-probabilities, the end of text's included.
    pub sum_logprob: f64,
    /// Probability of `<|nocaptions|>` at the first step.
    pub no_speech_prob: f64,
}

/// `log Σ exp(x)`.
fn logsumexp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    f64::from(max) + super::linear::sum_exp(x, max).ln()
}

impl Rules<'_> {
    /// Masks `logits` (to −∞) for step `step`, given the tokens sampled so far.
    fn apply(&self, step: usize, sampled: &[u32], logits: &mut [f32]) {
        let sp = &self.specials;
        let ts_begin = sp.timestamp_begin as usize;
        let ts_end = self.timestamp_end as usize;
        let ninf = f32::NEG_INFINITY;
        for &t in self.suppress {
            if let Some(v) = logits.get_mut(t as usize) {
                *v = ninf;
            }
        }
        if step == 0 {
            for &t in self.suppress_begin {
                if let Some(v) = logits.get_mut(t as usize) {
                    *v = ninf;
                }
            }
        }
        logits[sp.no_timestamps as usize] = ninf;
        let mut check_timestamp = false;
        if step == 0 {
            logits[..ts_begin].fill(ninf);
            let first_late = (self.max_initial_timestamp as usize + 1).min(logits.len());
            logits[first_late..=ts_end].fill(ninf);
        } else {
            let last = sampled[step - 1] as usize;
            if last >= ts_begin {
                let penultimate = if step >= 2 { sampled[step - 2] as usize } else { last };
                if penultimate >= ts_begin {
                    // A pair closed: text (or the end) must follow.
                    logits[ts_begin..=ts_end].fill(ninf);
                } else {
                    // A timestamp after text: another (≥ it) or the end.
                    logits[..sp.eot as usize].fill(ninf);
                    logits[ts_begin..last].fill(ninf);
                    check_timestamp = true;
                }
            } else {
                check_timestamp = true;
                // Timestamps must increase.
                if let Some(&t) = sampled[..step].iter().rev().find(|t| **t as usize >= ts_begin) {
                    logits[ts_begin..=t as usize].fill(ninf);
                }
            }
        }
        if check_timestamp {
            // If the timestamps together are likelier than any text token,
            // sample a timestamp.
            let ts = logsumexp(&logits[ts_begin..=ts_end]);
            let max_text = logits[..ts_begin].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if ts > f64::from(max_text) {
                logits[..ts_begin].fill(ninf);
            }
        }
    }
}

/// Decodes one window greedily after `prompt` (which ends with
/// `<|startoftranscript|>`).
/// `None` when `stop` was set before the window's end of text.
pub fn greedy<N: Net>(
    model: &N,
    cross: &N::Cross,
    prompt: &[u32],
    rules: &Rules<'_>,
    threads: usize,
    stop: Option<&AtomicBool>,
) -> Result<Option<Decoded>, EngineError> {
    let vocab = model.vocab();
    let mut cache = model.new_cache()?;
    let (head, sot) = prompt.split_at(prompt.len().saturating_sub(1));
    if !head.is_empty() {
        model.decode(head, &mut cache, cross, None, threads)?;
    }
    let start_step = head.len();
    let max_length = (N_TEXT_CTX / 2).min(N_TEXT_CTX - start_step);
    let mut logits = vec![0.0f32; vocab];
    let mut tokens: Vec<u32> = Vec::new();
    let mut sum_logprob = 0.0f64;
    let mut no_speech_prob = 0.0f64;
    let mut input = sot.first().copied().unwrap_or(rules.specials.sot);
    for step in 0..max_length {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Ok(None);
        }
        model.decode(&[input], &mut cache, cross, Some(&mut logits), threads)?;
        if step == 0 {
            let lse = logsumexp(&logits);
            no_speech_prob = (f64::from(logits[rules.specials.no_speech as usize]) - lse).exp();
        }
        rules.apply(step, &tokens, &mut logits);
        let lse = logsumexp(&logits);
        let mut best = 0usize;
        let mut best_v = f32::NEG_INFINITY;
        for (i, v) in logits.iter().enumerate() {
            if *v > best_v {
                best_v = *v;
                best = i;
            }
        }
        sum_logprob += f64::from(best_v) - lse;
        let best = best as u32;
        if best == rules.specials.eot {
            break;
        }
        tokens.push(best);
        input = best;
    }
    Ok(Some(Decoded {
        tokens,
        sum_logprob,
        no_speech_prob,
    }))
}
