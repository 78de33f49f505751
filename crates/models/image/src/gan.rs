//! DCGAN-style generators: a stack of 4x4 transposed convolutions, each
//! followed by batch normalisation and ReLU, the last by tanh. The first
//! layer turns the latent vector (noise, then an optional one-hot label) into
//! a 4x4 map with stride 1 and no padding; every later layer doubles the side
//! with stride 2 and padding 1.
//!
//! Batch normalisation in inference mode is an affine map per channel, so it
//! is folded into the preceding convolution's weights and a bias when the
//! model loads. A transposed convolution is computed as one matrix product
//! (the weights, transposed, times the input's channels × positions) followed
//! by a scatter-add of each kernel tap into the output ("col2im"). Activations
//! are kept channel-major (`C × N × H × W`) so that a batch of images is one
//! product per layer.

use std::collections::BTreeMap;

use gantry_manifest::torch::Tensor;

use crate::packed::PackedWeights;

/// Floats of kernel taps computed per chunk of input pixels (4 MiB).
const CHUNK_FLOATS: usize = 1 << 20;

/// Epsilon of PyTorch's `BatchNorm2d` default.
const BN_EPS: f32 = 1e-5;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(String);

pub(crate) fn load_err(message: impl Into<String>) -> LoadError {
    LoadError(message.into())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Relu,
    Tanh,
}

#[derive(Debug)]
struct Layer {
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
    /// `cin × (cout·k·k)`, row-major, batch norm folded in; emptied once
    /// packed.
    weight: Vec<f32>,
    /// The weights, transposed and packed for the product.
    packed: Option<PackedWeights>,
    bias: Vec<f32>,
    activation: Activation,
}

/// A loaded generator.
#[derive(Debug)]
pub struct Generator {
    input: usize,
    layers: Vec<Layer>,
    side: usize,
    channels: usize,
}

impl Generator {
    /// Builds the generator from the tensors under `prefix` (`<prefix>.<i>.weight`
    /// for the convolutions, `<prefix>.<j>.{weight,bias,running_mean,running_var}`
    /// for the batch norms), checking that the shapes chain.
    pub fn from_tensors(tensors: &BTreeMap<String, Tensor>, prefix: &str) -> Result<Self, LoadError> {
        let get = |name: &str| -> Result<Vec<f32>, LoadError> {
            let tensor = tensors
                .get(name)
                .ok_or_else(|| load_err(format!("the weights have no tensor {name}")))?;
            tensor
                .to_f32()
                .ok_or_else(|| load_err(format!("{name} is not a floating-point tensor")))
        };
        // Module indices under the prefix, in order.
        let mut modules: Vec<usize> = tensors
            .keys()
            .filter_map(|name| name.strip_prefix(prefix)?.strip_prefix('.'))
            .filter_map(|rest| rest.split_once('.')?.0.parse().ok())
            .collect();
        modules.sort_unstable();
        modules.dedup();
        let mut layers: Vec<Layer> = Vec::new();
        for index in modules {
            let name = |what: &str| format!("{prefix}.{index}.{what}");
            if tensors.contains_key(&name("running_mean")) {
                let layer = layers
                    .last_mut()
                    .ok_or_else(|| load_err(format!("batch norm {prefix}.{index} comes before any convolution")))?;
                let (gamma, beta, mean, var) = (
                    get(&name("weight"))?,
                    get(&name("bias"))?,
                    get(&name("running_mean"))?,
                    get(&name("running_var"))?,
                );
                if [gamma.len(), beta.len(), mean.len(), var.len()] != [layer.cout; 4] {
                    return Err(load_err(format!(
                        "batch norm {prefix}.{index} does not match its convolution"
                    )));
                }
                let per_out = layer.k * layer.k;
                for co in 0..layer.cout {
                    let scale = gamma[co] / (var[co] + BN_EPS).sqrt();
                    layer.bias[co] = (layer.bias[co] - mean[co]) * scale + beta[co];
                    for ci in 0..layer.cin {
                        let row = ci * layer.cout * per_out + co * per_out;
                        for w in &mut layer.weight[row..row + per_out] {
                            *w *= scale;
                        }
                    }
                }
            } else if let Some(weight) = tensors.get(&name("weight")) {
                let [cin, cout, k, k2] = weight.shape[..] else {
                    return Err(load_err(format!("{} is not a 4-D convolution weight", name("weight"))));
                };
                if k != k2 || k != 4 {
                    return Err(load_err(format!("{}: only 4x4 kernels are supported", name("weight"))));
                }
                if let Some(previous) = layers.last()
                    && previous.cout != cin
                {
                    return Err(load_err(format!(
                        "{} takes {cin} channels but the layer before gives {}",
                        name("weight"),
                        previous.cout
                    )));
                }
                let first = layers.is_empty();
                let bias = match tensors.get(&name("bias")) {
                    Some(_) => get(&name("bias"))?,
                    None => vec![0.0; cout],
                };
                layers.push(Layer {
                    cin,
                    cout,
                    k,
                    stride: if first { 1 } else { 2 },
                    pad: if first { 0 } else { 1 },
                    weight: get(&name("weight"))?,
                    packed: None,
                    bias,
                    activation: Activation::Relu,
                });
            }
        }
        let last = layers
            .last_mut()
            .ok_or_else(|| load_err(format!("the weights have no layers under {prefix}")))?;
        last.activation = Activation::Tanh;
        let channels = last.cout;
        for layer in &mut layers {
            layer.pack();
        }
        let side = layers.iter().fold(1, |side, l| (side - 1) * l.stride + l.k - 2 * l.pad);
        Ok(Self {
            input: layers[0].cin,
            layers,
            side,
            channels,
        })
    }

