//! The engine thread: one llama context, continuous batching.
//!
//! The thread owns the context. Requests arrive on a channel; every loop
//! iteration
//!
//! 1. takes new requests and admits waiting ones, in order, while a sequence
//!    id and enough of the token budget are free (a sequence reserves its
//!    prompt plus `max_tokens`);
//! 2. builds one batch with the next token of every generating sequence and,
//!    in the room left, the next chunk of prompts still being read;
//! 3. starts its decode and, while a GPU decodes it, releases the text of
//!    the tokens drawn at the last step (streams it, looks for stop
//!    strings);
//! 4. once the decode is done, retires the sequences that text or their
//!    length ended, freeing their KV cells so waiting requests can join
//!    before the next step, and draws the next token of every sequence that
//!    has logits, each with its own sampler chain: several at once on the
//!    engine's sampling threads where it has them (by default when layers
//!    are on a GPU, whose decode leaves the CPU idle), else one after
//!    another. An end-of-generation token ends its sequence at once; the
//!    text of any other waits for the next step's decode.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use gantry_worker_sdk::{CancellationToken, JobError};
use tokio::sync::mpsc;

use crate::LoadError;
use crate::draw::Drawer;
use crate::input::Sampling;
use crate::llama::{Batch, BatchFull, Candidates, Context, ContextSettings, Sampler, Stage, Token, Weights};
use crate::logprobs::TokenLogprob;
use crate::stream::TextStream;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// A generation request, already tokenized and checked against the context.
#[derive(Debug)]
pub struct Request {
    pub prompt: Vec<Token>,
    pub max_tokens: u32,
    /// How the request draws its tokens: its own sampler chain (grammar
    /// and penalties keep state), or a plain pass over the logits.
    pub sampler: Drawer,
    pub stop: Vec<String>,
    /// `Some(k)`: report each token's log-probability and its `k` likeliest
    /// alternatives.
    pub logprobs: Option<u32>,
}

impl Request {
    /// Tokens of the budget this request holds while it runs.
    fn reservation(&self) -> u64 {
        self.prompt.len() as u64 + u64::from(self.max_tokens)
    }
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub text: String,
    /// Generated token ids (without the end-of-generation token).
    pub tokens: Vec<i32>,
    pub prompt_tokens: usize,
    pub finish_reason: FinishReason,
}

/// What one generated token released: text (possibly empty: held back, or
/// a stop string) and, when asked for, the token's log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Emitted {
    pub piece: String,
    pub logprob: Option<TokenLogprob>,
}

/// Where the engine tells a request's owner what happens, on two channels:
/// the emitted pieces in order, and then the end, each tagged with the
/// request's index (several requests, the choices of one job, may share
/// the channels). Sending a piece wakes the owner only if it is waiting for
/// one, so an owner that gathers pieces over an interval sleeps through
/// them (see `TextModel::complete`); the end always wakes it.
#[derive(Debug, Clone)]
pub struct Listener {
    pub index: usize,
    pub pieces: mpsc::UnboundedSender<(usize, Emitted)>,
    pub done: mpsc::UnboundedSender<(usize, Result<Finished, JobError>)>,
}

/// The receiving ends of a [`Listener`].
#[derive(Debug)]
pub struct Submission {
    /// The emitted pieces, in order per request (never both empty); all of a
    /// request's are sent before its end.
    pub pieces: mpsc::UnboundedReceiver<(usize, Emitted)>,
    /// The results. Closed without one: the engine died.
    pub done: mpsc::UnboundedReceiver<(usize, Result<Finished, JobError>)>,
}

impl Submission {
    /// A listener for request `index` and the submission that hears it.
    pub fn channel() -> (Listener, Self) {
        let (pieces, pieces_rx) = mpsc::unbounded_channel();
        let (done, done_rx) = mpsc::unbounded_channel();
        (
            Listener { index: 0, pieces, done },
            Self {
                pieces: pieces_rx,
                done: done_rx,
            },
        )
    }
}

struct Job {
    request: Request,
    cancel: CancellationToken,
    listener: Listener,
    queued_at: Instant,
}

