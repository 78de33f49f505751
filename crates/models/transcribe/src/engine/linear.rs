//! Dense layers on the packed AVX2/FMA kernel, and the small pieces of
//! arithmetic around them (layer norm, GELU, softmax, threading).
#![allow(clippy::needless_range_loop)]

use gantry_model_image::packed::{INPUT_BLOCK, PackedWeights};

/// `y = W·x + b` for each row `x` of a row-major input.
#[derive(Debug)]
pub struct Linear {
    w: PackedWeights,
    /// The weight row-major too, for one row of input (the decoder's steps),
    /// where dot products beat the packed kernel's six-column blocks.
    rows: Option<Vec<f32>>,
    bias: Option<Vec<f32>>,
    pub out: usize,
    pub inp: usize,
}

pub use gantry_model_image::packed::pack_rows;

impl Linear {
    /// From a weight of shape `(out, inp)`, row-major, and an optional bias.
    pub fn new(weight: &[f32], bias: Option<Vec<f32>>, out: usize, inp: usize) -> Self {
        Self {
            w: PackedWeights::from_rows(weight, out, inp),
            rows: None,
            bias,
            out,
            inp,
        }
    }

    /// As [`Linear::new`], keeping the row-major weight for single rows.
    pub fn with_rows(weight: Vec<f32>, bias: Option<Vec<f32>>, out: usize, inp: usize) -> Self {
        let mut l = Self::new(&weight, bias, out, inp);
        l.rows = Some(weight);
        l
    }

    /// `out[i] = W·x[i] + b` for the `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
        if n == 1
            && let Some(w) = &self.rows
        {
            let x = &x[..self.inp];
            for (r, o) in out[..self.out].iter_mut().enumerate() {
                *o = dot(&w[r * self.inp..(r + 1) * self.inp], x) + self.bias.as_ref().map_or(0.0, |b| b[r]);
            }
            return;
        }
        pack_rows(x, n, self.inp, scratch);
        self.forward_packed(scratch, n, out);
    }

    /// Outputs `first .. first + out.len()` (bias included) of one input row,
    /// from the row-major weight.
    pub fn rows_forward(&self, x: &[f32], first: usize, out: &mut [f32]) {
        let w = self.rows.as_deref().unwrap_or_default();
        let x = &x[..self.inp];
        for (i, o) in out.iter_mut().enumerate() {
            let r = first + i;
            *o = dot(&w[r * self.inp..(r + 1) * self.inp], x) + self.bias.as_ref().map_or(0.0, |b| b[r]);
        }
    }

    /// `out = W[:, first .. first + x.len()] · x`, without the bias: the
    /// part of one row's product that some of its inputs make.
    pub fn partial_forward(&self, x: &[f32], first: usize, out: &mut [f32]) {
        let w = self.rows.as_deref().unwrap_or_default();
        for (r, o) in out[..self.out].iter_mut().enumerate() {
            *o = dot(&w[r * self.inp + first..][..x.len()], x);
        }
    }

    /// Adds the bias to one output row.
    pub fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            for (o, b) in out.iter_mut().zip(b) {
                *o += b;
            }
        }
    }

    /// As [`Linear::forward`], of input already packed.
    pub fn forward_packed(&self, xp: &[f32], n: usize, out: &mut [f32]) {
        self.w.matmul_packed(xp, n, &mut out[..n * self.out]);
        if let Some(b) = &self.bias {
            for row in out[..n * self.out].chunks_exact_mut(self.out) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
    }
}

/// Layer normalisation (ε = 1e-5) with a gain and a bias.
#[derive(Debug)]
pub struct LayerNorm {
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
}

impl LayerNorm {
    /// Normalises each row of `x` into `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.gamma.len();
        for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean = row.iter().map(|v| f64::from(*v)).sum::<f64>() / d as f64;
            let var = row
                .iter()
                .map(|v| {
                    let c = f64::from(*v) - mean;
                    c * c
                })
                .sum::<f64>()
                / d as f64;
            let inv = 1.0 / (var + 1e-5).sqrt();
            for i in 0..d {
                o[i] = ((f64::from(row[i]) - mean) * inv) as f32 * self.gamma[i] + self.beta[i];
            }
        }
    }
}

/// The error function to within 4e-7 (Abramowitz and Stegun 7.1.26, in f32),
/// branch-free so that loops of it vectorise.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_74) * t + 0.254_829_6) * t;
    (1.0 - poly * fast_exp(-a * a)).copysign(x)
}

