//! The text model end to end, with its real weights (SmolLM2-135M-Instruct,
//! fetched once into `GANTRY_TEST_MODELS_DIR`, default
//! `~/.cache/gantry/models`): the public endpoints (runsync, run + SSE
//! stream, cancel), billing, and the OpenAI-compatible routes.
use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Method, Response};
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use serde_json::{Value, json};

use crate::harness::{Backend, Event, SseReader, TestApp, parse_sse, run_client_script};

const MODEL: &str = "smollm2-135m-instruct";

gantry_testkit::on_both_backends!(
    greedy_runsync_is_billed_once_by_tokens,
    bad_input_fails_and_costs_nothing,
);

/// The shared weights directory of the test suite.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache/gantry/models"),
    }
}

/// An app serving the text model (and echo), fetching its weights on the
/// first run on a machine.
pub async fn text_app(backend: Backend) -> TestApp {
    text_app_streaming_every(backend, None).await
}

/// [`text_app`] with `text.stream_interval_ms` set (`None`: the default).
async fn text_app_streaming_every(backend: Backend, interval_ms: Option<u64>) -> TestApp {
    TestApp::spawn_with(backend, |s| {
        s.scheduler.bundled_workers = vec!["gantry-echo".into(), MODEL.into()];
        s.models_dir = Some(models_dir());
        s.pull_on_start = true;
        s.engine_mut("text")["threads"] = 1.into();
        s.engine_mut("text")["context_tokens"] = 4096.into();
        if let Some(ms) = interval_ms {
            s.engine_mut("text")["stream_interval_ms"] = ms.into();
        }
    })
    .await
}

/// The pieces of a text chunk's output (`{"tokens": [...]}`).
fn chunk_pieces(output: &Value) -> Vec<String> {
    serde_json::from_value(output["tokens"].clone()).unwrap_or_else(|e| panic!("{output}: {e}"))
}

