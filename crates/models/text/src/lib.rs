//! Text generation with GGUF models on llama.cpp, with continuous batching
//! and token streaming.
//!
//! A [`TextModel`] holds one copy of the weights and one llama.cpp context,
//! owned by a dedicated engine thread. Jobs are queued to that thread, which
//! decodes all running sequences together in one batch per step and admits
//! new ones between steps (see `engine.rs`), as long as a sequence slot and
//! enough of the shared KV budget are free.
//!
//! # Input
//!
//! A JSON object:
//!
//! | field         | type                         | default | meaning |
//! |---------------|------------------------------|---------|---------|
//! | `prompt`      | string                       |         | one user message, formatted with the model's chat template (or tokenized as is with `raw`) |
//! | `messages`    | array of `{role, content}`   |         | a chat; `role` is `system`, `user` or `assistant`; always formatted with the chat template plus the assistant's generation prompt |
//! | `raw`         | bool                         | false   | tokenize `prompt` as is (special tokens are parsed; BOS added if the model wants it) |
//! | `max_tokens`  | integer 1 ..= context length | 512     | most tokens to generate; without it, 512 or what the context has room for, whichever is less |
//! | `temperature` | number 0 ..= 2               | 0.7     | 0 is greedy (argmax) decoding |
//! | `top_p`       | number in (0, 1]             | 1       | nucleus sampling (1 = off) |
//! | `top_k`       | integer >= 0                 | 0       | keep the k likeliest tokens (0 = off) |
//! | `stop`        | string or array of <= 4 strings |      | generation ends before any of them; they are not part of the output |
//! | `seed`        | integer (u64)                | random  | same seed and input give the same output |
//! | `ignore_eos`  | bool                         | false   | never sample an end-of-generation token: the answer runs to `max_tokens` unless a stop string or a cancel ends it (fixed-length benchmarks and tests); not with a grammar |
//! | `min_p`       | number 0 ..= 1               | 0       | min-p sampling (0 = off) |
//! | `presence_penalty`, `frequency_penalty` | number -2 ..= 2 | 0 | OpenAI's penalties over the generated tokens |
//! | `logit_bias`  | object `{"<token id>": bias}` |        | bias -100 ..= 100 added to the token's logit |
//! | `n`           | integer 1 ..= 8              | 1       | choices, each its own sequence; a seed `s` gives choice `i` the seed `s + i` |
//! | `logprobs`, `top_logprobs` | bool, integer 0 ..= 20 | false, 0 | report each token's log-probability and alternatives (`logprobs.rs`) |
//! | `response_format` | OpenAI's object          |         | `text`, `json_object` or `json_schema`, enforced by a grammar (`grammar.rs`) |
//! | `tools`, `tool_choice`, `parallel_tool_calls` | OpenAI's | | function calling (`tools.rs`); `messages` may hold `tool` results and assistant `tool_calls` |
//!
//! Exactly one of `prompt` and `messages` is required; other fields are
//! rejected. `null` counts as absent. The input is one typed struct
//! (`input.rs`), which is also the model's input schema: every member's
//! problem is reported together in one `BadInput` message, separated by
//! `"; "` (`temperature: must be a number from 0 to 2 (got 5)`), and the
//! rules between members once every member is well formed.
//!
//! # Output
//!
//! ```json
//! {"choices": [{"index": 0, "tokens": ["Hello", "!"], "text": "Hello!", "finish_reason": "stop"}],
//!  "usage": {"input": 12, "output": 2}}
//! ```
//!
//! A choice also has `tool_calls` (OpenAI's shape; `finish_reason` is then
//! `"tool_calls"` and `text` the content beside the calls) and `logprobs`
//! when there are any. With `n` choices, `usage.output` is every choice's
//! tokens and the prompt counts once.
//!
//! `tokens` are the streamed pieces, in order; they concatenate to `text`
//! exactly. A piece is usually one token's text, but bytes of a character
//! split across tokens, and text that might begin a stop string, are held
//! back and released with a later piece, so pieces are never empty and
//! always valid UTF-8.
//! `finish_reason` is `"stop"` (end-of-generation token or stop string) or
//! `"length"` (`max_tokens` reached). `usage.input` counts prompt tokens,
//! `usage.output` generated tokens (the end-of-generation token is not
//! counted); the job bills `input + output` `tokens`.
//!
//! # Streaming
//!
//! The job's chunks are `{"tokens": ["<piece>", ...]}`: the pieces again,
//! in order, so the chunks' lists joined are `tokens`. A chunk belongs to one
//! choice (`index`, absent for the first) and carries its `tool_calls`
//! fragments (OpenAI's `delta.tool_calls` items) and `logprobs` entries when
//! there are any. The first piece is
//! sent alone as soon as it exists; after that, pieces produced within
//! [`EngineOptions::stream_interval`] of the last chunk travel together in
//! the next one, so no piece waits longer than the interval and a fast
//! stream costs the job path one chunk per interval rather than one per
//! token. With an interval of zero every piece is its own chunk.
//!
//! # Chat templates
//!
//! Prompts are formatted by llama.cpp's built-in template engine, which
//! recognises the GGUF's `tokenizer.chat_template` (ChatML, Llama 3, Gemma,
//! ...) but does not run Jinja: parts of a template beyond the message
//! layout (SmolLM2's default system message, for one) are not reproduced. A
//! model without a usable template serves only `raw` prompts.
//!
//! # Determinism
//!
//! Temperature 0 is plain argmax, so a request run alone gives exactly the
//! tokens of llama.cpp's own greedy decoding ([`greedy_tokens`] reproduces
//! `llama-simple`), and a fixed `seed` repeats a sampled output. Batching
//! keeps this exact while a sequence's KV cells stay in position order, but
//! llama.cpp's kernels are not batch-invariant in general: when another
//! sequence ends and frees cells that a running sequence then reuses, or
//! when the cache or the batch grows past the sizes where llama.cpp switches
//! attention kernels, sums are taken in another order and a near-tie between
//! two tokens can flip (llama.cpp issue #7052; GPUs behave the same way).
//!
//! # Logging
//!
//! llama.cpp's own log goes to `tracing` under the target `llama_cpp`; it
//! is chatty at INFO while loading (filter with `llama_cpp=warn`).

