//! Multiply-adds per second of the packed product's three input forms
//! (packed blocks, rows, gathered runs) on one thread, for one shape.
//!
//! ```text
//! packed_bench [rows] [depth] [columns] [rounds]   # defaults 512 1024 192 50
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use gantry_kernels::packed::{Columns, Epilogue, INPUT_BLOCK, PackedWeights, Runs};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (rows, depth, n, rounds) = (arg(0, 512), arg(1, 1024), arg(2, 192), arg(3, 50));
    let w: Vec<f32> = (0..rows * depth).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
    let x: Vec<f32> = (0..n * depth).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect();
    let packed = PackedWeights::from_rows(&w, rows, depth);
    let mut xp = Vec::new();
    gantry_kernels::packed::pack_rows(&x, n, depth, &mut xp);
    assert_eq!(xp.len(), n.div_ceil(INPUT_BLOCK) * depth * INPUT_BLOCK);
    let mut out = vec![0.0f32; rows * n];
    let inputs: Vec<usize> = (0..n).map(|j| j * depth).collect();
    let outputs: Vec<usize> = (0..n).map(|j| j * rows).collect();
    let macs = (rows * depth * n) as f64;
    let mut time = |name: &str, f: &mut dyn FnMut(&mut [f32])| {
        let mut best = f64::INFINITY;
        for _ in 0..rounds {
            let started = Instant::now();
            f(&mut out);
            best = best.min(started.elapsed().as_secs_f64());
        }
        println!(
            "{name:>9}: best {:.3} ms, {:.1} G multiply-adds/s",
            best * 1e3,
            macs / best / 1e9
        );
    };
    time("packed", &mut |out| packed.matmul_packed(&xp, n, out));
    time("rows", &mut |out| packed.matmul_rows(&x, n, out));
    let runs = Runs {
        count: 1,
        len: depth,
        stride: 0,
    };
    time("gathered", &mut |out| {
        let columns = Columns {
            inputs: &inputs,
            outputs: &outputs,
        };
        packed.matmul_gathered(&x, runs, columns, out, Epilogue::Plain)
    });
}
