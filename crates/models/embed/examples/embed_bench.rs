//! The encoder alone, in this process: sentences per second at batch 1 and
//! 64 on the reference set's short sentences (the same ones
//! `bench/embeddings/run.sh` sends). What the HTTP benchmark measures less
//! the job path; used to tune the CPU network.
//!
//! `cargo run --release -p gantry-model-embed --example embed_bench -- <model dir> [seconds]`
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::Device;
use gantry_model_embed::Encoder;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: embed_bench <model dir> [seconds]")?);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3.0);
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/reference.json"),
    )?)?;
    let sentences: Vec<String> = reference["sentences"]
        .as_array()
        .ok_or("reference.json has no sentences")?
        .iter()
        .zip(
            reference["token_ids"]
                .as_array()
                .ok_or("reference.json has no token_ids")?,
        )
        .filter(|(s, ids)| {
            ids.as_array().is_some_and(|ids| ids.len() < 64) && s.as_str().is_some_and(|s| !s.is_empty())
        })
        .filter_map(|(s, _)| s.as_str().map(str::to_owned))
        .collect();
    let batch: Vec<String> = (0..64)
        .map(|i| {
            let s = &sentences[i % sentences.len()];
            if i < sentences.len() {
                s.clone()
            } else {
                format!("{s} ({i})")
            }
        })
        .collect();
    let encoder = Encoder::load(&dir, Device::Cpu)?;
    let ids = |texts: &[String]| -> Vec<Vec<u32>> {
        texts
            .iter()
            .map(|t| {
                let mut v = encoder.tokenizer().encode(t);
                v.truncate(encoder.max_text_tokens());
                v
            })
            .collect()
    };
    let one = ids(&batch[..1]);
    let many = ids(&batch);
    println!(
        "threads {}, batch 1: {} tokens, batch 64: {} tokens",
        rayon::current_num_threads(),
        one[0].len() + 2,
        many.iter().map(|s| s.len() + 2).sum::<usize>()
    );
    for (name, set) in [("batch 1", &one), ("batch 64", &many)] {
        let views: Vec<&[u32]> = set.iter().map(Vec::as_slice).collect();
        encoder.embed(&views)?;
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < Duration::from_secs_f64(seconds) {
            encoder.embed(&views)?;
            runs += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        println!(
            "{name}: {:.2} ms a pass, {:.1} sentences/s",
            elapsed * 1e3 / runs as f64,
            (runs as usize * views.len()) as f64 / elapsed
        );
    }
    Ok(())
}
