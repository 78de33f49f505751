//! Voice matching end to end (piper-en-us-joe with Resemblyzer's speaker
//! encoder, both real weights): for reference recordings of four speakers
//! (espeak-ng voices, made by the test), the matched output is closer to
//! its reference, by the speaker encoder's cosine similarity, than the
//! plain voice reading the same text; bad references fail and cost nothing.
use std::time::{Duration, Instant};

use base64::Engine as _;
use gantry_model_speech::speaker::{SAMPLE_RATE, SpeakerEncoder, cosine};
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};
use crate::text::models_dir;
use crate::videos::serve_once_per_request;

const MODEL: &str = "piper-en-us-joe";
/// What the reference speakers say (neither the test text nor the calibration).
const REFERENCE_TEXT: &str = "On Saturday morning we drove to the coast with a basket of sandwiches. \
The wind was strong, so we walked along the cliffs and counted the boats in the harbour.";
/// What the matched voice says.
const TEXT: &str = "Please remember to bring your library card when you come in on Thursday. \
The new books are on the shelf beside the window.";
/// espeak-ng voices: four speakers unlike joe and unlike each other.
const SPEAKERS: [&str; 4] = ["en-us+f3", "en-us+Alicia", "en-gb+m1", "en-us+Andy"];

async fn voices_app() -> TestApp {
    TestApp::spawn_with(Backend::Sqlite, |s| {
        s.scheduler.bundled_workers = vec![MODEL.into()];
        s.scheduler.bundled_slots = 2;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
        s.engine_mut("speech")["threads"] = 1.into();
        // One reference comes from a URL on loopback.
        s.engine_mut("speech")["fetch_allow_ranges"] = serde_json::json!(["127.0.0.0/8"]);
    })
    .await
}

fn encoder() -> SpeakerEncoder {
    SpeakerEncoder::load(&models_dir().join(MODEL).join("pretrained.safetensors")).unwrap()
}

/// `text` spoken by espeak-ng's `voice`, as a WAV file.
fn espeak(voice: &str, text: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reference.wav");
    let status = std::process::Command::new("espeak-ng")
        .args(["-v", voice, "-w"])
        .arg(&path)
        .arg(text)
        .status()
        .expect("espeak-ng runs (Debian package espeak-ng)");
    assert!(status.success(), "espeak-ng -v {voice}");
    std::fs::read(&path).unwrap()
}

/// Samples of a 16-bit PCM WAV at 16 kHz mono.
fn wav_16k(bytes: &[u8]) -> Vec<f32> {
    let audio = gantry_media::audio::decode(bytes.to_vec(), 600.0).unwrap();
    assert!(!audio.samples.is_empty());
    assert_eq!(SAMPLE_RATE, 16_000);
    audio.samples
}

