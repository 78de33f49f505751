//! The operations IFNet is made of, on channel-major (`C × H × W`) `f32`
//! maps: 3x3 convolutions with PReLU, the 4x4 stride-2 transposed
//! convolution that ends each block, bilinear resizing as PyTorch's
//! `F.interpolate(mode="bilinear", align_corners=False)` computes it, and the
//! backward warp of `warplayer.py` (`grid_sample`, bilinear, border padding,
//! `align_corners=True`).
//!
//! Both convolutions are products with weights packed once at load
//! ([`PackedWeights`]). The 3x3 ones are [`gantry_kernels::conv`]'s,
//! with PReLU as their activation. The transposed convolution multiplies the
//! input by the weights and scatter-adds each of the 16 taps into its output
//! pixel ("col2im").

use gantry_kernels::conv::{self, Activation, Conv2d};
use gantry_kernels::packed::PackedWeights;

/// Floats of product columns per chunk of a transposed convolution (256
/// KiB), which stay in the core's cache while they are scattered.
const CHUNK_FLOATS: usize = 1 << 16;

/// Buffers the operations reuse from one call to the next while a frame is
/// interpolated, so that a frame allocates (and the system maps in) a
/// handful of them instead of several per convolution.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub(crate) conv: conv::Scratch,
    cols: Vec<f32>,
}

impl Scratch {
    /// Floats (and indices) held.
    pub(crate) fn floats(&self) -> usize {
        self.conv.floats() + self.cols.capacity()
    }
}

/// A 3x3 convolution with padding 1, stride 1 or 2, and bias, followed by a
/// per-channel PReLU.
pub(crate) fn conv3(weight: &[f32], cin: usize, cout: usize, stride: usize, bias: Vec<f32>, alpha: Vec<f32>) -> Conv2d {
    Conv2d::new(weight, cin, cout, 3, stride, bias, Activation::PRelu(alpha))
}

/// `ConvTranspose2d(cin, cout, 4, stride 2, padding 1)` with bias: doubles
/// each side.
#[derive(Debug)]
pub(crate) struct Deconv4 {
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    /// `(cout·16) × cin` packed.
    packed: PackedWeights,
    bias: Vec<f32>,
}

impl Deconv4 {
    /// `weight` is PyTorch's `cin × cout × 4 × 4`.
    pub(crate) fn new(weight: &[f32], cin: usize, cout: usize, bias: Vec<f32>) -> Self {
        assert_eq!(
            weight.len(),
            cin * cout * 16,
            "transposed convolution weight has the wrong size"
        );
        assert_eq!(bias.len(), cout, "transposed convolution bias has the wrong size");
        Self {
            cin,
            cout,
            packed: PackedWeights::from_transposed(weight, cin, cout * 16),
            bias,
        }
    }

    /// `x` is `cin × h × w`; returns `cout × 2h × 2w`.
    #[cfg(test)]
    pub(crate) fn forward(&self, x: &[f32], h: usize, w: usize) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_into(x, h, w, &mut out, &mut Scratch::default());
        out
    }

    /// [`Deconv4::forward`] into `out` (resized to `cout × 2h × 2w`).
    pub(crate) fn forward_into(&self, x: &[f32], h: usize, w: usize, out: &mut Vec<f32>, scratch: &mut Scratch) {
        assert_eq!(
            x.len(),
            self.cin * h * w,
            "transposed convolution input has the wrong size"
        );
        let (oh, ow) = (2 * h, 2 * w);
        let taps = self.cout * 16;
        let positions = h * w;
        // Zeroed: the taps are added in.
        out.clear();
        out.resize(self.cout * oh * ow, 0.0);
        let chunk = (CHUNK_FLOATS / taps).clamp(1, positions);
        if scratch.cols.len() < taps * chunk {
            scratch.cols.resize(taps * chunk, 0.0);
        }
        let cols = &mut scratch.cols[..taps * chunk];
        let mut first = 0;
        while first < positions {
            let len = chunk.min(positions - first);
            let cols = &mut cols[..taps * len];
            self.packed.matmul(x, positions, first..first + len, cols);
            for (offset, src) in cols.chunks_exact(taps).enumerate() {
                let pixel = first + offset;
                let (iy, ix) = (pixel / w, pixel % w);
                for co in 0..self.cout {
                    let plane = &mut out[co * oh * ow..][..oh * ow];
                    for kh in 0..4 {
                        let oy = (2 * iy + kh) as isize - 1;
                        if oy < 0 || oy >= oh as isize {
                            continue;
                        }
                        let row = &mut plane[oy as usize * ow..][..ow];
                        let tap = &src[(co * 4 + kh) * 4..][..4];
                        for (kw, v) in tap.iter().enumerate() {
                            let ox = (2 * ix + kw) as isize - 1;
                            if ox >= 0 && ox < ow as isize {
                                row[ox as usize] += v;
                            }
                        }
                    }
                }
            }
            first += len;
        }
        for (plane, bias) in out.chunks_exact_mut(oh * ow).zip(&self.bias) {
            plane.iter_mut().for_each(|v| *v += bias);
        }
    }
}

