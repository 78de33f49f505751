//! The encoder: a BERT model read from a sentence-transformers directory,
//! mean pooling over the real tokens and L2 normalization. On the CPU the
//! network is [`crate::bert`] (unpadded batches on packed kernels); on a
//! GPU it is candle-transformers' BERT on batches padded to the longest.
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, HiddenAct};
use serde::Deserialize;

use crate::bert::{Bert, Shape};
use crate::tokenizer::Tokenizer;

/// Why a model directory cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// How sentence-transformers pools the token vectors (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The average of the real (not padding) tokens' vectors.
    Mean,
    /// The `[CLS]` token's vector.
    Cls,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: usize,
}

#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

/// What runs the network: Gantry's own BERT on the CPU, or
/// candle-transformers' on a GPU (or when asked, for comparison).
enum Network {
    Packed(Bert),
    Candle(BertModel, Device),
}

/// A loaded encoder with its tokenizer and pooling.
pub struct Encoder {
    network: Network,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    dimensions: usize,
    /// Longest sequence, `[CLS]` and `[SEP]` included.
    max_tokens: usize,
}

fn read(dir: &Path, name: &str) -> Result<String, LoadError> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).map_err(|e| LoadError(format!("cannot read {}: {e}", path.display())))
}

fn parse<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<T, LoadError> {
    serde_json::from_str(&read(dir, name)?).map_err(|e| LoadError(format!("{name}: {e}")))
}

impl Encoder {
    /// Loads a sentence-transformers directory: `config.json`,
    /// `model.safetensors`, `tokenizer.json`, `modules.json`,
    /// `sentence_bert_config.json` and `1_Pooling/config.json`. On the CPU
    /// the network runs on [`Bert`]; on a CUDA device on candle.
    pub fn load(dir: &Path, device: Device) -> Result<Self, LoadError> {
        let candle = !device.is_cpu();
        Self::load_with(dir, device, candle)
    }