mod draw;
mod engine;
mod factory;
pub mod grammar;
mod input;
mod llama;
mod logprobs;
mod stream;
#[cfg(test)]
mod tests;
mod tools;

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_worker_sdk::{CancellationToken, JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};

pub use crate::engine::StepTotals;
use crate::engine::{EngineConfig, EngineHandle, FinishReason, Finished, Listener, Request, Submission};
pub use crate::factory::{TextFactory, TextSettings};
use crate::input::{DEFAULT_MAX_TOKENS, Params, Prompt, Role};
use crate::llama::{Batch, ChatTemplate, Context, ContextSettings, Sampler, Stage, Token, Weights};
pub use crate::logprobs::{Alternative, TokenLogprob};
pub use crate::tools::CallDelta as ToolCallDelta;
use crate::tools::{CallDelta, CallParser, Tools};
/// The typed output and stream chunks of a text job ([`gantry_text_output`]).
pub use gantry_text_output as output;

/// The default [`EngineOptions::stream_interval`].
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(50);

/// How the engine uses the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// CPU threads for llama.cpp; 0 = the number of cores.
    pub threads: usize,
    /// Threads that draw the next tokens of a step's sequences at once, each
    /// with its own sampler chain; 1 = one after another on the engine's
    /// thread; 0 = as many as `threads` resolves to when layers are offloaded
    /// to a GPU (the CPU is idle while it decodes), else 1.
    pub sampling_threads: usize,
    /// KV cache size in tokens, shared by all running sequences. Each
    /// sequence reserves its prompt plus `max_tokens` of it while it runs.
    pub context_tokens: u32,
    /// Sequences decoded together (1 ..= 256).
    pub max_sequences: u32,
    /// Most tokens per decode call (at least `max_sequences`); long prompts
    /// are read in chunks of this size.
    pub batch_tokens: u32,
    /// Layers offloaded to the GPU: 0 on CPU, `u32::MAX` = all.
    pub gpu_layers: u32,
    /// How long a streamed piece may wait to be sent together with the
    /// pieces after it. A request's first piece goes out at once; later ones
    /// at most this long after they are produced, joined into one chunk.
    /// Zero sends every piece as its own chunk.
    pub stream_interval: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            sampling_threads: 0,
            context_tokens: 8192,
            max_sequences: 16,
            batch_tokens: 512,
            gpu_layers: if cfg!(feature = "cuda") { u32::MAX } else { 0 },
            stream_interval: DEFAULT_STREAM_INTERVAL,
        }
    }
}

