//! The video models end to end with their real weights (RIFE's flownet and
//! the faces DCGAN, fetched once into `GANTRY_TEST_MODELS_DIR` and converted
//! to safetensors by the pull): the public endpoints, the MP4 behind the
//! expiring URL checked by `ffprobe` and played by headless Chromium, the
//! frames themselves (decoded by `ffmpeg`), and billing per started 5 s.
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};
use crate::text::models_dir;

const FACES: &str = "faces-morph-video";
const IMAGES: &str = "interpolate-video";
/// 0.50 USD for every started 5 s.
const BLOCK_MICRO_USD: i64 = 500_000;

gantry_testkit::on_both_backends!(
    inputs_a_video_model_cannot_honour_fail_and_cost_nothing,
    a_cancelled_video_shows_its_progress_stops_and_costs_nothing,
);

async fn video_app(backend: Backend) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec![FACES.into(), IMAGES.into()];
        // the test serves keyframe images on loopback
        s.engine_mut("video")["fetch_allow_ranges"] = serde_json::json!(["127.0.0.0/8"]);
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
    })
    .await
}

impl TestApp {
    /// Runs a video job and polls it to its end.
    async fn film(&self, model: &str, key: &str, input: Value) -> Value {
        let job = self
            .public_ok_with(
                Method::POST,
                &format!("/v2/{model}/run"),
                key,
                json!({ "input": input }),
            )
            .await;
        let id = job["id"].as_str().unwrap().to_owned();
        let started = Instant::now();
        loop {
            let job = self
                .public_ok(Method::GET, &format!("/v2/{model}/status/{id}"), key)
                .await;
            if !["IN_QUEUE", "IN_PROGRESS"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{id} never finished: {job}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn public_ok_with(&self, method: Method, path: &str, key: &str, body: Value) -> Value {
        let res = self.public(method, path, key).json(&body).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        res.json().await.unwrap()
    }

    /// The MP4 behind a job's `video_url`, saved to `dir`.
    async fn save_video(&self, job: &Value, dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
        let url = job["output"]["video_url"].as_str().expect("video_url");
        let res = self.client.get(url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        assert_eq!(res.headers()["content-type"], "video/mp4");
        let bytes = res.bytes().await.unwrap().to_vec();
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }
}

fn tool(name: &str) -> Command {
    let found = Command::new(name).arg("-version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "`{name}` is needed by the video tests (Debian: apt-get install ffmpeg; .ci/run installs it)"
    );
    Command::new(name)
}

/// What `ffprobe` reads from the file: codec, profile, size, frames counted
/// by decoding, frame rate and duration.
fn probe(path: &Path) -> Value {
    let out = tool("ffprobe")
        .args([
            "-v",
            "error",
            "-count_frames",
            "-select_streams",
            "v:0",
            "-show_streams",
            "-show_format",
        ])
        .args(["-of", "json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ffprobe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every frame of the video as RGB bytes, decoded by `ffmpeg`.
fn frames(path: &Path, width: usize, height: usize) -> Vec<Vec<u8>> {
    let out = tool("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));
    let size = width * height * 3;
    assert_eq!(out.stdout.len() % size, 0);
    out.stdout.chunks(size).map(<[u8]>::to_vec).collect()
}

/// Headless Chromium plays the file to its end (bench/video/play_in_chromium.py).
fn play_in_chromium(path: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/video/play_in_chromium.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(path)
        .arg("90")
        .output()
        .unwrap();
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "the player printed no result: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "Chromium did not play the video: {seen}");
    seen
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(x.abs_diff(*y))).sum::<f64>() / a.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_face_morph_is_an_h264_video_that_browsers_play() {
    let app = video_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let dir = tempfile::tempdir().unwrap();
    let input = json!({"seed": 3, "duration": 2, "fps": 12, "width": 128, "height": 128});
    let job = app.film(FACES, &key, input.clone()).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    assert_eq!(output["seed"], 3);
    assert_eq!(
        (output["frames"].as_u64(), output["fps"].as_u64()),
        (Some(24), Some(12))
    );
    assert_eq!(output["duration"].as_f64(), Some(2.0));
    assert_eq!(output["faces"], 3, "a face a second: at 0, 1 and 2 s (the last frame)");
    // 2 s is one started 5 s block: 0.50 USD.
    assert_eq!(output["billed_seconds"], 5);
    // Plus the MP4 kept for 7 days.
    let id = job["id"].as_str().unwrap();
    let micro = BLOCK_MICRO_USD + app.kept_files_charge(id).await;
    assert_eq!(app.charges(id).await, [micro]);
    assert_eq!(output["cost"].as_f64(), Some(micro as f64 / 1e6));

    let (path, bytes) = app.save_video(&job, dir.path(), "faces.mp4").await;
    let probed = probe(&path);
    let stream = &probed["streams"][0];
    assert_eq!(stream["codec_name"], "h264", "{probed}");
    assert_eq!(
        (stream["width"].as_u64(), stream["height"].as_u64()),
        (Some(128), Some(128))
    );
    assert_eq!(stream["nb_read_frames"], "24", "{probed}");
    assert_eq!(stream["r_frame_rate"], "12/1");
    assert_eq!(stream["pix_fmt"], "yuv420p");
    let duration: f64 = probed["format"]["duration"].as_str().unwrap().parse().unwrap();
    assert!((duration - 2.0).abs() < 0.01, "{duration}");

    let played = play_in_chromium(&path);
    assert_eq!(
        (played["width"].as_u64(), played["height"].as_u64()),
        (Some(128), Some(128)),
        "{played}"
    );
    assert!((played["duration"].as_f64().unwrap() - 2.0).abs() < 0.01, "{played}");

    // The video moves smoothly: the first and last faces differ, and
    // neighbouring frames differ far less than faces a second apart do.
    let decoded = frames(&path, 128, 128);
    assert_eq!(decoded.len(), 24);
    let keys = mean_abs_diff(&decoded[0], &decoded[12]);
    let steps: Vec<f64> = decoded.windows(2).map(|w| mean_abs_diff(&w[0], &w[1])).collect();
    let largest = steps.iter().copied().fold(0.0, f64::max);
    assert!(keys > 8.0, "two faces of the walk differ: {keys}");
    assert!(
        largest < keys / 2.0,
        "in-between frames, not cuts: steps {steps:?}, faces {keys}"
    );

    // Same seed, same bytes; another seed, another video.
    let again = app.film(FACES, &key, input).await;
    assert_eq!(app.save_video(&again, dir.path(), "again.mp4").await.1, bytes);
    let other = app
        .film(
            FACES,
            &key,
            json!({"seed": 4, "duration": 1, "fps": 8, "width": 64, "height": 64}),
        )
        .await;
    assert_eq!(other["status"], "COMPLETED", "{other}");
    assert_ne!(app.save_video(&other, dir.path(), "other.mp4").await.1, bytes);
}

/// A picture: a bright disk at `x` on a dark gradient, as PNG.
fn disk_png(width: u32, height: u32, x: f64) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |px, py| {
        let (dx, dy) = (f64::from(px) - x, f64::from(py) - f64::from(height) / 2.0);
        if dx * dx + dy * dy < 144.0 {
            image::Rgb([240, 220, 60])
        } else {
            image::Rgb([20, (py * 60 / height) as u8 + 20, 80])
        }
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// Mean x of the disk's (bright yellow) pixels in an RGB frame.
fn disk_x(frame: &[u8], width: usize) -> f64 {
    let (mut sum, mut n) = (0.0, 0.0);
    for (i, px) in frame.chunks(3).enumerate() {
        if px[0] > 150 && px[1] > 140 && px[2] < 130 {
            sum += (i % width) as f64;
            n += 1.0;
        }
    }
    assert!(n > 100.0, "the disk is visible ({n} pixels)");
    sum / n
}

/// Serves `body` as `media_type` to every request on a local port; the URL.
pub(crate) fn serve_once_per_request(body: Vec<u8>, media_type: &'static str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/input", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {media_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_become_a_video_that_moves_between_them() {
    let app = video_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let dir = tempfile::tempdir().unwrap();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    // The disk moves from x = 40 to x = 88 and back: a URL, a data: URL and plain base64.
    let left = disk_png(128, 96, 40.0);
    let url = serve_once_per_request(left.clone(), "image/png");
    let right = format!("data:image/png;base64,{}", b64(&disk_png(128, 96, 88.0)));
    let job = app
        .film(
            IMAGES,
            &key,
            json!({"images": [url, right, b64(&left)], "duration": 2, "fps": 8}),
        )
        .await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    assert_eq!(
        (output["width"].as_u64(), output["height"].as_u64()),
        (Some(128), Some(96))
    );
    assert_eq!(
        (output["frames"].as_u64(), output["keyframes"].as_u64()),
        (Some(16), Some(3))
    );
    let id = job["id"].as_str().unwrap();
    assert_eq!(
        app.charges(id).await,
        [BLOCK_MICRO_USD + app.kept_files_charge(id).await]
    );

    let (path, _) = app.save_video(&job, dir.path(), "disk.mp4").await;
    let probed = probe(&path);
    assert_eq!(probed["streams"][0]["codec_name"], "h264");
    assert_eq!(probed["streams"][0]["nb_read_frames"], "16");
    play_in_chromium(&path);

    let decoded = frames(&path, 128, 96);
    assert_eq!(decoded.len(), 16);
    // The first and last frames are the first and last images (after H.264).
    let original = image::load_from_memory(&left).unwrap().to_rgb8();
    assert!(mean_abs_diff(&decoded[0], original.as_raw()) < 6.0);
    assert!(mean_abs_diff(&decoded[15], original.as_raw()) < 6.0);
    // In between, the disk travels: right across the first half, back after.
    let xs: Vec<f64> = decoded.iter().map(|f| disk_x(f, 128)).collect();
    assert!((xs[0] - 40.0).abs() < 3.0 && (xs[15] - 40.0).abs() < 3.0, "{xs:?}");
    let peak = xs.iter().copied().fold(0.0, f64::max);
    assert!(peak > 80.0, "the disk reaches the right: {xs:?}");
    // A frame a third of the way to the right image has its disk a third of
    // the way along (RIFE moves it; a crossfade would show two faint disks).
    let third = xs[2];
    assert!((48.0..72.0).contains(&third), "frame 2 of 7.5 to the right: {xs:?}");
}

async fn inputs_a_video_model_cannot_honour_fail_and_cost_nothing(backend: Backend) {
    let app = video_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let png = b64(&disk_png(64, 64, 32.0));
    let missing = format!("{}/missing.png", app.public_base);
    for (model, input, needle) in [
        (FACES, json!({"duration": 60}), "duration"),
        (FACES, json!({"width": 100, "height": 100}), "multiple of 16"),
        (FACES, json!({"width": 128, "height": 64}), "equal"),
        (FACES, json!({"fps": 120}), "fps"),
        (
            FACES,
            json!({"negative_prompt": "x"}),
            "negative_prompt: unknown property",
        ),
        (IMAGES, json!({}), "images: required property is missing"),
        (IMAGES, json!({"images": [png]}), "2 to 16"),
        (IMAGES, json!({"images": [png, "!!not base64!!"]}), "images.1: "),
        (
            IMAGES,
            json!({"images": [png, b64(b"GIF89a not really")]}),
            "images.1: ",
        ),
        (IMAGES, json!({"images": [png, missing]}), "404"),
        // the cloud metadata address and the private network are never fetched
        (
            IMAGES,
            json!({"images": [png, "http://169.254.169.254/latest/x.png"]}),
            "not allowed",
        ),
        (
            IMAGES,
            json!({"images": ["http://[::ffff:10.0.0.1]/a.png", png]}),
            "not allowed",
        ),
    ] {
        let job = app.film(model, &key, input.clone()).await;
        assert_eq!(job["status"], "FAILED", "{model} {input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(
            error.starts_with("bad input") && error.contains(needle),
            "{needle} in {error}"
        );
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

async fn a_cancelled_video_shows_its_progress_stops_and_costs_nothing(backend: Backend) {
    let app = video_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let job = app
        .public_ok_with(
            Method::POST,
            &format!("/v2/{FACES}/run"),
            &key,
            json!({"input": {"duration": 20, "fps": 30, "width": 512, "height": 512}}),
        )
        .await;
    let id = job["id"].as_str().unwrap().to_owned();
    // Wait until frames are being drawn: the status shows the worker's
    // progress, and so does the stream, both as JSON and as an SSE event.
    let started = Instant::now();
    let drawn = loop {
        let status = app
            .public_ok(Method::GET, &format!("/v2/{FACES}/status/{id}"), &key)
            .await;
        if status["status"] == "IN_PROGRESS" && status["progress"]["stage"] == "frames" {
            assert_eq!(status["progress"]["of"], 600, "{status}");
            break status["progress"]["frames"].as_u64().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no frame progress: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stream = app
        .public_ok(Method::GET, &format!("/v2/{FACES}/stream/{id}"), &key)
        .await;
    assert_eq!(stream["status"], "IN_PROGRESS");
    assert_eq!(stream["progress"]["stage"], "frames", "{stream}");
    let mut sse = app
        .public(Method::GET, &format!("/v2/{FACES}/stream/{id}"), &key)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("event: progress") {
        let piece = tokio::time::timeout(Duration::from_secs(30), sse.chunk())
            .await
            .expect("a progress event within 30 s")
            .unwrap()
            .expect("the stream is open");
        seen.push_str(&String::from_utf8_lossy(&piece));
    }
    assert!(seen.contains(r#""stage":"frames""#), "{seen}");
    drop(sse);
    // It moves on: a later status counts more frames.
    let later = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let status = app
            .public_ok(Method::GET, &format!("/v2/{FACES}/status/{id}"), &key)
            .await;
        let n = status["progress"]["frames"].as_u64().unwrap();
        if n > drawn {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "progress stalls at {drawn}"
        );
    };
    assert!(later <= 600);
    let cancelled = app
        .public_ok(Method::POST, &format!("/v2/{FACES}/cancel/{id}"), &key)
        .await;
    assert_eq!(cancelled["status"], "CANCELLED");
    // The worker stops at its next window of frames and takes the next job.
    let next = app
        .film(
            FACES,
            &key,
            json!({"seed": 1, "duration": 1, "fps": 8, "width": 64, "height": 64}),
        )
        .await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    let status = app
        .public_ok(Method::GET, &format!("/v2/{FACES}/status/{id}"), &key)
        .await;
    assert_eq!(status["status"], "CANCELLED");
    assert_eq!(app.charges(&id).await, Vec::<i64>::new());
}
