//! Stable Diffusion end to end: tiny randomly initialised weights in the
//! diffusers layout (the real tensor names, smaller shapes, each component's
//! `config.json`) written by the test, an operator's model manifest that
//! names them with `path:` sources and their SHA-256, the pull that copies
//! and verifies them into the models directory, and the real pipeline
//! behind the public endpoints: images of the requested size, same seed same
//! bytes, step progress, cancellation, and billing by delivered megapixels.
use std::path::Path;
use std::time::{Duration, Instant};

use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::{Architecture, Variant};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::harness::{Backend, TestApp};

const MODEL: &str = "sd15-tiny";
const XL_MODEL: &str = "sdxl-tiny";

gantry_testkit::on_both_backends!(
    an_operator_manifest_serves_stable_diffusion_billed_by_its_pixels,
    a_long_generation_shows_its_steps_and_a_cancel_costs_nothing,
    an_sdxl_model_answers_with_its_extra_conditioning,
);

/// A bundled model whose files are all there but that does not load (here
/// an engine table naming no known variant) is left out of `serve`, as one
/// whose weights are missing: the platform starts and serves the others.
#[tokio::test]
async fn a_bundled_model_that_does_not_load_is_left_out_and_the_rest_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = operator_manifest(dir.path(), Variant::V1_5, MODEL);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("variant = \"sd-1.5\"", "variant = \"sd-0.9\"")).unwrap();
    let models = dir.path().join("models");
    let app = TestApp::spawn_with(Backend::Sqlite, |s| {
        s.manifest = Some(manifest);
        s.scheduler.bundled_workers = vec![MODEL.into(), "gantry-echo".into()];
        s.models_dir = Some(models);
        s.pull_on_start = true;
    })
    .await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let done = app
        .public_ok_with(
            Method::POST,
            "/v2/gantry-echo/runsync",
            &key,
            json!({"input": {"hello": "world"}}),
        )
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["output"]["hello"], "world");
    // The model's files were fetched and verified: only its loading failed.
    assert!(dir.path().join("models").join(MODEL).join("unet").is_dir());
}

/// Writes tiny weights of `variant` under `dir/weights` and a manifest
/// naming every file (relative `path:` sources) as model `id` in
/// `dir/models.toml`.
fn operator_manifest(dir: &Path, variant: Variant, id: &str) -> std::path::PathBuf {
    let weights = dir.join("weights");
    write_tiny_weights(&weights, &Architecture::tiny(variant)).unwrap();
    let mut files = Vec::new();
    let mut components = vec!["text_encoder", "unet", "vae", "tokenizer"];
    if variant == Variant::Xl {
        components.push("text_encoder_2");
    }
    for component in components {
        let mut names: Vec<_> = std::fs::read_dir(weights.join(component))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for name in names {
            let bytes = std::fs::read(weights.join(component).join(&name)).unwrap();
            files.push(format!(
                "[[models.files]]\nname = \"{component}/{name}\"\nsha256 = \"{}\"\nsize = {}\nsource = \"path:weights/{component}/{name}\"\n",
                Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>(),
                bytes.len()
            ));
        }
    }
    let manifest = format!(
        r#"[[models]]
id = "{id}"
category = "image"
unit = "megapixels"
price = {{ micro_usd = 20000, per = 1 }}
hold = {{ product = {{ fields = {{ width = 512, height = 512, num_images = 1 }}, divide = 1000000 }} }}
description = "The {variant} pipeline on tiny random weights"
license = "Apache-2.0"
engine = {{ architecture = "stable-diffusion", variant = "{variant}" }}
input_schema = '{{"type": "object", "required": ["prompt"]}}'
{files}"#,
        variant = variant.name(),
        files = files.join("")
    );
    let path = dir.join("models.toml");
    std::fs::write(&path, manifest).unwrap();
    path
}

async fn diffusion_app(backend: Backend) -> (TestApp, tempfile::TempDir) {
    diffusion_app_of(backend, Variant::V1_5, MODEL).await
}

async fn diffusion_app_of(backend: Backend, variant: Variant, id: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = operator_manifest(dir.path(), variant, id);
    let models = dir.path().join("models");
    let app = TestApp::spawn_with(backend, |s| {
        s.manifest = Some(manifest);
        s.scheduler.bundled_workers = vec![id.into()];
        s.models_dir = Some(models);
        s.pull_on_start = true;
    })
    .await;
    (app, dir)
}

impl TestApp {
    async fn paint(&self, key: &str, input: Value) -> Value {
        self.paint_with(MODEL, key, input).await
    }

    async fn paint_with(&self, model: &str, key: &str, input: Value) -> Value {
        self.public_ok_with(
            Method::POST,
            &format!("/v2/{model}/runsync"),
            key,
            json!({ "input": input }),
        )
        .await
    }

    async fn png(&self, url: &str) -> Vec<u8> {
        let res = self.client.get(url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        assert_eq!(res.headers()["content-type"], "image/png");
        res.bytes().await.unwrap().to_vec()
    }
}

async fn an_operator_manifest_serves_stable_diffusion_billed_by_its_pixels(backend: Backend) {
    let (app, dir) = diffusion_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;

    // The pull copied the weights into the models directory, in their subdirectories.
    let unet = dir
        .path()
        .join("models")
        .join(MODEL)
        .join("unet/diffusion_pytorch_model.safetensors");
    assert!(unet.is_file(), "{}", unet.display());
    // The model is listed with the manifest's price and schema.
    let listed = app.public_ok(Method::GET, "/v2/models", &key).await;
    let entry = listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == MODEL)
        .cloned()
        .unwrap_or_else(|| panic!("{MODEL} is not listed: {listed}"));
    assert_eq!(entry["category"], "image");
    assert_eq!(entry["price"]["usd"], "0.02");
    assert_eq!(entry["available"], true);

