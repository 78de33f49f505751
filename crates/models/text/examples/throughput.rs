//! Generation speed of the text engine: one stream, then N concurrent ones.
//!
//! ```sh
//! cargo run --release -p gantry-model-text --example throughput -- \
//!     [GGUF] [--tokens 128] [--streams 4] [--threads 0] [--sampling-threads 0] [--temperature 0.8]
//! ```
//!
//! Each phase also prints where the engine's steps spent their time: the
//! decode (llama.cpp), and the engine's own work outside it (the batch, the
//! draws of the tokens, streaming), per step and as a share of the decode.
//!
//! GGUF defaults to SmolLM2-135M-Instruct under `$GANTRY_TEST_MODELS_DIR`
//! (or `~/.cache/gantry/models`). Sampling runs at temperature 0.8 (0 =
//! greedy) with fixed seeds and a raw prompt that rarely ends by itself; the
//! figures count the tokens actually generated.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use gantry_model_text::{EngineOptions, StepTotals, TextModel};
use gantry_worker_sdk::CancellationToken;
use serde_json::json;

struct Args {
    gguf: PathBuf,
    tokens: u32,
    streams: usize,
    threads: usize,
    sampling_threads: usize,
    temperature: f64,
}

fn parse_args() -> Result<Args, String> {
    let models = std::env::var_os("GANTRY_TEST_MODELS_DIR").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
        PathBuf::from,
    );
    let mut args = Args {
        gguf: models.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
        tokens: 128,
        streams: 4,
        threads: 0,
        sampling_threads: 0,
        temperature: 0.8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--tokens" => args.tokens = value("--tokens")?.parse().map_err(|e| format!("--tokens: {e}"))?,
            "--streams" => args.streams = value("--streams")?.parse().map_err(|e| format!("--streams: {e}"))?,
            "--threads" => args.threads = value("--threads")?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--sampling-threads" => {
                args.sampling_threads = value("--sampling-threads")?
                    .parse()
                    .map_err(|e| format!("--sampling-threads: {e}"))?;
            }
            "--temperature" => {
                args.temperature = value("--temperature")?
                    .parse()
                    .map_err(|e| format!("--temperature: {e}"))?;
            }
            other if !other.starts_with("--") => args.gguf = PathBuf::from(other),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(args)
}

/// One stream's result: generated tokens, time to the first piece, total.
struct Run {
    tokens: u64,
    first: Duration,
    total: Duration,
}

async fn run(model: &TextModel, seed: u64, tokens: u32, temperature: f64) -> Run {
    let started = Instant::now();
    let first = Arc::new(Mutex::new(None));
    let first_seen = Arc::clone(&first);
    let input = json!({
        "prompt": "Chapter 1\n\nThe old lighthouse keeper had lived alone on the island for",
        "raw": true, "temperature": temperature, "seed": seed, "max_tokens": tokens,
    });
    let output = model
        .generate(input, CancellationToken::new(), move |_| {
            if let Ok(mut first) = first_seen.lock() {
                first.get_or_insert_with(|| started.elapsed());
            }
            async { Ok(()) }
        })
        .await;
    let total = started.elapsed();
    let generated = match output {
        Ok(output) => output.output["usage"]["output"].as_u64().unwrap_or(0),
        Err(error) => {
            eprintln!("request failed: {error}");
            0
        }
    };
    let first = first.lock().ok().and_then(|first| *first).unwrap_or(total);
    Run {
        tokens: generated,
        first,
        total,
    }
}

/// The engine's steps of a phase: per step, the decode and the engine's
/// own work outside it.
fn report_steps(label: &str, steps: StepTotals) {
    let per_step = |ns: u64| ns as f64 / steps.steps.max(1) as f64 / 1e6;
    println!(
        "{label} steps: {} steps, {:.1} draws/step; per step: decode {:.3} ms, engine outside decode {:.3} ms \
         ({:.1} % of the decode)",
        steps.steps,
        steps.draws as f64 / steps.steps.max(1) as f64,
        per_step(steps.decode_ns),
        per_step(steps.other_ns),
        steps.other_ns as f64 / steps.decode_ns.max(1) as f64 * 100.0
    );
}

fn report(label: &str, runs: &[Run], wall: Duration) {
    let tokens: u64 = runs.iter().map(|r| r.tokens).sum();
    let first = runs.iter().map(|r| r.first).max().unwrap_or_default();
    let per_stream: Vec<String> = runs
        .iter()
        .map(|r| {
            let decode = r.total.saturating_sub(r.first).as_secs_f64();
            format!("{:.1}", r.tokens.saturating_sub(1) as f64 / decode.max(1e-9))
        })
        .collect();
    println!(
        "{label}: {tokens} tokens in {:.2} s = {:.1} tokens/s aggregate; slowest first token {:.0} ms; \
         per-stream decode tokens/s [{}]",
        wall.as_secs_f64(),
        tokens as f64 / wall.as_secs_f64(),
        first.as_secs_f64() * 1000.0,
        per_stream.join(", ")
    );
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let options = EngineOptions {
        threads: args.threads,
        sampling_threads: args.sampling_threads,
        max_sequences: args.streams.max(1) as u32,
        ..EngineOptions::default()
    };
    let model = TextModel::load("bench", &args.gguf, options).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        // warm-up: first decode allocates buffers
        run(&model, 0, 8, args.temperature).await;
        let started = Instant::now();
        let before = model.step_times();
        let single = run(&model, 1, args.tokens, args.temperature).await;
        report("1 stream", &[single], started.elapsed());
        report_steps("1 stream", model.step_times().since(before));
        let started = Instant::now();
        let before = model.step_times();
        let runs =
            join_all((0..args.streams as u64).map(|i| run(&model, 100 + i, args.tokens, args.temperature))).await;
        let label = format!("{} streams", args.streams);
        report(&label, &runs, started.elapsed());
        report_steps(&label, model.step_times().since(before));
    });
    Ok(())
}
