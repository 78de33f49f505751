//! llama.cpp through its C API (the `llama-cpp-sys-2` bindings): the few
//! calls the engine makes, each behind a safe type.
//!
//! The engine talks to the C API itself rather than through a wrapper crate
//! for one reason: its context runs on a ggml threadpool of its own,
//! attached once ([`Context::new`]). Without one, llama.cpp starts and joins
//! its decode threads inside every `llama_decode`, which costs a few per
//! cent of every token (bench/results/2026-11-27-text.md), and the wrapper crate had no
//! way to attach one.
//!
//! Ownership: a [`Weights`] is read-only once loaded and shared between the
//! engine thread and the tokenizing tasks; a [`Context`], [`Batch`] and
//! [`Sampler`] belong to the engine thread. Every type frees its llama.cpp
//! object on drop; a context borrows its model, so it cannot outlive it.
//!
//! llama.cpp's log goes to `tracing` under the target `llama_cpp`.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Mutex, Once};

use llama_cpp_sys_2 as sys;

/// A token id of the model's vocabulary.
pub type Token = sys::llama_token;

/// How many [`Weights`] are loaded; llama.cpp's backends are initialised
/// while there is one, and freed after the last one (see [`Weights`]'s
/// `Drop`), so a process that unloads its models leaves nothing of
/// llama.cpp's for its exit to tear down.
static LOADED: Mutex<usize> = Mutex::new(0);

/// Counts one more loaded model, initialising llama.cpp (its backends, and
/// its log into `tracing`) for the first.
fn acquire_backend() {
    static LOG: Once = Once::new();
    LOG.call_once(|| {
        // SAFETY: `log_to_tracing` matches `ggml_log_callback`, ignores its
        // user data and lives for the whole program.
        unsafe { sys::llama_log_set(Some(log_to_tracing), std::ptr::null_mut()) };
    });
    let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if *loaded == 0 {
        // SAFETY: under the lock, with no model loaded; llama.cpp allows
        // initialising again after `llama_backend_free`.
        unsafe { sys::llama_backend_init() };
    }
    *loaded += 1;
}

/// Counts one model fewer; the last frees llama.cpp's backends.
fn release_backend() {
    let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *loaded = loaded.saturating_sub(1);
    if *loaded == 0 {
        // SAFETY: under the lock, after the last model (and so every
        // context, which borrows a model) was freed.
        unsafe { sys::llama_backend_free() };
        tracing::info!("llama.cpp backend freed");
    }
}

/// `ggml_log_callback`: llama.cpp logs a line in one or several calls
/// (`GGML_LOG_LEVEL_CONT` continues the previous one), from any thread, so
/// pieces are gathered per thread and each complete line becomes one event.
unsafe extern "C" fn log_to_tracing(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    thread_local! {
        static LINES: RefCell<LogLines> = const { RefCell::new(LogLines::new()) };
    }
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let _ = LINES.try_with(|lines| {
        if let Ok(mut lines) = lines.try_borrow_mut() {
            lines.push(level, &text, emit);
        }
    });
}

/// Pieces of llama.cpp's log, joined into lines.
struct LogLines {
    level: sys::ggml_log_level,
    pending: String,
}

impl LogLines {
    const fn new() -> Self {
        Self {
            level: sys::GGML_LOG_LEVEL_INFO,
            pending: String::new(),
        }
    }

    /// Takes one piece; calls `line` for every line it completes (a piece
    /// of a new level also completes a pending unterminated one).
    fn push(&mut self, level: sys::ggml_log_level, text: &str, mut line: impl FnMut(sys::ggml_log_level, &str)) {
        if level != sys::GGML_LOG_LEVEL_CONT {
            if !self.pending.is_empty() {
                line(self.level, &self.pending);
                self.pending.clear();
            }
            self.level = level;
        }
        self.pending.push_str(text);
        while let Some(end) = self.pending.find('\n') {
            line(self.level, &self.pending[..end]);
            self.pending.drain(..=end);
        }
    }
}

