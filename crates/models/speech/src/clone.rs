//! Voice matching ("cloning" with a single-speaker voice): the voice's audio
//! is moved toward a reference speaker by two transforms whose strength is
//! chosen by the speaker encoder.
//!
//! - **Scale** `s`: pitch and formants (the vocal tract's resonances) both
//!   multiplied by `s`, the duration kept. The audio is resampled so that it
//!   plays `s` times faster (pitch and formants × `s`, duration ÷ `s`), then
//!   stretched back to its length by WSOLA (overlap-add of windows taken
//!   where they continue the previous one best), which changes the duration
//!   but not the spectrum.
//! - **Equaliser** of strength `e` in `[0, 1]`: the long-term average
//!   spectrum of the output is pulled toward the reference's, in 24 bands
//!   from 80 Hz to 7.6 kHz, by `e` times the difference in decibels
//!   (clamped to ±12 dB), applied with a short-time Fourier transform.
//!
//! [`Matcher::fit`] tries scales and equaliser strengths on a calibration
//! utterance of the voice and keeps the pair whose output the speaker
//! encoder finds most similar to the reference (no change is one of the
//! candidates, so the match is never worse than the voice on that
//! utterance). The chosen transform is then applied to every sentence.

use crate::speaker::{self, SpeakerEncoder};

/// Scales tried first (pitch and formants), then the best one's neighbours
/// at ± `FINE_STEP`.
const SCALES: [f32; 7] = [0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4];
const FINE_STEP: f32 = 0.05;
/// Equaliser strengths tried on the best scale.
const EQ_STRENGTHS: [f32; 2] = [0.5, 1.0];
/// Bands of the equaliser.
const BANDS: usize = 24;
const BAND_LOW_HZ: f32 = 80.0;
const BAND_HIGH_HZ: f32 = 7600.0;
const MAX_GAIN_DB: f32 = 12.0;
/// STFT of the equaliser.
const FFT: usize = 1024;
const HOP: usize = FFT / 4;

/// What is done to the voice's audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Transform {
    /// Pitch and formant scale; 1 leaves them.
    pub scale: f32,
    /// Equaliser strength; 0 leaves the spectrum.
    pub eq_strength: f32,
    /// The equaliser's full-strength gain per band, in dB.
    pub eq_db: Vec<f32>,
}

impl Transform {
    /// No change.
    pub fn identity() -> Self {
        Self {
            scale: 1.0,
            eq_strength: 0.0,
            eq_db: vec![0.0; BANDS],
        }
    }

    /// `samples` at `rate` Hz, transformed; the same length.
    pub fn apply(&self, samples: &[f32], rate: u32) -> Vec<f32> {
        let mut out = if (self.scale - 1.0).abs() > 1e-4 {
            scale_voice(samples, rate, self.scale)
        } else {
            samples.to_vec()
        };
        if self.eq_strength > 0.0 {
            let gains: Vec<f32> = self.eq_db.iter().map(|db| db * self.eq_strength).collect();
            out = equalise(&out, rate, &gains);
        }
        out
    }
}

/// The result of fitting a transform to a reference speaker.
#[derive(Debug, Clone)]
pub struct Fit {
    pub transform: Transform,
    /// Speaker-embedding cosine similarity of the transformed calibration
    /// utterance to the reference.
    pub similarity: f32,
    /// The same for the untransformed voice.
    pub base_similarity: f32,
    /// Candidates tried.
    pub candidates: usize,
}

/// Fits transforms with a speaker encoder.
pub struct Matcher<'a> {
    pub encoder: &'a SpeakerEncoder,
}

