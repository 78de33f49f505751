//! Times the generator alone (no encoding, no platform) and writes its raw
//! output, for `bench/image/run.sh` to compare with onnxruntime on the same
//! weights and the same inputs.
//!
//! ```text
//! gan_bench <weights.safetensors> <tensor prefix> <inputs.f32> <batch> <rounds> <output.f32>
//! ```
//! `inputs.f32`: `batch × input_len` little-endian f32. Prints one JSON line
//! with the best and median milliseconds per batch; writes the output of the
//! last round as `batch × channels × side × side` little-endian f32.
//!
//! `GAN_BACKEND` picks what runs the layers: `kernels` (the default, as
//! served on the CPU), `candle` (candle's CPU device) or `cuda:N` (candle's
//! CUDA device N, in a `--features cuda` build).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, weights, prefix, inputs, batch, rounds, output] = &args[..] else {
        eprintln!("usage: gan_bench <weights.safetensors> <prefix> <inputs.f32> <batch> <rounds> <output.f32>");
        std::process::exit(2);
    };
    let tensors = gantry_manifest::torch::read_safetensors(weights.as_ref()).expect("weights");
    let name = std::env::var("GAN_BACKEND").unwrap_or_else(|_| "kernels".into());
    let backend = gantry_model_image::Backend::from_name(&name).unwrap_or_else(|e| {
        eprintln!("GAN_BACKEND: {e}");
        std::process::exit(2);
    });
    let generator = gantry_model_image::Generator::from_tensors_on(&tensors, prefix, &backend).expect("generator");
    let n: usize = batch.parse().expect("batch");
    let rounds: usize = rounds.parse().expect("rounds");
    let bytes = std::fs::read(inputs).expect("inputs");
    let z: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(
        z.len(),
        n * generator.input_len(),
        "inputs.f32 holds batch x {} values",
        generator.input_len()
    );
    let mut times = Vec::new();
    let mut out = Vec::new();
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        out = generator.forward(&z, n).expect("forward").0;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    // Channel-major to batch-major.
    let (c, plane) = (generator.channels(), generator.side() * generator.side());
    let mut nchw = vec![0f32; out.len()];
    for ch in 0..c {
        for b in 0..n {
            nchw[(b * c + ch) * plane..][..plane].copy_from_slice(&out[(ch * n + b) * plane..][..plane]);
        }
    }
    std::fs::write(output, nchw.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).expect("output");
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"backend\": \"{}\", \"batch\": {n}, \"best_ms\": {:.3}, \"median_ms\": {:.3}}}",
        generator.backend_name(),
        times[0],
        times[times.len() / 2]
    );
}
