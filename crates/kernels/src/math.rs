//! Elementwise functions of the networks, written branch-free so that a
//! loop over a slice of them vectorises: `eˣ`, the error function, GELU and
//! softmax.

/// The error function to within 4e-7 (Abramowitz and Stegun 7.1.26, in f32),
/// branch-free so that loops of it vectorise.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_74) * t + 0.254_829_6) * t;
    (1.0 - poly * fast_exp(-a * a)).copysign(x)
}

/// GELU with the (exact, not tanh-approximated) error function, in place:
/// compiled for AVX-512 and for AVX2 too, picked at run time. Rust does not
/// fuse a multiply and an add unless told, so every build gives the same
/// bits.
pub fn gelu(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, which is all the function is
            // compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                gelu_avx512(x)
            };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, which is all the function is
            // compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                gelu_avx2(x)
            };
            return;
        }
    }
    gelu_any(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gelu_avx512(x: &mut [f32]) {
    gelu_any(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_avx2(x: &mut [f32]) {
    gelu_any(x);
}

#[inline(always)]
fn gelu_any(x: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn gelu_gives_the_same_bits_on_every_build() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 61.0).collect();
        let mut picked = x.clone();
        gelu(&mut picked);
        let mut baseline = x;
        gelu_any(&mut baseline);
        assert_eq!(picked, baseline);
    }

    #[test]
    fn gelu_is_x_times_phi_to_seven_digits() {
        // x·Φ(x), as BERT and Whisper define GELU (not the tanh form).
        let x = [0.0f32, 1.0, -1.0, 2.5, -4.0];
        let want = [0.0f32, 0.841_344_7, -0.158_655_3, 2.484_475_9, -1.267e-4];
        let mut got = x;
        gelu(&mut got);
        for ((x, g), w) in x.iter().zip(got).zip(want) {
            assert!((g - w).abs() < 2e-6, "gelu({x}) = {g} not {w}");
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
