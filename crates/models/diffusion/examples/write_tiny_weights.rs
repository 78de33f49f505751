//! Writes a tiny, randomly initialised Stable Diffusion directory in the
//! diffusers layout: `cargo run -p gantry-model-diffusion --example
//! write_tiny_weights -- <sd-1.5|sd-turbo|sdxl> <dir>`.

use std::path::PathBuf;

use gantry_model_diffusion::tiny::write_tiny_weights;
use gantry_model_diffusion::{Architecture, Variant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: write_tiny_weights <sd-1.5|sd-turbo|sdxl> <dir>";
    let variant = args.next().and_then(|v| Variant::parse(&v)).ok_or(usage)?;
    let dir = PathBuf::from(args.next().ok_or(usage)?);
    write_tiny_weights(&dir, &Architecture::tiny(variant))?;
    println!("wrote a tiny {} model to {}", variant.name(), dir.display());
    Ok(())
}
