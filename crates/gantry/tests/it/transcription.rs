//! Speech to text end to end with real weights (whisper-tiny-en, and the
//! piper-en-us-joe voice to speak the audio it hears; both fetched once into
//! `GANTRY_TEST_MODELS_DIR`): the round trip from text to speech to text
//! under 15 % word error rate, billing per second of audio, the four input
//! formats, URLs through the address guard, segments streamed over SSE,
//! cancellation, and bad input.
use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};
use crate::text::{cancel_while_streaming, models_dir, read_sse};

const MODEL: &str = "whisper-tiny-en";
const VOICE: &str = "piper-en-us-joe";
/// 100 micro-USD per second of audio.
const MICRO_USD_PER_SECOND: i64 = 100;

/// Sentences the round trip speaks and hears back.
pub(crate) const SENTENCES: &[&str] = &[
    "The weather was cold and windy when we left the harbor this morning.",
    "Please send the quarterly report to the finance team before Friday.",
    "She bought fresh bread, a bag of apples and some cheese at the market.",
    "Our train was delayed because of a signal failure near the station.",
    "The children played in the garden until the sun went down.",
    "He said that the new bridge would open to traffic next spring.",
    "Remember to water the plants and lock the back door tonight.",
    "A small boat drifted slowly across the quiet lake.",
    "The library will be closed on Monday for the public holiday.",
    "My brother fixed the old bicycle with a new chain and two tires.",
    "We watched the storm roll in from the hills after dinner.",
];

gantry_testkit::on_both_backends!(
    a_clip_is_transcribed_and_billed_per_second,
    bad_audio_fails_and_costs_nothing,
);

async fn transcription_app(backend: Backend) -> TestApp {
    transcription_app_fetching(backend, &["127.0.0.0/8"]).await
}

/// The voice and Whisper; `audio_url` may reach `ranges` over HTTP (the
/// platform's own file URLs are read from its store whatever they are).
async fn transcription_app_fetching(backend: Backend, ranges: &[&str]) -> TestApp {
    let ranges: Vec<String> = ranges.iter().map(|r| (*r).to_owned()).collect();
    TestApp::spawn_with(backend, move |s| {
        s.scheduler.bundled_workers = vec![VOICE.into(), MODEL.into()];
        s.scheduler.bundled_slots = 2;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
        s.engine_mut("speech")["threads"] = 1.into();
        s.engine_mut("transcription")["threads"] = 2.into();
        s.engine_mut("transcription")["fetch_allow_ranges"] = ranges.into();
    })
    .await
}

impl TestApp {
    pub(crate) async fn job(&self, model: &str, endpoint: &str, key: &str, input: Value) -> Value {
        // runsync waits as long as it may (300 s), so that a slow machine
        // gets the finished job rather than its id.
        let path = match endpoint {
            "runsync" => format!("/v2/{model}/runsync?wait=300000"),
            _ => format!("/v2/{model}/{endpoint}"),
        };
        let res = self
            .public(Method::POST, &path, key)
            .timeout(Duration::from_secs(330))
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }

    /// `text` spoken by the voice: the URL of its WAV and its duration.
    async fn spoken(&self, key: &str, text: &str) -> (String, f64) {
        let job = self.job(VOICE, "runsync", key, json!({ "prompt": text })).await;
        assert_eq!(job["status"], "COMPLETED", "{job}");
        let url = job["output"]["audio_url"].as_str().unwrap().to_owned();
        (url, job["output"]["duration"].as_f64().unwrap())
    }

