//! The architecture of a diffusers directory, read from its `config.json`
//! files: `unet/config.json` (UNet2DConditionModel), `vae/config.json`
//! (AutoencoderKL) and `text_encoder[_2]/config.json` (transformers'
//! CLIPTextConfig). A component without a config takes the published
//! model's numbers for the variant ([`Architecture::full`]).
//!
//! [`write_configs`] writes the same files for an architecture, so the tiny
//! test weights load through exactly the path real weights take.

use std::path::Path;

use candle_transformers::models::stable_diffusion::unet_2d::BlockConfig;
use serde_json::{Value, json};

use crate::clip::{Activation, ClipConfig};
use crate::pipeline::{Architecture, PipelineError, Variant};
use crate::unet::TextTime;

const CONFIG: &str = "config.json";

fn bad(component: &str, why: impl std::fmt::Display) -> PipelineError {
    PipelineError::Load(format!("{component}/{CONFIG}: {why}"))
}

/// The parsed `component/config.json`, or `None` when there is none.
fn read(dir: &Path, component: &str) -> Result<Option<Value>, PipelineError> {
    read_file(dir, component, CONFIG)
}

fn read_file(dir: &Path, component: &str, file: &str) -> Result<Option<Value>, PipelineError> {
    let path = dir.join(component).join(file);
    let bad = |why: String| PipelineError::Load(format!("{component}/{file}: {why}"));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| bad(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(e.to_string())),
    }
}

fn usize_of(config: &Value, component: &str, key: &str) -> Result<Option<usize>, PipelineError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(component, format!("`{key}` must be a non-negative integer, not {v}"))),
    }
}

fn required(config: &Value, component: &str, key: &str) -> Result<usize, PipelineError> {
    usize_of(config, component, key)?.ok_or_else(|| bad(component, format!("`{key}` is missing")))
}

fn f64_of(config: &Value, component: &str, key: &str) -> Result<Option<f64>, PipelineError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(component, format!("`{key}` must be a number, not {v}"))),
    }
}

fn bool_of(config: &Value, component: &str, key: &str) -> Result<Option<bool>, PipelineError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad(component, format!("`{key}` must be true or false, not {v}"))),
    }
}

/// A list of integers, or one integer meaning the same for each of `n` blocks.
fn per_block(config: &Value, component: &str, key: &str, n: usize) -> Result<Option<Vec<usize>>, PipelineError> {
    let Some(value) = config.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if let Some(one) = value.as_u64() {
        return Ok(Some(vec![one as usize; n]));
    }
    let list: Option<Vec<usize>> = value
        .as_array()
        .and_then(|items| items.iter().map(|v| v.as_u64().map(|n| n as usize)).collect());
    match list {
        Some(list) if list.len() == n => Ok(Some(list)),
        _ => Err(bad(
            component,
            format!("`{key}` must be an integer or a list of {n} integers, not {value}"),
        )),
    }
}

fn strings(config: &Value, component: &str, key: &str) -> Result<Vec<String>, PipelineError> {
    config
        .get(key)
        .and_then(Value::as_array)
        .and_then(|items| items.iter().map(|v| v.as_str().map(str::to_owned)).collect())
        .ok_or_else(|| bad(component, format!("`{key}` must be a list of strings")))
}

fn list(config: &Value, component: &str, key: &str) -> Result<Vec<usize>, PipelineError> {
    let n = config.get(key).and_then(Value::as_array).map_or(0, Vec::len);
    match per_block(config, component, key, n)? {
        Some(list) if !list.is_empty() => Ok(list),
        _ => Err(bad(component, format!("`{key}` must be a non-empty list of integers"))),
    }
}

