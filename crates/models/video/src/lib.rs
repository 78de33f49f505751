//! Video models: RIFE frame interpolation between keyframes, encoded as
//! H.264 in MP4.
//!
//! - `faces-morph-video`: the keyframes are faces drawn by the DCGAN of
//!   `dcgan-faces-64` along a walk through its latent space (each point a
//!   rotation of the previous one toward fresh noise, so neighbours are
//!   related faces); they are resized to the video's size (Lanczos, 3 lobes).
//! - `interpolate-video`: the keyframes are the caller's images (URLs or
//!   base64), resized to the video's size.
//!
//! Every frame between two keyframes is drawn by RIFE HDv3 ([`rife`]) at its
//! own time between them, the frames of one window in parallel, and encoded
//! in order ([`encode`]). The same input (and seed) gives the same bytes.
//!
//! Billing: the unit is seconds, and a video is billed per started 5 s block
//! (a 4 s video as 5 s, a 5.5 s one as 10 s): the usage reported is the
//! delivered duration rounded up to the block of the model's price.

pub mod encode;
mod factory;
pub mod input;
pub mod rife;

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

pub use factory::{VideoFactory, VideoSettings};
use gantry_gan::Generator;
pub use gantry_gan::{Backend, Device};
use gantry_kernels::random::Normal;
use gantry_worker_sdk::{CancellationToken, JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use image::RgbImage;
use image::imageops::FilterType;
use serde_json::{Value, json};

use crate::encode::Mp4Encoder;
use crate::input::{ImageSource, Kind, Request};
pub use crate::rife::{Rife, RifeError};

/// Angle (radians) between two neighbouring points of the latent walk.
const WALK_STEP: f32 = 1.0;
/// Largest image accepted as a keyframe, before resizing (pixels per side).
const MAX_SOURCE_SIDE: u32 = 4096;
/// Largest image file fetched or decoded.
const MAX_SOURCE_BYTES: usize = 20 << 20;
/// How long fetching one keyframe URL may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a video model's keyframes come from.
enum Keyframes {
    Gan { generator: Generator, latent: usize },
    Images,
}

struct Engine {
    rife: Rife,
    keyframes: Keyframes,
    threads: usize,
    /// Seconds per billing block (the `per` of the model's price).
    block_seconds: u64,
}

/// A loaded video model.
#[derive(Clone)]
pub struct VideoModel {
    id: String,
    engine: Arc<Engine>,
    fetcher: gantry_net::Fetcher,
}

impl std::fmt::Debug for VideoModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoModel").field("id", &self.id).finish()
    }
}

/// How a video model reaches the URLs of its inputs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Frames interpolated at once, one thread each.
    pub threads: usize,
    /// Seconds per billing block (the `per` of the model's price).
    pub block_seconds: u64,
    /// Address ranges (CIDR) that input URLs may reach although they are
    /// loopback, private or reserved; public addresses are always allowed.
    pub fetch_allow_ranges: Vec<String>,
    /// The platform's own file URLs, read from its store.
    pub own_files: Option<Arc<dyn gantry_net::OwnFiles>>,
    /// Where RIFE and the keyframe generator run.
    pub backend: Backend,
}

/// Why a video model did not load.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(String);

impl VideoModel {
    /// `faces-morph-video`: RIFE from `rife` and the DCGAN whose tensors
    /// are under `prefix` in the safetensors file `generator`.
    pub fn load_faces(
        id: &str,
        rife: &Path,
        generator: &Path,
        prefix: &str,
        latent: usize,
        options: &Options,
    ) -> Result<Self, LoadError> {
        let tensors = gantry_manifest::torch::read_safetensors(generator).map_err(|e| LoadError(e.to_string()))?;
        let generator =
            Generator::from_tensors_on(&tensors, prefix, &options.backend).map_err(|e| LoadError(e.to_string()))?;
        if generator.input_len() != latent {
            return Err(LoadError(format!(
                "the generator takes {} inputs, but the manifest says {latent}",
                generator.input_len()
            )));
        }
        Self::with(id, rife, Keyframes::Gan { generator, latent }, options)
    }

