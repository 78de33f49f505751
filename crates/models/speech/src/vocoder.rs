//! The waveform side of `kokoro-hibari`: its network does not output audio
//! but five spectra per 12.5 ms frame and an F0 curve; this module turns them
//! into samples (the job `dsp.py` does in the hibari package).
//!
//! For every frame `k` and frequency bin `b` (601 bins of a 1200-point FFT
//! at 24 kHz) the complex spectrum is
//!
//! ```text
//! S[b,k] = e^{lh} · e^{iπ·tanh(θ)} · P[b,k]      harmonic: a pulse train at F0, filtered
//!        + e^{ln} · Z[b,k]                      noise: complex Gaussian, shaped
//!        + e^{lr} · e^{iφ}                      a free-phase residual
//! ```
//!
//! where `P` is the short-time spectrum of a band-limited pulse train that
//! follows the F0 curve (every harmonic below 11 kHz at unit amplitude; no
//! pulses where F0 is under 40 Hz, i.e. unvoiced), and the log-magnitudes are
//! capped at 7 before `exp`. One inverse STFT (Hann window, hop 300,
//! normalised by the summed squared window, centred) makes the waveform:
//! `F` frames give exactly `F · 300` samples.
//!
//! The noise comes from a seeded generator, so one seed gives the same audio
//! every time. The arithmetic is `f32` like the reference's, with the phase
//! of the pulse train accumulated in `f64` (it runs for the whole sentence);
//! the per-bin transcendental functions are branch-free polynomials
//! ([`math`]) so that pass runs as SIMD code.

use std::sync::Arc;

use realfft::num_complex::Complex32;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

/// FFT size of the network's spectra.
pub const N_FFT: usize = 1200;
/// Samples per frame.
pub const HOP: usize = 300;
/// Frequency bins per frame.
pub const BINS: usize = N_FFT / 2 + 1;
/// Output sample rate.
pub const SAMPLE_RATE: u32 = 24_000;
/// Below this F0 (Hz) a sample is unvoiced: no pulses.
const VOICED_HZ: f32 = 40.0;
/// Harmonics of the pulse train stop below this frequency (Hz).
const MAX_HARMONIC_HZ: f32 = 11_000.0;
/// Log-magnitudes are capped here before `exp`.
const MAX_LOG_MAGNITUDE: f32 = 7.0;

/// What the network gives for one utterance: five `[BINS, frames]`
/// row-major spectra (bin-major, as the graph lays them out) and `frames`
/// F0 values in Hz.
#[derive(Debug, Clone, Copy)]
pub struct Frames<'a> {
    /// Log-magnitude of the harmonic filter.
    pub lh: &'a [f32],
    /// Phase of the harmonic filter, before `π·tanh`.
    pub theta: &'a [f32],
    /// Log-magnitude of the noise.
    pub ln: &'a [f32],
    /// Log-magnitude of the free-phase residual.
    pub lr: &'a [f32],
    /// Phase of the residual.
    pub phi: &'a [f32],
    /// F0 per frame, Hz.
    pub f0: &'a [f32],
}

impl Frames<'_> {
    /// Frames, or why the arrays do not fit together.
    pub fn frames(&self) -> Result<usize, String> {
        let frames = self.f0.len();
        for (name, part) in [
            ("lh", self.lh),
            ("theta", self.theta),
            ("ln", self.ln),
            ("lr", self.lr),
            ("phi", self.phi),
        ] {
            if part.len() != BINS * frames {
                return Err(format!(
                    "{name} has {} values, not {BINS} x {frames} (bins x frames)",
                    part.len()
                ));
            }
        }
        Ok(frames)
    }
}

/// The FFT plans and the windows; made once, shared by threads.
pub struct Vocoder {
    forward: Arc<dyn RealToComplex<f32>>,
    inverse: Arc<dyn ComplexToReal<f32>>,
    /// Periodic Hann window.
    window: Vec<f32>,
    /// The window that analyses the pulse train: Hann / (N_FFT / 4), so a
    /// unit cosine shows as magnitude 1 in its bin, and `e^{lh}` is the
    /// harmonic's amplitude.
    analysis: Vec<f32>,
}

