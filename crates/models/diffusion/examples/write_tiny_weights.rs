//! Writes a randomly initialised Stable Diffusion directory in the
//! diffusers layout, tiny by default (for tests) or at the published size
//! with `--full` (for benchmarks: about 5 GB for SD-Turbo):
//! `cargo run -p gantry-model-diffusion --example write_tiny_weights --
//! <sd-1.5|sd-turbo|sdxl> <dir> [--full]`. The weights are seeded by tensor
//! name, so every run writes the same bytes.

use std::path::PathBuf;

use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::{Architecture, Variant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: write_tiny_weights <sd-1.5|sd-turbo|sdxl> <dir> [--full]";
    let variant = args.next().and_then(|v| Variant::parse(&v)).ok_or(usage)?;
    let dir = PathBuf::from(args.next().ok_or(usage)?);
    let full = match args.next().as_deref() {
        None => false,
        Some("--full") => true,
        Some(_) => return Err(usage.into()),
    };
    let (arch, size) = if full {
        (Architecture::full(variant), "full-size")
    } else {
        (Architecture::tiny(variant), "tiny")
    };
    write_tiny_weights(&dir, &arch)?;
    println!("wrote a {size} {} model to {}", variant.name(), dir.display());
    Ok(())
}
