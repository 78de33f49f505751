//! Times RIFE alone (no keyframes, no encoding, no platform), for
//! `bench/video/run.sh` to set beside onnxruntime on the same weights.
//!
//! ```text
//! rife_bench <flownet.safetensors> <width> <height> <rounds> <threads>
//! ```
//! With one thread it times single frames; with more, that many frames are
//! drawn at once (one per thread, as a video job draws a window of frames)
//! and the figure is the throughput. Prints one JSON line.
//!
//! `RIFE_BACKEND` picks what runs the network: `kernels` (the default, as
//! served on the CPU), `candle` (candle's CPU device) or `cuda:N` (candle's
//! CUDA device N, in a `--features cuda` build).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use gantry_model_video::{Backend, Rife};

/// A smooth textured frame, shifted by `dx` pixels.
fn frame(w: usize, h: usize, dx: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; 3 * w * h];
    for c in 0..3 {
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f32 - dx, y as f32);
                let v =
                    0.5 + 0.25 * ((fx * 0.07 + c as f32).sin() * (fy * 0.05).cos()) + 0.2 * ((fx + fy) * 0.013).sin();
                out[(c * h + y) * w + x] = v.clamp(0.0, 1.0);
            }
        }
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, weights, w, h, rounds, threads] = &args[..] else {
        eprintln!("usage: rife_bench <flownet.safetensors> <width> <height> <rounds> <threads>");
        std::process::exit(2);
    };
    let name = std::env::var("RIFE_BACKEND").unwrap_or_else(|_| "kernels".into());
    let backend = Backend::from_name(&name).unwrap_or_else(|e| {
        eprintln!("RIFE_BACKEND: {e}");
        std::process::exit(2);
    });
    let rife = Rife::load_on(weights.as_ref(), &backend).expect("weights");
    let (w, h): (usize, usize) = (w.parse().expect("width"), h.parse().expect("height"));
    let rounds: usize = rounds.parse().expect("rounds");
    let threads: usize = threads.parse().expect("threads");
    let (a, b) = (frame(w, h, 0.0), frame(w, h, 12.0));
    let round = || {
        std::thread::scope(|scope| {
            for i in 0..threads {
                let (rife, a, b) = (&rife, &a, &b);
                scope.spawn(move || {
                    std::hint::black_box(
                        rife.interpolate(a, b, w, h, (i + 1) as f32 / (threads + 1) as f32)
                            .expect("interpolate"),
                    )
                });
            }
        });
    };
    round(); // warm-up: fills the buffer pool
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            round();
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let (best, median) = (times[0], times[times.len() / 2]);
    println!(
        "{{\"engine\": \"rust\", \"backend\": \"{}\", \"width\": {w}, \"height\": {h}, \"threads\": {threads}, \"best_ms_per_round\": {best:.2}, \"median_ms_per_round\": {median:.2}, \"frames_per_s\": {:.2}}}",
        rife.backend_name(),
        threads as f64 * 1e3 / median
    );
}
