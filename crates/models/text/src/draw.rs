//! How a sequence picks its next token from its row of logits.
//!
//! Most requests ask for nothing but a temperature (or greedy decoding),
//! perhaps with `ignore_eos`: for them the draw is one pass over the row
//! here, with no candidate array. llama.cpp's sampler chain builds one of
//! vocabulary size (12 bytes a token) for every draw and runs each stage
//! over it with scalar code; at SmolLM2's 49,152 tokens that is about half a
//! millisecond a draw on a server core, which at 64 sequences is several
//! times the GPU's decode of the step. Everything else (a grammar, logit
//! biases, penalties, top-k, top-p, min-p) keeps the chain, whose stages
//! carry state or reorder the candidates.
//!
//! The plain draw is exact in what it samples: greedy is llama.cpp's argmax
//! (the first of equal maxima); a temperature draw picks token i with
//! probability exp((l_i - max) / T) / sum, as llama.cpp's `temp` and `dist`
//! stages do. Only the random numbers differ (a seeded SplitMix64 here, the
//! chain's Mersenne Twister there): a seed repeats its text on this engine,
//! and a different engine was never promised the same text for a seed.

use crate::llama::{Candidates, Sampler, Token};

/// A sequence's way of drawing tokens.
pub enum Drawer {
    /// llama.cpp's sampler chain (grammar, biases, penalties, truncations).
    Chain(Sampler),
    /// The likeliest token, not one of `ban`.
    Argmax { ban: Vec<Token> },
    /// A draw from the softmax of the logits at a temperature, never one of `ban`.
    Softmax {
        inverse_temperature: f32,
        ban: Vec<Token>,
        rng: SplitMix64,
        weights: Vec<f32>,
        blocks: Vec<f32>,
    },
}

impl std::fmt::Debug for Drawer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Chain(_) => f.write_str("Drawer::Chain"),
            Self::Argmax { ban } => write!(f, "Drawer::Argmax(ban {})", ban.len()),
            Self::Softmax {
                inverse_temperature,
                ban,
                ..
            } => write!(f, "Drawer::Softmax(1/T {inverse_temperature}, ban {})", ban.len()),
        }
    }
}

/// Tokens summed per block: the second pass finds its block from the
/// blocks' sums, then its token inside the block.
const BLOCK: usize = 256;

impl Drawer {
    /// The plain greedy drawer.
    pub fn argmax(ban: &[Token]) -> Self {
        Self::Argmax { ban: sorted(ban) }
    }

    /// The plain temperature drawer (`temperature` > 0), seeded.
    pub fn softmax(temperature: f32, seed: u64, ban: &[Token]) -> Self {
        Self::Softmax {
            inverse_temperature: 1.0 / temperature,
            ban: sorted(ban),
            rng: SplitMix64(seed),
            weights: Vec::new(),
            blocks: Vec::new(),
        }
    }

    /// Whether the draws go through llama.cpp's chain.
    #[cfg(test)]
    pub fn is_chain(&self) -> bool {
        matches!(self, Self::Chain(_))
    }

    /// The next token from `logits` (one row, the vocabulary's size), and
    /// for a chain its acceptance into the chain's state. `None` when
    /// nothing can be drawn (every token banned, or a chain that chose none).
    pub fn draw(&mut self, logits: &[f32], candidates: &mut Candidates) -> Option<Token> {
        match self {
            Self::Chain(sampler) => sampler.sample_row(logits, candidates),
            Self::Argmax { ban } => argmax(logits, ban),
            Self::Softmax {
                inverse_temperature,
                ban,
                rng,
                weights,
                blocks,
            } => softmax_draw(logits, *inverse_temperature, ban, rng.next_unit(), weights, blocks),
        }
    }
}

fn sorted(tokens: &[Token]) -> Vec<Token> {
    let mut tokens = tokens.to_vec();
    tokens.sort_unstable();
    tokens.dedup();
    tokens
}

/// The index of the largest logit not in `ban` (the first of equals).
fn argmax(logits: &[f32], ban: &[Token]) -> Option<Token> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &logit) in logits.iter().enumerate() {
        if best.is_none_or(|(_, b)| logit > b) && !is_banned(ban, i) {
            best = Some((i, logit));
        }
    }
    best.and_then(|(i, _)| Token::try_from(i).ok())
}

fn is_banned(ban: &[Token], index: usize) -> bool {
    !ban.is_empty() && Token::try_from(index).is_ok_and(|token| ban.binary_search(&token).is_ok())
}

