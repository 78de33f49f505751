//! Times one 3x3 convolution (padding 1) of Stable Diffusion's shapes on
//! candle's `conv2d` and on the packed kernels (the direct product and
//! Winograd's F(2x2) and F(4x4)), on the current rayon pool
//! (`RAYON_NUM_THREADS`): `cargo run --release -p gantry-model-diffusion
//! --example conv_bench -- [runs]`. Prints, per shape, the median time of
//! each and its rate in the direct convolution's multiply-adds per second,
//! the largest difference from candle's output, and which one the pipeline
//! runs.

use std::time::Instant;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use gantry_kernels::conv::{Activation, Conv2d, Scratch};
use gantry_kernels::winograd::Tile;
use gantry_model_diffusion::blocks::{Conv, Kernels, winograd_tile};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(5);
    let device = Device::Cpu;
    println!("threads {}", rayon::current_num_threads());
    // (channels in, channels out, side, batch): the VAE decoder at 256x256
    // output, and UNet layers at a 32x32 latent with guidance (batch 2).
    for (cin, cout, side, batch) in [
        (512, 512, 32, 1),
        (512, 512, 64, 1),
        (256, 256, 128, 1),
        (128, 128, 256, 1),
        (320, 320, 32, 2),
        (640, 640, 16, 2),
        (1280, 1280, 8, 2),
        (1280, 1280, 4, 2),
    ] {
        // `CONV_BENCH_SIDE=256` times only the shapes of that side.
        if std::env::var("CONV_BENCH_SIDE").is_ok_and(|s| s != side.to_string()) {
            continue;
        }
        let weight = (Tensor::randn(0f32, 0.05, (cout, cin, 3, 3), &device)?).contiguous()?;
        let bias = Tensor::randn(0f32, 0.05, cout, &device)?;
        let x = Tensor::randn(0f32, 1.0, (batch, cin, side, side), &device)?;
        let tensors = [("weight".to_owned(), weight.clone()), ("bias".to_owned(), bias.clone())]
            .into_iter()
            .collect();
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let candle = Conv::new(vb, (cin, cout), 3, 1, 1, Kernels::Candle)?;
        let macs = (batch * cout * cin * 9 * side * side) as f64;
        let mut line = format!("{cin:>4}->{cout:<4} {side:>3}x{side:<3} batch {batch}:");
        let mut times = Vec::with_capacity(runs);
        let mut out = candle.forward(&x)?;
        for _ in 0..runs {
            let started = Instant::now();
            out = candle.forward(&x)?;
            times.push(started.elapsed().as_secs_f64());
        }
        let t = median(times);
        line += &format!("  candle {:6.1} ms {:5.1}", t * 1e3, macs / t / 1e9);
        // The packed kernels: the direct product, and Winograd's algorithm
        // (multiply-adds counted as the direct convolution's, so that the
        // rates compare times), each against candle's output.
        let w = weight.flatten_all()?.to_vec1::<f32>()?;
        let b = bias.to_vec1::<f32>()?;
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let want = out.flatten_all()?.to_vec1::<f32>()?;
        let kinds = [
            (
                "direct",
                Conv2d::new(&w, cin, cout, 3, 1, b.clone(), Activation::Identity),
            ),
            (
                "F2",
                Conv2d::winograd(&w, cin, cout, b.clone(), Activation::Identity, Tile::F2),
            ),
            (
                "F4",
                Conv2d::winograd(&w, cin, cout, b.clone(), Activation::Identity, Tile::F4),
            ),
        ];
        for (name, conv) in kinds {
            let mut scratch = Scratch::default();
            let mut out = conv.forward_batch(&xs, batch, side, side, &mut scratch);
            let mut times = Vec::with_capacity(runs);
            for _ in 0..runs {
                let started = Instant::now();
                out = conv.forward_batch(&xs, batch, side, side, &mut scratch);
                times.push(started.elapsed().as_secs_f64());
            }
            let t = median(times);
            let diff = out.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            line += &format!("  {name} {:6.1} ms {:5.1} ({diff:.0e})", t * 1e3, macs / t / 1e9);
        }
        let chosen = winograd_tile(cin, cout).map_or("direct".to_owned(), |t| format!("{t:?}"));
        line += &format!("  pipeline: {chosen}");
        println!("{line}");
    }
    Ok(())
}
