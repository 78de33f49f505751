#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real voice (piper-en-us-joe) on the real runtime: espeak-ng's
//! phonemes are all known to it, its audio is speech-shaped, `speed` works,
//! and with the noise off the Rust path gives the same samples as
//! onnxruntime in Python on the same ids (`bench/speech/reference.py`).
//!
//! Needs the model in `GANTRY_TEST_MODELS_DIR` (`.ci/run` pulls it:
//! `gantry models pull piper-en-us-joe`) and, for the comparison, Python 3
//! with numpy and onnxruntime (`.ci/run` installs them).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gantry_model_speech::{Scales, SpeechModel, SpeechOptions};

const MODEL: &str = "piper-en-us-joe";

fn model_dir() -> PathBuf {
    let root = match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    };
    root.join(MODEL)
}

fn voice() -> &'static SpeechModel {
    static VOICE: OnceLock<SpeechModel> = OnceLock::new();
    VOICE.get_or_init(|| {
        let dir = model_dir();
        let graph = dir.join("en_US-joe-medium.onnx");
        assert!(
            graph.exists(),
            "{} is missing: run `gantry models pull {MODEL}` with GANTRY_MODELS_DIR set to its parent",
            graph.display()
        );
        SpeechModel::load(
            MODEL,
            &dir.join("libonnxruntime.so.1.32.0"),
            &graph,
            &dir.join("en_US-joe-medium.onnx.json"),
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

#[test]
fn config_is_read() {
    let voice = voice();
    assert_eq!(voice.voice(), "joe");
    assert_eq!(voice.sample_rate(), 22050);
    assert_eq!(
        voice.scales(),
        Some(Scales {
            noise_scale: 0.667,
            length_scale: 1.0,
            noise_w: 0.8
        })
    );
}

#[test]
fn every_english_phoneme_is_known_to_the_voice() {
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Sphinx of black quartz, judge my vow!",
        "How vexingly quick daft zebras jump; the five boxing wizards jump quickly: yes?",
        "Thirty-three thousand, four hundred and twelve measures of azure pleasure in 1999.",
        "She sells seashells by the seashore, and the vision was unusual: bathing in the rhythm.",
    ];
    for text in texts {
        let (ids, missing) = voice().phoneme_ids(text).unwrap();
        assert!(missing.is_empty(), "{text}: {missing:?}");
        assert_eq!((ids[0], ids[1], *ids.last().unwrap()), (1, 0, 2), "{text}");
        // A pad after every phoneme.
        assert!(ids[1..ids.len() - 1].iter().step_by(2).all(|&id| id == 0), "{text}");
    }
}

#[test]
fn speech_is_loud_long_enough_and_speed_shortens_it() {
    let text = "The quick brown fox jumps over the lazy dog.";
    let normal = voice().synthesize(text, 1.0).unwrap();
    let seconds = normal.audio.len() as f32 / 22050.0;
    // About 2.5 s at a normal rate; nine words cannot take less than 1.2 s or more than 5.
    assert!((1.2..5.0).contains(&seconds), "{seconds} s");
    assert!(rms(&normal.audio) > 0.02, "rms {}", rms(&normal.audio));
    // Speech has pauses: the quietest tenth of 20 ms frames is much quieter than the loudest.
    let mut frames: Vec<f32> = normal.audio.chunks(441).map(rms).collect();
    frames.sort_by(f32::total_cmp);
    let (quiet, loud) = (frames[frames.len() / 10], frames[frames.len() * 9 / 10]);
    assert!(loud > 5.0 * quiet, "frames: {quiet} vs {loud}");

    let fast = voice().synthesize(text, 2.0).unwrap();
    let ratio = fast.audio.len() as f32 / normal.audio.len() as f32;
    assert!((0.35..0.7).contains(&ratio), "speed 2 gave {ratio} of the length");
}

#[test]
fn same_samples_as_onnxruntime_in_python() {
    let (ids, _) = voice().phoneme_ids("Hello, this is a test of the voice.").unwrap();
    let scales = Scales {
        noise_scale: 0.0,
        length_scale: 1.0,
        noise_w: 0.0,
    };
    let ours = voice().run_ids(&ids, scales).unwrap();
    // Deterministic with the noise off.
    assert_eq!(voice().run_ids(&ids, scales).unwrap(), ours);

    let dir = tempfile::tempdir().unwrap();
    let ids_path = dir.path().join("ids.json");
    std::fs::write(&ids_path, format!("{ids:?}")).unwrap();
    let out = dir.path().join("out.f32");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/speech/reference.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(model_dir().join("en_US-joe-medium.onnx"))
        .arg(&ids_path)
        .args(["0", "1", "0"])
        .arg(&out)
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "{} failed (needs numpy and onnxruntime)",
        script.display()
    );
    let theirs: Vec<f32> = std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(ours.len(), theirs.len());
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "largest difference {worst}");
    assert!(rms(&ours) > 0.02);
}