impl Matcher<'_> {
    /// The transform that brings `calibration` (the voice at `rate` Hz) closest
    /// to the speaker of `reference` (16 kHz mono). `stop` is asked before
    /// each encoder run (the fit's unit of work, a fraction of a second to a
    /// second): `None` as soon as it answers true, so a cancelled job does
    /// not wait for the whole fit.
    pub fn fit(&self, calibration: &[f32], rate: u32, reference: &[f32], stop: &dyn Fn() -> bool) -> Option<Fit> {
        if stop() {
            return None;
        }
        let target = self.encoder.embed(reference);
        let reference_bands = band_powers(reference, speaker::SAMPLE_RATE);
        let stopped = std::cell::Cell::new(false);
        let score = |audio: &[f32]| {
            if stopped.get() || stop() {
                stopped.set(true);
                return f32::NEG_INFINITY;
            }
            let at_16k = gantry_media::audio::resample(audio, rate, speaker::SAMPLE_RATE);
            speaker::cosine(&self.encoder.embed(&at_16k), &target)
        };
        let base_similarity = score(calibration);
        let mut tried: Vec<(Transform, f32)> = Vec::new();
        let try_scale = |scale: f32, tried: &mut Vec<(Transform, f32)>| {
            let transform = Transform {
                scale,
                ..Transform::identity()
            };
            let similarity = if scale == 1.0 {
                base_similarity
            } else {
                score(&transform.apply(calibration, rate))
            };
            tried.push((transform, similarity));
        };
        for &scale in &SCALES {
            try_scale(scale, &mut tried);
        }
        let coarse = best(&tried).0.scale;
        for scale in [coarse - FINE_STEP, coarse + FINE_STEP] {
            try_scale(scale, &mut tried);
        }
        let scale = best(&tried).0.scale;
        let scaled = Transform {
            scale,
            ..Transform::identity()
        }
        .apply(calibration, rate);
        let at_16k = gantry_media::audio::resample(&scaled, rate, speaker::SAMPLE_RATE);
        let eq_db = equaliser_gains(&band_powers(&at_16k, speaker::SAMPLE_RATE), &reference_bands);
        for &eq_strength in &EQ_STRENGTHS {
            let transform = Transform {
                scale,
                eq_strength,
                eq_db: eq_db.clone(),
            };
            let similarity = score(&transform.apply(calibration, rate));
            tried.push((transform, similarity));
        }
        if stopped.get() {
            return None;
        }
        let candidates = tried.len();
        let (transform, similarity) = best(&tried);
        Some(Fit {
            transform,
            similarity,
            base_similarity,
            candidates,
        })
    }
}

/// The candidate with the highest similarity (the first of equals).
fn best(tried: &[(Transform, f32)]) -> (Transform, f32) {
    tried
        .iter()
        .fold(None::<&(Transform, f32)>, |top, candidate| match top {
            Some(top) if top.1 >= candidate.1 => Some(top),
            _ => Some(candidate),
        })
        .cloned()
        .unwrap_or((Transform::identity(), 0.0))
}

/// Pitch and formants × `scale`, the duration kept: resampled to play
/// `scale` times faster, then stretched back by WSOLA.
pub fn scale_voice(samples: &[f32], rate: u32, scale: f32) -> Vec<f32> {
    if samples.is_empty() {
        return Vec::new();
    }
    let faster_rate = ((f64::from(rate) / f64::from(scale)).round() as u32).max(1);
    let faster = gantry_media::audio::resample(samples, rate, faster_rate);
    wsola(&faster, samples.len(), rate)
}

/// `input` stretched (or squeezed) to `length` samples by WSOLA: Hann
/// windows of 30 ms at half overlap, each taken within ±10 ms of its ideal
/// place where it best continues the previous one.
pub fn wsola(input: &[f32], length: usize, rate: u32) -> Vec<f32> {
    let frame = ((rate as usize * 30) / 1000).max(16) & !1;
    let hop = frame / 2;
    let tolerance = (rate as usize * 10) / 1000;
    if input.len() < frame || length < frame {
        return gantry_media::audio::resample(input, input.len().max(1) as u32, length.max(1) as u32)
            .into_iter()
            .take(length)
            .collect();
    }
    let window: Vec<f32> = (0..frame)
        .map(|i| {
            let x = std::f32::consts::TAU * i as f32 / frame as f32;
            0.5 - 0.5 * x.cos()
        })
        .collect();
    let ratio = input.len() as f64 / length as f64;
    let mut out = vec![0.0f32; length + frame];
    let mut norm = vec![0.0f32; length + frame];
    let last_start = input.len() - frame;
    // Where the previous window's natural continuation starts in the input.
    let mut continuation: Option<usize> = None;
    let mut position = 0usize;
    while position < length {
        let ideal = ((position as f64 * ratio) as usize).min(last_start);
        let start = match continuation {
            None => ideal,
            Some(natural) => {
                let natural = natural.min(last_start);
                let low = ideal.saturating_sub(tolerance);
                let high = (ideal + tolerance).min(last_start);
                let reference = &input[natural..natural + hop];
                let mut best = (ideal, f32::NEG_INFINITY);
                for candidate in low..=high {
                    let piece = &input[candidate..candidate + hop];
                    let score: f32 = reference.iter().zip(piece).map(|(a, b)| a * b).sum();
                    if score > best.1 {
                        best = (candidate, score);
                    }
                }
                best.0
            }
        };
        for i in 0..frame {
            out[position + i] += input[start + i] * window[i];
            norm[position + i] += window[i];
        }
        continuation = Some(start + hop);
        position += hop;
    }
    out.truncate(length);
    for (o, n) in out.iter_mut().zip(&norm) {
        if *n > 1e-3 {
            *o /= n;
        }
    }
    out
}