impl EngineOptions {
    fn resolve(&self) -> Result<EngineConfig, LoadError> {
        let mut problems = Vec::new();
        if self.context_tokens == 0 {
            problems.push("context_tokens must be at least 1".to_owned());
        }
        if !(1..=256).contains(&self.max_sequences) {
            problems.push(format!(
                "max_sequences must be from 1 to 256, got {}",
                self.max_sequences
            ));
        }
        if self.batch_tokens < self.max_sequences.max(1) {
            problems.push(format!(
                "batch_tokens ({}) must be at least max_sequences ({})",
                self.batch_tokens, self.max_sequences
            ));
        }
        if !problems.is_empty() {
            return Err(LoadError::Options(problems.join("; ")));
        }
        let threads = resolve_threads(self.threads);
        Ok(EngineConfig {
            threads,
            // With the model on the CPU, the decode's own threads fill the
            // cores and draws on other threads slow the next decode (see
            // docs/benchmarks.md); with layers on a GPU, the CPU is idle
            // while it decodes.
            sampling_threads: match self.sampling_threads {
                0 if self.gpu_layers > 0 => usize::try_from(threads).unwrap_or(1),
                0 => 1,
                n => n,
            },
            context_tokens: self.context_tokens,
            max_sequences: self.max_sequences,
            batch_tokens: self.batch_tokens,
        })
    }
}

fn resolve_threads(threads: usize) -> i32 {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    } else {
        threads
    };
    i32::try_from(threads).unwrap_or(i32::MAX)
}

/// Why a model could not be loaded (or [`greedy_tokens`] failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The [`EngineOptions`] are unusable.
    #[error("invalid engine options: {0}")]
    Options(String),
    /// The GGUF file is missing or unreadable.
    #[error("cannot load model weights from {}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },
    /// llama.cpp could not create a context (usually: out of memory).
    #[error("cannot create the llama.cpp context: {0}")]
    Context(String),
    /// A decode failed ([`greedy_tokens`] only).
    #[error("decoding failed: {0}")]
    Decode(String),
}

fn load_weights(gguf: &Path, gpu_layers: u32) -> Result<Weights, LoadError> {
    let error = |reason: String| LoadError::Model {
        path: gguf.to_owned(),
        reason,
    };
    if !gguf.is_file() {
        return Err(error("no such file".into()));
    }
    Weights::load(gguf, gpu_layers).map_err(error)
}

/// What jobs share: the weights and how to build prompts.
struct Shared {
    model: Arc<Weights>,
    /// Every token that ends generation (the GGUF's and the family's end of
    /// turn): what `ignore_eos` bans.
    all_eog: Vec<Token>,
    /// `None` when the GGUF has no chat template llama.cpp understands.
    template: Option<ChatTemplate>,
    /// Most tokens (prompt + output) one request may use.
    context_length: u32,
}

/// A text-generation model served by one engine thread.
pub struct TextModel {
    id: String,
    shared: Arc<Shared>,
    engine: EngineHandle,
    stream_interval: Duration,
}

impl fmt::Debug for TextModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextModel")
            .field("id", &self.id)
            .field("context_length", &self.shared.context_length)
            .field("chat_template", &self.shared.template.is_some())
            .field("stream_interval", &self.stream_interval)
            .finish_non_exhaustive()
    }
}

impl TextModel {
    /// Where the engine's steps have spent their time since it started (see
    /// [`StepTotals`]).
    pub fn step_times(&self) -> StepTotals {
        self.engine.step_times()
    }

