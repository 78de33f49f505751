//! Times the Stable Diffusion pipeline alone (no HTTP, no job path):
//! `cargo run --release -p gantry-model-diffusion --example sd_bench --
//! <dir> <sd-1.5|sd-turbo|sdxl> <width> <height> <steps> <guidance> <runs>`.
//! Every run starts from the same noise (seed 0); prints one line per run
//! (load first) and the median, in milliseconds, and on standard error where
//! each run's time went (prompt, each denoising step, decoding); the
//! resident memory after loading and at the end, with its peak.
//!
//! `SD_DEVICE=cuda:0` runs it on that GPU (a build with the `cuda` feature)
//! and `SD_HALF=1` in f16; the default is the CPU in f32.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use gantry_model_diffusion::{Architecture, Params, Pipeline, Variant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: sd_bench <dir> <variant> <width> <height> <steps> <guidance> <runs>";
    if args.len() != 7 {
        return Err(usage.into());
    }
    let dir = PathBuf::from(&args[0]);
    let variant = Variant::parse(&args[1]).ok_or(usage)?;
    let (width, height): (u32, u32) = (args[2].parse()?, args[3].parse()?);
    let steps: usize = args[4].parse()?;
    let guidance: f64 = args[5].parse()?;
    let runs: usize = args[6].parse()?;

    // Where each generation's time goes, on standard error.
    tracing_subscriber::fmt()
        .with_env_filter("gantry_model_diffusion=debug")
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .init();
    let started = Instant::now();
    let arch = Architecture::from_dir(&dir, variant)?;
    let device = match std::env::var("SD_DEVICE").unwrap_or_default().as_str() {
        "" | "cpu" => Device::Cpu,
        cuda => Device::new_cuda(
            cuda.trim_start_matches("cuda")
                .trim_start_matches(':')
                .parse()
                .unwrap_or(0),
        )?,
    };
    let dtype = if std::env::var("SD_HALF").is_ok_and(|v| v == "1") {
        DType::F16
    } else {
        DType::F32
    };
    println!("device {device:?} {dtype:?}");
    let pipeline = Pipeline::load_with(&dir, arch, &device, dtype)?;
    println!("load {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    println!("memory after load: {}", memory());
    let params = Params {
        prompt: "a lighthouse at dusk, oil painting".into(),
        negative_prompt: String::new(),
        width,
        height,
        num_images: 1,
        steps,
        guidance_scale: guidance,
        seed: 0,
    };
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let started = Instant::now();
        let images = pipeline.generate(&params, |_, _| std::ops::ControlFlow::Continue(()))?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        println!("run {run} {ms:.0} ms ({}x{})", images[0].width, images[0].height);
        times.push(ms);
    }
    times.sort_by(f64::total_cmp);
    println!("median {:.0} ms", times[times.len() / 2]);
    println!("memory at the end: {}", memory());
    Ok(())
}

/// The process's resident memory now and at its peak (Linux).
fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| "?".into())
    };
    format!("resident {}, peak {}", field("VmRSS:"), field("VmHWM:"))
}