/// Band edges in Hz, spaced evenly on the mel scale.
fn band_edges() -> Vec<f32> {
    let mel = |hz: f32| 2595.0 * (1.0 + hz / 700.0).log10();
    let hz = |m: f32| 700.0 * (10f32.powf(m / 2595.0) - 1.0);
    let (low, high) = (mel(BAND_LOW_HZ), mel(BAND_HIGH_HZ));
    (0..=BANDS)
        .map(|i| hz(low + (high - low) * i as f32 / BANDS as f32))
        .collect()
}

/// A real FFT's power spectrum of one windowed frame (`FFT` points).
fn power_spectrum(frame: &[f32], window: &[f32], spectrum: &mut [(f32, f32)], power: &mut [f32]) {
    for (i, slot) in spectrum.iter_mut().enumerate() {
        *slot = (frame.get(i).copied().unwrap_or(0.0) * window[i], 0.0);
    }
    fft(spectrum, false);
    for (p, (re, im)) in power.iter_mut().zip(spectrum.iter()) {
        *p = re * re + im * im;
    }
}

fn hann(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.5 - 0.5 * (std::f32::consts::TAU * i as f32 / n as f32).cos())
        .collect()
}

/// Mean power per band over the whole signal, normalised to sum 1.
fn band_powers(samples: &[f32], rate: u32) -> Vec<f32> {
    let edges = band_edges();
    let window = hann(FFT);
    let mut spectrum = vec![(0.0f32, 0.0f32); FFT];
    let mut power = vec![0.0f32; FFT];
    let mut bands = [0.0f64; BANDS];
    let bin_hz = rate as f32 / FFT as f32;
    let mut start = 0;
    while start + FFT / 2 < samples.len().max(1) {
        power_spectrum(&samples[start..], &window, &mut spectrum, &mut power);
        for (b, band) in bands.iter_mut().enumerate() {
            let (low, high) = (edges[b], edges[b + 1]);
            let from = (low / bin_hz).ceil() as usize;
            let to = ((high / bin_hz).floor() as usize).clamp(from, FFT - 1);
            let sum: f32 = power[from..=to].iter().sum();
            *band += f64::from(sum / (to - from + 1) as f32);
        }
        start += FFT / 2;
    }
    let total: f64 = bands.iter().sum::<f64>().max(1e-20);
    bands.iter().map(|b| (b / total) as f32).collect()
}

/// Per band, the dB that takes `output`'s normalised spectrum to
/// `reference`'s, smoothed over neighbouring bands and clamped.
fn equaliser_gains(output: &[f32], reference: &[f32]) -> Vec<f32> {
    let raw: Vec<f32> = output
        .iter()
        .zip(reference)
        .map(|(o, r)| 10.0 * ((r + 1e-9) / (o + 1e-9)).log10())
        .collect();
    (0..raw.len())
        .map(|i| {
            let from = i.saturating_sub(1);
            let to = (i + 1).min(raw.len() - 1);
            let mean = raw[from..=to].iter().sum::<f32>() / (to - from + 1) as f32;
            mean.clamp(-MAX_GAIN_DB, MAX_GAIN_DB)
        })
        .collect()
}