    /// Loads `gguf` and starts the engine thread. Blocks while the weights
    /// load (call it from `spawn_blocking` inside async code).
    pub fn load(model_id: &str, gguf: &Path, options: EngineOptions) -> Result<Self, LoadError> {
        let config = options.resolve()?;
        let started = Instant::now();
        let model = Arc::new(load_weights(gguf, options.gpu_layers)?);
        let context_length = config.context_tokens.min(model.n_ctx_train().max(1));
        let template = usable_template(&model);
        if template.is_none() {
            tracing::warn!(
                model = model_id,
                "the model has no usable chat template: only `raw` prompts will work"
            );
        }
        let mut all_eog = model.end_of_generation_tokens();
        all_eog.extend(family_end_of_turn(&model));
        all_eog.sort_unstable();
        all_eog.dedup();
        let engine = EngineHandle::start(Arc::clone(&model), config, model_id)?;
        tracing::info!(
            model = model_id,
            path = %gguf.display(),
            params = model.n_params(),
            n_ctx_train = model.n_ctx_train(),
            context_tokens = config.context_tokens,
            max_sequences = config.max_sequences,
            batch_tokens = config.batch_tokens,
            threads = config.threads,
            gpu_layers = options.gpu_layers,
            stream_interval_ms = options.stream_interval.as_millis() as u64,
            load_ms = started.elapsed().as_millis() as u64,
            "text model loaded"
        );
        Ok(Self {
            id: model_id.to_owned(),
            shared: Arc::new(Shared {
                model,
                all_eog,
                template,
                context_length,
            }),
            engine,
            stream_interval: options.stream_interval,
        })
    }

    /// Most tokens one request may use, prompt and output together: the
    /// smaller of `context_tokens` and the model's trained context.
    pub fn context_length(&self) -> u32 {
        self.shared.context_length
    }

    /// Runs one request: `input` is the job's JSON (see the crate docs),
    /// `on_chunk` receives what each choice produces, in order, in groups as
    /// [`EngineOptions::stream_interval`] gathers them (its error ends the
    /// request), `cancel` stops it at the next token with
    /// [`JobError::Cancelled`]. [`Model::run`] is this with the job's context.
    pub async fn generate<F, Fut>(
        &self,
        input: Value,
        cancel: CancellationToken,
        on_chunk: F,
    ) -> Result<Output, JobError>
    where
        F: FnMut(Chunk) -> Fut + Send,
        Fut: Future<Output = Result<(), JobError>> + Send,
    {
        let (choices, prompt_tokens) = self.complete(input, cancel, on_chunk).await?;
        let input_tokens = prompt_tokens as u64;
        let output_tokens: u64 = choices.iter().map(|c| c.finished.tokens.len() as u64).sum();
        let output = output::TextOutput {
            choices: choices.iter().enumerate().map(|(i, c)| c.to_output(i)).collect(),
            usage: output::TokenUsage {
                input: input_tokens,
                output: output_tokens,
            },
        };
        let json = serde_json::to_value(&output).map_err(|e| JobError::internal(format!("output: {e}")))?;
        Ok(Output::new(json, Usage::whole("tokens", output.usage.total())))
    }

