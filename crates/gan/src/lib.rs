//! DCGAN-style generators: a stack of 4x4 transposed convolutions, each
//! followed by batch normalisation and ReLU, the last by tanh. The first
//! layer turns the latent vector (noise, then an optional one-hot label) into
//! a 4x4 map with stride 1 and no padding; every later layer doubles the side
//! with stride 2 and padding 1.
//!
//! Batch normalisation in inference mode is an affine map per channel, so it
//! is folded into the preceding convolution's weights and a bias when the
//! model loads. Activations are kept channels-innermost (`N × H × W × C`)
//! with a border of one zero pixel, so that the windows a layer reads are
//! runs of contiguous floats, and a batch of images is one set of products
//! per layer:
//!
//! - the first layer (a 1x1 input) is one product whose rows are the 4x4
//!   output's pixels and channels;
//! - a 4x4, stride-2 transposed convolution gives each output pixel of one
//!   parity (even or odd row, even or odd column) from a 2x2 window of the
//!   input and four of the kernel's sixteen taps. Each of the four parities
//!   is a product of depth `4 · cin` whose columns read their window in place
//!   ([`PackedWeights::matmul_gathered`]: two runs of two pixels) and write
//!   their output pixel directly, with the bias and ReLU applied on the way.
//!   Nothing is scattered and nothing is added twice;
//! - a layer with fewer than 16 output channels (the RGB output) would waste
//!   most of a 16-row weight panel that way, so it computes every tap of
//!   each input pixel (rows `cout · 16`) and adds them into the output
//!   ("col2im").
//!
//! With [`Backend::Candle`] the same layers run on candle instead, on the
//! device it names (a GPU in a `cuda` build); see [`device`](crate::device).

use std::collections::BTreeMap;

mod device;

/// What runs a generator's layers: the kernels, or candle's
/// `conv_transpose2d` on its device.
pub use gantry_kernels::backend::{Backend, BackendError, Device};
use gantry_manifest::torch::Tensor;

use gantry_kernels::norm;
use gantry_kernels::packed::{Columns, Epilogue, PackedWeights, Runs};
use gantry_kernels::winograd::Upsample;

/// Floats of kernel taps computed per chunk of input pixels (4 MiB).
const CHUNK_FLOATS: usize = 1 << 20;

/// Floats of the largest map a layer makes at once (8 MiB); larger batches
/// go through the later layers a few images at a time.
const MAP_FLOATS: usize = 2 << 20;

/// When a strided layer runs by Winograd's F(4×4, 3×3): from maps of 16
/// pixels a side (16 tiles an image), with at most this many floats of
/// transformed weights (9x the layer's) per tile of one image (below that
/// reuse, streaming the weights for a single image costs more than the
/// multiply-adds save: measured on the eyes generator's 256-channel layer,
/// 19 MB for 16 tiles), and at most 32 MiB of them in all.
const WINOGRAD_SIDE: usize = 16;
const WINOGRAD_FLOATS_PER_TILE: usize = 128 << 10;
const WINOGRAD_FLOATS: usize = 8 << 20;

/// Output channels from which a strided layer runs as four sub-pixel
/// products (one weight panel's rows).
const SUB_PIXEL_CHANNELS: usize = 16;

/// Epsilon of PyTorch's `BatchNorm2d` default.
const BN_EPS: f32 = 1e-5;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(String);

impl LoadError {
    /// A load error saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

fn load_err(message: impl Into<String>) -> LoadError {
    LoadError::new(message)
}

/// A generator that could not run a batch (on a GPU: out of memory, or the
/// device lost).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RunError(String);

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
    /// `cin × cout × k × k` (PyTorch's layout), batch norm folded in;
    /// emptied once packed.
    weight: Vec<f32>,
    /// The weights, packed for the products the layer runs.
    packed: Option<Plan>,
    bias: Vec<f32>,
    activation: Activation,
}

