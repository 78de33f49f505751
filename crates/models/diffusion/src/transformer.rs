//! The UNet's transformer (diffusers' `Transformer2DModel`): group norm,
//! projection in, transformer blocks of self-attention, cross-attention to
//! the text and a GEGLU feed-forward, projection out, residual. The same
//! arithmetic as candle-transformers' `SpatialTransformer` (its tanh GELU
//! included), but every dense layer is a [`Dense`], which runs on the
//! packed product of `gantry_kernels` when the weights are float32 on
//! the CPU: the dense layers are most of the transformer's work (at a
//! 32x32 latent about 1.3 G multiply-adds a block against 0.7 G for the
//! attention itself). On the same weights the attention is fused onto the
//! packed product too (`Attention::attend_packed`), and the feed-forward's
//! gate is one vectorised pass.

use candle_core::{D, DType, IndexOp, Module, Result, Tensor};
use candle_nn::{GroupNorm, LayerNorm, VarBuilder};
use gantry_kernels::norm;
use gantry_kernels::packed::{INPUT_BLOCK, PackedWeights, pack_rows};
use rayon::prelude::*;

use crate::blocks::{Conv, CrossAttention, Kernels};

/// A dense layer, `y = x·Wᵀ + b` over the last dimension.
pub enum Dense {
    Candle(candle_nn::Linear),
    Packed {
        w: PackedWeights,
        bias: Option<Vec<f32>>,
        inp: usize,
        out: usize,
    },
}

impl Dense {
    /// Reads `weight` (`out × inp`) and, when `bias`, `bias` from `vb`.
    pub fn new(vb: VarBuilder, inp: usize, out: usize, bias: bool, kernels: Kernels) -> Result<Self> {
        if kernels.packs(&vb) {
            let w = vb.get((out, inp), "weight")?.flatten_all()?.to_vec1::<f32>()?;
            let bias = if bias {
                Some(vb.get(out, "bias")?.to_vec1::<f32>()?)
            } else {
                None
            };
            return Ok(Self::Packed {
                w: PackedWeights::from_rows(&w, out, inp),
                bias,
                inp,
                out,
            });
        }
        Ok(Self::Candle(if bias {
            candle_nn::linear(inp, out, vb)?
        } else {
            candle_nn::linear_no_bias(inp, out, vb)?
        }))
    }
}

impl Module for Dense {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (w, bias, inp, out) = match self {
            Self::Candle(linear) => return linear.forward(xs),
            Self::Packed { w, bias, inp, out } => (w, bias, *inp, *out),
        };
        if xs.dim(D::Minus1)? != inp || xs.dtype() != DType::F32 {
            candle_core::bail!(
                "dense layer of {inp} float32 inputs given {:?} {:?}",
                xs.dims(),
                xs.dtype()
            );
        }
        let y = crate::blocks::with_f32_slice(xs, |x| {
            let n = x.len() / inp;
            let mut y = vec![0.0f32; n * out];
            // Rows split between the threads in whole input blocks.
            let threads = rayon::current_num_threads().max(1);
            let per = n.div_ceil(threads).div_ceil(INPUT_BLOCK).max(1) * INPUT_BLOCK;
            if n > 0 && out > 0 {
                y.par_chunks_mut(per * out)
                    .zip(x.par_chunks(per * inp))
                    .for_each(|(y, x)| {
                        let m = x.len() / inp;
                        let mut xp = Vec::new();
                        pack_rows(x, m, inp, &mut xp);
                        w.matmul_packed(&xp, m, y);
                        if let Some(b) = bias {
                            for row in y.chunks_exact_mut(out) {
                                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                            }
                        }
                    });
            }
            y
        })?;
        let mut dims = xs.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = out;
        }
        Tensor::from_vec(y, dims, xs.device())
    }
}

/// Multi-head attention of `xs` to itself or to a context.
struct Attention {
    to_q: Dense,
    to_k: Dense,
    to_v: Dense,
    to_out: Dense,
    heads: usize,
    scale: f64,
    sliced: Option<usize>,
}

impl Attention {
    fn new(
        vb: VarBuilder,
        dim: usize,
        context: usize,
        heads: usize,
        sliced: Option<usize>,
        k: Kernels,
    ) -> Result<Self> {
        let head = dim / heads;
        Ok(Self {
            to_q: Dense::new(vb.pp("to_q"), dim, dim, false, k)?,
            to_k: Dense::new(vb.pp("to_k"), context, dim, false, k)?,
            to_v: Dense::new(vb.pp("to_v"), context, dim, false, k)?,
            to_out: Dense::new(vb.pp("to_out.0"), dim, dim, true, k)?,
            heads,
            scale: 1.0 / (head as f64).sqrt(),
            sliced,
        })
    }