impl TestApp {
    /// Runs a reading through `/run` and polls it to its end (voice matching
    /// takes seconds, longer than a runsync wait on a busy machine).
    async fn read_aloud(&self, key: &str, input: Value) -> Value {
        let res = self
            .public(Method::POST, &format!("/v2/{MODEL}/run"), key)
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let job: Value = res.json().await.unwrap();
        let id = job["id"].as_str().unwrap().to_owned();
        let started = Instant::now();
        loop {
            let job = self
                .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), key)
                .await;
            if !["IN_QUEUE", "IN_PROGRESS"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "job {id} never finished: {job}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn audio_of(&self, job: &Value) -> Vec<u8> {
        assert_eq!(job["status"], "COMPLETED", "{job}");
        let url = job["output"]["audio_url"].as_str().unwrap();
        self.client
            .get(url)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matched_voice_is_closer_to_every_reference_speaker_than_the_plain_voice() {
    let app = voices_app().await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let encoder = encoder();
    let plain = app.read_aloud(&key, json!({ "prompt": TEXT })).await;
    assert!(plain["output"].get("voice_match").is_none(), "{plain}");
    let plain = encoder.embed(&wav_16k(&app.audio_of(&plain).await));

    let mut report = Vec::new();
    for (i, speaker) in SPEAKERS.iter().enumerate() {
        let reference_wav = espeak(speaker, REFERENCE_TEXT);
        let reference = encoder.embed(&wav_16k(&reference_wav));
        // The first reference by URL, the others inline.
        let given = if i == 0 {
            serve_once_per_request(reference_wav.clone(), "audio/wav")
        } else {
            base64::engine::general_purpose::STANDARD.encode(&reference_wav)
        };
        let job = app
            .read_aloud(&key, json!({ "prompt": TEXT, "reference_audio": given }))
            .await;
        let matched = encoder.embed(&wav_16k(&app.audio_of(&job).await));
        let fit = &job["output"]["voice_match"];
        let (before, after) = (cosine(&plain, &reference), cosine(&matched, &reference));
        report.push(format!(
            "{speaker}: plain {before:.3}, matched {after:.3} (calibration {} -> {}, pitch x{}, equaliser {}; {:.1} s)",
            fit["base_similarity"],
            fit["similarity"],
            fit["pitch_scale"],
            fit["equalizer"],
            job["executionTime"].as_f64().unwrap_or(0.0) / 1000.0
        ));
        assert!(
            fit["similarity"].as_f64().unwrap() >= fit["base_similarity"].as_f64().unwrap(),
            "{fit}"
        );
        // Billed like any reading: characters of the prompt.
        let id = job["id"].as_str().unwrap();
        let charges = app.charges(id).await;
        assert_eq!(
            charges,
            [TEXT.chars().count() as i64 * 50 + app.kept_files_charge(id).await]
        );
        assert!(
            after > before,
            "{speaker}: matched {after} is not closer than plain {before}\n{report:#?}"
        );
    }
    eprintln!("voice matching:\n{}", report.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reference_fails_and_costs_nothing() {
    let app = voices_app().await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let short = espeak("en-us", "Hi.");
    for (reference, needle) in [
        (json!(b64(b"not a recording at all")), "'reference_audio': "),
        (json!("@@"), "'reference_audio': not an http(s) URL"),
        (json!(b64(&short)), "at least 1 s"),
        (json!("http://10.1.2.3/me.wav"), "10.1.2.3 is not allowed"),
        (json!(7), "reference_audio: must be a string, not a number"),
    ] {
        let job = app
            .read_aloud(&key, json!({ "prompt": "Hello there.", "reference_audio": reference }))
            .await;
        assert_eq!(job["status"], "FAILED", "{job}");
        let error = job["error"].as_str().unwrap();
        assert!(
            error.starts_with("bad input") && error.contains(needle),
            "{needle} in {error}"
        );
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

/// A job cancelled while its voice is being matched ends `CANCELLED` and
/// costs nothing (the fit itself stops at its next encoder run: the speech
/// crate's `speaker_encoder` test counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reading_cancelled_while_matching_costs_nothing() {
    let app = voices_app().await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // A reference no other test uses, so no cached fit skips the matching.
    let reference = base64::engine::general_purpose::STANDARD.encode(espeak("en-us+f4", REFERENCE_TEXT));
    let res = app
        .public(Method::POST, &format!("/v2/{MODEL}/run"), &key)
        .json(&json!({ "input": { "prompt": TEXT, "reference_audio": reference } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    loop {
        let status = app
            .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), &key)
            .await;
        if status["progress"]["stage"] == "matching voice" {
            break;
        }
        assert_ne!(
            status["status"], "COMPLETED",
            "finished before matching was seen: {status}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no matching stage: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancelled = app
        .public_ok(Method::POST, &format!("/v2/{MODEL}/cancel/{id}"), &key)
        .await;
    assert_eq!(cancelled["status"], "CANCELLED");
    let status = app
        .public_ok(Method::GET, &format!("/v2/{MODEL}/status/{id}"), &key)
        .await;
    assert_eq!(status["status"], "CANCELLED", "{status}");
    assert_eq!(app.charges(&id).await, Vec::<i64>::new());
}
