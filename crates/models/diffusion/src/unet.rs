//! The denoising UNet, assembled here from [`crate::blocks`].
//!
//! candle-transformers has a `UNet2DConditionModel`, but it has no input
//! for SDXL's second conditioning: diffusers' `addition_embed_type =
//! "text_time"`, where the pooled output of the second text encoder and six
//! "time ids" (original size, crop corner, target size) go through their own
//! sinusoidal projection and MLP (`add_embedding`) and are added to the
//! timestep embedding that every resnet receives. Without it an SDXL UNet
//! is conditioned on the prompt only through cross-attention and draws
//! noticeably worse images. Its blocks also run their convolutions on
//! candle's CPU kernels only. This module owns the top level (input
//! convolution, the two embeddings, the skip connections between the down
//! and up paths, the output head), builds the blocks from this crate's, and
//! reads the same tensor names as the diffusers checkpoints.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::embeddings::{TimestepEmbedding, Timesteps};
use candle_transformers::models::stable_diffusion::unet_2d::{BlockConfig, UNet2DConditionModelConfig};

use crate::blocks::{Conv, CrossAttention, DownBlock, Kernels, MidBlock, NormSilu, ResnetConfig, UpBlock};

/// SDXL's extra conditioning (diffusers' `addition_embed_type =
/// "text_time"`): how wide the sinusoidal projection of each time id is
/// (`addition_time_embed_dim`, 256 for SDXL) and how wide the vector fed to
/// `add_embedding` is (`projection_class_embeddings_input_dim`: the pooled
/// text embedding plus six projected time ids, 1280 + 6 × 256 = 2816).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextTime {
    pub time_dim: usize,
    pub input_dim: usize,
}

impl TextTime {
    /// How many time ids a sample carries: original height and width, crop
    /// top and left, target height and width.
    pub const TIME_IDS: usize = 6;

    /// The width of the pooled text embedding this conditioning expects.
    pub fn pooled_dim(&self) -> Option<usize> {
        self.input_dim.checked_sub(Self::TIME_IDS * self.time_dim)
    }
}

/// The extra inputs of an SDXL UNet, one row per sample of the batch.
pub struct Conditioning<'a> {
    /// `(batch, pooled)`: the projected pooled output of the second text
    /// encoder.
    pub text_embeds: &'a Tensor,
    /// `(batch, 6)`: `[height, width, crop top, crop left, height, width]`
    /// in pixels.
    pub time_ids: &'a Tensor,
}

/// A diffusers `UNet2DConditionModel` with 4-channel latents.
pub struct UNet {
    conv_in: Conv,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    text_time: Option<(TextTime, Timesteps, TimestepEmbedding)>,
    down: Vec<DownBlock>,
    mid: MidBlock,
    up: Vec<UpBlock>,
    norm_out: NormSilu,
    conv_out: Conv,
    center_input: bool,
}

/// Latent channels in and out.
const LATENT_CHANNELS: usize = 4;

fn sliced(config: &UNet2DConditionModelConfig, heads: usize) -> Option<usize> {
    // As candle's model: a slice size of 0 means "half the heads".
    match config.sliced_attention_size {
        Some(0) => Some(heads / 2),
        other => other,
    }
}

/// The attentions of a block with `depth` transformer layers each.
fn cross(config: &UNet2DConditionModelConfig, block: &BlockConfig, depth: usize) -> CrossAttention {
    CrossAttention {
        depth,
        heads: block.attention_head_dim,
        context_dim: config.cross_attention_dim,
        sliced: sliced(config, block.attention_head_dim),
        linear_projection: config.use_linear_projection,
        groups: config.norm_num_groups,
    }
}

