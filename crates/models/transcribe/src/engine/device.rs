//! Whisper on candle: the computation of `model.rs` (pre-norm layers, exact
//! GELU, queries scaled by 1/√d, learned positions, tied output projection)
//! as tensor operations on one candle device, a CUDA GPU in a binary built
//! with the `cuda` feature (candle's CPU device serves the tests). The
//! weights come from the same `model.bin`, read through the same
//! [`dims_of`]; only where the arithmetic happens differs.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{LayerNorm, Linear};

use super::EngineError;
use super::decode::Net;
use super::format::ModelFile;
use super::mel::N_MELS;
use super::model::{
    DecoderLayer, Dims, EncoderLayer, N_CTX, N_FRAMES, N_TEXT_CTX, Reader, dims_of, has_own_projection, read_layers,
};

type Result<T> = std::result::Result<T, EngineError>;

pub(super) fn device_error(error: candle_core::Error) -> EngineError {
    EngineError::Device(error.to_string())
}

/// A 1-D convolution of kernel 3 and padding 1: weights `out × in × 3`.
struct Conv {
    weight: Tensor,
    /// `1 × out × 1`, to add to `1 × out × time`.
    bias: Tensor,
    stride: usize,
}

/// The weights on the device.
pub struct DeviceModel {
    dims: Dims,
    device: Device,
    conv1: Conv,
    conv2: Conv,
    enc_pos: Tensor,
    enc_layers: Vec<EncoderLayer<Linear, LayerNorm>>,
    enc_norm: LayerNorm,
    embeddings: Tensor,
    projection: Tensor,
    dec_pos: Tensor,
    dec_layers: Vec<DecoderLayer<Linear, LayerNorm>>,
    dec_norm: LayerNorm,
}

impl std::fmt::Debug for DeviceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceModel")
            .field("dims", &self.dims)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// Reads variables of `model.bin` onto one device.
struct Loader<'a> {
    file: &'a mut ModelFile,
    device: &'a Device,
}

impl Loader<'_> {
    fn tensor(&mut self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let values = self.file.take(name, dims)?;
        Tensor::from_vec(values, dims, self.device).map_err(device_error)
    }

    fn conv(&mut self, scope: &str, out: usize, inp: usize, stride: usize) -> Result<Conv> {
        let weight = self.tensor(&format!("{scope}/weight"), &[out, inp, 3])?;
        let bias = self.tensor(&format!("{scope}/bias"), &[out])?;
        Ok(Conv {
            weight,
            bias: bias.reshape((1, out, 1)).map_err(device_error)?,
            stride,
        })
    }
}

impl Reader for Loader<'_> {
    type Linear = Linear;
    type Norm = LayerNorm;

    fn norm(&mut self, scope: &str, d: usize) -> Result<LayerNorm> {
        let gamma = self.tensor(&format!("{scope}/gamma"), &[d])?;
        let beta = self.tensor(&format!("{scope}/beta"), &[d])?;
        Ok(LayerNorm::new(gamma, beta, 1e-5))
    }

    /// Every layer the same way on a device (`by_rows` is the kernels' matter).
    fn linear(&mut self, scope: &str, out: usize, inp: usize, _by_rows: bool) -> Result<Linear> {
        let weight = self.tensor(&format!("{scope}/weight"), &[out, inp])?;
        let bias = self.tensor(&format!("{scope}/bias"), &[out])?;
        Ok(Linear::new(weight, Some(bias)))
    }
}

impl Conv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.conv1d(&self.weight, 1, self.stride, 1, 1)?
            .broadcast_add(&self.bias)?
            .gelu_erf()
    }
}

