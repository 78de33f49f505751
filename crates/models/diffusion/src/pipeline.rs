//! The text-to-image pipeline: CLIP text encoder(s), UNet, scheduler, VAE
//! decoder, read from a diffusers-layout directory.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::unet_2d::{BlockConfig, UNet2DConditionModelConfig};
use candle_transformers::models::stable_diffusion::vae::AutoEncoderKLConfig;

use crate::blocks::Kernels;
use crate::clip::{ClipConfig, ClipTextEncoder};
use crate::ddim::{Ddim, Spacing};
use crate::tokenizer::Tokenizer;
use crate::unet::{Conditioning, TextTime, UNet};
use crate::vae::VaeDecoder;

/// Which Stable Diffusion family a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Stable Diffusion 1.5: CLIP ViT-L/14, DDIM, epsilon prediction.
    V1_5,
    /// SD-Turbo: the SD 2.1 architecture (OpenCLIP ViT-H/14), distilled for
    /// 1 to 4 steps without guidance; DDIM with trailing timesteps.
    Turbo,
    /// Stable Diffusion XL: two text encoders (ViT-L/14 and ViT-bigG/14,
    /// next-to-last hidden states concatenated to 2048 wide), the second
    /// one's pooled output and the image size as extra conditioning, DDIM.
    Xl,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::V1_5 => "sd-1.5",
            Variant::Turbo => "sd-turbo",
            Variant::Xl => "sdxl",
        }
    }

    /// Reads `sd-1.5`/`v1_5`, `sd-turbo`/`turbo`, `sdxl`/`xl`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().replace(['_', '.'], "-").as_str() {
            "sd-1-5" | "v1-5" | "1-5" | "sd15" => Some(Variant::V1_5),
            "sd-turbo" | "turbo" => Some(Variant::Turbo),
            "sdxl" | "xl" => Some(Variant::Xl),
            _ => None,
        }
    }

    /// Default side of the images.
    pub fn default_side(self) -> u32 {
        match self {
            Variant::V1_5 | Variant::Turbo => 512,
            Variant::Xl => 1024,
        }
    }
}

/// The shape of every component of a pipeline.
#[derive(Debug, Clone)]
pub struct Architecture {
    pub variant: Variant,
    pub clip: ClipConfig,
    pub clip2: Option<ClipConfig>,
    pub unet: UNet2DConditionModelConfig,
    /// SDXL's extra UNet conditioning (pooled text embedding and time ids).
    pub text_time: Option<TextTime>,
    pub vae: AutoEncoderKLConfig,
    /// Latents are the VAE's posterior divided by this.
    pub vae_scale: f64,
    /// Decode in float32 even when the pipeline runs in half precision
    /// (diffusers' `force_upcast`): SDXL's VAE overflows float16.
    pub vae_upcast: bool,
}

fn block(out_channels: usize, use_cross_attn: Option<usize>, attention_head_dim: usize) -> BlockConfig {
    BlockConfig {
        out_channels,
        use_cross_attn,
        attention_head_dim,
    }
}

fn unet_config(
    blocks: Vec<BlockConfig>,
    layers: usize,
    groups: usize,
    cross: usize,
    linear: bool,
) -> UNet2DConditionModelConfig {
    UNet2DConditionModelConfig {
        center_input_sample: false,
        flip_sin_to_cos: true,
        freq_shift: 0.,
        blocks,
        layers_per_block: layers,
        downsample_padding: 1,
        mid_block_scale_factor: 1.,
        norm_num_groups: groups,
        norm_eps: 1e-5,
        cross_attention_dim: cross,
        sliced_attention_size: None,
        use_linear_projection: linear,
    }
}