    pub(crate) async fn download(&self, url: &str) -> Vec<u8> {
        let res = self.client.get(url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        res.bytes().await.unwrap().to_vec()
    }
}

/// Lower case words without punctuation.
pub(crate) fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| c.is_whitespace() || c == '-')
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == '\'')
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Word error rate: (substitutions + insertions + deletions) / reference words.
pub(crate) fn word_error_rate(reference: &[String], heard: &[String]) -> f64 {
    let mut previous: Vec<usize> = (0..=heard.len()).collect();
    for (i, r) in reference.iter().enumerate() {
        let mut current = vec![i + 1; heard.len() + 1];
        for (j, h) in heard.iter().enumerate() {
            let substitute = previous[j] + usize::from(r != h);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[heard.len()] as f64 / reference.len().max(1) as f64
}

#[test]
fn word_error_rate_counts_edits() {
    let w = |s: &str| words(s);
    assert_eq!(word_error_rate(&w("a b c d"), &w("A, b; c d.")), 0.0);
    assert_eq!(word_error_rate(&w("a b c d"), &w("a x c")), 0.5);
    assert_eq!(word_error_rate(&w("a b"), &w("a b c d")), 1.0);
}

fn cost_of(duration: f64) -> i64 {
    // ceil(duration in µs) × 100 µUSD / 10⁶, rounded half up.
    let micros = (duration * 1e6).ceil() as i64;
    (micros * MICRO_USD_PER_SECOND + 500_000) / 1_000_000
}

async fn a_clip_is_transcribed_and_billed_per_second(backend: Backend) {
    let app = transcription_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // Three sentences (about 40 words): one misheard word is 2.5 %, so the
    // bound is not at the mercy of the voice's random variation.
    let text = SENTENCES[..3].join(" ");
    let sentence = text.as_str();
    let (url, spoken_seconds) = app.spoken(&key, sentence).await;
    let wav = app.download(&url).await;

    // Inline, as base64.
    let audio = base64::engine::general_purpose::STANDARD.encode(&wav);
    let job = app.job(MODEL, "runsync", &key, json!({ "audio": audio })).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    let wer = word_error_rate(&words(sentence), &words(output["text"].as_str().unwrap()));
    assert!(wer < 0.15, "heard {:?} for {sentence:?}: WER {wer}", output["text"]);
    assert_eq!(output["language"], "en");
    let duration = output["duration"].as_f64().unwrap();
    assert!(
        (duration - spoken_seconds).abs() < 0.002,
        "{duration} vs {spoken_seconds}"
    );
    let segments = output["segments"].as_array().unwrap();
    assert!(!segments.is_empty(), "{output}");
    let joined: Vec<&str> = segments.iter().map(|s| s["text"].as_str().unwrap()).collect();
    assert_eq!(words(&joined.join(" ")), words(output["text"].as_str().unwrap()));
    for s in segments {
        let (start, end) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
        assert!(0.0 <= start && start < end && end <= duration + 0.5, "{s}");
    }

    // Billed per second of audio, once, exactly.
    let id = job["id"].as_str().unwrap();
    let charges = app.charges(id).await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert!(
        (charges[0] - cost_of(duration)).abs() <= 1,
        "{charges:?} for {duration} s"
    );
    assert_eq!(output["cost"].as_f64().unwrap(), charges[0] as f64 / 1e6);

    // By URL (the platform's own file URL, allowed for this test), same words.
    let by_url = app.job(MODEL, "runsync", &key, json!({ "audio_url": url })).await;
    assert_eq!(by_url["status"], "COMPLETED", "{by_url}");
    assert_eq!(by_url["output"]["text"], output["text"]);
}

async fn bad_audio_fails_and_costs_nothing(backend: Backend) {
    let app = transcription_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    for (input, needle) in [
        (json!({}), "audio_url or audio is required"),
        (
            json!({ "audio": b64(b"just some text, not a sound file") }),
            "not a WAV, MP3, FLAC or Ogg Vorbis file",
        ),
        (json!({ "audio": "@@@" }), "audio: not an http(s) URL"),
        (
            json!({ "audio": "UklGRg==", "audio_url": "https://example.com/a.wav" }),
            "not both",
        ),
        (
            json!({ "audio": "UklGRg==", "language": "de" }),
            "language: must be one of en (got 'de')",
        ),
        (
            json!({ "audio": "UklGRg==", "prompt": "x" }),
            "prompt: unknown property",
        ),
        (
            json!({ "audio_url": "http://10.1.2.3/a.wav" }),
            "10.1.2.3 is not allowed",
        ),
        (
            json!({ "audio_url": "http://169.254.169.254/latest" }),
            "169.254.169.254 is not allowed",
        ),
    ] {
        let job = app.job(MODEL, "runsync", &key, input.clone()).await;
        assert_eq!(job["status"], "FAILED", "{input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(error.starts_with("bad input"), "{error}");
        assert!(error.contains(needle), "{needle} in {error}");
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
}

/// The round trip: every sentence spoken by the voice in one reading (about
/// 30 s, so Whisper's window moves on at least once), heard back by Whisper
/// through the stream, segment by segment, under 15 % word error rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoken_sentences_are_heard_back_under_15_percent_word_error_rate() {
    let app = transcription_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let reading = SENTENCES.join(" ");
    let (url, seconds) = app.spoken(&key, &reading).await;
    assert!(seconds > 30.0, "{seconds} s: the reading should span two windows");

    let job = app.job(MODEL, "run", &key, json!({ "audio_url": url })).await;
    let id = job["id"].as_str().unwrap().to_owned();
    let events = read_sse(&app, MODEL, &key, &id, Duration::from_secs(300)).await;
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last.1, "status");
    assert_eq!(last.2["status"], "COMPLETED", "{}", last.2);
    let chunks: Vec<&Value> = rest
        .iter()
        .filter(|(_, name, _)| name == "chunk")
        .map(|(_, _, data)| &data["output"])
        .collect();
    let output = &last.2["output"];
    let segments = output["segments"].as_array().unwrap();
    assert!(segments.len() >= 2, "{output}");
    // Every segment was streamed once, in order, as it was final.
    assert_eq!(chunks.len(), segments.len());
    for (i, (chunk, segment)) in chunks.iter().zip(segments).enumerate() {
        assert_eq!(chunk["id"], i);
        assert_eq!(*chunk, segment);
    }
    let mut end = 0.0;
    for segment in segments {
        let start = segment["start"].as_f64().unwrap();
        assert!(start >= end - 0.01, "segments overlap: {segment} after {end}");
        end = segment["end"].as_f64().unwrap();
    }
    assert!(
        end > seconds - 5.0 && end <= seconds + 0.5,
        "last segment ends at {end} of {seconds} s"
    );

    let heard = output["text"].as_str().unwrap();
    let wer = word_error_rate(&words(&reading), &words(heard));
    println!(
        "round trip over {seconds:.1} s: word error rate {:.1} %\n  said:  {reading}\n  heard: {heard}",
        wer * 100.0
    );
    assert!(wer < 0.15, "word error rate {wer}: heard {heard:?}");
    assert_eq!(app.charges(&id).await.len(), 1);
}

/// The same speech as WAV, MP3, FLAC and Ogg Vorbis (converted by Debian's
/// ffmpeg, which `.ci/run` installs), at 44.1 kHz stereo for the MP3: the
/// WAV heard under 15 % word error rate, and each other format heard as the
/// WAV was (within one word in ten: lossy codecs may tip a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mp3_flac_and_ogg_are_heard_like_wav() {
    let app = transcription_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let text = SENTENCES[2..5].join(" ");
    let sentence = text.as_str();
    let (url, _) = app.spoken(&key, sentence).await;
    let mut heard_wav = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("speech.wav");
    std::fs::write(&wav, app.download(&url).await).unwrap();
    for (name, args) in [
        ("speech.wav", &[][..]),
        ("speech.mp3", &["-ar", "44100", "-ac", "2", "-b:a", "128k"][..]),
        ("speech.flac", &[][..]),
        ("speech.ogg", &["-c:a", "libvorbis", "-q:a", "5"][..]),
    ] {
        let path = dir.path().join(name);
        if name != "speech.wav" {
            let status = std::process::Command::new("ffmpeg")
                .args(["-loglevel", "error", "-y", "-i"])
                .arg(&wav)
                .args(args)
                .arg(&path)
                .status()
                .expect("ffmpeg runs (Debian: ffmpeg)");
            assert!(status.success(), "ffmpeg made no {name}");
        }
        let audio = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&path).unwrap());
        let job = app.job(MODEL, "runsync", &key, json!({ "audio": audio })).await;
        assert_eq!(job["status"], "COMPLETED", "{name}: {job}");
        let heard = words(job["output"]["text"].as_str().unwrap());
        if name == "speech.wav" {
            let wer = word_error_rate(&words(sentence), &heard);
            assert!(wer < 0.15, "{name}: heard {heard:?}, WER {wer}");
            heard_wav = heard;
        } else {
            let apart = word_error_rate(&heard_wav, &heard);
            assert!(apart <= 0.1, "{name}: heard {heard:?}, the WAV {heard_wav:?} ({apart})");
        }
    }
}