/// `samples` through the equaliser with `gains_db` per band (interpolated
/// between band centres; below and above them the edge bands' gains).
pub fn equalise(samples: &[f32], rate: u32, gains_db: &[f32]) -> Vec<f32> {
    if samples.is_empty() || gains_db.is_empty() {
        return samples.to_vec();
    }
    let edges = band_edges();
    let centres: Vec<f32> = edges.windows(2).map(|e| 0.5 * (e[0] + e[1])).collect();
    let bin_hz = rate as f32 / FFT as f32;
    let gain_of = |hz: f32| -> f32 {
        let db = if hz <= centres[0] {
            gains_db[0]
        } else if hz >= centres[centres.len() - 1] {
            gains_db[gains_db.len() - 1]
        } else {
            let i = centres.iter().position(|c| *c > hz).unwrap_or(centres.len() - 1);
            let (c0, c1) = (centres[i - 1], centres[i]);
            let t = (hz - c0) / (c1 - c0);
            gains_db[i - 1] * (1.0 - t) + gains_db[i] * t
        };
        10f32.powf(db / 20.0)
    };
    let bin_gain: Vec<f32> = (0..=FFT / 2).map(|k| gain_of(k as f32 * bin_hz)).collect();
    // Overlap-add with a Hann window at 75 % overlap (sums to 2) and no
    // synthesis window; the first frame starts before the signal so that
    // every sample is covered by four frames.
    let window = hann(FFT);
    let mut out = vec![0.0f32; samples.len() + 2 * FFT];
    let mut spectrum = vec![(0.0f32, 0.0f32); FFT];
    let padded_len = samples.len() + 2 * FFT;
    let sample = |i: isize| -> f32 {
        if i < 0 {
            0.0
        } else {
            samples.get(i as usize).copied().unwrap_or(0.0)
        }
    };
    let mut start = -(FFT as isize);
    while start < samples.len() as isize {
        for (i, slot) in spectrum.iter_mut().enumerate() {
            *slot = (sample(start + i as isize) * window[i], 0.0);
        }
        fft(&mut spectrum, false);
        for k in 0..FFT {
            let g = bin_gain[k.min(FFT - k)];
            spectrum[k].0 *= g;
            spectrum[k].1 *= g;
        }
        fft(&mut spectrum, true);
        for (i, (re, _)) in spectrum.iter().enumerate() {
            let at = start + FFT as isize + i as isize;
            if at >= 0 && (at as usize) < padded_len {
                out[at as usize] += re / FFT as f32;
            }
        }
        start += HOP as isize;
    }
    let scale = 0.5;
    out[FFT..FFT + samples.len()].iter().map(|v| v * scale).collect()
}

