//! The speech model end to end with its real voice (piper-en-us-joe: the
//! ONNX graph and the ONNX Runtime library, fetched once into
//! `GANTRY_TEST_MODELS_DIR`; phonemes from the system's espeak-ng): runsync,
//! the WAV behind the expiring URL, billing by characters, sentences
//! streamed over SSE while the job runs, and bad input.
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, SseReader, TestApp};
use crate::text::{cancel_while_streaming, models_dir};

const MODEL: &str = "piper-en-us-joe";
/// 0.05 USD per 1000 characters: 50 micro-USD a character.
const MICRO_USD_PER_CHARACTER: i64 = 50;

gantry_testkit::on_both_backends!(
    a_sentence_is_a_real_wav_billed_by_characters,
    bad_input_fails_and_costs_nothing,
);

async fn speech_app(backend: Backend) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec![MODEL.into()];
        s.scheduler.bundled_slots = 2;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
        s.engine_mut("speech")["threads"] = 1.into();
    })
    .await
}

impl TestApp {
    async fn speak(&self, endpoint: &str, key: &str, input: Value) -> Value {
        let res = self
            .public(Method::POST, &format!("/v2/{MODEL}/{endpoint}"), key)
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }
}

/// A 16-bit mono PCM WAV, read back: its sample rate and samples.
pub(crate) fn read_wav(bytes: &[u8]) -> (u32, Vec<i16>) {
    assert!(bytes.len() >= 44, "{} bytes", bytes.len());
    assert_eq!(&bytes[0..4], b"RIFF");
    assert_eq!(&bytes[8..16], b"WAVEfmt ");
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    assert_eq!(u32_at(4) as usize, bytes.len() - 8, "RIFF size");
    assert_eq!((u16_at(20), u16_at(22), u16_at(34)), (1, 1, 16), "PCM, mono, 16 bits");
    assert_eq!(&bytes[36..40], b"data");
    assert_eq!(u32_at(40) as usize, bytes.len() - 44, "data size");
    let samples = bytes[44..]
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    (u32_at(24), samples)
}

fn rms(samples: &[i16]) -> f64 {
    (samples.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / samples.len().max(1) as f64).sqrt()
}

/// Speech, not silence or noise: loud on average, with quiet gaps.
pub(crate) fn assert_speech(samples: &[i16], what: &str) {
    assert!(rms(samples) > 1000.0, "{what}: rms {}", rms(samples));
    let mut frames: Vec<f64> = samples.chunks(441).map(rms).collect();
    frames.sort_by(f64::total_cmp);
    let (quiet, loud) = (frames[frames.len() / 10], frames[frames.len() * 9 / 10]);
    assert!(loud > 4.0 * quiet, "{what}: 20 ms frames from {quiet} to {loud}");
}

async fn a_sentence_is_a_real_wav_billed_by_characters(backend: Backend) {
    let app = speech_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let prompt = "The quick brown fox jumps over the lazy dog.";
    let job = app.speak("runsync", &key, json!({ "prompt": prompt })).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    let characters = prompt.chars().count() as i64;
    assert_eq!(output["characters"], characters);
    assert_eq!(output["sample_rate"], 22050);
    assert_eq!(output["format"], "wav");

    let url = output["audio_url"].as_str().expect("audio_url");
    let res = app.client.get(url).send().await.unwrap();
    assert_eq!(res.status(), 200, "{url}");
    assert_eq!(res.headers()["content-type"], "audio/wav");
    let (rate, samples) = read_wav(&res.bytes().await.unwrap());
    assert_eq!(rate, 22050);
    let seconds = samples.len() as f64 / 22050.0;
    assert!(
        (output["duration"].as_f64().unwrap() - seconds).abs() < 0.001,
        "{output}"
    );
    // 44 characters of English: about 2.5 s; 8 to 30 characters a second is speech.
    assert!(seconds > 0.5, "{seconds} s");
    let per_second = characters as f64 / seconds;
    assert!((8.0..30.0).contains(&per_second), "{per_second} characters a second");
    assert_speech(&samples, "the file");

    // Characters x price, plus the kept WAV, charged once, in exact micro-USD.
    let id = job["id"].as_str().unwrap();
    let micro = characters * MICRO_USD_PER_CHARACTER + app.kept_files_charge(id).await;
    assert_eq!(output["cost"].as_f64().unwrap(), micro as f64 / 1e6);
    assert_eq!(app.charges(id).await, [micro]);

    // Twice the speed, about half the audio.
    let fast = app
        .speak(
            "runsync",
            &key,
            json!({ "prompt": prompt, "speed": 2.0, "voice": "joe" }),
        )
        .await;
    assert_eq!(fast["status"], "COMPLETED", "{fast}");
    let ratio = fast["output"]["duration"].as_f64().unwrap() / seconds;
    assert!((0.35..0.7).contains(&ratio), "speed 2 gave {ratio} of the duration");
}

