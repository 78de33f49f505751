#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Every component of the three tiny pipelines, and each pipeline as a
//! whole, against diffusers and transformers: the text encoders (last hidden state, the next-to-last one
//! SDXL reads, and the projected pooled output), the UNet (batch of two,
//! timestep 601, at a latent size the down path halves evenly and at one it
//! does not; for SDXL with the pooled embedding and time ids through
//! `add_embedding`) and the VAE decoder. The expected outputs in
//! `tests/data/reference/` were computed by `tests/reference/reference.py`
//! from the very weights `write_tiny_weights` draws here (they are seeded
//! by tensor name); `tests/reference/regenerate.sh` rewrites them.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use gantry_model_diffusion::blocks::Kernels;
use gantry_model_diffusion::clip::ClipTextEncoder;
use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::unet::{Conditioning, UNet};
use gantry_model_diffusion::vae::VaeDecoder;
use gantry_model_diffusion::{Architecture, Params, Pipeline, Variant};

fn weights(path: PathBuf) -> VarBuilder<'static> {
    VarBuilder::from_buffered_safetensors(std::fs::read(path).unwrap(), DType::F32, &Device::Cpu).unwrap()
}

fn fixture(variant: Variant) -> HashMap<String, Tensor> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference")
        .join(format!("{}.safetensors", variant.name()));
    candle_core::safetensors::load(&path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

/// `got` equals `want` to float32 rounding: the largest difference is at
/// most 1e-4 of the largest value (or 1e-4, for small values).
fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_within(what, got, want, 1e-4);
}

fn assert_within(what: &str, got: &Tensor, want: &Tensor, tolerance: f32) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let scale = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .max(1.0);
    let diff = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        diff <= tolerance * scale,
        "{what}: differs from the reference by up to {diff} (largest value {scale}); \
         if the tiny weights changed on purpose, run tests/reference/regenerate.sh"
    );
}