/// In-place radix-2 FFT (`inverse`: without the 1/n).
fn fft(x: &mut [(f32, f32)], inverse: bool) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut j = 0;
    for i in 1..n {
        let mut bit = n >> 1;
        while j & bit != 0 {
            j ^= bit;
            bit >>= 1;
        }
        j |= bit;
        if i < j {
            x.swap(i, j);
        }
    }
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut len = 2;
    while len <= n {
        let angle = sign * std::f64::consts::TAU / len as f64;
        for start in (0..n).step_by(len) {
            for k in 0..len / 2 {
                let (s, c) = (angle * k as f64).sin_cos();
                let w = (c as f32, s as f32);
                let a = x[start + k];
                let b = x[start + k + len / 2];
                let t = (b.0 * w.0 - b.1 * w.1, b.0 * w.1 + b.1 * w.0);
                x[start + k] = (a.0 + t.0, a.1 + t.1);
                x[start + k + len / 2] = (a.0 - t.0, a.1 - t.1);
            }
        }
        len <<= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(hz: f32, rate: u32, seconds: f32) -> Vec<f32> {
        (0..(rate as f32 * seconds) as usize)
            .map(|i| 0.5 * (std::f32::consts::TAU * hz * i as f32 / rate as f32).sin())
            .collect()
    }

    /// The strongest frequency of `x`, by a DFT scan in 1 Hz steps.
    fn peak_hz(x: &[f32], rate: u32, from: f32, to: f32) -> f32 {
        let mid = &x[x.len() / 4..3 * x.len() / 4];
        let mut best = (from, 0.0f32);
        let mut hz = from;
        while hz <= to {
            let (mut re, mut im) = (0.0f32, 0.0f32);
            for (i, v) in mid.iter().enumerate() {
                let a = std::f32::consts::TAU * hz * i as f32 / rate as f32;
                re += v * a.cos();
                im += v * a.sin();
            }
            let p = re * re + im * im;
            if p > best.1 {
                best = (hz, p);
            }
            hz += 1.0;
        }
        best.0
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
    }

    #[test]
    fn scaling_moves_the_pitch_and_keeps_the_length() {
        let rate = 22050;
        let x = tone(200.0, rate, 1.0);
        for scale in [0.8f32, 1.25] {
            let y = scale_voice(&x, rate, scale);
            assert_eq!(y.len(), x.len());
            let peak = peak_hz(&y, rate, 120.0, 300.0);
            assert!((peak - 200.0 * scale).abs() <= 3.0, "scale {scale}: peak {peak}");
            let level = rms(&y[2000..y.len() - 2000]) / rms(&x);
            assert!((0.8..1.2).contains(&level), "scale {scale}: level {level}");
        }
    }

    #[test]
    fn wsola_keeps_a_tone_while_changing_its_length() {
        let rate = 16000;
        let x = tone(300.0, rate, 1.0);
        for length in [12000, 20000] {
            let y = wsola(&x, length, rate);
            assert_eq!(y.len(), length);
            assert!((peak_hz(&y, rate, 250.0, 350.0) - 300.0).abs() <= 2.0);
        }
    }

    #[test]
    fn a_flat_equaliser_changes_nothing_and_a_tilt_tilts() {
        let rate = 22050;
        let x: Vec<f32> = tone(300.0, rate, 0.5)
            .iter()
            .zip(tone(4000.0, rate, 0.5))
            .map(|(a, b)| a + b)
            .collect();
        let same = equalise(&x, rate, &[0.0; BANDS]);
        let diff = x.iter().zip(&same).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(diff < 1e-3, "flat equaliser differs by {diff}");
        // −12 dB at the low end rising to +12 dB at the top.
        let tilt: Vec<f32> = (0..BANDS)
            .map(|b| -12.0 + 24.0 * b as f32 / (BANDS - 1) as f32)
            .collect();
        let tilted = equalise(&x, rate, &tilt);
        let bands = band_powers(&tilted, rate);
        let before = band_powers(&x, rate);
        let edges = band_edges();
        let band_of = |hz: f32| edges.windows(2).position(|e| e[0] <= hz && hz < e[1]).unwrap();
        let (b300, b4k) = (band_of(300.0), band_of(4000.0));
        assert!(bands[b4k] / bands[b300] > 10.0 * before[b4k] / before[b300]);
    }

    #[test]
    fn equaliser_gains_are_clamped_and_smooth() {
        let flat = vec![1.0 / BANDS as f32; BANDS];
        assert!(equaliser_gains(&flat, &flat).iter().all(|g| g.abs() < 1e-4));
        let mut peaked = flat.clone();
        peaked[5] *= 1e6;
        let gains = equaliser_gains(&flat, &peaked);
        assert!(gains.iter().all(|g| g.abs() <= MAX_GAIN_DB), "{gains:?}");
        // The neighbours of the peak are raised too (smoothing); far bands are not.
        assert!(gains[4] > 0.0 && gains[6] > 0.0 && gains[5] == MAX_GAIN_DB, "{gains:?}");
        assert!(gains[20].abs() < 1e-3, "{gains:?}");
    }

    #[test]
    fn empty_and_short_audio_pass_through() {
        assert!(scale_voice(&[], 22050, 1.2).is_empty());
        assert_eq!(wsola(&[0.1; 10], 12, 22050).len(), 12);
        assert!(equalise(&[], 22050, &[0.0; BANDS]).is_empty());
        assert_eq!(Transform::identity().apply(&[0.25; 100], 22050), vec![0.25; 100]);
    }
}