    /// [`Self::generate`] without the JSON output: every choice's result and
    /// the prompt's length in tokens.
    async fn complete<F, Fut>(
        &self,
        input: Value,
        cancel: CancellationToken,
        mut on_chunk: F,
    ) -> Result<(Vec<ChoiceResult>, usize), JobError>
    where
        F: FnMut(Chunk) -> Fut + Send,
        Fut: Future<Output = Result<(), JobError>> + Send,
    {
        let params = Params::parse(&input, self.shared.context_length).map_err(JobError::BadInput)?;
        let shared = Arc::clone(&self.shared);
        let tools = params.tools.clone();
        let logprobs = params.logprobs.is_some();
        // Tokenizing a long prompt takes a while: keep it off the async threads.
        let requests = tokio::task::spawn_blocking(move || shared.requests(params))
            .await
            .map_err(|e| JobError::internal(format!("tokenizer task failed: {e}")))??;
        let prompt_tokens = requests.first().map_or(0, |r| r.prompt.len());
        // Stops the sequences when this future is dropped, too.
        let job_cancel = cancel.child_token();
        let _stop_when_dropped = job_cancel.clone().drop_guard();
        let (listener, Submission { mut pieces, mut done }) = Submission::channel();
        let mut choices: Vec<Choice> = Vec::with_capacity(requests.len());
        for (index, request) in requests.into_iter().enumerate() {
            choices.push(Choice::new(tools.as_ref(), logprobs));
            let listener = Listener {
                index,
                ..listener.clone()
            };
            self.engine.submit_to(request, job_cancel.clone(), listener);
        }
        drop(listener);
        let interval = self.stream_interval;
        let mut remaining = choices.len();
        // When the last group of pieces went out. Until `interval` after it,
        // this task sleeps: the engine queues the pieces it makes meanwhile
        // without waking it, and they go out together when it wakes. Past
        // that time it waits for the next piece, which goes out at once (so
        // does a request's first).
        let mut last_sent: Option<tokio::time::Instant> = None;
        loop {
            let due = last_sent
                .map(|sent| sent + interval)
                .filter(|due| *due > tokio::time::Instant::now());
            // A cancel wins at once, even over pieces already queued: the
            // engine drops the sequences at its next step (`job_cancel` is a
            // child of `cancel`).
            let mut ended = None;
            let mut group = Vec::new();
            match due {
                Some(due) => tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(JobError::Cancelled),
                    end = done.recv() => ended = Some(end),
                    () = tokio::time::sleep_until(due) => {},
                },
                None => tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(JobError::Cancelled),
                    piece = pieces.recv() => match piece {
                        Some(piece) => group.push(piece),
                        // The engine let go of every request: their ends say why.
                        None => ended = Some(done.recv().await),
                    },
                    end = done.recv() => ended = Some(end),
                },
            }
            if ended.is_some() || !interval.is_zero() {
                // Every piece of an ended request was queued before its end.
                take_queued(&mut pieces, &mut group);
            }
            if !group.is_empty() {
                last_sent = Some(tokio::time::Instant::now());
                send_group(&mut choices, group, interval.is_zero(), &mut on_chunk).await?;
            }
            let Some(end) = ended else { continue };
            let Some((index, result)) = end else {
                return Err(JobError::internal("the text engine stopped unexpectedly"));
            };
            let finished = result?;
            let choice = &mut choices[index];
            let last = choice.finish(index, finished);
            if !last.is_empty() {
                on_chunk(last).await?;
            }
            remaining -= 1;
            if remaining == 0 {
                return Ok((choices.into_iter().filter_map(Choice::result).collect(), prompt_tokens));
            }
        }
    }
}

/// What one choice produced since its last chunk.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chunk {
    /// The choice (0 unless the request asked for `n` > 1).
    pub index: usize,
    /// Pieces of the answer's text, in order.
    pub pieces: Vec<String>,
    /// Pieces of function calls (OpenAI's `delta.tool_calls` items).
    pub tool_calls: Vec<ToolCallDelta>,
    /// The generated tokens' log-probabilities, when asked for.
    pub logprobs: Vec<TokenLogprob>,
}

impl Chunk {
    fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.tool_calls.is_empty() && self.logprobs.is_empty()
    }

    /// The job's stream chunk ([`output::TextChunk`]).
    pub fn to_output(&self) -> output::TextChunk {
        output::TextChunk {
            index: self.index,
            tokens: self.pieces.clone(),
            tool_calls: self.tool_calls.iter().map(CallDelta::to_output).collect(),
            logprobs: self.logprobs.iter().map(TokenLogprob::to_output).collect(),
        }
    }

    /// [`Chunk::to_output`] as JSON: `{"tokens": [...]}`, with `index`,
    /// `tool_calls` and `logprobs` when there are any.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.to_output()).unwrap_or_else(|_| json!({ "tokens": self.pieces }))
    }
}

/// A choice while it runs.
struct Choice {
    /// Reads calls out of the text, when tools are offered.
    parser: Option<CallParser>,
    /// The content pieces sent.
    pieces: Vec<String>,
    logprobs: Option<Vec<TokenLogprob>>,
    finished: Option<Finished>,
}

/// A finished choice.
struct ChoiceResult {
    pieces: Vec<String>,
    calls: Vec<tools::Call>,
    logprobs: Option<Vec<TokenLogprob>>,
    finished: Finished,
}

impl ChoiceResult {
    fn to_output(&self, index: usize) -> output::Choice {
        let finish_reason = match self.finished.finish_reason {
            FinishReason::Stop if !self.calls.is_empty() => "tool_calls",
            reason => reason.as_str(),
        };
        output::Choice {
            index,
            tokens: self.pieces.clone(),
            text: self.pieces.concat(),
            finish_reason: finish_reason.to_owned(),
            tool_calls: self.calls.iter().map(tools::Call::to_output).collect(),
            logprobs: self
                .logprobs
                .as_ref()
                .map(|logprobs| logprobs.iter().map(TokenLogprob::to_output).collect()),
        }
    }
}