/// The largest of `values`, in lanes the compiler keeps in vector registers.
fn max_of(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let (chunks, rest) = values.as_chunks::<16>();
    for chunk in chunks {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane = if value > *lane { value } else { *lane };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &value in lanes.iter().chain(rest) {
        if value > max {
            max = value;
        }
    }
    max
}

/// e^x for x <= 0 (smaller than -87 gives about 1e-38, not 0), to within a
/// few parts in 10^7: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
/// series to r^6, times 2^n put into the exponent bits. Plain arithmetic,
/// with no branch and no call, so that a loop of it runs in vector lanes.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: the first has few enough bits that n * LN2_HI is exact.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // Separate multiplies and adds, not `mul_add`: without the FMA
    // instructions in the target, `mul_add` is a call to a software fma.
    let x = x.max(-87.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = r * (1.0 / 720.0) + 1.0 / 120.0;
    let p = r * p + 1.0 / 24.0;
    let p = r * p + 1.0 / 6.0;
    let p = r * p + 0.5;
    let p = r * p + 1.0;
    let p = r * p + 1.0;
    // n is in [-126, 0]: 2^n as the float with exponent n + 127.
    let exponent = (shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32 + 127) as u32;
    p * f32::from_bits(exponent << 23)
}

/// Draws from softmax(`logits` * `inverse_temperature`) without the tokens
/// of `ban`, with `unit` uniform in [0, 1): the token where the running sum
/// of the weights first reaches `unit` times their total.
fn softmax_draw(
    logits: &[f32],
    inverse_temperature: f32,
    ban: &[Token],
    unit: f64,
    weights: &mut Vec<f32>,
    blocks: &mut Vec<f32>,
) -> Option<Token> {
    if logits.is_empty() {
        return None;
    }
    let max = if ban.is_empty() {
        max_of(logits)
    } else {
        // A banned token's logit must not set the scale: every other weight
        // could underflow below it.
        logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| !is_banned(ban, i))
            .map(|(_, &l)| l)
            .fold(f32::NEG_INFINITY, f32::max)
    };
    if max == f32::NEG_INFINITY || max.is_nan() {
        return None;
    }
    weights.resize(logits.len(), 0.0);
    blocks.clear();
    for (out, row) in weights.chunks_mut(BLOCK).zip(logits.chunks(BLOCK)) {
        let mut lanes = [0.0f32; 16];
        let (outs, out_rest) = out.as_chunks_mut::<16>();
        let (rows, row_rest) = row.as_chunks::<16>();
        for (o, r) in outs.iter_mut().zip(rows) {
            for ((o, &r), lane) in o.iter_mut().zip(r).zip(lanes.iter_mut()) {
                let w = exp_nonpositive((r - max) * inverse_temperature);
                *o = w;
                *lane += w;
            }
        }
        let mut sum: f32 = lanes.iter().sum();
        for (o, &r) in out_rest.iter_mut().zip(row_rest) {
            *o = exp_nonpositive((r - max) * inverse_temperature);
            sum += *o;
        }
        blocks.push(sum);
    }
    for &token in ban {
        if let Some(weight) = usize::try_from(token).ok().and_then(|i| weights.get_mut(i)) {
            let block = &mut blocks[usize::try_from(token).unwrap_or(0) / BLOCK];
            *block -= *weight;
            *weight = 0.0;
        }
    }
    let total: f64 = blocks.iter().map(|&b| f64::from(b.max(0.0))).sum();
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let target = unit * total;
    let mut running = 0.0f64;
    let mut last_positive = None;
    for (b, &block) in blocks.iter().enumerate() {
        let block = f64::from(block.max(0.0));
        if running + block < target && b + 1 < blocks.len() {
            running += block;
            continue;
        }
        // The token is in this block (or, by rounding, just before its end).
        let start = b * BLOCK;
        for (i, &w) in weights[start..(start + BLOCK).min(weights.len())].iter().enumerate() {
            if w > 0.0 {
                running += f64::from(w);
                last_positive = Some(start + i);
                if running >= target {
                    return Token::try_from(start + i).ok();
                }
            }
        }
        if last_positive.is_some() {
            break;
        }
    }
    // Rounding left the target just past the last weight: the last token
    // that could be drawn.
    last_positive
        .or_else(|| weights.iter().rposition(|&w| w > 0.0))
        .and_then(|i| Token::try_from(i).ok())
}