/// How a layer computes, with its packed weights.
#[derive(Debug)]
enum Plan {
    /// A 1x1 input: rows are the output's `(kh, kw, co)`.
    First(PackedWeights),
    /// Stride 2: one product per output parity `(a, b)`, rows `co`, depth
    /// the window's `(row, column, ci)`.
    SubPixel(Box<[PackedWeights; 4]>),
    /// Stride 2 on maps of 16 pixels or more: Winograd's F(4×4, 3×3).
    Winograd(Upsample),
    /// Stride 2, few output channels: rows are every tap `(co, kh, kw)`.
    Scatter(PackedWeights),
}

/// A batch of maps, channels innermost, with a border of one zero pixel:
/// `n × (side + 2) × (side + 2) × channels`.
#[derive(Debug)]
struct Map {
    data: Vec<f32>,
    n: usize,
    side: usize,
    channels: usize,
}

/// Some consecutive images of a [`Map`].
#[derive(Debug, Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    side: usize,
    channels: usize,
}

impl View<'_> {
    /// As [`Map::at`].
    fn at(&self, b: usize, y: usize, x: usize) -> usize {
        offset(self.side, self.channels, b, y, x)
    }
}

/// Offset of pixel `(y, x)` of image `b` in a padded map of `side` pixels
/// and `channels` channels, in padded coordinates (the first real pixel is
/// `(1, 1)`).
fn offset(side: usize, channels: usize, b: usize, y: usize, x: usize) -> usize {
    let padded = side + 2;
    ((b * padded + y) * padded + x) * channels
}

impl Map {
    fn zeros(n: usize, side: usize, channels: usize) -> Self {
        let padded = side + 2;
        Self {
            data: vec![0.0; n * padded * padded * channels],
            n,
            side,
            channels,
        }
    }

    /// Offset of pixel `(y, x)` of image `b` ([`offset`]).
    fn at(&self, b: usize, y: usize, x: usize) -> usize {
        offset(self.side, self.channels, b, y, x)
    }

    /// Images `images` of the batch, borrowed.
    fn images(&self, images: std::ops::Range<usize>) -> View<'_> {
        let per_image = (self.side + 2) * (self.side + 2) * self.channels;
        View {
            data: &self.data[images.start * per_image..images.end * per_image],
            side: self.side,
            channels: self.channels,
        }
    }

    /// Applies `f(value, channel)` to every real pixel, leaving the border.
    fn map_interior(&mut self, f: impl Fn(f32, usize) -> f32) {
        for b in 0..self.n {
            for y in 1..=self.side {
                let start = self.at(b, y, 1);
                let row = &mut self.data[start..start + self.side * self.channels];
                for pixel in row.chunks_exact_mut(self.channels) {
                    for (c, v) in pixel.iter_mut().enumerate() {
                        *v = f(*v, c);
                    }
                }
            }
        }
    }

    /// Zeroes the border (after a scatter wrote into it).
    fn clear_border(&mut self) {
        let (padded, c) = (self.side + 2, self.channels);
        for b in 0..self.n {
            for y in 0..padded {
                let row = self.at(b, y, 0);
                if y == 0 || y == padded - 1 {
                    self.data[row..row + padded * c].fill(0.0);
                } else {
                    self.data[row..row + c].fill(0.0);
                    self.data[row + (padded - 1) * c..row + padded * c].fill(0.0);
                }
            }
        }
    }
}

/// A loaded generator.
#[derive(Debug)]
pub struct Generator {
    input: usize,
    layers: Vec<Layer>,
    side: usize,
    channels: usize,
    /// [`MAP_FLOATS`], lowered by tests.
    map_floats: usize,
    /// The layers on candle's device, with [`Backend::Candle`]; the
    /// kernels' `layers` then keep only their shapes.
    net: Option<device::Net>,
}

impl Generator {
    /// Builds the generator from the tensors under `prefix` (`<prefix>.<i>.weight`
    /// for the convolutions, `<prefix>.<j>.{weight,bias,running_mean,running_var}`
    /// for the batch norms), checking that the shapes chain.
    /// The layers run on this crate's kernels ([`Backend::Kernels`]).
    pub fn from_tensors(tensors: &BTreeMap<String, Tensor>, prefix: &str) -> Result<Self, LoadError> {
        Self::from_tensors_on(tensors, prefix, &Backend::Kernels)
    }