impl Choice {
    fn new(tools: Option<&Tools>, logprobs: bool) -> Self {
        Self {
            parser: tools.map(|_| CallParser::new()),
            pieces: Vec::new(),
            logprobs: logprobs.then(Vec::new),
            finished: None,
        }
    }

    /// The chunk for what the engine emitted.
    fn absorb(&mut self, index: usize, emitted: Vec<engine::Emitted>) -> Chunk {
        let mut chunk = Chunk {
            index,
            ..Chunk::default()
        };
        for item in emitted {
            self.read(&mut chunk, &item.piece);
            if let Some(logprob) = item.logprob {
                if let Some(all) = &mut self.logprobs {
                    all.push(logprob.clone());
                }
                chunk.logprobs.push(logprob);
            }
        }
        chunk
    }

    fn read(&mut self, chunk: &mut Chunk, text: &str) {
        if text.is_empty() {
            return;
        }
        let (content, calls) = match &mut self.parser {
            Some(parser) => {
                let parsed = parser.push(text);
                (parsed.content, parsed.calls)
            }
            None => (text.to_owned(), Vec::new()),
        };
        self.add(chunk, content, calls);
    }

    fn add(&mut self, chunk: &mut Chunk, content: String, calls: Vec<CallDelta>) {
        if !content.is_empty() {
            self.pieces.push(content.clone());
            chunk.pieces.push(content);
        }
        // One delta per call and chunk, as OpenAI sends them (clients merge
        // a chunk's deltas by index, and not all of them merge two of one).
        for call in calls {
            match chunk.tool_calls.last_mut() {
                Some(last) if last.index == call.index && call.start.is_none() => {
                    last.arguments.push_str(&call.arguments);
                }
                _ => chunk.tool_calls.push(call),
            }
        }
    }

    /// The last chunk, once the engine is done with this choice.
    fn finish(&mut self, index: usize, finished: Finished) -> Chunk {
        let mut chunk = Chunk {
            index,
            ..Chunk::default()
        };
        if let Some(parser) = &mut self.parser {
            let parsed = parser.finish();
            self.add(&mut chunk, parsed.content, parsed.calls);
        }
        self.finished = Some(finished);
        chunk
    }

    fn result(self) -> Option<ChoiceResult> {
        Some(ChoiceResult {
            calls: self.parser.map(|p| p.calls().to_vec()).unwrap_or_default(),
            pieces: self.pieces,
            logprobs: self.logprobs,
            finished: self.finished?,
        })
    }
}

/// Sends a group of emitted pieces as chunks: one per choice, in the order
/// the choices first appear, or one per piece when `alone`.
async fn send_group<F, Fut>(
    choices: &mut [Choice],
    group: Vec<(usize, engine::Emitted)>,
    alone: bool,
    on_chunk: &mut F,
) -> Result<(), JobError>
where
    F: FnMut(Chunk) -> Fut + Send,
    Fut: Future<Output = Result<(), JobError>> + Send,
{
    let mut batches: Vec<(usize, Vec<engine::Emitted>)> = Vec::new();
    for (index, emitted) in group {
        match batches.iter_mut().find(|(i, _)| *i == index) {
            Some((_, items)) if !alone => items.push(emitted),
            _ => batches.push((index, vec![emitted])),
        }
    }
    for (index, items) in batches {
        let Some(choice) = choices.get_mut(index) else { continue };
        let chunk = choice.absorb(index, items);
        if !chunk.is_empty() {
            on_chunk(chunk).await?;
        }
    }
    Ok(())
}

/// Moves the pieces the engine has queued so far into `group`.
fn take_queued(
    pieces: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, engine::Emitted)>,
    group: &mut Vec<(usize, engine::Emitted)>,
) {
    while let Ok(piece) = pieces.try_recv() {
        group.push(piece);
    }
}

