#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The real loading and sampling code on tiny random weights written in the
//! diffusers layout, for each variant.

use std::ops::ControlFlow;
use std::path::Path;

use candle_core::{DType, Device};
use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::{Architecture, DiffusionModel, LoadOptions, Params, Pipeline, PipelineError, Variant};

fn tiny(variant: Variant, dir: &Path) -> Pipeline {
    write_tiny_weights(dir, &Architecture::tiny(variant)).unwrap();
    for file in [
        "unet/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert_eq!(
        dir.join("text_encoder_2/model.safetensors").is_file(),
        variant == Variant::Xl
    );
    Pipeline::load_with(dir, Architecture::tiny(variant), &Device::Cpu, DType::F32).unwrap()
}

fn params(width: u32, height: u32, steps: usize, guidance_scale: f64, seed: u64) -> Params {
    Params {
        prompt: "the cat and the dog".into(),
        negative_prompt: String::new(),
        width,
        height,
        num_images: 1,
        steps,
        guidance_scale,
        seed,
    }
}

fn check_variant(variant: Variant) {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = tiny(variant, dir.path());
    let (steps, guidance) = if variant == Variant::Turbo { (1, 0.0) } else { (3, 7.5) };

    // the requested sizes, square and not
    let mut calls = Vec::new();
    let square = pipeline
        .generate(&params(64, 64, steps, guidance, 1), |k, n| {
            calls.push((k, n));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(
        calls,
        (1..=steps).map(|k| (k, steps)).collect::<Vec<_>>(),
        "progress once a step"
    );
    assert_eq!(square.len(), 1);
    assert_eq!(
        (square[0].width, square[0].height, square[0].pixels.len()),
        (64, 64, 64 * 64 * 3)
    );
    let wide = pipeline
        .generate(&params(96, 64, steps, guidance, 1), |_, _| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(
        (wide[0].width, wide[0].height, wide[0].pixels.len()),
        (96, 64, 96 * 64 * 3)
    );

    // same seed, same bytes; another seed, other pixels
    let again = pipeline
        .generate(&params(64, 64, steps, guidance, 1), |_, _| ControlFlow::Continue(()))
        .unwrap();
    assert!(square == again, "same seed, same bytes");
    let other = pipeline
        .generate(&params(64, 64, steps, guidance, 2), |_, _| ControlFlow::Continue(()))
        .unwrap();
    assert_ne!(square[0].pixels, other[0].pixels);
    let distinct: std::collections::HashSet<u8> = square[0].pixels.iter().copied().collect();
    assert!(distinct.len() > 8, "the image is not flat");

    // several images: image i is the one of seed + i
    let mut two = params(64, 64, steps, guidance, 1);
    two.num_images = 2;
    let both = pipeline.generate(&two, |_, _| ControlFlow::Continue(())).unwrap();
    assert_eq!(both.len(), 2);
    assert!(
        both[0] == square[0] && both[1] == other[0],
        "image i is the image of seed + i"
    );

    // cancellation between steps
    let mut seen = 0;
    let stopped = pipeline.generate(&params(64, 64, steps, guidance, 1), |k, _| {
        seen = k;
        ControlFlow::Break(())
    });
    assert!(matches!(stopped, Err(PipelineError::Cancelled)));
    assert_eq!(seen, 1);
    let mut calls = 0;
    pipeline
        .generate(&two, |k, n| {
            calls += 1;
            assert_eq!((k, n), (calls, 2 * steps));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(calls, 2 * steps, "progress once a step of every image");
}

#[test]
fn sd_1_5_end_to_end() {
    check_variant(Variant::V1_5);
}

#[test]
fn sd_turbo_end_to_end() {
    check_variant(Variant::Turbo);
}

#[test]
fn sdxl_end_to_end() {
    check_variant(Variant::Xl);
}

#[test]
fn negative_prompt_changes_a_guided_image() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = tiny(Variant::V1_5, dir.path());
    let plain = pipeline
        .generate(&params(64, 64, 2, 7.5, 3), |_, _| ControlFlow::Continue(()))
        .unwrap();
    let mut negative = params(64, 64, 2, 7.5, 3);
    negative.negative_prompt = "the dog".into();
    let steered = pipeline.generate(&negative, |_, _| ControlFlow::Continue(())).unwrap();
    assert_ne!(plain[0].pixels, steered[0].pixels);
}

#[test]
fn model_loads_through_the_worker_entry_point() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_weights(dir.path(), &Architecture::tiny(Variant::Turbo)).unwrap();
    // The directory's config.json files describe the tiny architecture.
    let model = DiffusionModel::load("sd-turbo-tiny", dir.path(), Variant::Turbo, LoadOptions::default()).unwrap();
    assert_eq!(model.variant(), Variant::Turbo);
    assert_eq!(model.pipeline().architecture().unet.cross_attention_dim, 32);
    // Without them, the published architecture does not fit the tiny weights.
    for component in ["unet", "vae", "text_encoder"] {
        std::fs::remove_file(dir.path().join(component).join("config.json")).unwrap();
    }
    let e = DiffusionModel::load("sd-turbo", dir.path(), Variant::Turbo, LoadOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("cannot load sd-turbo"), "{e}");
    let options = LoadOptions {
        architecture: Some(Architecture::tiny(Variant::Turbo)),
        ..LoadOptions::default()
    };
    DiffusionModel::load("sd-turbo-tiny", dir.path(), Variant::Turbo, options).unwrap();
    let missing = DiffusionModel::load("x", &dir.path().join("nope"), Variant::V1_5, LoadOptions::default())
        .err()
        .unwrap();
    assert!(missing.to_string().contains("tokenizer"), "{missing}");
}

#[test]
fn sdxl_in_half_precision_decodes_in_float32() {
    // diffusers' `force_upcast`: on for SDXL (its VAE overflows float16),
    // off for the others unless their vae/config.json says so.
    assert_eq!(Architecture::full(Variant::Xl).vae_dtype(DType::F16), DType::F32);
    assert_eq!(Architecture::full(Variant::V1_5).vae_dtype(DType::F16), DType::F16);
    assert_eq!(Architecture::full(Variant::Xl).vae_dtype(DType::F32), DType::F32);
    // The whole pipeline in half precision (here on the CPU): the UNet's
    // float16 latents meet a float32 VAE.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_weights(dir.path(), &Architecture::tiny(Variant::Xl)).unwrap();
    let pipeline = Pipeline::load_with(dir.path(), Architecture::tiny(Variant::Xl), &Device::Cpu, DType::F16).unwrap();
    let images = pipeline
        .generate(&params(64, 72, 2, 5.0, 1), |_, _| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!((images[0].width, images[0].height), (64, 72));
}
