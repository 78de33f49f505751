//! Convolutions on channel-major (`C × H × W`) `f32` maps as products with
//! weights packed once at load ([`PackedWeights`]): 3x3 with padding 1 and
//! stride 1 or 2, and 1x1, each with a bias and optionally a per-channel
//! PReLU. RIFE's flow network and the Stable Diffusion UNet and VAE decoder
//! run on them.
//!
//! The input taps of each chunk of output pixels are gathered ("im2col",
//! `cin·k² × pixels`) straight into the layout the product streams: six
//! pixels side by side per tap, copied six at a time from the zero-padded
//! input, which a stride-2 convolution first splits into its four phases so
//! that those six are neighbours there too. The product writes each output
//! channel's row into a buffer that stays in cache, from which bias and
//! activation are applied on the way to the output. A chunk holds as many
//! pixels as let every weight read from memory serve them all
//! ([`columns_per_call`]). On several threads, a map is split by output
//! pixels, each thread gathering and multiplying its own chunks, or, when
//! it is too small for that, by output channels (the weights' panels), so
//! that each thread reads only its share of the weights.

use std::ops::Range;

use rayon::prelude::*;

use crate::packed::{INPUT_BLOCK as NR, PackedWeights, columns_per_call};
use crate::winograd::{Tile, Winograd};

/// Buffers a convolution reuses from one call to the next, so that a chain
/// of them allocates a handful of buffers instead of several per call.
#[derive(Debug, Default)]
pub struct Scratch {
    pub(crate) padded: Vec<f32>,
    corner: Vec<usize>,
    /// One set per thread.
    pub(crate) buffers: Vec<Buffers>,
}

/// A thread's gathered taps and product.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    pub(crate) xp: Vec<f32>,
    pub(crate) prod: Vec<f32>,
}

impl Scratch {
    /// Floats (and indices) held.
    pub fn floats(&self) -> usize {
        self.padded.capacity()
            + self.corner.capacity()
            + self
                .buffers
                .iter()
                .map(|b| b.xp.capacity() + b.prod.capacity())
                .sum::<usize>()
    }
}

/// The first `len` elements of `v`, grown (never shrunk) to hold them; what
/// they hold is left from before.
pub(crate) fn fit<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// What follows the bias.
#[derive(Debug, Clone, PartialEq)]
pub enum Activation {
    Identity,
    /// PReLU with one slope per output channel.
    PRelu(Vec<f32>),
}

/// A `k × k` convolution (`k` 1 or 3, padding `k / 2`) with bias.
#[derive(Debug)]
pub struct Conv2d {
    cin: usize,
    cout: usize,
    kernel: usize,
    stride: usize,
    weights: Weights,
    bias: Vec<f32>,
    activation: Activation,
}

/// How the products are formed.
#[derive(Debug)]
enum Weights {
    /// `cout × (cin·k²)` packed, multiplied by the gathered input taps.
    Taps(PackedWeights),
    /// Transformed for Winograd's algorithm (3x3, stride 1).
    Winograd(Winograd),
}

/// The padded input of one image, split into its stride phases, and where
/// each output pixel's taps lie in it.
struct Layout {
    /// Side of the output.
    oh: usize,
    ow: usize,
    /// Floats per channel of the padded input (all its phases).
    plane: usize,
    /// Offset of each tap from the pixel's first tap.
    taps: [usize; 9],
}

impl Conv2d {
    /// `weight` is PyTorch's `cout × cin × k × k`. Supported: `k = 3` with
    /// stride 1 or 2, and `k = 1` with stride 1.
    pub fn new(
        weight: &[f32],
        cin: usize,
        cout: usize,
        kernel: usize,
        stride: usize,
        bias: Vec<f32>,
        activation: Activation,
    ) -> Self {
        assert!(
            (kernel == 3 && (stride == 1 || stride == 2)) || (kernel == 1 && stride == 1),
            "only 3x3 convolutions of stride 1 or 2 and 1x1 convolutions of stride 1 are supported"
        );
        let depth = cin * kernel * kernel;
        assert_eq!(weight.len(), cout * depth, "convolution weight has the wrong size");
        let weights = Weights::Taps(PackedWeights::from_rows(weight, cout, depth));
        Self::with((cin, cout), (kernel, stride), weights, bias, activation)
    }