/// Source taps of one axis of a bilinear resize: the two input indices and
/// the weight of the second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tap {
    pub(crate) i0: usize,
    pub(crate) i1: usize,
    pub(crate) lambda: f32,
}

/// PyTorch's `area_pixel_compute_source_index` for `align_corners=False`
/// with the caller's scale factor (`recompute_scale_factor=False`), then
/// the two neighbours as `upsample_bilinear2d` takes them.
pub(crate) fn taps(in_len: usize, out_len: usize, scale_factor: f64) -> Vec<Tap> {
    let inverse = (1.0 / scale_factor) as f32;
    (0..out_len)
        .map(|dst| {
            let src = (inverse * (dst as f32 + 0.5) - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(in_len - 1);
            let i1 = if i0 < in_len - 1 { i0 + 1 } else { i0 };
            let lambda = (src - i0 as f32).clamp(0.0, 1.0);
            Tap { i0, i1, lambda }
        })
        .collect()
}

/// Output side of `F.interpolate(scale_factor=...)`: `floor(len · factor)`.
pub(crate) fn resized_len(len: usize, scale_factor: f64) -> usize {
    (len as f64 * scale_factor).floor() as usize
}

/// `F.interpolate(x, scale_factor=f, mode="bilinear", align_corners=False,
/// recompute_scale_factor=False)` of `c × h × w`, each value then times
/// `multiplier`; returns `c × oh × ow`.
///
/// Computed as PyTorch's CPU kernel does, `h0·(w0·a + w1·b) + h1·(w0·c +
/// w1·d)`, but by rows: each input row's horizontal blends once, then each
/// output row as the blend of two of those.
#[cfg(test)]
pub(crate) fn resize(x: &[f32], c: usize, h: usize, w: usize, scale_factor: f64, multiplier: f32) -> Vec<f32> {
    let mut out = Vec::new();
    resize_onto(x, c, h, w, scale_factor, multiplier, &mut out);
    out
}

/// [`resize`], appending the result to `out`.
pub(crate) fn resize_onto(
    x: &[f32],
    c: usize,
    h: usize,
    w: usize,
    scale_factor: f64,
    multiplier: f32,
    out: &mut Vec<f32>,
) {
    assert_eq!(x.len(), c * h * w, "resize input has the wrong size");
    let (oh, ow) = (resized_len(h, scale_factor), resized_len(w, scale_factor));
    if oh == h && ow == w && multiplier == 1.0 {
        out.extend_from_slice(x);
        return;
    }
    let ys = taps(h, oh, scale_factor);
    let xs = taps(w, ow, scale_factor);
    let blend_row = |row: &[f32], out: &mut [f32]| {
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            *o = (1.0 - x.lambda) * row[x.i0] + x.lambda * row[x.i1];
        }
    };
    let start = out.len();
    out.resize(start + c * oh * ow, 0.0);
    // The horizontal blends of two input rows, and which rows they are.
    let (mut upper, mut lower) = (vec![0.0f32; ow], vec![0.0f32; ow]);
    for (plane, dst) in x.chunks_exact(h * w).zip(out[start..].chunks_exact_mut(oh * ow)) {
        let mut cached: [Option<usize>; 2] = [None, None];
        for (y, row) in ys.iter().zip(dst.chunks_exact_mut(ow)) {
            if cached[0] != Some(y.i0) {
                if cached[1] == Some(y.i0) {
                    std::mem::swap(&mut upper, &mut lower);
                    cached = [cached[1], cached[0]];
                } else {
                    blend_row(&plane[y.i0 * w..][..w], &mut upper);
                    cached[0] = Some(y.i0);
                }
            }
            if cached[1] != Some(y.i1) {
                blend_row(&plane[y.i1 * w..][..w], &mut lower);
                cached[1] = Some(y.i1);
            }
            let (h1, h0) = (y.lambda, 1.0 - y.lambda);
            for ((o, a), b) in row.iter_mut().zip(&upper).zip(&lower) {
                *o = (h0 * a + h1 * b) * multiplier;
            }
        }
    }
}

