//! The convolutional blocks of the UNet and the VAE decoder: resnets, down
//! and up blocks, the mid block, and the convolution they are made of.
//!
//! candle-transformers has these blocks too, but their convolutions are
//! candle's `conv2d`, which on the CPU is im2col plus a general matrix
//! product, 1.4–2.8x slower on Stable Diffusion's shapes than the packed
//! kernels of [`gantry_kernels::conv`] (`bench/results/2026-11-27-stable-diffusion.md`). Here a
//! convolution runs on those when its weights are float32 on the CPU
//! ([`Kernels::Packed`]), and on candle's everywhere else (CUDA, half
//! precision). The blocks read the diffusers tensor names, honour the
//! configured group-norm groups everywhere (candle's down and up blocks
//! always use 32), build the UNet's transformers from
//! [`crate::transformer`], and reuse candle's single-head attention for
//! the VAE.

use std::sync::Mutex;

use candle_core::{D, DType, Module, Result, Tensor};
use candle_nn::{Conv2dConfig, GroupNorm, Init, Linear, VarBuilder};
use candle_transformers::models::stable_diffusion::attention::{AttentionBlock, AttentionBlockConfig};
use gantry_kernels::conv::{Activation, Conv2d, Scratch};
use gantry_kernels::norm;
use gantry_kernels::winograd::Tile;

use crate::transformer::Transformer;
use rayon::prelude::*;

/// Which kernels a model's convolutions, dense layers and group norms run
/// on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// candle's, on every device and dtype.
    Candle,
    /// The packed ones where the weights are float32 on the CPU (3x3
    /// convolutions with padding 1 and stride 1 or 2, 1x1 convolutions,
    /// dense layers, group norm with SiLU), candle's elsewhere. The weights
    /// are read once into the packed layout; no second copy is kept.
    Packed,
}

impl Kernels {
    /// Whether weights read from `vb` go to the packed kernels.
    pub(crate) fn packs(self, vb: &VarBuilder) -> bool {
        self == Self::Packed && vb.device().is_cpu() && vb.dtype() == DType::F32
    }
}

/// A convolution with bias, on the kernels [`Conv::new`] was asked for.
pub enum Conv {
    Candle(candle_nn::Conv2d),
    Packed {
        conv: Conv2d,
        /// Reused from call to call; a caller that finds it taken (two
        /// images generated at once) works with its own.
        scratch: Mutex<Scratch>,
    },
}

impl Conv {
    /// Reads `weight` (`cout × cin × k × k`) and `bias` from `vb`.
    pub fn new(
        vb: VarBuilder,
        (cin, cout): (usize, usize),
        kernel: usize,
        stride: usize,
        padding: usize,
        kernels: Kernels,
    ) -> Result<Self> {
        let supported = (kernel == 3 && padding == 1 && (stride == 1 || stride == 2))
            || (kernel == 1 && padding == 0 && stride == 1);
        if supported && kernels.packs(&vb) {
            let weight = vb.get((cout, cin, kernel, kernel), "weight")?;
            let bias = vb.get(cout, "bias")?;
            let (weight, bias) = (weight.flatten_all()?.to_vec1::<f32>()?, bias.to_vec1::<f32>()?);
            let conv = match winograd_tile(cin, cout) {
                Some(tile) if kernel == 3 && stride == 1 => {
                    Conv2d::winograd(&weight, cin, cout, bias, Activation::Identity, tile)
                }
                _ => Conv2d::new(&weight, cin, cout, kernel, stride, bias, Activation::Identity),
            };
            return Ok(Self::Packed {
                conv,
                scratch: Mutex::new(Scratch::default()),
            });
        }
        let config = Conv2dConfig {
            padding,
            stride,
            ..Default::default()
        };
        Ok(Self::Candle(candle_nn::conv2d(cin, cout, kernel, config, vb)?))
    }
}

