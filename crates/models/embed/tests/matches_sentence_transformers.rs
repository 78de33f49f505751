//! The engine against sentence-transformers itself: the same token ids and
//! vectors within 1e-4 cosine on the sentences of `reference/reference.json`
//! (made once by `reference/make_reference.py` with the real library), one
//! at a time and batched together, through the worker's own input path, on
//! the CPU network and on the candle network the GPU path uses.
//!
//! Needs the model's files (`gantry models pull all-minilm-l6-v2`) in
//! `$GANTRY_TEST_MODELS_DIR/all-minilm-l6-v2` (default `~/.cache/gantry/models`).
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::PathBuf;

use gantry_model_embed::{EmbeddingModel, Encoder, Options};
use serde::Deserialize;

const MODEL: &str = "all-minilm-l6-v2";

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    sentences: Vec<String>,
    token_ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn model_dir() -> PathBuf {
    let base = std::env::var_os("GANTRY_TEST_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gantry/models")))
        .expect("neither GANTRY_TEST_MODELS_DIR nor HOME is set");
    let dir = base.join(MODEL);
    assert!(
        dir.join("model.safetensors").is_file(),
        "the {MODEL} model is not in {}: run `gantry models pull {MODEL}` \
         (or set GANTRY_TEST_MODELS_DIR to the models directory)",
        dir.display()
    );
    dir
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn token_ids_are_the_reference_tokenizers() {
    let reference = reference();
    let encoder = Encoder::load(&model_dir(), candle_core::Device::Cpu).unwrap();
    assert_eq!(encoder.max_text_tokens() + 2, reference.max_seq_length);
    let tokenizer = encoder.tokenizer();
    for (sentence, expected) in reference.sentences.iter().zip(&reference.token_ids) {
        let mut ids = vec![tokenizer.cls()];
        let mut text = tokenizer.encode(sentence);
        text.truncate(encoder.max_text_tokens());
        ids.extend(text);
        ids.push(tokenizer.sep());
        assert_eq!(&ids, expected, "token ids of {sentence:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_match_sentence_transformers() {
    let reference = reference();
    let model = EmbeddingModel::load(MODEL, &model_dir(), &Options::default()).unwrap();
    assert_eq!(model.dimensions(), reference.embeddings[0].len());
    let texts: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    // All at once (one batch of mixed lengths), one at a time, and from
    // concurrent requests that the engine batches together.
    let together = model.embed_texts(&texts).await.unwrap();
    // One request's inputs share passes: the short ones one batch, the long
    // one (cut to 256 tokens) past the batch's token bound another.
    assert_eq!(model.engine().passes(), 2);
    let mut alone = Vec::new();
    for text in &texts {
        alone.push(model.embed_texts(&[text]).await.unwrap().remove(0));
    }
    let before = model.engine().passes();
    let concurrent = futures_join(&model, &texts).await;
    // The concurrent requests shared forward passes (sent together, they
    // wait while the first pass runs, then go in one round).
    let passes = model.engine().passes() - before;
    assert!(
        passes < texts.len() as u64,
        "{} concurrent requests took {passes} passes",
        texts.len()
    );
    for (i, expected) in reference.embeddings.iter().enumerate() {
        for (how, got) in [
            ("batched", &together[i]),
            ("alone", &alone[i]),
            ("concurrent", &concurrent[i]),
        ] {
            let similarity = cosine(got, expected);
            assert!(
                similarity > 1.0 - 1e-4,
                "{how}: cosine {similarity} for {:?}",
                reference.sentences[i]
            );
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{how}: norm {norm}");
        }
    }
    // Related sentences are nearer than unrelated ones.
    assert!(cosine(&together[0], &together[1]) > cosine(&together[0], &together[4]));
}

/// The GPU path's network (candle-transformers' BERT on padded batches),
/// run here on the CPU: the same vectors.
#[test]
fn the_candle_network_matches_too() {
    let reference = reference();
    let encoder = Encoder::load_with(&model_dir(), candle_core::Device::Cpu, true).unwrap();
    let tokenizer = encoder.tokenizer();
    let ids: Vec<Vec<u32>> = reference
        .sentences
        .iter()
        .map(|s| {
            let mut ids = tokenizer.encode(s);
            ids.truncate(encoder.max_text_tokens());
            ids
        })
        .collect();
    let views: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let vectors = encoder.embed(&views).unwrap();
    for (i, expected) in reference.embeddings.iter().enumerate() {
        let similarity = cosine(&vectors[i], expected);
        assert!(
            similarity > 1.0 - 1e-4,
            "cosine {similarity} for {:?}",
            reference.sentences[i]
        );
    }
}

/// Every text as its own request, all in flight at once.
async fn futures_join(model: &EmbeddingModel, texts: &[&str]) -> Vec<Vec<f32>> {
    let mut set = Vec::new();
    for text in texts {
        set.push(model.embed_texts(std::slice::from_ref(text)));
    }
    let mut out = Vec::new();
    for fut in futures_util::future::join_all(set).await {
        out.push(fut.unwrap().remove(0));
    }
    out
}