    /// Length of the input vector (noise plus label).
    pub fn input_len(&self) -> usize {
        self.input
    }

    /// Side of the square output, in pixels.
    pub fn side(&self) -> usize {
        self.side
    }

    /// Runs the generator on `n` input vectors (`n × input_len`, one after
    /// the other) and returns `n` images as interleaved 8-bit RGB.
    pub fn generate(&self, inputs: &[f32], n: usize) -> Vec<Vec<u8>> {
        let (x, side) = self.forward(inputs, n);
        let plane = side * side;
        (0..n)
            .map(|b| {
                let mut rgb = vec![0u8; plane * self.channels];
                for c in 0..self.channels {
                    let src = &x[(c * n + b) * plane..(c * n + b + 1) * plane];
                    for (p, v) in src.iter().enumerate() {
                        rgb[p * self.channels + c] = ((v + 1.0) * 127.5).round().clamp(0.0, 255.0) as u8;
                    }
                }
                rgb
            })
            .collect()
    }

    /// The raw output for `n` input vectors: `channels × n × side × side`
    /// values in [-1, 1] (channel-major), and the side.
    pub fn forward(&self, inputs: &[f32], n: usize) -> (Vec<f32>, usize) {
        assert_eq!(inputs.len(), n * self.input, "input vectors have the wrong length");
        // Channel-major: x[c][b] for a 1x1 map.
        let mut x = vec![0.0f32; self.input * n];
        for b in 0..n {
            for c in 0..self.input {
                x[c * n + b] = inputs[b * self.input + c];
            }
        }
        let mut side = 1;
        for layer in &self.layers {
            let (out, out_side) = layer.forward(&x, n, side);
            x = out;
            side = out_side;
        }
        (x, side)
    }

    /// Channels of the output (3: RGB).
    pub fn channels(&self) -> usize {
        self.channels
    }
}

impl Layer {
    /// Packs the (folded) weights for the product, keeping one copy.
    fn pack(&mut self) {
        let taps = self.cout * self.k * self.k;
        self.packed = Some(PackedWeights::from_transposed(&self.weight, self.cin, taps));
        self.weight = Vec::new();
    }

