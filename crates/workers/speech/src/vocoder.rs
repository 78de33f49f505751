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
//! of the pulse train accumulated in `f64` (it runs for the whole sentence).

use std::sync::Arc;

use gantry_worker_image::Normal;
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
    /// from `noise` and scaled by `noise_scale` (1: as the network predicts
    /// it; 0: none, for comparing with another implementation).
    pub fn synthesize(&self, frames: &Frames<'_>, noise: &mut Normal, noise_scale: f32) -> Result<Vec<f32>, String> {
        let count = frames.frames()?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let pulse_spectra = self.pulse_spectra(&pulses(frames.f0), count);
        let mut out = vec![0.0f32; (count + N_FFT / HOP - 1) * HOP];
        let mut spectrum = vec![Complex32::default(); BINS];
        let mut frame = vec![0.0f32; N_FFT];
        let mut scratch = self.inverse.make_scratch_vec();
        let exp = |x: f32| x.min(MAX_LOG_MAGNITUDE).exp();
        for k in 0..count {
            for (b, bin) in spectrum.iter_mut().enumerate() {
                let at = b * count + k;
                let (sin_h, cos_h) = (std::f32::consts::PI * frames.theta[at].tanh()).sin_cos();
                let harmonic = pulse_spectra[k * BINS + b] * Complex32::new(cos_h, sin_h) * exp(frames.lh[at]);
                let z = Complex32::new(noise.next(), noise.next()) * (noise_scale * exp(frames.ln[at]));
                let (sin_r, cos_r) = frames.phi[at].sin_cos();
                let residual = Complex32::new(cos_r, sin_r) * exp(frames.lr[at]);
                *bin = harmonic + z + residual;
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
        assert_eq!(reflect_pad(&[1.0, 2.0, 3.0], 2), vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]);
        // Shorter than the pad: the mirror bounces.
        assert_eq!(reflect_pad(&[1.0, 2.0], 3), vec![2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]);
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
            assert!((f64::from(sample) - expected).abs() < 2e-2, "sample {n}: {sample} vs {expected}");
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
        let audio = Vocoder::new().synthesize(&parts, &mut Normal::new(1), 1.0).unwrap();
        assert_eq!(audio.len(), frames * HOP);
        // Every frame holds a cosine of amplitude 0.5; windowed once more and
        // overlap-added, normalised by the summed squared window, that is
        // 0.5 · Σw / Σw² = 0.5 · 2 / 1.5 (Hann at a quarter hop), away from the ends.
        for n in 600..audio.len() - 600 {
            let expected = 0.5 * 2.0 / 1.5 * (2.0 * std::f64::consts::PI * 800.0 * n as f64 / 24_000.0).cos();
            assert!((f64::from(audio[n]) - expected).abs() < 1e-4, "{n}: {} vs {expected}", audio[n]);
        }
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
        assert!(Vocoder::new().synthesize(&parts, &mut Normal::new(1), 1.0).unwrap_err().contains("lr"));
    }
}