/// `warp(img, flow)` of `warplayer.py`: each output pixel samples `img`
/// (`c × h × w`) bilinearly at its own position plus the flow (`fx`, `fy`,
/// in pixels), coordinates clamped to the image (`grid_sample` with
/// `padding_mode="border"`, `align_corners=True`).
#[cfg(test)]
pub(crate) fn warp(img: &[f32], c: usize, fx: &[f32], fy: &[f32], h: usize, w: usize) -> Vec<f32> {
    let mut out = Vec::new();
    warp_into(img, c, fx, fy, h, w, &mut out);
    out
}

/// [`warp`] into `out` (resized to `c × h × w`).
pub(crate) fn warp_into(img: &[f32], c: usize, fx: &[f32], fy: &[f32], h: usize, w: usize, out: &mut Vec<f32>) {
    let plane = h * w;
    assert_eq!(img.len(), c * plane, "warp input has the wrong size");
    assert!(fx.len() == plane && fy.len() == plane, "flow has the wrong size");
    // For each pixel of a row: its top-left source and the weights of its
    // four neighbours, computed once for every channel. The top-left is kept
    // one short of the last row and column so its neighbours exist; there
    // the far ones weigh 1 (a sample on the last row or column itself).
    let (xmax, ymax) = ((w - 1) as f32, (h - 1) as f32);
    let (xlast, ylast) = (w.saturating_sub(2), h.saturating_sub(2));
    let (dx, dy) = (usize::from(w > 1), if h > 1 { w } else { 0 });
    let mut index = vec![0usize; w];
    let mut weights = vec![[0.0f32; 4]; w];
    // Every value is written below.
    out.truncate(c * plane);
    out.resize(c * plane, 0.0);
    for (y, (fx, fy)) in fx.chunks_exact(w).zip(fy.chunks_exact(w)).enumerate() {
        for (x, (((i, wt), fx), fy)) in index.iter_mut().zip(weights.iter_mut()).zip(fx).zip(fy).enumerate() {
            let ix = (x as f32 + fx).clamp(0.0, xmax);
            let iy = (y as f32 + fy).clamp(0.0, ymax);
            // Not negative: truncation is the floor.
            let (x0, y0) = ((ix as usize).min(xlast), (iy as usize).min(ylast));
            let (ax, ay) = (ix - x0 as f32, iy - y0 as f32);
            *i = y0 * w + x0;
            *wt = [(1.0 - ax) * (1.0 - ay), ax * (1.0 - ay), (1.0 - ax) * ay, ax * ay];
        }
        for (src, dst) in img.chunks_exact(plane).zip(out.chunks_exact_mut(plane)) {
            let dst = &mut dst[y * w..][..w];
            for ((d, i), [nw, ne, sw, se]) in dst.iter_mut().zip(&index).zip(&weights) {
                let i = *i;
                *d = src[i] * nw + src[i + dx] * ne + src[i + dy] * sw + src[i + dy + dx] * se;
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

    #[test]
    fn the_transposed_convolution_matches_its_definition() {
        let (cin, cout, h, w) = (3, 5, 4, 3);
        let weight = pseudo(cin * cout * 16, 4);
        let x = pseudo(cin * h * w, 5);
        let bias = pseudo(cout, 6);
        let got = Deconv4::new(&weight, cin, cout, bias.clone()).forward(&x, h, w);
        let (oh, ow) = (2 * h, 2 * w);
        let mut want: Vec<f32> = (0..cout * oh * ow).map(|i| bias[i / (oh * ow)]).collect();
        for ci in 0..cin {
            for iy in 0..h {
                for ix in 0..w {
                    for co in 0..cout {
                        for kh in 0..4 {
                            for kw in 0..4 {
                                let oy = (2 * iy + kh) as isize - 1;
                                let ox = (2 * ix + kw) as isize - 1;
                                if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                    continue;
                                }
                                want[(co * oh + oy as usize) * ow + ox as usize] +=
                                    x[(ci * h + iy) * w + ix] * weight[((ci * cout + co) * 4 + kh) * 4 + kw];
                            }
                        }
                    }
                }
            }
        }
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
    }

    #[test]
    fn bilinear_resize_matches_hand_computed_values() {
        // Downscale by 2: src = 2·dst + 0.5, the mean of each pair.
        let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let got = resize(&x, 1, 4, 4, 0.5, 1.0);
        assert_eq!(got, vec![2.5, 4.5, 10.5, 12.5]);
        // Downscale by 4 of four equal rows 0..8: src = 4·dst + 1.5 on
        // both axes.
        let rows: Vec<f32> = (0..32).map(|i| (i % 8) as f32).collect();
        assert_eq!(resize(&rows, 1, 4, 8, 0.25, 1.0), vec![1.5, 5.5]);
        // Upscale by 2 of [0, 4] (and its single row): src = (dst + 0.5)/2 −
        // 0.5 = −0.25 (clamped to 0), 0.25, 0.75, 1.25 (past the end: the
        // last value).
        assert_eq!(
            resize(&[0.0, 4.0], 1, 1, 2, 2.0, 1.0),
            [[0.0, 1.0, 3.0, 4.0]; 2].concat()
        );
        // Upscale by 4 of [0, 8], times 0.5: src = −0.375, −0.125 (clamped),
        // 0.125, 0.375, 0.625, 0.875, 1.125, 1.375.
        assert_eq!(
            resize(&[0.0, 8.0], 1, 1, 2, 4.0, 0.5),
            [[0.0, 0.0, 0.5, 1.5, 2.5, 3.5, 4.0, 4.0]; 4].concat()
        );
        // Two-dimensional upscale of a 2x2 map, one value by hand: output
        // (1, 2) samples (0.25, 0.75): rows 0/1 weight 0.75/0.25, columns
        // 0/1 weight 0.25/0.75.
        let m = [1.0, 2.0, 3.0, 5.0];
        let up = resize(&m, 1, 2, 2, 2.0, 1.0);
        let want = 0.75 * (0.25 * 1.0 + 0.75 * 2.0) + 0.25 * (0.25 * 3.0 + 0.75 * 5.0);
        assert!((up[4 + 2] - want).abs() < 1e-6, "{} vs {want}", up[6]);
        assert_eq!(up.len(), 16);
    }

    #[test]
    fn warping_by_zero_flow_is_the_identity() {
        let (c, h, w) = (3, 5, 7);
        let img = pseudo(c * h * w, 7);
        let zero = vec![0.0; h * w];
        assert_eq!(warp(&img, c, &zero, &zero, h, w), img);
    }

    #[test]
    fn warping_shifts_and_clamps_at_the_border() {
        let (h, w) = (2, 4);
        let img: Vec<f32> = (0..8).map(|i| i as f32).collect();
        // Sample one and a half pixels to the right: past the right edge the
        // border value repeats.
        let fx = vec![1.5; 8];
        let fy = vec![0.0; 8];
        assert_eq!(
            warp(&img, 1, &fx, &fy, h, w),
            vec![1.5, 2.5, 3.0, 3.0, 5.5, 6.5, 7.0, 7.0]
        );
        // Half a pixel up from the bottom row.
        let fy = vec![-0.5; 8];
        let fx = vec![0.0; 8];
        assert_eq!(
            warp(&img, 1, &fx, &fy, h, w),
            vec![0.0, 1.0, 2.0, 3.0, 2.0, 3.0, 4.0, 5.0]
        );
    }
}