fn emit(level: sys::ggml_log_level, line: &str) {
    let line = line.trim_end();
    if line.is_empty() {
        return;
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama_cpp", "{line}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama_cpp", "{line}"),
        sys::GGML_LOG_LEVEL_INFO | sys::GGML_LOG_LEVEL_NONE => tracing::info!(target: "llama_cpp", "{line}"),
        _ => tracing::debug!(target: "llama_cpp", "{line}"),
    }
}

/// A loaded model: its weights and vocabulary.
pub struct Weights {
    raw: NonNull<sys::llama_model>,
    vocab: NonNull<sys::llama_vocab>,
}

// SAFETY: a loaded model is not changed by anything this module calls on it
// (tokenizing, metadata, chat templates and contexts only read it); llama.cpp's
// own server shares one model between its threads the same way.
unsafe impl Send for Weights {}
// SAFETY: see `Send`.
unsafe impl Sync for Weights {}

impl Weights {
    /// Loads a GGUF file, offloading up to `gpu_layers` layers to a GPU when
    /// llama.cpp was built with one. The error is the reason, for a person.
    pub fn load(path: &Path, gpu_layers: u32) -> Result<Self, String> {
        let path = path.to_str().ok_or("the path is not valid UTF-8")?;
        let path = CString::new(path).map_err(|_| "the path contains a NUL byte")?;
        acquire_backend();
        // SAFETY: plain values out, no pointers in.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = i32::try_from(gpu_layers).unwrap_or(i32::MAX);
        // SAFETY: `path` is NUL-terminated and outlives the call; `params`
        // are llama.cpp's defaults with one number changed.
        let raw = unsafe { sys::llama_model_load_from_file(path.as_ptr(), params) };
        let Some(raw) = NonNull::new(raw) else {
            release_backend();
            return Err("llama.cpp could not load it (its log, target `llama_cpp`, says why)".into());
        };
        // SAFETY: `raw` is a loaded model; the vocabulary lives as long as it.
        let vocab = unsafe { sys::llama_model_get_vocab(raw.as_ptr()) };
        let Some(vocab) = NonNull::new(vocab.cast_mut()) else {
            // SAFETY: `raw` was loaded above and nothing else holds it.
            unsafe { sys::llama_model_free(raw.as_ptr()) };
            release_backend();
            return Err("the model has no vocabulary".into());
        };
        Ok(Self { raw, vocab })
    }

