//! Transcribes a WAV file with the Rust Whisper engine and reports the speed.
//!
//! ```text
//! cargo run -p gantry-model-transcribe --release --example transcribe_bench -- \
//!     MODEL_DIR AUDIO.wav [--runs N] [--threads T] [--backend kernels|candle|cuda:N] [--json]
//!     [--features OUT.f32] [--encode OUT.f32]
//! ```
//!
//! The WAV is 16-bit PCM; channels are averaged and other rates resampled
//! (linearly) to 16 kHz. `--json` prints the transcript as
//! `bench/transcribe/reference.py` does; `--features` / `--encode` write the
//! log-mel features / the first window's encoder output as raw f32.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use gantry_model_transcribe::engine::{Backend, TranscribeOptions, Whisper};

fn read_wav(path: &PathBuf) -> Result<Vec<f32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err("not a RIFF/WAVE file".into());
    }
    let (mut channels, mut rate, mut bits) = (0usize, 0usize, 0usize);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let size = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]) as usize;
        let body = &bytes[at + 8..(at + 8 + size).min(bytes.len())];
        if id == b"fmt " && body.len() >= 16 {
            channels = u16::from_le_bytes([body[2], body[3]]) as usize;
            rate = u32::from_le_bytes([body[4], body[5], body[6], body[7]]) as usize;
            bits = u16::from_le_bytes([body[14], body[15]]) as usize;
        } else if id == b"data" {
            if bits != 16 || channels == 0 {
                return Err(format!("{bits}-bit, {channels} channels: only 16-bit PCM is read"));
            }
            let frames: Vec<f32> = body
                .chunks_exact(2 * channels)
                .map(|f| {
                    f.chunks_exact(2)
                        .map(|s| f32::from(i16::from_le_bytes([s[0], s[1]])) / 32768.0)
                        .sum::<f32>()
                        / channels as f32
                })
                .collect();
            if rate == 16_000 {
                return Ok(frames);
            }
            let n = (frames.len() as u64 * 16_000 / rate as u64) as usize;
            return Ok((0..n)
                .map(|i| {
                    let t = i as f64 * rate as f64 / 16_000.0;
                    let j = t as usize;
                    let f = (t - j as f64) as f32;
                    let a = frames[j.min(frames.len() - 1)];
                    let b = frames[(j + 1).min(frames.len() - 1)];
                    a + (b - a) * f
                })
                .collect());
        }
        at += 8 + size + (size & 1);
    }
    Err("no data chunk".into())
}

fn write_f32(path: &str, data: &[f32]) -> Result<(), String> {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("{path}: {e}"))
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut positional = Vec::new();
    let (mut runs, mut threads, mut json) = (3usize, 0usize, false);
    let (mut features, mut encode) = (None, None);
    let mut backend = Backend::Kernels;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).ok_or("--runs N")?,
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).ok_or("--threads T")?,
            "--json" => json = true,
            "--features" => features = Some(args.next().ok_or("--features OUT")?),
            "--encode" => encode = Some(args.next().ok_or("--encode OUT")?),
            "--backend" => {
                let name = args.next().ok_or("--backend kernels | candle | cuda:N")?;
                backend = Backend::from_name(&name).map_err(|e| e.to_string())?;
            }
            _ => positional.push(a),
        }
    }
    let [model_dir, wav] = positional.as_slice() else {
        return Err(
            "usage: transcribe_bench MODEL_DIR AUDIO.wav [--runs N] [--threads T] [--backend kernels|candle|cuda:N] [--json]"
                .into(),
        );
    };
    let t = Instant::now();
    let whisper = Whisper::load_on(&PathBuf::from(model_dir), &backend).map_err(|e| e.to_string())?;
    eprintln!("backend: {}", whisper.backend_name());
    let load_s = t.elapsed().as_secs_f64();
    let samples = read_wav(&PathBuf::from(wav))?;
    let audio_s = samples.len() as f64 / 16_000.0;
    if let Some(path) = &features {
        let mel = whisper.features(&samples, threads);
        write_f32(path, &mel.data)?;
        println!("{{\"shape\": [80, {}]}}", mel.frames);
        return Ok(());
    }
    if let Some(path) = &encode {
        let mel = whisper.features(&samples, threads);
        let window = mel.window(0, 3000.min(mel.frames.saturating_sub(1)), 3000);
        let t = Instant::now();
        let out = whisper.encode(&window, threads).map_err(|e| e.to_string())?;
        eprintln!("encode: {:.3} s", t.elapsed().as_secs_f64());
        write_f32(path, &out)?;
        println!("{{\"shape\": [1500, {}]}}", out.len() / 1500);
        return Ok(());
    }
    let opts = TranscribeOptions {
        threads,
        ..TranscribeOptions::default()
    };
    if json {
        let tr = whisper
            .transcribe(&samples, &opts, &mut |_| ControlFlow::Continue(()))
            .map_err(|e| e.to_string())?;
        let segs: Vec<String> = tr
            .segments
            .iter()
            .map(|s| {
                format!(
                    "  {{\"start\": {}, \"end\": {}, \"text\": {}, \"tokens\": {:?}, \"avg_logprob\": {}, \"no_speech_prob\": {}}}",
                    s.start,
                    s.end,
                    json_string(&s.text),
                    s.tokens,
                    s.avg_logprob,
                    s.no_speech_prob
                )
            })
            .collect();
        println!(
            "{{\"text\": {}, \"duration\": {}, \"segments\": [\n{}\n]}}",
            json_string(&tr.text),
            tr.duration,
            segs.join(",\n")
        );
        return Ok(());
    }
    // Warm-up, then the best of `runs`.
    let mut best = f64::INFINITY;
    for run in 0..=runs {
        let t = Instant::now();
        let tr = whisper
            .transcribe(&samples, &opts, &mut |_| ControlFlow::Continue(()))
            .map_err(|e| e.to_string())?;
        let s = t.elapsed().as_secs_f64();
        if run > 0 {
            best = best.min(s);
        } else {
            eprintln!("{} segments: {}", tr.segments.len(), tr.text);
        }
    }
    println!(
        "{{\"audio_s\": {audio_s:.3}, \"best_wall_s\": {best:.3}, \"audio_s_per_s\": {:.2}, \"threads\": {threads}, \"load_s\": {load_s:.3}}}",
        audio_s / best
    );
    Ok(())
}