    /// The convolution of these weights, its bias and activation checked.
    fn with(
        (cin, cout): (usize, usize),
        (kernel, stride): (usize, usize),
        weights: Weights,
        bias: Vec<f32>,
        activation: Activation,
    ) -> Self {
        assert_eq!(bias.len(), cout, "convolution bias has the wrong size");
        if let Activation::PRelu(alpha) = &activation {
            assert_eq!(alpha.len(), cout, "PReLU slopes have the wrong size");
        }
        Self {
            cin,
            cout,
            kernel,
            stride,
            weights,
            bias,
            activation,
        }
    }

    /// A 3x3 convolution of stride 1 (padding 1) computed by Winograd's
    /// algorithm with output tiles of `tile` ([`crate::winograd`]): 2.25x
    /// (`F2`) or 4x (`F4`) fewer multiplications than [`Conv2d::new`]'s,
    /// for `(m + 2)² / 9` times the weights' memory. It pays on maps of
    /// many tiles; on a handful the transforms and the `(m + 2)²` separate
    /// products cost more than they save.
    pub fn winograd(
        weight: &[f32],
        cin: usize,
        cout: usize,
        bias: Vec<f32>,
        activation: Activation,
        tile: Tile,
    ) -> Self {
        let weights = Weights::Winograd(Winograd::new(weight, cin, cout, tile));
        Self::with((cin, cout), (3, 1), weights, bias, activation)
    }

    pub fn cin(&self) -> usize {
        self.cin
    }

    pub fn cout(&self) -> usize {
        self.cout
    }

    /// Output side for an input side.
    pub fn out_len(&self, len: usize) -> usize {
        (len + 2 * (self.kernel / 2) - self.kernel) / self.stride + 1
    }

