//! Whisper's encoder and decoder, as CTranslate2 runs them: pre-norm
//! Transformer layers, exact GELU, queries scaled by 1/√d before the product,
//! learned position encodings, logits against the token embeddings.
#![allow(clippy::needless_range_loop)]

use gantry_kernels::packed::{INPUT_BLOCK, PackedWeights};

use super::EngineError;
use super::format::ModelFile;
use super::linear::{LayerNorm, Linear, axpy, dot, gelu, in_pieces, pack_rows, par_rows, softmax};
use super::mel::N_MELS;

/// Mel frames in the encoder's window.
pub const N_FRAMES: usize = 3000;
/// Encoder positions (after the stride-2 convolution).
pub const N_CTX: usize = N_FRAMES / 2;
/// Decoder positions.
pub const N_TEXT_CTX: usize = 448;
/// Query rows of the encoder's attention handled at once.
const QUERY_BLOCK: usize = 96;

/// The sizes of a Whisper model.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub d_model: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub enc_layers: usize,
    pub dec_layers: usize,
}

/// One encoder layer, on either backend: `L` its linear layers, `N` its norms.
#[derive(Debug)]
pub(super) struct EncoderLayer<L, N> {
    pub ln1: N,
    pub qkv: L,
    pub out: L,
    pub ln2: N,
    pub ffn1: L,
    pub ffn2: L,
}

/// One decoder layer, on either backend.
#[derive(Debug)]
pub(super) struct DecoderLayer<L, N> {
    pub ln1: N,
    pub qkv: L,
    pub out: L,
    pub ln2: N,
    pub cross_q: L,
    pub cross_kv: L,
    pub cross_out: L,
    pub ln3: N,
    pub ffn1: L,
    pub ffn2: L,
}

/// Reads the layers of `model.bin` for one backend.
pub(super) trait Reader {
    type Linear;
    type Norm;
    fn norm(&mut self, scope: &str, d: usize) -> Result<Self::Norm, EngineError>;
    /// A linear layer `out × inp`; `by_rows` where it mostly meets one row
    /// at a time (the decoder's steps), which the kernels keep unpacked.
    fn linear(&mut self, scope: &str, out: usize, inp: usize, by_rows: bool) -> Result<Self::Linear, EngineError>;
}

/// The layers of every Whisper, by their names in `model.bin`: the encoder's
/// and its final norm, the decoder's and its final norm.
pub(super) type Layers<R> = (
    Vec<EncoderLayer<<R as Reader>::Linear, <R as Reader>::Norm>>,
    <R as Reader>::Norm,
    Vec<DecoderLayer<<R as Reader>::Linear, <R as Reader>::Norm>>,
    <R as Reader>::Norm,
);

pub(super) fn read_layers<R: Reader>(r: &mut R, dims: &Dims) -> Result<Layers<R>, EngineError> {
    let (d, ffn) = (dims.d_model, dims.ffn);
    let mut enc_layers = Vec::with_capacity(dims.enc_layers);
    for i in 0..dims.enc_layers {
        let s = format!("encoder/layer_{i}");
        enc_layers.push(EncoderLayer {
            ln1: r.norm(&format!("{s}/self_attention/layer_norm"), d)?,
            qkv: r.linear(&format!("{s}/self_attention/linear_0"), 3 * d, d, false)?,
            out: r.linear(&format!("{s}/self_attention/linear_1"), d, d, false)?,
            ln2: r.norm(&format!("{s}/ffn/layer_norm"), d)?,
            ffn1: r.linear(&format!("{s}/ffn/linear_0"), ffn, d, false)?,
            ffn2: r.linear(&format!("{s}/ffn/linear_1"), d, ffn, false)?,
        });
    }
    let enc_norm = r.norm("encoder/layer_norm", d)?;
    let mut dec_layers = Vec::with_capacity(dims.dec_layers);
    for i in 0..dims.dec_layers {
        let s = format!("decoder/layer_{i}");
        dec_layers.push(DecoderLayer {
            ln1: r.norm(&format!("{s}/self_attention/layer_norm"), d)?,
            qkv: r.linear(&format!("{s}/self_attention/linear_0"), 3 * d, d, true)?,
            out: r.linear(&format!("{s}/self_attention/linear_1"), d, d, true)?,
            ln2: r.norm(&format!("{s}/attention/layer_norm"), d)?,
            cross_q: r.linear(&format!("{s}/attention/linear_0"), d, d, true)?,
            // Over a whole window of encoder output, once per window.
            cross_kv: r.linear(&format!("{s}/attention/linear_1"), 2 * d, d, false)?,
            cross_out: r.linear(&format!("{s}/attention/linear_2"), d, d, true)?,
            ln3: r.norm(&format!("{s}/ffn/layer_norm"), d)?,
            ffn1: r.linear(&format!("{s}/ffn/linear_0"), ffn, d, true)?,
            ffn2: r.linear(&format!("{s}/ffn/linear_1"), d, ffn, true)?,
        });
    }
    let dec_norm = r.norm("decoder/layer_norm", d)?;
    Ok((enc_layers, enc_norm, dec_layers, dec_norm))
}

