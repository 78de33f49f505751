//! The image models end to end with their real weights (fetched once into
//! `GANTRY_TEST_MODELS_DIR`, converted to safetensors by the pull): the
//! public endpoints, the expiring file URLs, the images themselves, and
//! billing by delivered megapixels.
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};
use crate::text::models_dir;

const FACES: &str = "dcgan-faces-64";
const EYES: &str = "eyes-128";

gantry_testkit::on_both_backends!(
    a_face_is_a_real_png_billed_by_its_pixels,
    inputs_a_model_cannot_honour_fail_and_cost_nothing,
);

async fn image_app(backend: Backend) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec![FACES.into(), EYES.into()];
        s.scheduler.bundled_slots = 2;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
    })
    .await
}

impl TestApp {
    async fn draw(&self, model: &str, key: &str, input: Value) -> Value {
        let res = self
            .public(Method::POST, &format!("/v2/{model}/runsync"), key)
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }

    /// The bytes behind a file URL, checking its media type.
    async fn fetch_image(&self, url: &str, media_type: &str) -> Vec<u8> {
        let res = self.client.get(url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        assert_eq!(res.headers()["content-type"], media_type);
        res.bytes().await.unwrap().to_vec()
    }
}

fn decode(bytes: &[u8]) -> image::RgbImage {
    image::load_from_memory(bytes).expect("a decodable image").to_rgb8()
}

/// Mean and standard deviation of all channels.
fn spread(img: &image::RgbImage) -> (f64, f64) {
    let values: Vec<f64> = img.as_raw().iter().map(|v| f64::from(*v)).collect();
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
    (mean, var.sqrt())
}

async fn a_face_is_a_real_png_billed_by_its_pixels(backend: Backend) {
    let app = image_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app.draw(FACES, &key, json!({"prompt": "a face", "seed": 7})).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    assert_eq!(
        (output["width"].as_u64(), output["height"].as_u64()),
        (Some(64), Some(64))
    );
    assert_eq!(output["seed"], 7);
    let bytes = app
        .fetch_image(output["image_url"].as_str().expect("image_url"), "image/png")
        .await;
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    let img = decode(&bytes);
    assert_eq!(img.dimensions(), (64, 64));
    let (mean, sd) = spread(&img);
    assert!(
        sd > 20.0 && (40.0..220.0).contains(&mean),
        "a picture, not a flat field: mean {mean}, sd {sd}"
    );

    // 4096 pixels at 0.0024 USD per megapixel: 9.8304 micro-USD, rounded once.
    // Plus the PNG kept for 7 days.
    let id = job["id"].as_str().unwrap();
    let micro = 10 + app.kept_files_charge(id).await;
    assert_eq!(app.charges(id).await, [micro]);
    assert_eq!(output["cost"].as_f64(), Some(micro as f64 / 1e6));

    // Same seed, same bytes; another seed, another face.
    let again = app.draw(FACES, &key, json!({"seed": 7})).await;
    let same = app
        .fetch_image(again["output"]["image_url"].as_str().unwrap(), "image/png")
        .await;
    assert_eq!(same, bytes);
    let other = app.draw(FACES, &key, json!({"seed": 8})).await;
    let different = app
        .fetch_image(other["output"]["image_url"].as_str().unwrap(), "image/png")
        .await;
    assert_ne!(different, bytes);

    // Several images, upscaled and in another format: `images`, billed by every pixel delivered.
    let job = app
        .draw(
            FACES,
            &key,
            json!({"seed": 7, "num_images": 3, "width": 256, "height": 256, "output_format": "jpeg"}),
        )
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let urls = job["output"]["images"].as_array().expect("images");
    assert_eq!(urls.len(), 3);
    assert!(job["output"].get("image_url").is_none());
    let mut decoded = Vec::new();
    for url in urls {
        let img = decode(&app.fetch_image(url.as_str().unwrap(), "image/jpeg").await);
        assert_eq!(img.dimensions(), (256, 256));
        decoded.push(img);
    }
    assert_ne!(decoded[0], decoded[1]);
    // 3 x 65536 pixels x 2400 / 10^6 = 471.8592 micro-USD.
    let id = job["id"].as_str().unwrap();
    assert_eq!(app.charges(id).await, [472 + app.kept_files_charge(id).await]);
    // The first image of the batch is the 64x64 face of seed 7, upscaled.
    let small = image::imageops::resize(&decoded[0], 64, 64, image::imageops::FilterType::Triangle);
    let diff: f64 = small
        .as_raw()
        .iter()
        .zip(img.as_raw())
        .map(|(a, b)| f64::from(a.abs_diff(*b)))
        .sum::<f64>()
        / small.as_raw().len() as f64;
    assert!(
        diff < 12.0,
        "image 0 of seed 7 is the face of seed 7 (mean difference {diff})"
    );
}

async fn inputs_a_model_cannot_honour_fail_and_cost_nothing(backend: Backend) {
    let app = image_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for (model, input, needle) in [
        (FACES, json!({"width": 64, "height": 128}), "equal"),
        (FACES, json!({"negative_prompt": "blurry"}), "negative_prompt"),
        (
            FACES,
            json!({"guidance_scale": 7.5, "num_inference_steps": 30}),
            "guidance_scale",
        ),
        (FACES, json!({"width": 4096, "height": 4096}), "width"),
        (FACES, json!({"output_format": "gif"}), "output_format"),
        (FACES, json!({"num_images": 9}), "num_images"),
        (EYES, json!({"prompt": "an eye"}), "colours this model draws"),
        (EYES, json!({"prompt": "a blue or green eye"}), "several"),
        (
            EYES,
            json!({"prompt": "a red eye", "style": "anime"}),
            "style: unknown property",
        ),
    ] {
        let job = app.draw(model, &key, input.clone()).await;
        assert_eq!(job["status"], "FAILED", "{model} {input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(
            error.starts_with("bad input") && error.contains(needle),
            "{needle} in {error}"
        );
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

/// The colour word of the prompt steers the conditional generator: with the
/// same noise, a "blue" eye is bluer than a "brown" one, and the output says
/// which label it drew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_picks_the_eye_colour() {
    let app = image_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let mut blueness = Vec::new();
    for (prompt, label) in [("a bright Blue eye", "blue"), ("a warm brown eye", "brown")] {
        let job = app
            .draw(
                EYES,
                &key,
                json!({"prompt": prompt, "seed": 3, "num_images": 4, "output_format": "webp"}),
            )
            .await;
        assert_eq!(job["status"], "COMPLETED", "{job}");
        assert_eq!(job["output"]["label"], label);
        let mut total = 0.0;
        for url in job["output"]["images"].as_array().unwrap() {
            let img = decode(&app.fetch_image(url.as_str().unwrap(), "image/webp").await);
            assert_eq!(img.dimensions(), (128, 128));
            // Blue minus red over the whole picture.
            total += img.pixels().map(|p| f64::from(p[2]) - f64::from(p[0])).sum::<f64>() / f64::from(128 * 128);
        }
        blueness.push(total / 4.0);
        // 4 x 16384 pixels at 0.02 USD per megapixel: 1310.72 micro-USD.
        let id = job["id"].as_str().unwrap();
        assert_eq!(app.charges(id).await, [1311 + app.kept_files_charge(id).await]);
    }
    assert!(
        blueness[0] > blueness[1] + 10.0,
        "blue eyes are bluer than brown ones: {blueness:?}"
    );
}

/// `terrain-128`: the ONNX consistency model on ONNX Runtime (its own copy of
/// the runtime library, from the manifest). A 16-bit grey PNG heightfield
/// that is not flat, the difficulty honoured and returned, same seed same
/// bytes, a rougher terrain for a higher difficulty, billed by pixels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terrain_heightfields_follow_the_difficulty() {
    const TERRAIN: &str = "terrain-128";
    let app = TestApp::spawn_with(Backend::Sqlite, |s| {
        s.scheduler.bundled_workers = vec![TERRAIN.into()];
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
    })
    .await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // Mean absolute slope between neighbouring pixels, in 16-bit levels.
    let roughness = |img: &image::ImageBuffer<image::Luma<u16>, Vec<u16>>| -> f64 {
        let (w, h) = img.dimensions();
        let mut total = 0.0;
        for y in 0..h {
            for x in 1..w {
                total += f64::from(img.get_pixel(x, y)[0].abs_diff(img.get_pixel(x - 1, y)[0]));
            }
        }
        total / f64::from(h * (w - 1))
    };
    let mut rough = Vec::new();
    for difficulty in [1, 100] {
        let job = app
            .draw(
                TERRAIN,
                &key,
                json!({"difficulty": difficulty, "seed": 11, "num_images": 4}),
            )
            .await;
        assert_eq!(job["status"], "COMPLETED", "{job}");
        assert_eq!(job["output"]["difficulty"], json!(vec![difficulty; 4]));
        let mut total = 0.0;
        for url in job["output"]["images"].as_array().unwrap() {
            let bytes = app.fetch_image(url.as_str().unwrap(), "image/png").await;
            let img = image::load_from_memory(&bytes).unwrap().to_luma16();
            assert_eq!(img.dimensions(), (128, 128));
            let lowest = img.pixels().map(|p| p[0]).min().unwrap();
            let highest = img.pixels().map(|p| p[0]).max().unwrap();
            assert_eq!(lowest, 0, "the lowest point is the floor");
            assert!(highest > 1000, "not flat: highest {highest}");
            total += roughness(&img);
        }
        rough.push(total / 4.0);
        // 4 x 16384 pixels at 0.02 USD per megapixel.
        let id = job["id"].as_str().unwrap();
        assert_eq!(app.charges(id).await, [1311 + app.kept_files_charge(id).await]);
    }
    assert!(rough[1] > rough[0], "difficulty 100 is rougher than 1: {rough:?}");
    // A terrain is continuous: neighbours differ by a few percent of the range at most.
    assert!(rough[1] < 3000.0, "a smooth heightfield, not noise: {rough:?}");

    let once = app.draw(TERRAIN, &key, json!({"seed": 5})).await;
    let again = app.draw(TERRAIN, &key, json!({"seed": 5})).await;
    let difficulty = once["output"]["difficulty"].as_u64().unwrap();
    assert!((1..=100).contains(&difficulty), "drawn from the seed: {once}");
    assert_eq!(again["output"]["difficulty"], once["output"]["difficulty"]);
    let a = app
        .fetch_image(once["output"]["image_url"].as_str().unwrap(), "image/png")
        .await;
    let b = app
        .fetch_image(again["output"]["image_url"].as_str().unwrap(), "image/png")
        .await;
    assert_eq!(a, b, "same seed, same bytes");

    let bad = app.draw(TERRAIN, &key, json!({"difficulty": 101})).await;
    assert_eq!(bad["status"], "FAILED");
    assert!(bad["error"].as_str().unwrap().contains("difficulty"), "{bad}");
    assert_eq!(app.charges(bad["id"].as_str().unwrap()).await, Vec::<i64>::new());
}
