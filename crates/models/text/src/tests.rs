//! Tests with real weights (SmolLM2-135M-Instruct, Q4_1).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::future::join_all;
use gantry_worker_sdk::{CancellationToken, JobError, Output};
use serde_json::{Value, json};

use super::*;
use crate::engine::{Finished, Request, Submission};

const MODEL_DIR: &str = "smollm2-135m-instruct";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The test weights; fails (never skips) when they are missing.
fn weights() -> PathBuf {
    let dir = std::env::var_os("GANTRY_TEST_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/gantry/models")
        });
    let path = dir.join(MODEL_DIR).join(MODEL_FILE);
    assert!(
        path.is_file(),
        "test weights missing at {}: run `gantry models pull smollm2-135m-instruct` \
         (or point GANTRY_TEST_MODELS_DIR at a directory holding {MODEL_DIR}/{MODEL_FILE})",
        path.display()
    );
    path
}

/// Test engines use one thread: tests run two at a time on small machines,
/// and llama.cpp's threads spin while they wait for each other.
const TEST_OPTIONS: EngineOptions = EngineOptions {
    threads: 1,
    // Two, so that every batched test draws its tokens on the sampling
    // threads, as a server does.
    sampling_threads: 2,
    context_tokens: 8192,
    max_sequences: 16,
    batch_tokens: 512,
    gpu_layers: 0,
    stream_interval: Duration::ZERO,
};

/// One model shared by the tests that do not need special options, with a
/// lock: its tests compare outputs across runs, and requests running at the
/// same time can change llama.cpp's numerics (see `concurrent_greedy_...`).
async fn shared_model() -> (tokio::sync::MutexGuard<'static, ()>, &'static TextModel) {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    static MODEL: OnceLock<TextModel> = OnceLock::new();
    let guard = LOCK.lock().await;
    (guard, MODEL.get_or_init(|| load(TEST_OPTIONS)))
}

fn load(options: EngineOptions) -> TextModel {
    TextModel::load("smollm2", &weights(), options).unwrap()
}

/// Runs `input`, collecting the streamed groups of pieces.
async fn run_groups(model: &TextModel, input: Value) -> (Result<Output, JobError>, Vec<Vec<String>>) {
    let groups = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&groups);
    let result = model
        .generate(input, CancellationToken::new(), move |chunk: Chunk| {
            sink.lock().unwrap().push(chunk.pieces);
            async { Ok(()) }
        })
        .await;
    let groups = groups.lock().unwrap().clone();
    (result, groups)
}

/// Runs `input` on a model that streams every piece alone, collecting them.
async fn run_collect(model: &TextModel, input: Value) -> (Result<Output, JobError>, Vec<String>) {
    let (result, groups) = run_groups(model, input).await;
    assert!(groups.iter().all(|group| group.len() == 1), "{groups:?}");
    (result, groups.concat())
}

async fn run_ok(model: &TextModel, input: Value) -> (Value, Vec<String>) {
    let (result, pieces) = run_collect(model, input.clone()).await;
    let output = result.unwrap_or_else(|e| panic!("{input}: {e}"));
    let choice = &output.output["choices"][0];
    // the chunks, the `tokens` list and the text agree exactly
    let tokens: Vec<String> = serde_json::from_value(choice["tokens"].clone()).unwrap();
    assert_eq!(tokens, pieces);
    assert_eq!(pieces.concat(), choice["text"].as_str().unwrap());
    assert!(pieces.iter().all(|p| !p.is_empty()));
    let usage = &output.output["usage"];
    let billed = usage["input"].as_u64().unwrap() + usage["output"].as_u64().unwrap();
    assert_eq!(output.usage, Usage::whole("tokens", billed));
    (output.output, pieces)
}

fn text(output: &Value) -> &str {
    output["choices"][0]["text"].as_str().unwrap()
}

fn finish_reason(output: &Value) -> &str {
    output["choices"][0]["finish_reason"].as_str().unwrap()
}

