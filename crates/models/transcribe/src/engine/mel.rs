//! Log-mel features as faster-whisper's `FeatureExtractor` computes them:
//! 160 zeros appended, frames of 400 samples every 160 (reflect-padded by
//! 200 at both ends), a periodic Hann window, the power spectrum, 80 Slaney
//! mel filters up to 8 kHz, `log10` floored at 1e-10 and at the whole
//! spectrogram's maximum less 8, then `(x + 4) / 4`; the last frame dropped.
#![allow(clippy::needless_range_loop)]

/// Samples per second.
pub const SAMPLE_RATE: usize = 16_000;
/// Samples per FFT frame.
pub const N_FFT: usize = 400;
/// Samples between frames.
pub const HOP: usize = 160;
/// Mel bins.
pub const N_MELS: usize = 80;
/// Frequency bins of the one-sided spectrum.
const N_FREQS: usize = N_FFT / 2 + 1;

/// A log-mel spectrogram, mel-major: `data[m * frames + t]`.
#[derive(Debug, Clone)]
pub struct LogMel {
    pub data: Vec<f32>,
    pub frames: usize,
}

/// The mel filter bank (`N_MELS × N_FREQS`, row-major), as librosa's Slaney
/// filters, computed in `f64` and rounded to `f32`.
pub fn mel_filters() -> Vec<f32> {
    let fftfreqs: Vec<f64> = (0..N_FREQS)
        .map(|k| k as f64 * SAMPLE_RATE as f64 / N_FFT as f64)
        .collect();
    let max_mel = 45.245_640_471_924_965_f64;
    let n = N_MELS + 2;
    let step = max_mel / (n - 1) as f64;
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    let freqs: Vec<f64> = (0..n)
        .map(|i| {
            let mel = if i == n - 1 { max_mel } else { i as f64 * step };
            if mel >= min_log_mel {
                min_log_hz * (logstep * (mel - min_log_mel)).exp()
            } else {
                f_sp * mel
            }
        })
        .collect();
    let mut weights = vec![0.0f32; N_MELS * N_FREQS];
    for m in 0..N_MELS {
        let enorm = 2.0 / (freqs[m + 2] - freqs[m]);
        for k in 0..N_FREQS {
            let lower = -(freqs[m] - fftfreqs[k]) / (freqs[m + 1] - freqs[m]);
            let upper = (freqs[m + 2] - fftfreqs[k]) / (freqs[m + 2] - freqs[m + 1]);
            let w = lower.min(upper).max(0.0);
            weights[m * N_FREQS + k] = (w * enorm) as f32;
        }
    }
    weights
}

/// A complex FFT of one size, mixed radix (any factors; Whisper's 400 is
/// 2⁴·5²), decimation in time, in `f64`.
struct Fft {
    n: usize,
    factors: Vec<usize>,
    /// `exp(-2πi·j/n)`.
    twiddles: Vec<(f64, f64)>,
}

impl Fft {
    fn new(n: usize) -> Self {
        let mut factors = Vec::new();
        let mut rest = n;
        for p in [4usize, 2, 3, 5] {
            while rest.is_multiple_of(p) && rest > 1 {
                factors.push(p);
                rest /= p;
            }
        }
        let mut p = 7;
        while rest > 1 {
            while rest.is_multiple_of(p) {
                factors.push(p);
                rest /= p;
            }
            p += 2;
        }
        let twiddles = (0..n)
            .map(|j| {
                let a = -2.0 * std::f64::consts::PI * j as f64 / n as f64;
                (a.cos(), a.sin())
            })
            .collect();
        Self { n, factors, twiddles }
    }

    /// `out = DFT(x)`, where `x` is read at `x[0], x[stride], …`.
    fn run(&self, x: &[(f64, f64)], out: &mut [(f64, f64)]) {
        self.rec(x, 1, self.n, 0, out);
    }

    fn rec(&self, x: &[(f64, f64)], stride: usize, n: usize, level: usize, out: &mut [(f64, f64)]) {
        if n == 1 {
            out[0] = x[0];
            return;
        }
        let p = self.factors[level];
        let m = n / p;
        for r in 0..p {
            self.rec(&x[r * stride..], stride * p, m, level + 1, &mut out[r * m..(r + 1) * m]);
        }
        // Combine the p sub-transforms: X[k + q·m] = Σ_r W_n^{r(k + q·m)} · Y_r[k].
        let scale = self.n / n;
        let mut t = [(0.0f64, 0.0f64); 16];
        let mut y = [(0.0f64, 0.0f64); 16];
        for k in 0..m {
            for r in 0..p {
                let (wr, wi) = self.twiddles[(r * k * scale) % self.n];
                let (a, b) = out[r * m + k];
                t[r] = (a * wr - b * wi, a * wi + b * wr);
            }
            for q in 0..p {
                let mut acc = (0.0, 0.0);
                for r in 0..p {
                    let (wr, wi) = self.twiddles[((r * q * m) % n) * scale];
                    let (a, b) = t[r];
                    acc.0 += a * wr - b * wi;
                    acc.1 += a * wi + b * wr;
                }
                y[q] = acc;
            }
            for q in 0..p {
                out[k + q * m] = y[q];
            }
        }
    }
}