impl Shared {
    /// Formats and tokenizes the prompt, settles `max_tokens` and builds
    /// one request per choice.
    fn requests(&self, params: Params) -> Result<Vec<Request>, JobError> {
        let text = match &params.prompt {
            Prompt::Raw(text) => text.clone(),
            Prompt::Chat(messages) => self.format_chat(messages, params.tools.as_ref())?,
        };
        // BOS as the model wants it; special tokens in the text are parsed
        // (llama.cpp's own tools do the same).
        let prompt = self
            .model
            .tokenize(text.as_bytes(), true, true)
            .map_err(JobError::bad_input)?;
        if prompt.is_empty() {
            return Err(JobError::bad_input("the prompt is empty"));
        }
        let context = self.context_length as usize;
        if prompt.len() >= context {
            return Err(JobError::bad_input(format!(
                "the prompt is {} tokens; the context holds {context} tokens for prompt and output together",
                prompt.len()
            )));
        }
        let room = u32::try_from(context - prompt.len()).unwrap_or(u32::MAX);
        let max_tokens = match params.max_tokens {
            None => DEFAULT_MAX_TOKENS.min(room),
            Some(max_tokens) if max_tokens <= room => max_tokens,
            Some(max_tokens) => {
                return Err(JobError::bad_input(format!(
                    "the prompt ({} tokens) plus `max_tokens` ({max_tokens}) exceeds the context length ({context} tokens)",
                    prompt.len()
                )));
            }
        };
        let n_vocab = self.model.n_vocab();
        if let Some((token, _)) = params.sampling.logit_bias.iter().find(|(t, _)| *t >= n_vocab) {
            return Err(JobError::bad_input(format!(
                "`logit_bias`: token {token} is not in the vocabulary (0 to {})",
                n_vocab - 1
            )));
        }
        let mut requests = Vec::with_capacity(params.n as usize);
        for i in 0..params.n {
            let grammar = match &params.grammar {
                None => None,
                Some(grammar) => {
                    let triggers: Vec<&str> = grammar.trigger.iter().map(String::as_str).collect();
                    Some(Sampler::grammar(&self.model, &grammar.text, &triggers).map_err(|e| {
                        let field = if params.tools.is_some() {
                            "tools"
                        } else {
                            "response_format"
                        };
                        JobError::bad_input(format!("`{field}`: {e}"))
                    })?)
                }
            };
            let mut sampling = params.sampling.clone();
            // Each choice its own draw; a seed still repeats all of them.
            sampling.seed = Some(match sampling.seed {
                Some(seed) => seed.wrapping_add(u64::from(i)),
                None => engine::random_seed(),
            });
            let ban = params.ignore_eos.then_some((self.all_eog.as_slice(), n_vocab));
            requests.push(Request {
                prompt: prompt.clone(),
                max_tokens,
                sampler: engine::sampler(&sampling, grammar, ban, n_vocab, max_tokens),
                stop: params.stop.clone(),
                logprobs: params.logprobs,
            });
        }
        Ok(requests)
    }

    fn format_chat(&self, messages: &[input::Message], tools: Option<&Tools>) -> Result<String, JobError> {
        let Some(template) = &self.template else {
            return Err(JobError::bad_input(
                "this model has no chat template; send `prompt` with `raw: true`",
            ));
        };
        // Tool calls and results become text in the model's own turns; the
        // tools are described in the system message.
        let mut chat: Vec<(&str, String)> = Vec::with_capacity(messages.len() + 1);
        for message in messages {
            let content = match message.role {
                Role::Tool => tools::render_result(&message.content),
                Role::Assistant if !message.tool_calls.is_empty() => {
                    let calls = tools::render_calls(&message.tool_calls);
                    if message.content.is_empty() {
                        calls
                    } else {
                        format!("{}\n{calls}", message.content)
                    }
                }
                _ => message.content.clone(),
            };
            let role = match message.role {
                Role::Tool => "user",
                role => role.as_str(),
            };
            chat.push((role, content));
        }
        if let Some(tools) = tools {
            let described = tools.system_text();
            match chat.first_mut() {
                Some((role, content)) if *role == "system" => *content = format!("{content}\n\n{described}"),
                _ => chat.insert(0, ("system", described)),
            }
        }
        // `Params::parse` refused NUL characters, the only bad input here.
        let chat: Vec<(&str, &str)> = chat.iter().map(|(role, content)| (*role, content.as_str())).collect();
        template
            .apply(&chat, true)
            .map_err(|e| JobError::internal(format!("cannot apply the chat template: {e}")))
    }
}

fn is_gemma(model: &Weights) -> bool {
    model
        .meta("general.architecture")
        .is_some_and(|family| family.starts_with("gemma"))
}