    /// The context length the model was trained with.
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: `self.raw` is a loaded model.
        u32::try_from(unsafe { sys::llama_model_n_ctx_train(self.raw.as_ptr()) }).unwrap_or(0)
    }

    /// Number of parameters.
    pub fn n_params(&self) -> u64 {
        // SAFETY: `self.raw` is a loaded model.
        unsafe { sys::llama_model_n_params(self.raw.as_ptr()) }
    }

    /// A string from the GGUF's metadata, e.g. `general.architecture`.
    pub fn meta(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        let mut buffer = vec![0u8; 128];
        loop {
            // SAFETY: `key` is NUL-terminated; `buffer` has the given size;
            // llama.cpp writes at most that many bytes, NUL included.
            let n = unsafe {
                sys::llama_model_meta_val_str(
                    self.raw.as_ptr(),
                    key.as_ptr(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            let n = usize::try_from(n).ok()?;
            if n < buffer.len() {
                buffer.truncate(n);
                return String::from_utf8(buffer).ok();
            }
            buffer.resize(n + 1, 0);
        }
    }

    /// The GGUF's own chat template (`tokenizer.chat_template`), if any.
    pub fn chat_template(&self) -> Option<ChatTemplate> {
        // SAFETY: `self.raw` is a loaded model; a null name asks for the
        // default template. The string belongs to the model; it is copied.
        let template = unsafe { sys::llama_model_chat_template(self.raw.as_ptr(), std::ptr::null()) };
        if template.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, alive as long as the model.
        Some(ChatTemplate(unsafe { CStr::from_ptr(template) }.to_owned()))
    }

    /// Tokenizes `text`; `add_special` adds BOS/EOS where the model wants
    /// them, `parse_special` reads special tokens written in the text.
    pub fn tokenize(&self, text: &[u8], add_special: bool, parse_special: bool) -> Result<Vec<Token>, String> {
        let length = i32::try_from(text.len()).map_err(|_| "the text is longer than llama.cpp accepts")?;
        // a token covers at least one byte, plus BOS and EOS
        let mut tokens: Vec<Token> = vec![0; text.len().saturating_add(2).min(i32::MAX as usize)];
        loop {
            let capacity = i32::try_from(tokens.len()).unwrap_or(i32::MAX);
            // SAFETY: `text` holds `length` bytes and `tokens` room for
            // `capacity` tokens; llama.cpp writes no more than that.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab.as_ptr(),
                    text.as_ptr().cast(),
                    length,
                    tokens.as_mut_ptr(),
                    capacity,
                    add_special,
                    parse_special,
                )
            };
            if n == i32::MIN {
                return Err("the text has more tokens than llama.cpp can count".into());
            }
            match usize::try_from(n) {
                Ok(n) => {
                    tokens.truncate(n);
                    return Ok(tokens);
                }
                // negative: the number of tokens needed
                Err(_) => tokens.resize(n.unsigned_abs() as usize, 0),
            }
        }
    }

    /// Appends the text of `token` to `out`: raw bytes, which may end
    /// inside a UTF-8 character. Special tokens (`<|im_end|>`, ...) render as
    /// nothing unless `special` is set.
    pub fn piece(&self, token: Token, special: bool, out: &mut Vec<u8>) {
        let mut buffer = [0u8; 64];
        // SAFETY: `buffer` has room for 64 bytes; llama.cpp writes at most
        // that and returns the length, or minus the length it needs.
        let n = unsafe {
            sys::llama_token_to_piece(self.vocab.as_ptr(), token, buffer.as_mut_ptr().cast(), 64, 0, special)
        };
        match usize::try_from(n) {
            Ok(n) => out.extend_from_slice(&buffer[..n.min(buffer.len())]),
            Err(_) => {
                let mut long = vec![0u8; n.unsigned_abs() as usize];
                // SAFETY: as above, with a buffer of the size asked for.
                let n = unsafe {
                    sys::llama_token_to_piece(
                        self.vocab.as_ptr(),
                        token,
                        long.as_mut_ptr().cast(),
                        i32::try_from(long.len()).unwrap_or(i32::MAX),
                        0,
                        special,
                    )
                };
                long.truncate(usize::try_from(n).unwrap_or(0));
                out.extend_from_slice(&long);
            }
        }
    }

    /// Whether `token` ends generation (EOS, EOT and the like).
    pub fn is_end_of_generation(&self, token: Token) -> bool {
        // SAFETY: the vocabulary of a loaded model; any id is accepted.
        unsafe { sys::llama_vocab_is_eog(self.vocab.as_ptr(), token) }
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> i32 {
        // SAFETY: the vocabulary of a loaded model.
        unsafe { sys::llama_vocab_n_tokens(self.vocab.as_ptr()) }
    }

    /// Every token of the vocabulary that ends generation.
    pub fn end_of_generation_tokens(&self) -> Vec<Token> {
        (0..self.n_vocab())
            .filter(|&token| self.is_end_of_generation(token))
            .collect()
    }
}

impl Drop for Weights {
    fn drop(&mut self) {
        // SAFETY: contexts borrow the model, so none is left; nothing else
        // holds the pointer.
        unsafe { sys::llama_model_free(self.raw.as_ptr()) }
        tracing::info!("text model weights freed");
        release_backend();
    }
}

fn self_vocab(model: &Weights) -> *const sys::llama_vocab {
    model.vocab.as_ptr()
}

/// A chat template for llama.cpp's built-in formatter: the GGUF's Jinja
/// source, which llama.cpp recognises by its markers, or the name of a
/// built-in format such as `"gemma"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate(CString);

impl ChatTemplate {
    /// A built-in format by name; `None` if the name holds a NUL byte.
    pub fn named(name: &str) -> Option<Self> {
        CString::new(name).ok().map(Self)
    }

    /// Formats `messages` (role, content), ending with the assistant's
    /// generation prompt when `add_assistant` is set.
    pub fn apply(&self, messages: &[(&str, &str)], add_assistant: bool) -> Result<String, String> {
        let owned = messages
            .iter()
            .map(|&(role, content)| Ok((CString::new(role)?, CString::new(content)?)))
            .collect::<Result<Vec<_>, std::ffi::NulError>>()
            .map_err(|_| "a message contains a NUL character")?;
        let chat: Vec<sys::llama_chat_message> = owned
            .iter()
            .map(|(role, content)| sys::llama_chat_message {
                role: role.as_ptr(),
                content: content.as_ptr(),
            })
            .collect();
        let text_bytes: usize = messages.iter().map(|(role, content)| role.len() + content.len()).sum();
        let mut buffer = vec![0u8; text_bytes * 2 + 256];
        loop {
            let capacity = i32::try_from(buffer.len()).map_err(|_| "the chat is too long")?;
            // SAFETY: the template and every message string are
            // NUL-terminated and outlive the call; `buffer` holds `capacity`
            // bytes and llama.cpp writes at most that.
            let n = unsafe {
                sys::llama_chat_apply_template(
                    self.0.as_ptr(),
                    chat.as_ptr(),
                    chat.len(),
                    add_assistant,
                    buffer.as_mut_ptr().cast(),
                    capacity,
                )
            };
            let n = usize::try_from(n).map_err(|_| "llama.cpp does not know this chat template")?;
            if n <= buffer.len() {
                buffer.truncate(n);
                return String::from_utf8(buffer).map_err(|_| "the formatted chat is not UTF-8".into());
            }
            buffer.resize(n, 0);
        }
    }
}

/// How a [`Context`] is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextSettings {
    /// KV cells, shared by all sequences when `unified_kv` is set.
    pub n_ctx: u32,
    /// Most tokens per `decode`.
    pub n_batch: u32,
    /// Most tokens per compute graph (a decode is split into these).
    pub n_ubatch: u32,
    /// Most sequences at once.
    pub n_seq_max: u32,
    /// One pool of KV cells for all sequences (otherwise each gets
    /// `n_ctx / n_seq_max`).
    pub unified_kv: bool,
    /// CPU threads, for single tokens and prompts alike.
    pub threads: i32,
}

