//! The CLIP text encoder of Stable Diffusion (`CLIPTextModel`), with the
//! tensor names of `transformers` (`text_model.embeddings.token_embedding`,
//! `text_model.encoder.layers.N.self_attn.q_proj`, ...). candle's own
//! `stable_diffusion::clip::Config` has private fields, so a configuration of
//! any size is expressed here; the names and shapes it reads are checked
//! against candle's model for the full-size configurations in the tests.
//! Its dense layers are [`Dense`]: on float32 CPU weights and
//! [`Kernels::Packed`] they run on the packed product, as the UNet's do.

use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};

use crate::blocks::Kernels;
use crate::transformer::Dense;

/// The MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(1.702 x)` (OpenAI CLIP: SD 1.x, SDXL's first encoder).
    QuickGelu,
    /// GELU (OpenCLIP: SD 2.x, SDXL's second encoder).
    Gelu,
}

/// Size of a CLIP text encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipConfig {
    pub vocab_size: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub positions: usize,
    pub layers: usize,
    pub heads: usize,
    pub activation: Activation,
    /// Pad the 77 tokens with `<|endoftext|>` (SD 1.x) rather than id 0
    /// (`!`: SD 2.x, SDXL).
    pub pad_with_end: bool,
    /// The width of `text_projection` (transformers'
    /// `CLIPTextModelWithProjection`), for an encoder whose pooled output
    /// conditions the UNet (SDXL's `text_encoder_2`); `None`: no projection
    /// is read.
    pub projection: Option<usize>,
}

impl ClipConfig {
    /// openai/clip-vit-large-patch14 (SD 1.5, SDXL's `text_encoder`).
    pub fn vit_l14(pad_with_end: bool) -> Self {
        Self {
            vocab_size: 49408,
            hidden: 768,
            intermediate: 3072,
            positions: 77,
            layers: 12,
            heads: 12,
            activation: Activation::QuickGelu,
            pad_with_end,
            projection: None,
        }
    }

    /// OpenCLIP ViT-H/14, 23 of its 24 layers (SD 2.1, SD-Turbo).
    pub fn vit_h14() -> Self {
        Self {
            vocab_size: 49408,
            hidden: 1024,
            intermediate: 4096,
            positions: 77,
            layers: 23,
            heads: 16,
            activation: Activation::Gelu,
            pad_with_end: false,
            projection: None,
        }
    }

    /// OpenCLIP ViT-bigG/14 with its text projection (SDXL's
    /// `text_encoder_2`).
    pub fn vit_bigg14() -> Self {
        Self {
            vocab_size: 49408,
            hidden: 1280,
            intermediate: 5120,
            positions: 77,
            layers: 32,
            heads: 20,
            activation: Activation::Gelu,
            pad_with_end: false,
            projection: Some(1280),
        }
    }
}

struct Layer {
    q: Dense,
    k: Dense,
    v: Dense,
    out: Dense,
    ln1: LayerNorm,
    ln2: LayerNorm,
    fc1: Dense,
    fc2: Dense,
}

/// A CLIP text transformer; `forward` gives the last hidden state after the
/// final layer norm, `(batch, tokens, hidden)`, and [`Self::encode`] what
/// SDXL takes from its encoders.
pub struct ClipTextEncoder {
    config: ClipConfig,
    token_embedding: Embedding,
    position_embedding: Embedding,
    layers: Vec<Layer>,
    final_layer_norm: LayerNorm,
    text_projection: Option<Dense>,
}

/// What SDXL takes from a text encoder.
pub struct Encoded {
    /// `(batch, tokens, hidden)`: the output of the next-to-last layer,
    /// without the final layer norm (diffusers' `hidden_states[-2]`).
    pub penultimate: Tensor,
    /// `(batch, projection)`: the final hidden state at each sequence's
    /// first `<|endoftext|>` (its highest id), through `text_projection`;
    /// only for an encoder that has one.
    pub pooled: Option<Tensor>,
}