fn unet(config: &Value, arch: &mut Architecture) -> Result<(), PipelineError> {
    const C: &str = "unet";
    for (key, expected) in [("in_channels", 4), ("out_channels", 4)] {
        if let Some(n) = usize_of(config, C, key)?
            && n != expected
        {
            return Err(bad(
                C,
                format!("`{key}` is {n}; this pipeline runs {expected}-channel latents"),
            ));
        }
    }
    let channels = list(config, C, "block_out_channels")?;
    let n = channels.len();
    let kinds = strings(config, C, "down_block_types")?;
    if kinds.len() != n {
        return Err(bad(C, "`down_block_types` and `block_out_channels` differ in length"));
    }
    let heads = per_block(config, C, "attention_head_dim", n)?.unwrap_or_else(|| vec![8; n]);
    let layers = per_block(config, C, "transformer_layers_per_block", n)?.unwrap_or_else(|| vec![1; n]);
    let mut blocks = Vec::with_capacity(n);
    for i in 0..n {
        let use_cross_attn = match kinds[i].as_str() {
            "CrossAttnDownBlock2D" => Some(layers[i]),
            "DownBlock2D" => None,
            other => return Err(bad(C, format!("down block type {other:?} is not supported"))),
        };
        blocks.push(BlockConfig {
            out_channels: channels[i],
            use_cross_attn,
            attention_head_dim: heads[i],
        });
    }
    let u = &mut arch.unet;
    u.blocks = blocks;
    u.layers_per_block = required(config, C, "layers_per_block")?;
    u.norm_num_groups = usize_of(config, C, "norm_num_groups")?.unwrap_or(32);
    u.norm_eps = f64_of(config, C, "norm_eps")?.unwrap_or(1e-5);
    u.cross_attention_dim = required(config, C, "cross_attention_dim")?;
    u.use_linear_projection = bool_of(config, C, "use_linear_projection")?.unwrap_or(false);
    u.center_input_sample = bool_of(config, C, "center_input_sample")?.unwrap_or(false);
    u.flip_sin_to_cos = bool_of(config, C, "flip_sin_to_cos")?.unwrap_or(true);
    u.freq_shift = f64_of(config, C, "freq_shift")?.unwrap_or(0.);
    u.downsample_padding = usize_of(config, C, "downsample_padding")?.unwrap_or(1);
    u.mid_block_scale_factor = f64_of(config, C, "mid_block_scale_factor")?.unwrap_or(1.);
    arch.text_time = match config.get("addition_embed_type").filter(|v| !v.is_null()) {
        None => None,
        Some(Value::String(kind)) if kind == "text_time" => Some(TextTime {
            time_dim: required(config, C, "addition_time_embed_dim")?,
            input_dim: required(config, C, "projection_class_embeddings_input_dim")?,
        }),
        Some(other) => return Err(bad(C, format!("`addition_embed_type` {other} is not supported"))),
    };
    Ok(())
}

fn vae(config: &Value, arch: &mut Architecture) -> Result<(), PipelineError> {
    const C: &str = "vae";
    let v = &mut arch.vae;
    v.block_out_channels = list(config, C, "block_out_channels")?;
    v.layers_per_block = required(config, C, "layers_per_block")?;
    v.norm_num_groups = usize_of(config, C, "norm_num_groups")?.unwrap_or(32);
    v.latent_channels = usize_of(config, C, "latent_channels")?.unwrap_or(4);
    if v.latent_channels != 4 {
        return Err(bad(C, "`latent_channels` must be 4"));
    }
    v.use_quant_conv = bool_of(config, C, "use_quant_conv")?.unwrap_or(true);
    v.use_post_quant_conv = bool_of(config, C, "use_post_quant_conv")?.unwrap_or(true);
    if let Some(scale) = f64_of(config, C, "scaling_factor")? {
        arch.vae_scale = scale;
    }
    if let Some(upcast) = bool_of(config, C, "force_upcast")? {
        arch.vae_upcast = upcast;
    }
    Ok(())
}