impl Job {
    /// Cancelled, or nobody is listening any more.
    fn is_abandoned(&self) -> bool {
        self.cancel.is_cancelled() || self.listener.done.is_closed()
    }

    /// Tells the owner how the request ended.
    fn end(self, result: Result<Finished, JobError>) {
        let _ = self.listener.done.send((self.listener.index, result));
    }
}

/// Context settings, already resolved (threads > 0 etc.).
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    pub threads: i32,
    /// Threads that draw the tokens of a step's sequences; 1 draws them on
    /// the engine thread.
    pub sampling_threads: usize,
    pub context_tokens: u32,
    pub max_sequences: u32,
    pub batch_tokens: u32,
}

impl EngineConfig {
    fn context_settings(&self) -> ContextSettings {
        ContextSettings {
            n_ctx: self.context_tokens,
            n_batch: self.batch_tokens,
            n_ubatch: self.batch_tokens.min(512),
            n_seq_max: self.max_sequences,
            // One pool of KV cells shared by all sequences, so the budget is
            // shared too (otherwise each sequence gets n_ctx / n_seq_max).
            unified_kv: true,
            threads: self.threads,
        }
    }
}

/// Where an engine's steps spend their time, summed since it started: the
/// decode (llama.cpp's work, on the CPU's threads or the GPU) and the rest
/// (building the batch, drawing tokens, streaming, bookkeeping), which is
/// the engine's own work on the critical path of every step.
#[derive(Debug, Default)]
pub struct StepTimes {
    steps: AtomicU64,
    decode_ns: AtomicU64,
    other_ns: AtomicU64,
    draws: AtomicU64,
}

/// A reading of [`StepTimes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTotals {
    pub steps: u64,
    pub decode_ns: u64,
    pub other_ns: u64,
    /// Tokens drawn (sequences that had logits, over all steps).
    pub draws: u64,
}

impl StepTotals {
    /// What happened between `earlier` and this reading.
    pub fn since(self, earlier: StepTotals) -> StepTotals {
        StepTotals {
            steps: self.steps - earlier.steps,
            decode_ns: self.decode_ns - earlier.decode_ns,
            other_ns: self.other_ns - earlier.other_ns,
            draws: self.draws - earlier.draws,
        }
    }
}

impl StepTimes {
    fn record(&self, decode_ns: u64, other_ns: u64, draws: u64) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.decode_ns.fetch_add(decode_ns, Ordering::Relaxed);
        self.other_ns.fetch_add(other_ns, Ordering::Relaxed);
        self.draws.fetch_add(draws, Ordering::Relaxed);
    }

    pub fn totals(&self) -> StepTotals {
        StepTotals {
            steps: self.steps.load(Ordering::Relaxed),
            decode_ns: self.decode_ns.load(Ordering::Relaxed),
            other_ns: self.other_ns.load(Ordering::Relaxed),
            draws: self.draws.load(Ordering::Relaxed),
        }
    }
}

/// The handle the rest of the crate uses: submit requests, get events.
///
/// Dropping it stops the engine and waits for its thread: the thread ends
/// the requests still queued or running (their submissions were dropped
/// with the model), frees its llama.cpp context, and lets go of the
/// weights, so a model that is dropped has given its memory (on a GPU too)
/// back before the drop returns, and before the process exits.
#[derive(Debug)]
pub struct EngineHandle {
    inbox: std_mpsc::Sender<Job>,
    times: Arc<StepTimes>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // A sender that leads nowhere replaces the inbox's last one, which
        // the engine sees as the end of its requests.
        drop(std::mem::replace(&mut self.inbox, std_mpsc::channel().0));
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the text engine's thread panicked");
        }
    }
}

