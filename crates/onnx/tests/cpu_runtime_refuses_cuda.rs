#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The CPU build of ONNX Runtime that every ONNX model ships with has no
//! CUDA provider: a session asked for CUDA on it is refused with what to do
//! (`onnx_library`), and the CPU provider still serves. Its own test binary:
//! one runtime per process. Needs the `terrain-128` weights in
//! `GANTRY_TEST_MODELS_DIR` (`scripts/test` pulls them).
use std::path::PathBuf;

use gantry_onnx::{Device, OnnxError};

#[test]
fn asking_the_cpu_runtime_for_cuda_says_to_set_onnx_library() {
    let dir = match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    }
    .join("terrain-128");
    let graph = dir.join("terrain_consistency_unet_difficulty100.onnx");
    assert!(
        graph.exists(),
        "{} is missing: gantry models pull terrain-128",
        graph.display()
    );
    gantry_onnx::init(&dir.join("libonnxruntime.so.1.32.0")).unwrap();

    let err = gantry_onnx::session_on(&graph, 1, Device::Cuda(1))
        .map(|_| ())
        .unwrap_err();
    let OnnxError::Provider { device, reason, .. } = &err else {
        panic!("not a provider error: {err}");
    };
    assert_eq!(*device, Device::Cuda(1));
    assert!(
        reason.contains("no CUDA provider") && reason.contains("onnx_library"),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("ONNX Runtime cannot run on CUDA device 1 (the library "),
        "{err}"
    );

    gantry_onnx::session_on(&graph, 1, Device::Cpu).expect("the CPU provider serves");
}