    /// `(batch, tokens, dim)` to `(batch · heads, tokens, dim / heads)`.
    fn split(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, t, d) = xs.dims3()?;
        xs.reshape((b, t, self.heads, d / self.heads))?
            .transpose(1, 2)?
            .reshape((b * self.heads, t, d / self.heads))
    }

    fn forward(&self, xs: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let context = context.unwrap_or(xs).contiguous()?;
        if xs.dtype() == DType::F32 && xs.device().is_cpu() && matches!(self.to_q, Dense::Packed { .. }) {
            let q = self.to_q.forward(xs)?;
            let (k, v) = (self.to_k.forward(&context)?, self.to_v.forward(&context)?);
            return self.to_out.forward(&self.attend_packed(&q, &k, &v)?);
        }
        let q = self.split(&self.to_q.forward(xs)?)?.to_dtype(DType::F32)?;
        let k = self.split(&self.to_k.forward(&context)?)?.to_dtype(DType::F32)?;
        let v = self.split(&self.to_v.forward(&context)?)?.to_dtype(DType::F32)?;
        let rows = q.dim(0)?;
        let attend = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
            let scores = q.matmul(&(k.t()? * self.scale)?)?;
            candle_nn::ops::softmax_last_dim(&scores)?.matmul(v)
        };
        // Sliced attention: `s` rows of heads at a time (the last slice may
        // be shorter), which bounds the score matrices' memory.
        let out = match self.sliced.filter(|&s| s > 0 && rows > s) {
            Some(s) => {
                let parts = (0..rows)
                    .step_by(s)
                    .map(|start| {
                        let r = start..(start + s).min(rows);
                        attend(&q.i(r.clone())?, &k.i(r.clone())?, &v.i(r)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&parts, 0)?
            }
            None => attend(&q, &k, &v)?,
        }
        .to_dtype(xs.dtype())?;
        let (bh, t, d) = out.dims3()?;
        let out = out
            .reshape((bh / self.heads, self.heads, t, d))?
            .transpose(1, 2)?
            .reshape((bh / self.heads, t, d * self.heads))?;
        self.to_out.forward(&out)
    }
}

impl Attention {
    /// Multi-head attention of float32 CPU tensors `q` `(batch, tq, dim)`
    /// and `k`, `v` `(batch, tk, dim)`, fused: each thread takes a band of
    /// query rows and, head by head, multiplies them by the head's keys on
    /// the packed product, takes the softmax of each row of scores, and
    /// multiplies by the head's values into its columns of the output. No
    /// head is split out or merged back, and the scores of a band are all
    /// that is held. (Sliced attention is a memory bound for the unfused
    /// path; the bands bound it here.)
    fn attend_packed(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (batch, tq, dim) = q.dims3()?;
        let tk = k.dim(1)?;
        let (heads, hd) = (self.heads, dim / self.heads);
        if batch * tq * tk * hd == 0 {
            return Tensor::zeros((batch, tq, dim), DType::F32, q.device());
        }
        let scale = self.scale as f32;
        let k = k.flatten_all()?.to_vec1::<f32>()?;
        let v = v.flatten_all()?.to_vec1::<f32>()?;
        let threads = rayon::current_num_threads().max(1);
        let band = tq.div_ceil(threads).max(1);
        let out = crate::blocks::with_f32_slice(q, |q| {
            let mut out = vec![0.0f32; batch * tq * dim];
            // Tasks: (image, a band of its query rows, their output rows).
            let mut tasks = Vec::new();
            for (b, (out, q)) in out.chunks_mut(tq * dim).zip(q.chunks(tq * dim)).enumerate() {
                for (out, q) in out.chunks_mut(band * dim).zip(q.chunks(band * dim)) {
                    tasks.push((b, out, q));
                }
            }
            tasks.into_par_iter().for_each(|(b, out, q)| {
                let rows = q.len() / dim;
                let (keys, values) = (&k[b * tk * dim..][..tk * dim], &v[b * tk * dim..][..tk * dim]);
                let mut qh = vec![0.0f32; rows * hd];
                let mut kh = vec![0.0f32; tk * hd];
                let mut vt = vec![0.0f32; hd * tk];
                let mut scores = vec![0.0f32; rows * tk];
                let mut oh = vec![0.0f32; rows * hd];
                for h in 0..heads {
                    let cols = h * hd..(h + 1) * hd;
                    for (dst, src) in qh.chunks_exact_mut(hd).zip(q.chunks_exact(dim)) {
                        dst.copy_from_slice(&src[cols.clone()]);
                    }
                    for (dst, src) in kh.chunks_exact_mut(hd).zip(keys.chunks_exact(dim)) {
                        dst.copy_from_slice(&src[cols.clone()]);
                    }
                    for (j, src) in values.chunks_exact(dim).enumerate() {
                        for (c, x) in src[cols.clone()].iter().enumerate() {
                            vt[c * tk + j] = *x;
                        }
                    }
                    PackedWeights::from_rows(&kh, tk, hd).matmul_rows(&qh, rows, &mut scores);
                    norm::softmax_rows(&mut scores, tk, scale);
                    PackedWeights::from_rows(&vt, hd, tk).matmul_rows(&scores, rows, &mut oh);
                    for (dst, src) in out.chunks_exact_mut(dim).zip(oh.chunks_exact(hd)) {
                        dst[cols.clone()].copy_from_slice(src);
                    }
                }
            });
            out
        })?;
        Tensor::from_vec(out, (batch, tq, dim), q.device())
    }
}