impl EngineHandle {
    /// Starts the engine thread for `model` and waits until its context
    /// exists.
    pub fn start(model: Arc<Weights>, config: EngineConfig, name: &str) -> Result<Self, LoadError> {
        let (inbox, requests) = std_mpsc::channel();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let times = Arc::new(StepTimes::default());
        let pool = match config.sampling_threads {
            0 | 1 => None,
            threads => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name({
                        let name = name.to_owned();
                        move |i| format!("text-draw-{name}-{i}")
                    })
                    .build()
                    .map_err(|e| LoadError::Context(format!("cannot start the sampling threads: {e}")))?,
            ),
        };
        let engine_times = Arc::clone(&times);
        let thread = std::thread::Builder::new()
            .name(format!("text-engine-{name}"))
            .spawn(move || engine_thread(model, config, pool, engine_times, &requests, &ready_tx))
            .map_err(|e| LoadError::Context(format!("cannot start the engine thread: {e}")))?;
        let started = ready_rx.recv();
        let handle = Self {
            inbox,
            times,
            thread: Some(thread),
        };
        match started {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(LoadError::Context("the engine thread stopped while starting".into())),
        }
    }

    /// Queues `request`; its pieces and its end arrive on the returned
    /// [`Submission`]. Cancelling `cancel` or dropping the submission's `done`
    /// stops the sequence at its next token.
    #[cfg(test)]
    pub fn submit(&self, request: Request, cancel: CancellationToken) -> Submission {
        let (listener, submission) = Submission::channel();
        self.submit_to(request, cancel, listener);
        submission
    }

    /// Where the engine's steps have spent their time so far.
    pub fn step_times(&self) -> StepTotals {
        self.times.totals()
    }

    /// Queues `request`, telling `listener` what happens.
    pub fn submit_to(&self, request: Request, cancel: CancellationToken, listener: Listener) {
        let job = Job {
            request,
            cancel,
            listener,
            queued_at: Instant::now(),
        };
        if let Err(std_mpsc::SendError(job)) = self.inbox.send(job) {
            job.end(Err(JobError::internal("the text engine is not running")));
        }
    }
}

fn engine_thread(
    model: Arc<Weights>,
    config: EngineConfig,
    pool: Option<rayon::ThreadPool>,
    times: Arc<StepTimes>,
    requests: &std_mpsc::Receiver<Job>,
    ready: &std_mpsc::SyncSender<Result<(), LoadError>>,
) {
    let context = match Context::new(&model, config.context_settings()).map_err(LoadError::Context) {
        Ok(context) => context,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    tracing::debug!(
        n_ctx = context.n_ctx(),
        n_batch = context.n_batch(),
        n_ubatch = context.n_ubatch(),
        threadpool = context.has_threadpool(),
        "text engine context ready"
    );
    let _ = ready.send(Ok(()));
    let totals = Arc::clone(&times);
    // Serving consumes the engine: its context is freed when it returns,
    // before this thread's share of the weights.
    Engine::new(&model, context, config, pool, times).serve(requests);
    // Where its steps went over its life (what bench/gpu reads).
    let spent = totals.totals();
    tracing::info!(
        steps = spent.steps,
        decode_ms = spent.decode_ns / 1_000_000,
        other_ms = spent.other_ns / 1_000_000,
        draws = spent.draws,
        "text engine stopped; its context is freed"
    );
}

/// A running sequence.
struct Sequence {
    id: i32,
    job: Job,
    /// Prompt tokens already in the batch of some decode.
    prefilled: usize,
    /// Tokens of this sequence in the KV cache (= next position).
    position: i32,
    /// Sampled token to feed in the next decode.
    next_input: Option<Token>,
    /// Index in the current batch whose logits this sequence samples from.
    logits_at: Option<i32>,
    /// The token drawn from those logits, this step.
    drawn: Option<Token>,
    /// The last token drawn, whose text is released (streamed, checked for
    /// stop strings) while the next decode runs, and its log-probability
    /// when asked for (read before that decode overwrites the logits).
    pending: Option<(Token, Option<TokenLogprob>)>,
    /// `pending` is the last token `max_tokens` allows: the sequence ends
    /// once its text is released.
    finishing: bool,
    /// Its sampler chain's candidates, kept from token to token.
    candidates: Candidates,
    generated: Vec<i32>,
    text: TextStream,
    started_at: Instant,
}

impl Sequence {
    fn send(&self, piece: String, logprob: Option<TokenLogprob>) {
        if piece.is_empty() && logprob.is_none() {
            return;
        }
        // a closed channel is noticed before the next step (`is_abandoned`)
        let _ = self
            .job
            .listener
            .pieces
            .send((self.job.listener.index, Emitted { piece, logprob }));
    }
}

struct Engine<'m> {
    model: &'m Weights,
    context: Context<'m>,
    batch: Batch,
    /// The text of the token being sampled (reused).
    piece: Vec<u8>,
    budget: u64,
    reserved: u64,
    free_ids: Vec<i32>,
    waiting: VecDeque<Job>,
    active: Vec<Sequence>,
    /// Sequences whose end was found while a decode ran (a stop string in
    /// the text released then, or their last token): retired, and their
    /// owners told, once it has finished, since their KV cells must not
    /// change under it.
    ended: Vec<(i32, FinishReason)>,
    /// End-of-turn tokens the GGUF does not mark as end of generation.
    extra_eog: Vec<Token>,
    /// Where the sequences of a step draw their tokens at once (none: one
    /// after another, on this thread).
    pool: Option<rayon::ThreadPool>,
    times: Arc<StepTimes>,
}

