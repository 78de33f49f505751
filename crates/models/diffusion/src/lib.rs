//! Text-to-image with Stable Diffusion on candle.
//!
//! A model is a diffusers-layout directory: `tokenizer/` (`vocab.json`,
//! `merges.txt`), `text_encoder/model.safetensors` (and `text_encoder_2/` for
//! SDXL), `unet/diffusion_pytorch_model.safetensors` and
//! `vae/diffusion_pytorch_model.safetensors`. The prompt (and the negative
//! prompt, for classifier-free guidance) is tokenised with CLIP's BPE
//! ([`tokenizer`]), encoded by the CLIP text encoder(s) ([`clip`]), and the
//! UNet ([`unet`], with SDXL's extra conditioning) denoises latents drawn
//! from the seed with DDIM ([`ddim`]) for the requested number of steps;
//! the VAE decodes them to RGB ([`pipeline`]).
//!
//! The same seed gives the same bytes on the same machine: image `i` of a
//! job with seed `s` starts from latents drawn from `s + i` with a portable
//! generator (SplitMix64 and Box-Muller), and DDIM (eta 0) adds no noise of
//! its own. Usage is the delivered pixels, in megapixels.

pub mod blocks;
pub mod clip;
pub mod config;
pub mod ddim;
mod factory;
pub mod input;
pub mod pipeline;
pub mod tiny;
pub mod tokenizer;
pub mod transformer;
pub mod unet;
pub mod vae;

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};

pub use factory::{DiffusionFactory, DiffusionSettings};
use input::{Format, Request};
pub use pipeline::{Architecture, Params, Pipeline, PipelineError, RgbImage, Variant};

/// Where and how a model runs.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// CUDA device ordinal (needs the `cuda` feature); `None`: the CPU.
    pub cuda_device: Option<usize>,
    /// Half precision (F16) weights and activations; only sensible on a GPU.
    pub half: bool,
    /// An architecture other than the one the directory's `config.json`
    /// files describe.
    pub architecture: Option<Architecture>,
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// A loaded Stable Diffusion model.
pub struct DiffusionModel {
    id: String,
    variant: Variant,
    pipeline: Arc<Pipeline>,
}

impl DiffusionModel {
    /// Loads model `id` from the diffusers directory `dir`.
    pub fn load(id: &str, dir: &Path, variant: Variant, options: LoadOptions) -> Result<Self, LoadError> {
        let device = match options.cuda_device {
            None => Device::Cpu,
            Some(ordinal) => {
                Device::new_cuda(ordinal).map_err(|e| LoadError(format!("no CUDA device {ordinal}: {e}")))?
            }
        };
        let dtype = if options.half { DType::F16 } else { DType::F32 };
        let arch = match options.architecture {
            Some(arch) => arch,
            None => Architecture::from_dir(dir, variant).map_err(|e| {
                LoadError(format!(
                    "cannot read the {} configuration in {}: {e}",
                    variant.name(),
                    dir.display()
                ))
            })?,
        };
        if arch.variant != variant {
            return Err(LoadError(format!(
                "the architecture is {}, not {}",
                arch.variant.name(),
                variant.name()
            )));
        }
        let pipeline = Pipeline::load_with(dir, arch, &device, dtype)
            .map_err(|e| LoadError(format!("cannot load {} from {}: {e}", variant.name(), dir.display())))?;
        tracing::info!(model = id, variant = variant.name(), dir = %dir.display(), ?device, ?dtype, "diffusion model loaded");
        Ok(Self {
            id: id.to_owned(),
            variant,
            pipeline: Arc::new(pipeline),
        })
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }
}

/// A [`WorkerRuntime`] serving `model` with `config`.
pub fn runtime(model: DiffusionModel, config: WorkerConfig) -> WorkerRuntime<DiffusionModel> {
    WorkerRuntime::new(model, config)
}

/// Encodes an RGB image as PNG, JPEG (quality 90) or lossless WebP.
pub fn encode(img: &RgbImage, format: Format) -> Result<Vec<u8>, String> {
    gantry_media::image::encode_rgb(&img.pixels, img.width, img.height, format)
}