/// Self-attention, cross-attention and the GEGLU feed-forward, each after a
/// layer norm and added to its input.
struct Block {
    norm1: LayerNorm,
    attn1: Attention,
    norm2: LayerNorm,
    attn2: Attention,
    norm3: LayerNorm,
    /// `dim → 2 · 4 · dim`: the hidden half and the gate half.
    ff_in: Dense,
    ff_out: Dense,
}

impl Block {
    fn new(
        vb: VarBuilder,
        dim: usize,
        heads: usize,
        context: usize,
        sliced: Option<usize>,
        k: Kernels,
    ) -> Result<Self> {
        let inner = 4 * dim;
        Ok(Self {
            norm1: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm1"))?,
            attn1: Attention::new(vb.pp("attn1"), dim, dim, heads, sliced, k)?,
            norm2: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm2"))?,
            attn2: Attention::new(vb.pp("attn2"), dim, context, heads, sliced, k)?,
            norm3: candle_nn::layer_norm(dim, 1e-5, vb.pp("norm3"))?,
            ff_in: Dense::new(vb.pp("ff.net.0.proj"), dim, 2 * inner, true, k)?,
            ff_out: Dense::new(vb.pp("ff.net.2"), inner, dim, true, k)?,
        })
    }

    fn forward(&self, xs: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let xs = (self.attn1.forward(&self.norm1.forward(xs)?, None)? + xs)?;
        let xs = (self.attn2.forward(&self.norm2.forward(&xs)?, context)? + xs)?;
        let gated = geglu(&self.ff_in.forward(&self.norm3.forward(&xs)?)?)?;
        self.ff_out.forward(&gated)? + xs
    }
}

/// The feed-forward's gate: the last dimension's first half times GELU of
/// its second half, with candle's GELU (the tanh approximation, where
/// diffusers' is exact); one vectorised pass over float32 CPU tensors, the
/// rows split between the threads, candle's operations elsewhere.
fn geglu(x: &Tensor) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let last = dims.last().copied().unwrap_or(0);
    if x.dtype() != DType::F32 || !x.device().is_cpu() || last == 0 || last % 2 != 0 {
        let halves = x.chunk(2, D::Minus1)?;
        return &halves[0] * halves[1].gelu()?;
    }
    let inner = last / 2;
    let out = crate::blocks::with_f32_slice(x, |x| {
        let mut out = vec![0.0f32; x.len() / 2];
        let rows = (x.len() / last).div_ceil(rayon::current_num_threads().max(1)).max(1);
        out.par_chunks_mut(rows * inner)
            .zip(x.par_chunks(rows * last))
            .for_each(|(out, x)| norm::geglu_tanh(x, inner, out));
        out
    })?;
    if let Some(d) = dims.last_mut() {
        *d = inner;
    }
    Tensor::from_vec(out, dims, x.device())
}

enum Projection {
    Conv(Conv),
    Dense(Dense),
}

/// diffusers' `Transformer2DModel` over a `(batch, channels, h, w)` map.
pub(crate) struct Transformer {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<Block>,
    proj_out: Projection,
}

impl Transformer {
    pub(crate) fn new(vb: VarBuilder, channels: usize, config: &CrossAttention, k: Kernels) -> Result<Self> {
        let projection = |name: &str, inp: usize, out: usize| -> Result<Projection> {
            Ok(if config.linear_projection {
                Projection::Dense(Dense::new(vb.pp(name), inp, out, true, k)?)
            } else {
                Projection::Conv(Conv::new(vb.pp(name), (inp, out), 1, 1, 0, k)?)
            })
        };
        Ok(Self {
            norm: candle_nn::group_norm(config.groups, channels, 1e-6, vb.pp("norm"))?,
            proj_in: projection("proj_in", channels, channels)?,
            blocks: (0..config.depth)
                .map(|i| {
                    Block::new(
                        vb.pp("transformer_blocks").pp(i),
                        channels,
                        config.heads,
                        config.context_dim,
                        config.sliced,
                        k,
                    )
                })
                .collect::<Result<Vec<_>>>()?,
            proj_out: projection("proj_out", channels, channels)?,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let (b, c, h, w) = xs.dims4()?;
        let normed = self.norm.forward(xs)?;
        // To tokens, `(batch, h · w, channels)`, before or after projecting.
        let tokens = |t: &Tensor| t.flatten_from(2)?.transpose(1, 2)?.contiguous();
        let mut hidden = match &self.proj_in {
            Projection::Conv(conv) => tokens(&conv.forward(&normed)?)?,
            Projection::Dense(dense) => dense.forward(&tokens(&normed)?)?,
        };
        for block in &self.blocks {
            hidden = block.forward(&hidden, context)?;
        }
        let map = |t: &Tensor| t.transpose(1, 2)?.reshape((b, c, h, w));
        let out = match &self.proj_out {
            Projection::Conv(conv) => conv.forward(&map(&hidden)?.contiguous()?)?,
            Projection::Dense(dense) => map(&dense.forward(&hidden)?)?,
        };
        out + xs
    }
}
