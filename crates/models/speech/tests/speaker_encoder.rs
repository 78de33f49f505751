#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The speaker encoder (Resemblyzer's voice encoder in Rust) on speech from
//! espeak-ng: its mel frames and embeddings match Resemblyzer's algorithm in
//! numpy + librosa (`bench/speech/speaker_reference.py`) on the same samples,
//! clips of one voice are closer than clips of two voices, and degenerate
//! input does not panic.
//!
//! Needs the converted weights (`pretrained.safetensors`, next to the voice
//! in `GANTRY_TEST_MODELS_DIR/piper-en-us-joe`), the `espeak-ng` and `ffmpeg`
//! programs, and for the comparison Python 3 with numpy and librosa
//! (`GANTRY_TEST_PYTHON` names the interpreter; `python3` by default).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gantry_model_speech::speaker::{self, SAMPLE_RATE, SpeakerEncoder};

const MODEL: &str = "piper-en-us-joe";
const WEIGHTS: &str = "pretrained.safetensors";

fn weights_path() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        candidates.push(PathBuf::from(dir).join(MODEL).join(WEIGHTS));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(
            PathBuf::from(home)
                .join(".cache/gantry/models")
                .join(MODEL)
                .join(WEIGHTS),
        );
    }
    candidates.push(PathBuf::from("/tmp/rz/models/rz-test").join(WEIGHTS));
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("the speaker encoder's weights are missing; looked at {candidates:?}"))
}

fn encoder() -> &'static SpeakerEncoder {
    static ENCODER: OnceLock<SpeakerEncoder> = OnceLock::new();
    ENCODER.get_or_init(|| SpeakerEncoder::load(&weights_path()).unwrap())
}

/// A clip of espeak-ng speech, resampled to 16 kHz 16-bit PCM by ffmpeg.
struct Clip {
    wav: PathBuf,
    samples: Vec<f32>,
}

fn speak(dir: &Path, name: &str, voice: &str, text: &str) -> Clip {
    let raw = dir.join(format!("{name}-22k.wav"));
    let wav = dir.join(format!("{name}.wav"));
    let status = Command::new("espeak-ng")
        .args(["-v", voice, "-w"])
        .arg(&raw)
        .arg(text)
        .status()
        .expect("espeak-ng must be installed");
    assert!(status.success(), "espeak-ng failed");
    let status = Command::new("ffmpeg")
        .args(["-loglevel", "error", "-y", "-i"])
        .arg(&raw)
        .args(["-ar", &SAMPLE_RATE.to_string(), "-ac", "1", "-acodec", "pcm_s16le"])
        .arg(&wav)
        .status()
        .expect("ffmpeg must be installed");
    assert!(status.success(), "ffmpeg failed");
    let samples = read_pcm16(&wav);
    Clip { wav, samples }
}

/// The samples of a mono 16-bit PCM WAV file, as `i16 / 32768`.
fn read_pcm16(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"RIFF");
    assert_eq!(&bytes[8..12], b"WAVE");
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let body = &bytes[at + 8..(at + 8 + len).min(bytes.len())];
        if id == b"fmt " {
            assert_eq!(u16::from_le_bytes([body[0], body[1]]), 1, "PCM");
            assert_eq!(u16::from_le_bytes([body[2], body[3]]), 1, "mono");
            assert_eq!(u32::from_le_bytes(body[4..8].try_into().unwrap()), SAMPLE_RATE);
            assert_eq!(u16::from_le_bytes([body[14], body[15]]), 16, "16-bit");
        } else if id == b"data" {
            return body
                .chunks_exact(2)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
                .collect();
        }
        at += 8 + len + len % 2;
    }
    panic!("{} has no data chunk", path.display());
}

