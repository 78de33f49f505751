//! The `kokoro-hibari` voice in this process, timed the way the worker runs
//! it (the worker's sentence split, the G2P, one graph run per chunk, the
//! vocoder, 16-bit PCM): CONCURRENCY threads, each with its own session of
//! THREADS intra-op threads, speak TEXT until REQUESTS readings are done.
//! Prints one JSON line: audio seconds, wall seconds, times real time, and the
//! time to the first sentence's audio of SHORT (one reading, nothing else running).
//!
//!     cargo run --release -p gantry-model-speech --example hibari_bench -- \
//!         MODEL_DIR THREADS CONCURRENCY REQUESTS "TEXT" "SHORT"
//!
//! MODEL_DIR is `<models>/kokoro-hibari` (`gantry models pull kokoro-hibari`).
//! `bench/speech/hibari.sh` runs it beside the hibari package in Python.
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gantry_model_speech::{SpeechModel, SpeechOptions, sentences, wav};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, threads, concurrency, requests, text, short] = args.as_slice() else {
        return Err("usage: hibari_bench MODEL_DIR THREADS CONCURRENCY REQUESTS TEXT SHORT".to_owned());
    };
    let number = |s: &str| s.parse::<usize>().map_err(|e| format!("{s}: {e}"));
    let (threads, concurrency, requests) = (number(threads)?, number(concurrency)?.max(1), number(requests)?);
    let dir = Path::new(dir);
    let model = SpeechModel::load_hibari(
        "kokoro-hibari",
        &dir.join("libonnxruntime.so.1.32.0"),
        dir,
        "heart",
        SpeechOptions {
            threads,
            sessions: concurrency,
            ..SpeechOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let speak = |text: &str| -> Result<f64, String> {
        let mut samples = 0usize;
        for sentence in sentences::split(text) {
            let utterance = model.synthesize(&sentence, 1.0)?;
            samples += wav::clip_pcm16(&utterance.audio).len();
        }
        Ok(samples as f64 / f64::from(model.sample_rate()))
    };
    speak("Warming up.")?;

    let started = Instant::now();
    let first = sentences::split(short)
        .into_iter()
        .next()
        .ok_or("SHORT has no sentence")?;
    model.synthesize(&first, 1.0)?;
    let first_audio_ms = started.elapsed().as_secs_f64() * 1e3;

    let left = AtomicUsize::new(requests);
    let started = Instant::now();
    let audio: f64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..concurrency)
            .map(|_| {
                scope.spawn(|| {
                    let mut seconds = 0.0;
                    while left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        seconds += speak(text)?;
                    }
                    Ok::<f64, String>(seconds)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "a thread panicked".to_owned())?)
            .sum::<Result<f64, String>>()
    })?;
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "engine": "gantry (Rust, in process)",
            "threads": threads,
            "concurrency": concurrency,
            "requests": requests,
            "audio_s": (audio * 1000.0).round() / 1000.0,
            "wall_s": (wall * 1000.0).round() / 1000.0,
            "x_realtime": (audio / wall * 100.0).round() / 100.0,
            "first_audio_ms": (first_audio_ms * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