/// The Winograd tile a 3x3 stride-1 convolution of these channels runs
/// with on the packed kernels, if any: F(4x4) up to 512 channels in and
/// out (4x fewer multiplications for 4x the weights' memory), F(2x2) up to
/// 1280 by 640 (2.25x fewer for 1.8x the memory), and the direct product
/// for the wider layers of the UNet, whose weights are most of its memory,
/// and for inputs of fewer than 16 channels (the models' first layers).
/// The measured speeds are in `bench/results/2026-11-27-stable-diffusion.md`.
pub fn winograd_tile(cin: usize, cout: usize) -> Option<Tile> {
    if cin < 16 || !cout.is_multiple_of(8) {
        None
    } else if cin * cout <= 512 * 512 {
        Some(Tile::F4)
    } else if cin * cout <= 1280 * 640 {
        Some(Tile::F2)
    } else {
        None
    }
}

impl Module for Conv {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Self::Candle(conv) => conv.forward(xs),
            Self::Packed { conv, scratch } => {
                let (batch, channels, h, w) = xs.dims4()?;
                if channels != conv.cin() || xs.dtype() != DType::F32 {
                    candle_core::bail!(
                        "convolution of {} float32 channels given {channels} {:?} channels",
                        conv.cin(),
                        xs.dtype()
                    );
                }
                let out = with_f32_slice(xs, |x| match scratch.try_lock() {
                    Ok(mut scratch) => conv.forward_batch(x, batch, h, w, &mut scratch),
                    Err(_) => conv.forward_batch(x, batch, h, w, &mut Scratch::default()),
                })?;
                let shape = (batch, conv.cout(), conv.out_len(h), conv.out_len(w));
                Tensor::from_vec(out, shape, xs.device())
            }
        }
    }
}

/// `f` of a float32 CPU tensor's values in order, read in place when the
/// tensor is contiguous (no copy of a map that can be tens of megabytes),
/// copied otherwise.
pub(crate) fn with_f32_slice<T>(xs: &Tensor, f: impl FnOnce(&[f32]) -> T) -> Result<T> {
    if xs.is_contiguous() {
        let (storage, layout) = xs.storage_and_layout();
        if let candle_core::Storage::Cpu(cpu) = &*storage {
            let all = cpu.as_slice::<f32>()?;
            let start = layout.start_offset();
            return Ok(f(&all[start..start + xs.elem_count()]));
        }
    }
    Ok(f(&xs.flatten_all()?.to_vec1::<f32>()?))
}

/// A group norm followed by SiLU, the pair every resnet and both models'
/// output heads begin with. On float32 CPU tensors it is two vectorised
/// passes for the statistics and one for the output
/// ([`gantry_kernels::norm`]), the groups spread over the rayon pool;
/// elsewhere candle's `GroupNorm` and `silu`.
pub(crate) struct NormSilu {
    norm: GroupNorm,
    groups: usize,
    eps: f64,
    /// The affine parameters on the CPU in float32, when the norm's are.
    affine: Option<(Vec<f32>, Vec<f32>)>,
}