impl DeviceModel {
    /// Reads the weights of `model.bin` onto `device`.
    pub fn from_file(mut f: ModelFile, device: &Device) -> Result<Self> {
        let dims = dims_of(&f)?;
        let own_projection = has_own_projection(&f);
        let (d, vocab) = (dims.d_model, dims.vocab);
        let mut l = Loader { file: &mut f, device };
        let conv1 = l.conv("encoder/conv1", d, N_MELS, 1)?;
        let conv2 = l.conv("encoder/conv2", d, d, 2)?;
        let enc_pos = l.tensor("encoder/position_encodings/encodings", &[N_CTX, d])?;
        let (enc_layers, enc_norm, dec_layers, dec_norm) = read_layers(&mut l, &dims)?;
        let dec_pos = l.tensor("decoder/position_encodings/encodings", &[N_TEXT_CTX, d])?;
        let embeddings = l.tensor("decoder/embeddings/weight", &[vocab, d])?;
        let projection = if own_projection {
            l.tensor("decoder/projection/weight", &[vocab, d])?
        } else {
            embeddings.clone()
        };
        Ok(Self {
            dims,
            device: device.clone(),
            conv1,
            conv2,
            enc_pos,
            enc_layers,
            enc_norm,
            embeddings,
            projection,
            dec_pos,
            dec_layers,
            dec_norm,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The encoder's output (`N_CTX × d_model`) for a window of features
    /// (`N_MELS × N_FRAMES`, mel-major), on the device.
    pub fn encode(&self, mel: &[f32]) -> Result<Tensor> {
        self.encode_tensor(mel).map_err(device_error)
    }

    fn encode_tensor(&self, mel: &[f32]) -> candle_core::Result<Tensor> {
        let x = Tensor::from_slice(mel, (1, N_MELS, N_FRAMES), &self.device)?;
        let x = self.conv2.forward(&self.conv1.forward(&x)?)?;
        let mut x = x.squeeze(0)?.t()?.contiguous()?.add(&self.enc_pos)?;
        for layer in &self.enc_layers {
            let qkv = layer.qkv.forward(&layer.ln1.forward(&x)?)?;
            let d = self.dims.d_model;
            let keys = self.heads(&qkv.narrow(1, d, d)?)?;
            let values = self.heads(&qkv.narrow(1, 2 * d, d)?)?;
            let attn = self.attend(&qkv.narrow(1, 0, d)?, &keys, &values, None)?;
            x = x.add(&layer.out.forward(&attn)?)?;
            let hidden = layer.ffn1.forward(&layer.ln2.forward(&x)?)?.gelu_erf()?;
            x = x.add(&layer.ffn2.forward(&hidden)?)?;
        }
        self.enc_norm.forward(&x)
    }

    /// The cross-attention keys and values of every decoder layer for one
    /// window of features.
    pub fn cross(&self, mel: &[f32]) -> Result<DeviceCross> {
        let run = || -> candle_core::Result<DeviceCross> {
            let enc = self.encode_tensor(mel)?;
            let d = self.dims.d_model;
            let mut layers = Vec::with_capacity(self.dec_layers.len());
            for layer in &self.dec_layers {
                let kv = layer.cross_kv.forward(&enc)?;
                layers.push((self.heads(&kv.narrow(1, 0, d)?)?, self.heads(&kv.narrow(1, d, d)?)?));
            }
            Ok(DeviceCross { layers })
        };
        run().map_err(device_error)
    }

    /// `n × d_model` as `heads × n × head_dim`.
    fn heads(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let n = x.dim(0)?;
        x.reshape((n, self.dims.heads, self.dims.head_dim))?
            .transpose(0, 1)?
            .contiguous()
    }

    /// Attention of the query rows `q` (`n × d_model`, unscaled) over `keys`
    /// and `values` (`heads × m × head_dim`), with `mask` (`n × m`, 0 or -∞)
    /// added to the scores; `n × d_model`.
    fn attend(&self, q: &Tensor, keys: &Tensor, values: &Tensor, mask: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let n = q.dim(0)?;
        let scale = 1.0 / (self.dims.head_dim as f64).sqrt();
        let q = self.heads(q)?.affine(scale, 0.0)?;
        let scores = q.matmul(&keys.t()?)?;
        let scores = match mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        weights.matmul(values)?.transpose(0, 1)?.reshape((n, self.dims.d_model))
    }

    fn decode_tensors(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        cross: &DeviceCross,
        logits: Option<&mut [f32]>,
    ) -> candle_core::Result<()> {
        let (n, start, d) = (tokens.len(), cache.len, self.dims.d_model);
        if n == 0 || start + n > N_TEXT_CTX {
            return Ok(());
        }
        let last_token = self.dims.vocab as u32 - 1;
        let ids: Vec<u32> = tokens.iter().map(|&t| t.min(last_token)).collect();
        let ids = Tensor::from_vec(ids, n, &self.device)?;
        let mut x = self
            .embeddings
            .index_select(&ids, 0)?
            .add(&self.dec_pos.narrow(0, start, n)?)?;
        // Position `start + i` sees the keys up to itself.
        let mask = if n > 1 {
            let width = start + n;
            let mask: Vec<f32> = (0..n)
                .flat_map(|i| (0..width).map(move |j| if j <= start + i { 0.0 } else { f32::NEG_INFINITY }))
                .collect();
            Some(Tensor::from_vec(mask, (n, width), &self.device)?)
        } else {
            None
        };
        for (layer, (cached, (cross_k, cross_v))) in
            self.dec_layers.iter().zip(cache.layers.iter_mut().zip(&cross.layers))
        {
            let qkv = layer.qkv.forward(&layer.ln1.forward(&x)?)?;
            let new_k = self.heads(&qkv.narrow(1, d, d)?)?;
            let new_v = self.heads(&qkv.narrow(1, 2 * d, d)?)?;
            let (keys, values) = match cached.take() {
                Some((k, v)) => (Tensor::cat(&[&k, &new_k], 1)?, Tensor::cat(&[&v, &new_v], 1)?),
                None => (new_k, new_v),
            };
            let attn = self.attend(&qkv.narrow(1, 0, d)?, &keys, &values, mask.as_ref())?;
            *cached = Some((keys, values));
            x = x.add(&layer.out.forward(&attn)?)?;
            let q = layer.cross_q.forward(&layer.ln2.forward(&x)?)?;
            let attn = self.attend(&q, cross_k, cross_v, None)?;
            x = x.add(&layer.cross_out.forward(&attn)?)?;
            let hidden = layer.ffn1.forward(&layer.ln3.forward(&x)?)?.gelu_erf()?;
            x = x.add(&layer.ffn2.forward(&hidden)?)?;
        }
        cache.len = start + n;
        if let Some(logits) = logits {
            let last = self.dec_norm.forward(&x.narrow(0, n - 1, 1)?)?;
            let scores = last.matmul(&self.projection.t()?)?.squeeze(0)?.to_dtype(DType::F32)?;
            let scores = scores.to_vec1::<f32>()?;
            logits[..scores.len()].copy_from_slice(&scores);
        }
        Ok(())
    }
}

/// One window's cross-attention keys and values on the device, by layer:
/// each `heads × N_CTX × head_dim`.
#[derive(Debug)]
pub struct DeviceCross {
    layers: Vec<(Tensor, Tensor)>,
}

/// The decoder's self-attention keys and values on the device, by layer
/// (`heads × len × head_dim`, none before the first token).
#[derive(Debug)]
pub struct DeviceCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl Net for DeviceModel {
    type Cross = DeviceCross;
    type Cache = DeviceCache;

    fn vocab(&self) -> usize {
        self.dims.vocab
    }

    fn new_cache(&self) -> Result<DeviceCache> {
        Ok(DeviceCache {
            layers: (0..self.dec_layers.len()).map(|_| None).collect(),
            len: 0,
        })
    }

    fn decode(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        cross: &DeviceCross,
        logits: Option<&mut [f32]>,
        _threads: usize,
    ) -> Result<()> {
        self.decode_tensors(tokens, cache, cross, logits).map_err(device_error)
    }
}