/// A llama.cpp context: the KV cache and the compute state, decoding on a
/// ggml threadpool of its own whose threads live as long as the context.
pub struct Context<'m> {
    raw: NonNull<sys::llama_context>,
    threadpool: Option<NonNull<sys::ggml_threadpool>>,
    _model: PhantomData<&'m Weights>,
}

// SAFETY: a context is used by one thread at a time (it is `!Sync` and every
// call takes `&mut self` or reads plain settings); llama.cpp does not tie it
// to the thread that made it.
unsafe impl Send for Context<'_> {}

impl<'m> Context<'m> {
    /// A context on `model`, with a threadpool of `settings.threads` threads
    /// attached (if ggml cannot start one, llama.cpp's own per-decode threads
    /// are used, with a warning).
    pub fn new(model: &'m Weights, settings: ContextSettings) -> Result<Self, String> {
        // SAFETY: plain values out, no pointers in.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = settings.n_ctx;
        params.n_batch = settings.n_batch;
        params.n_ubatch = settings.n_ubatch;
        params.n_seq_max = settings.n_seq_max;
        params.kv_unified = settings.unified_kv;
        params.n_threads = settings.threads;
        params.n_threads_batch = settings.threads;
        params.no_perf = true;
        // SAFETY: `model.raw` is a loaded model that outlives the context
        // (the `'m` borrow); `params` are llama.cpp's defaults, adjusted.
        let raw = unsafe { sys::llama_init_from_model(model.raw.as_ptr(), params) };
        let raw = NonNull::new(raw).ok_or("llama.cpp could not create it (its log, target `llama_cpp`, says why)")?;
        // SAFETY: plain values out; the parameters are read during the call only.
        let threadpool = unsafe {
            let mut pool = sys::ggml_threadpool_params_default(settings.threads);
            NonNull::new(sys::ggml_threadpool_new(&raw mut pool))
        };
        match threadpool {
            // SAFETY: both are alive; the pool outlives the context (freed
            // after it in `drop`), and one pool serves tokens and prompts.
            Some(pool) => unsafe { sys::llama_attach_threadpool(raw.as_ptr(), pool.as_ptr(), pool.as_ptr()) },
            None => tracing::warn!(
                threads = settings.threads,
                "ggml could not start a threadpool: llama.cpp starts its threads on every decode"
            ),
        }
        Ok(Self {
            raw,
            threadpool,
            _model: PhantomData,
        })
    }