    /// `x` is `cin × n × side × side`; returns `cout × n × out × out` and `out`.
    fn forward(&self, x: &[f32], n: usize, side: usize) -> (Vec<f32>, usize) {
        let positions = n * side * side;
        let taps = self.cout * self.k * self.k;
        let packed = self
            .packed
            .as_ref()
            .unwrap_or_else(|| unreachable!("layers are packed when the model loads"));
        let out_side = (side - 1) * self.stride + self.k - 2 * self.pad;
        let out_plane = out_side * out_side;
        let mut out = vec![0.0f32; self.cout * n * out_plane];
        // The input pixels in chunks whose kernel taps stay within a few
        // megabytes: for each chunk, one product gives every tap of every
        // pixel, cols[(b,ih,iw)][(co,kh,kw)] = Σ_ci weight[ci][(co,kh,kw)] ·
        // x[ci][(b,ih,iw)], and a scatter-add ("col2im") puts each tap into
        // its output pixel while the chunk is still in cache.
        let chunk = (CHUNK_FLOATS / taps).max(1);
        let mut cols = vec![0.0f32; taps * chunk.min(positions)];
        let mut first = 0;
        while first < positions {
            let len = chunk.min(positions - first);
            let cols = &mut cols[..taps * len];
            packed.matmul(x, positions, first..first + len, cols);
            for (offset, src) in cols.chunks_exact(taps).enumerate() {
                let pixel = first + offset;
                let (b, ih, iw) = (pixel / (side * side), pixel / side % side, pixel % side);
                for co in 0..self.cout {
                    let plane = &mut out[(co * n + b) * out_plane..][..out_plane];
                    for kh in 0..self.k {
                        let Some(oh) = (ih * self.stride + kh)
                            .checked_sub(self.pad)
                            .filter(|oh| *oh < out_side)
                        else {
                            continue;
                        };
                        let row = &mut plane[oh * out_side..][..out_side];
                        let tap = &src[(co * self.k + kh) * self.k..][..self.k];
                        for (kw, v) in tap.iter().enumerate() {
                            if let Some(ow) = (iw * self.stride + kw)
                                .checked_sub(self.pad)
                                .filter(|ow| *ow < out_side)
                            {
                                row[ow] += v;
                            }
                        }
                    }
                }
            }
            first += len;
        }
        for co in 0..self.cout {
            let bias = self.bias[co];
            let channel = &mut out[co * n * out_plane..(co + 1) * n * out_plane];
            match self.activation {
                Activation::Relu => channel.iter_mut().for_each(|v| *v = (*v + bias).max(0.0)),
                Activation::Tanh => channel.iter_mut().for_each(|v| *v = (*v + bias).tanh()),
            }
        }
        (out, out_side)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_manifest::torch::DType;

    fn tensor(shape: &[usize], values: impl Fn(usize) -> f32) -> Tensor {
        let numel: usize = shape.iter().product();
        Tensor {
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: (0..numel).flat_map(|i| values(i).to_le_bytes()).collect(),
        }
    }

    /// The transposed convolution written the way its definition reads: every
    /// input pixel adds its value times the kernel at its strided position.
    fn reference(x: &[f32], cin: usize, side: usize, w: &[f32], cout: usize, stride: usize, pad: usize) -> Vec<f32> {
        let out_side = (side - 1) * stride + 4 - 2 * pad;
        let mut out = vec![0.0; cout * out_side * out_side];
        for ci in 0..cin {
            for ih in 0..side {
                for iw in 0..side {
                    for co in 0..cout {
                        for kh in 0..4 {
                            for kw in 0..4 {
                                let oh = (ih * stride + kh) as isize - pad as isize;
                                let ow = (iw * stride + kw) as isize - pad as isize;
                                if oh < 0 || ow < 0 || oh >= out_side as isize || ow >= out_side as isize {
                                    continue;
                                }
                                out[(co * out_side + oh as usize) * out_side + ow as usize] +=
                                    x[(ci * side + ih) * side + iw] * w[((ci * cout + co) * 4 + kh) * 4 + kw];
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn a_strided_layer_matches_the_definition() {
        let (cin, cout, side) = (3, 2, 5);
        let w: Vec<f32> = (0..cin * cout * 16)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 10.0)
            .collect();
        let x: Vec<f32> = (0..cin * side * side)
            .map(|i| ((i * 5 % 13) as f32 - 6.0) / 7.0)
            .collect();
        let mut layer = Layer {
            cin,
            cout,
            k: 4,
            stride: 2,
            pad: 1,
            weight: w.clone(),
            packed: None,
            bias: vec![0.0; cout],
            activation: Activation::Tanh,
        };
        layer.pack();
        let (got, out_side) = layer.forward(&x, 1, side);
        assert_eq!(out_side, 10);
        let want: Vec<f32> = reference(&x, cin, side, &w, cout, 2, 1)
            .iter()
            .map(|v| v.tanh())
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn batch_norm_folds_into_the_convolution_and_a_batch_equals_single_runs() {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "g.0.weight".into(),
            tensor(&[6, 4, 4, 4], |i| ((i % 9) as f32 - 4.0) / 8.0),
        );
        tensors.insert("g.1.weight".into(), tensor(&[4], |i| 1.0 + i as f32 / 4.0));
        tensors.insert("g.1.bias".into(), tensor(&[4], |i| i as f32 / 10.0 - 0.1));
        tensors.insert("g.1.running_mean".into(), tensor(&[4], |i| i as f32 / 20.0));
        tensors.insert("g.1.running_var".into(), tensor(&[4], |i| 0.5 + i as f32));
        tensors.insert(
            "g.1.num_batches_tracked".into(),
            Tensor {
                dtype: DType::I64,
                shape: vec![],
                data: 7i64.to_le_bytes().to_vec(),
            },
        );
        tensors.insert(
            "g.3.weight".into(),
            tensor(&[4, 3, 4, 4], |i| ((i % 7) as f32 - 3.0) / 6.0),
        );
        let g = Generator::from_tensors(&tensors, "g").unwrap();
        assert_eq!((g.input_len(), g.side()), (6, 8));

        let z: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) / 5.0).collect();
        // By hand: layer 1 then batch norm then ReLU, layer 2 then tanh.
        let w0 = tensors["g.0.weight"].to_f32().unwrap();
        let h = reference(&z[..6], 6, 1, &w0, 4, 1, 0);
        let h: Vec<f32> = h
            .chunks(16)
            .enumerate()
            .flat_map(|(c, plane)| {
                let (gamma, beta, mean, var) = (
                    1.0 + c as f32 / 4.0,
                    c as f32 / 10.0 - 0.1,
                    c as f32 / 20.0,
                    0.5 + c as f32,
                );
                plane
                    .iter()
                    .map(move |v| ((v - mean) / (var + BN_EPS).sqrt() * gamma + beta).max(0.0))
                    .collect::<Vec<_>>()
            })
            .collect();
        let w3 = tensors["g.3.weight"].to_f32().unwrap();
        let y = reference(&h, 4, 4, &w3, 3, 2, 1);
        let want: Vec<u8> = (0..64)
            .flat_map(|p| (0..3).map(move |c| (c, p)))
            .map(|(c, p)| ((y[c * 64 + p].tanh() + 1.0) * 127.5).round().clamp(0.0, 255.0) as u8)
            .collect();

        let batch = g.generate(&z, 2);
        let single = g.generate(&z[..6], 1);
        assert_eq!(batch[0], single[0], "an image does not depend on its batch");
        let close = batch[0].iter().zip(&want).all(|(a, b)| a.abs_diff(*b) <= 1);
        assert!(close, "{:?}\nvs\n{:?}", &batch[0][..24], &want[..24]);
        assert_ne!(batch[0], batch[1]);
    }
}