    /// Where RIFE runs ([`Rife::backend_name`]); the keyframe generator is
    /// on the same backend.
    pub fn backend_name(&self) -> String {
        self.engine.rife.backend_name()
    }

    /// `interpolate-video`: RIFE from `rife`; the keyframes come with each job.
    pub fn load_interpolate(id: &str, rife: &Path, options: &Options) -> Result<Self, LoadError> {
        Self::with(id, rife, Keyframes::Images, options)
    }

    fn with(id: &str, rife: &Path, keyframes: Keyframes, options: &Options) -> Result<Self, LoadError> {
        let rife = Rife::load_on(rife, &options.backend).map_err(|e| LoadError(format!("RIFE: {e}")))?;
        let fetcher = gantry_net::Fetcher::new(&options.fetch_allow_ranges, FETCH_TIMEOUT)
            .map_err(|e| LoadError(format!("fetch_allow_ranges: {e}")))?
            .with_own_files(options.own_files.clone());
        Ok(Self {
            id: id.to_owned(),
            engine: Arc::new(Engine {
                rife,
                keyframes,
                threads: options.threads.max(1),
                block_seconds: options.block_seconds.max(1),
            }),
            fetcher,
        })
    }

    fn kind(&self) -> Kind {
        match &self.engine.keyframes {
            Keyframes::Gan { generator, .. } => Kind::LatentWalk {
                native_side: u32::try_from(generator.side()).unwrap_or(u32::MAX),
            },
            Keyframes::Images => Kind::Images,
        }
    }

    /// Fetches and decodes the keyframe images of a request.
    async fn fetch_images(&self, sources: &[ImageSource]) -> Result<Vec<RgbImage>, JobError> {
        let mut images = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let bytes = self
                .fetcher
                .bytes(source, MAX_SOURCE_BYTES)
                .await
                .map_err(|e| JobError::bad_input(format!("images.{i}: {e}")))?;
            let image = tokio::task::spawn_blocking(move || decode(&bytes))
                .await
                .map_err(|e| JobError::internal(format!("the image decoder stopped: {e}")))?
                .map_err(|e| JobError::bad_input(format!("images.{i}: {e}")))?;
            images.push(image);
        }
        Ok(images)
    }
}

/// Decodes a PNG, JPEG or WebP file into RGB, refusing huge images.
fn decode(bytes: &[u8]) -> Result<RgbImage, String> {
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read the image: {e}"))?;
    if reader.format().is_none() {
        return Err("not a PNG, JPEG or WebP image".into());
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SOURCE_SIDE);
    limits.max_image_height = Some(MAX_SOURCE_SIDE);
    reader.limits(limits);
    let image = reader.decode().map_err(|e| format!("cannot decode the image: {e}"))?;
    Ok(image.to_rgb8())
}

/// The size of a video made from images: the given one, or the first
/// image's, scaled down to fit 512x512 and rounded to whole macroblocks.
fn video_size(request: &Request, first: &RgbImage) -> (u32, u32) {
    if let Some(size) = request.size {
        return size;
    }
    let (w, h) = (f64::from(first.width()), f64::from(first.height()));
    let max = input::MAX_SIDE as f64;
    let scale = (max / w).min(max / h).min(1.0);
    let round = |v: f64| {
        let m = input::SIDE_MULTIPLE as f64;
        ((v * scale / m).round() * m).clamp(input::MIN_SIDE as f64, max) as u32
    };
    (round(w), round(h))
}

/// Planar RGB floats in `[0, 1]` of `image` resized to `w` × `h`.
fn planar(image: &RgbImage, w: u32, h: u32) -> Vec<f32> {
    let resized;
    let image = if image.dimensions() == (w, h) {
        image
    } else {
        resized = image::imageops::resize(image, w, h, FilterType::Lanczos3);
        &resized
    };
    let plane = (w * h) as usize;
    let mut out = vec![0.0f32; 3 * plane];
    for (i, px) in image.pixels().enumerate() {
        for c in 0..3 {
            out[c * plane + i] = f32::from(px[c]) / 255.0;
        }
    }
    out
}