impl<'m> Engine<'m> {
    fn new(
        model: &'m Weights,
        context: Context<'m>,
        config: EngineConfig,
        pool: Option<rayon::ThreadPool>,
        times: Arc<StepTimes>,
    ) -> Self {
        let max_sequences = i32::try_from(config.max_sequences).unwrap_or(i32::MAX);
        let extra_eog = crate::family_end_of_turn(model);
        Self {
            model,
            context,
            batch: Batch::new(config.batch_tokens as usize),
            piece: Vec::new(),
            budget: u64::from(config.context_tokens),
            reserved: 0,
            // popped from the end: hand out 0, 1, 2, ... first
            free_ids: (0..max_sequences).rev().collect(),
            waiting: VecDeque::new(),
            active: Vec::new(),
            ended: Vec::new(),
            extra_eog,
            pool,
            times,
        }
    }

    fn serve(mut self, requests: &std_mpsc::Receiver<Job>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                match requests.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    // the model was dropped and nothing is left to do
                    Err(_) => break,
                }
            }
            while let Ok(job) = requests.try_recv() {
                self.waiting.push_back(job);
            }
            self.drop_abandoned();
            self.admit();
            if !self.active.is_empty() {
                // A bug must not take the engine down with it: fail the
                // sequences of this step, start from a clean cache, go on.
                let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
                if stepped.is_err() {
                    // A decode may still run: its cells change only after it.
                    self.context.synchronize();
                    self.ended.clear();
                    self.fail_all("the text engine panicked");
                    self.context.clear();
                }
            }
        }
    }

    /// Ends cancelled requests, waiting or running.
    fn drop_abandoned(&mut self) {
        for job in std::mem::take(&mut self.waiting) {
            if job.is_abandoned() {
                job.end(Err(JobError::Cancelled));
            } else {
                self.waiting.push_back(job);
            }
        }
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].job.is_abandoned() {
                let sequence = self.retire(i);
                tracing::debug!(
                    seq = sequence.id,
                    generated = sequence.generated.len(),
                    "sequence cancelled"
                );
                sequence.job.end(Err(JobError::Cancelled));
            } else {
                i += 1;
            }
        }
    }

    /// Starts waiting requests, oldest first, while they fit.
    fn admit(&mut self) {
        while let Some(job) = self.waiting.front() {
            let need = job.request.reservation();
            if self.free_ids.is_empty() || self.reserved + need > self.budget {
                break;
            }
            let Some(job) = self.waiting.pop_front() else { break };
            let Some(id) = self.free_ids.pop() else { break };
            self.reserved += need;
            tracing::debug!(
                seq = id,
                prompt_tokens = job.request.prompt.len(),
                max_tokens = job.request.max_tokens,
                queued_ms = job.queued_at.elapsed().as_millis() as u64,
                "sequence admitted"
            );
            self.active.push(Sequence {
                id,
                text: TextStream::new(job.request.stop.clone()),
                job,
                prefilled: 0,
                position: 0,
                next_input: None,
                logits_at: None,
                drawn: None,
                pending: None,
                finishing: false,
                candidates: Candidates::default(),
                generated: Vec::new(),
                started_at: Instant::now(),
            });
        }
    }

    /// Removes sequence `i`, freeing its KV cells, id and reservation.
    fn retire(&mut self, i: usize) -> Sequence {
        let sequence = self.active.remove(i);
        if let Err(error) = self.context.remove_sequence(sequence.id) {
            tracing::error!(seq = sequence.id, %error, "cannot free the KV cells of a sequence");
        }
        self.free_ids.push(sequence.id);
        self.reserved -= sequence.job.request.reservation();
        sequence
    }

    /// One decode of all active sequences, then sampling. While the decode
    /// runs (on a GPU, after `submit` returns), the text of the tokens drawn
    /// at the last step is released; the tokens of this one are drawn once
    /// it has finished. So the engine's own work on the critical path of a
    /// step is building the batch and drawing; streaming is off it. A
    /// sequence that a stop string ends is in this decode already: its
    /// token of it is dropped with its cells.
    fn step(&mut self) {
        let started = Instant::now();
        if let Err(error) = self.fill_batch() {
            self.fail_all(&format!("cannot build the batch: {error}"));
            return;
        }
        if self.batch.is_empty() {
            // Nothing to decode: what the last step drew ends now.
            self.release_pending();
            self.retire_ended();
            return;
        }
        let submitted = Instant::now();
        if let Err(error) = self.context.submit(&self.batch) {
            self.fail_all(&format!("llama.cpp decode failed: {error}"));
            return;
        }
        let mut decode = submitted.elapsed();
        self.release_pending();
        let waited = Instant::now();
        self.context.synchronize();
        decode += waited.elapsed();
        self.retire_ended();
        let draws = self.draw_all();
        self.take_draws();
        let total = started.elapsed();
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.times
            .record(nanos(decode), nanos(total.saturating_sub(decode)), draws);
    }

    /// Each sequence with logits this step draws its next token with its own
    /// sampler chain, into `drawn`: on the sampling threads when several do,
    /// else here. The rows of logits are read here first (the context's reads
    /// are for one thread); a chain needs only its row. Returns how many drew.
    fn draw_all(&mut self) -> u64 {
        let n_vocab = self.model.n_vocab();
        let context = &self.context;
        let mut work: Vec<(&mut Sequence, &[f32])> = Vec::with_capacity(self.active.len());
        for sequence in &mut self.active {
            sequence.drawn = None;
            if let Some(row) = sequence.logits_at.and_then(|index| context.logits(index, n_vocab)) {
                work.push((sequence, row));
            }
        }
        let draw = |(sequence, row): &mut (&mut Sequence, &[f32])| {
            sequence.drawn = sequence.job.request.sampler.draw(row, &mut sequence.candidates);
        };
        match &self.pool {
            Some(pool) if work.len() > 1 => {
                use rayon::iter::{IntoParallelRefMutIterator, ParallelIterator};
                pool.install(|| work.par_iter_mut().for_each(draw));
            }
            _ => work.iter_mut().for_each(draw),
        }
        work.len() as u64
    }

    fn fill_batch(&mut self) -> Result<(), BatchFull> {
        self.batch.clear();
        // generating sequences first: one token each
        for sequence in &mut self.active {
            sequence.logits_at = None;
            if let Some(token) = sequence.next_input.take() {
                sequence.logits_at = Some(self.batch.push(token, sequence.position, sequence.id, true)?);
                sequence.position += 1;
            }
        }
        // then prompts, in admission order, in the room left
        for sequence in &mut self.active {
            let room = self.batch.room();
            if room == 0 {
                break;
            }
            let prompt = &sequence.job.request.prompt;
            if sequence.prefilled >= prompt.len() {
                continue;
            }
            let take = (prompt.len() - sequence.prefilled).min(room);
            for (offset, &token) in prompt[sequence.prefilled..sequence.prefilled + take].iter().enumerate() {
                let is_last = sequence.prefilled + offset + 1 == prompt.len();
                let index = self.batch.push(token, sequence.position, sequence.id, is_last)?;
                if is_last {
                    sequence.logits_at = Some(index);
                }
                sequence.position += 1;
            }
            sequence.prefilled += take;
        }
        Ok(())
    }

    /// Takes each sequence's drawn token: an end-of-generation token ends
    /// it now (nothing of it is pending); another becomes its next input
    /// (unless it is the last `max_tokens` allows) and its pending text,
    /// released during the next decode.
    fn take_draws(&mut self) {
        let model = self.model;
        let mut i = 0;
        while i < self.active.len() {
            let sequence = &mut self.active[i];
            let Some(index) = sequence.logits_at.take() else {
                i += 1;
                continue;
            };
            let Some(token) = sequence.drawn.take() else {
                // No logits for it, or a chain that chose nothing: a bug
                // of this sequence's, not the others'.
                let sequence = self.retire(i);
                sequence.job.end(Err(JobError::internal("the sampler drew no token")));
                continue;
            };
            if model.is_end_of_generation(token) || self.extra_eog.contains(&token) {
                let sequence = self.retire(i);
                finish_sequence(sequence, FinishReason::Stop);
                continue;
            }
            // Now: the next decode overwrites the logits.
            let logprob = sequence.job.request.logprobs.and_then(|top| {
                self.context
                    .logits(index, model.n_vocab())
                    .map(|logits| TokenLogprob::of(model, logits, token, top as usize))
            });
            sequence.generated.push(token);
            sequence.pending = Some((token, logprob));
            if sequence.generated.len() >= sequence.job.request.max_tokens as usize {
                sequence.finishing = true;
            } else {
                sequence.next_input = Some(token);
            }
            i += 1;
        }
    }

    /// Releases the text of each sequence's pending token (streams it, and
    /// looks for its stop strings), and notes the sequences this ends, to
    /// be retired by [`Self::retire_ended`] once no decode runs.
    fn release_pending(&mut self) {
        let model = self.model;
        for sequence in &mut self.active {
            let Some((token, logprob)) = sequence.pending.take() else {
                continue;
            };
            self.piece.clear();
            model.piece(token, false, &mut self.piece);
            let released = sequence.text.push(&self.piece);
            sequence.send(released.piece, logprob);
            if released.stopped {
                self.ended.push((sequence.id, FinishReason::Stop));
            } else if sequence.finishing {
                self.ended.push((sequence.id, FinishReason::Length));
            }
        }
    }

    /// Retires the sequences [`Self::release_pending`] ended and tells
    /// their owners; their logits of the decode just done are not drawn.
    fn retire_ended(&mut self) {
        for (id, reason) in std::mem::take(&mut self.ended) {
            if let Some(i) = self.active.iter().position(|s| s.id == id) {
                let sequence = self.retire(i);
                finish_sequence(sequence, reason);
            }
        }
    }

    fn fail_all(&mut self, message: &str) {
        tracing::error!(sequences = self.active.len(), "{message}");
        while !self.active.is_empty() {
            let sequence = self.retire(0);
            sequence.job.end(Err(JobError::internal(message)));
        }
    }
}

