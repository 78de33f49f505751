//! Tiny randomly initialised weights in the diffusers layout, for tests:
//! candle's model definitions are instantiated on a backend that creates
//! each tensor asked for with the model's own initialisation (like a
//! `VarMap`, so every name and shape is what the loaders read) and the
//! result is saved with safetensors. The draws are seeded by the tensor's
//! name, so the same architecture always gives the same bytes: a test can
//! compare against outputs computed once by diffusers and transformers
//! from these very files (`tests/data/reference/`). Unlike a `VarMap`, the backend says
//! every tensor exists, so the VAE's attention takes today's diffusers names
//! (`to_q`, `to_k`, `to_v`, `to_out.0`) rather than the legacy ones
//! (`query`, `key`, `value`, `proj_attn`) that candle also accepts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use candle_transformers::models::stable_diffusion::vae::AutoEncoderKL;

use crate::blocks::Kernels;
use crate::clip::ClipTextEncoder;
use crate::pipeline::{Architecture, PipelineError};
use gantry_kernels::random::Normal;

use crate::tokenizer::{END_OF_TEXT, START_OF_TEXT};
use crate::unet::UNet;

/// Creates every tensor a model asks for, with the initialisation it asks
/// for, and keeps it.
#[derive(Clone, Default)]
struct Initialiser(Arc<Mutex<HashMap<String, Tensor>>>);

/// The portable generator of the latents (SplitMix64 and Box-Muller),
/// seeded from the tensor's name (FNV-1a).
fn draws_for(name: &str) -> Normal {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    Normal::new(hash)
}

fn uniform(draws: &mut Normal, n: usize, lo: f64, up: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (up - lo) * draws.uniform()).collect()
}

fn normal(draws: &mut Normal, n: usize, mean: f64, stdev: f64) -> Vec<f64> {
    (0..n).map(|_| mean + stdev * f64::from(draws.next())).collect()
}

/// A tensor drawn as `init` asks, from the draws of `name`.
fn draw(shape: &Shape, name: &str, init: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
    let n = shape.elem_count();
    let draws = &mut draws_for(name);
    let values: Vec<f64> = match init {
        Init::Const(c) => vec![c; n],
        Init::Uniform { lo, up } => uniform(draws, n, lo, up),
        Init::Randn { mean, stdev } => normal(draws, n, mean, stdev),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    uniform(draws, n, -bound, bound)
                }
                NormalOrUniform::Normal => normal(draws, n, 0., std),
            }
        }
    };
    Tensor::from_vec(values, shape.clone(), dev)?.to_dtype(dtype)
}

impl SimpleBackend for Initialiser {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let tensor = draw(&s, name, h, dtype, dev)?;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), tensor.clone());
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("{name}: the shape of a new tensor must be given")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

impl Initialiser {
    fn builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), DType::F32, Device::Cpu)
    }

    fn save(&self, dir: &Path, component: &str, file: &str) -> Result<(), PipelineError> {
        let folder = dir.join(component);
        std::fs::create_dir_all(&folder)
            .map_err(|e| PipelineError::Load(format!("cannot create {}: {e}", folder.display())))?;
        let tensors = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        candle_core::safetensors::save(&tensors, folder.join(file))?;
        Ok(())
    }
}

/// Writes a complete diffusers directory for `arch` under `dir`:
/// `text_encoder[_2]/model.safetensors`, `unet/` and `vae/`
/// `diffusion_pytorch_model.safetensors`, each component's `config.json`
/// ([`crate::config::write_configs`]), and a small byte-level
/// `tokenizer/vocab.json` + `merges.txt` (the 512 byte symbols, a few
/// merges, and the two special tokens at CLIP's ids 49406 and 49407).
pub fn write_tiny_weights(dir: &Path, arch: &Architecture) -> Result<(), PipelineError> {
    let encoders =
        std::iter::once(("text_encoder", &arch.clip)).chain(arch.clip2.as_ref().map(|c| ("text_encoder_2", c)));
    for (component, config) in encoders {
        let weights = Initialiser::default();
        ClipTextEncoder::new(weights.builder(), config, Kernels::Candle)?;
        weights.save(dir, component, "model.safetensors")?;
    }
    let weights = Initialiser::default();
    UNet::new(weights.builder(), &arch.unet, arch.text_time, Kernels::Candle)?;
    weights.save(dir, "unet", "diffusion_pytorch_model.safetensors")?;
    let weights = Initialiser::default();
    AutoEncoderKL::new(weights.builder(), 3, 3, arch.vae.clone())?;
    weights.save(dir, "vae", "diffusion_pytorch_model.safetensors")?;
    crate::config::write_configs(dir, arch)?;
    write_tiny_tokenizer(&dir.join("tokenizer"))
}

fn write_tiny_tokenizer(folder: &Path) -> Result<(), PipelineError> {
    let io = |e: std::io::Error| PipelineError::Load(format!("cannot write the tokenizer: {e}"));
    std::fs::create_dir_all(folder).map_err(io)?;
    // CLIP's order: the bytes that stand for themselves first (so `!` is
    // id 0, the pad token of SD 2.x and SDXL), then the others.
    let printable = |b: &u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let symbols: Vec<String> = (0u8..=255)
        .filter(printable)
        .chain((0u8..=255).filter(|b| !printable(b)))
        .map(|b| crate::tokenizer::byte_symbol(b).to_string())
        .collect();
    let mut vocab: BTreeMap<String, u32> = BTreeMap::new();
    for (i, s) in symbols.iter().enumerate() {
        vocab.insert(s.clone(), i as u32);
        vocab.insert(format!("{s}</w>"), 256 + i as u32);
    }
    let merges = [
        ("a", "t</w>"),
        ("c", "at</w>"),
        ("o", "g</w>"),
        ("d", "og</w>"),
        ("t", "h"),
        ("th", "e</w>"),
    ];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), 512 + i as u32);
    }
    vocab.insert(START_OF_TEXT.to_owned(), 49406);
    vocab.insert(END_OF_TEXT.to_owned(), 49407);
    let json = serde_json::to_string(&vocab).map_err(|e| PipelineError::Load(e.to_string()))?;
    std::fs::write(folder.join("vocab.json"), json).map_err(io)?;
    let mut text = String::from("#version: 0.2\n");
    for (a, b) in merges {
        text.push_str(&format!("{a} {b}\n"));
    }
    std::fs::write(folder.join("merges.txt"), text).map_err(io)
}