/// A long recording is cancelled after its first segment: the job ends
/// CANCELLED before the rest is heard, costs nothing, and the worker is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_transcription_stops_and_costs_nothing() {
    let app = transcription_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let reading = [SENTENCES, SENTENCES, SENTENCES].concat().join(" ");
    let (url, seconds) = app.spoken(&key, &reading).await;
    assert!(seconds > 70.0, "{seconds} s");
    let job = app.job(MODEL, "run", &key, json!({ "audio_url": url })).await;
    let id = job["id"].as_str().unwrap().to_owned();
    let events = cancel_while_streaming(&app, MODEL, &key, &id, 0, Duration::from_secs(120)).await;
    let last = events.last().unwrap();
    assert_eq!((last.1.as_str(), &last.2["status"]), ("status", &json!("CANCELLED")));
    assert_eq!(app.charges(&id).await, Vec::<i64>::new());
    // The worker is free again.
    let (short, _) = app.spoken(&key, "Still listening.").await;
    let next = app.job(MODEL, "runsync", &key, json!({ "audio_url": short })).await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
}

/// In the embedded default no address range is allowed, so a fetch of the
/// platform's own loopback URL would be refused: a speech URL feeds the
/// transcription all the same, read from the file store. Only its owner may
/// use it; a URL whose signature was changed is no file of the platform's,
/// and is fetched (and refused) like any other loopback URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speech_url_of_the_platform_feeds_a_transcription_directly() {
    let app = transcription_app_fetching(Backend::Sqlite, &[]).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let sentence = SENTENCES[0];
    let (url, _) = app.spoken(&key, sentence).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let job = app.job(MODEL, "runsync", &key, json!({ "audio_url": url })).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let heard = words(job["output"]["text"].as_str().unwrap());
    let wer = word_error_rate(&words(sentence), &heard);
    assert!(wer < 0.15, "heard {heard:?}, WER {wer}");

    // Another account's job may not read it.
    let (_, other) = app.user_with_key("endpoints:run").await;
    let res = app
        .public(Method::POST, &format!("/v2/{MODEL}/run"), &other)
        .json(&json!({"input": { "audio_url": url }}))
        .send()
        .await
        .unwrap();
    let body = crate::harness::problem(res, 422).await;
    assert!(
        crate::harness::errors_of(&body)
            .iter()
            .any(|e| e.starts_with("input.audio_url: the file is not one of your jobs' files")),
        "{body}"
    );

    // A changed signature: not the platform's file, so fetched over HTTP, and
    // loopback is refused.
    let tampered = url.replacen("sig=", "sig=0", 1);
    let job = app.job(MODEL, "runsync", &key, json!({ "audio_url": tampered })).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert!(job["error"].as_str().unwrap().contains("not allowed"), "{job}");
}
