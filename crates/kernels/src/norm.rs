//! The two passes of a group norm followed by SiLU, vectorised: the
//! statistics of a group (sums of eight lanes over short runs, carried in
//! f64), and `silu(x · scale + shift)` with an exponential of its own
//! (Cephes' range reduction and polynomial, within a few float32 ulps of
//! libm's), so that eight values take a handful of vector instructions
//! instead of eight calls to `expf`; and, with the same exponential, the
//! gated GELU of Stable Diffusion's feed-forward layers and the softmax of
//! its attention. Compiled for AVX2 with FMA (picked at run time when the
//! CPU has them) and for the baseline.

const LANES: usize = 8;
/// Values summed in float32 lanes before the sum joins the f64 total.
const RUN: usize = 64;

/// The mean and the (biased) variance of `x`, in f64.
pub fn moments(x: &[f32]) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, which is all the function is
        // compiled to use.
        #[allow(unsafe_code)]
        return unsafe { moments_avx2(x) };
    }
    moments_any(x)
}

/// `out[i] = silu(x[i] · scale + shift)`, `silu(y) = y / (1 + e^-y)`.
pub fn affine_silu(x: &[f32], scale: f32, shift: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output differ in length");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: as in `moments`.
        #[allow(unsafe_code)]
        unsafe {
            affine_silu_avx2(x, scale, shift, out);
        }
        return;
    }
    affine_silu_any(x, scale, shift, out);
}

