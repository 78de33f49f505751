//! The embedding model end to end (all-MiniLM-L6-v2, fetched once into
//! `GANTRY_TEST_MODELS_DIR`): vectors through runsync and the OpenAI route
//! equal to sentence-transformers' (the embedding crate's reference.json),
//! billing per input token exactly once, bad input that costs nothing,
//! concurrent requests batched together, and two real clients (the OpenAI
//! SDK and LangChain).
use std::path::PathBuf;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, run_client_script};
use crate::text::models_dir;

const MODEL: &str = "all-minilm-l6-v2";

gantry_testkit::on_both_backends!(
    vectors_equal_the_reference_and_are_billed_per_token,
    bad_input_fails_and_costs_nothing,
);

fn reference_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/embed/tests/reference/reference.json")
}

struct Reference {
    sentences: Vec<String>,
    /// Text tokens of each sentence (the reference's ids less [CLS] and [SEP]).
    tokens: Vec<usize>,
    vectors: Vec<Vec<f64>>,
}

fn reference() -> Reference {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(reference_path()).unwrap()).unwrap();
    Reference {
        sentences: serde_json::from_value(json["sentences"].clone()).unwrap(),
        tokens: json["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ids| ids.as_array().unwrap().len() - 2)
            .collect(),
        vectors: serde_json::from_value(json["embeddings"].clone()).unwrap(),
    }
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn assert_near(got: &Value, expected: &[f64], what: &str) {
    let got: Vec<f64> = match got {
        Value::String(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => serde_json::from_value(other.clone()).unwrap(),
    };
    assert_eq!(got.len(), expected.len(), "{what}");
    let similarity = cosine(&got, expected);
    assert!(similarity > 1.0 - 1e-4, "{what}: cosine {similarity}");
}

/// 0.10 USD per million tokens: a tenth of a micro-USD a token, rounded
/// half up to whole micro-USD per job.
fn cost_of(tokens: usize) -> i64 {
    (tokens as i64 + 5) / 10
}

async fn embedding_app(backend: Backend) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec![MODEL.into()];
        s.scheduler.bundled_slots = 16;
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
    })
    .await
}

impl TestApp {
    async fn embed(&self, key: &str, input: Value) -> Value {
        let res = self
            .public(Method::POST, &format!("/v2/{MODEL}/runsync"), key)
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }
}

async fn vectors_equal_the_reference_and_are_billed_per_token(backend: Backend) {
    let app = embedding_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let reference = reference();

    // Every reference sentence in one job, the long one cut to the model's length.
    let job = app.embed(&key, json!({ "input": reference.sentences })).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    assert_eq!(output["dimensions"], 384);
    let vectors = output["embeddings"].as_array().unwrap();
    assert_eq!(vectors.len(), reference.sentences.len());
    for (i, vector) in vectors.iter().enumerate() {
        assert_near(vector, &reference.vectors[i], &reference.sentences[i]);
    }
    let long = reference.sentences.len() - 1;
    assert_eq!(output["truncated"], json!([long]), "only the long sentence is cut");
    let tokens: usize = reference.tokens.iter().sum();
    assert_eq!(output["usage"]["input_tokens"], tokens);
    assert_eq!(app.charges(job["id"].as_str().unwrap()).await, [cost_of(tokens)]);
    assert_eq!(output["cost"].as_f64().unwrap(), cost_of(tokens) as f64 / 1e6);

    // One string, as base64 floats.
    let job = app
        .embed(
            &key,
            json!({ "input": reference.sentences[2], "encoding_format": "base64" }),
        )
        .await;
    assert_near(&job["output"]["embeddings"][0], &reference.vectors[2], "base64");
    assert_eq!(
        app.charges(job["id"].as_str().unwrap()).await,
        [cost_of(reference.tokens[2])]
    );

    // The OpenAI route: the same vectors in OpenAI's list, the same billing.
    let res = app
        .public(Method::POST, &format!("/v2/{MODEL}/openai/v1/embeddings"), &key)
        .json(&json!({ "model": MODEL, "input": [reference.sentences[0], reference.sentences[1]] }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], MODEL);
    for i in 0..2 {
        assert_eq!(body["data"][i]["index"], i);
        assert_eq!(body["data"][i]["object"], "embedding");
        assert_near(&body["data"][i]["embedding"], &reference.vectors[i], "openai");
    }
    let tokens = reference.tokens[0] + reference.tokens[1];
    assert_eq!(body["usage"], json!({"prompt_tokens": tokens, "total_tokens": tokens}));
}

async fn bad_input_fails_and_costs_nothing(backend: Backend) {
    let app = embedding_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let long = "word ".repeat(400);
    for (input, needle) in [
        (json!({"input": long, "truncate": false}), "input[0] has 400 tokens"),
        (json!({"input": []}), "must not be an empty array"),
        (json!({"input": [30522]}), "30522 is not a token id"),
        (json!({"input": "x", "dimensions": 128}), "cannot be shortened"),
        (json!({"input": "x", "normalize": true}), "normalize: unknown property"),
        (json!({"text": "x"}), "input: required property is missing"),
    ] {
        let job = app.embed(&key, input.clone()).await;
        assert_eq!(job["status"], "FAILED", "{input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(error.starts_with("bad input"), "{error}");
        assert!(error.contains(needle), "{needle} in {error}");
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }

    // On the OpenAI route: OpenAI's error shape, naming what is wrong.
    for (body, needle) in [
        (json!({"input": "x", "dimensions": 128}), "cannot be shortened"),
        (json!({"model": MODEL}), "`input` is required"),
        (
            json!({"input": "x", "frobnicate": 1}),
            "Unrecognized request argument supplied: frobnicate",
        ),
    ] {
        let res = app
            .public(Method::POST, &format!("/v2/{MODEL}/openai/v1/embeddings"), &key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{body}");
        let error: Value = res.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{needle} in {message}");
    }
    // A text model is not an embedding model.
    let res = app
        .public(Method::POST, "/v2/gantry-echo/openai/v1/embeddings", &key)
        .json(&json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
}

/// Many clients at once: each gets its own sentence's vector (the engine
/// batches their inputs together) and each job is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_their_own_vectors() {
    let app = embedding_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let reference = reference();
    let count = reference.sentences.len();
    let mut tasks = Vec::new();
    for round in 0..2 {
        for i in 0..count {
            let request = app.public(Method::POST, &format!("/v2/{MODEL}/runsync"), &key).json(
                &json!({ "input": { "input": [reference.sentences[i], reference.sentences[(i + round) % count]] } }),
            );
            tasks.push(tokio::spawn(async move {
                let res = request.send().await.unwrap();
                assert_eq!(res.status(), 200);
                (round, i, res.json::<Value>().await.unwrap())
            }));
        }
    }
    for task in tasks {
        let (round, i, job) = task.await.unwrap();
        assert_eq!(job["status"], "COMPLETED", "{job}");
        let vectors = &job["output"]["embeddings"];
        assert_near(&vectors[0], &reference.vectors[i], &reference.sentences[i]);
        let j = (i + round) % count;
        assert_near(&vectors[1], &reference.vectors[j], &reference.sentences[j]);
        let tokens = reference.tokens[i] + reference.tokens[j];
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, [cost_of(tokens)]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_get_the_reference_vectors() {
    let app = embedding_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let reference = reference_path().display().to_string();
    run_client_script(
        &app,
        "openai_embeddings.py",
        MODEL,
        &key,
        &[("GANTRY_REFERENCE", reference)],
        "embeddings clients: all checks passed",
        "openai langchain-openai",
    )
    .await;
}
