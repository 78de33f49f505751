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
//! | `ignore_eos`  | bool                         | false   | never sample an end-of-generation token: the answer runs to `max_tokens` unless a stop string or a cancel ends it (fixed-length benchmarks and tests) |
//!
//! Exactly one of `prompt` and `messages` is required; other fields are
//! rejected. `null` counts as absent. All problems are reported together in
//! one `BadInput` message, separated by `"; "`.
//!
//! # Output
//!
//! ```json
//! {"choices": [{"tokens": ["Hello", "!"], "text": "Hello!", "finish_reason": "stop"}],
//!  "usage": {"input": 12, "output": 2}}
//! ```
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
//! in order, so the chunks' lists joined are `tokens`. The first piece is
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

mod engine;
mod input;
mod llama;
mod stream;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_worker_sdk::{CancellationToken, JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};

use crate::engine::{EngineConfig, EngineHandle, Finished, Request, Submission};
use crate::input::{DEFAULT_MAX_TOKENS, Params, Prompt};
use crate::llama::{Batch, ChatTemplate, Context, ContextSettings, Sampler, Stage, Token, Weights};

/// The default [`EngineOptions::stream_interval`].
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(50);

/// How the engine uses the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// CPU threads for llama.cpp; 0 = the number of cores.
    pub threads: usize,
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
        Ok(EngineConfig {
            threads: resolve_threads(self.threads),
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
    /// `on_pieces` receives the streamed pieces in order, in groups as
    /// [`EngineOptions::stream_interval`] gathers them (its error ends the
    /// request), `cancel` stops it at the next token with
    /// [`JobError::Cancelled`]. [`Model::run`] is this with the job's context.
    pub async fn generate<F, Fut>(
        &self,
        input: Value,
        cancel: CancellationToken,
        on_pieces: F,
    ) -> Result<Output, JobError>
    where
        F: FnMut(Vec<String>) -> Fut + Send,
        Fut: Future<Output = Result<(), JobError>> + Send,
    {
        let (pieces, finished) = self.complete(input, cancel, on_pieces).await?;
        let input_tokens = finished.prompt_tokens as u64;
        let output_tokens = finished.tokens.len() as u64;
        let output = json!({
            "choices": [{
                "tokens": pieces,
                "text": finished.text,
                "finish_reason": finished.finish_reason.as_str(),
            }],
            "usage": {"input": input_tokens, "output": output_tokens},
        });
        Ok(Output::new(
            output,
            Usage::whole("tokens", input_tokens + output_tokens),
        ))
    }

    /// [`Self::generate`] without the JSON output: the pieces and the raw
    /// result (token ids included).
    async fn complete<F, Fut>(
        &self,
        input: Value,
        cancel: CancellationToken,
        mut on_pieces: F,
    ) -> Result<(Vec<String>, Finished), JobError>
    where
        F: FnMut(Vec<String>) -> Fut + Send,
        Fut: Future<Output = Result<(), JobError>> + Send,
    {
        let params = Params::parse(&input, self.shared.context_length).map_err(JobError::BadInput)?;
        let shared = Arc::clone(&self.shared);
        // Tokenizing a long prompt takes a while: keep it off the async threads.
        let request = tokio::task::spawn_blocking(move || shared.request(params))
            .await
            .map_err(|e| JobError::internal(format!("tokenizer task failed: {e}")))??;
        // Stops the sequence when this future is dropped, too.
        let job_cancel = cancel.child_token();
        let _stop_when_dropped = job_cancel.clone().drop_guard();
        let Submission { mut pieces, mut done } = self.engine.submit(request, job_cancel);
        let interval = self.stream_interval;
        let mut sent = Vec::new();
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
            // engine drops the sequence at its next step (`job_cancel` is a
            // child of `cancel`).
            let mut group = match due {
                Some(due) => tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(JobError::Cancelled),
                    end = &mut done => return end_of(end, &mut pieces, sent, interval, &mut on_pieces).await,
                    () = tokio::time::sleep_until(due) => Vec::new(),
                },
                None => tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(JobError::Cancelled),
                    piece = pieces.recv() => match piece {
                        Some(piece) => vec![piece],
                        // The engine let go of the request: its end says why.
                        None => return end_of((&mut done).await, &mut pieces, sent, interval, &mut on_pieces).await,
                    },
                    end = &mut done => return end_of(end, &mut pieces, sent, interval, &mut on_pieces).await,
                },
            };
            if !interval.is_zero() {
                take_queued(&mut pieces, &mut group);
            }
            if !group.is_empty() {
                last_sent = Some(tokio::time::Instant::now());
                sent.extend_from_slice(&group);
                on_pieces(group).await?;
            }
        }
    }
}

/// Moves the pieces the engine has queued so far into `group`.
fn take_queued(pieces: &mut tokio::sync::mpsc::UnboundedReceiver<String>, group: &mut Vec<String>) {
    while let Ok(piece) = pieces.try_recv() {
        group.push(piece);
    }
}

/// How [`TextModel::complete`] ends once the engine has: the pieces still
/// queued go out as one last group (each alone with an interval of zero),
/// then the result.
async fn end_of<F, Fut>(
    end: Result<Result<Finished, JobError>, tokio::sync::oneshot::error::RecvError>,
    pieces: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    mut sent: Vec<String>,
    interval: Duration,
    on_pieces: &mut F,
) -> Result<(Vec<String>, Finished), JobError>
where
    F: FnMut(Vec<String>) -> Fut + Send,
    Fut: Future<Output = Result<(), JobError>> + Send,
{
    let finished = end.map_err(|_| JobError::internal("the text engine stopped unexpectedly"))??;
    // Every piece was queued before the end.
    let mut rest = Vec::new();
    take_queued(pieces, &mut rest);
    let group_size = if interval.is_zero() { 1 } else { rest.len().max(1) };
    for group in rest.chunks(group_size) {
        sent.extend_from_slice(group);
        on_pieces(group.to_vec()).await?;
    }
    Ok((sent, finished))
}

impl Shared {
    /// Formats and tokenizes the prompt and settles `max_tokens`.
    fn request(&self, params: Params) -> Result<Request, JobError> {
        let text = match &params.prompt {
            Prompt::Raw(text) => text.clone(),
            Prompt::Chat(messages) => self.format_chat(messages)?,
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
        Ok(Request {
            prompt,
            max_tokens,
            sampling: params.sampling,
            stop: params.stop,
            ignore_eos: params.ignore_eos,
        })
    }

    fn format_chat(&self, messages: &[input::Message]) -> Result<String, JobError> {
        let Some(template) = &self.template else {
            return Err(JobError::bad_input(
                "this model has no chat template; send `prompt` with `raw: true`",
            ));
        };
        // `Params::parse` refused NUL characters, the only bad input here.
        let chat: Vec<(&str, &str)> = messages
            .iter()
            .map(|message| (message.role.as_str(), message.content.as_str()))
            .collect();
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
        self.generate(input, cancel, |pieces| {
            let ctx = ctx.clone();
            async move { ctx.chunk(json!({ "tokens": pieces })).await }
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