/// SplitMix64: a small, fast, well-mixed generator, enough for drawing
/// tokens (not for secrets).
pub struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponential_is_within_a_few_parts_in_ten_million() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -80.0 {
            let ours = f64::from(exp_nonpositive(x));
            let exact = f64::from(x).exp();
            worst = worst.max(((ours - exact) / exact).abs());
            x -= 0.001_37;
        }
        assert!(worst < 5e-7, "largest relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-200.0) < 1e-37);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn argmax_takes_the_first_largest_and_skips_banned_tokens() {
        let logits = [0.5, 3.0, -1.0, 3.0, 2.0];
        let mut candidates = Candidates::default();
        assert_eq!(Drawer::argmax(&[]).draw(&logits, &mut candidates), Some(1));
        assert_eq!(Drawer::argmax(&[1]).draw(&logits, &mut candidates), Some(3));
        assert_eq!(Drawer::argmax(&[3, 1]).draw(&logits, &mut candidates), Some(4));
        assert_eq!(Drawer::argmax(&[0, 1, 2, 3, 4]).draw(&logits, &mut candidates), None);
    }

    /// Over many draws each token comes up as often as its softmax
    /// probability says (a fixed seed: the same counts on every machine).
    #[test]
    fn draws_follow_the_softmax_at_the_temperature() {
        // A row longer than a block, with the mass spread over a few blocks.
        let mut logits = vec![-30.0f32; 3 * BLOCK + 17];
        let chosen = [
            (5usize, 2.0f32),
            (300, 1.0),
            (301, 0.0),
            (700, 1.5),
            (3 * BLOCK + 16, -0.5),
        ];
        for &(i, l) in &chosen {
            logits[i] = l;
        }
        for temperature in [0.7f32, 1.0, 1.6] {
            let exact: Vec<f64> = logits.iter().map(|&l| f64::from(l / temperature).exp()).collect();
            let total: f64 = exact.iter().sum();
            let mut drawer = Drawer::softmax(temperature, 42, &[]);
            let mut counts = vec![0u32; logits.len()];
            let draws = 40_000;
            let mut candidates = Candidates::default();
            for _ in 0..draws {
                let token = drawer.draw(&logits, &mut candidates).expect("a token");
                counts[usize::try_from(token).unwrap()] += 1;
            }
            for &(i, _) in &chosen {
                let expected = exact[i] / total;
                let seen = f64::from(counts[i]) / f64::from(draws);
                assert!(
                    (seen - expected).abs() < 0.01,
                    "T={temperature} token {i}: {seen} drawn, {expected} expected"
                );
            }
            let others: u32 = (0..logits.len())
                .filter(|i| !chosen.iter().any(|&(c, _)| c == *i))
                .map(|i| counts[i])
                .sum();
            let expected_others = (0..logits.len())
                .filter(|i| !chosen.iter().any(|&(c, _)| c == *i))
                .map(|i| exact[i] / total)
                .sum::<f64>();
            assert!(f64::from(others) / f64::from(draws) < expected_others * 3.0 + 1e-4);
        }
    }

    #[test]
    fn a_banned_token_is_never_drawn_even_when_it_dominates() {
        let mut logits = vec![0.0f32; 600];
        logits[7] = 200.0; // would underflow every other weight if it set the scale
        logits[450] = 1.0;
        let mut drawer = Drawer::softmax(1.0, 7, &[7]);
        let mut candidates = Candidates::default();
        let mut seen_450 = 0;
        for _ in 0..2_000 {
            let token = drawer.draw(&logits, &mut candidates).expect("a token");
            assert_ne!(token, 7);
            seen_450 += u32::from(token == 450);
        }
        // e / (599 - 1 + e) of the draws, about 0.45 %: some, not most.
        assert!((1..60).contains(&seen_450), "{seen_450}");
        let everything: Vec<Token> = (0..600).collect();
        assert_eq!(
            Drawer::softmax(1.0, 7, &everything).draw(&logits, &mut candidates),
            None
        );
    }

    /// Only requests with nothing but a temperature (or greedy, with or
    /// without `ignore_eos`'s ban) skip llama.cpp's chain.
    #[test]
    fn only_plain_requests_skip_the_chain() {
        use crate::input::Sampling;
        let base = Sampling {
            temperature: 0.8,
            ..Sampling::default()
        };
        let plain = |sampling: &Sampling| !crate::engine::sampler(sampling, None, None, 100, 16).is_chain();
        assert!(plain(&base));
        assert!(!crate::engine::sampler(&base, None, Some((&[2, 3], 100)), 100, 16).is_chain());
        // Greedy ignores the truncations.
        assert!(plain(&Sampling {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.5,
            ..base.clone()
        }));
        for chained in [
            Sampling {
                top_k: 40,
                ..base.clone()
            },
            Sampling {
                top_p: 0.9,
                ..base.clone()
            },
            Sampling {
                min_p: 0.05,
                ..base.clone()
            },
            Sampling {
                presence_penalty: 0.5,
                ..base.clone()
            },
            Sampling {
                frequency_penalty: -0.5,
                ..base.clone()
            },
            Sampling {
                logit_bias: vec![(1, 2.0)],
                ..base.clone()
            },
            Sampling {
                temperature: 0.0,
                logit_bias: vec![(1, 2.0)],
                ..base.clone()
            },
        ] {
            assert!(!plain(&chained), "{chained:?}");
        }
    }

    #[test]
    fn a_seed_repeats_its_draws() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 20.0).collect();
        let run = |seed| {
            let mut drawer = Drawer::softmax(0.8, seed, &[]);
            let mut candidates = Candidates::default();
            (0..50)
                .map(|_| drawer.draw(&logits, &mut candidates).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }
}
