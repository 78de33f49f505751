//! BERT's encoder on the CPU, written for embedding many short texts.
//!
//! The sequences of a batch are not padded: their tokens are laid end to
//! end, so every dense layer is one product over exactly the batch's tokens
//! (on `gantry_kernels`' packed kernel, the weights packed once at
//! load, the tokens split between threads), and attention runs per sequence
//! and head over that sequence's own tokens, which needs no mask. The
//! arithmetic is BERT's (post-norm layers, exact-erf GELU), in f32.
use std::collections::HashMap;

use candle_core::Tensor;
use gantry_kernels::math::gelu;
use gantry_kernels::packed::{INPUT_BLOCK, PackedWeights};
use rayon::prelude::*;

use crate::encoder::LoadError;

/// A dense layer `y = x·Wᵀ + b` on packed weights.
struct Dense {
    w: PackedWeights,
    bias: Vec<f32>,
    inp: usize,
    out: usize,
}

impl Dense {
    /// `x` is `n × inp`, row-major; returns `n × out`.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() / self.inp;
        let mut y = vec![0.0f32; n * self.out];
        if n == 0 {
            return y;
        }
        let threads = rayon::current_num_threads().max(1);
        if threads > 1 && n <= FEW_TOKENS * threads {
            // Few tokens (one short sentence): each thread takes a share of
            // the output features for every token, so the weights are read
            // once, not once per thread.
            let panels = self.w.panels();
            let per = panels.div_ceil(threads).next_multiple_of(2);
            let parts: Vec<(std::ops::Range<usize>, Vec<f32>)> = (0..panels.div_ceil(per))
                .into_par_iter()
                .map(|t| {
                    let share = t * per..((t + 1) * per).min(panels);
                    let features = self.w.panel_rows(share.clone());
                    let mut part = vec![0.0f32; n * features.len()];
                    self.w.matmul_rows_of(share, x, n, &mut part);
                    (features, part)
                })
                .collect();
            for (features, part) in parts {
                let width = features.len();
                for (row, values) in y.chunks_exact_mut(self.out).zip(part.chunks_exact(width)) {
                    let dst = &mut row[features.clone()];
                    for ((d, v), b) in dst.iter_mut().zip(values).zip(&self.bias[features.clone()]) {
                        *d = v + b;
                    }
                }
            }
            return y;
        }
        let per = n.div_ceil(threads).div_ceil(INPUT_BLOCK).max(1) * INPUT_BLOCK;
        y.par_chunks_mut(per * self.out)
            .zip(x.par_chunks(per * self.inp))
            .for_each(|(y, x)| {
                let rows = x.len() / self.inp;
                self.w.matmul_rows(x, rows, y);
                for row in y.chunks_exact_mut(self.out) {
                    for (v, b) in row.iter_mut().zip(&self.bias) {
                        *v += b;
                    }
                }
            });
        y
    }
}

/// Tokens per thread up to which a dense layer is split between threads by
/// its output features rather than by tokens.
const FEW_TOKENS: usize = 24;

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl Norm {
    /// Layer norm of every row of `x` (`… × gamma.len()`), in place.
    fn apply(&self, x: &mut [f32]) {
        let h = self.gamma.len();
        x.par_chunks_mut(h * 16).for_each(|rows| {
            for row in rows.chunks_exact_mut(h) {
                let mean = row.iter().sum::<f32>() / h as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
                let scale = 1.0 / (var + self.eps).sqrt();
                for ((v, g), b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
                    *v = (*v - mean) * scale * g + b;
                }
            }
        });
    }
}

struct Layer {
    /// Query, key and value in one product (`3h × h`).
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    up: Dense,
    down: Dense,
    out_norm: Norm,
}

/// BERT's embeddings and encoder layers.
pub struct Bert {
    words: Vec<f32>,
    positions: Vec<f32>,
    /// Token type 0 (every input here is a single segment).
    segment: Vec<f32>,
    embed_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    vocab: usize,
    max_positions: usize,
}

/// The shape of a BERT (from its `config.json`).
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub eps: f32,
}