    /// Whether a threadpool is attached.
    pub fn has_threadpool(&self) -> bool {
        self.threadpool.is_some()
    }

    /// KV cells.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: a live context.
        unsafe { sys::llama_n_ctx(self.raw.as_ptr()) }
    }

    /// Most tokens per decode.
    pub fn n_batch(&self) -> u32 {
        // SAFETY: a live context.
        unsafe { sys::llama_n_batch(self.raw.as_ptr()) }
    }

    /// Most tokens per compute graph.
    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: a live context.
        unsafe { sys::llama_n_ubatch(self.raw.as_ptr()) }
    }

    /// Decodes `batch`: its tokens enter the KV cache, and the logits of the
    /// tokens marked for them become readable by [`Sampler::sample`].
    /// Returns once the backend has finished: a GPU computes after
    /// `llama_decode` returns, and the wait would otherwise fall on the first
    /// read of the logits, counted as the engine's own work.
    pub fn decode(&mut self, batch: &Batch) -> Result<(), String> {
        self.submit(batch)?;
        self.synchronize();
        Ok(())
    }

    /// Starts the decode of `batch` and returns: on a GPU, before the device
    /// has finished it (the engine does its own work meanwhile); on the
    /// CPU, once it is done. Its logits are read after [`Self::synchronize`]
    /// (`logits` also waits). llama.cpp has copied the batch when this
    /// returns.
    pub fn submit(&mut self, batch: &Batch) -> Result<(), String> {
        // SAFETY: a live context and a batch whose arrays hold `n_tokens`
        // filled entries (`Batch::push` keeps that).
        let code = unsafe { sys::llama_decode(self.raw.as_ptr(), batch.raw) };
        match code {
            0 => Ok(()),
            1 => Err("no room in the KV cache for the batch".into()),
            2 => Err("the decode was aborted".into()),
            -1 => Err("llama.cpp refused the batch".into()),
            code => Err(format!("llama_decode returned {code}")),
        }
    }

    /// Waits until the last decode has finished on its device.
    pub fn synchronize(&mut self) {
        // SAFETY: a live context.
        unsafe { sys::llama_synchronize(self.raw.as_ptr()) };
    }

    /// The logits (`n_vocab` of them) of batch index `index` of the last
    /// decode, which must be one whose logits the batch asked for.
    pub fn logits(&self, index: i32, n_vocab: i32) -> Option<&[f32]> {
        let n = usize::try_from(n_vocab).ok()?;
        // SAFETY: a live context; llama.cpp returns null for an index without
        // logits, else `n_vocab` floats that stay valid until the next decode,
        // which needs `&mut self`.
        let logits = unsafe { sys::llama_get_logits_ith(self.raw.as_ptr(), index) };
        if logits.is_null() {
            return None;
        }
        // SAFETY: see above.
        Some(unsafe { std::slice::from_raw_parts(logits, n) })
    }

    /// Frees the KV cells of sequence `seq`.
    pub fn remove_sequence(&mut self, seq: i32) -> Result<(), String> {
        // SAFETY: a live context; its memory lives as long as it.
        let removed = unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.raw.as_ptr()), seq, -1, -1) };
        if removed {
            Ok(())
        } else {
            Err(format!("llama.cpp could not remove sequence {seq}"))
        }
    }

    /// Empties the KV cache (every sequence).
    pub fn clear(&mut self) {
        // SAFETY: a live context; its memory lives as long as it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.raw.as_ptr()), true) }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: the context is freed once, then the pool it used, which
        // nothing else holds.
        unsafe {
            sys::llama_free(self.raw.as_ptr());
            if let Some(pool) = self.threadpool {
                sys::ggml_threadpool_free(pool.as_ptr());
            }
        }
    }
}