/// GELU with the (exact, not tanh-approximated) error function.
pub fn gelu(x: &mut [f32]) {
    for v in x {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// `eˣ` to about one ulp (Cephes' `expf`), branch-free so that loops of it
/// vectorise; arguments below −87.3 give the smallest normal float, not 0.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let x = x.clamp(-87.336_55, 88.722_83);
    let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `Σ exp(x - max)` over `x`, in `f64`.
pub fn sum_exp(x: &[f32], max: f32) -> f64 {
    let mut acc = [0.0f32; 8];
    let (chunks, rest) = x.as_chunks::<8>();
    let mut total = 0.0f64;
    for (i, c) in chunks.iter().enumerate() {
        for j in 0..8 {
            acc[j] += fast_exp(c[j] - max);
        }
        if i % 64 == 63 {
            total += acc.iter().map(|v| f64::from(*v)).sum::<f64>();
            acc = [0.0; 8];
        }
    }
    total += acc.iter().map(|v| f64::from(*v)).sum::<f64>();
    total + rest.iter().map(|v| f64::from(fast_exp(v - max))).sum::<f64>()
}

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = fast_exp(*v - max);
    }
    let sum: f32 = {
        let mut acc = [0.0f32; 8];
        let (chunks, rest) = x.as_chunks::<8>();
        for c in chunks {
            for j in 0..8 {
                acc[j] += c[j];
            }
        }
        acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
    };
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// A dot product the compiler vectorises (eight partial sums).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// `y += a·x`.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Runs `work(first_row, rows)` over `threads` contiguous pieces of `out`
/// (`n` rows of `row_len`), each a multiple of the kernel's input block
/// where possible; the calling thread takes the first piece.
pub fn par_rows<F>(out: &mut [f32], n: usize, row_len: usize, threads: usize, work: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let threads = threads.clamp(1, n.div_ceil(INPUT_BLOCK).max(1));
    if threads == 1 {
        work(0, &mut out[..n * row_len]);
        return;
    }
    let per = n.div_ceil(threads).div_ceil(INPUT_BLOCK) * INPUT_BLOCK;
    in_pieces(&mut out[..n * row_len], per, row_len, work);
}

/// Runs `work(first_unit, piece)` on the pieces of `out` that hold `per`
/// units of `unit` values each, a thread per piece; the calling thread
/// takes the first.
pub fn in_pieces<F>(out: &mut [f32], per: usize, unit: usize, work: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    std::thread::scope(|s| {
        let mut pieces = out.chunks_mut(per * unit).enumerate();
        let first = pieces.next();
        for (i, piece) in pieces {
            let work = &work;
            s.spawn(move || work(i * per, piece));
        }
        if let Some((_, piece)) = first {
            work(0, piece);
        }
    });
}

/// Number of threads to use for `threads` (0 = one per core).
pub fn resolve_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_the_schoolbook_product() {
        let (out, inp, n) = (19, 13, 8);
        let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
        let b: Vec<f32> = (0..out).map(|i| i as f32 / 3.0).collect();
        let x: Vec<f32> = (0..n * inp).map(|i| ((i * 5 % 17) as f32 - 8.0) / 5.0).collect();
        let lin = Linear::new(&w, Some(b.clone()), out, inp);
        let mut y = vec![0.0; n * out];
        lin.forward(&x, n, &mut y, &mut Vec::new());
        let single = Linear::with_rows(w.clone(), Some(b.clone()), out, inp);
        for i in 0..n {
            let mut y1 = vec![0.0; out];
            single.forward(&x[i * inp..(i + 1) * inp], 1, &mut y1, &mut Vec::new());
            for r in 0..out {
                assert!((y1[r] - y[i * out + r]).abs() < 1e-4);
            }
        }
        for i in 0..n {
            for r in 0..out {
                let want: f32 = b[r] + (0..inp).map(|k| w[r * inp + k] * x[i * inp + k]).sum::<f32>();
                assert!((y[i * out + r] - want).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn fast_exp_is_within_two_ulps() {
        for i in -8700..8800 {
            let x = i as f32 / 100.0;
            let want = f64::from(x).exp();
            let got = f64::from(fast_exp(x));
            assert!(((got - want) / want).abs() < 2.5e-7, "exp({x}) = {got}, not {want}");
        }
        assert!(fast_exp(f32::NEG_INFINITY) < 1.2e-38);
        let x = [0.5f32, -1.0, 2.0, -3.0, 0.0, 1.0, -0.25, 3.0, 1.5, -2.0];
        let want: f64 = x.iter().map(|v| (f64::from(*v) - 3.0).exp()).sum();
        assert!((sum_exp(&x, 3.0) - want).abs() < 1e-6);
    }

    #[test]
    fn erf_is_within_4e_7() {
        // The Maclaurin series, in f64 (enough terms for |x| ≤ 4).
        let series = |x: f64| {
            let (mut term, mut sum) = (x, x);
            for n in 1..120 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        };
        for i in -400..400 {
            let x = i as f32 / 100.0;
            let want = series(f64::from(x));
            assert!((f64::from(erf(x)) - want).abs() < 4e-7, "erf({x}): {}", erf(x));
        }
    }

    #[test]
    fn gelu_uses_the_error_function() {
        let mut x = [-3.0f32, -0.5, 0.0, 1.0, 2.5];
        gelu(&mut x);
        let want = [-0.004_049_694f32, -0.154_268_77, 0.0, 0.841_344_8, 2.484_475_8];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
}
