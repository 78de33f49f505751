//! The `kokoro-hibari` voice end to end with its real files (the graph, the
//! G2P's lexicons and models, ONNX Runtime; fetched once into
//! `GANTRY_TEST_MODELS_DIR`): runsync, the 24 kHz WAV behind the expiring
//! URL, billing by characters, the same text giving the same bytes,
//! sentences streamed over SSE, bad input, and the round trip through
//! `whisper-tiny-en` under 15 % word error rate.
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp};
use crate::speech::{assert_speech, read_wav};
use crate::text::{models_dir, read_sse};
use crate::transcription::{SENTENCES, word_error_rate, words};

const MODEL: &str = "kokoro-hibari";
const WHISPER: &str = "whisper-tiny-en";
/// 0.05 USD per 1000 characters: 50 micro-USD a character.
const MICRO_USD_PER_CHARACTER: i64 = 50;

gantry_testkit::on_both_backends!(
    a_sentence_is_read_the_same_every_time_and_billed_by_characters,
    bad_input_fails_and_costs_nothing,
);

async fn hibari_app(backend: Backend) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec![MODEL.into(), WHISPER.into()];
        s.scheduler.bundled_slots = 2;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
        s.engine_mut("speech")["threads"] = 1.into();
        s.engine_mut("transcription")["threads"] = 2.into();
        // The round trip hands the platform's own file URL (127.0.0.1) to Whisper.
        s.engine_mut("transcription")["fetch_allow_ranges"] = serde_json::json!(["127.0.0.0/8"]);
    })
    .await
}

async fn a_sentence_is_read_the_same_every_time_and_billed_by_characters(backend: Backend) {
    let app = hibari_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let prompt = "Dr. Smith paid $9.99 for 3 books on the 2nd of May.";
    let job = app.job(MODEL, "runsync", &key, json!({ "prompt": prompt })).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    let characters = prompt.chars().count() as i64;
    assert_eq!(output["characters"], characters);
    assert_eq!(output["sample_rate"], 24_000);
    assert_eq!(output["format"], "wav");
    let url = output["audio_url"].as_str().expect("audio_url");
    let res = app.client.get(url).send().await.unwrap();
    assert_eq!(res.headers()["content-type"], "audio/wav");
    let bytes = app.download(url).await;
    let (rate, samples) = read_wav(&bytes);
    assert_eq!(rate, 24_000);
    let seconds = samples.len() as f64 / 24_000.0;
    assert!(
        (output["duration"].as_f64().unwrap() - seconds).abs() < 0.001,
        "{output}"
    );
    // The numbers, money and the title are read out: many more syllables
    // than characters would suggest for plain words.
    assert!((2.5..9.0).contains(&seconds), "{seconds} s for {prompt:?}");
    assert_speech(&samples, "the file");

    // Characters x price, plus the kept WAV, charged once, in exact micro-USD.
    let id = job["id"].as_str().unwrap();
    let micro = characters * MICRO_USD_PER_CHARACTER + app.kept_files_charge(id).await;
    assert_eq!(output["cost"].as_f64().unwrap(), micro as f64 / 1e6);
    assert_eq!(app.charges(id).await, [micro]);

    // The vocoder's noise is seeded by the text: the same request, the same bytes.
    let again = app
        .job(MODEL, "runsync", &key, json!({ "prompt": prompt, "voice": "heart" }))
        .await;
    assert_eq!(again["status"], "COMPLETED", "{again}");
    assert_eq!(
        app.download(again["output"]["audio_url"].as_str().unwrap()).await,
        bytes
    );

    // Twice the speed, about half the audio.
    let fast = app
        .job(MODEL, "runsync", &key, json!({ "prompt": prompt, "speed": 2.0 }))
        .await;
    assert_eq!(fast["status"], "COMPLETED", "{fast}");
    let ratio = fast["output"]["duration"].as_f64().unwrap() / seconds;
    assert!((0.35..0.7).contains(&ratio), "speed 2 gave {ratio} of the duration");
}

async fn bad_input_fails_and_costs_nothing(backend: Backend) {
    let app = hibari_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for (input, needle) in [
        (json!({"prompt": " "}), "prompt: must not be empty or only whitespace"),
        (json!({"prompt": "Hello.", "voice": "joe"}), "unknown voice 'joe'"),
        (
            json!({"prompt": "Hello.", "speed": 0.1}),
            "speed: must be a number from 0.5 to 2 (got 0.1)",
        ),
        (json!({"prompt": "x".repeat(5001)}), "at most 5000"),
        (
            json!({"prompt": "Hello.", "reference_audio": "UklGRg=="}),
            "voice matching is not available",
        ),
        // Found only while speaking: a number too long to read out.
        (
            json!({"prompt": format!("Fine. Then {} goes here.", "9".repeat(40))}),
            "cannot read",
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

/// Every sentence streams as a playable WAV whose samples, in order, are the
/// file's; Whisper hears the reading back under 15 % word error rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentences_stream_and_are_heard_back_under_15_percent_word_error_rate() {
    let app = hibari_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let mut sentences: Vec<&str> = SENTENCES.to_vec();
    sentences.push("The meeting moved from 9:30 to 11 on Tuesday, the 4th of June.");
    let reading = sentences.join(" ");
    let job = app.job(MODEL, "run", &key, json!({ "prompt": reading })).await;
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
    assert_eq!(chunks.len(), sentences.len(), "one chunk per sentence");
    let mut streamed = Vec::new();
    for (i, (chunk, sentence)) in chunks.iter().zip(&sentences).enumerate() {
        assert_eq!(chunk["index"], i);
        assert_eq!(chunk["text"], *sentence);
        let wav = base64::engine::general_purpose::STANDARD
            .decode(chunk["audio_base64"].as_str().unwrap())
            .unwrap();
        let (rate, samples) = read_wav(&wav);
        assert_eq!(rate, 24_000);
        assert_speech(&samples, sentence);
        streamed.extend(samples);
    }
    let output = &last.2["output"];
    let file = app.download(output["audio_url"].as_str().unwrap()).await;
    assert_eq!(read_wav(&file).1, streamed, "the chunks add up to the file");
    let seconds = output["duration"].as_f64().unwrap();

    let heard = app
        .job(WHISPER, "runsync", &key, json!({ "audio_url": output["audio_url"] }))
        .await;
    assert_eq!(heard["status"], "COMPLETED", "{heard}");
    let heard = heard["output"]["text"].as_str().unwrap();
    let wer = word_error_rate(&words(&reading), &words(heard));
    println!(
        "hibari round trip over {seconds:.1} s: word error rate {:.1} %\n  said:  {reading}\n  heard: {heard}",
        wer * 100.0
    );
    assert!(wer < 0.15, "word error rate {wer}: heard {heard:?}");
}
