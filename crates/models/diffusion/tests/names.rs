#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The components read the tensor names and shapes of the published
//! checkpoints. The full-size models are built on a backend that records
//! every name and shape asked for and hands back a zero broadcast to the
//! shape (no memory is allocated for it), so SDXL's 2.6 B-parameter UNet
//! costs nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use candle_transformers::models::stable_diffusion::clip as candle_clip;
use candle_transformers::models::stable_diffusion::vae::AutoEncoderKL;
use gantry_model_diffusion::blocks::Kernels;
use gantry_model_diffusion::clip::{ClipConfig, ClipTextEncoder};
use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::unet::UNet;
use gantry_model_diffusion::vae::VaeDecoder;
use gantry_model_diffusion::{Architecture, Variant};

type Names = BTreeMap<String, Vec<usize>>;

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Names>>);

impl SimpleBackend for Recorder {
    fn get(&self, s: Shape, name: &str, _: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        self.0.lock().unwrap().insert(name.to_owned(), s.dims().to_vec());
        Tensor::zeros((), dtype, dev)?.broadcast_as(s)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        candle_core::bail!("{name}: no shape")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

fn record(build: impl FnOnce(VarBuilder<'static>) -> Result<()>) -> Names {
    let recorder = Recorder::default();
    build(VarBuilder::from_backend(
        Box::new(recorder.clone()),
        DType::F32,
        Device::Cpu,
    ))
    .unwrap();
    recorder.0.lock().unwrap().clone()
}

fn unet(arch: &Architecture) -> Names {
    record(|vb| UNet::new(vb, &arch.unet, arch.text_time, Kernels::Candle).map(drop))
}

fn vae(arch: &Architecture) -> Names {
    record(|vb| AutoEncoderKL::new(vb, 3, 3, arch.vae.clone()).map(drop))
}

fn decoder(arch: &Architecture) -> Names {
    record(|vb| VaeDecoder::new(vb, &arch.vae, Kernels::Candle).map(drop))
}

fn ours(config: &ClipConfig) -> Names {
    record(|vb| ClipTextEncoder::new(vb, config, Kernels::Candle).map(drop))
}

fn candles(config: &candle_clip::Config) -> Names {
    record(|vb| candle_clip::ClipTextTransformer::new(vb, config).map(drop))
}

/// The names with every number replaced by `N`: the kinds of tensor.
fn kinds(names: &Names) -> BTreeSet<String> {
    names
        .keys()
        .map(|n| {
            n.split('.')
                .map(|p| if p.parse::<usize>().is_ok() { "N" } else { p })
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect()
}

fn read_names(path: &std::path::Path) -> Names {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.dims().to_vec()))
        .collect()
}

#[test]
fn the_text_encoders_read_what_candles_clip_reads() {
    // every name and every shape, for the four published text encoders
    assert_eq!(ours(&ClipConfig::vit_l14(true)), candles(&candle_clip::Config::v1_5()));
    assert_eq!(ours(&ClipConfig::vit_h14()), candles(&candle_clip::Config::v2_1()));
    assert_eq!(ours(&ClipConfig::vit_l14(false)), candles(&candle_clip::Config::sdxl()));
    // SDXL's second encoder is a CLIPTextModelWithProjection: candle's
    // transformer plus `text_projection` (1280 x 1280, no bias)
    let mut bigg = ours(&ClipConfig::vit_bigg14());
    assert_eq!(bigg.remove("text_projection.weight"), Some(vec![1280, 1280]));
    assert_eq!(bigg, candles(&candle_clip::Config::sdxl2()));
    let names = ours(&ClipConfig::vit_l14(true));
    assert_eq!(names.len(), 2 + 12 * 16 + 2);
    assert_eq!(names["text_model.encoder.layers.0.self_attn.q_proj.weight"], [768, 768]);
    assert_eq!(names["text_model.embeddings.token_embedding.weight"], [49408, 768]);
    assert_eq!(names["text_model.embeddings.position_embedding.weight"], [77, 768]);
    assert_eq!(names["text_model.final_layer_norm.bias"], [768]);
    assert_eq!(
        ours(&ClipConfig::vit_bigg14())["text_model.encoder.layers.31.mlp.fc1.weight"],
        [5120, 1280]
    );
}

#[test]
fn full_size_unets_and_vaes_have_the_diffusers_names() {
    let v15 = unet(&Architecture::full(Variant::V1_5));
    assert_eq!(
        v15["down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight"],
        [320, 320]
    );
    assert_eq!(
        v15["down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"],
        [320, 768]
    );
    assert_eq!(v15["down_blocks.0.attentions.0.proj_in.weight"], [320, 320, 1, 1]);
    assert_eq!(
        v15["mid_block.attentions.0.transformer_blocks.0.attn2.to_v.weight"],
        [1280, 768]
    );
    assert_eq!(v15["conv_in.weight"], [320, 4, 3, 3]);
    assert_eq!(v15["conv_out.weight"], [4, 320, 3, 3]);
    assert_eq!(v15["time_embedding.linear_1.weight"], [1280, 320]);
    assert_eq!(
        v15["up_blocks.3.attentions.2.transformer_blocks.0.ff.net.0.proj.weight"],
        [2560, 320]
    );
    // 686 tensors in runwayml/stable-diffusion-v1-5's unet/diffusion_pytorch_model.safetensors
    assert_eq!(v15.len(), 686);
    assert_eq!(
        v15.values().map(|s| s.iter().product::<usize>()).sum::<usize>(),
        859_520_964
    );

    let v21 = unet(&Architecture::full(Variant::Turbo));
    // SD 2.x: linear projections in and out of the transformers, 1024-wide context
    assert_eq!(v21["down_blocks.0.attentions.0.proj_in.weight"], [320, 320]);
    assert_eq!(
        v21["down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"],
        [320, 1024]
    );
    assert_eq!(
        v21.values().map(|s| s.iter().product::<usize>()).sum::<usize>(),
        865_910_724
    );

    let xl = unet(&Architecture::full(Variant::Xl));
    assert!(!xl.contains_key("down_blocks.0.attentions.0.proj_in.weight"));
    // the pooled text embedding (1280) and six time ids (6 x 256) join the
    // time embedding through `add_embedding`
    assert_eq!(xl["add_embedding.linear_1.weight"], [1280, 2816]);
    assert_eq!(xl["add_embedding.linear_2.weight"], [1280, 1280]);
    // 1680 tensors and 2 567 463 684 parameters in
    // stabilityai/stable-diffusion-xl-base-1.0's unet/diffusion_pytorch_model.safetensors
    assert_eq!(xl.len(), 1680);
    assert_eq!(
        xl.values().map(|s| s.iter().product::<usize>()).sum::<usize>(),
        2_567_463_684
    );
    assert_eq!(
        xl["down_blocks.2.attentions.1.transformer_blocks.9.attn2.to_k.weight"],
        [1280, 2048]
    );
    assert_eq!(
        xl["mid_block.attentions.0.transformer_blocks.9.attn1.to_out.0.weight"],
        [1280, 1280]
    );

    for variant in [Variant::V1_5, Variant::Turbo, Variant::Xl] {
        let vae = vae(&Architecture::full(variant));
        assert_eq!(vae["decoder.up_blocks.0.resnets.0.conv1.weight"], [512, 512, 3, 3]);
        assert_eq!(vae["encoder.down_blocks.0.resnets.0.conv1.weight"], [128, 128, 3, 3]);
        assert_eq!(vae["decoder.mid_block.attentions.0.to_q.weight"], [512, 512]);
        assert_eq!(vae["decoder.mid_block.attentions.0.to_out.0.weight"], [512, 512]);
        assert_eq!(vae["quant_conv.weight"], [8, 8, 1, 1]);
        assert_eq!(vae["post_quant_conv.weight"], [4, 4, 1, 1]);
        // the decoder reads every tensor of the file but the encoder's
        let mut decoding = vae.clone();
        decoding.retain(|name, _| !name.starts_with("encoder.") && !name.starts_with("quant_conv."));
        assert_eq!(decoder(&Architecture::full(variant)), decoding);
        assert_eq!(
            vae.values().map(|s| s.iter().product::<usize>()).sum::<usize>(),
            83_653_863
        );
    }
}

#[test]
fn tiny_weights_have_the_structure_of_the_full_models() {
    for variant in [Variant::V1_5, Variant::Turbo, Variant::Xl] {
        let dir = tempfile::tempdir().unwrap();
        let tiny = Architecture::tiny(variant);
        write_tiny_weights(dir.path(), &tiny).unwrap();
        let full = Architecture::full(variant);
        // what was written is what the models read
        let unet_file = read_names(&dir.path().join("unet/diffusion_pytorch_model.safetensors"));
        assert_eq!(unet_file, unet(&tiny), "{variant:?}");
        let vae_file = read_names(&dir.path().join("vae/diffusion_pytorch_model.safetensors"));
        assert_eq!(vae_file, vae(&tiny), "{variant:?}");
        let clip_file = read_names(&dir.path().join("text_encoder/model.safetensors"));
        assert_eq!(clip_file, ours(&tiny.clip));
        // the same kinds of tensor as the full model, and tiny names are full names
        for (tiny_names, full_names) in [
            (unet_file, unet(&full)),
            (vae_file, vae(&full)),
            (clip_file, ours(&full.clip)),
        ] {
            assert_eq!(kinds(&tiny_names), kinds(&full_names), "{variant:?}");
            let missing: Vec<_> = tiny_names.keys().filter(|n| !full_names.contains_key(*n)).collect();
            assert!(missing.is_empty(), "{variant:?}: {missing:?}");
        }
        if let (Some(tiny2), Some(full2)) = (&tiny.clip2, &full.clip2) {
            let file = read_names(&dir.path().join("text_encoder_2/model.safetensors"));
            assert_eq!(file, ours(tiny2));
            assert_eq!(kinds(&file), kinds(&ours(full2)));
        }
    }
}