/// Tokens that end a turn in the model's chat format but that the GGUF may
/// not mark as end of generation: Gemma's `<end_of_turn>` (without it, a
/// Gemma answer runs on into a new turn).
pub(crate) fn family_end_of_turn(model: &Weights) -> Vec<Token> {
    if !is_gemma(model) {
        return Vec::new();
    }
    match model.tokenize(b"<end_of_turn>", false, true).as_deref() {
        Ok([token]) => vec![*token],
        _ => Vec::new(),
    }
}

/// The GGUF's chat template, if llama.cpp can apply it; for a GGUF that
/// carries none, llama.cpp's built-in template of its model family where
/// the family has exactly one (Gemma's `<start_of_turn>` turns: some Gemma 3
/// conversions ship without `tokenizer.chat_template`).
fn usable_template(model: &Weights) -> Option<ChatTemplate> {
    let applies = |template: &ChatTemplate| template.apply(&[("user", "hi")], true).is_ok();
    if let Some(template) = model.chat_template().filter(applies) {
        return Some(template);
    }
    let family = model.meta("general.architecture")?;
    let builtin = if family.starts_with("gemma") {
        "gemma"
    } else {
        return None;
    };
    let template = ChatTemplate::named(builtin)?;
    applies(&template).then(|| {
        tracing::info!(%family, builtin, "the GGUF has no chat template: using llama.cpp's built-in one");
        template
    })
}

impl Model for TextModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let cancel = ctx.cancellation_token();
        self.generate(input, cancel, |chunk| {
            let ctx = ctx.clone();
            async move { ctx.chunk(chunk.to_json()).await }
        })
        .await
    }
}

/// A [`WorkerRuntime`] serving `model` with `config`.
pub fn runtime(model: TextModel, config: WorkerConfig) -> WorkerRuntime<TextModel> {
    WorkerRuntime::new(model, config)
}

/// Greedy decoding of `prompt` tokenized as is (BOS added if the model wants
/// it, special tokens parsed), on a fresh single-sequence context, the way
/// llama.cpp's `llama-simple` does it: up to `n` token ids, stopping early
/// (and excluding it) at an end-of-generation token. Loads the weights on
/// every call; meant for tests and benchmarks.
pub fn greedy_tokens(gguf: &Path, prompt: &str, n: usize) -> Result<Vec<i32>, LoadError> {
    let options = EngineOptions::default();
    let model = load_weights(gguf, options.gpu_layers)?;
    let tokens = model
        .tokenize(prompt.as_bytes(), true, true)
        .map_err(LoadError::Decode)?;
    if tokens.is_empty() {
        return Err(LoadError::Decode("the prompt is empty".into()));
    }
    let n_ctx = u32::try_from(tokens.len() + n + 1).map_err(|_| LoadError::Decode("prompt too long".into()))?;
    let batch_size = 512u32;
    let mut context = Context::new(
        &model,
        ContextSettings {
            n_ctx,
            n_batch: batch_size,
            n_ubatch: batch_size,
            n_seq_max: 1,
            unified_kv: false,
            threads: resolve_threads(options.threads),
        },
    )
    .map_err(LoadError::Context)?;
    let decode_error = |e: &dyn fmt::Display| LoadError::Decode(e.to_string());
    let mut batch = Batch::new(batch_size as usize);
    let mut position = 0i32;
    let mut last = 0;
    for chunk in tokens.chunks(batch_size as usize) {
        batch.clear();
        for &token in chunk {
            let is_last = position as usize + 1 == tokens.len();
            last = batch.push(token, position, 0, is_last).map_err(|e| decode_error(&e))?;
            position += 1;
        }
        context.decode(&batch).map_err(|e| decode_error(&e))?;
    }
    let mut sampler = Sampler::chain(&[Stage::Greedy]);
    let mut output = Vec::with_capacity(n);
    while output.len() < n {
        let token = sampler.sample(&context, last);
        if model.is_end_of_generation(token) {
            break;
        }
        output.push(token);
        if output.len() == n {
            break;
        }
        batch.clear();
        last = batch.push(token, position, 0, true).map_err(|e| decode_error(&e))?;
        position += 1;
        context.decode(&batch).map_err(|e| decode_error(&e))?;
    }
    Ok(output)
}
