//! Image models: GAN generators run in plain Rust.
//!
//! A generator here is a DCGAN-style stack of transposed convolutions
//! ([`gan`]), loaded from safetensors (the manifest converts the published
//! PyTorch checkpoints once, when they are pulled). An unconditional model
//! draws from noise alone; a conditional one also takes a one-hot label,
//! which comes from the words of the prompt (`eyes-128`: the colour named in
//! it). Every image of a job is generated in one batch, resized to the
//! requested side when that differs from the generator's (Lanczos, 3 lobes),
//! encoded as PNG, JPEG (quality 90) or lossless WebP, and sent to the
//! platform, which serves it behind an expiring URL.
//!
//! The same seed gives the same bytes: image `i` of a job with seed `s` is
//! drawn from the seed `s + i` with a portable generator (SplitMix64 and the
//! Box-Muller transform), so a one-image job with seed `s + i` returns the
//! same image. Usage is the delivered pixels, in megapixels.

mod factory;
pub mod input;
pub mod terrain;

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use gantry_media::image::JPEG_QUALITY;
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use image::{ImageEncoder, RgbImage};
use serde_json::{Value, json};

pub use factory::ImageFactory;
pub use gantry_gan::{Backend, Device, Generator, LoadError};
pub use gantry_kernels::random::Normal;
pub use gantry_media::image::encode_rgb;
use input::{Abilities, Format, Request};
pub use terrain::{Terrain, TerrainSpec};

/// How a manifest entry describes a GAN generator (its `engine` table).
#[derive(Debug, Clone, PartialEq)]
pub struct GanSpec {
    /// Name prefix of the generator's tensors (`netG_state_dict.main`).
    pub prefix: String,
    /// Length of the noise vector.
    pub latent: usize,
    /// Labels of a conditional model, in the order of its one-hot input,
    /// each with the words of a prompt that name it.
    pub labels: Vec<(String, Vec<String>)>,
    /// The side of the images the generator draws (`engine.side`), which
    /// the input schema gives as the default size; checked against the
    /// weights when they load. `None`: not stated (no default size).
    pub side: Option<u32>,
}

impl GanSpec {
    /// Reads `architecture = "dcgan"`, `tensor_prefix`, `latent`, `labels`
    /// (a table of label → list of words) and `side` from an engine table.
    pub fn from_engine(engine: &serde_json::Map<String, Value>) -> Result<Self, String> {
        if engine.get("architecture").and_then(Value::as_str) != Some("dcgan") {
            return Err("engine.architecture must be \"dcgan\"".into());
        }
        let prefix = engine
            .get("tensor_prefix")
            .and_then(Value::as_str)
            .ok_or("engine.tensor_prefix is missing")?
            .to_owned();
        let latent = engine
            .get("latent")
            .and_then(Value::as_u64)
            .ok_or("engine.latent is missing")? as usize;
        let labels = match engine.get("labels") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    let name = item.get("name").and_then(Value::as_str).ok_or("a label has no name")?;
                    let words = match item.get("words") {
                        Some(Value::Array(words)) => words
                            .iter()
                            .map(|w| w.as_str().map(str::to_lowercase).ok_or("label words must be strings"))
                            .collect::<Result<Vec<_>, _>>()?,
                        _ => vec![name.to_lowercase()],
                    };
                    Ok((name.to_owned(), words))
                })
                .collect::<Result<Vec<_>, &str>>()?,
            Some(_) => return Err("engine.labels must be a list".into()),
        };
        let side = match engine.get("side") {
            None => None,
            Some(side) => Some(
                side.as_u64()
                    .and_then(|side| u32::try_from(side).ok())
                    .filter(|side| *side > 0)
                    .ok_or("engine.side must be a positive integer")?,
            ),
        };
        Ok(Self {
            prefix,
            latent,
            labels,
            side,
        })
    }
}

/// A loaded image model.
pub struct ImageModel {
    id: String,
    engine: Engine,
}

#[derive(Clone)]
enum Engine {
    Gan { spec: GanSpec, generator: Arc<Generator> },
    Terrain(Arc<Terrain>),
}

impl ImageModel {
    /// Loads the generator of model `id` from a safetensors file, its layers
    /// on `backend`.
    pub fn load(id: &str, weights: &Path, spec: GanSpec, backend: &Backend) -> Result<Self, LoadError> {
        let tensors = gantry_manifest::torch::read_safetensors(weights).map_err(|e| LoadError::new(e.to_string()))?;
        let generator = Generator::from_tensors_on(&tensors, &spec.prefix, backend)?;
        let wanted = spec.latent + spec.labels.len();
        if generator.input_len() != wanted {
            return Err(LoadError::new(format!(
                "the generator takes {} inputs, but the manifest says {} noise + {} labels",
                generator.input_len(),
                spec.latent,
                spec.labels.len()
            )));
        }
        if let Some(side) = spec.side
            && side as usize != generator.side()
        {
            return Err(LoadError::new(format!(
                "the generator draws {0}x{0} images, but the manifest says side = {side}",
                generator.side()
            )));
        }
        Ok(Self {
            id: id.to_owned(),
            engine: Engine::Gan {
                spec,
                generator: Arc::new(generator),
            },
        })
    }