impl Bert {
    /// Takes the weights out of `tensors` (a safetensors file's, with or
    /// without a `bert.` prefix).
    pub fn from_tensors(tensors: &HashMap<String, Tensor>, shape: &Shape) -> Result<Self, LoadError> {
        let prefix = if tensors.contains_key("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let get = |name: &str, len: usize| -> Result<Vec<f32>, LoadError> {
            let full = format!("{prefix}{name}");
            let tensor = tensors
                .get(&full)
                .ok_or_else(|| LoadError(format!("model.safetensors has no {full}")))?;
            let values = tensor
                .to_dtype(candle_core::DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| LoadError(format!("{full}: {e}")))?;
            if values.len() != len {
                return Err(LoadError(format!("{full} has {} values, expected {len}", values.len())));
            }
            Ok(values)
        };
        let h = shape.hidden;
        let dense = |name: &str, inp: usize, out: usize| -> Result<Dense, LoadError> {
            Ok(Dense {
                w: PackedWeights::from_rows(&get(&format!("{name}.weight"), out * inp)?, out, inp),
                bias: get(&format!("{name}.bias"), out)?,
                inp,
                out,
            })
        };
        let norm = |name: &str| -> Result<Norm, LoadError> {
            Ok(Norm {
                gamma: get(&format!("{name}.weight"), h)?,
                beta: get(&format!("{name}.bias"), h)?,
                eps: shape.eps,
            })
        };
        if shape.heads == 0 || !h.is_multiple_of(shape.heads) {
            return Err(LoadError(format!(
                "{h} hidden features do not split into {} heads",
                shape.heads
            )));
        }
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let at = format!("encoder.layer.{i}");
            let mut qkv = Vec::with_capacity(3 * h * h);
            let mut bias = Vec::with_capacity(3 * h);
            for part in ["query", "key", "value"] {
                qkv.extend(get(&format!("{at}.attention.self.{part}.weight"), h * h)?);
                bias.extend(get(&format!("{at}.attention.self.{part}.bias"), h)?);
            }
            layers.push(Layer {
                qkv: Dense {
                    w: PackedWeights::from_rows(&qkv, 3 * h, h),
                    bias,
                    inp: h,
                    out: 3 * h,
                },
                attn_out: dense(&format!("{at}.attention.output.dense"), h, h)?,
                attn_norm: norm(&format!("{at}.attention.output.LayerNorm"))?,
                up: dense(&format!("{at}.intermediate.dense"), h, shape.intermediate)?,
                down: dense(&format!("{at}.output.dense"), shape.intermediate, h)?,
                out_norm: norm(&format!("{at}.output.LayerNorm"))?,
            });
        }
        let segment = get("embeddings.token_type_embeddings.weight", 2 * h)
            .or_else(|_| get("embeddings.token_type_embeddings.weight", h))?;
        Ok(Self {
            words: get("embeddings.word_embeddings.weight", shape.vocab * h)?,
            positions: get("embeddings.position_embeddings.weight", shape.max_positions * h)?,
            segment: segment[..h].to_vec(),
            embed_norm: norm("embeddings.LayerNorm")?,
            layers,
            hidden: h,
            heads: shape.heads,
            vocab: shape.vocab,
            max_positions: shape.max_positions,
        })
    }

    /// The last layer's token vectors of `sequences` (full token ids, `[CLS]`
    /// and `[SEP]` included), laid end to end: `tokens × hidden`.
    pub fn forward(&self, sequences: &[&[u32]]) -> Result<Vec<f32>, String> {
        let h = self.hidden;
        let total: usize = sequences.iter().map(|s| s.len()).sum();
        let mut x = vec![0.0f32; total * h];
        let mut at = 0;
        for sequence in sequences {
            if sequence.len() > self.max_positions {
                return Err(format!(
                    "a sequence of {} tokens is longer than the model's {}",
                    sequence.len(),
                    self.max_positions
                ));
            }
            for (p, &id) in sequence.iter().enumerate() {
                let id = id as usize;
                if id >= self.vocab {
                    return Err(format!("token id {id} is outside the vocabulary"));
                }
                let row = &mut x[at * h..(at + 1) * h];
                let word = &self.words[id * h..(id + 1) * h];
                let position = &self.positions[p * h..(p + 1) * h];
                for (((v, w), q), s) in row.iter_mut().zip(word).zip(position).zip(&self.segment) {
                    *v = w + q + s;
                }
                at += 1;
            }
        }
        self.embed_norm.apply(&mut x);
        let spans: Vec<(usize, usize)> = sequences
            .iter()
            .scan(0, |start, s| {
                let span = (*start, s.len());
                *start += s.len();
                Some(span)
            })
            .collect();
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x);
            let context = self.attention(&qkv, &spans, total);
            let mut attended = layer.attn_out.forward(&context);
            add(&mut attended, &x);
            layer.attn_norm.apply(&mut attended);
            let mut inner = layer.up.forward(&attended);
            inner.par_chunks_mut(4096).for_each(gelu);
            let mut out = layer.down.forward(&inner);
            add(&mut out, &attended);
            layer.out_norm.apply(&mut out);
            x = out;
        }
        Ok(x)
    }

    /// Self-attention of every sequence over its own tokens: `qkv` is
    /// `tokens × 3h` (queries, keys, values); returns `tokens × h`.
    fn attention(&self, qkv: &[f32], spans: &[(usize, usize)], total: usize) -> Vec<f32> {
        let h = self.hidden;
        let d = h / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        // One task per sequence and head; each writes its own columns of
        // its own rows, gathered afterwards.
        let tasks: Vec<(usize, usize)> = (0..spans.len())
            .flat_map(|s| (0..self.heads).map(move |head| (s, head)))
            .collect();
        let parts: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(s, head)| {
                let (start, n) = spans[s];
                let row = |t: usize, part: usize| &qkv[(start + t) * 3 * h + part * h + head * d..][..d];
                let mut out = vec![0.0f32; n * d];
                let mut scores = vec![0.0f32; n];
                for i in 0..n {
                    let q = row(i, 0);
                    let mut max = f32::NEG_INFINITY;
                    for (j, score) in scores.iter_mut().enumerate() {
                        let k = row(j, 1);
                        *score = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                        max = max.max(*score);
                    }
                    let mut sum = 0.0;
                    for score in &mut scores {
                        *score = (*score - max).exp();
                        sum += *score;
                    }
                    let o = &mut out[i * d..(i + 1) * d];
                    for (j, score) in scores.iter().enumerate() {
                        let weight = score / sum;
                        for (acc, v) in o.iter_mut().zip(row(j, 2)) {
                            *acc += weight * v;
                        }
                    }
                }
                out
            })
            .collect();
        let mut context = vec![0.0f32; total * h];
        for (&(s, head), part) in tasks.iter().zip(parts) {
            let (start, n) = spans[s];
            for t in 0..n {
                context[(start + t) * h + head * d..][..d].copy_from_slice(&part[t * d..(t + 1) * d]);
            }
        }
        context
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dense_layer_gives_the_same_sums_split_either_way() {
        // 40 output features (three panels, the last ragged) over 24 inputs;
        // 3 tokens are split between the threads by features, 300 by tokens.
        let (inp, out) = (24, 40);
        let w: Vec<f32> = (0..inp * out).map(|i| ((i * 7 % 19) as f32 - 9.0) / 8.0).collect();
        let bias: Vec<f32> = (0..out).map(|o| o as f32 / 10.0).collect();
        let dense = Dense {
            w: PackedWeights::from_rows(&w, out, inp),
            bias: bias.clone(),
            inp,
            out,
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for n in [1, 3, 300] {
            let x: Vec<f32> = (0..n * inp).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let y = pool.install(|| dense.forward(&x));
            assert_eq!(y.len(), n * out);
            for t in 0..n {
                for o in 0..out {
                    let want = (0..inp).map(|k| w[o * inp + k] * x[t * inp + k]).sum::<f32>() + bias[o];
                    let got = y[t * out + o];
                    assert!((got - want).abs() < 1e-4, "{n} tokens [{t},{o}]: {got} vs {want}");
                }
            }
        }
    }
}