impl NormSilu {
    pub(crate) fn new(vb: VarBuilder, groups: usize, channels: usize, eps: f64, kernels: Kernels) -> Result<Self> {
        let affine = if kernels.packs(&vb) {
            Some((
                vb.get_with_hints(channels, "weight", Init::Const(1.0))?
                    .to_vec1::<f32>()?,
                vb.get_with_hints(channels, "bias", Init::Const(0.0))?
                    .to_vec1::<f32>()?,
            ))
        } else {
            None
        };
        Ok(Self {
            norm: candle_nn::group_norm(groups, channels, eps, vb)?,
            groups,
            eps,
            affine,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let Some((gamma, beta)) = self
            .affine
            .as_ref()
            .filter(|_| xs.dtype() == DType::F32 && xs.device().is_cpu())
        else {
            return candle_nn::ops::silu(&self.norm.forward(xs)?);
        };
        let (batch, channels, h, w) = xs.dims4()?;
        if channels != gamma.len() {
            candle_core::bail!("group norm of {} channels given {channels}", gamma.len());
        }
        let out = with_f32_slice(xs, |x| {
            let per_channel = h * w;
            let group_len = channels / self.groups * per_channel;
            let mut out = vec![0.0f32; x.len()];
            if group_len > 0 {
                out.par_chunks_mut(group_len)
                    .zip(x.par_chunks(group_len))
                    .enumerate()
                    .for_each(|(i, (out, x))| {
                        let (mean, var) = norm::moments(x);
                        let inv = 1.0 / (var + self.eps).sqrt();
                        let first = (i % self.groups) * (group_len / per_channel);
                        for (c, (out, x)) in out.chunks_mut(per_channel).zip(x.chunks(per_channel)).enumerate() {
                            let scale = (f64::from(gamma[first + c]) * inv) as f32;
                            let shift = (f64::from(beta[first + c]) - mean * f64::from(gamma[first + c]) * inv) as f32;
                            norm::affine_silu(x, scale, shift, out);
                        }
                    });
            }
            out
        })?;
        Tensor::from_vec(out, (batch, channels, h, w), xs.device())
    }
}

/// What every resnet of a model shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResnetConfig {
    /// Width of the timestep embedding (none in the VAE).
    pub temb: Option<usize>,
    pub groups: usize,
    pub eps: f64,
    /// The sum of the two paths is divided by it.
    pub scale: f64,
    pub kernels: Kernels,
}

/// diffusers' `ResnetBlock2D` (default time-embedding mode, no dropout at
/// inference).
pub(crate) struct Resnet {
    norm1: NormSilu,
    conv1: Conv,
    time_emb_proj: Option<Linear>,
    norm2: NormSilu,
    conv2: Conv,
    conv_shortcut: Option<Conv>,
    scale: f64,
}

impl Resnet {
    pub(crate) fn new(vb: VarBuilder, cin: usize, cout: usize, config: ResnetConfig) -> Result<Self> {
        let k = config.kernels;
        Ok(Self {
            norm1: NormSilu::new(vb.pp("norm1"), config.groups, cin, config.eps, k)?,
            conv1: Conv::new(vb.pp("conv1"), (cin, cout), 3, 1, 1, k)?,
            time_emb_proj: match config.temb {
                Some(temb) => Some(candle_nn::linear(temb, cout, vb.pp("time_emb_proj"))?),
                None => None,
            },
            norm2: NormSilu::new(vb.pp("norm2"), config.groups, cout, config.eps, k)?,
            conv2: Conv::new(vb.pp("conv2"), (cout, cout), 3, 1, 1, k)?,
            conv_shortcut: if cin == cout {
                None
            } else {
                Some(Conv::new(vb.pp("conv_shortcut"), (cin, cout), 1, 1, 0, k)?)
            },
            scale: config.scale,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        let shortcut = match &self.conv_shortcut {
            Some(conv) => conv.forward(xs)?,
            None => xs.clone(),
        };
        let mut h = self.conv1.forward(&self.norm1.forward(xs)?)?;
        if let (Some(temb), Some(proj)) = (temb, &self.time_emb_proj) {
            let t = proj.forward(&candle_nn::ops::silu(temb)?)?;
            h = t.unsqueeze(D::Minus1)?.unsqueeze(D::Minus1)?.broadcast_add(&h)?;
        }
        let h = self.conv2.forward(&self.norm2.forward(&h)?)?;
        let sum = (shortcut + h)?;
        if self.scale == 1.0 { Ok(sum) } else { sum / self.scale }
    }
}

/// The attention after a resnet: the UNet's spatial transformer (self- and
/// cross-attention) or the VAE's single-head self-attention.
pub(crate) enum Attention {
    Spatial(Box<Transformer>),
    Plain(AttentionBlock),
}

impl Attention {
    fn forward(&self, xs: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        match self {
            Self::Spatial(a) => a.forward(xs, context),
            Self::Plain(a) => a.forward(xs),
        }
    }
}

/// How the attentions (transformers) of a block are built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CrossAttention {
    /// Transformer layers per attention.
    pub depth: usize,
    pub heads: usize,
    pub context_dim: usize,
    pub sliced: Option<usize>,
    pub linear_projection: bool,
    pub groups: usize,
}

impl CrossAttention {
    /// The `layers` attentions of a block of `channels` (none without
    /// cross-attention).
    fn all(
        attention: Option<Self>,
        vb: &VarBuilder,
        layers: usize,
        channels: usize,
        kernels: Kernels,
    ) -> Result<Vec<Attention>> {
        match attention {
            Some(a) => (0..layers)
                .map(|i| a.build(vb.pp("attentions").pp(i), channels, kernels))
                .collect(),
            None => Ok(Vec::new()),
        }
    }