impl Reader for ModelFile {
    type Linear = Linear;
    type Norm = LayerNorm;

    fn norm(&mut self, scope: &str, d: usize) -> Result<LayerNorm, EngineError> {
        layer_norm(self, scope, d)
    }

    fn linear(&mut self, scope: &str, out: usize, inp: usize, by_rows: bool) -> Result<Linear, EngineError> {
        if by_rows {
            linear_rows(self, scope, out, inp)
        } else {
            linear(self, scope, out, inp)
        }
    }
}

/// The weights, loaded and packed.
#[derive(Debug)]
pub struct Model {
    pub dims: Dims,
    conv1: Linear,
    conv2: Linear,
    enc_pos: Vec<f32>,
    enc_layers: Vec<EncoderLayer<Linear, LayerNorm>>,
    enc_norm: LayerNorm,
    /// Token embeddings (`vocab × d_model`, row-major): looked up for the
    /// input, and the output projection (tied).
    embeddings: Vec<f32>,
    /// A separate output projection, if the model has one.
    projection: Option<Vec<f32>>,
    dec_pos: Vec<f32>,
    dec_layers: Vec<DecoderLayer<Linear, LayerNorm>>,
    dec_norm: LayerNorm,
}

/// Rows of the output projection per piece a thread takes.
const LOGIT_ROWS: usize = 32;

fn layer_norm(f: &mut ModelFile, scope: &str, d: usize) -> Result<LayerNorm, EngineError> {
    Ok(LayerNorm {
        gamma: f.take(&format!("{scope}/gamma"), &[d])?,
        beta: f.take(&format!("{scope}/beta"), &[d])?,
    })
}

fn linear(f: &mut ModelFile, scope: &str, out: usize, inp: usize) -> Result<Linear, EngineError> {
    let w = f.take(&format!("{scope}/weight"), &[out, inp])?;
    let b = f.take(&format!("{scope}/bias"), &[out])?;
    Ok(Linear::new(&w, Some(b), out, inp))
}

fn linear_rows(f: &mut ModelFile, scope: &str, out: usize, inp: usize) -> Result<Linear, EngineError> {
    let w = f.take(&format!("{scope}/weight"), &[out, inp])?;
    let b = f.take(&format!("{scope}/bias"), &[out])?;
    Ok(Linear::with_rows(w, Some(b), out, inp))
}

fn conv(f: &mut ModelFile, scope: &str, out: usize, inp: usize) -> Result<Linear, EngineError> {
    let w = f.take(&format!("{scope}/weight"), &[out, inp, 3])?;
    let b = f.take(&format!("{scope}/bias"), &[out])?;
    Ok(Linear::new(&w, Some(b), out, inp * 3))
}

fn count_layers(f: &ModelFile, scope: &str) -> usize {
    (0..)
        .take_while(|i| f.has(&format!("{scope}/layer_{i}/ffn/linear_0/weight")))
        .count()
}