impl Default for Vocoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Vocoder {
    pub fn new() -> Self {
        let mut planner = RealFftPlanner::<f32>::new();
        let window: Vec<f32> = (0..N_FFT)
            .map(|n| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos()) as f32)
            .collect();
        let analysis = window.iter().map(|w| w / (N_FFT / 4) as f32).collect();
        Self {
            forward: planner.plan_fft_forward(N_FFT),
            inverse: planner.plan_fft_inverse(N_FFT),
            window,
            analysis,
        }
    }

    /// The waveform of `frames` (`frames · HOP` samples), the noise drawn
    /// from a generator seeded with `seed` and scaled by `noise_scale` (1: as
    /// the network predicts it; 0: none, for comparing with another
    /// implementation).
    pub fn synthesize(&self, frames: &Frames<'_>, seed: u64, noise_scale: f32) -> Result<Vec<f32>, String> {
        let count = frames.frames()?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let pulse_spectra = self.pulse_spectra(&pulses(frames.f0), count);
        let filters = filters(frames, count, seed, noise_scale);
        let mut out = vec![0.0f32; (count + N_FFT / HOP - 1) * HOP];
        let mut spectrum = vec![Complex32::default(); BINS];
        let mut frame = vec![0.0f32; N_FFT];
        let mut scratch = self.inverse.make_scratch_vec();
        for k in 0..count {
            let pulse = &pulse_spectra[k * BINS..(k + 1) * BINS];
            for (b, (bin, &p)) in spectrum.iter_mut().zip(pulse).enumerate() {
                let at = b * count + k;
                let harmonic = Complex32::new(filters.harmonic_re[at], filters.harmonic_im[at]);
                *bin = p * harmonic + Complex32::new(filters.added_re[at], filters.added_im[at]);
            }
            // A real signal's DC and Nyquist bins are real: their imaginary
            // parts are dropped, as an inverse real FFT does.
            spectrum[0].im = 0.0;
            spectrum[BINS - 1].im = 0.0;
            self.inverse
                .process_with_scratch(&mut spectrum, &mut frame, &mut scratch)
                .map_err(|e| format!("inverse FFT: {e}"))?;
            let start = k * HOP;
            for (n, (&sample, &w)) in frame.iter().zip(&self.window).enumerate() {
                // The inverse transform is unnormalised: divide by N here.
                out[start + n] += sample * w / N_FFT as f32;
            }
        }
        // Normalise by the summed squared window under each sample (constant
        // inside, smaller at the two ends), then drop the centring pad.
        let squares: Vec<f32> = self.window.iter().map(|w| w * w).collect();
        let blocks = N_FFT / HOP;
        for (block, chunk) in out.chunks_mut(HOP).enumerate() {
            for (j, sample) in chunk.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for part in 0..blocks {
                    // Frame `block - part` covers this block with its part `part`.
                    if block >= part && block - part < count {
                        sum += squares[part * HOP + j];
                    }
                }
                *sample /= sum.max(1e-11);
            }
        }
        let half = N_FFT / 2;
        Ok(out[half..half + count * HOP].to_vec())
    }

    /// The short-time spectra of `signal` (`count` frames, centred, the
    /// signal mirrored at its ends): `count · BINS` values, frame-major.
    fn pulse_spectra(&self, signal: &[f32], count: usize) -> Vec<Complex32> {
        let half = N_FFT / 2;
        let padded = reflect_pad(signal, half);
        let mut spectra = vec![Complex32::default(); count * BINS];
        let mut frame = vec![0.0f32; N_FFT];
        let mut scratch = self.forward.make_scratch_vec();
        for (k, spectrum) in spectra.chunks_mut(BINS).enumerate() {
            let start = k * HOP;
            for ((x, &s), &w) in frame.iter_mut().zip(&padded[start..start + N_FFT]).zip(&self.analysis) {
                *x = s * w;
            }
            // The lengths are the plan's own, so this cannot fail.
            if self
                .forward
                .process_with_scratch(&mut frame, spectrum, &mut scratch)
                .is_err()
            {
                spectrum.fill(Complex32::default());
            }
        }
        spectra
    }
}

