#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The GPU build of ONNX Runtime (`scripts/fetch-onnxruntime-gpu.sh`, which
//! `scripts/test` runs) in place of the CPU one a model names: it loads, it
//! runs a real graph on the CPU provider, it has the CUDA provider built in,
//! and a session asked for CUDA either gets it (on a machine with a GPU and
//! CUDA 13's libraries) or fails with [`OnnxError::Provider`], never quietly
//! running on the CPU. Its own test binary: one runtime per process.
//!
//! Needs `GANTRY_TEST_ONNXRUNTIME_GPU` (the library's path) and the
//! `terrain-128` weights in `GANTRY_TEST_MODELS_DIR`; `scripts/test` provides
//! both.
use std::path::{Path, PathBuf};

use gantry_onnx::ort::ep::ExecutionProvider;
use gantry_onnx::{Device, OnnxError, Tensor};

fn models_dir() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    }
}

#[test]
fn the_gpu_runtime_replaces_the_models_own_and_cuda_is_had_or_refused_never_faked() {
    let gpu = std::env::var_os("GANTRY_TEST_ONNXRUNTIME_GPU")
        .map(PathBuf::from)
        .expect("GANTRY_TEST_ONNXRUNTIME_GPU names the GPU runtime: run scripts/fetch-onnxruntime-gpu.sh (scripts/test does)");
    let dir = models_dir().join("terrain-128");
    let graph = dir.join("terrain_consistency_unet_difficulty100.onnx");
    assert!(
        graph.exists(),
        "{} is missing: gantry models pull terrain-128",
        graph.display()
    );

    gantry_onnx::prefer_library(&gpu).unwrap();
    // The model's own (CPU) runtime is named; the preferred one is loaded.
    gantry_onnx::init(&dir.join("libonnxruntime.so.1.32.0")).unwrap();
    let canonical = std::fs::canonicalize(&gpu).unwrap();
    assert_eq!(gantry_onnx::loaded_library(), Some(canonical.as_path()));
    assert!(
        gantry_onnx::ort::ep::CUDA::is_available().unwrap(),
        "the GPU build lists the CUDA provider"
    );

    // On the CPU provider the graph runs: one denoising step of the terrain
    // model (noise, sigma, difficulty) gives a finite heightfield.
    let mut cpu = gantry_onnx::session_on(&graph, 1, Device::Cpu).unwrap();
    let side = 128;
    let noise: Vec<f32> = (0..side * side)
        .map(|i| ((i * 7919 % 2003) as f32 / 2003.0 - 0.5) * 160.0)
        .collect();
    let outputs = cpu
        .run(gantry_onnx::ort::inputs![
            "noisy" => Tensor::from_array(([1, 1, side, side], noise)).unwrap(),
            "sigma" => Tensor::from_array(([1usize], vec![80.0f32])).unwrap(),
            "difficulty" => Tensor::from_array(([1usize], vec![0.5f32])).unwrap(),
        ])
        .unwrap();
    let (_, denoised) = outputs["denoised"].try_extract_tensor::<f32>().unwrap();
    assert_eq!(denoised.len(), side * side);
    assert!(denoised.iter().all(|v| v.is_finite()));
    assert!(denoised.iter().any(|v| *v != denoised[0]), "a flat heightfield");
    drop(outputs);

    let on_gpu = gantry_onnx::session_on(&graph, 1, Device::Cuda(0));
    if Path::new("/dev/nvidia0").exists() {
        on_gpu.expect("a machine with a GPU and CUDA 13's libraries runs the graph on CUDA");
    } else {
        let err = on_gpu.map(|_| ()).unwrap_err();
        eprintln!("as expected without a GPU: {err}");
        let OnnxError::Provider {
            device,
            library,
            reason,
        } = &err
        else {
            panic!("not a provider error: {err}");
        };
        assert_eq!((*device, library.as_path()), (Device::Cuda(0), canonical.as_path()));
        assert!(!reason.is_empty());
        assert!(
            err.to_string()
                .starts_with("ONNX Runtime cannot run on CUDA device 0 (the library "),
            "{err}"
        );
    }

    // One runtime per process: another library is refused.
    let other = gantry_onnx::prefer_library(&dir.join("libonnxruntime.so.1.32.0")).unwrap_err();
    assert!(matches!(other, OnnxError::OtherLibrary { .. }), "{other}");
}