/// The sizes of the Whisper in `model.bin`, checked against what this engine
/// runs (both backends read them here).
pub(super) fn dims_of(f: &ModelFile) -> Result<Dims, EngineError> {
    let bad = |m: String| EngineError::Config(m);
    if f.spec != "WhisperSpec" {
        return Err(bad(format!("model.bin holds a {}, not a WhisperSpec", f.spec)));
    }
    let enc_pos_dims = f
        .shape("encoder/position_encodings/encodings")
        .ok_or_else(|| bad("encoder/position_encodings/encodings is missing".into()))?
        .to_vec();
    let emb_dims = f
        .shape("decoder/embeddings/weight")
        .ok_or_else(|| bad("decoder/embeddings/weight is missing".into()))?
        .to_vec();
    let ffn = f
        .shape("encoder/layer_0/ffn/linear_0/weight")
        .map(|d| d[0])
        .ok_or_else(|| bad("encoder/layer_0/ffn/linear_0/weight is missing".into()))?;
    let (Some(&d_model), Some(&vocab)) = (enc_pos_dims.get(1), emb_dims.first()) else {
        return Err(bad("the embeddings have the wrong rank".into()));
    };
    let heads = f.scalar("encoder/num_heads").unwrap_or(6.0) as usize;
    let dec_heads = f.scalar("decoder/num_heads").unwrap_or(6.0) as usize;
    if heads == 0 || d_model % heads != 0 || dec_heads != heads {
        return Err(bad(format!(
            "{heads} encoder and {dec_heads} decoder heads for width {d_model}"
        )));
    }
    if enc_pos_dims[0] != N_CTX {
        return Err(bad(format!("{} encoder positions, not {N_CTX}", enc_pos_dims[0])));
    }
    if f.scalar("decoder/activation").is_some_and(|a| a != 3.0) {
        return Err(bad("the decoder's activation is not the exact GELU".into()));
    }
    if f.scalar("decoder/pre_norm").is_some_and(|a| a != 1.0)
        || f.scalar("decoder/scale_embeddings").is_some_and(|a| a != 0.0)
    {
        return Err(bad(
            "the decoder is not a pre-norm decoder with unscaled embeddings".into()
        ));
    }
    Ok(Dims {
        d_model,
        heads,
        head_dim: d_model / heads,
        ffn,
        vocab,
        enc_layers: count_layers(f, "encoder"),
        dec_layers: count_layers(f, "decoder"),
    })
}

/// Whether `model.bin` has an output projection of its own (every Whisper
/// ties it to the token embeddings).
pub(super) fn has_own_projection(f: &ModelFile) -> bool {
    f.has("decoder/projection/weight") && !f.is_alias("decoder/projection/weight", "decoder/embeddings/weight")
}

impl Model {
    /// Builds the model from the variables of `model.bin`.
    pub fn from_file(mut f: ModelFile) -> Result<Self, EngineError> {
        let dims = dims_of(&f)?;
        let (d, vocab) = (dims.d_model, dims.vocab);
        let conv1 = conv(&mut f, "encoder/conv1", d, N_MELS)?;
        let conv2 = conv(&mut f, "encoder/conv2", d, d)?;
        let enc_pos = f.take("encoder/position_encodings/encodings", &[N_CTX, d])?;
        let (enc_layers, enc_norm, dec_layers, dec_norm) = read_layers(&mut f, &dims)?;
        let dec_pos = f.take("decoder/position_encodings/encodings", &[N_TEXT_CTX, d])?;
        let emb = f.take("decoder/embeddings/weight", &[vocab, d])?;
        // The projection is tied to the embeddings in every Whisper; a
        // separate one is used if the file has it.
        let projection = if has_own_projection(&f) {
            Some(f.take("decoder/projection/weight", &[vocab, d])?)
        } else {
            None
        };
        let embeddings = emb;
        Ok(Self {
            dims,
            conv1,
            conv2,
            enc_pos,
            enc_layers,
            enc_norm,
            embeddings,
            dec_pos,
            dec_layers,
            dec_norm,
            projection,
        })
    }