/// Where frame `f` of `frames` falls between `keys` keyframes: the keyframe
/// before it and the time (0 ≤ t < 1) from it to the next.
fn position(f: usize, frames: usize, keys: usize) -> (usize, f32) {
    let p = f as f64 * (keys - 1) as f64 / (frames - 1) as f64;
    let k = (p.floor() as usize).min(keys - 1);
    let t = p - k as f64;
    if t < 1e-6 || k == keys - 1 {
        (k, 0.0)
    } else {
        (k, t as f32)
    }
}

/// The faces of the latent walk from `seed`: `count` keyframes.
fn walk(generator: &Generator, latent: usize, seed: u64, count: usize) -> Result<Vec<RgbImage>, String> {
    let mut normal = Normal::new(seed);
    let mut z: Vec<f32> = (0..latent).map(|_| normal.next()).collect();
    let mut inputs = z.clone();
    let (c, s) = (WALK_STEP.cos(), WALK_STEP.sin());
    for _ in 1..count {
        for v in &mut z {
            *v = c * *v + s * normal.next();
        }
        inputs.extend_from_slice(&z);
    }
    let side = u32::try_from(generator.side()).unwrap_or(0);
    Ok(generator
        .generate(&inputs, count)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(|rgb| RgbImage::from_raw(side, side, rgb))
        .collect())
}

/// What a render reports while it runs.
enum Event {
    Frames(usize),
}