    /// Loads a terrain model (an ONNX graph on ONNX Runtime).
    pub fn load_terrain(
        id: &str,
        runtime_library: &Path,
        graph: &Path,
        threads: usize,
        device: gantry_onnx::Device,
        spec: TerrainSpec,
    ) -> Result<Self, LoadError> {
        Ok(Self {
            id: id.to_owned(),
            engine: Engine::Terrain(Arc::new(Terrain::load(runtime_library, graph, threads, device, spec)?)),
        })
    }

    /// Side of the images the model draws.
    pub fn native_side(&self) -> u32 {
        match &self.engine {
            Engine::Gan { generator, .. } => u32::try_from(generator.side()).unwrap_or(u32::MAX),
            Engine::Terrain(_) => terrain::SIDE as u32,
        }
    }

    fn abilities(&self) -> Abilities<'_> {
        match &self.engine {
            Engine::Gan { spec, .. } => Abilities {
                native_side: self.native_side(),
                labels: &spec.labels,
                difficulty_levels: 0,
            },
            Engine::Terrain(terrain) => Abilities {
                native_side: self.native_side(),
                labels: &[],
                difficulty_levels: terrain.spec().levels,
            },
        }
    }

    /// Where the model computes: the generator's backend
    /// ([`Generator::backend_name`]), or ONNX Runtime's device.
    pub fn backend_name(&self) -> String {
        match &self.engine {
            Engine::Gan { generator, .. } => generator.backend_name(),
            Engine::Terrain(terrain) => format!("onnxruntime on {}", terrain.device()),
        }
    }

    /// Generates and encodes the images of a validated request (blocking:
    /// run it off the async runtime).
    pub fn render(&self, request: &Request, seed: u64) -> Result<Vec<Vec<u8>>, String> {
        self.engine.render(request, seed).map(|(images, _)| images)
    }
}

impl Engine {
    /// The encoded images, and for a terrain the difficulty of each.
    fn render(&self, request: &Request, seed: u64) -> Result<(Vec<Vec<u8>>, Vec<u32>), String> {
        match self {
            Engine::Gan { spec, generator } => Ok((render(generator, spec, request, seed)?, Vec::new())),
            Engine::Terrain(terrain) => render_terrain(terrain, request, seed),
        }
    }
}

/// A [`WorkerRuntime`] serving `model` with `config`.
pub fn runtime(model: ImageModel, config: WorkerConfig) -> WorkerRuntime<ImageModel> {
    WorkerRuntime::new(model, config)
}

impl Model for ImageModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input, &self.abilities()).map_err(JobError::BadInput)?;
        // 53 bits: a seed the caller can send back exactly as a JSON number.
        let seed = request.seed.unwrap_or_else(|| rand::random::<u64>() >> 11);
        let n = request.num_images;
        ctx.progress(json!({"stage": "generating", "images": n})).await?;
        let (engine, job) = (self.engine.clone(), request.clone());
        let (images, difficulties) = tokio::task::spawn_blocking(move || engine.render(&job, seed))
            .await
            .map_err(|e| JobError::internal(format!("the generator stopped: {e}")))?
            .map_err(JobError::internal)?;
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let format = request.format;
        let media_type = match (&self.engine, format) {
            (Engine::Terrain(_), Format::Png) => "image/png",
            _ => format.media_type(),
        };
        for (i, bytes) in images.iter().enumerate() {
            let pointer = if n == 1 {
                "/image_url".to_owned()
            } else {
                format!("/images/{i}")
            };
            ctx.put_file(&pointer, media_type, bytes).await?;
        }
        let side = request.side;
        let mut output = json!({
            "width": side,
            "height": side,
            "seed": seed,
            "output_format": format.name(),
        });
        if n == 1 {
            output["image_url"] = Value::String(String::new());
        } else {
            output["images"] = Value::Array(vec![Value::String(String::new()); n]);
        }
        if let (Some(label), Engine::Gan { spec, .. }) = (request.label, &self.engine) {
            output["label"] = Value::String(spec.labels[label].0.clone());
        }
        if let Engine::Terrain(terrain) = &self.engine {
            output["difficulty"] = if n == 1 {
                json!(difficulties[0])
            } else {
                json!(difficulties)
            };
            output["height_range_m"] = json!(terrain.spec().height_range);
        }
        let pixels = u64::from(side) * u64::from(side) * n as u64;
        // One pixel is one millionth of a megapixel: the usage is exact.
        let usage = Usage::micros("megapixels", i64::try_from(pixels).unwrap_or(i64::MAX));
        Ok(Output::new(output, usage))
    }
}