fn clip(config: &Value, component: &str, clip: &mut ClipConfig) -> Result<(), PipelineError> {
    clip.vocab_size = required(config, component, "vocab_size")?;
    clip.hidden = required(config, component, "hidden_size")?;
    clip.intermediate = required(config, component, "intermediate_size")?;
    clip.positions = usize_of(config, component, "max_position_embeddings")?.unwrap_or(77);
    clip.layers = required(config, component, "num_hidden_layers")?;
    clip.heads = required(config, component, "num_attention_heads")?;
    if clip.heads == 0 || !clip.hidden.is_multiple_of(clip.heads) {
        return Err(bad(
            component,
            "`hidden_size` must be a multiple of `num_attention_heads`",
        ));
    }
    clip.activation = match config.get("hidden_act").and_then(Value::as_str) {
        Some("quick_gelu") => Activation::QuickGelu,
        Some("gelu") => Activation::Gelu,
        None => clip.activation,
        Some(other) => return Err(bad(component, format!("`hidden_act` {other:?} is not supported"))),
    };
    // transformers writes a `projection_dim` for every CLIP text model; only
    // `CLIPTextModelWithProjection` has the weights of one.
    let with_projection = config
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|names| names.iter().any(|n| n.as_str() == Some("CLIPTextModelWithProjection")));
    clip.projection = if with_projection {
        Some(required(config, component, "projection_dim")?)
    } else {
        None
    };
    Ok(())
}

/// Whether `tokenizer_dir/special_tokens_map.json` pads with
/// `<|endoftext|>` (`Some(true)`) or `!` (`Some(false)`); `None` without
/// the file.
fn pads_with_end(dir: &Path, tokenizer_dir: &str) -> Result<Option<bool>, PipelineError> {
    let Some(map) = read_file(dir, tokenizer_dir, "special_tokens_map.json")? else {
        return Ok(None);
    };
    let pad = match map.get("pad_token") {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Object(token)) => token.get("content").and_then(Value::as_str),
        _ => None,
    };
    match pad {
        None => Ok(None),
        Some("<|endoftext|>") => Ok(Some(true)),
        Some("!") => Ok(Some(false)),
        Some(other) => Err(PipelineError::Load(format!(
            "{tokenizer_dir}/special_tokens_map.json: pad token {other:?} is not supported (<|endoftext|> or !)"
        ))),
    }
}

impl Architecture {
    /// The architecture of the diffusers directory `dir` holding a model of
    /// `variant`: its `config.json` files where present, the published
    /// numbers elsewhere.
    pub fn from_dir(dir: &Path, variant: Variant) -> Result<Self, PipelineError> {
        let mut arch = Self::full(variant);
        if let Some(config) = read(dir, "unet")? {
            unet(&config, &mut arch)?;
        }
        if let Some(config) = read(dir, "vae")? {
            vae(&config, &mut arch)?;
        }
        if let Some(config) = read(dir, "text_encoder")? {
            clip(&config, "text_encoder", &mut arch.clip)?;
        }
        if let (Some(clip2), Some(config)) = (arch.clip2.as_mut(), read(dir, "text_encoder_2")?) {
            clip(&config, "text_encoder_2", clip2)?;
        }
        if let Some(pad) = pads_with_end(dir, "tokenizer")? {
            arch.clip.pad_with_end = pad;
        }
        if let (Some(clip2), Some(pad)) = (arch.clip2.as_mut(), pads_with_end(dir, "tokenizer_2")?) {
            clip2.pad_with_end = pad;
        }
        if let Some(tt) = arch.text_time {
            let projection = arch.clip2.as_ref().and_then(|c| c.projection);
            if projection.is_none() || tt.pooled_dim() != projection {
                return Err(PipelineError::Load(format!(
                    "the UNet's add_embedding takes {} features, 6 time ids of {} and a pooled text embedding of {}, \
                     but the second text encoder's projection gives {}",
                    tt.input_dim,
                    tt.time_dim,
                    tt.pooled_dim().map_or_else(|| "nothing".into(), |n| n.to_string()),
                    projection.map_or_else(|| "none".into(), |n| n.to_string()),
                )));
            }
        }
        let text_width = arch.clip.hidden + arch.clip2.as_ref().map_or(0, |c| c.hidden);
        if text_width != arch.unet.cross_attention_dim {
            return Err(PipelineError::Load(format!(
                "the text encoders give {text_width} features but the UNet attends to {}",
                arch.unet.cross_attention_dim
            )));
        }
        Ok(arch)
    }
}