/// Per bin and frame (bin-major, like the network's arrays), in separate
/// real and imaginary arrays: the harmonic filter `e^{lh} · e^{iπ·tanh θ}`,
/// and what is added after it, the shaped noise `e^{ln} · Z` plus the
/// residual `e^{lr} · e^{iφ}`. `Z` is a complex Gaussian by the Box–Muller
/// transform (a magnitude `√(−2 ln u₁)` at the angle `2π u₂`), its uniforms
/// hashed from the seed and the element's index, so every element is
/// independent of the others: one pass of branch-free arithmetic that the
/// compiler turns into SIMD code, built for AVX2 and FMA where the CPU has them.
struct Filters {
    harmonic_re: Vec<f32>,
    harmonic_im: Vec<f32>,
    added_re: Vec<f32>,
    added_im: Vec<f32>,
}

fn filters(frames: &Frames<'_>, count: usize, seed: u64, noise_scale: f32) -> Filters {
    let len = BINS * count;
    let mut out = Filters {
        harmonic_re: vec![0.0; len],
        harmonic_im: vec![0.0; len],
        added_re: vec![0.0; len],
        added_im: vec![0.0; len],
    };
    // Two 32-bit keys from the seed: one per uniform of a pair.
    let key = seed ^ (seed >> 32).wrapping_mul(0x9e37_79b9);
    let keys = (key as u32, (key >> 32) as u32 ^ 0x85eb_ca6b);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, which is all `filters_avx2` is
        // compiled to use beyond the baseline.
        #[allow(unsafe_code)]
        unsafe {
            filters_avx2(frames, len, keys, noise_scale, &mut out);
        }
        return out;
    }
    filters_into(frames, len, keys, noise_scale, &mut out);
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn filters_avx2(frames: &Frames<'_>, len: usize, keys: (u32, u32), noise_scale: f32, out: &mut Filters) {
    filters_into(frames, len, keys, noise_scale, out);
}

#[inline(always)]
fn filters_into(frames: &Frames<'_>, len: usize, keys: (u32, u32), noise_scale: f32, out: &mut Filters) {
    let (lh, theta, ln, lr, phi) = (
        &frames.lh[..len],
        &frames.theta[..len],
        &frames.ln[..len],
        &frames.lr[..len],
        &frames.phi[..len],
    );
    let harmonic_re = &mut out.harmonic_re[..len];
    let harmonic_im = &mut out.harmonic_im[..len];
    let added_re = &mut out.added_re[..len];
    let added_im = &mut out.added_im[..len];
    for i in 0..len {
        let magnitude = math::exp(lh[i].min(MAX_LOG_MAGNITUDE));
        let (sin, cos) = math::sin_cos(std::f32::consts::PI * math::tanh(theta[i]));
        harmonic_re[i] = magnitude * cos;
        harmonic_im[i] = magnitude * sin;
        let residual = math::exp(lr[i].min(MAX_LOG_MAGNITUDE));
        let (sin_r, cos_r) = math::sin_cos(phi[i]);
        let (u1, u2) = (uniform(i as u32, keys.0), uniform(i as u32, keys.1));
        let noise = noise_scale * math::exp(ln[i].min(MAX_LOG_MAGNITUDE)) * (-2.0 * math::ln(u1)).sqrt();
        let (sin_n, cos_n) = math::sin_cos(std::f32::consts::TAU * u2);
        added_re[i] = residual * cos_r + noise * cos_n;
        added_im[i] = residual * sin_r + noise * sin_n;
    }
}