/// A batch for [`Context::decode`]: tokens, each of one sequence.
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

// SAFETY: the batch owns its arrays; nothing else points into them.
unsafe impl Send for Batch {}

/// [`Batch::push`] on a full batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the batch is full ({0} tokens)")]
pub struct BatchFull(pub usize);

impl Batch {
    /// An empty batch with room for `capacity` tokens.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, i32::MAX as usize);
        // SAFETY: allocates arrays for `capacity` tokens of one sequence id
        // each; no embeddings.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        Self { raw, capacity }
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        usize::try_from(self.raw.n_tokens).unwrap_or(0)
    }

    /// Tokens that still fit.
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.len())
    }

    /// Whether the batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the batch (its room stays).
    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Adds `token` at `position` of sequence `seq`; `logits` asks for its
    /// logits after the decode. Returns the token's index in the batch.
    pub fn push(&mut self, token: Token, position: i32, seq: i32, logits: bool) -> Result<i32, BatchFull> {
        let i = self.len();
        if i >= self.capacity {
            return Err(BatchFull(self.capacity));
        }
        // SAFETY: `i` is below the capacity the arrays were allocated with,
        // and every `seq_id[i]` points to room for one id.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = position;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = i8::from(logits);
        }
        self.raw.n_tokens += 1;
        Ok(self.raw.n_tokens - 1)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: allocated by `llama_batch_init`, freed once.
        unsafe { sys::llama_batch_free(self.raw) }
    }
}

/// One step of a [`Sampler`] chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stage<'a> {
    /// Never pick these tokens (their logits become minus infinity) out of a
    /// vocabulary of `n_vocab`.
    Ban { tokens: &'a [Token], n_vocab: i32 },
    /// The likeliest token.
    Greedy,
    /// Keep the `k` likeliest tokens.
    TopK(i32),
    /// Keep the likeliest tokens whose probabilities add up to `p` (at least one).
    TopP(f32),
    /// Divide the logits by a temperature.
    Temperature(f32),
    /// Draw from the distribution with a seeded generator.
    Draw(u32),
    /// Add a bias to the logits of some tokens, out of a vocabulary of `n_vocab`.
    Bias { biases: &'a [(Token, f32)], n_vocab: i32 },
    /// OpenAI's penalties over the last `last_n` sampled tokens: minus
    /// `frequency` per earlier occurrence, minus `presence` once if any.
    Penalties {
        n_vocab: i32,
        last_n: i32,
        frequency: f32,
        presence: f32,
    },
    /// Drop the tokens less likely than `p` times the likeliest one.
    MinP(f32),
}

/// A chain of sampling stages, with the state of its random generator.
pub struct Sampler(NonNull<sys::llama_sampler>);

// SAFETY: the chain owns its stages; nothing else points into them.
unsafe impl Send for Sampler {}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sampler")
    }
}