/// GEGLU with GELU's tanh approximation: each row of `x` is `2 · inner`
/// values, a hidden half `h` and a gate half `g`; row `r` of `out`
/// (`inner` values) is `h · gelu(g)`, `gelu(g) = g/2 · (1 + tanh(√(2/π) ·
/// (g + 0.044715 g³)))`.
pub fn geglu_tanh(x: &[f32], inner: usize, out: &mut [f32]) {
    assert_eq!(x.len(), 2 * out.len(), "GEGLU input is not twice its output");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: as in `moments`.
        #[allow(unsafe_code)]
        unsafe {
            geglu_tanh_avx2(x, inner, out);
        }
        return;
    }
    geglu_tanh_any(x, inner, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn geglu_tanh_avx2(x: &[f32], inner: usize, out: &mut [f32]) {
    geglu_tanh_any(x, inner, out);
}

#[inline(always)]
fn geglu_tanh_any(x: &[f32], inner: usize, out: &mut [f32]) {
    const K: f32 = 0.797_884_6; // √(2/π)
    for (row, out) in x.chunks_exact(2 * inner).zip(out.chunks_exact_mut(inner)) {
        let (hidden, gate) = row.split_at(inner);
        for ((o, &h), &g) in out.iter_mut().zip(hidden).zip(gate) {
            // tanh(u) = 1 - 2 / (e^(2u) + 1), so 1 + tanh(u) = 2 - 2 / (e^(2u) + 1).
            let u = K * (g + 0.044_715 * g * g * g);
            let one_plus_tanh = 2.0 - 2.0 / (exp(2.0 * u) + 1.0);
            *o = h * (0.5 * g * one_plus_tanh);
        }
    }
}

/// `tanh` of every value, in place, as `1 - 2 / (e^(2|x|) + 1)` with the
/// sign put back: within 2e-7 of libm's (absolute), exactly ±1 far out.
pub fn tanh(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: as in `moments`.
        #[allow(unsafe_code)]
        unsafe {
            tanh_avx2(x);
        }
        return;
    }
    tanh_any(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tanh_avx2(x: &mut [f32]) {
    tanh_any(x);
}

#[inline(always)]
fn tanh_any(x: &mut [f32]) {
    for v in x {
        let t = 1.0 - 2.0 / (exp(2.0 * v.abs()) + 1.0);
        *v = t.copysign(*v);
    }
}

/// Softmax of each row of `scores` (`cols` values a row) after scaling by
/// `scale`, in place: `e^(scale·(s - max)) / Σ`.
pub fn softmax_rows(scores: &mut [f32], cols: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: as in `moments`.
        #[allow(unsafe_code)]
        unsafe {
            softmax_rows_avx2(scores, cols, scale);
        }
        return;
    }
    softmax_rows_any(scores, cols, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_rows_avx2(scores: &mut [f32], cols: usize, scale: f32) {
    softmax_rows_any(scores, cols, scale);
}

#[inline(always)]
fn softmax_rows_any(scores: &mut [f32], cols: usize, scale: f32) {
    for row in scores.chunks_exact_mut(cols.max(1)) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut lanes = [0.0f32; LANES];
        let (blocks, rest) = row.as_chunks_mut::<LANES>();
        for block in blocks {
            for (v, l) in block.iter_mut().zip(lanes.iter_mut()) {
                *v = exp(scale * (*v - max));
                *l += *v;
            }
        }
        let mut total: f32 = lanes.iter().sum();
        for v in rest {
            *v = exp(scale * (*v - max));
            total += *v;
        }
        let inv = 1.0 / total;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn moments_avx2(x: &[f32]) -> (f64, f64) {
    moments_any(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn affine_silu_avx2(x: &[f32], scale: f32, shift: f32, out: &mut [f32]) {
    affine_silu_any(x, scale, shift, out);
}

/// The sums of `v - m` and of `(v - m)²` over `x`: eight float32 lanes
/// over runs of [`RUN`] values, each run's totals added in f64.
#[inline(always)]
fn sums_about(x: &[f32], m: f32) -> (f64, f64) {
    let (mut s1, mut s2) = (0.0f64, 0.0f64);
    let (runs, rest) = x.as_chunks::<RUN>();
    for run in runs {
        let (mut l1, mut l2) = ([0.0f32; LANES], [0.0f32; LANES]);
        for block in run.as_chunks::<LANES>().0 {
            for ((a, b), v) in l1.iter_mut().zip(l2.iter_mut()).zip(block) {
                let d = v - m;
                *a += d;
                *b += d * d;
            }
        }
        s1 += l1.iter().map(|&l| f64::from(l)).sum::<f64>();
        s2 += l2.iter().map(|&l| f64::from(l)).sum::<f64>();
    }
    for &v in rest {
        let d = f64::from(v - m);
        s1 += d;
        s2 += d * d;
    }
    (s1, s2)
}

#[inline(always)]
fn moments_any(x: &[f32]) -> (f64, f64) {
    if x.is_empty() {
        return (0.0, 0.0);
    }
    let n = x.len() as f64;
    // A first estimate of the mean, then the sums about it: they are small
    // numbers, so float32 lanes keep them exact enough, and the estimate's
    // own error comes back as the mean of the differences.
    let (estimate, _) = sums_about(x, 0.0);
    let m = (estimate / n) as f32;
    let (s1, s2) = sums_about(x, m);
    let d = s1 / n;
    (f64::from(m) + d, (s2 / n - d * d).max(0.0))
}

#[inline(always)]
fn affine_silu_any(x: &[f32], scale: f32, shift: f32, out: &mut [f32]) {
    let (blocks, rest) = x.as_chunks::<LANES>();
    let (outs, out_rest) = out.as_chunks_mut::<LANES>();
    for (o, b) in outs.iter_mut().zip(blocks) {
        for (o, v) in o.iter_mut().zip(b) {
            let y = v * scale + shift;
            *o = y / (1.0 + exp(-y));
        }
    }
    for (o, v) in out_rest.iter_mut().zip(rest) {
        let y = v * scale + shift;
        *o = y / (1.0 + exp(-y));
    }
}

/// `e^x` for float32, branch-free so that it vectorises: `x = n·ln 2 + r`
/// with `|r| ≤ ln 2 / 2` (ln 2 in two parts), `e^r` by Cephes' degree-7
/// polynomial, `2^n` built in the exponent bits. Inputs are clamped to
/// [-87, 88], inside float32's normal range.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_2e-4;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponential_is_libms_to_a_few_ulps() {
        let mut worst = 0.0f32;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 4e-7, "largest relative difference {worst}");
        assert_eq!(exp(-200.0), exp(-87.0));
        assert!(exp(-200.0) > 0.0 && exp(200.0).is_finite());
    }

    #[test]
    fn tanh_is_libms_to_2e_7() {
        let mut x: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 / 1000.0).collect();
        x.extend([1e-30, -1e-8, 3e-4, 50.0, -100.0, f32::MAX, f32::MIN]);
        let want: Vec<f32> = x.iter().map(|v| v.tanh()).collect();
        tanh(&mut x);
        for (got, want) in x.iter().zip(&want) {
            assert!((got - want).abs() < 2e-7, "{got} vs {want}");
            assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "{got} vs {want}");
        }
        assert_eq!(x[x.len() - 2..], [1.0, -1.0]);
    }

    #[test]
    fn softmax_rows_sum_to_one_in_the_right_proportions() {
        let cols = 21;
        let mut scores: Vec<f32> = (0..3 * cols).map(|i| ((i * 29 % 43) as f32 - 21.0) / 2.0).collect();
        let original = scores.clone();
        softmax_rows(&mut scores, cols, 0.125);
        for (got, x) in scores.chunks(cols).zip(original.chunks(cols)) {
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let e: Vec<f64> = x.iter().map(|&v| (0.125 * f64::from(v - max)).exp()).collect();
            let total: f64 = e.iter().sum();
            for (g, e) in got.iter().zip(&e) {
                assert!((f64::from(*g) - e / total).abs() < 1e-6, "{g} vs {}", e / total);
            }
        }
    }

    #[test]
    fn geglu_matches_its_definition() {
        let inner = 37;
        let x: Vec<f32> = (0..3 * 2 * inner)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0)
            .collect();
        let mut out = vec![f32::NAN; 3 * inner];
        geglu_tanh(&x, inner, &mut out);
        for (r, row) in x.chunks_exact(2 * inner).enumerate() {
            for j in 0..inner {
                let (h, g) = (f64::from(row[j]), f64::from(row[inner + j]));
                let gelu = 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3))).tanh());
                let want = (h * gelu) as f32;
                let got = out[r * inner + j];
                assert!(
                    (got - want).abs() <= 2e-6 * (1.0 + want.abs()),
                    "[{r},{j}] {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn silu_and_moments_match_their_definitions() {
        // Lengths with and without a ragged tail, values far from zero
        // (where a one-pass variance would lose them).
        for len in [0, 1, 7, 8, 63, 64, 65, 1000, 4099] {
            let x: Vec<f32> = (0..len)
                .map(|i| 1000.0 + ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let n = len.max(1) as f64;
            let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
            let (m, v) = moments(&x);
            assert!(
                (m - mean).abs() < 1e-9 * mean.abs().max(1.0),
                "{len}: mean {m} vs {mean}"
            );
            assert!((v - var).abs() < 1e-5 * var.max(1e-3), "{len}: variance {v} vs {var}");

            let (scale, shift) = (0.01f32, -10.0f32);
            let mut out = vec![f32::NAN; len];
            affine_silu(&x, scale, shift, &mut out);
            for (o, &v) in out.iter().zip(&x) {
                let y = v * scale + shift;
                let want = y / (1.0 + (-y).exp());
                assert!(
                    (o - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{len}: silu({y}) {o} vs {want}"
                );
            }
        }
        // Far out on both sides.
        let x = [-1000.0f32, -90.0, -20.0, 0.0, 20.0, 90.0, 1000.0];
        let mut out = [0.0f32; 7];
        affine_silu(&x, 1.0, 0.0, &mut out);
        assert_eq!(out[3], 0.0);
        assert!(out[0] > -1e-30 && out[0] <= 0.0, "{}", out[0]);
        assert_eq!(&out[5..], &[90.0, 1000.0]);
    }
}