impl TestApp {
    pub async fn text(&self, endpoint: &str, key: &str, body: Value) -> Response {
        self.public(Method::POST, &format!("/v2/{MODEL}/{endpoint}"), key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// POSTs `body` to the model's OpenAI chat completions route.
    pub async fn chat_completions(&self, key: &str, body: &Value) -> Response {
        self.public(Method::POST, &format!("/v2/{MODEL}/openai/v1/chat/completions"), key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// The micro-USD charged for `job_id` (one entry per charge).
    pub async fn charges(&self, job_id: &str) -> Vec<i64> {
        let db = Database::connect(&self.database_url).await.unwrap();
        let sql = match db.get_database_backend() {
            DbBackend::Postgres => "SELECT amount_micro_usd FROM ledger_entries WHERE job_id = $1",
            _ => "SELECT amount_micro_usd FROM ledger_entries WHERE job_id = ?",
        };
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(
                db.get_database_backend(),
                sql,
                [job_id.into()],
            ))
            .await
            .unwrap();
        rows.iter()
            .map(|row| row.try_get::<i64>("", "amount_micro_usd").unwrap())
            .collect()
    }

    /// The part of `job_id`'s charge that pays for keeping its output files
    /// (their bytes for the files' lifetime at the default price; see
    /// `files::kept_files_are_charged_with_their_job` for literal figures).
    pub async fn kept_files_charge(&self, job_id: &str) -> i64 {
        let bytes = self
            .count(&format!(
                "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM files WHERE job_id = '{job_id}'"
            ))
            .await;
        let lifetime_ms = i64::try_from(self.settings.files.lifetime_secs * 1000).unwrap();
        gantry_billing::storage::StoragePrices::default().kept_files(u64::try_from(bytes).unwrap(), lifetime_ms)
    }

    /// Reads a job's Server-Sent Events until the stream ends.
    pub async fn sse(&self, key: &str, job_id: &str, last_event_id: Option<i64>) -> Vec<(Option<i64>, String, Value)> {
        let mut request = self
            .public(Method::GET, &format!("/v2/{MODEL}/stream/{job_id}"), key)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let res = request.send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        parse_sse(&res.text().await.unwrap())
    }
}
/// Reads the SSE stream of `model`'s job `id` to its end, each event within
/// `wait`; every event, in order.
pub async fn read_sse(app: &TestApp, model: &str, key: &str, id: &str, wait: Duration) -> Vec<Event> {
    SseReader::open(app, model, key, id, None).await.rest(wait).await
}

/// Reads the SSE stream of job `id` until chunk `seq` has come (chunks the
/// worker sent while running), checks that the job is still `IN_PROGRESS`,
/// cancels it, and reads the stream to its end, each wait bounded by `wait`.
/// Returns every event; the caller checks the last.
pub async fn cancel_while_streaming(
    app: &TestApp,
    model: &str,
    key: &str,
    id: &str,
    seq: i64,
    wait: Duration,
) -> Vec<Event> {
    let mut reader = SseReader::open(app, model, key, id, None).await;
    let mut events = Vec::new();
    while events.last().is_none_or(|(id, _, _)| *id != Some(seq)) {
        events.push(reader.next(wait).await.expect("the stream is open"));
    }
    let status: Value = app
        .public_ok(Method::GET, &format!("/v2/{model}/status/{id}"), key)
        .await;
    assert_eq!(status["status"], "IN_PROGRESS", "chunks stream before the end");
    let cancelled: Value = app
        .public_ok(Method::POST, &format!("/v2/{model}/cancel/{id}"), key)
        .await;
    assert_eq!(cancelled["status"], "CANCELLED");
    events.extend(reader.rest(wait).await);
    events
}

/// 10.00 USD per million tokens, in micro-USD: exactly 10 per token.
fn price_of(output: &Value) -> i64 {
    let tokens = output["usage"]["input"].as_i64().unwrap() + output["usage"]["output"].as_i64().unwrap();
    tokens * 10
}

async fn greedy_runsync_is_billed_once_by_tokens(backend: Backend) {
    let app = text_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let body = json!({"input": {"prompt": "What is the capital of France?", "max_tokens": 24, "temperature": 0}});
    let res = app.text("runsync", &key, body.clone()).await;
    assert_eq!(res.status(), 200);
    let job: Value = res.json().await.unwrap();
    assert_eq!(job["status"], "COMPLETED", "{job}");
    let output = &job["output"];
    let choice = &output["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "a real answer: {text}");
    let tokens: Vec<&str> = choice["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), text, "the tokens make up the text");
    assert_eq!(output["usage"]["output"].as_u64().unwrap() as usize, tokens.len());
    assert!(
        output["usage"]["input"].as_u64().unwrap() > 5,
        "the chat template counts: {output}"
    );
    // Cost in USD is usage x price, charged once in exact micro-USD.
    let micro = price_of(output);
    assert_eq!(output["cost"].as_f64().unwrap(), micro as f64 / 1e6);
    assert_eq!(app.charges(job["id"].as_str().unwrap()).await, [micro]);
    // Greedy decoding is deterministic.
    let again: Value = app.text("runsync", &key, body).await.json().await.unwrap();
    assert_eq!(again["output"]["choices"][0]["text"], choice["text"]);
}

async fn bad_input_fails_and_costs_nothing(backend: Backend) {
    let app = text_app(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for input in [
        json!({"prompt": "hi", "temperature": 5, "top_k": -1, "bogus": true}),
        json!({"messages": [{"role": "robot", "content": "hi"}]}),
        json!({"prompt": "hi", "max_tokens": 10_000_000}),
        json!({}),
    ] {
        let job: Value = app
            .text("runsync", &key, json!({ "input": input }))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(job["status"], "FAILED", "{input} -> {job}");
        let error = job["error"].as_str().unwrap();
        assert!(error.starts_with("bad input"), "{error}");
        assert_eq!(app.charges(job["id"].as_str().unwrap()).await, Vec::<i64>::new());
    }
    // Every problem of one input is named at once.
    let job: Value = app
        .text(
            "runsync",
            &key,
            json!({"input": {"prompt": "hi", "temperature": 5, "top_k": -1, "bogus": true}}),
        )
        .await
        .json()
        .await
        .unwrap();
    let error = job["error"].as_str().unwrap();
    for field in ["temperature", "top_k", "bogus"] {
        assert!(error.contains(field), "{field} in {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stream_over_sse_once_in_order_and_resume_after_last_event_id() {
    // Every token its own chunk, so that there are many to resume between.
    let app = text_app_streaming_every(Backend::Sqlite, Some(0)).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app
        .text(
            "run",
            &key,
            json!({"input": {"prompt": "Write a short poem about the sea.", "max_tokens": 40, "temperature": 0.8, "seed": 42}}),
        )
        .await;
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let events = app.sse(&key, &id, None).await;
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last.1, "status", "the stream ends with the final job");
    assert_eq!(last.2["status"], "COMPLETED");
    let final_text = last.2["output"]["choices"][0]["text"].as_str().unwrap().to_string();
    let ids: Vec<i64> = chunks.iter().map(|(id, _, _)| id.unwrap()).collect();
    assert_eq!(
        ids,
        (0..chunks.len() as i64).collect::<Vec<_>>(),
        "every chunk once, in order"
    );
    let streamed: Vec<String> = chunks
        .iter()
        .flat_map(|(_, name, data)| {
            assert_eq!(name, "chunk");
            let pieces = chunk_pieces(&data["output"]);
            assert_eq!(pieces.len(), 1, "one piece per chunk with an interval of 0");
            pieces
        })
        .collect();
    assert_eq!(streamed.concat(), final_text, "the streamed text is the text");
    assert_eq!(
        chunks.len() as u64,
        last.2["output"]["usage"]["output"].as_u64().unwrap()
    );
    // A reader that reconnects after chunk 9 gets exactly the rest.
    let resumed = app.sse(&key, &id, Some(9)).await;
    let rest: Vec<i64> = resumed.iter().filter_map(|(id, _, _)| *id).collect();
    assert_eq!(rest, (10..chunks.len() as i64).collect::<Vec<_>>());
    assert_eq!(resumed.last().unwrap().1, "status");
    // The same seed gives the same text through runsync.
    let sync: Value = app
        .text(
            "runsync",
            &key,
            json!({"input": {"prompt": "Write a short poem about the sea.", "max_tokens": 40, "temperature": 0.8, "seed": 42}}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(sync["output"]["choices"][0]["text"], final_text.as_str());
    // A bad Last-Event-ID is a problem, not a stream.
    let bad = app
        .public(Method::GET, &format!("/v2/{MODEL}/stream/{id}"), &key)
        .header("accept", "text/event-stream")
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// With a stream interval, a request's first token is a chunk of its own
/// and the tokens made within the interval after a chunk travel together in
/// the next: an interval longer than the request holds all the rest for the
/// end. The JSON stream, the SSE stream and the OpenAI stream carry the same
/// pieces as the output, once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_made_within_the_stream_interval_travel_in_one_chunk() {
    let app = text_app_streaming_every(Backend::Sqlite, Some(3_600_000)).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let input = json!({"prompt": "Write a short poem about the sea.", "max_tokens": 24, "temperature": 0});
    let res = app.text("run", &key, json!({ "input": input })).await;
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let events = app.sse(&key, &id, None).await;
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last.2["status"], "COMPLETED");
    let tokens: Vec<String> = serde_json::from_value(last.2["output"]["choices"][0]["tokens"].clone()).unwrap();
    assert!(tokens.len() > 2, "{tokens:?}");
    let groups: Vec<Vec<String>> = chunks
        .iter()
        .map(|(_, _, data)| chunk_pieces(&data["output"]))
        .collect();
    assert_eq!(groups.len(), 2, "the first token, then the rest at the end: {groups:?}");
    assert_eq!(groups[0], tokens[..1]);
    assert_eq!(groups.concat(), tokens, "every piece once, in order");
    assert_eq!(chunks.iter().map(|(id, _, _)| id.unwrap()).collect::<Vec<_>>(), [0, 1]);

    // The JSON stream of the finished job holds the same two chunks.
    let stream: Value = app
        .public_ok(Method::GET, &format!("/v2/{MODEL}/stream/{id}"), &key)
        .await;
    let json_groups: Vec<Vec<String>> = stream["stream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| chunk_pieces(&item["output"]))
        .collect();
    assert_eq!(json_groups, groups);

    // OpenAI streaming: the role and first token, then one delta with the rest.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "max_tokens": 24, "temperature": 0, "stream": true});
    let res = app.chat_completions(&key, &body).await;
    assert_eq!(res.status(), 200);
    let events = parse_sse(&res.text().await.unwrap());
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| e.2["choices"][0]["delta"]["content"].as_str())
        .filter(|content| !content.is_empty())
        .collect();
    assert_eq!(deltas.len(), 2, "{deltas:?}");
    assert_eq!(deltas.concat(), tokens.concat());
}

/// Chunks reach an SSE reader while the job runs, and a cancel ends it and
/// its charge. The answer cannot end by itself before the cancel whatever the
/// machine's speed: `ignore_eos` makes it run to 2000 tokens, and with a stream
/// interval of 0 each token is a chunk, so chunk 5 is the sixth token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_delivers_tokens_while_the_job_runs_and_cancel_stops_it_free() {
    let app = text_app_streaming_every(Backend::Sqlite, Some(0)).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app
        .text(
            "run",
            &key,
            json!({"input": {"prompt": "Count from one to one thousand in words.", "max_tokens": 2000,
                "temperature": 0, "ignore_eos": true}}),
        )
        .await;
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let events = cancel_while_streaming(&app, MODEL, &key, &id, 5, Duration::from_secs(30)).await;
    let last = events.last().unwrap();
    assert_eq!(last.1, "status");
    assert_eq!(last.2["status"], "CANCELLED");
    assert_eq!(
        app.charges(&id).await,
        Vec::<i64>::new(),
        "a cancelled generation costs nothing"
    );
}

/// `ignore_eos` runs greedy decoding to `max_tokens` where the same request
/// without it stops early, and the tokens it shares with that answer come
/// first, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_generates_exactly_max_tokens() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let input = json!({"prompt": "Say yes.", "max_tokens": 120, "temperature": 0});
    let short: Value = app
        .text("runsync", &key, json!({ "input": input }))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(short["output"]["choices"][0]["finish_reason"], "stop", "{short}");
    let short_tokens = short["output"]["usage"]["output"].as_u64().unwrap();
    assert!(short_tokens < 120, "{short}");
    let mut long_input = input.clone();
    long_input["ignore_eos"] = json!(true);
    let long: Value = app
        .text("runsync", &key, json!({ "input": long_input }))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(long["status"], "COMPLETED", "{long}");
    let output = &long["output"];
    assert_eq!(output["choices"][0]["finish_reason"], "length", "{long}");
    assert_eq!(output["usage"]["output"], 120);
    let text = output["choices"][0]["text"].as_str().unwrap();
    let short_text = short["output"]["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(short_text), "{text:?} continues {short_text:?}");
    assert_eq!(app.charges(long["id"].as_str().unwrap()).await, [price_of(output)]);
    // Not a boolean: refused, and free.
    let mut bad = input;
    bad["ignore_eos"] = json!("yes");
    let job: Value = app
        .text("runsync", &key, json!({ "input": bad }))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(job["status"], "FAILED");
    assert!(
        job["error"]
            .as_str()
            .unwrap()
            .contains("ignore_eos: must be a boolean, not a string"),
        "{job}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_the_model_and_match_their_solo_answers() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let prompts = [
        "Name three colours.",
        "What is two plus two?",
        "Say hello in French.",
        "Which planet is the largest?",
    ];
    let body = |p: &str| json!({"input": {"prompt": p, "max_tokens": 20, "temperature": 0}});
    let mut solo = Vec::new();
    for prompt in prompts {
        let job: Value = app.text("runsync", &key, body(prompt)).await.json().await.unwrap();
        solo.push(job["output"]["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let together = futures_util::future::join_all(prompts.iter().map(|p| {
        let app = &app;
        let key = &key;
        async move {
            let job: Value = app.text("runsync", key, body(p)).await.json().await.unwrap();
            job["output"]["choices"][0]["text"].as_str().unwrap().to_string()
        }
    }))
    .await;
    // Sharing a batch changes the order of floating-point sums in the
    // matrix kernels, so a near-tie between two tokens can break the other
    // way later in the answer (as in llama.cpp's own server); the answers
    // agree on how they start and all complete.
    for (batched, alone) in together.iter().zip(&solo) {
        let head: String = alone.chars().take(12).collect();
        assert!(batched.starts_with(&head), "{batched:?} vs {alone:?}");
    }
}

/// `n` choices, a JSON schema and a forced tool call through the OpenAI
/// route: every choice's tokens are billed once, the prompt once; the JSON
/// parses; the call's arguments follow its parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_structured_output_and_tool_calls_are_billed_once() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let chat = json!({"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 12,
        "temperature": 1.0, "seed": 9, "n": 3});
    let answer: Value = app.chat_completions(&key, &chat).await.json().await.unwrap();
    assert_eq!(answer["choices"].as_array().unwrap().len(), 3, "{answer}");
    let usage = &answer["usage"];
    let job_id = answer["id"].as_str().unwrap().strip_prefix("chatcmpl-").unwrap();
    assert_eq!(
        app.charges(job_id).await,
        [usage["total_tokens"].as_i64().unwrap() * 10]
    );
    // The job's own output says the same: the prompt once, every choice's tokens.
    let job: Value = app
        .public(Method::GET, &format!("/v2/{MODEL}/status/{job_id}"), &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let generated: u64 = job["output"]["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tokens"].as_array().unwrap().len() as u64)
        .sum();
    assert!(generated <= usage["completion_tokens"].as_u64().unwrap(), "{job}");
    assert_eq!(job["output"]["usage"]["input"], usage["prompt_tokens"]);

    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
        "hex": {"type": "string", "maxLength": 7}}, "required": ["color", "hex"], "additionalProperties": false});
    let structured = json!({"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "color", "schema": schema}}});
    let answer: Value = app.chat_completions(&key, &structured).await.json().await.unwrap();
    let content: Value = serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(
        ["red", "green", "blue"].contains(&content["color"].as_str().unwrap()),
        "{content}"
    );

    let tools = json!([{"type": "function", "function": {"name": "paint", "parameters": schema}}]);
    let call = json!({"messages": [{"role": "user", "content": "Paint the wall."}], "max_tokens": 60, "temperature": 0,
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false});
    let answer: Value = app.chat_completions(&key, &call).await.json().await.unwrap();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let arguments: Value = serde_json::from_str(
        choice["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(arguments["hex"].is_string(), "{arguments}");
    let job_id = answer["id"].as_str().unwrap().strip_prefix("chatcmpl-").unwrap();
    assert_eq!(
        app.charges(job_id).await,
        [answer["usage"]["total_tokens"].as_i64().unwrap() * 10]
    );

    // A schema the grammar cannot express: 400 naming the parameter, nothing charged.
    let mut bad = structured.clone();
    bad["response_format"]["json_schema"]["schema"] = json!({"type": "string", "pattern": "^a+$"});
    let res = app.chat_completions(&key, &bad).await;
    assert_eq!(res.status().as_u16(), 400);
    let error: Value = res.json().await.unwrap();
    assert_eq!(error["error"]["param"], "response_format", "{error}");
    assert!(
        error["error"]["message"].as_str().unwrap().contains("pattern"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_routes_answer_in_openai_shapes() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let base = format!("/v2/{MODEL}/openai/v1");
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16, "temperature": 0});
    let res = app.chat_completions(&key, &chat).await;
    assert_eq!(res.status(), 200);
    let answer: Value = res.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{answer}");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    let usage = &answer["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    let job_id = answer["id"].as_str().unwrap().strip_prefix("chatcmpl-").unwrap();
    assert_eq!(
        app.charges(job_id).await,
        [usage["total_tokens"].as_i64().unwrap() * 10],
        "billed like any job"
    );

    // Streaming: the same text, chunk by chunk, then usage, then [DONE].
    let mut streaming = chat.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let res = app.chat_completions(&key, &streaming).await;
    assert_eq!(res.status(), 200);
    let events = parse_sse(&res.text().await.unwrap());
    assert_eq!(events.last().unwrap().2, Value::String("[DONE]".into()));
    let chunks: Vec<&Value> = events.iter().map(|e| &e.2).filter(|v| v.is_object()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text, "streamed text equals the non-streamed text");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], *usage);

    // Legacy completions continue the raw prompt.
    let completion: Value = app
        .public(Method::POST, &format!("{base}/completions"), &key)
        .json(&json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(completion["object"], "text_completion");
    assert!(
        completion["choices"][0]["text"].as_str().unwrap().contains("Paris"),
        "{completion}"
    );

    let models: Value = app.public_ok(Method::GET, &format!("{base}/models"), &key).await;
    assert_eq!(models["data"][0]["id"], MODEL);

    // Errors in OpenAI's shape: authentication, validation, a non-text model.
    for (res, status) in [
        (
            app.client
                .get(format!("{}{base}/models", app.public_base))
                .bearer_auth("gk_nope")
                .send()
                .await
                .unwrap(),
            401,
        ),
        (app.chat_completions(&key, &json!({"messages": [], "n": 2})).await, 400),
        (
            app.public(Method::POST, "/v2/gantry-echo/openai/v1/chat/completions", &key)
                .json(&chat)
                .send()
                .await
                .unwrap(),
            404,
        ),
    ] {
        assert_eq!(res.status().as_u16(), status);
        let body: Value = res.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(body["error"]["type"].is_string(), "{body}");
    }

    // What the document refuses is refused before any job exists: an unknown
    // member, and a temperature outside 0 to 2.
    let mut bad = chat.clone();
    bad["frobnicate"] = json!(1);
    bad["temperature"] = json!(2.5);
    let res = app.chat_completions(&key, &bad).await;
    assert_eq!(res.status().as_u16(), 400);
    let message = res.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("frobnicate: unknown parameter"), "{message}");
    assert!(
        message.contains("temperature: must be a number from 0 to 2"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_works_against_it() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    run_client_script(
        &app,
        "openai_sdk.py",
        MODEL,
        &key,
        &[],
        "openai sdk: all checks passed",
        "openai",
    )
    .await;
}

/// LangChain's `ChatOpenAI` (`langchain-openai`), pointed at the OpenAI
/// routes: a chat, streaming, a forced tool call (whole and streamed), the
/// tool's result sent back, and structured output (tests/langchain_client.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_chat_openai_works_against_it() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    run_client_script(
        &app,
        "langchain_client.py",
        MODEL,
        &key,
        &[],
        "langchain: all checks passed",
        "langchain-openai",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_and_the_openapi_document_follow_the_manifest() {
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // Its bundled worker serves it once the weights are loaded, which takes
    // as long as the machine takes: the list is read until it says so.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let list: Value = loop {
        let list: Value = app.public_ok(Method::GET, "/v2/models", &key).await;
        let ready = list["models"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == MODEL && m["available"] == true);
        if ready || std::time::Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let models = list["models"].as_array().unwrap();
    let text = models
        .iter()
        .find(|m| m["id"] == MODEL)
        .expect("the text model is listed");
    assert_eq!(text["category"], "text");
    assert_eq!(text["unit"], "tokens");
    assert_eq!(text["price"], json!({"usd": "10.00", "per": 1_000_000}));
    assert_eq!(text["available"], true, "its bundled worker serves it");
    assert!(text["inputSchema"]["properties"]["max_tokens"].is_object());
    let gemma = models
        .iter()
        .find(|m| m["id"] == "gemma-3-270m-it")
        .expect("in the manifest");
    assert_eq!(gemma["available"], false, "no worker serves it here");

    let doc = app.document(&app.public_base).await;
    let schema = &doc["components"]["schemas"][format!("ModelInput.{MODEL}")];
    assert_eq!(schema["properties"]["messages"]["type"], "array");
    let input = &doc["components"]["schemas"]["RunRequest"]["properties"]["input"]["x-model-inputs"];
    assert!(
        input
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["$ref"] == format!("#/components/schemas/ModelInput.{MODEL}"))
    );
}

/// Through the public endpoint, a raw prompt decoded greedily gives exactly
/// llama.cpp's own greedy continuation of it (the first 32 tokens, from
/// llama.cpp itself on the same file: crates/models/text/tests/fixtures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_greedy_text_equals_llama_cpp_reference() {
    let fixture: Value = serde_json::from_str(include_str!(
        "../../../models/text/tests/fixtures/smollm2-greedy-llama-cpp.json"
    ))
    .unwrap();
    let app = text_app(Backend::Sqlite).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    for case in fixture["cases"].as_array().unwrap() {
        let input = json!({"prompt": case["prompt"], "raw": true, "max_tokens": 32, "temperature": 0});
        let job: Value = app
            .text("runsync", &key, json!({ "input": input }))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(job["status"], "COMPLETED", "{job}");
        assert_eq!(job["output"]["choices"][0]["text"], case["text"], "{}", case["prompt"]);
        assert_eq!(job["output"]["usage"]["output"], 32);
    }
}

/// A family's settings table of the wrong type stops the start, naming the
/// table, also when the settings were made in code rather than loaded.
#[tokio::test]
async fn a_settings_table_of_the_wrong_type_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = gantry::Settings {
        management_addr: "127.0.0.1:0".into(),
        public_addr: "127.0.0.1:0".into(),
        data_dir: dir.path().to_path_buf(),
        ..gantry::Settings::default()
    };
    settings.scheduler.addr = "127.0.0.1:0".into();
    settings.engine_mut("text")["max_sequences"] = "many".into();
    let Err(error) = gantry::Platform::start(settings).await else {
        panic!("a start with text.max_sequences = \"many\" succeeded");
    };
    let message = error.to_string();
    assert!(
        message.contains("[text]") && message.contains("invalid type"),
        "{message}"
    );
}

/// SIGTERM after serving text: the process unloads the model in order (the
/// engine's llama.cpp context, then the weights, then llama.cpp's backend),
/// all before it says it stopped, and exits 0. On a GPU, what is still
/// loaded at exit meets the CUDA runtime's own exit handlers, which abort
/// the process; here, on the CPU build, the order is what is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_serving_text_unloads_the_model_in_order_and_exits_0() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let models = models_dir();
    let gantry = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command
            .args(args)
            .env("GANTRY_DATA_DIR", dir.path())
            .env("GANTRY_MODELS_DIR", &models)
            .env("GANTRY_PULL_ON_START", "true")
            .env("GANTRY_LOG", "info")
            .env("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0")
            .env("GANTRY_PUBLIC_ADDR", "127.0.0.1:0")
            .env("GANTRY_SCHEDULER__ADDR", "127.0.0.1:0")
            .env("GANTRY_SCHEDULER__BUNDLED_WORKERS", format!("[{MODEL}]"))
            .env("GANTRY_TEXT__THREADS", "1")
            .env("GANTRY_TEXT__CONTEXT_TOKENS", "2048")
            .env_remove("GANTRY_DATABASE_URL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        command
    };
    let email = "sigterm@example.test";
    for args in [
        vec!["users", "create", email],
        vec!["users", "set-limits", email, "--exempt"],
        vec!["users", "add-credit", email, "10"],
    ] {
        let output = gantry(&args).output().unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = gantry(&["keys", "create", "--user", email, "--scopes", "endpoints:run"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let key = String::from_utf8(output.stdout).unwrap().trim().to_owned();

    let mut serve = crate::processes::Proc::spawn("serve", gantry(&["serve"]));
    let public = crate::processes::log_field(&serve.wait_for_log("gantry is serving").await, "public");
    serve.wait_for_log("connected to the scheduler").await;
    let job: Value = crate::harness::http_client(Duration::from_secs(120))
        .post(format!("http://{public}/v2/{MODEL}/runsync"))
        .bearer_auth(&key)
        .json(&json!({"input": {"prompt": "Count to five.", "max_tokens": 8, "temperature": 0.8}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["status"], "COMPLETED", "{job}");

    serve.stop().await; // SIGTERM, then exit status 0
    let lines = serve.lines();
    let at = |needle: &str| {
        let found: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(needle)).collect();
        assert_eq!(found.len(), 1, "one line with {needle:?}:\n{}", lines.join("\n"));
        found[0]
    };
    let order = [
        at("shutting down: finishing in-flight requests"),
        at("text engine stopped; its context is freed"),
        at("text model weights freed"),
        at("llama.cpp backend freed"),
        at("workers stopped; their models are unloaded"),
        at("gantry stopped"),
    ];
    assert!(order.is_sorted(), "out of order {order:?}:\n{}", lines.join("\n"));
}
