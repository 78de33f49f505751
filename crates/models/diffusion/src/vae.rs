//! The VAE decoder of diffusers' `AutoencoderKL`: latents to pixels. Only
//! the decoder (and `post_quant_conv`) is read; text-to-image never encodes.
//! At 512x512 it is about 1.2 T multiply-adds of 3x3 convolutions, most of
//! a CPU image's fixed cost, so it is built from [`crate::blocks`].

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::vae::AutoEncoderKLConfig;

use crate::blocks::{Conv, Kernels, MidBlock, NormSilu, ResnetConfig, UpBlock};

/// The VAE's group norms and resnets use this epsilon.
const EPS: f64 = 1e-6;
/// RGB.
const IMAGE_CHANNELS: usize = 3;

pub struct VaeDecoder {
    post_quant_conv: Option<Conv>,
    conv_in: Conv,
    mid: MidBlock,
    up: Vec<UpBlock>,
    norm_out: NormSilu,
    conv_out: Conv,
}

impl VaeDecoder {
    /// Reads `post_quant_conv` and `decoder.*` from the weights of a whole
    /// `AutoencoderKL`.
    pub fn new(vb: VarBuilder, config: &AutoEncoderKLConfig, kernels: Kernels) -> Result<Self> {
        let channels = &config.block_out_channels;
        let (Some(&first), Some(&last)) = (channels.first(), channels.last()) else {
            candle_core::bail!("a VAE needs at least one block");
        };
        let latent = config.latent_channels;
        let post_quant_conv = if config.use_post_quant_conv {
            Some(Conv::new(vb.pp("post_quant_conv"), (latent, latent), 1, 1, 0, kernels)?)
        } else {
            None
        };
        let vb = vb.pp("decoder");
        let resnet = ResnetConfig {
            temb: None,
            groups: config.norm_num_groups,
            eps: EPS,
            scale: 1.0,
            kernels,
        };
        let conv_in = Conv::new(vb.pp("conv_in"), (latent, last), 3, 1, 1, kernels)?;
        let mid = MidBlock::self_attention(vb.pp("mid_block"), last, resnet)?;
        let reversed: Vec<usize> = channels.iter().rev().copied().collect();
        let up = reversed
            .iter()
            .enumerate()
            .map(|(i, &cout)| {
                let cin = if i == 0 { cout } else { reversed[i - 1] };
                UpBlock::new(
                    vb.pp("up_blocks").pp(i),
                    (cin, cout),
                    config.layers_per_block + 1,
                    &[],
                    resnet,
                    None,
                    i + 1 < reversed.len(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let norm_out = NormSilu::new(vb.pp("conv_norm_out"), config.norm_num_groups, first, EPS, kernels)?;
        let conv_out = Conv::new(vb.pp("conv_out"), (first, IMAGE_CHANNELS), 3, 1, 1, kernels)?;
        Ok(Self {
            post_quant_conv,
            conv_in,
            mid,
            up,
            norm_out,
            conv_out,
        })
    }

    /// Latents (already divided by the scaling factor), `(batch, latent,
    /// h, w)`, to images `(batch, 3, 8h, 8w)` in about −1..1.
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor> {
        let xs = match &self.post_quant_conv {
            Some(conv) => conv.forward(latents)?,
            None => latents.clone(),
        };
        let mut xs = self.mid.forward(&self.conv_in.forward(&xs)?, None, None)?;
        for block in &self.up {
            xs = block.forward(&xs, &[], None, None, None)?;
        }
        self.conv_out.forward(&self.norm_out.forward(&xs)?)
    }
}