    /// The encoder's output (`N_CTX × d_model`, row-major) for a window of
    /// features (`N_MELS × N_FRAMES`, mel-major).
    pub fn encode(&self, mel: &[f32], threads: usize) -> Vec<f32> {
        let d = self.dims.d_model;
        // conv1 (k=3, padding 1) + GELU, im2col straight into packed input.
        let mut h1 = vec![0.0f32; N_FRAMES * d];
        par_rows(&mut h1, N_FRAMES, d, threads, |first, out| {
            let n = out.len() / d;
            let depth = N_MELS * 3;
            let blocks = n.div_ceil(INPUT_BLOCK);
            let mut xp = vec![0.0f32; blocks * depth * INPUT_BLOCK];
            for i in 0..n {
                let t = first + i;
                let (b, q) = (i / INPUT_BLOCK, i % INPUT_BLOCK);
                for c in 0..N_MELS {
                    for j in 0..3 {
                        let tau = t as isize + j as isize - 1;
                        if (0..N_FRAMES as isize).contains(&tau) {
                            xp[(b * depth + c * 3 + j) * INPUT_BLOCK + q] = mel[c * N_FRAMES + tau as usize];
                        }
                    }
                }
            }
            self.conv1.forward_packed(&xp, n, out);
            gelu(out);
        });
        // conv2 (k=3, stride 2, padding 1) + GELU, plus the positions.
        let mut x = vec![0.0f32; N_CTX * d];
        par_rows(&mut x, N_CTX, d, threads, |first, out| {
            let n = out.len() / d;
            let depth = d * 3;
            let blocks = n.div_ceil(INPUT_BLOCK);
            let mut xp = vec![0.0f32; blocks * depth * INPUT_BLOCK];
            for i in 0..n {
                let t = first + i;
                let (b, q) = (i / INPUT_BLOCK, i % INPUT_BLOCK);
                let block = &mut xp[b * depth * INPUT_BLOCK..(b + 1) * depth * INPUT_BLOCK];
                for j in 0..3 {
                    let tau = (2 * t + j) as isize - 1;
                    if (0..N_FRAMES as isize).contains(&tau) {
                        let src = &h1[tau as usize * d..(tau as usize + 1) * d];
                        for c in 0..d {
                            block[(c * 3 + j) * INPUT_BLOCK + q] = src[c];
                        }
                    }
                }
            }
            self.conv2.forward_packed(&xp, n, out);
            gelu(out);
            for (row, pos) in out.chunks_exact_mut(d).zip(self.enc_pos[first * d..].chunks_exact(d)) {
                for (v, p) in row.iter_mut().zip(pos) {
                    *v += p;
                }
            }
        });
        drop(h1);
        let (heads, hd) = (self.dims.heads, self.dims.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut qkv = vec![0.0f32; N_CTX * 3 * d];
        for layer in &self.enc_layers {
            // Norm and the fused projection, by rows.
            par_rows(&mut qkv, N_CTX, 3 * d, threads, |first, out| {
                let n = out.len() / (3 * d);
                let mut y = vec![0.0f32; n * d];
                layer.ln1.forward(&x[first * d..(first + n) * d], &mut y);
                layer.qkv.forward(&y, n, out, &mut Vec::new());
            });
            // Each head's keys and values, packed as the kernel's weights.
            let mut keys = Vec::with_capacity(heads);
            let mut values = Vec::with_capacity(heads);
            let mut kt = vec![0.0f32; hd * N_CTX];
            let mut vh = vec![0.0f32; N_CTX * hd];
            for h in 0..heads {
                for s in 0..N_CTX {
                    let row = &qkv[s * 3 * d..];
                    for k in 0..hd {
                        kt[k * N_CTX + s] = row[d + h * hd + k];
                    }
                    vh[s * hd..(s + 1) * hd].copy_from_slice(&row[2 * d + h * hd..2 * d + (h + 1) * hd]);
                }
                keys.push(PackedWeights::from_transposed(&kt, hd, N_CTX));
                values.push(PackedWeights::from_transposed(&vh, N_CTX, hd));
            }
            // Attention, the output projection and the feed-forward block, by rows.
            let qkv = &qkv;
            par_rows(&mut x, N_CTX, d, threads, |first, xs| {
                let n = xs.len() / d;
                let mut attn = vec![0.0f32; n * d];
                let mut q = vec![0.0f32; QUERY_BLOCK * hd];
                let mut scores = vec![0.0f32; QUERY_BLOCK * N_CTX];
                let mut head_out = vec![0.0f32; QUERY_BLOCK * hd];
                let mut xp = Vec::new();
                for h in 0..heads {
                    for b0 in (0..n).step_by(QUERY_BLOCK) {
                        let m = QUERY_BLOCK.min(n - b0);
                        for i in 0..m {
                            let row = &qkv[(first + b0 + i) * 3 * d + h * hd..][..hd];
                            for k in 0..hd {
                                q[i * hd + k] = row[k] * scale;
                            }
                        }
                        pack_rows(&q, m, hd, &mut xp);
                        keys[h].matmul_packed(&xp, m, &mut scores[..m * N_CTX]);
                        for row in scores[..m * N_CTX].chunks_exact_mut(N_CTX) {
                            softmax(row);
                        }
                        pack_rows(&scores, m, N_CTX, &mut xp);
                        values[h].matmul_packed(&xp, m, &mut head_out[..m * hd]);
                        for i in 0..m {
                            attn[(b0 + i) * d + h * hd..][..hd].copy_from_slice(&head_out[i * hd..(i + 1) * hd]);
                        }
                    }
                }
                let mut y = vec![0.0f32; n * d];
                layer.out.forward(&attn, n, &mut y, &mut xp);
                for (v, a) in xs.iter_mut().zip(&y) {
                    *v += a;
                }
                layer.ln2.forward(xs, &mut y);
                let mut hidden = vec![0.0f32; n * self.dims.ffn];
                layer.ffn1.forward(&y, n, &mut hidden, &mut xp);
                gelu(&mut hidden);
                layer.ffn2.forward(&hidden, n, &mut y, &mut xp);
                for (v, a) in xs.iter_mut().zip(&y) {
                    *v += a;
                }
            });
        }
        let mut out = vec![0.0f32; N_CTX * d];
        par_rows(&mut out, N_CTX, d, threads, |first, o| {
            let n = o.len() / d;
            self.enc_norm.forward(&x[first * d..(first + n) * d], o);
        });
        out
    }

    /// The cross-attention keys and values of every decoder layer for one
    /// encoder output.
    pub fn cross_kv(&self, enc: &[f32], threads: usize) -> CrossKv {
        let (d, heads, hd) = (self.dims.d_model, self.dims.heads, self.dims.head_dim);
        let mut layers = Vec::with_capacity(self.dec_layers.len());
        let mut kv = vec![0.0f32; N_CTX * 2 * d];
        for layer in &self.dec_layers {
            par_rows(&mut kv, N_CTX, 2 * d, threads, |first, out| {
                let n = out.len() / (2 * d);
                layer
                    .cross_kv
                    .forward(&enc[first * d..(first + n) * d], n, out, &mut Vec::new());
            });
            let mut k = vec![0.0f32; heads * N_CTX * hd];
            let mut v = vec![0.0f32; heads * N_CTX * hd];
            for s in 0..N_CTX {
                let row = &kv[s * 2 * d..(s + 1) * 2 * d];
                for h in 0..heads {
                    k[(h * N_CTX + s) * hd..][..hd].copy_from_slice(&row[h * hd..(h + 1) * hd]);
                    v[(h * N_CTX + s) * hd..][..hd].copy_from_slice(&row[d + h * hd..d + (h + 1) * hd]);
                }
            }
            layers.push((k, v));
        }
        CrossKv { layers }
    }

    /// `logits = E · x` over the vocabulary, the rows shared among threads.
    /// One vector against 80 MB of weights is bound by memory: row-major dot
    /// products beat the packed kernel here, which would do six columns'
    /// arithmetic for the one.
    fn project(&self, x: &[f32], logits: &mut [f32], threads: usize) {
        let d = self.dims.d_model;
        let vocab = self.dims.vocab;
        let weights = self.projection.as_deref().unwrap_or(&self.embeddings);
        let work = |first: usize, out: &mut [f32]| {
            let rows = weights[first * d..(first + out.len()) * d].chunks_exact(d);
            for (o, row) in out.iter_mut().zip(rows) {
                *o = dot(row, x);
            }
        };
        let threads = threads.clamp(1, 16);
        if threads == 1 {
            work(0, &mut logits[..vocab]);
            return;
        }
        let per = vocab.div_ceil(threads).div_ceil(LOGIT_ROWS) * LOGIT_ROWS;
        in_pieces(&mut logits[..vocab], per, 1, work);
    }
}

impl super::decode::Net for Model {
    type Cross = CrossKv;
    type Cache = KvCache;

