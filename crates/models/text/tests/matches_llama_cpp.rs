#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Greedy decoding matches llama.cpp's own greedy decoding, token for token,
//! for the first 32 tokens of fixed prompts on the same GGUF file. The
//! reference tokens were produced by llama.cpp itself (bench/text/greedy_ref.cpp
//! linked against the llama.cpp this crate builds; bench/text/make-fixture.sh
//! regenerates them).
use std::path::PathBuf;

use serde_json::Value;

fn weights() -> PathBuf {
    let dir = match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry/models"),
    };
    let path = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `gantry models pull smollm2-135m-instruct` with GANTRY_MODELS_DIR={}",
        path.display(),
        dir.display()
    );
    path
}

#[test]
fn greedy_tokens_equal_llama_cpp_reference() {
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/smollm2-greedy-llama-cpp.json")).expect("fixture parses");
    let gguf = weights();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let expected: Vec<i32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| i32::try_from(t.as_i64().unwrap()).unwrap())
            .collect();
        assert_eq!(expected.len(), 32, "the fixture holds 32 tokens");
        let ours = gantry_model_text::greedy_tokens(&gguf, prompt, expected.len()).unwrap();
        assert_eq!(ours, expected, "greedy tokens of {prompt:?}");
    }
}