impl ClipTextEncoder {
    /// Reads the weights under `text_model.` (and `text_projection.` when
    /// the configuration has a projection), for the dense layers to run on
    /// `kernels`.
    pub fn new(vb: VarBuilder, config: &ClipConfig, kernels: Kernels) -> Result<Self> {
        let dense = |vb: VarBuilder, inp, out| Dense::new(vb, inp, out, true, kernels);
        let root = vb.clone();
        let vb = vb.pp("text_model");
        let c = config;
        let emb = vb.pp("embeddings");
        let token_embedding = candle_nn::embedding(c.vocab_size, c.hidden, emb.pp("token_embedding"))?;
        let position_embedding = candle_nn::embedding(c.positions, c.hidden, emb.pp("position_embedding"))?;
        let layers_vb = vb.pp("encoder").pp("layers");
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let l = layers_vb.pp(i.to_string());
            let attn = l.pp("self_attn");
            let mlp = l.pp("mlp");
            layers.push(Layer {
                q: dense(attn.pp("q_proj"), c.hidden, c.hidden)?,
                k: dense(attn.pp("k_proj"), c.hidden, c.hidden)?,
                v: dense(attn.pp("v_proj"), c.hidden, c.hidden)?,
                out: dense(attn.pp("out_proj"), c.hidden, c.hidden)?,
                ln1: candle_nn::layer_norm(c.hidden, 1e-5, l.pp("layer_norm1"))?,
                ln2: candle_nn::layer_norm(c.hidden, 1e-5, l.pp("layer_norm2"))?,
                fc1: dense(mlp.pp("fc1"), c.hidden, c.intermediate)?,
                fc2: dense(mlp.pp("fc2"), c.intermediate, c.hidden)?,
            });
        }
        let final_layer_norm = candle_nn::layer_norm(c.hidden, 1e-5, vb.pp("final_layer_norm"))?;
        // `text_projection` sits beside `text_model`, not inside it.
        let text_projection = match c.projection {
            Some(width) => Some(Dense::new(root.pp("text_projection"), c.hidden, width, false, kernels)?),
            None => None,
        };
        Ok(Self {
            config: config.clone(),
            token_embedding,
            position_embedding,
            layers,
            final_layer_norm,
            text_projection,
        })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// `ids`: `(batch, tokens)` of u32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let last = self.run(ids, self.layers.len())?;
        self.final_layer_norm.forward(&last)
    }

    /// The next-to-last hidden state and, for an encoder with a projection,
    /// the projected pooled output; the last layer runs only for the
    /// latter.
    pub fn encode(&self, ids: &Tensor) -> Result<Encoded> {
        let n = self.layers.len();
        let penultimate = self.run(ids, n.saturating_sub(1))?;
        let Some(projection) = &self.text_projection else {
            return Ok(Encoded {
                penultimate,
                pooled: None,
            });
        };
        let mask = causal_mask(ids.dim(1)?, ids.device(), penultimate.dtype())?;
        let last = match self.layers.last() {
            Some(layer) => self.layer(layer, &penultimate, &mask)?,
            None => penultimate.clone(),
        };
        let last = self.final_layer_norm.forward(&last)?;
        // Each sequence's first end-of-text token: the first position of its
        // highest id, as transformers picks it.
        let mut rows = Vec::new();
        for (b, sequence) in ids.to_vec2::<u32>()?.iter().enumerate() {
            let top = sequence.iter().copied().max().unwrap_or(0);
            let at = sequence.iter().position(|&id| id == top).unwrap_or(0);
            rows.push(last.get(b)?.get(at)?);
        }
        let pooled = projection.forward(&Tensor::stack(&rows, 0)?)?;
        Ok(Encoded {
            penultimate,
            pooled: Some(pooled),
        })
    }

    /// The embeddings through the first `layers` layers.
    fn run(&self, ids: &Tensor, layers: usize) -> Result<Tensor> {
        let seq = ids.dim(1)?;
        let device = ids.device();
        let positions = Tensor::arange(0u32, seq as u32, device)?.unsqueeze(0)?;
        let mut xs = self
            .token_embedding
            .forward(ids)?
            .broadcast_add(&self.position_embedding.forward(&positions)?)?;
        let mask = causal_mask(seq, device, xs.dtype())?;
        for layer in self.layers.iter().take(layers) {
            xs = self.layer(layer, &xs, &mask)?;
        }
        Ok(xs)
    }

    fn layer(&self, layer: &Layer, xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (batch, seq, _) = xs.dims3()?;
        let heads = self.config.heads;
        let head_dim = self.config.hidden / heads;
        let scale = (head_dim as f64).powf(-0.5);
        let split =
            |t: Tensor| -> Result<Tensor> { t.reshape((batch, seq, heads, head_dim))?.transpose(1, 2)?.contiguous() };
        let h = layer.ln1.forward(xs)?;
        let q = split((layer.q.forward(&h)? * scale)?)?;
        let k = split(layer.k.forward(&h)?)?;
        let v = split(layer.v.forward(&h)?)?;
        let weights = q.matmul(&k.t()?)?.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax(&weights, D::Minus1)?;
        let h = weights
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((batch, seq, self.config.hidden))?;
        let xs = (xs + layer.out.forward(&h)?)?;
        let h = layer.fc1.forward(&layer.ln2.forward(&xs)?)?;
        let h = match self.config.activation {
            Activation::QuickGelu => (&h * candle_nn::ops::sigmoid(&(&h * 1.702f64)?)?)?,
            Activation::Gelu => h.gelu_erf()?,
        };
        xs + layer.fc2.forward(&h)?
    }
}

fn causal_mask(seq: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    let mask: Vec<f32> = (0..seq)
        .flat_map(|i| (0..seq).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_slice(&mask, (seq, seq), device)?.to_dtype(dtype)
}
