//! One thread that owns the encoder and batches work across requests.
//!
//! Each job sends all of its sequences at once. The thread takes every
//! request waiting when it is free, sorts their sequences by length (so that
//! a batch pads little), runs them in batches of at most `max_batch`
//! sequences and [`BATCH_TOKENS`] padded tokens, and answers each request when its last vector is made. A
//! request whose job was cancelled meanwhile (its answer no longer awaited)
//! is dropped before it costs any work.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use crate::encoder::Encoder;

/// The vectors of one request, in its order, or why there are none.
pub type Reply = Result<Vec<Vec<f32>>, String>;

struct Request {
    sequences: Vec<Vec<u32>>,
    reply: oneshot::Sender<Reply>,
}

/// The handle of the encoder's thread (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    requests: mpsc::Sender<Request>,
    /// Forward passes run so far.
    passes: Arc<AtomicU64>,
}

impl Engine {
    /// Starts the thread that owns `encoder`.
    pub fn start(encoder: Encoder, max_batch: usize) -> std::io::Result<Self> {
        let (requests, queue) = mpsc::channel::<Request>();
        let max_batch = max_batch.max(1);
        let passes = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&passes);
        thread::Builder::new()
            .name("embed-engine".into())
            .spawn(move || serve(&encoder, &queue, max_batch, &counted))?;
        Ok(Self { requests, passes })
    }

    /// How many forward passes the engine has run: fewer than the sequences
    /// it embedded when requests shared batches.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// The vectors of `sequences` (already cut to the model's length).
    pub async fn embed(&self, sequences: Vec<Vec<u32>>) -> Reply {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request { sequences, reply })
            .map_err(|_| "the embedding engine has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the embedding engine has stopped".to_owned())?
    }
}

/// Most sequences taken into one round (the rest wait for the next).
const ROUND_SEQUENCES: usize = 8192;

/// Most padded tokens in one batch. Attention keeps a few tensors of
/// batch × heads × length² floats alive at once, so long sequences go in
/// smaller batches: 64 sequences of up to 64 tokens, 16 of 256.
const BATCH_TOKENS: usize = 4096;

/// `order` (sorted by length, shortest first) cut into batches of at most
/// `max_batch` sequences and [`BATCH_TOKENS`] padded tokens (one sequence
/// alone may pass that bound).
fn batches<T: Copy>(order: &[T], length: impl Fn(T) -> usize, max_batch: usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in 0..order.len() {
        let count = end - start + 1;
        if end > start && (count > max_batch || count * length(order[end]) > BATCH_TOKENS) {
            out.push(&order[start..end]);
            start = end;
        }
    }
    if start < order.len() {
        out.push(&order[start..]);
    }
    out
}

fn serve(encoder: &Encoder, queue: &mpsc::Receiver<Request>, max_batch: usize, passes: &AtomicU64) {
    while let Ok(first) = queue.recv() {
        let mut round = vec![first];
        let mut count = round[0].sequences.len();
        while count < ROUND_SEQUENCES {
            match queue.try_recv() {
                Ok(request) => {
                    count += request.sequences.len();
                    round.push(request);
                }
                Err(_) => break,
            }
        }
        round.retain(|request| !request.reply.is_closed());
        run_round(encoder, round, max_batch, passes);
    }
}

fn run_round(encoder: &Encoder, round: Vec<Request>, max_batch: usize, passes: &AtomicU64) {
    // Every sequence of the round as (request, position), shortest first.
    let mut order: Vec<(usize, usize)> = round
        .iter()
        .enumerate()
        .flat_map(|(r, request)| (0..request.sequences.len()).map(move |i| (r, i)))
        .collect();
    order.sort_by_key(|&(r, i)| round[r].sequences[i].len());
    let mut vectors: Vec<Vec<Vec<f32>>> = round.iter().map(|r| vec![Vec::new(); r.sequences.len()]).collect();
    let mut failure = None;
    for batch in batches(&order, |(r, i)| round[r].sequences[i].len() + 2, max_batch) {
        let sequences: Vec<&[u32]> = batch.iter().map(|&(r, i)| round[r].sequences[i].as_slice()).collect();
        passes.fetch_add(1, Ordering::Relaxed);
        match encoder.embed(&sequences) {
            Ok(made) => {
                for (&(r, i), vector) in batch.iter().zip(made) {
                    vectors[r][i] = vector;
                }
            }
            Err(error) => {
                tracing::error!(%error, "embedding batch failed");
                failure = Some(error);
                break;
            }
        }
    }
    for (request, made) in round.into_iter().zip(vectors) {
        let reply = match &failure {
            Some(error) => Err(error.clone()),
            None => Ok(made),
        };
        let _ = request.reply.send(reply);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_bounded_in_sequences_and_padded_tokens() {
        let lengths: Vec<usize> = [10; 100].into_iter().chain([100; 50]).chain([258]).collect();
        let sizes: Vec<usize> = batches(&lengths, |n| n, 64).iter().map(|b| b.len()).collect();
        // 64 + 36 short ones; the first batch of long ones takes 4 short
        // ones too (40 sequences of up to 100 tokens); then 40 at most.
        assert_eq!(sizes.iter().sum::<usize>(), 151);
        for batch in batches(&lengths, |n| n, 64) {
            let longest = batch.iter().copied().max().unwrap();
            assert!(
                batch.len() <= 64 && (batch.len() * longest <= BATCH_TOKENS || batch.len() == 1),
                "{batch:?}"
            );
        }
        assert_eq!(sizes[0], 64);
        assert_eq!(batches(&[5000], |n| n, 64).len(), 1);
        assert!(batches(&[] as &[usize], |n| n, 64).is_empty());
    }
}