/// The Python reference's embedding and mel frames (`frames × 40`) of a clip.
fn reference(clip: &Clip) -> (Vec<f32>, Vec<f32>, usize) {
    let python = std::env::var_os("GANTRY_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../bench/speech/speaker_reference.py");
    let mel_path = clip.wav.with_extension("mel");
    let output = Command::new(&python)
        .arg(&script)
        .arg(weights_path())
        .arg(&clip.wav)
        .arg("--mel")
        .arg(&mel_path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python:?}: {e}"));
    assert!(
        output.status.success(),
        "{} failed (it needs numpy and librosa): {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let embedding: Vec<f32> = answer["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let frames = answer["frames"].as_u64().unwrap() as usize;
    let mel: Vec<f32> = std::fs::read(&mel_path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(mel.len(), frames * 40);
    (embedding, mel, frames)
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

#[test]
fn matches_the_python_reference() {
    let dir = tempfile::tempdir().unwrap();
    let clips = [
        // Under 2.7 s: one partial, the audio zero-padded to 1.6 s or more.
        ("short", "en-us+f3", "Good morning."),
        // Several partials; the last one kept or dropped by its coverage.
        (
            "long",
            "en-us+m3",
            "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.",
        ),
        (
            "british",
            "en-gb",
            "She sells sea shells by the sea shore, or so they say.",
        ),
    ];
    for (name, voice, text) in clips {
        let clip = speak(dir.path(), name, voice, text);
        let (want_embedding, want_mel, want_frames) = reference(&clip);

        let (mel, frames) = SpeakerEncoder::mel(&clip.samples);
        assert_eq!(frames, want_frames, "{name}: mel frames");
        assert_eq!(frames, 1 + clip.samples.len() / 160);
        // Relative to each value (about 4e-7 at worst), with a floor a
        // million times below the clip's loudest band for the zeros of
        // silent frames.
        let floor = want_mel.iter().fold(0.0f32, |m, v| m.max(*v)) * 1e-6;
        let mut worst = 0.0f32;
        for (got, want) in mel.iter().zip(&want_mel) {
            worst = worst.max((got - want).abs() / want.abs().max(floor));
        }
        eprintln!("{name}: mel max relative difference {worst:.2e}");
        assert!(worst < 1e-3, "{name}: mel differs by {worst} relative");

        let embedding = encoder().embed_trimmed(&clip.samples);
        assert_eq!(embedding.len(), 256);
        let similarity = speaker::cosine(&embedding, &want_embedding);
        let max_diff = embedding
            .iter()
            .zip(&want_embedding)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{name}: cosine {similarity:.7}, max abs difference {max_diff:.2e}");
        assert!(similarity > 0.9999, "{name}: cosine {similarity}");
        assert!(max_diff < 1e-3, "{name}: max abs difference {max_diff}");
        assert!((norm(&embedding) - 1.0).abs() < 1e-5);
    }
}

#[test]
fn one_voice_is_closer_than_two() {
    let dir = tempfile::tempdir().unwrap();
    let sentences = [
        "A rainbow appears when sunlight passes through drops of water in the air.",
        "Please remember to bring your umbrella to the meeting tomorrow afternoon.",
    ];
    let voices = ["en-us+m3", "en-us+f4"];
    let mut embeddings = Vec::new();
    for (v, voice) in voices.iter().enumerate() {
        for (s, text) in sentences.iter().enumerate() {
            let clip = speak(dir.path(), &format!("v{v}s{s}"), voice, text);
            embeddings.push((v, encoder().embed(&clip.samples)));
        }
    }
    let mut same = Vec::new();
    let mut different = Vec::new();
    for (i, (vi, ei)) in embeddings.iter().enumerate() {
        for (vj, ej) in &embeddings[i + 1..] {
            let similarity = speaker::cosine(ei, ej);
            if vi == vj {
                same.push(similarity);
            } else {
                different.push(similarity);
            }
        }
    }
    eprintln!("same voice: {same:?}; different voices: {different:?}");
    let closest_different = different.iter().fold(f32::MIN, |m, v| m.max(*v));
    assert!(
        same.iter().all(|s| *s > closest_different),
        "same voice {same:?}, different voices {different:?}"
    );
}

#[test]
fn trimming_silence_keeps_the_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let clip = speak(
        dir.path(),
        "pause",
        "en-us+m3",
        "Silence is golden, but speech is silver.",
    );
    // Two seconds of near silence before, between two copies, and after.
    let quiet: Vec<f32> = (0..2 * SAMPLE_RATE as usize)
        .map(|i| 1e-5 * (i as f32 * 0.7).sin())
        .collect();
    let mut padded = quiet.clone();
    padded.extend_from_slice(&clip.samples);
    padded.extend_from_slice(&quiet);
    padded.extend_from_slice(&clip.samples);
    padded.extend_from_slice(&quiet);

    let trimmed = speaker::trim_silences(&padded);
    assert!(trimmed.len() < padded.len() - 4 * SAMPLE_RATE as usize);
    assert!(trimmed.len() > clip.samples.len());

    let plain = encoder().embed(&clip.samples);
    let with_pauses = encoder().embed(&padded);
    let untrimmed = encoder().embed_trimmed(&speaker::normalize_volume(&padded, -30.0));
    let kept = speaker::cosine(&plain, &with_pauses);
    let lost = speaker::cosine(&plain, &untrimmed);
    eprintln!("with the pauses trimmed: cosine {kept}; untrimmed: {lost}");
    assert!(kept > 0.95 && kept > lost, "trimmed {kept}, untrimmed {lost}");
}

#[test]
fn threads_give_the_same_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let clip = speak(
        dir.path(),
        "threads",
        "en-us+f2",
        "Four score and seven years ago our fathers brought forth on this continent a new nation.",
    );
    let one = encoder().embed(&clip.samples);
    let two = encoder().clone().with_threads(2).embed(&clip.samples);
    assert_eq!(one, two);
}

#[test]
fn empty_and_short_inputs_do_not_panic() {
    let encoder = encoder();
    assert_eq!(encoder.embed(&[]), vec![0.0; 256]);
    assert_eq!(encoder.embed_trimmed(&[]), vec![0.0; 256]);
    let (mel, frames) = SpeakerEncoder::mel(&[]);
    assert_eq!((mel.len(), frames), (40, 1));
    let tone: Vec<f32> = (0..4000).map(|i| 0.2 * (i as f32 * 0.06).sin()).collect();
    for input in [&[0.5f32][..], &[0.0; 10], &[0.0; 16_000], &tone[..100], &tone[..]] {
        for embedding in [encoder.embed(input), encoder.embed_trimmed(input)] {
            assert_eq!(embedding.len(), 256);
            assert!(embedding.iter().all(|v| v.is_finite() && *v >= 0.0));
            let n = norm(&embedding);
            assert!(n == 0.0 || (n - 1.0).abs() < 1e-5, "norm {n}");
        }
    }
    assert!(speaker::trim_silences(&[]).is_empty());
    assert!(speaker::normalize_volume(&[], -30.0).is_empty());
    assert_eq!(speaker::cosine(&[0.0; 4], &[1.0; 4]), 0.0);
}

#[test]
fn a_fit_stops_at_its_next_encoder_run_when_asked() {
    use gantry_model_speech::clone::Matcher;
    use std::cell::Cell;
    let dir = tempfile::tempdir().unwrap();
    // Another espeak-ng voice stands in for the voice being matched (16 kHz).
    let voice = speak(
        dir.path(),
        "voice",
        "en-us",
        "Would you like a cup of tea before we go?",
    );
    let reference = speak(
        dir.path(),
        "reference",
        "en-us+f3",
        "The harbour was quiet in the morning.",
    );
    let matcher = Matcher { encoder: encoder() };

    let asked = Cell::new(0);
    let never = || {
        asked.set(asked.get() + 1);
        false
    };
    let fit = matcher
        .fit(&voice.samples, SAMPLE_RATE, &reference.samples, &never)
        .expect("a fit never stopped completes");
    // Asked once before the reference is embedded, then once per candidate
    // scored (the unchanged voice's score is reused).
    assert_eq!(fit.candidates, 11);
    let full = asked.get();
    assert!(full >= 10, "asked {full} times");

    // Cancelled after the third question: no fit, and no further questions
    // (every later candidate is skipped, none is scored).
    let asked = Cell::new(0);
    let after_three = || {
        asked.set(asked.get() + 1);
        asked.get() > 3
    };
    assert!(
        matcher
            .fit(&voice.samples, SAMPLE_RATE, &reference.samples, &after_three)
            .is_none()
    );
    assert_eq!(asked.get(), 4, "the fit went on asking after it was stopped");
}