/// Index of `i` (which may lie outside `0..len`) under NumPy's `reflect` padding.
fn reflect(i: isize, len: usize) -> usize {
    if len == 1 {
        return 0;
    }
    let period = 2 * (len as isize - 1);
    let mut j = i.rem_euclid(period);
    if j >= len as isize {
        j = period - j;
    }
    j as usize
}

/// The log-mel spectrogram of 16 kHz mono samples, over `threads` threads.
pub fn log_mel(samples: &[f32], filters: &[f32], threads: usize) -> LogMel {
    let mut padded = Vec::with_capacity(samples.len() + HOP);
    padded.extend_from_slice(samples);
    padded.resize(samples.len() + HOP, 0.0);
    let len = padded.len();
    // Frames of the centred STFT, less the last.
    let frames = len / HOP;
    let window: Vec<f32> = (0..N_FFT)
        .map(|j| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * j as f64 / N_FFT as f64).cos()) as f32)
        .collect();
    let fft = Fft::new(N_FFT);
    let half = (N_FFT / 2) as isize;
    let mut mel = vec![0.0f32; frames * N_MELS];
    // Frame-major while computing; transposed at the end.
    let work = |first: usize, out: &mut [f32]| {
        let mut x = vec![(0.0f64, 0.0f64); N_FFT];
        let mut spec = vec![(0.0f64, 0.0f64); N_FFT];
        let mut power = vec![0.0f32; N_FREQS];
        for (i, row) in out.chunks_exact_mut(N_MELS).enumerate() {
            let start = ((first + i) * HOP) as isize - half;
            for j in 0..N_FFT {
                let s = padded[reflect(start + j as isize, len)];
                x[j] = (f64::from(s * window[j]), 0.0);
            }
            fft.run(&x, &mut spec);
            for k in 0..N_FREQS {
                let (re, im) = spec[k];
                let (re, im) = (re as f32, im as f32);
                power[k] = re * re + im * im;
            }
            for (m, v) in row.iter_mut().enumerate() {
                let f = &filters[m * N_FREQS..(m + 1) * N_FREQS];
                let mut acc = 0.0f64;
                for k in 0..N_FREQS {
                    acc += f64::from(f[k]) * f64::from(power[k]);
                }
                *v = (acc as f32).max(1e-10).log10();
            }
        }
    };
    let threads = threads.clamp(1, frames.max(1));
    let per = frames.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let mut chunks = mel.chunks_mut(per * N_MELS).enumerate();
        let first = chunks.next();
        for (c, chunk) in chunks {
            let work = &work;
            s.spawn(move || work(c * per, chunk));
        }
        if let Some((_, chunk)) = first {
            work(0, chunk);
        }
    });
    let max = mel.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let floor = max - 8.0;
    let mut data = vec![0.0f32; frames * N_MELS];
    for t in 0..frames {
        for m in 0..N_MELS {
            data[m * frames + t] = (mel[t * N_MELS + m].max(floor) + 4.0) / 4.0;
        }
    }
    LogMel { data, frames }
}

impl LogMel {
    /// Frames `start .. start + len` of every bin, zero-padded to `width`
    /// frames: the encoder's input, `N_MELS × width`.
    pub fn window(&self, start: usize, len: usize, width: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; N_MELS * width];
        let len = len.min(width).min(self.frames.saturating_sub(start));
        for m in 0..N_MELS {
            let src = &self.data[m * self.frames + start..][..len];
            out[m * width..][..len].copy_from_slice(src);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fft_matches_the_direct_transform() {
        for n in [1usize, 2, 5, 12, 400] {
            let fft = Fft::new(n);
            let x: Vec<(f64, f64)> = (0..n)
                .map(|i| ((i as f64 * 0.37).sin(), (i as f64 * 0.11).cos()))
                .collect();
            let mut got = vec![(0.0, 0.0); n];
            fft.run(&x, &mut got);
            for k in 0..n {
                let mut want = (0.0f64, 0.0f64);
                for (j, (a, b)) in x.iter().enumerate() {
                    let ang = -2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                    want.0 += a * ang.cos() - b * ang.sin();
                    want.1 += a * ang.sin() + b * ang.cos();
                }
                assert!(
                    (got[k].0 - want.0).abs() < 1e-9 && (got[k].1 - want.1).abs() < 1e-9,
                    "n={n} k={k}"
                );
            }
        }
    }

    #[test]
    fn reflect_follows_numpy() {
        // np.pad([0,1,2,3], 5, mode="reflect") = [1,2,3,2,1, 0,1,2,3, 2,1,0,1,2]
        let want = [1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(reflect(i as isize - 5, 4), *w);
        }
    }

    #[test]
    fn frame_count_follows_the_feature_extractor() {
        let filters = mel_filters();
        for (n, frames) in [(0usize, 1usize), (159, 1), (160, 2), (16_000, 101)] {
            let mel = log_mel(&vec![0.1; n], &filters, 2);
            assert_eq!(mel.frames, frames, "{n} samples");
        }
    }
}