    /// As [`Generator::from_tensors`], with the layers on `backend`.
    pub fn from_tensors_on(
        tensors: &BTreeMap<String, Tensor>,
        prefix: &str,
        backend: &Backend,
    ) -> Result<Self, LoadError> {
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
        let net = match backend {
            Backend::Kernels => None,
            Backend::Candle(device) => Some(
                device::Net::new(&layers, device)
                    .map_err(|e| load_err(format!("cannot put the generator on {device:?}: {e}")))?,
            ),
        };
        let mut side = 1;
        for layer in &mut layers {
            if net.is_none() {
                layer.pack(side);
            } else {
                layer.weight = Vec::new();
            }
            side = layer.out_side(side);
        }
        Ok(Self {
            input: layers[0].cin,
            layers,
            side,
            channels,
            map_floats: MAP_FLOATS,
            net,
        })
    }

    /// Where the layers run: `"kernels"` (this crate's, on the CPU) or
    /// candle's device (`"candle Cpu"`, `"candle Cuda(…)"`).
    pub fn backend_name(&self) -> String {
        gantry_kernels::backend::name(self.net.as_ref().map(device::Net::device))
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
    pub fn generate(&self, inputs: &[f32], n: usize) -> Result<Vec<Vec<u8>>, RunError> {
        let (x, side) = self.forward(inputs, n)?;
        let plane = side * side;
        Ok((0..n)
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
            .collect())
    }

    /// The raw output for `n` input vectors: `channels × n × side × side`
    /// values in [-1, 1] (channel-major), and the side.
    pub fn forward(&self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, usize), RunError> {
        assert_eq!(inputs.len(), n * self.input, "input vectors have the wrong length");
        if let Some(net) = &self.net {
            let out = net
                .forward(inputs, n, self.input)
                .map_err(|e| RunError(format!("the generator failed on {:?}: {e}", net.device())))?;
            return Ok((out, self.side));
        }
        let plane = self.side * self.side;
        let mut out = vec![0.0f32; self.channels * n * plane];
        let first = self.layers[0].forward(Source::Latent(inputs), n);
        self.finish(0, first, 0, n, &mut out);
        let last = &self.layers[self.layers.len() - 1];
        if !last.applies() {
            match last.activation {
                Activation::Tanh => norm::tanh(&mut out),
                Activation::Relu => out.iter_mut().for_each(|v| *v = v.max(0.0)),
            }
        }
        Ok((out, self.side))
    }

    /// Takes layer `i`'s output `map` (images `first ..` of a batch of
    /// `total`) through the layers after it, in slices of images small
    /// enough that no map outgrows [`MAP_FLOATS`] (the maps of the last
    /// layers, tens of megabytes for a batch, would otherwise be mapped
    /// and faulted in afresh on every call), and writes the last layer's
    /// output into `out`, channel-major, with its bias (its activation is
    /// left to the caller, to run over whole planes).
    fn finish(&self, i: usize, mut map: Map, first: usize, total: usize, out: &mut [f32]) {
        let layer = &self.layers[i];
        let Some(next) = self.layers.get(i + 1) else {
            let (side, plane) = (map.side, map.side * map.side);
            for c in 0..self.channels {
                let bias = if layer.applies() { 0.0 } else { layer.bias[c] };
                for b in 0..map.n {
                    let dst = &mut out[(c * total + first + b) * plane..][..plane];
                    for (y, row) in dst.chunks_exact_mut(side).enumerate() {
                        let start = map.at(b, y + 1, 1) + c;
                        for (d, v) in row.iter_mut().zip(map.data[start..].iter().step_by(self.channels)) {
                            *d = v + bias;
                        }
                    }
                }
            }
            return;
        };
        if !layer.applies() {
            map.map_interior(|v, c| layer.activation.apply(v + layer.bias[c]));
        }
        let out_side = next.out_side(map.side);
        let per_image = (out_side + 2) * (out_side + 2) * next.cout;
        let chunk = (self.map_floats / per_image).max(1);
        for start in (0..map.n).step_by(chunk) {
            let len = chunk.min(map.n - start);
            let slice = next.forward(Source::Map(map.images(start..start + len)), len);
            self.finish(i + 1, slice, first + start, total, out);
        }
    }

    /// Channels of the output (3: RGB).
    pub fn channels(&self) -> usize {
        self.channels
    }
}

impl Activation {
    fn apply(self, v: f32) -> f32 {
        match self {
            Activation::Relu => v.max(0.0),
            Activation::Tanh => v.tanh(),
        }
    }
}

/// What a layer reads: the input vectors (`n × cin`) or the map before it.
enum Source<'a> {
    Latent(&'a [f32]),
    Map(View<'a>),
}

impl Layer {
    /// Side of the output of a map of `side` pixels.
    fn out_side(&self, side: usize) -> usize {
        (side - 1) * self.stride + self.k - 2 * self.pad
    }

    /// Packs the (folded) weights for the products the layer runs on maps
    /// of `side` pixels, keeping one copy.
    fn pack(&mut self, side: usize) {
        let (cin, cout, k) = (self.cin, self.cout, self.k);
        let w = |ci: usize, co: usize, kh: usize, kw: usize| self.weight[((ci * cout + co) * k + kh) * k + kw];
        let plan = if self.stride == 1 {
            // Rows (kh, kw, co): the product of one input vector is its 4x4
            // output, channels innermost.
            let mut t = vec![0.0f32; cin * k * k * cout];
            for ci in 0..cin {
                for kh in 0..k {
                    for kw in 0..k {
                        for co in 0..cout {
                            t[((ci * k + kh) * k + kw) * cout + co] = w(ci, co, kh, kw);
                        }
                    }
                }
            }
            Plan::First(PackedWeights::from_transposed(&t, cin, k * k * cout))
        } else if side >= WINOGRAD_SIDE
            && Upsample::fits(cin, cout, side)
            && Upsample::weight_floats(cin, cout) <= WINOGRAD_FLOATS.min(WINOGRAD_FLOATS_PER_TILE * (side / 4).pow(2))
        {
            Plan::Winograd(Upsample::new(&self.weight, cin, cout))
        } else if cout >= SUB_PIXEL_CHANNELS {
            // Output row 2m + a takes input rows m - 1 + a + t (t = 0, 1)
            // through kernel row 3 - a - 2t; columns alike. In the padded
            // map those input rows are m + a + t.
            let parity = |a: usize, b: usize| {
                let mut rows = vec![0.0f32; cout * 4 * cin];
                for co in 0..cout {
                    for t in 0..2 {
                        for u in 0..2 {
                            for ci in 0..cin {
                                rows[(co * 4 + t * 2 + u) * cin + ci] = w(ci, co, 3 - a - 2 * t, 3 - b - 2 * u);
                            }
                        }
                    }
                }
                PackedWeights::from_rows(&rows, cout, 4 * cin)
            };
            Plan::SubPixel(Box::new([parity(0, 0), parity(0, 1), parity(1, 0), parity(1, 1)]))
        } else {
            Plan::Scatter(PackedWeights::from_transposed(&self.weight, cin, cout * k * k))
        };
        self.packed = Some(plan);
        self.weight = Vec::new();
    }

    /// Whether [`Layer::forward`] applies the bias and activation itself
    /// (otherwise its map holds the bare sums).
    fn applies(&self) -> bool {
        self.activation == Activation::Relu && !matches!(self.packed, Some(Plan::Scatter(_)))
    }

    /// Runs the layer on `n` images; the output map has a zero border, and
    /// the bias and activation applied where [`Layer::applies`].
    fn forward(&self, source: Source<'_>, n: usize) -> Map {
        let plan = self
            .packed
            .as_ref()
            .unwrap_or_else(|| unreachable!("layers are packed when the model loads"));
        let (cin, cout, k) = (self.cin, self.cout, self.k);
        let relu = self.activation == Activation::Relu;
        match (plan, source) {
            (Plan::First(packed), Source::Latent(z)) => {
                let mut taps = vec![0.0f32; n * k * k * cout];
                packed.matmul_rows(z, n, &mut taps);
                let mut out = Map::zeros(n, k, cout);
                for b in 0..n {
                    for kh in 0..k {
                        let start = out.at(b, kh + 1, 1);
                        let dst = &mut out.data[start..start + k * cout];
                        let src = &taps[(b * k + kh) * k * cout..][..k * cout];
                        if relu {
                            for ((d, v), bias) in dst.iter_mut().zip(src).zip(self.bias.iter().cycle()) {
                                *d = (v + bias).max(0.0);
                            }
                        } else {
                            dst.copy_from_slice(src);
                        }
                    }
                }
                out
            }
            (Plan::SubPixel(parities), Source::Map(x)) => {
                let side = x.side;
                let mut out = Map::zeros(n, 2 * side, cout);
                let mut inputs = Vec::with_capacity(n * side * side);
                let mut outputs = Vec::with_capacity(n * side * side);
                let runs = Runs {
                    count: 2,
                    len: 2 * cin,
                    stride: (side + 2) * cin,
                };
                let epilogue = if relu {
                    Epilogue::BiasRelu(&self.bias)
                } else {
                    Epilogue::Plain
                };
                for (i, packed) in parities.iter().enumerate() {
                    let (a, c) = (i / 2, i % 2);
                    inputs.clear();
                    outputs.clear();
                    for b in 0..n {
                        for m in 0..side {
                            for j in 0..side {
                                inputs.push(x.at(b, m + a, j + c));
                                outputs.push(out.at(b, 2 * m + a + 1, 2 * j + c + 1));
                            }
                        }
                    }
                    let columns = Columns {
                        inputs: &inputs,
                        outputs: &outputs,
                    };
                    packed.matmul_gathered(x.data, runs, columns, &mut out.data, epilogue);
                }
                out
            }
            (Plan::Winograd(upsample), Source::Map(x)) => {
                let mut out = Map::zeros(n, 2 * x.side, cout);
                let zeros;
                let bias = if relu {
                    &self.bias[..]
                } else {
                    zeros = vec![0.0; cout];
                    &zeros[..]
                };
                upsample.forward(x.data, n, x.side, &mut out.data, bias, relu);
                out
            }
            (Plan::Scatter(packed), Source::Map(x)) => {
                let side = x.side;
                let mut out = Map::zeros(n, 2 * side, cout);
                let rows = cout * k * k;
                let positions = n * side * side;
                // The input pixels in chunks whose taps stay within a few
                // megabytes: one product gives every tap of every pixel of
                // the chunk, then each is added into its output pixel while
                // the chunk is in cache. In padded coordinates input pixel
                // (ih, iw)'s tap (kh, kw) lands on (2·ih + kh, 2·iw + kw),
                // inside the map or on its border (cleared afterwards).
                let chunk = (CHUNK_FLOATS / rows).max(1).min(positions);
                let mut taps = vec![0.0f32; rows * chunk];
                let outputs: Vec<usize> = (0..chunk).map(|j| j * rows).collect();
                let mut inputs = Vec::with_capacity(chunk);
                let runs = Runs {
                    count: 1,
                    len: cin,
                    stride: 0,
                };
                for first in (0..positions).step_by(chunk) {
                    let len = chunk.min(positions - first);
                    let pixel = |p: usize| (p / (side * side), p / side % side, p % side);
                    inputs.clear();
                    inputs.extend((first..first + len).map(|p| {
                        let (b, ih, iw) = pixel(p);
                        x.at(b, ih + 1, iw + 1)
                    }));
                    let columns = Columns {
                        inputs: &inputs,
                        outputs: &outputs[..len],
                    };
                    packed.matmul_gathered(x.data, runs, columns, &mut taps, Epilogue::Plain);
                    for (offset, src) in taps[..len * rows].chunks_exact(rows).enumerate() {
                        let (b, ih, iw) = pixel(first + offset);
                        for kh in 0..k {
                            for kw in 0..k {
                                let at = out.at(b, 2 * ih + kh, 2 * iw + kw);
                                let dst = &mut out.data[at..at + cout];
                                for (co, d) in dst.iter_mut().enumerate() {
                                    *d += src[(co * k + kh) * k + kw];
                                }
                            }
                        }
                    }
                }
                out.clear_border();
                out
            }
            _ => unreachable!("the first layer reads the input vectors and only it"),
        }
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

    /// Runs one strided layer on a batch of channel-major maps and returns
    /// its activated output, channel-major per image.
    fn run_layer(layer: &Layer, images: &[Vec<f32>], side: usize) -> Vec<Vec<f32>> {
        let mut map = Map::zeros(images.len(), side, layer.cin);
        for (b, x) in images.iter().enumerate() {
            for c in 0..layer.cin {
                for y in 0..side {
                    for i in 0..side {
                        let at = map.at(b, y + 1, i + 1) + c;
                        map.data[at] = x[(c * side + y) * side + i];
                    }
                }
            }
        }
        let out = layer.forward(Source::Map(map.images(0..images.len())), images.len());
        let applied = layer.applies();
        let out_side = 2 * side;
        assert_eq!(out.side, out_side);
        // The border stays zero for the next layer.
        let padded = out_side + 2;
        for b in 0..images.len() {
            for y in 0..padded {
                for i in 0..padded {
                    if y == 0 || i == 0 || y == padded - 1 || i == padded - 1 {
                        let at = out.at(b, y, i);
                        assert!(
                            out.data[at..at + layer.cout].iter().all(|v| *v == 0.0),
                            "border at ({y},{i})"
                        );
                    }
                }
            }
        }
        (0..images.len())
            .map(|b| {
                let mut chw = vec![0.0; layer.cout * out_side * out_side];
                for c in 0..layer.cout {
                    for y in 0..out_side {
                        for i in 0..out_side {
                            let v = out.data[out.at(b, y + 1, i + 1) + c];
                            chw[(c * out_side + y) * out_side + i] = if applied {
                                v
                            } else {
                                layer.activation.apply(v + layer.bias[c])
                            };
                        }
                    }
                }
                chw
            })
            .collect()
    }

    #[test]
    fn strided_layers_match_the_definition_by_scatter_and_by_sub_pixel() {
        // 2 and 3 output channels take the scatter, 16 and 17 the four
        // sub-pixel products (17: a ragged weight panel), sides 16 and 20
        // Winograd's F(4x4) (its rounding is looser).
        for (cin, cout, side, activation) in [
            (3, 2, 5, Activation::Tanh),
            (5, 3, 1, Activation::Relu),
            (3, 16, 5, Activation::Relu),
            (7, 17, 3, Activation::Relu),
            (4, 17, 1, Activation::Tanh),
            (8, 16, 16, Activation::Relu),
            (16, 24, 20, Activation::Tanh),
        ] {
            let w: Vec<f32> = (0..cin * cout * 16)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 10.0)
                .collect();
            let images: Vec<Vec<f32>> = (0..2)
                .map(|b| {
                    (0..cin * side * side)
                        .map(|i| (((i + 3 * b) * 5 % 13) as f32 - 6.0) / 7.0)
                        .collect()
                })
                .collect();
            let bias: Vec<f32> = (0..cout).map(|c| c as f32 / 10.0 - 0.5).collect();
            let mut layer = Layer {
                cin,
                cout,
                k: 4,
                stride: 2,
                pad: 1,
                weight: w.clone(),
                packed: None,
                bias: bias.clone(),
                activation,
            };
            layer.pack(side);
            let winograd = matches!(layer.packed, Some(Plan::Winograd(_)));
            assert_eq!(winograd, side >= WINOGRAD_SIDE, "({cin},{cout},{side})");
            let got = run_layer(&layer, &images, side);
            for (b, x) in images.iter().enumerate() {
                let want = reference(x, cin, side, &w, cout, 2, 1);
                for (i, (g, v)) in got[b].iter().zip(&want).enumerate() {
                    let plane = 4 * side * side;
                    let v = activation.apply(v + bias[i / plane]);
                    let tolerance = if winograd { 1e-4 } else { 1e-5 };
                    assert!(
                        (g - v).abs() < tolerance,
                        "({cin},{cout},{side}) image {b} [{i}]: {g} vs {v}"
                    );
                }
            }
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

        let batch = g.generate(&z, 2).unwrap();
        let single = g.generate(&z[..6], 1).unwrap();
        assert_eq!(batch[0], single[0], "an image does not depend on its batch");
        // Nor on the slices a batch goes through the later layers in.
        let whole = g.forward(&z, 2).unwrap();
        let mut sliced = g;
        sliced.map_floats = 1;
        assert_eq!(sliced.forward(&z, 2).unwrap(), whole);
        let close = batch[0].iter().zip(&want).all(|(a, b)| a.abs_diff(*b) <= 1);
        assert!(close, "{:?}\nvs\n{:?}", &batch[0][..24], &want[..24]);
        assert_ne!(batch[0], batch[1]);
    }

    /// A generator of every plan the kernels have: the first layer, the
    /// four sub-pixel products (32 and 16 output channels), Winograd (a
    /// 16-pixel map) and the scatter (3 output channels), with batch norms.
    fn every_plan() -> BTreeMap<String, Tensor> {
        let mut tensors = BTreeMap::new();
        let chain = [(10, 32), (32, 32), (32, 16), (16, 16), (16, 3)];
        for (i, (cin, cout)) in chain.into_iter().enumerate() {
            let conv = 3 * i;
            let spread = 4.0 / (cin as f32 * 4.0).sqrt();
            tensors.insert(
                format!("g.{conv}.weight"),
                tensor(&[cin, cout, 4, 4], |j| {
                    (((j * 7919 + i) % 211) as f32 / 105.0 - 1.0) * spread
                }),
            );
            if i + 1 < chain.len() {
                let bn = conv + 1;
                tensors.insert(
                    format!("g.{bn}.weight"),
                    tensor(&[cout], |c| 0.8 + (c % 5) as f32 / 10.0),
                );
                tensors.insert(format!("g.{bn}.bias"), tensor(&[cout], |c| (c % 3) as f32 / 10.0 - 0.1));
                tensors.insert(
                    format!("g.{bn}.running_mean"),
                    tensor(&[cout], |c| (c % 4) as f32 / 20.0),
                );
                tensors.insert(
                    format!("g.{bn}.running_var"),
                    tensor(&[cout], |c| 0.5 + (c % 7) as f32 / 7.0),
                );
            }
        }
        tensors
    }

    #[test]
    fn candle_on_the_cpu_gives_the_kernels_output_for_every_plan() {
        let tensors = every_plan();
        let kernels = Generator::from_tensors(&tensors, "g").unwrap();
        let cpu = Backend::Candle(Device::Cpu);
        let candle = Generator::from_tensors_on(&tensors, "g", &cpu).unwrap();
        assert_eq!((candle.input_len(), candle.side(), candle.channels()), (10, 64, 3));
        assert_eq!(kernels.backend_name(), "kernels");
        assert_eq!(candle.backend_name(), "candle Cpu");
        let plans: Vec<&str> = kernels
            .layers
            .iter()
            .map(|l| match l.packed {
                Some(Plan::First(_)) => "first",
                Some(Plan::SubPixel(_)) => "sub-pixel",
                Some(Plan::Winograd(_)) => "winograd",
                Some(Plan::Scatter(_)) => "scatter",
                None => "none",
            })
            .collect();
        assert_eq!(plans, ["first", "sub-pixel", "sub-pixel", "winograd", "scatter"]);
        assert!(candle.layers.iter().all(|l| l.packed.is_none() && l.weight.is_empty()));

        let n = 3;
        let z: Vec<f32> = (0..n * 10).map(|i| ((i * 37 % 29) as f32 - 14.0) / 7.0).collect();
        let (want, side) = kernels.forward(&z, n).unwrap();
        let (got, got_side) = candle.forward(&z, n).unwrap();
        assert_eq!((got_side, got.len()), (side, want.len()));
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "candle and the kernels differ by {worst}");
        assert!(
            want.iter().any(|v| v.abs() > 0.1),
            "the test model's output is all but zero"
        );
        assert_eq!(candle.generate(&z, n).unwrap().len(), n);
    }
}
