//! The video models' side of the plug-in boundary: every manifest entry of
//! category `video` (RIFE, with keyframes from a GAN or from each job), and
//! the `[video]` settings table.
use gantry_worker_sdk::factory::{ModelEntry, ModelFactory, ModelFiles, ModelKind};
use serde::{Deserialize, Serialize};

use crate::{Options, VideoModel};

/// How many frames of a job are drawn at once, and where input URLs may
/// go: `[video]` in the configuration file, `GANTRY_VIDEO__…` in the environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VideoSettings {
    /// Frames interpolated in parallel (one thread each); unset or 0 means one per core.
    pub threads: Option<usize>,
    /// Address ranges (CIDR) that the URLs of video inputs (keyframe images)
    /// may reach although they are loopback, private or reserved addresses.
    pub fetch_allow_ranges: Vec<String>,
    /// CUDA device ordinal RIFE and the keyframe generator run on (candle's
    /// CUDA backend; needs a binary built with the `cuda` feature); unset
    /// means the CPU, on Gantry's kernels.
    pub cuda_device: Option<usize>,
}

/// Loads RIFE from the safetensors its pull converted from `flownet.pkl`,
/// and for `engine.keyframes = "dcgan"` the GAN's converted checkpoint.
pub struct VideoFactory;

impl ModelFactory for VideoFactory {
    const SETTINGS: Option<&'static str> = Some("video");
    type Settings = VideoSettings;
    type Model = VideoModel;

    fn input_schema(entry: &ModelEntry) -> serde_json::Value {
        crate::input::schema(entry)
    }

    fn accepts(entry: &ModelEntry) -> bool {
        entry.category == ModelKind::Video
    }

    fn load(files: &ModelFiles<'_>, settings: &VideoSettings) -> Result<VideoModel, String> {
        let rife = files.find("flownet", |name| name.starts_with("flownet"))?;
        let threads = settings
            .threads
            .filter(|n| *n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));
        let options = Options {
            threads,
            block_seconds: u64::try_from(files.entry().price.per()).unwrap_or(1),
            fetch_allow_ranges: settings.fetch_allow_ranges.clone(),
            own_files: files.own_files(),
            backend: gantry_gan::Backend::for_cuda_device(settings.cuda_device).map_err(|e| e.to_string())?,
        };
        let model = match files.engine_str("keyframes") {
            Some("dcgan") => {
                let prefix = files
                    .engine_str("tensor_prefix")
                    .ok_or("its engine table names no tensor_prefix")?;
                let latent = files
                    .engine_u64("latent")
                    .ok_or("its engine table names no latent size")?;
                let generator = files.find("generator", |name| !name.starts_with("flownet"))?;
                VideoModel::load_faces(files.id(), &rife, &generator, prefix, latent as usize, &options)
            }
            Some("images") => VideoModel::load_interpolate(files.id(), &rife, &options),
            other => return Err(format!("unknown keyframes source {other:?} (dcgan or images)")),
        }
        .map_err(|e| e.to_string())?;
        tracing::info!(model = files.id(), threads, backend = %model.backend_name(), "video model ready");
        Ok(model)
    }
}