/// Terrains: grey heightfields, 0 m black and `height_range` white (16-bit
/// PNG, 8-bit JPEG and WebP). Image `i` draws its noise from seed + `i`;
/// without a `difficulty`, each draws its own (1 to `levels`) from its seed.
fn render_terrain(terrain: &Terrain, request: &Request, seed: u64) -> Result<(Vec<Vec<u8>>, Vec<u32>), String> {
    let n = request.num_images;
    let plane = terrain::SIDE * terrain::SIDE;
    let mut noise = vec![0.0f32; n * plane];
    let mut difficulties = Vec::with_capacity(n);
    for (i, z) in noise.chunks_mut(plane).enumerate() {
        let mut normal = Normal::new(seed.wrapping_add(i as u64));
        let drawn = 1 + (normal.next_u64() % u64::from(terrain.spec().levels)) as u32;
        difficulties.push(request.difficulty.unwrap_or(drawn));
        for v in z.iter_mut() {
            *v = normal.next();
        }
    }
    let range = terrain.spec().height_range;
    let side = terrain::SIDE as u32;
    let images = terrain
        .generate(&noise, &difficulties)?
        .into_iter()
        .map(|heights| {
            let levels: Vec<u16> = heights
                .iter()
                .map(|h| ((h / range).clamp(0.0, 1.0) * 65535.0).round() as u16)
                .collect();
            let mut img: image::ImageBuffer<image::Luma<u16>, Vec<u16>> =
                image::ImageBuffer::from_raw(side, side, levels).ok_or("the heightfield has the wrong size")?;
            if request.side != side {
                img = image::imageops::resize(&img, request.side, request.side, image::imageops::FilterType::Lanczos3);
            }
            encode_grey(&img, request.format)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((images, difficulties))
}

fn encode_grey(img: &image::ImageBuffer<image::Luma<u16>, Vec<u16>>, format: Format) -> Result<Vec<u8>, String> {
    let mut out = Cursor::new(Vec::new());
    let (w, h) = img.dimensions();
    let written = match format {
        Format::Png => {
            // The encoder takes 16-bit samples in native byte order.
            let bytes: Vec<u8> = img.as_raw().iter().flat_map(|v| v.to_ne_bytes()).collect();
            image::codecs::png::PngEncoder::new(&mut out).write_image(&bytes, w, h, image::ExtendedColorType::L16)
        }
        Format::Jpeg | Format::Webp => {
            let bytes: Vec<u8> = img.as_raw().iter().map(|v| (v >> 8) as u8).collect();
            if format == Format::Jpeg {
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY).write_image(
                    &bytes,
                    w,
                    h,
                    image::ExtendedColorType::L8,
                )
            } else {
                image::codecs::webp::WebPEncoder::new_lossless(&mut out).write_image(
                    &bytes,
                    w,
                    h,
                    image::ExtendedColorType::L8,
                )
            }
        }
    };
    written.map_err(|e| format!("cannot encode the heightfield as {}: {e}", format.name()))?;
    Ok(out.into_inner())
}

fn render(generator: &Generator, spec: &GanSpec, request: &Request, seed: u64) -> Result<Vec<Vec<u8>>, String> {
    let n = request.num_images;
    let width = generator.input_len();
    let mut inputs = vec![0.0f32; n * width];
    for (i, z) in inputs.chunks_mut(width).enumerate() {
        let mut normal = Normal::new(seed.wrapping_add(i as u64));
        for v in &mut z[..spec.latent] {
            *v = normal.next();
        }
        if let Some(label) = request.label {
            z[spec.latent + label] = 1.0;
        }
    }
    let native = u32::try_from(generator.side()).map_err(|e| e.to_string())?;
    generator
        .generate(&inputs, n)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|rgb| {
            let mut img = RgbImage::from_raw(native, native, rgb).ok_or("the generator's output has the wrong size")?;
            if request.side != native {
                img = image::imageops::resize(&img, request.side, request.side, image::imageops::FilterType::Lanczos3);
            }
            encode(&img, request.format)
        })
        .collect()
}

fn encode(img: &RgbImage, format: Format) -> Result<Vec<u8>, String> {
    let (w, h) = img.dimensions();
    encode_rgb(img.as_raw(), w, h, format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_table_is_read() {
        let engine = json!({
            "architecture": "dcgan", "tensor_prefix": "main", "latent": 100,
            "labels": [{"name": "gray", "words": ["gray", "Grey"]}, {"name": "red"}]
        });
        let spec = GanSpec::from_engine(engine.as_object().unwrap()).unwrap();
        assert_eq!(spec.labels[1], ("red".to_owned(), vec!["red".to_owned()]));
        assert_eq!(spec.labels[0].1, vec!["gray", "grey"]);
        assert!(GanSpec::from_engine(json!({"architecture": "unet"}).as_object().unwrap()).is_err());
        assert_eq!(spec.side, None);
        let sided = json!({"architecture": "dcgan", "tensor_prefix": "main", "latent": 100, "side": 128});
        assert_eq!(
            GanSpec::from_engine(sided.as_object().unwrap()).unwrap().side,
            Some(128)
        );
        let bad = json!({"architecture": "dcgan", "tensor_prefix": "main", "latent": 100, "side": "big"});
        assert_eq!(
            GanSpec::from_engine(bad.as_object().unwrap()).unwrap_err(),
            "engine.side must be a positive integer"
        );
    }
}