    fn vocab(&self) -> usize {
        self.dims.vocab
    }

    /// A fresh self-attention cache.
    fn new_cache(&self) -> Result<KvCache, EngineError> {
        let size = self.dims.heads * N_TEXT_CTX * self.dims.head_dim;
        Ok(KvCache {
            layers: (0..self.dec_layers.len())
                .map(|_| (vec![0.0f32; size], vec![0.0f32; size]))
                .collect(),
            len: 0,
        })
    }

    /// Runs the decoder over `tokens` (appended after the `cache.len`
    /// positions already cached) and, if `logits` is given, writes the
    /// logits of the last position into it.
    fn decode(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        cross: &CrossKv,
        logits: Option<&mut [f32]>,
        threads: usize,
    ) -> Result<(), EngineError> {
        let (d, heads, hd) = (self.dims.d_model, self.dims.heads, self.dims.head_dim);
        let n = tokens.len();
        let start = cache.len;
        if n == 0 || start + n > N_TEXT_CTX {
            return Ok(());
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let mut x = vec![0.0f32; n * d];
        for (i, &t) in tokens.iter().enumerate() {
            let t = (t as usize).min(self.dims.vocab - 1);
            let emb = &self.embeddings[t * d..(t + 1) * d];
            let pos = &self.dec_pos[(start + i) * d..(start + i + 1) * d];
            for k in 0..d {
                x[i * d + k] = emb[k] + pos[k];
            }
        }
        let mut y = vec![0.0f32; n * d];
        let mut qkv = vec![0.0f32; n * 3 * d];
        let mut attn = vec![0.0f32; n * d];
        let mut q = vec![0.0f32; n * d];
        let mut hidden = vec![0.0f32; n * self.dims.ffn];
        let mut y_ffn = vec![0.0f32; n * d];
        let mut scores = vec![0.0f32; N_CTX.max(N_TEXT_CTX)];
        for (li, layer) in self.dec_layers.iter().enumerate() {
            // Self-attention over the cache and these tokens (causal).
            layer.ln1.forward(&x, &mut y);
            forward_maybe_par(&layer.qkv, &y, n, &mut qkv, threads);
            let (kc, vc) = &mut cache.layers[li];
            for i in 0..n {
                let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
                for h in 0..heads {
                    let at = (h * N_TEXT_CTX + start + i) * hd;
                    kc[at..at + hd].copy_from_slice(&row[d + h * hd..d + (h + 1) * hd]);
                    vc[at..at + hd].copy_from_slice(&row[2 * d + h * hd..2 * d + (h + 1) * hd]);
                }
            }
            attn.fill(0.0);
            for i in 0..n {
                let len = start + i + 1;
                for h in 0..heads {
                    let qh: Vec<f32> = qkv[i * 3 * d + h * hd..][..hd].iter().map(|v| v * scale).collect();
                    let keys = &kc[h * N_TEXT_CTX * hd..];
                    for s in 0..len {
                        scores[s] = dot(&qh, &keys[s * hd..(s + 1) * hd]);
                    }
                    softmax(&mut scores[..len]);
                    let values = &vc[h * N_TEXT_CTX * hd..];
                    let o = &mut attn[i * d + h * hd..][..hd];
                    for s in 0..len {
                        axpy(scores[s], &values[s * hd..(s + 1) * hd], o);
                    }
                }
            }
            forward_maybe_par(&layer.out, &attn, n, &mut y, threads);
            for (v, a) in x.iter_mut().zip(&y) {
                *v += a;
            }
            // Cross-attention over the encoder output.
            layer.ln2.forward(&x, &mut y);
            forward_maybe_par(&layer.cross_q, &y, n, &mut q, threads);
            let (ck, cv) = &cross.layers[li];
            cross_attention(&q, n, ck, cv, &self.dims, &mut attn, threads);
            forward_maybe_par(&layer.cross_out, &attn, n, &mut y, threads);
            for (v, a) in x.iter_mut().zip(&y) {
                *v += a;
            }
            // Feed-forward.
            layer.ln3.forward(&x, &mut y);
            if n == 1 && threads > 1 {
                ffn_split(&layer.ffn1, &layer.ffn2, &y, &mut hidden, &mut y_ffn, threads);
                y.copy_from_slice(&y_ffn);
            } else {
                forward_maybe_par(&layer.ffn1, &y, n, &mut hidden, threads);
                gelu(&mut hidden);
                forward_maybe_par(&layer.ffn2, &hidden, n, &mut y, threads);
            }
            for (v, a) in x.iter_mut().zip(&y) {
                *v += a;
            }
        }
        cache.len = start + n;
        if let Some(logits) = logits {
            let mut last = vec![0.0f32; d];
            self.dec_norm.forward(&x[(n - 1) * d..n * d], &mut last);
            self.project(&last, logits, threads);
        }
        Ok(())
    }
}

/// Attention of `n` query rows (`q`, `n × d_model`, unscaled) over one
/// window's cross keys and values, into `attn`; the heads shared among
/// threads.
fn cross_attention(q: &[f32], n: usize, ck: &[f32], cv: &[f32], dims: &Dims, attn: &mut [f32], threads: usize) {
    let (d, heads, hd) = (dims.d_model, dims.heads, dims.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    // Heads `hs` for all rows, into `out` (`n × hs.len()·hd`).
    let work = |hs: std::ops::Range<usize>, out: &mut [f32]| {
        let width = hs.len() * hd;
        let mut scores = vec![0.0f32; N_CTX];
        let mut qh = vec![0.0f32; hd];
        out.fill(0.0);
        for i in 0..n {
            for (g, h) in hs.clone().enumerate() {
                for (a, b) in qh.iter_mut().zip(&q[i * d + h * hd..][..hd]) {
                    *a = b * scale;
                }
                let keys = &ck[h * N_CTX * hd..(h + 1) * N_CTX * hd];
                for (s, k) in scores.iter_mut().zip(keys.chunks_exact(hd)) {
                    *s = dot(&qh, k);
                }
                softmax(&mut scores);
                let values = &cv[h * N_CTX * hd..(h + 1) * N_CTX * hd];
                let o = &mut out[i * width + g * hd..][..hd];
                for (p, v) in scores.iter().zip(values.chunks_exact(hd)) {
                    axpy(*p, v, o);
                }
            }
        }
    };
    let threads = threads.clamp(1, heads);
    if threads == 1 {
        work(0..heads, &mut attn[..n * d]);
        return;
    }
    let per = heads.div_ceil(threads);
    let groups: Vec<std::ops::Range<usize>> = (0..heads).step_by(per).map(|h| h..(h + per).min(heads)).collect();
    let mut outs: Vec<Vec<f32>> = groups.iter().map(|g| vec![0.0f32; n * g.len() * hd]).collect();
    std::thread::scope(|s| {
        let mut jobs = groups.iter().cloned().zip(outs.iter_mut());
        let first = jobs.next();
        for (g, out) in jobs {
            let work = &work;
            s.spawn(move || work(g, out));
        }
        if let Some((g, out)) = first {
            work(g, out);
        }
    });
    for (g, out) in groups.iter().zip(&outs) {
        let width = g.len() * hd;
        for i in 0..n {
            attn[i * d + g.start * hd..][..width].copy_from_slice(&out[i * width..(i + 1) * width]);
        }
    }
}

/// The feed-forward block of one row, its hidden units shared among
/// threads: each computes its units and their part of the second product,
/// and the parts are summed.
fn ffn_split(ffn1: &Linear, ffn2: &Linear, x: &[f32], hidden: &mut [f32], out: &mut [f32], threads: usize) {
    let units = ffn1.out;
    let threads = threads.clamp(1, 8);
    let per = units.div_ceil(threads);
    let mut parts: Vec<Vec<f32>> = (0..threads).map(|_| vec![0.0f32; ffn2.out]).collect();
    let work = |i: usize, h: &mut [f32], part: &mut [f32]| {
        let first_unit = i * per;
        ffn1.rows_forward(x, first_unit, h);
        gelu(h);
        ffn2.partial_forward(h, first_unit, part);
    };
    std::thread::scope(|s| {
        let mut jobs = hidden[..units].chunks_mut(per).zip(parts.iter_mut()).enumerate();
        let first = jobs.next();
        for (i, (h, part)) in jobs {
            let work = &work;
            s.spawn(move || work(i, h, part));
        }
        if let Some((i, (h, part))) = first {
            work(i, h, part);
        }
    });
    out[..ffn2.out].fill(0.0);
    for part in &parts {
        for (o, p) in out.iter_mut().zip(part) {
            *o += p;
        }
    }
    ffn2.add_bias(&mut out[..ffn2.out]);
}

/// A linear layer over `n` rows, shared among threads when there are many.
fn forward_maybe_par(layer: &Linear, x: &[f32], n: usize, out: &mut [f32], threads: usize) {
    if n < 4 * INPUT_BLOCK || threads <= 1 {
        layer.forward(x, n, out, &mut Vec::new());
        return;
    }
    par_rows(out, n, layer.out, threads, |first, o| {
        let m = o.len() / layer.out;
        layer.forward(&x[first * layer.inp..(first + m) * layer.inp], m, o, &mut Vec::new());
    });
}

/// The cross-attention keys and values of one window, by layer: each
/// `heads × N_CTX × head_dim`.
#[derive(Debug)]
pub struct CrossKv {
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

/// The decoder's self-attention keys and values, by layer: each
/// `heads × N_TEXT_CTX × head_dim`, of which `len` positions are filled.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    pub len: usize,
}