fn finish_sequence(mut sequence: Sequence, reason: FinishReason) {
    let last = sequence.text.finish();
    sequence.send(last, None);
    let elapsed = sequence.started_at.elapsed();
    let generated = sequence.generated.len();
    tracing::debug!(
        seq = sequence.id,
        prompt_tokens = sequence.job.request.prompt.len(),
        generated,
        finish_reason = reason.as_str(),
        tokens_per_s = generated as f64 / elapsed.as_secs_f64().max(1e-9),
        "sequence finished"
    );
    let finished = Finished {
        text: sequence.text.text().to_owned(),
        prompt_tokens: sequence.job.request.prompt.len(),
        tokens: std::mem::take(&mut sequence.generated),
        finish_reason: reason,
    };
    sequence.job.end(Ok(finished));
}

/// How a request with `sampling` draws. Temperature 0 is argmax, exactly
/// like llama.cpp's greedy decoding. A request that asks for nothing beyond
/// a temperature (and perhaps `ignore_eos`) draws with a plain pass over its
/// logits ([`Drawer::argmax`], [`Drawer::softmax`]); any other gets
/// llama.cpp's chain. (A chain keeps its vocabulary-sized candidate buffer
/// between tokens, where a lone sampler gets a fresh one, 600 KB for
/// SmolLM2, freshly mapped and page-faulted, on every token.)
///
/// `grammar` comes first, so that nothing after it can pick a token it
/// forbids; then `ban` (the end-of-generation tokens and the vocabulary's
/// size, for `ignore_eos`), the logit biases and the penalties (over the
/// last `window` tokens), then the truncations and the draw, in llama.cpp's
/// own order.
pub fn sampler(
    sampling: &Sampling,
    grammar: Option<Sampler>,
    ban: Option<(&[Token], i32)>,
    n_vocab: i32,
    window: u32,
) -> Drawer {
    let plain = grammar.is_none()
        && sampling.logit_bias.is_empty()
        && sampling.presence_penalty == 0.0
        && sampling.frequency_penalty == 0.0
        && (sampling.is_greedy() || (sampling.top_k == 0 && sampling.top_p >= 1.0 && sampling.min_p <= 0.0));
    if plain {
        let banned = ban.map_or(&[][..], |(tokens, _)| tokens);
        return if sampling.is_greedy() {
            Drawer::argmax(banned)
        } else {
            Drawer::softmax(sampling.temperature, sampling.seed.unwrap_or_else(random_seed), banned)
        };
    }
    let mut chain = Vec::with_capacity(8);
    if let Some((tokens, n_vocab)) = ban {
        chain.push(Stage::Ban { tokens, n_vocab });
    }
    if !sampling.logit_bias.is_empty() {
        chain.push(Stage::Bias {
            biases: &sampling.logit_bias,
            n_vocab,
        });
    }
    if sampling.presence_penalty != 0.0 || sampling.frequency_penalty != 0.0 {
        chain.push(Stage::Penalties {
            n_vocab,
            last_n: i32::try_from(window).unwrap_or(i32::MAX),
            frequency: sampling.frequency_penalty,
            presence: sampling.presence_penalty,
        });
    }
    if sampling.is_greedy() {
        chain.push(Stage::Greedy);
        return Drawer::Chain(Sampler::chain_after(grammar, &chain));
    }
    if sampling.top_k > 0 {
        chain.push(Stage::TopK(i32::try_from(sampling.top_k).unwrap_or(i32::MAX)));
    }
    if sampling.top_p < 1.0 {
        chain.push(Stage::TopP(sampling.top_p));
    }
    if sampling.min_p > 0.0 {
        chain.push(Stage::MinP(sampling.min_p));
    }
    chain.push(Stage::Temperature(sampling.temperature));
    chain.push(Stage::Draw(seed32(sampling.seed.unwrap_or_else(random_seed))));
    Drawer::Chain(Sampler::chain_after(grammar, &chain))
}

/// Folds a 64-bit seed into llama.cpp's 32 bits, avoiding `u32::MAX`, which
/// llama.cpp reads as "pick a random seed".
fn seed32(seed: u64) -> u32 {
    let folded = (seed ^ (seed >> 32)) as u32;
    if folded == u32::MAX { folded - 1 } else { folded }
}

pub(crate) fn random_seed() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_fold_into_32_bits() {
        assert_eq!(seed32(0), 0);
        assert_eq!(seed32(42), 42);
        assert_ne!(seed32(u64::from(u32::MAX)), u32::MAX);
        assert_ne!(seed32(1 << 32), seed32(2 << 32));
        assert_ne!(random_seed(), random_seed());
    }
}