    /// [`Encoder::load`] with candle-transformers' BERT wherever it runs
    /// (`candle`), or Gantry's own (CPU only).
    pub fn load_with(dir: &Path, device: Device, candle: bool) -> Result<Self, LoadError> {
        let config: Config = parse(dir, "config.json")?;
        let tokenizer = Tokenizer::from_json(&read(dir, "tokenizer.json")?).map_err(|e| LoadError(e.to_string()))?;
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(LoadError(format!(
                "the tokenizer has {} ids but the model only {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        let modules: Vec<Module> = parse(dir, "modules.json")?;
        let mut normalize = false;
        for module in &modules {
            match module.kind.as_str() {
                "sentence_transformers.models.Transformer" | "sentence_transformers.models.Pooling" => {}
                "sentence_transformers.models.Normalize" => normalize = true,
                other => return Err(LoadError(format!("modules.json: unsupported module {other}"))),
            }
        }
        let pooling_config: PoolingConfig = parse(dir, "1_Pooling/config.json")?;
        let pooling = match (
            pooling_config.pooling_mode_mean_tokens,
            pooling_config.pooling_mode_cls_token,
            pooling_config.pooling_mode_max_tokens || pooling_config.pooling_mode_mean_sqrt_len_tokens,
        ) {
            (true, false, false) => Pooling::Mean,
            (false, true, false) => Pooling::Cls,
            _ => {
                return Err(LoadError(
                    "1_Pooling/config.json: only mean or CLS pooling is supported".into(),
                ));
            }
        };
        let sbert: SentenceBertConfig = parse(dir, "sentence_bert_config.json")?;
        let max_tokens = sbert.max_seq_length.min(config.max_position_embeddings);
        if max_tokens < 2 {
            return Err(LoadError(format!(
                "max_seq_length {max_tokens} leaves no room for text"
            )));
        }
        let weights = dir.join("model.safetensors");
        // The workspace forbids `unsafe`, so the file is read, not mapped.
        let bytes =
            std::fs::read(&weights).map_err(|e| LoadError(format!("cannot read {}: {e}", weights.display())))?;
        let network = if candle || config.hidden_act != HiddenAct::Gelu {
            let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device)
                .map_err(|e| LoadError(format!("model.safetensors: {e}")))?;
            let model = BertModel::load(vb, &config).map_err(|e| LoadError(format!("model.safetensors: {e}")))?;
            Network::Candle(model, device)
        } else {
            let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
                .map_err(|e| LoadError(format!("model.safetensors: {e}")))?;
            let shape = Shape {
                hidden: config.hidden_size,
                heads: config.num_attention_heads,
                layers: config.num_hidden_layers,
                intermediate: config.intermediate_size,
                vocab: config.vocab_size,
                max_positions: config.max_position_embeddings,
                eps: config.layer_norm_eps as f32,
            };
            Network::Packed(Bert::from_tensors(&tensors, &shape)?)
        };
        Ok(Self {
            network,
            tokenizer,
            pooling,
            normalize,
            dimensions: config.hidden_size,
            max_tokens,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Length of each vector.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Most text tokens of one input (the model's length less `[CLS]` and `[SEP]`).
    pub fn max_text_tokens(&self) -> usize {
        self.max_tokens - 2
    }

    /// Whether vectors are scaled to length 1.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The vectors of `sequences` (text token ids, each at most
    /// [`Encoder::max_text_tokens`] long), run as one batch.
    pub fn embed(&self, sequences: &[&[u32]]) -> Result<Vec<Vec<f32>>, String> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        match &self.network {
            Network::Packed(bert) => self.embed_packed(bert, sequences),
            Network::Candle(model, device) => self.embed_candle(model, device, sequences).map_err(|e| e.to_string()),
        }
    }

    fn embed_packed(&self, bert: &Bert, sequences: &[&[u32]]) -> Result<Vec<Vec<f32>>, String> {
        let full: Vec<Vec<u32>> = sequences
            .iter()
            .map(|s| {
                let mut ids = Vec::with_capacity(s.len() + 2);
                ids.push(self.tokenizer.cls());
                ids.extend_from_slice(s);
                ids.push(self.tokenizer.sep());
                ids
            })
            .collect();
        let views: Vec<&[u32]> = full.iter().map(Vec::as_slice).collect();
        let hidden = bert.forward(&views)?;
        let h = self.dimensions;
        let mut start = 0;
        let mut out = Vec::with_capacity(full.len());
        for ids in &full {
            let rows = &hidden[start * h..(start + ids.len()) * h];
            let mut vector = match self.pooling {
                Pooling::Cls => rows[..h].to_vec(),
                Pooling::Mean => {
                    let mut sum = vec![0.0f32; h];
                    for row in rows.chunks_exact(h) {
                        for (s, v) in sum.iter_mut().zip(row) {
                            *s += v;
                        }
                    }
                    let count = ids.len() as f32;
                    sum.iter_mut().for_each(|s| *s /= count);
                    sum
                }
            };
            if self.normalize {
                let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                vector.iter_mut().for_each(|v| *v /= norm);
            }
            out.push(vector);
            start += ids.len();
        }
        Ok(out)
    }

    fn embed_candle(
        &self,
        model: &BertModel,
        device: &Device,
        sequences: &[&[u32]],
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let batch = sequences.len();
        let len = sequences.iter().map(|s| s.len()).max().unwrap_or(0) + 2;
        let mut ids = vec![0u32; batch * len];
        let mut mask = vec![0u32; batch * len];
        for (row, sequence) in sequences.iter().enumerate() {
            let line = &mut ids[row * len..(row + 1) * len];
            line[0] = self.tokenizer.cls();
            line[1..=sequence.len()].copy_from_slice(sequence);
            line[sequence.len() + 1] = self.tokenizer.sep();
            mask[row * len..row * len + sequence.len() + 2].fill(1);
        }
        let ids = Tensor::from_vec(ids, (batch, len), device)?;
        let types = ids.zeros_like()?;
        let mask = Tensor::from_vec(mask, (batch, len), device)?;
        let hidden = model.forward(&ids, &types, Some(&mask))?;
        let pooled = match self.pooling {
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            Pooling::Mean => {
                let weights = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                let sums = hidden.broadcast_mul(&weights)?.sum(1)?;
                let counts = weights.sum(1)?;
                sums.broadcast_div(&counts)?
            }
        };
        let pooled = if self.normalize {
            let norms = pooled.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
            pooled.broadcast_div(&norms)?
        } else {
            pooled
        };
        pooled.to_dtype(DType::F32)?.to_vec2::<f32>()
    }
}