impl Sampler {
    /// A chain of `stages`, applied in order. A chain keeps its
    /// vocabulary-sized candidate buffer from token to token.
    pub fn chain(stages: &[Stage<'_>]) -> Self {
        Self::chain_after(None, stages)
    }

    /// A chain of `first` (a grammar, say), then `stages`.
    pub fn chain_after(first: Option<Sampler>, stages: &[Stage<'_>]) -> Self {
        // SAFETY: plain values in; returns a new chain that this value owns
        // (allocation failure aborts inside llama.cpp, as `new` does).
        let chain = unsafe { sys::llama_sampler_chain_init(sys::llama_sampler_chain_params { no_perf: true }) };
        let chain = NonNull::new(chain).unwrap_or_else(|| std::process::abort());
        if let Some(first) = first {
            let raw = first.0.as_ptr();
            // The chain owns it from here on.
            std::mem::forget(first);
            // SAFETY: a live sampler that nothing else frees.
            unsafe { sys::llama_sampler_chain_add(chain.as_ptr(), raw) };
        }
        for stage in stages {
            // SAFETY: each init returns a new stage; the chain takes
            // ownership of it.
            unsafe {
                let stage = match *stage {
                    Stage::Ban { tokens, n_vocab } => {
                        let biases: Vec<sys::llama_logit_bias> = tokens
                            .iter()
                            .map(|&token| sys::llama_logit_bias {
                                token,
                                bias: f32::NEG_INFINITY,
                            })
                            .collect();
                        // The stage copies the biases.
                        sys::llama_sampler_init_logit_bias(
                            n_vocab,
                            i32::try_from(biases.len()).unwrap_or(i32::MAX),
                            biases.as_ptr(),
                        )
                    }
                    Stage::Greedy => sys::llama_sampler_init_greedy(),
                    Stage::TopK(k) => sys::llama_sampler_init_top_k(k),
                    Stage::TopP(p) => sys::llama_sampler_init_top_p(p, 1),
                    Stage::Temperature(t) => sys::llama_sampler_init_temp(t),
                    Stage::Draw(seed) => sys::llama_sampler_init_dist(seed),
                    Stage::Bias { biases, n_vocab } => {
                        let biases: Vec<sys::llama_logit_bias> = biases
                            .iter()
                            .map(|&(token, bias)| sys::llama_logit_bias { token, bias })
                            .collect();
                        // The stage copies the biases.
                        sys::llama_sampler_init_logit_bias(
                            n_vocab,
                            i32::try_from(biases.len()).unwrap_or(i32::MAX),
                            biases.as_ptr(),
                        )
                    }
                    Stage::Penalties {
                        n_vocab,
                        last_n,
                        frequency,
                        presence,
                    } => sys::llama_sampler_init_penalties(n_vocab, last_n, 1.0, frequency, presence),
                    Stage::MinP(p) => sys::llama_sampler_init_min_p(p, 1),
                };
                sys::llama_sampler_chain_add(chain.as_ptr(), stage);
            }
        }
        Self(chain)
    }

    /// Samples from the logits of batch index `index` of the last decode and
    /// records the token in the chain's state. `index` must be a token whose
    /// logits the batch asked for ([`Batch::push`] returned it): llama.cpp
    /// aborts the process otherwise.
    /// A grammar stage: only texts of the GBNF `grammar` (root rule `root`)
    /// can be sampled, and an end-of-generation token only once the text is
    /// complete. With `triggers` (regular expressions), the grammar applies
    /// only from the first match in the generated text on (llama.cpp's lazy
    /// grammar); before that, any text. The error is llama.cpp's refusal of
    /// the grammar.
    pub fn grammar(model: &Weights, grammar: &str, triggers: &[&str]) -> Result<Self, String> {
        let text = CString::new(grammar).map_err(|_| "the grammar contains a NUL byte")?;
        let patterns = triggers
            .iter()
            .map(|t| CString::new(*t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| "a trigger contains a NUL byte")?;
        let pattern_ptrs: Vec<*const c_char> = patterns.iter().map(|p| p.as_ptr()).collect();
        // SAFETY: the vocabulary of a loaded model, NUL-terminated strings
        // alive for the call (llama.cpp copies them); a null result is a
        // grammar llama.cpp could not parse.
        let raw = unsafe {
            if triggers.is_empty() {
                sys::llama_sampler_init_grammar(self_vocab(model), text.as_ptr(), c"root".as_ptr())
            } else {
                sys::llama_sampler_init_grammar_lazy_patterns(
                    self_vocab(model),
                    text.as_ptr(),
                    c"root".as_ptr(),
                    pattern_ptrs.as_ptr().cast_mut(),
                    pattern_ptrs.len(),
                    std::ptr::null(),
                    0,
                )
            }
        };
        NonNull::new(raw)
            .map(Self)
            .ok_or_else(|| "llama.cpp refused the grammar".to_owned())
    }

    pub fn sample(&mut self, context: &Context<'_>, index: i32) -> Token {
        // SAFETY: a live chain and context.
        unsafe { sys::llama_sampler_sample(self.0.as_ptr(), context.raw.as_ptr(), index) }
    }

    /// Draws a token from one row of logits and accepts it into the chain's
    /// state, as [`Sampler::sample`] does from a context's row: every token
    /// is a candidate with its logit, the stages run in order, and the one
    /// they select is the token. Needs no context, so that several chains
    /// can draw at once on other threads. `None` if no stage selected one.
    pub fn sample_row(&mut self, logits: &[f32], candidates: &mut Candidates) -> Option<Token> {
        let cur = &mut candidates.0;
        cur.clear();
        cur.extend(
            logits
                .iter()
                .zip(0..)
                .map(|(&logit, id)| sys::llama_token_data { id, logit, p: 0.0 }),
        );
        let mut array = sys::llama_token_data_array {
            data: cur.as_mut_ptr(),
            size: cur.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: a live chain; `array` describes `cur`, which outlives the
        // call. Stages work in place: they may shrink `size` and reorder, and
        // leave `data` pointing at candidates the chain can reach.
        unsafe { sys::llama_sampler_apply(self.0.as_ptr(), &mut array) };
        let selected = usize::try_from(array.selected).ok().filter(|&i| i < array.size)?;
        // SAFETY: `selected` is below the array's size, as the chain left it.
        let token = unsafe { (*array.data.add(selected)).id };
        // SAFETY: a live chain.
        unsafe { sys::llama_sampler_accept(self.0.as_ptr(), token) };
        Some(token)
    }
}

/// Every token of the vocabulary with its logit: a chain's candidates for
/// one draw ([`Sampler::sample_row`]), kept from token to token.
#[derive(Default)]
pub struct Candidates(Vec<sys::llama_token_data>);

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: the chain frees its stages with itself; freed once.
        unsafe { sys::llama_sampler_free(self.0.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_pieces_become_lines_at_their_level() {
        let mut lines = LogLines::new();
        let mut seen = Vec::new();
        let mut push = |level, text: &str| lines.push(level, text, |level, line| seen.push((level, line.to_owned())));
        push(sys::GGML_LOG_LEVEL_WARN, "loading ");
        push(sys::GGML_LOG_LEVEL_CONT, "model...");
        push(sys::GGML_LOG_LEVEL_CONT, " done\nsecond line\n");
        push(sys::GGML_LOG_LEVEL_INFO, "no newline");
        push(sys::GGML_LOG_LEVEL_ERROR, "failed\n");
        assert_eq!(
            seen,
            [
                (sys::GGML_LOG_LEVEL_WARN, "loading model... done".to_owned()),
                (sys::GGML_LOG_LEVEL_WARN, "second line".to_owned()),
                (sys::GGML_LOG_LEVEL_INFO, "no newline".to_owned()),
                (sys::GGML_LOG_LEVEL_ERROR, "failed".to_owned()),
            ]
        );
    }

    #[test]
    fn a_batch_refuses_tokens_beyond_its_room() {
        let mut batch = Batch::new(2);
        assert!(batch.is_empty());
        assert_eq!(batch.room(), 2);
        assert_eq!(batch.push(1, 0, 0, false), Ok(0));
        assert_eq!(batch.push(2, 1, 0, true), Ok(1));
        assert_eq!(batch.push(3, 2, 0, true), Err(BatchFull(2)));
        assert_eq!((batch.len(), batch.room()), (2, 0));
        batch.clear();
        assert!(batch.is_empty());
        assert_eq!(batch.push(3, 0, 1, true), Ok(0));
    }

    #[test]
    fn unknown_chat_templates_are_an_error() {
        let messages = [("user", "hi")];
        let error = ChatTemplate::named("no-such-format").and_then(|t| t.apply(&messages, true).err());
        assert_eq!(error.as_deref(), Some("llama.cpp does not know this chat template"));
        let chatml = ChatTemplate::named("chatml").map(|t| t.apply(&messages, true));
        assert_eq!(
            chatml,
            Some(Ok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".to_owned()))
        );
        let nul = ChatTemplate::named("chatml").map(|t| t.apply(&[("user", "a\0b")], true));
        assert_eq!(nul, Some(Err("a message contains a NUL character".to_owned())));
    }
}