/// Draws every frame and encodes the video (blocking).
fn render(
    engine: &Engine,
    keys: &[Vec<f32>],
    (w, h): (u32, u32),
    request: &Request,
    cancel: &CancellationToken,
    events: &mpsc::Sender<Event>,
) -> Result<Vec<u8>, JobError> {
    let (width, height) = (w as usize, h as usize);
    let frames = request.frames;
    let mut encoder =
        Mp4Encoder::new(width, height, request.fps, request.fps.saturating_mul(2)).map_err(JobError::internal)?;
    let mut f = 0;
    while f < frames {
        if cancel.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        let window: Vec<usize> = (f..frames.min(f + engine.threads)).collect();
        let drawn: Vec<Vec<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = window
                .iter()
                .map(|&i| {
                    scope.spawn(move || {
                        let (k, t) = position(i, frames, keys.len());
                        if t == 0.0 {
                            Ok(keys[k].clone())
                        } else {
                            engine.rife.interpolate(&keys[k], &keys[k + 1], width, height, t)
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect::<Result<Vec<_>, _>>()
        })
        .map_err(|_| JobError::internal("a frame's interpolation panicked"))?
        .into_iter()
        .collect::<Result<Vec<_>, RifeError>>()
        .map_err(JobError::internal)?;
        for frame in &drawn {
            encoder.push(frame).map_err(JobError::internal)?;
        }
        f += window.len();
        let _ = events.send(Event::Frames(f));
    }
    encoder.finish().map_err(JobError::internal)
}

/// A [`WorkerRuntime`] serving `model` with `config`.
pub fn runtime(model: VideoModel, config: WorkerConfig) -> WorkerRuntime<VideoModel> {
    WorkerRuntime::new(model, config)
}

impl Model for VideoModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input, self.kind()).map_err(JobError::BadInput)?;
        let engine = self.engine.clone();
        let mut output = json!({});
        let (keys, size) = match &engine.keyframes {
            Keyframes::Gan { latent, .. } => {
                // 53 bits: a seed the caller can send back exactly as a JSON number.
                let seed = request.seed.unwrap_or_else(|| rand::random::<u64>() >> 11);
                let seconds = (request.frames - 1) as f64 / f64::from(request.fps);
                let count = ((seconds / request.seconds_per_face).round() as usize + 1).max(2);
                let size = request.size.unwrap_or((256, 256));
                ctx.progress(json!({"stage": "keyframes", "faces": count})).await?;
                let (job_engine, latent) = (engine.clone(), *latent);
                let keys = tokio::task::spawn_blocking(move || {
                    let Keyframes::Gan { generator, .. } = &job_engine.keyframes else {
                        return Ok(Vec::new());
                    };
                    walk(generator, latent, seed, count).map(|faces| {
                        faces
                            .iter()
                            .map(|face| planar(face, size.0, size.1))
                            .collect::<Vec<_>>()
                    })
                })
                .await
                .map_err(|e| JobError::internal(format!("the generator stopped: {e}")))?
                .map_err(JobError::internal)?;
                output["seed"] = json!(seed);
                output["faces"] = json!(count);
                (keys, size)
            }
            Keyframes::Images => {
                ctx.progress(json!({"stage": "keyframes", "images": request.images.len()}))
                    .await?;
                let images = self.fetch_images(&request.images).await?;
                let size = video_size(&request, &images[0]);
                let keys = tokio::task::spawn_blocking(move || {
                    images.iter().map(|img| planar(img, size.0, size.1)).collect::<Vec<_>>()
                })
                .await
                .map_err(|e| JobError::internal(format!("resizing the images stopped: {e}")))?;
                output["keyframes"] = json!(keys.len());
                (keys, size)
            }
        };
        let frames = request.frames;
        ctx.progress(json!({"stage": "frames", "frames": 0, "of": frames}))
            .await?;
        let (events, progress) = mpsc::channel();
        let cancel = ctx.cancellation_token();
        let job = request.clone();
        let mut task = tokio::task::spawn_blocking(move || render(&engine, &keys, size, &job, &cancel, &events));
        let mut reported = 0;
        let video = loop {
            tokio::select! {
                done = &mut task => break done.map_err(|e| JobError::internal(format!("the renderer stopped: {e}")))??,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    let mut latest = None;
                    while let Ok(Event::Frames(n)) = progress.try_recv() {
                        latest = Some(n);
                    }
                    if let Some(n) = latest.filter(|n| *n > reported) {
                        reported = n;
                        ctx.progress(json!({"stage": "frames", "frames": n, "of": frames})).await?;
                    }
                }
            }
        };
        if ctx.is_cancelled() {
            return Err(JobError::Cancelled);
        }
        ctx.put_file("/video_url", "video/mp4", &video).await?;
        let duration = request.duration();
        let block = self.engine.block_seconds;
        let billed = (duration / block as f64 - 1e-9).ceil().max(1.0) as u64 * block;
        output["video_url"] = Value::String(String::new());
        output["duration"] = json!(duration);
        output["fps"] = json!(request.fps);
        output["frames"] = json!(frames);
        output["width"] = json!(size.0);
        output["height"] = json!(size.1);
        output["billed_seconds"] = json!(billed);
        let usage = Usage::whole("seconds", billed);
        Ok(Output::new(output, usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_fall_between_their_keyframes() {
        // 5 frames over 3 keyframes: 0, 0.5, 1, 1.5, 2
        let got: Vec<_> = (0..5).map(|f| position(f, 5, 3)).collect();
        assert_eq!(got, [(0, 0.0), (0, 0.5), (1, 0.0), (1, 0.5), (2, 0.0)]);
        // the last frame is the last keyframe
        assert_eq!(position(95, 96, 4), (3, 0.0));
        let (k, t) = position(1, 96, 4);
        assert_eq!(k, 0);
        assert!((t - 3.0 / 95.0).abs() < 1e-6);
    }

    #[test]
    fn an_image_video_takes_the_first_image_size_within_bounds() {
        let request = input::parse(&json!({"images": ["iVBORw0K", "iVBORw0K"]}), Kind::Images).unwrap();
        assert_eq!(video_size(&request, &RgbImage::new(300, 200)), (304, 208));
        assert_eq!(video_size(&request, &RgbImage::new(2000, 1000)), (512, 256));
        assert_eq!(video_size(&request, &RgbImage::new(20, 20)), (64, 64));
    }

    #[test]
    fn planes_are_red_green_blue() {
        let mut img = RgbImage::new(2, 1);
        img.put_pixel(0, 0, image::Rgb([255, 0, 51]));
        assert_eq!(planar(&img, 2, 1), [1.0, 0.0, 0.0, 0.0, 0.2, 0.0]);
    }

    #[test]
    fn broken_images_are_refused_clearly() {
        assert!(decode(b"not an image").unwrap_err().contains("not a PNG"));
    }
}
