#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Both generators, on their real weights, give the same output as
//! onnxruntime computing the same network from the same safetensors
//! (`bench/image/reference.py` builds the ONNX graph layer by layer and runs
//! it), to within 1e-3 on every value of a batch of eight: on the CPU
//! kernels that serve by default, and on candle (its CPU device here; the
//! same graph runs on its CUDA device with `image.cuda_device`).
//!
//! Needs the weights in `GANTRY_TEST_MODELS_DIR` (`.ci/run` pulls them) and
//! Python 3 with numpy, onnx and onnxruntime (`.ci/run` installs them).
use std::path::{Path, PathBuf};
use std::process::Command;

use gantry_model_image::{Backend, Device, Generator};

fn models_dir() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    }
}

fn check(model: &str, file: &str, prefix: &str, labels: usize) {
    let weights = models_dir().join(model).join(file);
    assert!(
        weights.exists(),
        "{} is missing: run `gantry models pull {model}` with GANTRY_MODELS_DIR={}",
        weights.display(),
        models_dir().display()
    );
    let tensors = gantry_manifest::torch::read_safetensors(&weights).unwrap();
    for backend in [Backend::Kernels, Backend::Candle(Device::Cpu)] {
        let generator = Generator::from_tensors_on(&tensors, prefix, &backend).unwrap();
        compare(model, &weights, prefix, labels, &generator);
    }
}

fn compare(model: &str, weights: &Path, prefix: &str, labels: usize, generator: &Generator) {
    let n = 8;
    let width = generator.input_len();
    // Deterministic inputs: a spread of noise values and each label once.
    let inputs: Vec<f32> = (0..n * width)
        .map(|i| {
            let (b, c) = (i / width, i % width);
            if c >= width - labels {
                if (c - (width - labels)) == b % labels.max(1) {
                    1.0
                } else {
                    0.0
                }
            } else {
                (((i * 7919) % 2003) as f32 / 2003.0 - 0.5) * 4.0
            }
        })
        .collect();
    let (out, side) = generator.forward(&inputs, n).unwrap();
    let channels = generator.channels();
    let plane = side * side;
    let mut nchw = vec![0f32; out.len()];
    for c in 0..channels {
        for b in 0..n {
            nchw[(b * channels + c) * plane..][..plane].copy_from_slice(&out[(c * n + b) * plane..][..plane]);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, values: &[f32]| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        path
    };
    let z = write("z.f32", &inputs);
    let y = write("y.f32", &nchw);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/image/reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .args([
            "compare".as_ref(),
            weights.as_os_str(),
            prefix.as_ref(),
            z.as_os_str(),
            "8".as_ref(),
            y.as_os_str(),
        ])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{model} on {}: onnxruntime disagrees or could not run (pip install numpy onnx onnxruntime):\n{stdout}\n{stderr}",
        generator.backend_name()
    );
    assert!(stdout.contains("max_abs_diff"), "{stdout}");
}

#[test]
fn the_face_generator_matches_onnxruntime() {
    check("dcgan-faces-64", "weights.safetensors", "netG_state_dict.main", 0);
}

#[test]
fn the_eye_generator_matches_onnxruntime() {
    check("eyes-128", "generator_model_state.safetensors", "main", 8);
}
