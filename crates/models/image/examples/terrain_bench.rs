//! Times `terrain-128`'s graph as the worker runs it (ONNX Runtime loaded
//! from the model's directory, one intra-op thread, the normalisation and
//! the mapping to metres included), for `bench/image/run.sh` to put beside
//! onnxruntime in Python on the same graph and inputs.
//!
//! ```text
//! terrain_bench <terrain-128 model dir> <noise.f32> <batch> <rounds>
//! ```
//! `noise.f32`: `batch × 128 × 128` little-endian f32 of unit variance; every
//! image at difficulty 50. Prints one JSON line with the best and median
//! milliseconds per batch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Instant;

use gantry_model_image::{Terrain, TerrainSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, noise, batch, rounds] = &args[..] else {
        eprintln!("usage: terrain_bench <terrain-128 model dir> <noise.f32> <batch> <rounds>");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    // The manifest's engine table for terrain-128.
    let spec = TerrainSpec {
        sigma: 80.0,
        levels: 100,
        height_range: 22.168_64,
        asinh_scale: 0.1,
    };
    let terrain = Terrain::load(
        &dir.join("libonnxruntime.so.1.32.0"),
        &dir.join("terrain_consistency_unet_difficulty100.onnx"),
        1,
        gantry_onnx::Device::Cpu,
        spec,
    )
    .expect("terrain graph");
    let n: usize = batch.parse().expect("batch");
    let rounds: usize = rounds.parse().expect("rounds");
    let bytes = std::fs::read(noise).expect("noise");
    let noise: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let difficulties = vec![50; n];
    terrain.generate(&noise, &difficulties).expect("warm-up");
    let mut times = Vec::new();
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        terrain.generate(&noise, &difficulties).expect("terrain");
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"batch\": {n}, \"best_ms\": {:.3}, \"median_ms\": {:.3}}}",
        times[0],
        times[times.len() / 2]
    );
}