impl UNet {
    /// Reads the weights of a UNet of `config` (with SDXL's conditioning
    /// when `text_time` is set) from `vb`, under the diffusers names; its
    /// convolutions run on `kernels`.
    pub fn new(
        vb: VarBuilder,
        config: &UNet2DConditionModelConfig,
        text_time: Option<TextTime>,
        kernels: Kernels,
    ) -> Result<Self> {
        let blocks = &config.blocks;
        let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else {
            candle_core::bail!("a UNet needs at least one block");
        };
        let base = first.out_channels;
        let time_dim = base * 4;
        let conv_in = Conv::new(vb.pp("conv_in"), (LATENT_CHANNELS, base), 3, 1, 1, kernels)?;
        let time_proj = Timesteps::new(base, config.flip_sin_to_cos, config.freq_shift);
        let time_embedding = TimestepEmbedding::new(vb.pp("time_embedding"), base, time_dim)?;
        let text_time = match text_time {
            Some(tt) => Some((
                tt,
                Timesteps::new(tt.time_dim, config.flip_sin_to_cos, config.freq_shift),
                TimestepEmbedding::new(vb.pp("add_embedding"), tt.input_dim, time_dim)?,
            )),
            None => None,
        };
        let resnet = ResnetConfig {
            temb: Some(time_dim),
            groups: config.norm_num_groups,
            eps: config.norm_eps,
            scale: 1.0,
            kernels,
        };
        let attention = |block: &BlockConfig| block.use_cross_attn.map(|depth| cross(config, block, depth));

        let n = blocks.len();
        let mut down = Vec::with_capacity(n);
        for (i, block) in blocks.iter().enumerate() {
            let input = if i == 0 { base } else { blocks[i - 1].out_channels };
            down.push(DownBlock::new(
                vb.pp("down_blocks").pp(i),
                (input, block.out_channels),
                config.layers_per_block,
                resnet,
                attention(block),
                (i + 1 < n).then_some(config.downsample_padding),
            )?);
        }

        let mid_attention = cross(config, last, last.use_cross_attn.unwrap_or(1));
        let mid = MidBlock::cross_attention(
            vb.pp("mid_block"),
            last.out_channels,
            ResnetConfig {
                scale: config.mid_block_scale_factor,
                ..resnet
            },
            mid_attention,
        )?;

        // The up path mirrors the down path: up block `i` belongs to down
        // block `n - 1 - i`, takes the output of the block below it and the
        // skips of its mirror (and the first skip of the next block up).
        let mut up = Vec::with_capacity(n);
        for i in 0..n {
            let mirror = n - 1 - i;
            let block = &blocks[mirror];
            let below = if i == 0 {
                last.out_channels
            } else {
                blocks[mirror + 1].out_channels
            };
            let layers = config.layers_per_block + 1;
            let mut skips = vec![block.out_channels; layers];
            skips[layers - 1] = blocks[mirror.saturating_sub(1)].out_channels;
            up.push(UpBlock::new(
                vb.pp("up_blocks").pp(i),
                (below, block.out_channels),
                layers,
                &skips,
                resnet,
                attention(block),
                i + 1 < n,
            )?);
        }

        let norm_out = NormSilu::new(
            vb.pp("conv_norm_out"),
            config.norm_num_groups,
            base,
            config.norm_eps,
            kernels,
        )?;
        let conv_out = Conv::new(vb.pp("conv_out"), (base, LATENT_CHANNELS), 3, 1, 1, kernels)?;
        Ok(Self {
            conv_in,
            time_proj,
            time_embedding,
            text_time,
            down,
            mid,
            up,
            norm_out,
            conv_out,
            center_input: config.center_input_sample,
        })
    }

    /// Whether this UNet takes SDXL's extra conditioning, and its shape.
    pub fn text_time(&self) -> Option<TextTime> {
        self.text_time.as_ref().map(|(tt, _, _)| *tt)
    }

    /// The predicted noise for latents `xs` `(batch, 4, h, w)` at
    /// `timestep`, attending to `context` `(batch, tokens, width)`.
    /// `extra` is required exactly when the UNet was built with
    /// [`TextTime`].
    pub fn forward(&self, xs: &Tensor, timestep: f64, context: &Tensor, extra: Option<Conditioning>) -> Result<Tensor> {
        let (batch, _, height, width) = xs.dims4()?;
        let t = (Tensor::ones(batch, xs.dtype(), xs.device())? * timestep)?;
        let mut emb = self.time_embedding.forward(&self.time_proj.forward(&t)?)?;
        match (&self.text_time, extra) {
            (Some((_, proj, mlp)), Some(extra)) => {
                let ids = extra.time_ids.to_dtype(xs.dtype())?.flatten_all()?;
                let times = proj.forward(&ids)?.reshape((batch, ()))?;
                let joined = Tensor::cat(&[&extra.text_embeds.to_dtype(xs.dtype())?, &times], 1)?;
                emb = (emb + mlp.forward(&joined)?)?;
            }
            (None, None) => {}
            (Some(_), None) => candle_core::bail!("this UNet needs the pooled text embedding and the time ids (SDXL)"),
            (None, Some(_)) => candle_core::bail!("this UNet takes no pooled text embedding or time ids"),
        }

        let xs = if self.center_input {
            ((xs * 2.0)? - 1.0)?
        } else {
            xs.clone()
        };
        let mut xs = self.conv_in.forward(&xs)?;
        let mut skips = vec![xs.clone()];
        for block in &self.down {
            let (next, states) = block.forward(&xs, Some(&emb), Some(context))?;
            skips.extend(states);
            xs = next;
        }
        xs = self.mid.forward(&xs, Some(&emb), Some(context))?;

        // When the latent size is not a multiple of 2^(blocks - 1), each
        // upsampler is told the size of the skip it must meet, as diffusers
        // does (nearest-neighbour upsampling to that size).
        let factor = 1usize << (self.up.len() - 1);
        let odd = !height.is_multiple_of(factor) || !width.is_multiple_of(factor);
        let last = self.up.len() - 1;
        for (i, block) in self.up.iter().enumerate() {
            let mine = skips.split_off(skips.len() - block.skips());
            let size = match skips.last() {
                Some(next) if odd && i < last => {
                    let (_, _, h, w) = next.dims4()?;
                    Some((h, w))
                }
                _ => None,
            };
            xs = block.forward(&xs, &mine, Some(&emb), size, Some(context))?;
        }
        self.conv_out.forward(&self.norm_out.forward(&xs)?)
    }
}