impl DiffusionModel {
    /// Runs a validated request on a blocking thread; `(step, steps)` comes
    /// through `progress` after every step; stops when `cancel` is set.
    async fn generate(&self, request: &Request, seed: u64, ctx: &JobContext) -> Result<Vec<Vec<u8>>, JobError> {
        let params = Params {
            prompt: request.prompt.clone(),
            negative_prompt: request.negative_prompt.clone(),
            width: request.width,
            height: request.height,
            num_images: request.num_images,
            steps: request.steps,
            guidance_scale: request.guidance_scale,
            seed,
        };
        let format = request.format;
        let pipeline = Arc::clone(&self.pipeline);
        let cancel = ctx.cancellation_token();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, usize)>();
        let task = tokio::task::spawn_blocking(move || {
            let images = pipeline.generate(&params, |step, steps| {
                let _ = tx.send((step, steps));
                if cancel.is_cancelled() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            images
                .iter()
                .map(|img| encode(img, format).map_err(PipelineError::Load))
                .collect::<Result<Vec<_>, _>>()
        });
        while let Some((step, steps)) = rx.recv().await {
            ctx.progress(json!({"step": step, "steps": steps})).await?;
        }
        match task.await {
            Err(e) => Err(JobError::internal(format!("the pipeline stopped: {e}"))),
            Ok(Err(PipelineError::Cancelled)) => Err(JobError::Cancelled),
            Ok(Err(e)) => Err(JobError::internal(e)),
            Ok(Ok(images)) => Ok(images),
        }
    }
}

impl Model for DiffusionModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input, self.variant).map_err(JobError::BadInput)?;
        // 53 bits: a seed the caller can send back exactly as a JSON number.
        let seed = request.seed.unwrap_or_else(|| rand::random::<u64>() >> 11);
        let images = self.generate(&request, seed, &ctx).await?;
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let n = images.len();
        for (i, bytes) in images.iter().enumerate() {
            let pointer = if n == 1 {
                "/image_url".to_owned()
            } else {
                format!("/images/{i}")
            };
            ctx.put_file(&pointer, request.format.media_type(), bytes).await?;
        }
        let mut output = json!({
            "width": request.width,
            "height": request.height,
            "seed": seed,
            "output_format": request.format.name(),
        });
        if n == 1 {
            output["image_url"] = Value::String(String::new());
        } else {
            output["images"] = Value::Array(vec![Value::String(String::new()); n]);
        }
        let pixels = u64::from(request.width) * u64::from(request.height) * n as u64;
        // One pixel is one millionth of a megapixel: the usage is exact.
        let usage = Usage::micros("megapixels", i64::try_from(pixels).unwrap_or(i64::MAX));
        Ok(Output::new(output, usage))
    }
}

/// Re-exported so callers can name the encoding of a request.
pub use input::Format as OutputFormat;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_format_at_the_image_size() {
        let img = RgbImage {
            width: 24,
            height: 16,
            pixels: (0..24 * 16 * 3).map(|i| (i % 251) as u8).collect(),
        };
        for (format, expected) in [
            (Format::Png, image::ImageFormat::Png),
            (Format::Jpeg, image::ImageFormat::Jpeg),
            (Format::Webp, image::ImageFormat::WebP),
        ] {
            let bytes = encode(&img, format).unwrap();
            assert_eq!(image::guess_format(&bytes).unwrap(), expected);
            let decoded = image::load_from_memory(&bytes).unwrap().to_rgb8();
            assert_eq!(decoded.dimensions(), (24, 16));
            if format != Format::Jpeg {
                assert_eq!(decoded.as_raw(), &img.pixels, "{} is lossless", format.name());
            }
        }
    }

    #[test]
    fn variant_names() {
        for v in [Variant::V1_5, Variant::Turbo, Variant::Xl] {
            assert_eq!(Variant::parse(v.name()), Some(v));
        }
        assert_eq!(Variant::parse("v1_5"), Some(Variant::V1_5));
        assert_eq!(Variant::parse("SDXL"), Some(Variant::Xl));
        assert_eq!(Variant::parse("sd3"), None);
    }
}