    fn build(&self, vb: VarBuilder, channels: usize, kernels: Kernels) -> Result<Attention> {
        Ok(Attention::Spatial(Box::new(Transformer::new(
            vb, channels, self, kernels,
        )?)))
    }
}

/// A down block (`DownBlock2D`, `CrossAttnDownBlock2D`, or the VAE
/// encoder's): resnets, each followed by an attention when the block has
/// them, then a stride-2 convolution unless it is the last.
pub(crate) struct DownBlock {
    resnets: Vec<Resnet>,
    attentions: Vec<Attention>,
    downsampler: Option<Conv>,
    /// diffusers' `padding = 0` downsampler: pad right and bottom by one,
    /// then convolve unpadded.
    pad_after: bool,
}

impl DownBlock {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        vb: VarBuilder,
        (cin, cout): (usize, usize),
        layers: usize,
        resnet: ResnetConfig,
        attention: Option<CrossAttention>,
        downsample_padding: Option<usize>,
    ) -> Result<Self> {
        let resnets = (0..layers)
            .map(|i| Resnet::new(vb.pp("resnets").pp(i), if i == 0 { cin } else { cout }, cout, resnet))
            .collect::<Result<Vec<_>>>()?;
        let attentions = CrossAttention::all(attention, &vb, layers, cout, resnet.kernels)?;
        let downsampler = match downsample_padding {
            Some(padding) => Some(Conv::new(
                vb.pp("downsamplers.0.conv"),
                (cout, cout),
                3,
                2,
                padding,
                resnet.kernels,
            )?),
            None => None,
        };
        Ok(Self {
            resnets,
            attentions,
            downsampler,
            pad_after: downsample_padding == Some(0),
        })
    }

    /// The block's output and the states the up path takes as skips.
    pub(crate) fn forward(
        &self,
        xs: &Tensor,
        temb: Option<&Tensor>,
        context: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut xs = xs.clone();
        let mut states = Vec::with_capacity(self.resnets.len() + 1);
        for (i, resnet) in self.resnets.iter().enumerate() {
            xs = resnet.forward(&xs, temb)?;
            if let Some(attention) = self.attentions.get(i) {
                xs = attention.forward(&xs, context)?;
            }
            states.push(xs.clone());
        }
        if let Some(conv) = &self.downsampler {
            if self.pad_after {
                xs = xs.pad_with_zeros(D::Minus1, 0, 1)?.pad_with_zeros(D::Minus2, 0, 1)?;
            }
            xs = conv.forward(&xs)?;
            states.push(xs.clone());
        }
        Ok((xs, states))
    }
}

/// An up block (`UpBlock2D`, `CrossAttnUpBlock2D`, or the VAE decoder's
/// `UpDecoderBlock2D`): resnets, each on the block's input joined with a
/// skip from the down path when there are skips, each followed by an
/// attention when the block has them, then nearest-neighbour doubling and a
/// 3x3 convolution unless it is the last.
pub(crate) struct UpBlock {
    resnets: Vec<Resnet>,
    attentions: Vec<Attention>,
    upsampler: Option<Conv>,
}

impl UpBlock {
    /// `skips[i]` is the width of the skip resnet `i` takes (empty in the
    /// VAE decoder).
    pub(crate) fn new(
        vb: VarBuilder,
        (cin, cout): (usize, usize),
        layers: usize,
        skips: &[usize],
        resnet: ResnetConfig,
        attention: Option<CrossAttention>,
        upsample: bool,
    ) -> Result<Self> {
        let resnets = (0..layers)
            .map(|i| {
                let input = if i == 0 { cin } else { cout };
                let skip = skips.get(i).copied().unwrap_or(0);
                Resnet::new(vb.pp("resnets").pp(i), input + skip, cout, resnet)
            })
            .collect::<Result<Vec<_>>>()?;
        let attentions = CrossAttention::all(attention, &vb, layers, cout, resnet.kernels)?;
        let upsampler = if upsample {
            Some(Conv::new(
                vb.pp("upsamplers.0.conv"),
                (cout, cout),
                3,
                1,
                1,
                resnet.kernels,
            )?)
        } else {
            None
        };
        Ok(Self {
            resnets,
            attentions,
            upsampler,
        })
    }