fn vae_config(channels: Vec<usize>, layers: usize, groups: usize) -> AutoEncoderKLConfig {
    AutoEncoderKLConfig {
        block_out_channels: channels,
        layers_per_block: layers,
        latent_channels: 4,
        norm_num_groups: groups,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

impl Architecture {
    /// The published models' configurations (the same numbers as candle's
    /// `StableDiffusionConfig::{v1_5, v2_1, sdxl}`, whose fields are private).
    pub fn full(variant: Variant) -> Self {
        match variant {
            Variant::V1_5 => Self {
                variant,
                clip: ClipConfig::vit_l14(true),
                clip2: None,
                unet: unet_config(
                    vec![
                        block(320, Some(1), 8),
                        block(640, Some(1), 8),
                        block(1280, Some(1), 8),
                        block(1280, None, 8),
                    ],
                    2,
                    32,
                    768,
                    false,
                ),
                text_time: None,
                vae: vae_config(vec![128, 256, 512, 512], 2, 32),
                vae_scale: 0.18215,
                vae_upcast: false,
            },
            Variant::Turbo => Self {
                variant,
                clip: ClipConfig::vit_h14(),
                clip2: None,
                unet: unet_config(
                    vec![
                        block(320, Some(1), 5),
                        block(640, Some(1), 10),
                        block(1280, Some(1), 20),
                        block(1280, None, 20),
                    ],
                    2,
                    32,
                    1024,
                    true,
                ),
                text_time: None,
                vae: vae_config(vec![128, 256, 512, 512], 2, 32),
                vae_scale: 0.18215,
                vae_upcast: false,
            },
            Variant::Xl => Self {
                variant,
                clip: ClipConfig::vit_l14(false),
                clip2: Some(ClipConfig::vit_bigg14()),
                unet: unet_config(
                    vec![block(320, None, 5), block(640, Some(2), 10), block(1280, Some(10), 20)],
                    2,
                    32,
                    2048,
                    true,
                ),
                // 1280 pooled + 6 time ids x 256
                text_time: Some(TextTime {
                    time_dim: 256,
                    input_dim: 2816,
                }),
                vae: vae_config(vec![128, 256, 512, 512], 2, 32),
                vae_scale: 0.13025,
                vae_upcast: true,
            },
        }
    }

    /// A tiny model of the same structure (2-layer CLIP of width 32, UNet
    /// with blocks of 32 and 64 channels, 1 layer per block, attention heads
    /// of 8, group norms of 32 groups as in the full models; a VAE of four
    /// blocks (16, 16, 32, 32 channels) so that it upsamples by 8 like the
    /// real one), for tests.
    pub fn tiny(variant: Variant) -> Self {
        let clip = |pad_with_end, activation| ClipConfig {
            vocab_size: 49408,
            hidden: 32,
            intermediate: 64,
            positions: 77,
            layers: 2,
            heads: 4,
            activation,
            pad_with_end,
            projection: None,
        };
        use crate::clip::Activation::{Gelu, QuickGelu};
        let full = Self::full(variant);
        let (clip, clip2, blocks, cross, linear) = match variant {
            Variant::V1_5 => (
                clip(true, QuickGelu),
                None,
                vec![block(32, Some(1), 8), block(64, None, 8)],
                32,
                false,
            ),
            Variant::Turbo => (
                clip(false, Gelu),
                None,
                vec![block(32, Some(1), 8), block(64, None, 8)],
                32,
                true,
            ),
            Variant::Xl => (
                clip(false, QuickGelu),
                Some(ClipConfig {
                    projection: Some(16),
                    ..clip(false, Gelu)
                }),
                vec![block(32, None, 8), block(64, Some(2), 8)],
                64,
                true,
            ),
        };
        Self {
            variant,
            clip,
            clip2,
            unet: unet_config(blocks, 1, 32, cross, linear),
            // 16 pooled + 6 time ids x 8
            text_time: full.text_time.map(|_| TextTime {
                time_dim: 8,
                input_dim: 64,
            }),
            vae: vae_config(vec![16, 16, 32, 32], 1, 8),
            vae_scale: full.vae_scale,
            vae_upcast: full.vae_upcast,
        }
    }

    /// The precision the VAE runs in, for a pipeline in `dtype`.
    pub fn vae_dtype(&self, dtype: DType) -> DType {
        if self.vae_upcast { DType::F32 } else { dtype }
    }

    fn scheduler(&self, steps: usize) -> Ddim {
        let spacing = match self.variant {
            Variant::Turbo => Spacing::Trailing,
            Variant::V1_5 | Variant::Xl => Spacing::Leading,
        };
        Ddim::new(steps, spacing)
    }
}

/// Why a pipeline could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{0}")]
    Load(String),
    #[error("{0}")]
    Candle(#[from] candle_core::Error),
    #[error("cancelled")]
    Cancelled,
}

/// What one call of [`Pipeline::generate`] makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub prompt: String,
    pub negative_prompt: String,
    pub width: u32,
    pub height: u32,
    pub num_images: usize,
    pub steps: usize,
    /// Classifier-free guidance; at 1 or below the unconditional pass is
    /// skipped.
    pub guidance_scale: f64,
    /// Image `i` starts from the noise of seed `seed + i`.
    pub seed: u64,
}

/// An RGB image, 8 bits a channel, rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// A loaded Stable Diffusion pipeline.
pub struct Pipeline {
    arch: Architecture,
    tokenizer: Tokenizer,
    clip: ClipTextEncoder,
    clip2: Option<ClipTextEncoder>,
    unet: UNet,
    vae: VaeDecoder,
    device: Device,
    dtype: DType,
}

/// The safetensors file of a component: `model.safetensors` or
/// `diffusion_pytorch_model.safetensors` (what diffusers writes), the
/// `.fp16` variants accepted too.
fn weights_file(dir: &Path, component: &str) -> Result<PathBuf, PipelineError> {
    let base = dir.join(component);
    for name in [
        "model.safetensors",
        "diffusion_pytorch_model.safetensors",
        "model.fp16.safetensors",
        "diffusion_pytorch_model.fp16.safetensors",
    ] {
        let path = base.join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    Err(PipelineError::Load(format!(
        "no safetensors weights in {}",
        base.display()
    )))
}

fn var_builder(path: &Path, dtype: DType, device: &Device) -> Result<VarBuilder<'static>, PipelineError> {
    // The workspace forbids `unsafe`, so the file is read rather than mapped;
    // tensors are copied out of the buffer as the model asks for them.
    let bytes = std::fs::read(path).map_err(|e| PipelineError::Load(format!("cannot read {}: {e}", path.display())))?;
    Ok(VarBuilder::from_buffered_safetensors(bytes, dtype, device)?)
}

/// The tokenizer of a diffusers directory: `tokenizer/vocab.json` +
/// `tokenizer/merges.txt`, or open_clip's `bpe_simple_vocab_16e6.txt.gz`
/// in the directory or its `tokenizer/`.
pub fn load_tokenizer(dir: &Path) -> Result<Tokenizer, PipelineError> {
    let tok = dir.join("tokenizer");
    if tok.join("vocab.json").is_file() && tok.join("merges.txt").is_file() {
        return Tokenizer::from_vocab_and_merges(&tok.join("vocab.json"), &tok.join("merges.txt"))
            .map_err(PipelineError::Load);
    }
    for path in [
        dir.join("bpe_simple_vocab_16e6.txt.gz"),
        tok.join("bpe_simple_vocab_16e6.txt.gz"),
    ] {
        if path.is_file() {
            return Tokenizer::from_bpe_file(&path).map_err(PipelineError::Load);
        }
    }
    Err(PipelineError::Load(format!(
        "no tokenizer in {} (tokenizer/vocab.json and tokenizer/merges.txt)",
        dir.display()
    )))
}

impl Pipeline {
    /// Loads the published model of `variant` from a diffusers directory.
    pub fn load(dir: &Path, variant: Variant, device: &Device, dtype: DType) -> Result<Self, PipelineError> {
        Self::load_with(dir, Architecture::full(variant), device, dtype)
    }

    /// Loads a model of the given architecture from a diffusers directory.
    pub fn load_with(dir: &Path, arch: Architecture, device: &Device, dtype: DType) -> Result<Self, PipelineError> {
        let tokenizer = load_tokenizer(dir)?;
        let clip = ClipTextEncoder::new(
            var_builder(&weights_file(dir, "text_encoder")?, dtype, device)?,
            &arch.clip,
            Kernels::Packed,
        )?;
        let clip2 = match &arch.clip2 {
            Some(config) => Some(ClipTextEncoder::new(
                var_builder(&weights_file(dir, "text_encoder_2")?, dtype, device)?,
                config,
                Kernels::Packed,
            )?),
            None => None,
        };
        // Float32 on the CPU runs the convolutions on the packed kernels;
        // everything else on candle's.
        let unet = UNet::new(
            var_builder(&weights_file(dir, "unet")?, dtype, device)?,
            &arch.unet,
            arch.text_time,
            Kernels::Packed,
        )?;
        let vae = VaeDecoder::new(
            var_builder(&weights_file(dir, "vae")?, arch.vae_dtype(dtype), device)?,
            &arch.vae,
            Kernels::Packed,
        )?;
        Ok(Self {
            arch,
            tokenizer,
            clip,
            clip2,
            unet,
            vae,
            device: device.clone(),
            dtype,
        })
    }

    pub fn architecture(&self) -> &Architecture {
        &self.arch
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The token ids `encoder` reads for `text`, `(1, 77)`.
    fn ids(&self, encoder: &ClipTextEncoder, text: &str) -> Result<Tensor, PipelineError> {
        let pad = if encoder.config().pad_with_end {
            self.tokenizer.end_token()
        } else {
            0
        };
        let ids = self.tokenizer.encode_padded(text, pad);
        Ok(Tensor::new(ids.as_slice(), &self.device)?.unsqueeze(0)?)
    }

    /// What conditions the UNet on `text`: `(1, 77, width)`, the hidden
    /// states of every text encoder concatenated, and for SDXL the second
    /// encoder's projected pooled output `(1, pooled)`.
    ///
    /// SD 1.5 and SD-Turbo take each encoder's last hidden state after its
    /// final layer norm; SDXL takes the next-to-last layer's output, as
    /// diffusers' SDXL pipeline does.
    fn embed(&self, text: &str) -> Result<(Tensor, Option<Tensor>), PipelineError> {
        let encoders = std::iter::once(&self.clip).chain(self.clip2.as_ref());
        if self.arch.text_time.is_none() {
            let parts = encoders
                .map(|encoder| Ok(encoder.forward(&self.ids(encoder, text)?)?))
                .collect::<Result<Vec<_>, PipelineError>>()?;
            return Ok((Tensor::cat(&parts, 2)?, None));
        }
        let mut parts = Vec::new();
        let mut pooled = None;
        for encoder in encoders {
            let encoded = encoder.encode(&self.ids(encoder, text)?)?;
            parts.push(encoded.penultimate);
            pooled = encoded.pooled.or(pooled);
        }
        let pooled = pooled.ok_or_else(|| {
            PipelineError::Load("SDXL needs a text encoder with a text projection (text_encoder_2)".into())
        })?;
        Ok((Tensor::cat(&parts, 2)?, Some(pooled)))
    }

    /// The negative side of classifier-free guidance, given the prompt's
    /// own embeddings. SDXL, like diffusers' pipeline with
    /// `force_zeros_for_empty_prompt` (the SDXL base default), uses zeros of
    /// their shapes when there is no negative prompt, and encodes nothing.
    fn embed_negative(
        &self,
        text: &str,
        cond: &Tensor,
        cond_pooled: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>), PipelineError> {
        if self.arch.text_time.is_some() && text.is_empty() {
            return Ok((cond.zeros_like()?, cond_pooled.map(Tensor::zeros_like).transpose()?));
        }
        self.embed(text)
    }

    /// Runs the pipeline. The images are made one after the other, and
    /// `progress(k, n)` is called after each of the `n = steps × images`
    /// denoising steps; `ControlFlow::Break` stops with
    /// [`PipelineError::Cancelled`].
    pub fn generate(
        &self,
        params: &Params,
        progress: impl FnMut(usize, usize) -> ControlFlow<()>,
    ) -> Result<Vec<RgbImage>, PipelineError> {
        let values = 4 * (params.height as usize / 8) * (params.width as usize / 8);
        let noise = (0..params.num_images.max(1) as u64)
            .map(|i| {
                let mut normal = gantry_kernels::random::Normal::new(params.seed.wrapping_add(i));
                (0..values).map(|_| normal.next()).collect()
            })
            .collect::<Vec<_>>();
        self.generate_from_noise(params, &noise, progress)
    }

    /// [`Self::generate`] from given starting noise rather than the seed's:
    /// one image per entry of `noise`, each `4 × height/8 × width/8` values
    /// (channel, row, column), `params.num_images` and `params.seed`
    /// unused. What diffusers' pipelines do with `latents=`.
    pub fn generate_from_noise(
        &self,
        params: &Params,
        noise: &[Vec<f32>],
        mut progress: impl FnMut(usize, usize) -> ControlFlow<()>,
    ) -> Result<Vec<RgbImage>, PipelineError> {
        if !params.width.is_multiple_of(8)
            || !params.height.is_multiple_of(8)
            || params.width == 0
            || params.height == 0
        {
            return Err(PipelineError::Load(
                "width and height must be positive multiples of 8".into(),
            ));
        }
        let n = noise.len();
        let guided = params.guidance_scale > 1.0;
        let started = Instant::now();
        let (cond, cond_pooled) = self.embed(&params.prompt)?;
        let (context, pooled) = if guided {
            let (uncond, uncond_pooled) = self.embed_negative(&params.negative_prompt, &cond, cond_pooled.as_ref())?;
            let pooled = match (uncond_pooled, cond_pooled) {
                (Some(u), Some(c)) => Some(Tensor::cat(&[u, c], 0)?),
                _ => None,
            };
            (Tensor::cat(&[uncond, cond], 0)?, pooled)
        } else {
            (cond, cond_pooled)
        };
        let context = context.to_dtype(self.dtype)?;
        // SDXL's size conditioning: the image was neither resized nor
        // cropped, and is wanted at the size requested.
        let extra = match pooled {
            Some(pooled) => {
                let (h, w) = (params.height as f32, params.width as f32);
                let rows = pooled.dim(0)?;
                let ids: Vec<f32> = (0..rows).flat_map(|_| [h, w, 0., 0., h, w]).collect();
                let ids = Tensor::from_vec(ids, (rows, TextTime::TIME_IDS), &self.device)?;
                Some((pooled.to_dtype(self.dtype)?, ids.to_dtype(self.dtype)?))
            }
            None => None,
        };
        let (lh, lw) = (params.height as usize / 8, params.width as usize / 8);
        if let Some(bad) = noise.iter().find(|n| n.len() != 4 * lh * lw) {
            return Err(PipelineError::Load(format!(
                "starting noise of {} values for latents of 4 x {lh} x {lw}",
                bad.len()
            )));
        }
        tracing::debug!(ms = ms(started), "prompt encoded");
        let mut images = Vec::with_capacity(n);
        // One image at a time: image `i` is exactly the one-image result of
        // its own noise (a batch would change the arithmetic slightly).
        let per_image = params.steps.max(1);
        let total = per_image * n;
        for (i, noise) in noise.iter().enumerate() {
            let noise = Tensor::from_slice(noise, (1, 4, lh, lw), &self.device)?;
            let latents = self.denoise(params, &context, extra.as_ref(), guided, noise, |k| {
                progress(i * per_image + k, total)
            })?;
            let started = Instant::now();
            images.push(self.decode(&latents)?);
            tracing::debug!(ms = ms(started), image = i, "latents decoded");
        }
        Ok(images)
    }

    /// The denoising loop for one image from `noise` `(1, 4, h, w)`;
    /// `progress(k)` after step `k`.
    fn denoise(
        &self,
        params: &Params,
        context: &Tensor,
        extra: Option<&(Tensor, Tensor)>,
        guided: bool,
        noise: Tensor,
        mut progress: impl FnMut(usize) -> ControlFlow<()>,
    ) -> Result<Tensor, PipelineError> {
        // DDIM starts from the noise itself (its initial sigma is 1) and
        // does not scale the UNet's input.
        let scheduler = self.arch.scheduler(params.steps.max(1));
        let mut latents = noise.to_dtype(self.dtype)?;
        let timesteps = scheduler.timesteps().to_vec();
        for (k, &t) in timesteps.iter().enumerate() {
            let started = Instant::now();
            let input = if guided {
                Tensor::cat(&[&latents, &latents], 0)?
            } else {
                latents.clone()
            };
            let conditioning = extra.map(|(text_embeds, time_ids)| Conditioning { text_embeds, time_ids });
            let predicted = self.unet.forward(&input, t as f64, context, conditioning)?;
            let predicted = if guided {
                let uncond = predicted.narrow(0, 0, 1)?;
                let cond = predicted.narrow(0, 1, 1)?;
                (&uncond + ((cond - &uncond)? * params.guidance_scale)?)?
            } else {
                predicted
            };
            latents = scheduler.step(&predicted, t, &latents)?;
            tracing::debug!(ms = ms(started), step = k + 1, "denoising step");
            if progress(k + 1).is_break() {
                return Err(PipelineError::Cancelled);
            }
        }
        Ok(latents)
    }

    fn decode(&self, latents: &Tensor) -> Result<RgbImage, PipelineError> {
        let latents = latents.to_dtype(self.arch.vae_dtype(self.dtype))?;
        let decoded = self.vae.decode(&(latents / self.arch.vae_scale)?)?;
        let pixels = ((decoded.to_dtype(DType::F32)? / 2.0)? + 0.5)?
            .clamp(0f32, 1f32)?
            .affine(255.0, 0.5)?
            .clamp(0f32, 255f32)?
            .to_dtype(DType::U8)?
            .permute((0, 2, 3, 1))?
            .contiguous()?;
        let (_, h, w, _) = pixels.dims4()?;
        Ok(RgbImage {
            width: w as u32,
            height: h as u32,
            pixels: pixels.flatten_all()?.to_vec1::<u8>()?,
        })
    }
}

/// Milliseconds since `started`, for the debug log of where a generation's
/// time goes (`RUST_LOG=gantry_model_diffusion=debug`).
fn ms(started: Instant) -> u64 {
    started.elapsed().as_millis() as u64
}