fn check(variant: Variant) {
    let dir = tempfile::tempdir().unwrap();
    let arch = Architecture::tiny(variant);
    write_tiny_weights(dir.path(), &arch).unwrap();
    let want = fixture(variant);

    let encoders = std::iter::once(("text_encoder", "clip", &arch.clip))
        .chain(arch.clip2.as_ref().map(|c| ("text_encoder_2", "clip2", c)));
    for ((folder, name, config), kernels) in encoders.flat_map(|e| [(e, Kernels::Candle), (e, Kernels::Packed)]) {
        let file = weights(dir.path().join(folder).join("model.safetensors"));
        let encoder = ClipTextEncoder::new(file, config, kernels).unwrap();
        let what = format!("{name} ({kernels:?})");
        let ids = &want[&format!("{name}.ids")];
        assert_close(
            &format!("{what} last"),
            &encoder.forward(ids).unwrap(),
            &want[&format!("{name}.last")],
        );
        let encoded = encoder.encode(ids).unwrap();
        assert_close(
            &format!("{what} penultimate"),
            &encoded.penultimate,
            &want[&format!("{name}.penultimate")],
        );
        match (encoded.pooled, want.get(&format!("{name}.pooled"))) {
            (Some(got), Some(expected)) => assert_close(&format!("{what} pooled"), &got, expected),
            (None, None) => {}
            (got, expected) => panic!(
                "{name}: pooled output {} but the reference {}",
                if got.is_some() { "computed" } else { "missing" },
                if expected.is_some() { "has one" } else { "has none" }
            ),
        }
    }

    // Both kernels: candle's convolutions and the packed ones the pipeline
    // runs on the CPU.
    for kernels in [Kernels::Candle, Kernels::Packed] {
        let unet = UNet::new(
            weights(dir.path().join("unet/diffusion_pytorch_model.safetensors")),
            &arch.unet,
            arch.text_time,
            kernels,
        )
        .unwrap();
        for label in ["even", "odd"] {
            let get = |part: &str| want.get(&format!("unet.{label}.{part}"));
            let extra = match (get("text_embeds"), get("time_ids")) {
                (Some(text_embeds), Some(time_ids)) => Some(Conditioning { text_embeds, time_ids }),
                _ => None,
            };
            assert_eq!(extra.is_some(), arch.text_time.is_some(), "{label}: conditioning");
            let out = unet
                .forward(get("latents").unwrap(), 601.0, get("context").unwrap(), extra)
                .unwrap();
            // candle's UNet feed-forward (GEGLU) uses the tanh approximation of
            // GELU where diffusers' is exact: to float32 rounding against
            // diffusers run with that approximation, and within 0.3 % of the
            // largest value against diffusers as published (about 0.05 % is
            // seen; a missing or misplaced conditioning is off by 100 %).
            assert_close(
                &format!("unet ({label}, {kernels:?}, tanh GELU)"),
                &out,
                get("out_tanh_gelu").unwrap(),
            );
            assert_within(&format!("unet ({label}, {kernels:?})"), &out, get("out").unwrap(), 3e-3);
        }

        let vae = VaeDecoder::new(
            weights(dir.path().join("vae/diffusion_pytorch_model.safetensors")),
            &arch.vae,
            kernels,
        )
        .unwrap();
        assert_close(
            &format!("vae ({kernels:?})"),
            &vae.decode(&want["vae.latents"]).unwrap(),
            &want["vae.out"],
        );
    }

    // The whole pipeline from the same starting noise: tokenizer, encoders,
    // guidance, DDIM's timesteps and steps, SDXL's time ids and zeros for
    // an empty negative prompt, the VAE's scaling and the conversion to
    // 8-bit pixels.
    let pipeline = Pipeline::load_with(dir.path(), arch, &Device::Cpu, DType::F32).unwrap();
    let params = pipeline_case(variant);
    let noise = want["pipeline.noise"].flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut steps = Vec::new();
    let images = pipeline
        .generate_from_noise(&params, &[noise], |k, n| {
            steps.push((k, n));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(
        steps,
        (1..=params.steps).map(|k| (k, params.steps)).collect::<Vec<_>>(),
        "one UNet step per requested step"
    );
    let image = &images[0];
    let reference = &want["pipeline.image"];
    assert_eq!(
        reference.dims(),
        [params.height as usize, params.width as usize, 3],
        "reference size"
    );
    assert_eq!((image.width, image.height), (params.width, params.height));
    let expected = reference.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let worst = image
        .pixels
        .iter()
        .zip(&expected)
        .map(|(&got, &want)| (f32::from(got) - want * 255.0).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1.0,
        "{}: the image differs from diffusers' by up to {worst} levels of 255",
        variant.name()
    );
}

/// What `reference.py` asked diffusers' pipeline for (its `PIPELINE_CASES`).
fn pipeline_case(variant: Variant) -> Params {
    let (prompt, negative, steps, guidance, height, width) = match variant {
        Variant::V1_5 => ("the cat", "a dog", 4, 7.5, 64, 48),
        Variant::Turbo => ("the cat", "", 3, 0.0, 64, 64),
        Variant::Xl => ("the dog", "", 3, 5.0, 64, 56),
    };
    Params {
        prompt: prompt.into(),
        negative_prompt: negative.into(),
        width,
        height,
        num_images: 1,
        steps,
        guidance_scale: guidance,
        seed: 0,
    }
}

#[test]
fn sd15_components_match_diffusers() {
    check(Variant::V1_5);
}

#[test]
fn sd_turbo_components_match_diffusers() {
    check(Variant::Turbo);
}

#[test]
fn sdxl_components_match_diffusers() {
    check(Variant::Xl);
}

#[test]
fn an_sdxl_unet_refuses_to_run_without_its_conditioning() {
    let dir = tempfile::tempdir().unwrap();
    let arch = Architecture::tiny(Variant::Xl);
    write_tiny_weights(dir.path(), &arch).unwrap();
    let unet = UNet::new(
        weights(dir.path().join("unet/diffusion_pytorch_model.safetensors")),
        &arch.unet,
        arch.text_time,
        Kernels::Packed,
    )
    .unwrap();
    let latents = Tensor::zeros((1, 4, 8, 8), DType::F32, &Device::Cpu).unwrap();
    let context = Tensor::zeros((1, 16, arch.unet.cross_attention_dim), DType::F32, &Device::Cpu).unwrap();
    let err = unet.forward(&latents, 1.0, &context, None).unwrap_err().to_string();
    assert!(err.contains("time ids"), "{err}");
}

#[test]
fn sliced_attention_gives_the_unsliced_result() {
    // 2 samples x 8 heads = 16 rows of attention, in slices of 5: the last
    // slice holds one row.
    let dir = tempfile::tempdir().unwrap();
    let arch = Architecture::tiny(Variant::V1_5);
    write_tiny_weights(dir.path(), &arch).unwrap();
    let file = dir.path().join("unet/diffusion_pytorch_model.safetensors");
    let mut sliced = arch.unet.clone();
    sliced.sliced_attention_size = Some(5);
    // Slicing applies to candle's attention; the packed kernels' attention
    // is fused (bands of query rows) and ignores it, so it is the third
    // result that must agree.
    let whole = UNet::new(weights(file.clone()), &arch.unet, None, Kernels::Candle).unwrap();
    let sliced_candle = UNet::new(weights(file.clone()), &sliced, None, Kernels::Candle).unwrap();
    let sliced_fused = UNet::new(weights(file), &sliced, None, Kernels::Packed).unwrap();
    let latents = Tensor::randn(0f32, 1.0, (2, 4, 8, 8), &Device::Cpu).unwrap();
    let context = Tensor::randn(0f32, 1.0, (2, 16, arch.unet.cross_attention_dim), &Device::Cpu).unwrap();
    let want = whole.forward(&latents, 500.0, &context, None).unwrap();
    let got = sliced_candle.forward(&latents, 500.0, &context, None).unwrap();
    assert_close("sliced attention", &got, &want);
    let fused = sliced_fused.forward(&latents, 500.0, &context, None).unwrap();
    assert_close("fused attention (slicing configured)", &fused, &want);
}