    /// How many skips the block takes.
    pub(crate) fn skips(&self) -> usize {
        self.resnets.len()
    }

    /// `skips` are taken last first; `size` is the upsampled size when it is
    /// not double the input's (a latent side that halving made odd).
    pub(crate) fn forward(
        &self,
        xs: &Tensor,
        skips: &[Tensor],
        temb: Option<&Tensor>,
        size: Option<(usize, usize)>,
        context: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut xs = xs.clone();
        for (i, resnet) in self.resnets.iter().enumerate() {
            if let Some(skip) = skips.len().checked_sub(i + 1).map(|j| &skips[j]) {
                xs = Tensor::cat(&[&xs, skip], 1)?;
            }
            xs = resnet.forward(&xs, temb)?;
            if let Some(attention) = self.attentions.get(i) {
                xs = attention.forward(&xs, context)?;
            }
        }
        if let Some(conv) = &self.upsampler {
            let (_, _, h, w) = xs.dims4()?;
            let (h, w) = size.unwrap_or((2 * h, 2 * w));
            xs = conv.forward(&xs.upsample_nearest2d(h, w)?)?;
        }
        Ok(xs)
    }
}

/// The mid block: a resnet, then attention and resnet `layers` times.
pub(crate) struct MidBlock {
    first: Resnet,
    rest: Vec<(Attention, Resnet)>,
}

impl MidBlock {
    /// The UNet's (`UNetMidBlock2DCrossAttn`, one layer).
    pub(crate) fn cross_attention(
        vb: VarBuilder,
        channels: usize,
        resnet: ResnetConfig,
        attention: CrossAttention,
    ) -> Result<Self> {
        Ok(Self {
            first: Resnet::new(vb.pp("resnets.0"), channels, channels, resnet)?,
            rest: vec![(
                attention.build(vb.pp("attentions.0"), channels, resnet.kernels)?,
                Resnet::new(vb.pp("resnets.1"), channels, channels, resnet)?,
            )],
        })
    }

    /// The VAE's (`UNetMidBlock2D`, one single-head self-attention).
    pub(crate) fn self_attention(vb: VarBuilder, channels: usize, resnet: ResnetConfig) -> Result<Self> {
        let config = AttentionBlockConfig {
            num_head_channels: None,
            num_groups: resnet.groups,
            rescale_output_factor: resnet.scale,
            eps: resnet.eps,
        };
        Ok(Self {
            first: Resnet::new(vb.pp("resnets.0"), channels, channels, resnet)?,
            rest: vec![(
                Attention::Plain(AttentionBlock::new(vb.pp("attentions.0"), channels, config)?),
                Resnet::new(vb.pp("resnets.1"), channels, channels, resnet)?,
            )],
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, temb: Option<&Tensor>, context: Option<&Tensor>) -> Result<Tensor> {
        let mut xs = self.first.forward(xs, temb)?;
        for (attention, resnet) in &self.rest {
            xs = resnet.forward(&attention.forward(&xs, context)?, temb)?;
        }
        Ok(xs)
    }
}