    /// `x` is `cin × h × w`; returns `cout × oh × ow`, on this thread.
    pub fn forward(&self, x: &[f32], h: usize, w: usize) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_into(x, h, w, &mut out, &mut Scratch::default());
        out
    }

    /// [`Conv2d::forward`] into `out` (resized to `cout × oh × ow`).
    pub fn forward_into(&self, x: &[f32], h: usize, w: usize, out: &mut Vec<f32>, scratch: &mut Scratch) {
        let pixels = self.out_len(h) * self.out_len(w);
        // Every value is written.
        out.truncate(self.cout * pixels);
        out.resize(self.cout * pixels, 0.0);
        self.image(x, h, w, out, scratch, 1);
    }

    /// A batch (`x` is `batch × cin × h × w`), each image split between the
    /// threads of the current rayon pool, by output pixels or, on a map too
    /// small for that, by output channels; returns `batch × cout × oh × ow`.
    pub fn forward_batch(&self, x: &[f32], batch: usize, h: usize, w: usize, scratch: &mut Scratch) -> Vec<f32> {
        assert_eq!(
            x.len(),
            batch * self.cin * h * w,
            "convolution input has the wrong size"
        );
        let size = self.cout * self.out_len(h) * self.out_len(w);
        let mut out = vec![0.0f32; batch * size];
        let parts = rayon::current_num_threads().max(1);
        if size > 0 {
            for (x, out) in x.chunks_exact(self.cin * h * w).zip(out.chunks_exact_mut(size)) {
                self.image(x, h, w, out, scratch, parts);
            }
        }
        out
    }

    /// The zero-padded input, split into stride phases, into
    /// `scratch.padded`.
    fn pad(&self, x: &[f32], h: usize, w: usize, scratch: &mut Scratch) -> Layout {
        let (s, p) = (self.stride, self.kernel / 2);
        // Tap (kh, kw) of output pixel (oy, ox) is padded pixel (s·oy + kh,
        // s·ox + kw), which is (oy + kh/s, ox + kw/s) of phase (kh%s, kw%s).
        let (ph, pw) = ((h + 2 * p).div_ceil(s), (w + 2 * p).div_ceil(s));
        let phase = ph * pw;
        let plane = s * s * phase;
        let padded = fit(&mut scratch.padded, self.cin * plane);
        if p > 0 {
            padded.fill(0.0);
        }
        for (src, dst) in x.chunks_exact(h * w).zip(padded.chunks_exact_mut(plane)) {
            for (y, row) in src.chunks_exact(w).enumerate() {
                let py = y + p;
                let start = (py % s) * s * phase + (py / s) * pw;
                if s == 1 {
                    dst[start + p..][..w].copy_from_slice(row);
                } else {
                    // Column x is padded column x + 1: even x to the odd
                    // phase at x/2, odd x to the even phase at (x + 1)/2.
                    let (even, odd) = dst[start..].split_at_mut(phase);
                    for (k, pair) in row.chunks(2).enumerate() {
                        odd[k] = pair[0];
                        if let Some(v) = pair.get(1) {
                            even[k + 1] = *v;
                        }
                    }
                }
            }
        }
        let k = self.kernel;
        let taps = std::array::from_fn(|t| {
            let (kh, kw) = (t / k, t % k);
            ((kh % s) * s + kw % s) * phase + (kh / s) * pw + kw / s
        });
        let (oh, ow) = (self.out_len(h), self.out_len(w));
        let corner = &mut scratch.corner;
        corner.clear();
        corner.extend((0..oh).flat_map(|oy| (0..ow).map(move |ox| oy * pw + ox)));
        Layout { oh, ow, plane, taps }
    }

    /// One image into `out` (`cout × oh × ow`), on `parts` threads of the
    /// current rayon pool: split by output pixels when each thread gets at
    /// least a chunk of them, by output channels otherwise (a small map
    /// with many channels, where reading the weights is most of the cost
    /// and each thread then reads only its share).
    fn image(&self, x: &[f32], h: usize, w: usize, out: &mut [f32], scratch: &mut Scratch, parts: usize) {
        assert_eq!(x.len(), self.cin * h * w, "convolution input has the wrong size");
        let packed = match &self.weights {
            Weights::Taps(packed) => packed,
            Weights::Winograd(winograd) => {
                assert_eq!(out.len(), self.cout * h * w, "convolution output has the wrong size");
                return winograd.image(x, (h, w), out, &self.bias, &self.activation, scratch, parts);
            }
        };
        let layout = self.pad(x, h, w, scratch);
        let pixels = layout.oh * layout.ow;
        assert_eq!(out.len(), self.cout * pixels, "convolution output has the wrong size");
        let Scratch {
            padded,
            corner,
            buffers,
        } = scratch;
        let (padded, corner) = (&padded[..], &corner[..]);
        let panels = packed.panels();
        let chunk = columns_per_call(self.cin * self.kernel * self.kernel);
        buffers.resize_with(parts.max(1), Default::default);
        if parts <= 1 || panels == 0 {
            let mut planes: Vec<&mut [f32]> = out.chunks_exact_mut(pixels).collect();
            self.run(packed, padded, &layout, corner, 0..panels, &mut planes, &mut buffers[0]);
        } else if pixels >= parts * chunk {
            // Thread t computes pixels bounds[t]..bounds[t + 1] of every
            // plane (whole register blocks, the last thread the rest).
            let bounds: Vec<usize> = (0..=parts)
                .map(|t| {
                    if t == parts {
                        pixels
                    } else {
                        pixels * t / parts / NR * NR
                    }
                })
                .collect();
            let mut shares: Vec<Vec<&mut [f32]>> = (0..parts).map(|_| Vec::with_capacity(self.cout)).collect();
            for plane in out.chunks_exact_mut(pixels) {
                let mut rest = plane;
                for (t, share) in shares.iter_mut().enumerate() {
                    let (mine, tail) = rest.split_at_mut(bounds[t + 1] - bounds[t]);
                    share.push(mine);
                    rest = tail;
                }
            }
            shares
                .par_iter_mut()
                .zip(buffers.par_iter_mut())
                .enumerate()
                .for_each(|(t, (planes, buffers))| {
                    let corners = &corner[bounds[t]..bounds[t + 1]];
                    self.run(packed, padded, &layout, corners, 0..panels, planes, buffers);
                });
        } else {
            // Thread t computes the rows of panels ranges[t], all pixels
            // (no more threads than panels).
            let parts = parts.min(panels);
            let ranges: Vec<Range<usize>> = (0..parts)
                .map(|t| panels * t / parts..panels * (t + 1) / parts)
                .collect();
            let mut shares: Vec<Vec<&mut [f32]>> = Vec::with_capacity(parts);
            let mut rest = out;
            for range in &ranges {
                let rows = packed.panel_rows(range.clone()).len();
                let (mine, tail) = rest.split_at_mut(rows * pixels);
                shares.push(mine.chunks_exact_mut(pixels).collect());
                rest = tail;
            }
            shares
                .par_iter_mut()
                .zip(buffers.par_iter_mut())
                .zip(&ranges)
                .for_each(|((planes, buffers), range)| {
                    self.run(packed, padded, &layout, corner, range.clone(), planes, buffers);
                });
        }
    }

    /// The output pixels whose first taps lie at `corners`, for the rows of
    /// the weights' `panels`: `planes[r]` is row `r`'s part of its plane.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        packed: &PackedWeights,
        padded: &[f32],
        layout: &Layout,
        corners: &[usize],
        panels: Range<usize>,
        planes: &mut [&mut [f32]],
        buffers: &mut Buffers,
    ) {
        let rows = packed.panel_rows(panels.clone());
        let depth = self.cin * self.kernel * self.kernel;
        let chunk = columns_per_call(depth);
        let total = corners.len();
        let mut first = 0;
        while first < total {
            let n = chunk.min(total - first);
            let xp = fit(&mut buffers.xp, n.div_ceil(NR) * depth * NR);
            self.gather(padded, layout, &corners[first..first + n], xp);
            let prod = fit(&mut buffers.prod, rows.len() * n);
            packed.matmul_packed_rows_of(panels.clone(), xp, n, prod, n);
            for ((co, src), dst) in rows.clone().zip(prod.chunks_exact(n)).zip(planes.iter_mut()) {
                let bias = self.bias[co];
                let dst = &mut dst[first..first + n];
                match &self.activation {
                    Activation::Identity => {
                        for (d, v) in dst.iter_mut().zip(src) {
                            *d = v + bias;
                        }
                    }
                    Activation::PRelu(alpha) => {
                        let alpha = alpha[co];
                        for (d, v) in dst.iter_mut().zip(src) {
                            let y = v + bias;
                            *d = if y > 0.0 { y } else { alpha * y };
                        }
                    }
                }
            }
            first += n;
        }
    }

    /// The input taps of the output pixels whose first taps lie at
    /// `corners`, gathered into the product's packed layout: block b, row k
    /// = (ci, kh, kw), lane q holds tap k of pixel b·NR + q.
    fn gather(&self, padded: &[f32], layout: &Layout, corners: &[usize], xp: &mut [f32]) {
        let taps = self.kernel * self.kernel;
        let depth = self.cin * taps;
        let plane = layout.plane;
        let offsets = &layout.taps[..taps];
        for (b, block) in xp.chunks_exact_mut(depth * NR).enumerate() {
            let corners = &corners[b * NR..corners.len().min((b + 1) * NR)];
            let (lanes, _) = block.as_chunks_mut::<NR>();
            let c0 = corners[0];
            if corners.len() == NR && corners[NR - 1] == c0 + NR - 1 {
                // A block of neighbours on one row: plain copies.
                for (ci, lanes) in lanes.chunks_exact_mut(taps).enumerate() {
                    let src = &padded[ci * plane + c0..];
                    for (lane, off) in lanes.iter_mut().zip(offsets) {
                        if let Some(v) = src[*off..].first_chunk::<NR>() {
                            *lane = *v;
                        }
                    }
                }
            } else {
                for (ci, lanes) in lanes.chunks_exact_mut(taps).enumerate() {
                    let src = &padded[ci * plane..][..plane];
                    for (lane, off) in lanes.iter_mut().zip(offsets) {
                        for (v, c) in lane.iter_mut().zip(corners) {
                            *v = src[c + off];
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 2.0)
            .collect()
    }

    /// The convolution as its definition reads.
    fn naive(x: &[f32], (cin, h, w): (usize, usize, usize), conv: &Conv2d, weight: &[f32]) -> Vec<f32> {
        let (k, s, cout) = (conv.kernel, conv.stride, conv.cout);
        let p = k / 2;
        let (oh, ow) = (conv.out_len(h), conv.out_len(w));
        let mut out = vec![0.0; cout * oh * ow];
        for co in 0..cout {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = conv.bias[co];
                    for ci in 0..cin {
                        for kh in 0..k {
                            for kw in 0..k {
                                let iy = (oy * s + kh) as isize - p as isize;
                                let ix = (ox * s + kw) as isize - p as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                acc += x[(ci * h + iy as usize) * w + ix as usize]
                                    * weight[((co * cin + ci) * k + kh) * k + kw];
                            }
                        }
                    }
                    out[(co * oh + oy) * ow + ox] = match &conv.activation {
                        Activation::PRelu(alpha) if acc <= 0.0 => alpha[co] * acc,
                        _ => acc,
                    };
                }
            }
        }
        out
    }

    fn close(got: &[f32], want: &[f32], what: &str) {
        close_within(got, want, 1e-4, what);
    }

    fn close_within(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < tolerance * (1.0 + w.abs()), "{what} [{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn every_kind_matches_a_naive_loop() {
        // The later ones span several chunks of gathered taps, and (at 40
        // input channels) several slices of the shared dimension.
        for (cin, cout, h, w, k, stride) in [
            (3, 5, 7, 9, 3, 1),
            (4, 17, 8, 6, 3, 2),
            (2, 3, 5, 5, 3, 2),
            (1, 16, 1, 3, 3, 1),
            (16, 20, 24, 25, 3, 1),
            (16, 7, 51, 50, 3, 2),
            (40, 33, 13, 11, 3, 1),
            (5, 9, 7, 3, 1, 1),
            (300, 18, 4, 5, 1, 1),
        ] {
            let weight = pseudo(cout * cin * k * k, 1);
            let x = pseudo(cin * h * w, 2);
            for activation in [
                Activation::Identity,
                Activation::PRelu((0..cout).map(|i| 0.1 * i as f32).collect()),
            ] {
                let conv = Conv2d::new(&weight, cin, cout, k, stride, pseudo(cout, 3), activation);
                let want = naive(&x, (cin, h, w), &conv, &weight);
                let what = format!("({cin},{cout},{h},{w},k{k},s{stride})");
                close(&conv.forward(&x, h, w), &want, &what);
            }
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn winograd_matches_a_naive_loop_on_one_thread_and_on_three() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        // Sides that are and are not multiples of the tile, maps smaller
        // than one tile, more tiles than a chunk holds (the last), and deep
        // sums (300 input channels).
        for (cin, cout, h, w) in [
            (3, 8, 7, 9),
            (1, 8, 1, 1),
            (2, 16, 2, 3),
            (16, 24, 24, 25),
            (41, 32, 13, 11),
            (300, 16, 9, 8),
            (8, 8, 70, 66),
            (8, 8, 210, 190),
        ] {
            let weight = pseudo(cout * cin * 9, 8);
            let x = pseudo(cin * h * w, 9);
            for tile in [Tile::F2, Tile::F4] {
                for activation in [
                    Activation::Identity,
                    Activation::PRelu((0..cout).map(|i| 0.1 * i as f32).collect()),
                ] {
                    let conv = Conv2d::winograd(&weight, cin, cout, pseudo(cout, 10), activation, tile);
                    let want = naive(&x, (cin, h, w), &conv, &weight);
                    let what = format!("({cin},{cout},{h},{w}) {tile:?}");
                    // Rounding grows with the sum's length and with the
                    // transforms' coefficients (up to 8 for F4): 2e-5 of
                    // the typical size of a sum of 9·cin products of
                    // values in [-1, 1].
                    let tolerance = (2e-5 * ((9 * cin) as f32).sqrt()).max(1e-4);
                    close_within(&conv.forward(&x, h, w), &want, tolerance, &what);
                    let batch = [x.clone(), x.clone()].concat();
                    let mut scratch = Scratch::default();
                    let got = pool.install(|| conv.forward_batch(&batch, 2, h, w, &mut scratch));
                    let want = [want.clone(), want].concat();
                    close_within(&got, &want, tolerance, &format!("{what} on three threads"));
                }
            }
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_batch_split_between_threads_gives_each_image_its_own_result() {
        // A small map with many channels is split by channels, a large one
        // by pixels (more than three chunks of gathered taps).
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        // The last has fewer output channels (one panel) than threads.
        for (cin, cout, h, w, stride) in [
            (12, 70, 9, 10, 1),
            (4, 20, 60, 50, 1),
            (3, 18, 241, 100, 2),
            (5, 3, 70, 60, 1),
        ] {
            let what = format!("({cin},{cout},{h},{w},s{stride})");
            let weight = pseudo(cout * cin * 9, 4);
            let conv = Conv2d::new(&weight, cin, cout, 3, stride, pseudo(cout, 5), Activation::Identity);
            let images = [pseudo(cin * h * w, 6), pseudo(cin * h * w, 7)];
            let batch: Vec<f32> = images.concat();
            let mut scratch = Scratch::default();
            let got = pool.install(|| conv.forward_batch(&batch, 2, h, w, &mut scratch));
            let want: Vec<f32> = images
                .iter()
                .flat_map(|x| naive(x, (cin, h, w), &conv, &weight))
                .collect();
            close(&got, &want, &format!("{what}: a batch of two on three threads"));
            // The scratch is reused for another batch.
            let got = pool.install(|| conv.forward_batch(&images[0], 1, h, w, &mut scratch));
            close(&got, &want[..got.len()], &format!("{what}: one image after two"));
        }
    }
}