fn clip_json(config: &ClipConfig) -> Value {
    json!({
        "architectures": [if config.projection.is_some() { "CLIPTextModelWithProjection" } else { "CLIPTextModel" }],
        "projection_dim": config.projection.unwrap_or(config.hidden),
        "model_type": "clip_text_model",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden,
        "intermediate_size": config.intermediate,
        "max_position_embeddings": config.positions,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "hidden_act": match config.activation {
            Activation::QuickGelu => "quick_gelu",
            Activation::Gelu => "gelu",
        },
    })
}

/// Writes the `config.json` of every component of `arch` under `dir`, in
/// the format diffusers and transformers write them.
pub fn write_configs(dir: &Path, arch: &Architecture) -> Result<(), PipelineError> {
    let u = &arch.unet;
    let down: Vec<&str> = u
        .blocks
        .iter()
        .map(|b| match b.use_cross_attn {
            Some(_) => "CrossAttnDownBlock2D",
            None => "DownBlock2D",
        })
        .collect();
    let up: Vec<&str> = u
        .blocks
        .iter()
        .rev()
        .map(|b| match b.use_cross_attn {
            Some(_) => "CrossAttnUpBlock2D",
            None => "UpBlock2D",
        })
        .collect();
    let unet = json!({
        "_class_name": "UNet2DConditionModel",
        "in_channels": 4,
        "out_channels": 4,
        "block_out_channels": u.blocks.iter().map(|b| b.out_channels).collect::<Vec<_>>(),
        "down_block_types": down,
        "up_block_types": up,
        "attention_head_dim": u.blocks.iter().map(|b| b.attention_head_dim).collect::<Vec<_>>(),
        "transformer_layers_per_block": u.blocks.iter().map(|b| b.use_cross_attn.unwrap_or(1)).collect::<Vec<_>>(),
        "layers_per_block": u.layers_per_block,
        "norm_num_groups": u.norm_num_groups,
        "norm_eps": u.norm_eps,
        "cross_attention_dim": u.cross_attention_dim,
        "use_linear_projection": u.use_linear_projection,
        "center_input_sample": u.center_input_sample,
        "flip_sin_to_cos": u.flip_sin_to_cos,
        "freq_shift": u.freq_shift,
        "downsample_padding": u.downsample_padding,
        "mid_block_scale_factor": u.mid_block_scale_factor,
        "addition_embed_type": arch.text_time.map(|_| "text_time"),
        "addition_time_embed_dim": arch.text_time.map(|t| t.time_dim),
        "projection_class_embeddings_input_dim": arch.text_time.map(|t| t.input_dim),
    });
    let v = &arch.vae;
    let vae = json!({
        "_class_name": "AutoencoderKL",
        "in_channels": 3,
        "out_channels": 3,
        "block_out_channels": v.block_out_channels,
        "down_block_types": vec!["DownEncoderBlock2D"; v.block_out_channels.len()],
        "up_block_types": vec!["UpDecoderBlock2D"; v.block_out_channels.len()],
        "layers_per_block": v.layers_per_block,
        "norm_num_groups": v.norm_num_groups,
        "latent_channels": v.latent_channels,
        "use_quant_conv": v.use_quant_conv,
        "use_post_quant_conv": v.use_post_quant_conv,
        "scaling_factor": arch.vae_scale,
        "force_upcast": arch.vae_upcast,
    });
    let mut files = vec![("unet", unet), ("vae", vae), ("text_encoder", clip_json(&arch.clip))];
    if let Some(clip2) = &arch.clip2 {
        files.push(("text_encoder_2", clip_json(clip2)));
    }
    for (component, config) in files {
        let folder = dir.join(component);
        let io = |e: std::io::Error| bad(component, e);
        std::fs::create_dir_all(&folder).map_err(io)?;
        let text = serde_json::to_string_pretty(&config).map_err(|e| bad(component, e))?;
        std::fs::write(folder.join(CONFIG), text).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn configs_written_for_an_architecture_read_back_the_same() {
        for variant in [Variant::V1_5, Variant::Turbo, Variant::Xl] {
            for arch in [Architecture::tiny(variant), Architecture::full(variant)] {
                let dir = tempfile::tempdir().unwrap();
                write_configs(dir.path(), &arch).unwrap();
                let read = Architecture::from_dir(dir.path(), variant).unwrap();
                assert_eq!(format!("{read:?}"), format!("{arch:?}"), "{}", variant.name());
            }
        }
    }

    #[test]
    fn a_directory_without_configs_is_the_published_model() {
        let dir = tempfile::tempdir().unwrap();
        let arch = Architecture::from_dir(dir.path(), Variant::Xl).unwrap();
        assert_eq!(format!("{arch:?}"), format!("{:?}", Architecture::full(Variant::Xl)));
    }

    #[test]
    fn the_published_sd15_unet_config_reads_as_the_builtin_numbers() {
        // The fields of runwayml/stable-diffusion-v1-5's unet/config.json that matter here.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("unet")).unwrap();
        let config = json!({
            "_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": 8,
            "block_out_channels": [320, 640, 1280, 1280], "center_input_sample": false,
            "cross_attention_dim": 768,
            "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
            "downsample_padding": 1, "flip_sin_to_cos": true, "freq_shift": 0, "in_channels": 4,
            "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32,
            "out_channels": 4, "sample_size": 64,
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]
        });
        std::fs::write(dir.path().join("unet/config.json"), config.to_string()).unwrap();
        let arch = Architecture::from_dir(dir.path(), Variant::V1_5).unwrap();
        assert_eq!(format!("{arch:?}"), format!("{:?}", Architecture::full(Variant::V1_5)));
    }

    #[test]
    fn the_published_sdxl_configs_read_as_the_builtin_numbers() {
        // The fields that matter here of stabilityai/stable-diffusion-xl-base-1.0's
        // unet, text_encoder, text_encoder_2 and vae config.json.
        let dir = tempfile::tempdir().unwrap();
        let files = [
            (
                "unet/config.json",
                json!({
                    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "addition_embed_type": "text_time",
                    "addition_embed_type_num_heads": 64, "addition_time_embed_dim": 256,
                    "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
                    "center_input_sample": false, "cross_attention_dim": 2048,
                    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                    "downsample_padding": 1, "flip_sin_to_cos": true, "freq_shift": 0, "in_channels": 4,
                    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32,
                    "out_channels": 4, "projection_class_embeddings_input_dim": 2816, "sample_size": 128,
                    "transformer_layers_per_block": [1, 2, 10],
                    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                    "use_linear_projection": true
                }),
            ),
            (
                "text_encoder/config.json",
                json!({
                    "architectures": ["CLIPTextModel"], "hidden_act": "quick_gelu", "hidden_size": 768,
                    "intermediate_size": 3072, "max_position_embeddings": 77, "num_attention_heads": 12,
                    "num_hidden_layers": 12, "projection_dim": 768, "vocab_size": 49408
                }),
            ),
            (
                "text_encoder_2/config.json",
                json!({
                    "architectures": ["CLIPTextModelWithProjection"], "hidden_act": "gelu", "hidden_size": 1280,
                    "intermediate_size": 5120, "max_position_embeddings": 77, "num_attention_heads": 20,
                    "num_hidden_layers": 32, "projection_dim": 1280, "vocab_size": 49408
                }),
            ),
            (
                "vae/config.json",
                json!({
                    "_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512],
                    "force_upcast": true, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,
                    "scaling_factor": 0.13025
                }),
            ),
        ];
        for (path, config) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, config.to_string()).unwrap();
        }
        let arch = Architecture::from_dir(dir.path(), Variant::Xl).unwrap();
        assert_eq!(format!("{arch:?}"), format!("{:?}", Architecture::full(Variant::Xl)));

        // The tokenizers' special tokens decide the padding.
        for (folder, pad) in [("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")] {
            std::fs::create_dir_all(dir.path().join(folder)).unwrap();
            let map = json!({"bos_token": {"content": "<|startoftext|>"}, "pad_token": pad});
            std::fs::write(dir.path().join(folder).join("special_tokens_map.json"), map.to_string()).unwrap();
        }
        let arch = Architecture::from_dir(dir.path(), Variant::Xl).unwrap();
        assert!(arch.clip.pad_with_end);
        assert!(!arch.clip2.unwrap().pad_with_end);
    }

    #[test]
    fn configs_the_pipeline_cannot_run_are_refused() {
        let write = |arch: &Architecture, edit: &dyn Fn(&mut Value, &mut Value)| {
            let dir = tempfile::tempdir().unwrap();
            write_configs(dir.path(), arch).unwrap();
            let read = |c: &str| -> Value {
                serde_json::from_slice(&std::fs::read(dir.path().join(c).join(CONFIG)).unwrap()).unwrap()
            };
            let (mut unet, mut clip2) = (read("unet"), read("text_encoder_2"));
            edit(&mut unet, &mut clip2);
            std::fs::write(dir.path().join("unet").join(CONFIG), unet.to_string()).unwrap();
            std::fs::write(dir.path().join("text_encoder_2").join(CONFIG), clip2.to_string()).unwrap();
            Architecture::from_dir(dir.path(), Variant::Xl)
                .map(drop)
                .unwrap_err()
                .to_string()
        };
        let xl = Architecture::tiny(Variant::Xl);
        let err = write(&xl, &|unet, _| {
            unet["projection_class_embeddings_input_dim"] = json!(100)
        });
        assert!(
            err.contains("add_embedding takes 100") && err.contains("projection gives 16"),
            "{err}"
        );
        let err = write(&xl, &|_, clip2| clip2["architectures"] = json!(["CLIPTextModel"]));
        assert!(err.contains("projection gives none"), "{err}");
        let err = write(&xl, &|unet, _| unet["addition_embed_type"] = json!("image"));
        assert!(
            err.contains("addition_embed_type") && err.contains("not supported"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        write_configs(dir.path(), &xl).unwrap();
        std::fs::create_dir_all(dir.path().join("tokenizer")).unwrap();
        std::fs::write(
            dir.path().join("tokenizer/special_tokens_map.json"),
            r#"{"pad_token": "<pad>"}"#,
        )
        .unwrap();
        let err = Architecture::from_dir(dir.path(), Variant::Xl).unwrap_err().to_string();
        assert!(err.contains("pad token \"<pad>\""), "{err}");
    }

    #[test]
    fn bad_configs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("vae")).unwrap();
        std::fs::write(dir.path().join("vae/config.json"), r#"{"block_out_channels": "wide"}"#).unwrap();
        let err = Architecture::from_dir(dir.path(), Variant::V1_5)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("vae/config.json") && err.contains("block_out_channels"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        write_configs(dir.path(), &Architecture::tiny(Variant::V1_5)).unwrap();
        let wide = clip_json(&ClipConfig::vit_l14(true));
        std::fs::write(dir.path().join("text_encoder/config.json"), wide.to_string()).unwrap();
        let err = Architecture::from_dir(dir.path(), Variant::V1_5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("768 features") && err.contains("attends to 32"), "{err}");
    }
}