#[tokio::test]
async fn model_metadata() {
    let (_lock, model) = shared_model().await;
    assert!(model.shared.template.is_some(), "SmolLM2 ships a chat template");
    assert_eq!(model.context_length(), 8192);
    let params = Params::parse(&json!({"prompt": "Hi"}), 8192).unwrap();
    let request = model.shared.requests(params).unwrap().remove(0);
    let mut prompt = Vec::new();
    for &token in &request.prompt {
        model.shared.model.piece(token, true, &mut prompt);
    }
    let prompt = String::from_utf8(prompt).unwrap();
    assert!(prompt.contains("<|im_start|>user\nHi<|im_end|>"), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
}

#[test]
fn the_c_api_wrapper_reads_the_gguf() {
    let model = Weights::load(&weights(), 0).unwrap();
    assert_eq!(model.meta("general.architecture").as_deref(), Some("llama"));
    assert_eq!(model.meta("no.such.key"), None);
    assert_eq!(model.n_ctx_train(), 8192);
    assert!(
        (130_000_000..140_000_000).contains(&model.n_params()),
        "{}",
        model.n_params()
    );
    // longer than the first buffer `meta` tries
    let template = model.meta("tokenizer.chat_template").unwrap();
    assert!(template.len() > 128 && template.contains("<|im_start|>"), "{template}");
    assert_eq!(model.chat_template(), ChatTemplate::named(&template));
    // text -> tokens -> text
    let text = "Grüße aus Zürich: 3.14 🚀";
    let tokens = model.tokenize(text.as_bytes(), false, false).unwrap();
    assert!(tokens.len() > 5);
    let mut bytes = Vec::new();
    for &token in &tokens {
        model.piece(token, false, &mut bytes);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    // special tokens: parsed only when asked, rendered only when asked
    let special = model.tokenize(b"<|im_end|>", false, true).unwrap();
    assert_eq!(special.len(), 1);
    assert!(model.is_end_of_generation(special[0]));
    assert!(model.tokenize(b"<|im_end|>", false, false).unwrap().len() > 1);
    let (mut shown, mut hidden) = (Vec::new(), Vec::new());
    model.piece(special[0], true, &mut shown);
    model.piece(special[0], false, &mut hidden);
    assert_eq!((shown.as_slice(), hidden.as_slice()), (&b"<|im_end|>"[..], &b""[..]));
}

#[test]
fn the_engine_context_decodes_on_its_own_threadpool() {
    let model = Weights::load(&weights(), 0).unwrap();
    let settings = ContextSettings {
        n_ctx: 256,
        n_batch: 64,
        n_ubatch: 64,
        n_seq_max: 2,
        unified_kv: true,
        threads: 2,
    };
    let mut context = Context::new(&model, settings).unwrap();
    assert!(context.has_threadpool());
    assert_eq!((context.n_ctx(), context.n_batch(), context.n_ubatch()), (256, 64, 64));
    let tokens = model.tokenize(b"The quick brown fox", true, false).unwrap();
    let mut batch = Batch::new(64);
    let mut last = 0;
    for (position, &token) in tokens.iter().enumerate() {
        last = batch
            .push(token, position as i32, 1, position + 1 == tokens.len())
            .unwrap();
    }
    context.decode(&batch).unwrap();
    let mut sampler = Sampler::chain(&[Stage::Greedy]);
    let first = sampler.sample(&context, last);
    let reference = greedy_tokens(&weights(), "The quick brown fox", 1).unwrap();
    assert_eq!(vec![first], reference);
    // a sequence's cells can be freed and the cache emptied
    context.remove_sequence(1).unwrap();
    context.clear();
    // four batches of 64 fill the 256 cells; a fifth finds no room
    let mut block = Batch::new(64);
    for start in (0..320).step_by(64) {
        block.clear();
        for position in start..start + 64 {
            block.push(tokens[0], position, 0, false).unwrap();
        }
        let decoded = context.decode(&block);
        if start < 256 {
            decoded.unwrap();
        } else {
            assert_eq!(decoded, Err("no room in the KV cache for the batch".to_owned()));
        }
    }
}

#[tokio::test]
async fn greedy_generation_is_deterministic() {
    let (_lock, model) = shared_model().await;
    let input = json!({"prompt": "What is the capital of France?", "temperature": 0, "max_tokens": 40});
    let (first, _) = run_ok(model, input.clone()).await;
    let (second, _) = run_ok(model, input).await;
    assert_eq!(first, second);
    assert!(!text(&first).is_empty());
    assert!(text(&first).contains("Paris"), "{}", text(&first));
}

#[tokio::test]
async fn engine_greedy_matches_plain_greedy_decoding() {
    let (_lock, model) = shared_model().await;
    let prompt = "The quick brown fox";
    let (mut choices, _) = model
        .complete(
            json!({"prompt": prompt, "raw": true, "temperature": 0, "max_tokens": 32}),
            CancellationToken::new(),
            |_| async { Ok(()) },
        )
        .await
        .unwrap();
    let ChoiceResult { pieces, finished, .. } = choices.remove(0);
    let reference = greedy_tokens(&weights(), prompt, 32).unwrap();
    assert_eq!(finished.tokens, reference);
    assert_eq!(pieces.concat(), finished.text);
}

/// Tokenizes `input` for `model`'s engine.
fn request(model: &TextModel, input: &Value) -> Request {
    let params = Params::parse(input, model.context_length()).unwrap();
    model.shared.requests(params).unwrap().remove(0)
}

/// Waits for one submission's end: its pieces and the result.
async fn drain(submission: Submission) -> (Vec<String>, Result<Finished, JobError>) {
    let Submission { mut pieces, mut done } = submission;
    let (_, result) = done.recv().await.expect("the engine stopped");
    let mut all = Vec::new();
    // every piece is queued before the end
    while let Ok((_, emitted)) = pieces.try_recv() {
        if !emitted.piece.is_empty() {
            all.push(emitted.piece);
        }
    }
    (all, result)
}

/// Sequences decoded in one batch give exactly the tokens each gives alone.
///
/// llama.cpp's CPU kernels make this hold while every sequence's KV cells
/// lie in position order and below 256 (more cells switch single-token
/// decodes to another attention kernel) and batches stay under 64 tokens.
/// A sequence that ends early frees cells *between* those of the others,
/// whose next tokens then land there: their attention then sums in another
/// order and a near-tie can flip (llama.cpp issue #7052). So the four
/// requests here start in the same step and all run to `max_tokens`.
#[tokio::test]
async fn batched_greedy_sequences_match_solo_runs() {
    batched_sequences_match_solo_runs(|_| json!({"temperature": 0})).await;
}

/// The same with sampling, each request with a seed of its own: in a batch,
/// the four chains draw at once on the sampling threads, and each draws
/// exactly what it draws alone (same logits, same chain, same seed).
#[tokio::test]
async fn batched_sampled_sequences_match_solo_runs() {
    batched_sequences_match_solo_runs(|i| json!({"temperature": 0.9, "top_k": 40, "seed": 11 + i})).await;
}

/// Greedy again, with a stop string for the first: it ends a step early in
/// a batch whose decode of its next token is already under way (its text is
/// released while that decode runs); the others go on exactly as alone,
/// and the stopped one ends as it does alone.
#[tokio::test]
async fn a_stop_string_in_a_batch_ends_its_sequence_alone() {
    batched_sequences_match_solo_runs(|i| match i {
        0 => json!({"temperature": 0, "stop": [" 7"]}),
        _ => json!({"temperature": 0}),
    })
    .await;
}

/// Four requests run one at a time, then together in one batch; `sampling`
/// gives the sampling fields of the `i`th.
async fn batched_sequences_match_solo_runs(sampling: impl Fn(usize) -> Value) {
    let model = load(EngineOptions {
        context_tokens: 1024,
        max_sequences: 4,
        batch_tokens: 48,
        ..TEST_OPTIONS
    });
    let inputs: Vec<Value> = [
        "1, 2, 3, 4,",
        "Monday, Tuesday, Wednesday,",
        "The prime numbers are 2, 3, 5, 7,",
        "a, b, c, d,",
    ]
    .iter()
    .enumerate()
    .map(|(i, prompt)| {
        let mut input = json!({"prompt": prompt, "raw": true, "max_tokens": 24, "ignore_eos": true});
        for (key, value) in sampling(i).as_object().unwrap() {
            input[key] = value.clone();
        }
        input
    })
    .collect();
    let mut solo = Vec::new();
    for input in &inputs {
        let (pieces, finished) = drain(model.engine.submit(request(&model, input), CancellationToken::new())).await;
        let finished = finished.unwrap();
        let reason = if input.get("stop").is_some() {
            engine::FinishReason::Stop
        } else {
            engine::FinishReason::Length
        };
        assert_eq!(finished.finish_reason, reason, "{input}: {}", finished.text);
        assert_eq!(pieces.concat(), finished.text);
        solo.push(finished);
    }
    // A blocker holds the whole budget, so the four queue up; cancelling it
    // lets them all in at the same step.
    let blocker_input = json!({"prompt": "Hi", "raw": true, "temperature": 0, "max_tokens": 1000});
    let blocker_cancel = CancellationToken::new();
    let blocker = model
        .engine
        .submit(request(&model, &blocker_input), blocker_cancel.clone());
    let batched: Vec<_> = inputs
        .iter()
        .map(|input| model.engine.submit(request(&model, input), CancellationToken::new()))
        .collect();
    blocker_cancel.cancel();
    assert!(matches!(drain(blocker).await.1, Err(JobError::Cancelled)));
    let batched = join_all(batched.into_iter().map(drain)).await;
    for (solo, (pieces, batched)) in solo.iter().zip(batched) {
        let batched = batched.unwrap();
        assert_eq!(&batched, solo);
        assert_eq!(pieces.concat(), batched.text);
    }
}

/// Many requests at once on one engine all complete properly.
#[tokio::test]
async fn concurrent_requests_all_complete() {
    let model = load(EngineOptions {
        context_tokens: 2048,
        max_sequences: 4,
        ..TEST_OPTIONS
    });
    let inputs: Vec<Value> = (0..6)
        .map(|i| json!({"prompt": format!("Tell me fact number {i} about cats."), "temperature": 0.8, "seed": i, "max_tokens": 24}))
        .collect();
    let outputs = join_all(inputs.iter().map(|input| run_ok(&model, input.clone()))).await;
    for (output, _) in &outputs {
        let generated = output["usage"]["output"].as_u64().unwrap();
        assert!((1..=24).contains(&generated));
        let reason = finish_reason(output);
        assert!(reason == "stop" || (reason == "length" && generated == 24), "{output}");
    }
}

#[tokio::test]
async fn requests_beyond_the_budget_wait_their_turn() {
    // room for two 100-token reservations at a time, and two sequence slots
    let model = load(EngineOptions {
        context_tokens: 256,
        max_sequences: 2,
        batch_tokens: 16,
        ..TEST_OPTIONS
    });
    let input = json!({"prompt": "Count: 1, 2, 3,", "raw": true, "temperature": 0, "max_tokens": 90});
    let (alone, _) = run_ok(&model, input.clone()).await;
    let results = join_all((0..5).map(|_| run_ok(&model, input.clone()))).await;
    for (output, _) in &results {
        assert_eq!(text(output), text(&alone));
    }
    // a request that can never fit is refused
    let (error, _) = run_collect(&model, json!({"prompt": "Hi", "raw": true, "max_tokens": 256})).await;
    assert!(matches!(error, Err(JobError::BadInput(_))), "{error:?}");
}

#[tokio::test]
async fn long_prompts_are_read_in_chunks() {
    let model = load(EngineOptions {
        context_tokens: 1024,
        max_sequences: 2,
        batch_tokens: 8,
        ..TEST_OPTIONS
    });
    let prompt = "The history of the city begins in the year 1200, when a small village grew around a river crossing. ";
    let input = json!({"prompt": prompt.repeat(3), "raw": true, "temperature": 0, "max_tokens": 16});
    let (mut choices, _) = model
        .complete(input, CancellationToken::new(), |_| async { Ok(()) })
        .await
        .unwrap();
    let ChoiceResult { pieces, finished, .. } = choices.remove(0);
    assert!(finished.prompt_tokens > 8 * 4, "the prompt spans several batches");
    let reference = greedy_tokens(&weights(), &prompt.repeat(3), 16).unwrap();
    assert_eq!(finished.tokens, reference);
    assert_eq!(pieces.concat(), finished.text);
}

#[tokio::test]
async fn sampling_with_a_seed_is_reproducible() {
    let (_lock, model) = shared_model().await;
    let input = json!({"prompt": "Tell me a story about a dragon.", "temperature": 1.0, "top_p": 0.95, "top_k": 50, "seed": 1234, "max_tokens": 40});
    let (first, pieces) = run_ok(model, input.clone()).await;
    let (second, _) = run_ok(model, input).await;
    assert_eq!(text(&first), text(&second));
    assert_eq!(pieces.concat(), text(&first));
}

#[tokio::test]
async fn max_tokens_is_respected() {
    let (_lock, model) = shared_model().await;
    let (output, _) = run_ok(
        model,
        json!({"prompt": "Numbers: 1, 2, 3, 4,", "raw": true, "temperature": 0, "max_tokens": 5}),
    )
    .await;
    assert_eq!(output["usage"]["output"], 5);
    assert_eq!(finish_reason(&output), "length");
    assert!(output["usage"]["input"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn chat_ends_with_stop_reason() {
    let (_lock, model) = shared_model().await;
    let (output, _) = run_ok(
        model,
        json!({"messages": [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": "Is the sky blue? Yes or no?"}
        ], "temperature": 0, "max_tokens": 200}),
    )
    .await;
    assert_eq!(finish_reason(&output), "stop");
    assert!(output["usage"]["output"].as_u64().unwrap() < 200);
    assert!(!text(&output).contains("<|im_end|>"));
}

#[tokio::test]
async fn stop_strings_end_generation() {
    let (_lock, model) = shared_model().await;
    let base = json!({"prompt": "Numbers: 1, 2, 3, 4,", "raw": true, "temperature": 0, "max_tokens": 30});
    let (free, _) = run_ok(model, base.clone()).await;
    let free = text(&free).to_owned();
    let cut = free.find(" 7").expect("the model counts on");
    let mut input = base;
    input["stop"] = json!(["nothing like this", " 7"]);
    let (output, _) = run_ok(model, input).await;
    assert_eq!(text(&output), &free[..cut]);
    assert_eq!(finish_reason(&output), "stop");
}

/// A request that needs almost the whole budget of a small engine: it only
/// runs once everything before it has released its reservation.
fn whole_budget() -> Value {
    json!({"prompt": "Numbers: 1, 2, 3, 4,", "raw": true, "temperature": 0, "max_tokens": 480})
}

#[tokio::test]
async fn cancellation_stops_generation_and_frees_the_budget() {
    let model = load(EngineOptions {
        context_tokens: 512,
        max_sequences: 2,
        ..TEST_OPTIONS
    });
    let cancel = CancellationToken::new();
    let count = Arc::new(Mutex::new(0usize));
    let seen = Arc::clone(&count);
    let trigger = cancel.clone();
    let result = model
        .generate(whole_budget(), cancel, move |chunk: Chunk| {
            let mut seen = seen.lock().unwrap();
            *seen += chunk.pieces.len();
            if *seen == 3 {
                trigger.cancel();
            }
            async { Ok(()) }
        })
        .await;
    assert_eq!(result, Err(JobError::Cancelled));
    assert_eq!(*count.lock().unwrap(), 3, "no piece is forwarded after the cancel");

    // a request dropped mid-way (as the SDK drops a job after its grace)
    // stops too; its sink never takes the first piece, so it is still
    // running when dropped, however fast the machine
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        model.generate(whole_budget(), CancellationToken::new(), |_| {
            std::future::pending::<Result<(), JobError>>()
        }),
    )
    .await;
    assert!(dropped.is_err(), "still running after 300 ms");

    // both released their reservations: a request needing the whole budget
    // runs (it would wait forever otherwise)
    let (result, _) = tokio::time::timeout(Duration::from_secs(120), run_collect(&model, whole_budget()))
        .await
        .expect("the budget was not released");
    assert!(result.is_ok(), "{result:?}");
}

/// The pieces of a streamed request, grouped by the stream interval: the
/// first alone, the rest in non-empty groups that join to the output's
/// `tokens`; a long interval holds everything after the first piece for the
/// end of the request.
#[tokio::test]
async fn pieces_are_grouped_by_the_stream_interval() {
    let input = json!({"prompt": "Numbers: 1, 2, 3, 4,", "raw": true, "temperature": 0, "max_tokens": 24});
    let fresh = |stream_interval| {
        load(EngineOptions {
            context_tokens: 512,
            stream_interval,
            ..TEST_OPTIONS
        })
    };
    let (reference, _) = run_ok(&fresh(Duration::ZERO), input.clone()).await;
    for interval in [Duration::from_millis(20), Duration::from_secs(3600)] {
        let model = fresh(interval);
        let (result, groups) = run_groups(&model, input.clone()).await;
        let output = result.unwrap().output;
        assert_eq!(
            output, reference,
            "{interval:?}: the output does not depend on the grouping"
        );
        let tokens: Vec<String> = serde_json::from_value(output["choices"][0]["tokens"].clone()).unwrap();
        assert!(tokens.len() > 2, "{tokens:?}");
        assert_eq!(groups.concat(), tokens, "{interval:?}: every piece once, in order");
        assert_eq!(groups[0].len(), 1, "{interval:?}: the first piece goes out alone");
        assert!(groups.iter().all(|group| !group.is_empty()), "{interval:?}: {groups:?}");
        if interval == Duration::from_secs(3600) {
            assert_eq!(groups.len(), 2, "the rest waits for the end: {groups:?}");
        }
    }
}

#[tokio::test]
async fn a_failing_sink_ends_the_request() {
    let (_lock, model) = shared_model().await;
    let result = model
        .generate(
            json!({"prompt": "Numbers: 1, 2, 3, 4,", "raw": true, "temperature": 0, "max_tokens": 4000}),
            CancellationToken::new(),
            |_| async { Err(JobError::internal("connection lost")) },
        )
        .await;
    assert_eq!(result, Err(JobError::internal("connection lost")));
}

#[tokio::test]
async fn bad_inputs_are_rejected() {
    let (_lock, model) = shared_model().await;
    for (input, needle) in [
        (
            json!({"prompt": "Hi", "max_tokens": 9000}),
            "`max_tokens` must be an integer from 1 to 8192, got 9000",
        ),
        (
            json!({"prompt": "Hi", "temperature": -1, "bogus": true}),
            "bogus: unknown property",
        ),
        (json!({"prompt": "hello ".repeat(9000), "raw": true}), "the prompt is"),
        (json!({"prompt": "", "raw": true}), "empty"),
        (json!({"messages": [{"role": "user", "content": "a\u{0}b"}]}), "NUL"),
        (
            json!({"prompt": "hello ".repeat(8000), "raw": true, "max_tokens": 1000}),
            "exceeds the context length",
        ),
    ] {
        let (result, pieces) = run_collect(model, input.clone()).await;
        match result {
            Err(JobError::BadInput(message)) => assert!(message.contains(needle), "{message}"),
            other => panic!("{input}: {other:?}"),
        }
        assert!(pieces.is_empty());
    }
}

#[test]
fn invalid_options_are_refused() {
    for options in [
        EngineOptions {
            max_sequences: 0,
            ..EngineOptions::default()
        },
        EngineOptions {
            max_sequences: 300,
            ..EngineOptions::default()
        },
        EngineOptions {
            batch_tokens: 8,
            ..EngineOptions::default()
        },
        EngineOptions {
            context_tokens: 0,
            ..EngineOptions::default()
        },
    ] {
        assert!(matches!(
            TextModel::load("x", Path::new("/nonexistent.gguf"), options),
            Err(LoadError::Options(_))
        ));
    }
    let missing = TextModel::load("x", Path::new("/nonexistent.gguf"), EngineOptions::default());
    assert!(matches!(missing, Err(LoadError::Model { .. })), "{missing:?}");
}

/// Schemas of the kinds clients send (Pydantic's output included): every
/// one converts, and llama.cpp parses every grammar made.
fn sample_schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}, "c": {"type": "boolean"}}}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "minItems": 1, "maxItems": 3}),
        json!({"type": "array", "items": {"type": "string"}, "minItems": 2}),
        json!({"type": "array", "items": {"type": "string"}, "maxItems": 1}),
        json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false}),
        json!({"type": "string", "enum": ["red", "green", "blue"]}),
        json!({"const": {"fixed": [1, "two", null]}}),
        json!({"type": ["string", "null"], "maxLength": 10}),
        json!({"type": "string", "minLength": 2, "maxLength": 5}),
        json!({"type": "string", "format": "date"}),
        json!({"type": "string", "format": "date-time"}),
        json!({"type": "string", "format": "uuid"}),
        json!({"type": "string", "format": "email"}),
        json!({"type": "integer", "minimum": 0}),
        json!({"type": "integer", "minimum": 18}),
        json!({"type": "integer", "exclusiveMinimum": 0}),
        json!({"type": "number", "minimum": 0}),
        json!({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null}),
        json!({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "b"}, "x": {"type": "number"}}, "required": ["kind", "x"]}]}),
        json!({"type": "object", "additionalProperties": {"type": "integer"}}),
        json!({"type": "object"}),
        json!({}),
        json!(true),
        json!({"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["value"]}),
        json!({"allOf": [{"$ref": "#/definitions/Point"}], "definitions": {"Point": {"type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}}}),
        // What `client.beta.chat.completions.parse` sends for a Pydantic model.
        json!({
            "$defs": {
                "Address": {"properties": {"city": {"title": "City", "type": "string"},
                    "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Zip"}},
                    "required": ["city", "zip"], "title": "Address", "type": "object", "additionalProperties": false},
                "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}
            },
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
                "address": {"$ref": "#/$defs/Address"},
                "color": {"$ref": "#/$defs/Color"},
                "score": {"title": "Score", "type": "number"},
                "born": {"format": "date", "title": "Born", "type": "string"}
            },
            "required": ["name", "tags", "address", "color", "score", "born"],
            "title": "Person", "type": "object", "additionalProperties": false
        }),
    ]
}

#[test]
fn llama_cpp_accepts_every_converted_grammar() {
    let model = Weights::load(&weights(), 0).unwrap();
    for schema in sample_schemas() {
        let grammar = grammar::schema_to_gbnf(&schema).unwrap_or_else(|e| panic!("{schema}: {e}"));
        if let Err(error) = Sampler::grammar(&model, &grammar, &[]) {
            panic!("{schema}: {error}\n{grammar}");
        }
    }
    Sampler::grammar(&model, &grammar::any_object_gbnf(), &[]).unwrap();
    // tool call grammars, strict and lazy
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": sample_schemas()[0]}},
        {"type": "function", "function": {"name": "person", "parameters": sample_schemas().pop()}},
        {"type": "function", "function": {"name": "no_arguments"}},
    ]);
    for choice in [
        json!("auto"),
        json!("required"),
        json!({"type": "function", "function": {"name": "person"}}),
    ] {
        for parallel in [false, true] {
            let params = Params::parse(
                &json!({"prompt": "x", "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}),
                4096,
            )
            .unwrap();
            let grammar = params.grammar.unwrap();
            let triggers: Vec<&str> = grammar.trigger.iter().map(String::as_str).collect();
            if let Err(error) = Sampler::grammar(&model, &grammar.text, &triggers) {
                panic!("{choice} parallel {parallel}: {error}\n{}", grammar.text);
            }
        }
    }
    assert!(Sampler::grammar(&model, "root ::= undefined-rule", &[]).is_err());
}

/// Runs a greedy chat request and returns its first choice.
async fn chat(model: &TextModel, mut input: Value) -> (Value, Vec<Chunk>) {
    input["temperature"] = json!(0);
    let chunks = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&chunks);
    let output = model
        .generate(input.clone(), CancellationToken::new(), move |chunk: Chunk| {
            sink.lock().unwrap().push(chunk);
            async { Ok(()) }
        })
        .await
        .unwrap_or_else(|e| panic!("{input}: {e}"));
    let chunks = chunks.lock().unwrap().clone();
    (output.output, chunks)
}

#[tokio::test]
async fn json_outputs_parse_and_match_their_schema() {
    let (_lock, model) = shared_model().await;
    let (output, _) = chat(
        model,
        json!({"prompt": "What is the capital of France? Answer in JSON, like {\"capital\": \"...\"}.",
            "max_tokens": 200, "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(finish_reason(&output), "stop", "{output}");
    let value: Value = serde_json::from_str(text(&output)).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert!(value.is_object(), "{value}");

    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "color": {"enum": ["black", "white", "orange"]},
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}},
        "required": ["name", "age", "color", "friends"], "additionalProperties": false});
    let (output, _) = chat(
        model,
        json!({"prompt": "Invent a cat.", "max_tokens": 200, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": true, "schema": schema}}}),
    )
    .await;
    assert_eq!(finish_reason(&output), "stop", "{output}");
    let cat: Value = serde_json::from_str(text(&output)).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert!(cat["name"].as_str().is_some_and(|n| n.chars().count() <= 20), "{cat}");
    assert!(cat["age"].as_u64().is_some(), "{cat}");
    assert!(
        ["black", "white", "orange"].contains(&cat["color"].as_str().unwrap_or_default()),
        "{cat}"
    );
    assert!(cat["friends"].as_array().is_some_and(|f| f.len() <= 2), "{cat}");
    assert_eq!(cat.as_object().unwrap().len(), 4, "{cat}");
}

#[tokio::test]
async fn forced_tool_calls_are_well_formed_and_stream_as_deltas() {
    let (_lock, model) = shared_model().await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let (output, chunks) = chat(
            model,
            json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": false, "max_tokens": 120}),
        )
        .await;
        let choice_out = &output["choices"][0];
        assert_eq!(choice_out["finish_reason"], "tool_calls", "{output}");
        let calls = choice_out["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{output}");
        let call = &calls[0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        let name = call["function"]["name"].as_str().unwrap();
        let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        if choice.is_object() || name == "get_weather" {
            assert_eq!(name, "get_weather", "{output}");
            assert!(arguments["city"].is_string(), "{arguments}");
            assert!(["celsius", "fahrenheit"].contains(&arguments["unit"].as_str().unwrap()));
        } else {
            assert_eq!((name, arguments), ("get_time", json!({})));
        }
        // the deltas assemble into the same call, as the SDK assembles them
        let deltas: Vec<Value> = chunks
            .iter()
            .flat_map(|c| {
                c.tool_calls
                    .iter()
                    .map(|d| serde_json::to_value(d.to_output()).unwrap())
            })
            .collect();
        assert_eq!(deltas[0]["id"], call["id"]);
        assert_eq!(deltas[0]["function"]["name"], call["function"]["name"]);
        let assembled: String = deltas
            .iter()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        assert_eq!(assembled, call["function"]["arguments"].as_str().unwrap());
        assert_eq!(text(&output), "", "no content besides the call");
    }
    // a tool's result in the history, and `auto`: text or a call, well formed either way
    let (output, _) = chat(
        model,
        json!({"messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}],
            "tools": tools, "max_tokens": 60}),
    )
    .await;
    let choice_out = &output["choices"][0];
    for call in choice_out["tool_calls"].as_array().into_iter().flatten() {
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap();
    }
}

#[tokio::test]
async fn logprobs_choices_and_penalties() {
    let (_lock, model) = shared_model().await;
    let (output, chunks) = chat(
        model,
        json!({"prompt": "Count: 1, 2, 3,", "raw": true, "max_tokens": 8, "n": 2, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    let choices = output["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let mut generated = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let logprobs = choice["logprobs"].as_array().unwrap();
        assert_eq!(logprobs.len(), 8, "one per generated token: {choice}");
        generated += logprobs.len();
        for entry in logprobs {
            let top = entry["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            // greedy: the chosen token is the likeliest
            assert_eq!(top[0]["token"], entry["token"]);
            assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
            assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        }
        // the chunks of each choice carry its pieces
        let streamed: String = chunks
            .iter()
            .filter(|c| c.index == i)
            .flat_map(|c| c.pieces.clone())
            .collect();
        assert_eq!(streamed, choice["text"].as_str().unwrap());
    }
    assert_eq!(choices[0]["text"], choices[1]["text"], "greedy choices agree");
    assert_eq!(output["usage"]["output"], generated, "every choice's tokens are billed");

    // penalties change a repetitive greedy answer; min_p alone keeps it
    let repeat = json!({"prompt": "a a a a a a a a", "raw": true, "max_tokens": 12});
    let (plain, _) = chat(model, repeat.clone()).await;
    let mut penalised = repeat.clone();
    penalised["frequency_penalty"] = json!(2.0);
    penalised["presence_penalty"] = json!(2.0);
    let (penalised, _) = chat(model, penalised).await;
    assert_ne!(text(&plain), text(&penalised));
    let mut min_p = repeat.clone();
    min_p["min_p"] = json!(0.1);
    assert_eq!(text(&chat(model, min_p).await.0), text(&plain));
    // a bias of -100 on the greedy first token moves it
    let first = model
        .shared
        .model
        .tokenize(text(&plain).as_bytes(), false, false)
        .unwrap()[0];
    let mut biased = repeat;
    biased["logit_bias"] = json!({ first.to_string(): -100 });
    assert_ne!(text(&chat(model, biased).await.0), text(&plain));
}
