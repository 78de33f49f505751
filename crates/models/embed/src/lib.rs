//! Sentence embeddings: a sentence-transformers BERT model (all-MiniLM-L6-v2)
//! on candle, as a Gantry worker.
//!
//! A job's input is `{"input": ...}` in OpenAI's shapes (one string, a list
//! of strings, a list of token ids, or a list of such lists), with optional
//! `encoding_format` (`float` or `base64`), `dimensions` (only the model's
//! own) and `truncate` (default true: inputs longer than the model reads are
//! cut; false refuses them). Its output:
//!
//! ```json
//! {"embeddings": [[0.01, ...], ...], "dimensions": 384,
//!  "usage": {"input_tokens": 12}, "truncated": []}
//! ```
//!
//! `input_tokens` counts the text tokens the model read (after any cut,
//! without the `[CLS]` and `[SEP]` every sequence gets); the job is billed
//! that many `tokens`. `truncated` lists the positions of the inputs that
//! were cut. Sequences of all the jobs in flight are batched together on one
//! engine thread (see [`engine`]).
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use gantry_worker_sdk::{JobContext, JobError, Model, Output, Usage, WorkerConfig, WorkerRuntime};
use serde_json::{Value, json};

pub mod bert;
pub mod encoder;
pub mod engine;
mod factory;
pub mod input;
pub mod tokenizer;

pub use encoder::{Encoder, LoadError};
pub use engine::Engine;
pub use factory::{EmbeddingFactory, EmbeddingSettings};
pub use input::{Encoding, Inputs};
pub use tokenizer::Tokenizer;

/// How a model runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most sequences in one forward pass.
    pub max_batch: usize,
    /// CUDA device ordinal (needs the `cuda` feature); `None`: the CPU.
    pub cuda_device: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_batch: 64,
            cuda_device: None,
        }
    }
}

/// A loaded embedding model.
pub struct EmbeddingModel {
    id: String,
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    dimensions: usize,
    max_text_tokens: usize,
}

impl EmbeddingModel {
    /// Loads model `id` from the sentence-transformers directory `dir`.
    pub fn load(id: &str, dir: &Path, options: &Options) -> Result<Self, LoadError> {
        let device = match options.cuda_device {
            None => candle_core::Device::Cpu,
            Some(ordinal) => candle_core::Device::new_cuda(ordinal)
                .map_err(|e| LoadError(format!("no CUDA device {ordinal}: {e}")))?,
        };
        let encoder = Encoder::load(dir, device)?;
        let tokenizer = Arc::new(encoder.tokenizer().clone());
        let dimensions = encoder.dimensions();
        let max_text_tokens = encoder.max_text_tokens();
        let engine = Engine::start(encoder, options.max_batch)
            .map_err(|e| LoadError(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            id: id.to_owned(),
            engine,
            tokenizer,
            dimensions,
            max_text_tokens,
        })
    }

    /// Length of each vector.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Most text tokens one input is read to.
    pub fn max_text_tokens(&self) -> usize {
        self.max_text_tokens
    }

    /// The sizes its files give, as a manifest entry states them.
    pub fn sizes(&self) -> input::Sizes {
        input::Sizes {
            dimensions: self.dimensions,
            vocab_size: self.tokenizer.vocab_size(),
            // The text tokens and `[CLS]`, `[SEP]`.
            max_tokens: self.max_text_tokens + 2,
        }
    }

    /// The engine that runs this model's forward passes.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The vectors of `texts` (cut to the model's length), in order.
    pub async fn embed_texts(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let texts = Inputs::Texts(texts.iter().map(|&t| t.to_owned()).collect());
        let (sequences, _) = prepare(&self.tokenizer, texts, self.max_text_tokens, true)?;
        self.engine.embed(sequences).await
    }
}

/// A [`WorkerRuntime`] serving `model` with `config`.
pub fn runtime(model: EmbeddingModel, config: WorkerConfig) -> WorkerRuntime<EmbeddingModel> {
    WorkerRuntime::new(model, config)
}

/// The token ids of every input, cut to `max` (or refused when too long and
/// `truncate` is off), with the positions of the inputs that were cut.
fn prepare(
    tokenizer: &Tokenizer,
    inputs: Inputs,
    max: usize,
    truncate: bool,
) -> Result<(Vec<Vec<u32>>, Vec<usize>), String> {
    let mut sequences = match inputs {
        Inputs::Texts(texts) => texts.iter().map(|text| tokenizer.encode(text)).collect(),
        Inputs::Tokens(tokens) => tokens,
    };
    let long: Vec<usize> = (0..sequences.len()).filter(|&i| sequences[i].len() > max).collect();
    if !truncate && !long.is_empty() {
        let listed: Vec<String> = long
            .iter()
            .map(|&i| format!("input[{i}] has {} tokens", sequences[i].len()))
            .collect();
        return Err(format!(
            "{}; this model reads at most {max} tokens per input (leave `truncate` on to cut longer inputs)",
            listed.join(", ")
        ));
    }
    for &i in &long {
        sequences[i].truncate(max);
    }
    Ok((sequences, long))
}

fn encode_vector(vector: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(vector),
        Encoding::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

impl Model for EmbeddingModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let request = input::parse(&input, self.dimensions, self.tokenizer.vocab_size()).map_err(JobError::BadInput)?;
        let tokenizer = Arc::clone(&self.tokenizer);
        let max = self.max_text_tokens;
        let (sequences, truncated) =
            tokio::task::spawn_blocking(move || prepare(&tokenizer, request.inputs, max, request.truncate))
                .await
                .map_err(|e| JobError::internal(format!("tokenizer: {e}")))?
                .map_err(JobError::BadInput)?;
        let tokens: usize = sequences.iter().map(Vec::len).sum();
        let vectors = tokio::select! {
            made = self.engine.embed(sequences) => made.map_err(JobError::Internal)?,
            () = ctx.cancelled() => return Err(JobError::Cancelled),
        };
        let embeddings: Vec<Value> = vectors.iter().map(|v| encode_vector(v, request.encoding)).collect();
        let output = json!({
            "embeddings": embeddings,
            "dimensions": self.dimensions,
            "usage": {"input_tokens": tokens},
            "truncated": truncated,
        });
        Ok(Output::new(output, Usage::whole("tokens", tokens as u64)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_little_endian_f32() {
        let encoded = encode_vector(&[1.0, -2.5], Encoding::Base64);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap();
        assert_eq!(bytes, [0, 0, 128, 63, 0, 0, 32, 192]);
        assert_eq!(encode_vector(&[0.5], Encoding::Float), json!([0.5]));
    }
}