/// Uniform in (0, 1] from element `index` and `key`: a 32-bit integer hash
/// (two multiply–xorshift rounds), so the draws of different elements are
/// independent and can be computed side by side.
#[inline(always)]
fn uniform(index: u32, key: u32) -> f32 {
    let mut x = index ^ key;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    ((x >> 8) + 1) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Single-precision `exp`, `ln`, `sin`/`cos` and `tanh` without branches or
/// library calls (Cody–Waite range reduction and the Cephes minimax
/// polynomials), so the vocoder's loops vectorise. Within a few ulp of the
/// library functions over the ranges the network produces.
mod math {
    /// Rounds to the nearest integer (ties to even) for |x| < 2²².
    #[inline(always)]
    fn round(x: f32) -> f32 {
        const SHIFT: f32 = 12_582_912.0; // 1.5 · 2²³
        (x + SHIFT) - SHIFT
    }

    /// `e^x`: the Whisper engine's branch-free Cephes `expf`.
    pub use gantry_kernels::math::fast_exp as exp;

    /// Natural logarithm of a positive normal `x`.
    #[inline(always)]
    pub fn ln(x: f32) -> f32 {
        let bits = x.to_bits();
        let mut e = ((bits >> 23) & 0xff) as i32 - 126;
        // The mantissa in [0.5, 1).
        let m = f32::from_bits((bits & 0x807f_ffff) | 0x3f00_0000);
        // Below √½, double it (and lower the exponent) so the polynomial's
        // argument stays within [√½ − 1, √2 − 1].
        let low = m < std::f32::consts::FRAC_1_SQRT_2;
        e -= i32::from(low);
        let m = if low { m + m } else { m };
        let x = m - 1.0;
        let z = x * x;
        let mut p = 7.037_683_6e-2f32;
        p = p * x - 1.151_461e-1;
        p = p * x + 1.167_699_9e-1;
        p = p * x - 1.242_014_1e-1;
        p = p * x + 1.424_932_3e-1;
        p = p * x - 1.666_805_8e-1;
        p = p * x + 2.000_071_5e-1;
        p = p * x - 2.499_999_4e-1;
        p = p * x + 3.333_333e-1;
        let e = e as f32;
        let y = p * x * z + e * -2.121_944_4e-4 - 0.5 * z;
        x + y + e * 0.693_359_4
    }

    /// `(sin x, cos x)` for |x| up to a few thousand.
    #[inline(always)]
    pub fn sin_cos(x: f32) -> (f32, f32) {
        let q = round(x * std::f32::consts::FRAC_2_PI);
        // x − q·π/2 with π/2 split in three, so the reduction is exact enough.
        let r = ((x - q * 1.570_312_5) - q * 4.837_513e-4) - q * 7.549_79e-8;
        let z = r * r;
        let sin = r + r * z * (-1.666_665_5e-1 + z * (8.332_161e-3 + z * -1.951_529_6e-4));
        let cos = 1.0 - 0.5 * z + z * z * (4.166_664_6e-2 + z * (-1.388_731_6e-3 + z * 2.443_315_7e-5));
        // The quadrant picks and signs the two.
        let quadrant = q as i32 as u32;
        let swap = (quadrant & 1).wrapping_neg();
        let s = f32::from_bits((cos.to_bits() & swap) | (sin.to_bits() & !swap));
        let c = f32::from_bits((sin.to_bits() & swap) | (cos.to_bits() & !swap));
        let s_sign = (quadrant & 2) << 30;
        let c_sign = (quadrant.wrapping_add(1) & 2) << 30;
        (
            f32::from_bits(s.to_bits() ^ s_sign),
            f32::from_bits(c.to_bits() ^ c_sign),
        )
    }

    /// `tanh x`, to within 1e-7 absolute.
    #[inline(always)]
    pub fn tanh(x: f32) -> f32 {
        let x = x.clamp(-9.0, 9.0);
        1.0 - 2.0 / (exp(2.0 * x) + 1.0)
    }
}

/// `signal` with `pad` samples mirrored onto each end (the edge sample not
/// repeated), as `numpy.pad(mode="reflect")`; a signal too short to mirror
/// is padded with zeros instead.
fn reflect_pad(signal: &[f32], pad: usize) -> Vec<f32> {
    let n = signal.len();
    let mut out = vec![0.0f32; n + 2 * pad];
    out[pad..pad + n].copy_from_slice(signal);
    if n > 1 {
        // Reflection bounces back and forth for signals shorter than the pad.
        let period = 2 * (n - 1);
        let at = |i: isize| -> f32 {
            let m = i.rem_euclid(period as isize) as usize;
            signal[if m < n { m } else { period - m }]
        };
        for i in 0..pad {
            out[i] = at(i as isize - pad as isize);
            out[pad + n + i] = at((n + i) as isize);
        }
    }
    out
}

/// A band-limited pulse train following `f0` (one value per frame, Hz):
/// `frames · HOP` samples. F0 is interpolated linearly between frame
/// centres; every harmonic below [`MAX_HARMONIC_HZ`] has unit amplitude:
/// `Σ_{h=1..H} cos(h·t) = sin((H + ½)·t) / (2·sin(t/2)) − ½`. Samples whose
/// F0 is below [`VOICED_HZ`] are silent.
pub fn pulses(f0: &[f32]) -> Vec<f32> {
    let frames = f0.len();
    let mut out = Vec::with_capacity(frames * HOP);
    let mut phase = 0.0f64;
    let half = HOP / 2;
    for k in 0..frames {
        let previous = f0[k.saturating_sub(1)];
        let current = f0[k];
        let next = f0[(k + 1).min(frames - 1)];
        for j in 0..HOP {
            // Sample j of frame k lies (j + ½)/HOP − ½ frames after the frame's centre.
            let offset = ((j as f64 + 0.5) / HOP as f64 - 0.5).rem_euclid(1.0) as f32;
            let (from, to) = if j < half { (previous, current) } else { (current, next) };
            let frequency = from * (1.0 - offset) + to * offset;
            let voiced = frequency > VOICED_HZ;
            let frequency = frequency.max(VOICED_HZ);
            phase += f64::from(frequency);
            let t = ((phase / f64::from(SAMPLE_RATE)).fract() * 2.0 * std::f64::consts::PI) as f32;
            if !voiced {
                out.push(0.0);
                continue;
            }
            let harmonics = (MAX_HARMONIC_HZ / frequency).floor() + 0.5;
            let denominator = 2.0 * (t * 0.5).sin();
            let sum = if denominator.abs() <= 2e-3 {
                // The limit at t → 0 (mod 2π): H + ½.
                harmonics
            } else {
                (harmonics * t).sin() / denominator
            };
            out.push(sum - 0.5);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_mirrors_without_repeating_the_edge() {
        assert_eq!(
            reflect_pad(&[1.0, 2.0, 3.0], 2),
            vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]
        );
        // Shorter than the pad: the mirror bounces.
        assert_eq!(
            reflect_pad(&[1.0, 2.0], 3),
            vec![2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]
        );
    }

    #[test]
    fn a_pulse_train_is_a_sum_of_unit_harmonics() {
        // 1234 Hz: harmonics 1..=8 below 11 kHz (a frequency that divides
        // 11 kHz exactly would sit on the rounding edge of the harmonic count).
        let train = pulses(&[1234.0; 4]);
        let mut phase = 0.0f64;
        for (n, &sample) in train.iter().enumerate() {
            phase += 1234.0 / f64::from(SAMPLE_RATE);
            let t = phase.fract() * 2.0 * std::f64::consts::PI;
            let expected: f64 = (1..=8).map(|h| (h as f64 * t).cos()).sum();
            assert!(
                (f64::from(sample) - expected).abs() < 2e-2,
                "sample {n}: {sample} vs {expected}"
            );
        }
        // Unvoiced frames are silent.
        assert!(pulses(&[0.0, 20.0]).iter().all(|&s| s == 0.0));
    }

    #[test]
    fn a_residual_alone_is_resynthesised_exactly() {
        // With the harmonic and noise parts off (log-magnitude -100), a pure
        // residual of one bin's cosine comes back as that cosine.
        let frames = 16;
        let off = vec![-100.0f32; BINS * frames];
        let zero = vec![0.0f32; BINS * frames];
        let bin = 40; // 800 Hz
        let mut lr = vec![-100.0f32; BINS * frames];
        // Each frame's phase advances by the bin's rotation over one hop.
        let mut phi = zero.clone();
        for k in 0..frames {
            lr[bin * frames + k] = (N_FFT as f32 / 4.0).ln();
            phi[bin * frames + k] = (2.0 * std::f64::consts::PI * (bin * HOP * k) as f64 / N_FFT as f64) as f32;
        }
        let f0 = vec![0.0f32; frames];
        let parts = Frames {
            lh: &off,
            theta: &zero,
            ln: &off,
            lr: &lr,
            phi: &phi,
            f0: &f0,
        };
        let audio = Vocoder::new().synthesize(&parts, 1, 1.0).unwrap();
        assert_eq!(audio.len(), frames * HOP);
        // Every frame holds a cosine of amplitude 0.5; windowed once more and
        // overlap-added, normalised by the summed squared window, that is
        // 0.5 · Σw / Σw² = 0.5 · 2 / 1.5 (Hann at a quarter hop), away from the ends.
        let inside = audio.len() - 600;
        for (n, &sample) in audio.iter().enumerate().take(inside).skip(600) {
            let expected = 0.5 * 2.0 / 1.5 * (2.0 * std::f64::consts::PI * 800.0 * n as f64 / 24_000.0).cos();
            assert!(
                (f64::from(sample) - expected).abs() < 1e-4,
                "{n}: {sample} vs {expected}"
            );
        }
    }

    #[test]
    fn the_fast_functions_agree_with_the_library() {
        let mut worst = [0.0f64; 5];
        for i in -40_000..=40_000 {
            let x = i as f32 * 2.25e-4; // −9 ..= 9
            let track = |slot: &mut f64, ours: f32, theirs: f32| {
                *slot = slot.max(f64::from((ours - theirs).abs()) / f64::from(theirs.abs().max(1.0)));
            };
            track(&mut worst[0], math::exp(x), x.exp());
            let (s, c) = math::sin_cos(x * 3.0);
            track(&mut worst[1], s, (x * 3.0).sin());
            track(&mut worst[2], c, (x * 3.0).cos());
            track(&mut worst[3], math::tanh(x), x.tanh());
            let u = (i + 40_001) as f32 / 80_002.0;
            track(&mut worst[4], math::ln(u), u.ln());
        }
        assert!(worst.iter().all(|&w| w < 1e-6), "relative errors {worst:?}");
        assert!(math::exp(-200.0) < 1.2e-38, "underflows to the smallest normal");
    }

    #[test]
    fn uniforms_stay_in_the_half_open_unit_interval() {
        let draws: Vec<f32> = (0..100_000).map(|i| uniform(i, 0x1234_5678)).collect();
        assert!(draws.iter().all(|&u| u > 0.0 && u <= 1.0));
        let mean = draws.iter().sum::<f32>() / draws.len() as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        // Paired as the vocoder pairs them (two keys), Box–Muller gives
        // standard normals.
        let normals: Vec<f64> = (0..100_000u32)
            .map(|i| {
                let (u1, u2) = (uniform(i, 11), uniform(i, 12));
                f64::from((-2.0 * math::ln(u1)).sqrt() * math::sin_cos(std::f32::consts::TAU * u2).1)
            })
            .collect();
        let mean = normals.iter().sum::<f64>() / normals.len() as f64;
        let variance = normals.iter().map(|z| (z - mean).powi(2)).sum::<f64>() / normals.len() as f64;
        assert!(
            mean.abs() < 0.02 && (variance - 1.0).abs() < 0.03,
            "mean {mean}, variance {variance}"
        );
    }

    #[test]
    fn mismatched_arrays_are_refused() {
        let a = vec![0.0f32; BINS * 2];
        let parts = Frames {
            lh: &a,
            theta: &a,
            ln: &a,
            lr: &a[..BINS],
            phi: &a,
            f0: &[100.0, 100.0],
        };
        assert!(Vocoder::new().synthesize(&parts, 1, 1.0).unwrap_err().contains("lr"));
    }
}
