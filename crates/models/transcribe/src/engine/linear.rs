//! Dense layers on the packed AVX2/FMA kernel, and the small pieces of
//! arithmetic around them (layer norm, GELU, softmax, threading).
#![allow(clippy::needless_range_loop)]

pub use gantry_kernels::math::{fast_exp, gelu, softmax, sum_exp};
use gantry_kernels::packed::{INPUT_BLOCK, PackedWeights};

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

pub use gantry_kernels::packed::pack_rows;

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
}