async fn bad_input_fails_and_costs_nothing(backend: Backend) {
    let app = speech_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for (input, needle) in [
        (json!({"prompt": ""}), "prompt: must not be empty or only whitespace"),
        (json!({}), "prompt: required property is missing"),
        (json!({"prompt": "Hello.", "voice": "amy"}), "unknown voice 'amy'"),
        (
            json!({"prompt": "Hello.", "speed": 9}),
            "speed: must be a number from 0.5 to 2 (got 9)",
        ),
        (json!({"prompt": "Hello.", "format": "mp3"}), "(got 'mp3')"),
        (json!({"prompt": "x".repeat(5001)}), "at most 5000"),
        (json!({"prompt": "Hello.", "pitch": 2}), "pitch: unknown property"),
    ] {
        let job = app.speak("runsync", &key, input.clone()).await;
        assert_eq!(job["status"], "FAILED", "{input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(error.starts_with("bad input"), "{error}");
        assert!(error.contains(needle), "{needle} in {error}");
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

/// Events of a job's SSE stream with the time each arrived.
async fn sse_timed(app: &TestApp, key: &str, id: &str) -> Vec<(Instant, String, Value)> {
    let mut reader = SseReader::open(app, MODEL, key, id, None).await;
    let mut events = Vec::new();
    while let Some((_, name, data)) = reader.next(Duration::from_secs(120)).await {
        events.push((Instant::now(), name, data));
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentences_stream_in_order_as_playable_wavs_before_the_job_ends() {
    let app = speech_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let first = "Hello there.";
    let second = "This second sentence is a good deal longer than the first one, \
                  so that it takes the voice a while to speak it from beginning to end.";
    let prompt = format!("{first} {second}");
    let job = app.speak("run", &key, json!({ "prompt": prompt })).await;
    let id = job["id"].as_str().unwrap().to_string();
    let events = sse_timed(&app, &key, &id).await;

    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last.1, "status", "the stream ends with the job");
    assert_eq!(last.2["status"], "COMPLETED", "{}", last.2);
    assert_eq!(chunks.len(), 2, "one chunk per sentence: {chunks:?}");
    let mut streamed = Vec::new();
    for (i, (_, name, data)) in chunks.iter().enumerate() {
        assert_eq!(name, "chunk");
        let chunk = &data["output"];
        assert_eq!(chunk["index"], i);
        assert_eq!(chunk["text"], [first, second][i]);
        assert_eq!(chunk["sample_rate"], 22050);
        let wav = base64::engine::general_purpose::STANDARD
            .decode(chunk["audio_base64"].as_str().unwrap())
            .unwrap();
        let (rate, samples) = read_wav(&wav);
        assert_eq!(rate, 22050);
        assert!(samples.len() > 22050 / 2, "sentence {i}: {} samples", samples.len());
        assert_speech(&samples, &format!("sentence {i}"));
        streamed.extend(samples);
    }
    // The first sentence was out while the second was still being spoken.
    let gap = last.0.duration_since(chunks[0].0);
    assert!(
        gap > Duration::from_millis(20),
        "first chunk only {gap:?} before the end"
    );
    assert!(chunks[0].0 < chunks[1].0);

    // The chunks, together, are the file.
    let output = &last.2["output"];
    assert_eq!(output["sentences"], 2);
    let res = app
        .client
        .get(output["audio_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    let (_, whole) = read_wav(&res.bytes().await.unwrap());
    assert_eq!(whole, streamed);
    let micro = prompt.chars().count() as i64 * MICRO_USD_PER_CHARACTER;
    assert_eq!(app.charges(&id).await, [micro + app.kept_files_charge(&id).await]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_reading_stops_and_costs_nothing() {
    let app = speech_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let prompt = (1..=40)
        .map(|i| format!("This is sentence number {i} of a long reading that nobody will hear to the end."))
        .collect::<Vec<_>>()
        .join(" ");
    let job = app.speak("run", &key, json!({ "prompt": prompt })).await;
    let id = job["id"].as_str().unwrap().to_string();
    let events = cancel_while_streaming(&app, MODEL, &key, &id, 0, Duration::from_secs(60)).await;
    let last = events.last().unwrap();
    assert_eq!((last.1.as_str(), &last.2["status"]), ("status", &json!("CANCELLED")));
    let chunks = events.iter().filter(|(_, name, _)| name == "chunk").count();
    assert!(chunks < 40, "{chunks} of 40 sentences");
    assert_eq!(app.charges(&id).await, Vec::<i64>::new());
    // The worker is free again: a short job goes through.
    let next = app.speak("runsync", &key, json!({ "prompt": "Still here." })).await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
}

/// What ffprobe says of a file: codec, sample rate, channels, duration.
fn probe(path: &std::path::Path) -> (String, u32, u32, f64) {
    let out = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,sample_rate,channels:format=duration",
        ])
        .args(["-of", "json"])
        .arg(path)
        .output()
        .expect("ffprobe runs (Debian: ffmpeg)");
    assert!(
        out.status.success(),
        "ffprobe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stream = &info["streams"][0];
    (
        stream["codec_name"].as_str().unwrap().to_owned(),
        stream["sample_rate"].as_str().unwrap().parse().unwrap(),
        stream["channels"].as_u64().unwrap() as u32,
        info["format"]["duration"].as_str().unwrap().parse().unwrap(),
    )
}

/// 16-bit mono samples of an audio file, decoded by ffmpeg.
fn decode_pcm(path: &std::path::Path) -> Vec<i16> {
    let out = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-f", "s16le", "-ac", "1", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(out.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flac_and_ogg_files_are_what_they_say() {
    let app = speech_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let dir = tempfile::tempdir().unwrap();
    let prompt = "Lossless or not, this is still speech. It comes in two sentences.";
    for (format, media_type, codec) in [("flac", "audio/flac", "flac"), ("ogg", "audio/ogg", "vorbis")] {
        let job = app
            .speak("run", &key, json!({ "prompt": prompt, "format": format }))
            .await;
        let id = job["id"].as_str().unwrap().to_string();
        let events = sse_timed(&app, &key, &id).await;
        let (last, chunks) = events.split_last().unwrap();
        assert_eq!(last.2["status"], "COMPLETED", "{format}: {}", last.2);
        let output = &last.2["output"];
        assert_eq!(output["format"], format);
        let res = app
            .client
            .get(output["audio_url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.headers()["content-type"], media_type);
        let path = dir.path().join(format!("whole.{format}"));
        std::fs::write(&path, res.bytes().await.unwrap()).unwrap();
        let (found, rate, channels, seconds) = probe(&path);
        assert_eq!((found.as_str(), rate, channels), (codec, 22050, 1), "{format}");
        let duration = output["duration"].as_f64().unwrap();
        assert!(
            (seconds - duration).abs() < 0.05,
            "{format}: {seconds} s in the file, {duration} s said"
        );
        let whole = decode_pcm(&path);
        assert_speech(&whole, format);

        // Each chunk is a complete file of the same format; for FLAC (lossless)
        // their samples, one after the other, are exactly the file's.
        assert_eq!(chunks.len(), 2, "{format}: {chunks:?}");
        let mut joined = Vec::new();
        for (i, (_, _, data)) in chunks.iter().enumerate() {
            assert_eq!(data["output"]["format"], format);
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data["output"]["audio_base64"].as_str().unwrap())
                .unwrap();
            let piece = dir.path().join(format!("chunk{i}.{format}"));
            std::fs::write(&piece, bytes).unwrap();
            assert_eq!(probe(&piece).0, codec);
            joined.extend(decode_pcm(&piece));
        }
        if format == "flac" {
            assert_eq!(joined, whole, "the FLAC chunks are the FLAC file");
        } else {
            let ratio = joined.len() as f64 / whole.len() as f64;
            assert!(
                (0.98..1.02).contains(&ratio),
                "ogg chunks hold {ratio} of the file's samples"
            );
        }
        let micro = prompt.chars().count() as i64 * MICRO_USD_PER_CHARACTER;
        assert_eq!(app.charges(&id).await, [micro + app.kept_files_charge(&id).await]);
    }
}