    let input = json!({"prompt": "a cat", "width": 64, "height": 96, "num_inference_steps": 3, "seed": 7});
    let job = app.paint(&key, input.clone()).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    assert_eq!(
        (output["width"].as_u64(), output["height"].as_u64()),
        (Some(64), Some(96))
    );
    assert_eq!(output["seed"], 7);
    let bytes = app.png(output["image_url"].as_str().unwrap()).await;
    let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (64, 96));
    // 6144 pixels at 0.02 USD per megapixel: 122.88 micro-USD, rounded once.
    let id = job["id"].as_str().unwrap();
    assert_eq!(app.charges(id).await, [123 + app.kept_files_charge(id).await]);

    // Same seed, same bytes; another prompt, another image.
    let again = app.paint(&key, input).await;
    assert_eq!(app.png(again["output"]["image_url"].as_str().unwrap()).await, bytes);
    let other = app
        .paint(
            &key,
            json!({"prompt": "the dog", "width": 64, "height": 96, "num_inference_steps": 3, "seed": 7}),
        )
        .await;
    assert_ne!(app.png(other["output"]["image_url"].as_str().unwrap()).await, bytes);

    // Several images in another format: every delivered pixel is billed.
    let job = app
        .paint(
            &key,
            json!({"prompt": "a cat", "width": 64, "height": 64, "num_inference_steps": 2, "num_images": 2,
                   "output_format": "jpeg", "seed": 1}),
        )
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let urls = job["output"]["images"].as_array().unwrap();
    assert_eq!(urls.len(), 2);
    // 2 x 4096 pixels x 20000 / 10^6 = 163.84 micro-USD.
    let id = job["id"].as_str().unwrap();
    assert_eq!(app.charges(id).await, [164 + app.kept_files_charge(id).await]);

    // What the model cannot honour fails before any work and costs nothing.
    for (input, needle) in [
        (json!({"prompt": "a cat", "width": 60}), "width"),
        (
            json!({"prompt": "a cat", "num_inference_steps": 1000}),
            "num_inference_steps",
        ),
        (json!({"width": 64}), "prompt"),
    ] {
        let job = app.paint(&key, input).await;
        assert_eq!(job["status"], "FAILED", "{job}");
        let error = job["error"].as_str().unwrap();
        assert!(
            error.starts_with("bad input") && error.contains(needle),
            "{needle} in {error}"
        );
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

async fn a_long_generation_shows_its_steps_and_a_cancel_costs_nothing(backend: Backend) {
    let (app, _dir) = diffusion_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app
        .public_ok_with(
            Method::POST,
            &format!("/v2/{MODEL}/run"),
            &key,
            json!({"input": {"prompt": "a cat", "width": 256, "height": 256, "num_inference_steps": 100, "num_images": 4}}),
        )
        .await;
    let id = job["id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let step = loop {
        let status = app
            .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), &key)
            .await;
        if status["status"] == "IN_PROGRESS" && status["progress"]["step"].is_u64() {
            assert_eq!(status["progress"]["steps"], 400, "{status}");
            break status["progress"]["step"].as_u64().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no step progress: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The steps move on.
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let status = app
            .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), &key)
            .await;
        if status["progress"]["step"].as_u64().unwrap() > step {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "progress stalls at {step}"
        );
    }
    let cancelled = app
        .public_ok(Method::POST, &format!("/v2/{MODEL}/cancel/{id}"), &key)
        .await;
    assert_eq!(cancelled["status"], "CANCELLED");
    // The worker stops at its next step and takes the next job.
    let next = app
        .paint(
            &key,
            json!({"prompt": "a cat", "width": 64, "height": 64, "num_inference_steps": 1}),
        )
        .await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    let status = app
        .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), &key)
        .await;
    assert_eq!(status["status"], "CANCELLED");
    assert_eq!(app.charges(&id).await, Vec::<i64>::new());
}

/// SDXL behind the public endpoint: two text encoders, the second one's
/// pooled output and the image size through the UNet's `add_embedding`, and
/// guidance whose negative side is zeros without a negative prompt.
async fn an_sdxl_model_answers_with_its_extra_conditioning(backend: Backend) {
    let (app, _dir) = diffusion_app_of(backend, Variant::Xl, XL_MODEL).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let input = json!({"prompt": "a cat", "width": 64, "height": 72, "num_inference_steps": 3,
                       "guidance_scale": 5, "seed": 3});
    let job = app.paint_with(XL_MODEL, &key, input.clone()).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let bytes = app.png(job["output"]["image_url"].as_str().unwrap()).await;
    assert_eq!(
        image::load_from_memory(&bytes).unwrap().to_rgb8().dimensions(),
        (64, 72)
    );
    // 4608 pixels at 0.02 USD per megapixel: 92.16 micro-USD.
    let id = job["id"].as_str().unwrap();
    assert_eq!(app.charges(id).await, [92 + app.kept_files_charge(id).await]);

    // Same seed, same bytes; a negative prompt replaces the zeros, and the
    // requested size enters the conditioning, so both change the image.
    let again = app.paint_with(XL_MODEL, &key, input.clone()).await;
    assert_eq!(app.png(again["output"]["image_url"].as_str().unwrap()).await, bytes);
    let mut negative = input.clone();
    negative["negative_prompt"] = json!("a dog");
    let other = app.paint_with(XL_MODEL, &key, negative).await;
    assert_eq!(other["status"], "COMPLETED", "{other}");
    assert_ne!(app.png(other["output"]["image_url"].as_str().unwrap()).await, bytes);
}
