//! Speaker embeddings: a plain-Rust port of Resemblyzer's voice encoder
//! (`resemblyzer` 0.1.4, `VoiceEncoder.embed_utterance`), which maps 16 kHz
//! mono speech to a 256-dimensional, L2-normalised vector; two clips of the
//! same voice give vectors with a high cosine similarity ([`cosine`]).
//!
//! [`SpeakerEncoder::embed`] first prepares the audio as Resemblyzer's
//! `preprocess_wav` does: the volume is raised (never lowered) to -30 dBFS
//! ([`normalize_volume`]) and long silences are cut ([`trim_silences`]).
//! Then, as `embed_utterance` ([`SpeakerEncoder::embed_trimmed`]):
//!
//! 1. The utterance is split into partials of 160 mel frames (1.6 s), one
//!    every 77 frames (1.3 per second). The last one is kept only when the
//!    audio covers at least 75 % of it, or when it is the only one; the audio
//!    is zero-padded up to the end of the last partial.
//! 2. The mel spectrogram ([`SpeakerEncoder::mel`]) is librosa's
//!    `melspectrogram` with Resemblyzer's arguments: 400-sample (25 ms)
//!    periodic Hann windows every 160 samples (10 ms), centred on their frame
//!    by 200 zeros at each end, the power spectrum (magnitude squared), 40
//!    Slaney mel bands over 0 – 8 kHz with Slaney normalisation, no log;
//!    `1 + len / 160` frames. The zero padding is the default `pad_mode`
//!    (`"constant"`) of librosa 0.10 and later, which is what
//!    `pip install librosa` gives today (0.11.0 when this was written); older
//!    librosa padded by reflection, which changes the frames within 200
//!    samples of either end. The spectrum is computed in `f64` and the result
//!    rounded to `f32`; librosa stores the spectrum and sums the bands in
//!    `f32`, so values differ by under 1e-6 relative.
//! 3. Each partial goes through a 3-layer LSTM (hidden size 256, PyTorch's
//!    gate order input, forget, cell, output; zero initial state). The last
//!    layer's final hidden state goes through a 256 → 256 linear layer, a
//!    ReLU and L2 normalisation.
//! 4. The utterance's embedding is the mean of its partials' embeddings,
//!    L2-normalised.
//!
//! Differences from Resemblyzer:
//! - Voice activity is not detected by webrtcvad (which has no Rust port) but
//!   by energy; see [`trim_silences`]. The smoothing and dilation around it
//!   are Resemblyzer's.
//! - When trimming leaves nothing, [`SpeakerEncoder::embed`] embeds the
//!   untrimmed audio (Resemblyzer would embed an empty clip, i.e. silence).
//! - Empty input gives the zero vector (Resemblyzer embeds the padding, i.e.
//!   silence), and so does a partial whose ReLU output is all zeros (where
//!   Resemblyzer divides by a zero norm).
//!
//! The LSTM runs in `f32`, with the logistic function and `tanh` from a
//! polynomial `exp` (errors about 1e-7). The input projections of all the
//! frames of a batch of partials are one matrix product per layer; the
//! recurrence then multiplies the hidden-to-hidden weights by every
//! partial's state at each step, so that the weights are read once per step
//! for the whole batch. Weights are stored in panels of 32 outputs
//! (`Panels`) whose products the compiler vectorises with the accumulators
//! in registers. Agreement with Resemblyzer's algorithm in float64 is about
//! 1e-6 per embedding component.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use gantry_manifest::torch::Tensor;

/// The sample rate the encoder expects, in Hz.
pub const SAMPLE_RATE: u32 = 16_000;
/// Length of an embedding.
pub const EMBEDDING_SIZE: usize = 256;

/// Samples per FFT window (25 ms).
const N_FFT: usize = 400;
/// Samples between mel frames (10 ms).
const HOP: usize = 160;
/// Frequency bins of the one-sided spectrum.
const N_FREQS: usize = N_FFT / 2 + 1;
/// Mel bands.
const N_MELS: usize = 40;
/// Mel frames per partial utterance (1.6 s).
const PARTIAL_FRAMES: usize = 160;
/// Partial utterances per second of audio.
const PARTIALS_PER_SECOND: f64 = 1.3;
/// The share of the last partial the audio must cover for it to be kept.
const MIN_COVERAGE: f64 = 0.75;
/// LSTM hidden size.
const HIDDEN: usize = 256;
/// LSTM gate rows per layer (input, forget, cell, output).
const GATES: usize = 4 * HIDDEN;
/// LSTM layers.
const LAYERS: usize = 3;
/// The volume [`SpeakerEncoder::embed`] raises quiet audio to, in dBFS.
const TARGET_DBFS: f32 = -30.0;
/// Full scale of 16-bit PCM, Resemblyzer's reference for dBFS.
const INT16_MAX: f64 = 32767.0;
/// Samples per voice-activity window (30 ms).
const VAD_WINDOW: usize = 480;
/// Windows in the moving average over the voiced flags.
const VAD_AVERAGE_WIDTH: usize = 8;
/// Resemblyzer's `vad_max_silence_length`: voiced regions are dilated by a
/// structuring element of this many windows plus one, centred, i.e. by half
/// of it on each side.
const VAD_MAX_SILENCE: usize = 6;
/// The percentile of the windows' energies that stands for the clip's loud
/// speech.
const VAD_PERCENTILE: f64 = 95.0;
/// How far below that energy, in dB, a window still counts as voiced.
const VAD_RELATIVE_DB: f64 = 40.0;
/// The mean square below which a window never counts as voiced (-80 dB
/// relative to full scale, about 3 steps of 16-bit PCM in RMS).
const VAD_FLOOR_MEAN_SQUARE: f64 = 1e-8;

/// Resemblyzer's voice encoder, loaded; `Send + Sync`, so one can serve many
/// threads.
#[derive(Clone)]
pub struct SpeakerEncoder {
    layers: Vec<LstmLayer>,
    /// `EMBEDDING_SIZE × HIDDEN`, row-major.
    linear_weight: Vec<f32>,
    linear_bias: Vec<f32>,
    /// Threads one embedding may use (partials are shared out among them).
    threads: usize,
}

impl std::fmt::Debug for SpeakerEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpeakerEncoder")
            .field("layers", &self.layers.len())
            .field("hidden", &HIDDEN)
            .field("embedding", &EMBEDDING_SIZE)
            .field("threads", &self.threads)
            .finish()
    }
}

/// One LSTM layer's weights, gate rows in PyTorch's order.
#[derive(Clone)]
struct LstmLayer {
    /// Input size.
    input: usize,
    /// `W_ih` (`GATES × input`).
    w_ih: Panels,
    /// `W_hh` (`GATES × HIDDEN`).
    w_hh: Panels,
    /// `b_ih + b_hh`.
    bias: Vec<f32>,
}

/// Outputs of a weight panel: the outputs one kernel call computes (eight
/// SSE registers of accumulators).
const PANEL: usize = 32;

/// A weight matrix `W` (`outputs × inputs`, `outputs` a multiple of
/// [`PANEL`]) laid out for products with row vectors: panels of `PANEL`
/// consecutive outputs, each input-major, i.e.
/// `data[(p · inputs + k) · PANEL + j] = W[p · PANEL + j][k]`.
#[derive(Clone)]
struct Panels {
    inputs: usize,
    outputs: usize,
    data: Vec<f32>,
}

impl Panels {
    /// Lays out `w` (`outputs × inputs`, row-major).
    fn new(w: &[f32], inputs: usize) -> Self {
        let outputs = w.len() / inputs;
        let mut data = vec![0.0f32; outputs * inputs];
        for (j, row) in w.chunks_exact(inputs).enumerate() {
            let (p, lane) = (j / PANEL, j % PANEL);
            for (k, &v) in row.iter().enumerate() {
                data[(p * inputs + k) * PANEL + lane] = v;
            }
        }
        Self { inputs, outputs, data }
    }

    /// `out[r][j] += x[r] · W[j]` for every row `r` of `x` (`rows × inputs`)
    /// and `out` (`rows × outputs`). Each panel is used for all the rows
    /// before the next is read, so it stays in the L1 cache.
    fn accumulate(&self, x: &[f32], out: &mut [f32]) {
        for (p, panel) in self.data.chunks_exact(self.inputs * PANEL).enumerate() {
            let (panel, _) = panel.as_chunks::<PANEL>();
            for (x, o) in x.chunks_exact(self.inputs).zip(out.chunks_exact_mut(self.outputs)) {
                let (o, _) = o[p * PANEL..].as_chunks_mut::<PANEL>();
                if let Some(o) = o.first_mut() {
                    panel_kernel(x, panel, o);
                }
            }
        }
    }
}

/// `out[j] += Σ_k x[k] · panel[k][j]`, the accumulators kept in registers.
#[inline(always)]
fn panel_kernel(x: &[f32], panel: &[[f32; PANEL]], out: &mut [f32; PANEL]) {
    let mut acc = *out;
    for (&xk, w) in x.iter().zip(panel) {
        for (a, w) in acc.iter_mut().zip(w) {
            *a += xk * w;
        }
    }
    *out = acc;
}

impl SpeakerEncoder {
    /// Loads the converted Resemblyzer weights (safetensors).
    ///
    /// The tensors read are `model_state.lstm.{weight_ih,weight_hh,bias_ih,bias_hh}_l{0,1,2}`
    /// and `model_state.linear.{weight,bias}`, in any floating type; others
    /// (the optimiser state, the similarity scale) are ignored. One embedding
    /// uses one thread until [`SpeakerEncoder::with_threads`] says otherwise.
    pub fn load(path: &Path) -> Result<Self, String> {
        let tensors = gantry_manifest::torch::read_safetensors(path)
            .map_err(|e| format!("cannot read the speaker encoder {}: {e}", path.display()))?;
        let mut layers = Vec::with_capacity(LAYERS);
        for layer in 0..LAYERS {
            let input = if layer == 0 { N_MELS } else { HIDDEN };
            let w_ih = weights(
                &tensors,
                &format!("model_state.lstm.weight_ih_l{layer}"),
                &[GATES, input],
            )?;
            let w_hh = weights(
                &tensors,
                &format!("model_state.lstm.weight_hh_l{layer}"),
                &[GATES, HIDDEN],
            )?;
            let b_ih = weights(&tensors, &format!("model_state.lstm.bias_ih_l{layer}"), &[GATES])?;
            let b_hh = weights(&tensors, &format!("model_state.lstm.bias_hh_l{layer}"), &[GATES])?;
            let bias = b_ih.iter().zip(&b_hh).map(|(a, b)| a + b).collect();
            layers.push(LstmLayer {
                input,
                w_ih: Panels::new(&w_ih, input),
                w_hh: Panels::new(&w_hh, HIDDEN),
                bias,
            });
        }
        Ok(Self {
            layers,
            linear_weight: weights(&tensors, "model_state.linear.weight", &[EMBEDDING_SIZE, HIDDEN])?,
            linear_bias: weights(&tensors, "model_state.linear.bias", &[EMBEDDING_SIZE])?,
            threads: 1,
        })
    }

    /// The same encoder, spreading each embedding's partials over up to
    /// `threads` threads (0: one per core). Clips under about 2.7 s have a
    /// single partial and always use one thread.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        self
    }

    /// Embedding of 16 kHz mono samples: volume-normalised, silences trimmed, then as `embed_trimmed`.
    ///
    /// When trimming leaves nothing (under 30 ms of audio, or no window
    /// loud enough), the volume-normalised audio is embedded untrimmed.
    /// Empty input gives the zero vector.
    pub fn embed(&self, samples: &[f32]) -> Vec<f32> {
        if samples.is_empty() {
            return vec![0.0; EMBEDDING_SIZE];
        }
        let normalized = normalize_volume(samples, TARGET_DBFS);
        let trimmed = trim_silences(&normalized);
        if trimmed.is_empty() {
            self.embed_trimmed(&normalized)
        } else {
            self.embed_trimmed(&trimmed)
        }
    }

    /// Embedding without the preprocessing (for comparisons with resemblyzer on the same samples).
    ///
    /// This is `VoiceEncoder.embed_utterance` with its default rate (1.3
    /// partials per second) and minimum coverage (0.75). Empty input gives
    /// the zero vector.
    pub fn embed_trimmed(&self, samples: &[f32]) -> Vec<f32> {
        if samples.is_empty() {
            return vec![0.0; EMBEDDING_SIZE];
        }
        let starts = partial_starts(samples.len());
        let Some(&last) = starts.last() else {
            return vec![0.0; EMBEDDING_SIZE];
        };
        let padded_len = samples.len().max((last + PARTIAL_FRAMES) * HOP);
        let mut padded = Vec::with_capacity(padded_len);
        padded.extend_from_slice(samples);
        padded.resize(padded_len, 0.0);
        let (mel, _) = Self::mel(&padded);

        let threads = self.threads.clamp(1, starts.len());
        let per_thread = starts.len().div_ceil(threads);
        let mut groups = starts.chunks(per_thread);
        let mut sum = vec![0.0f32; EMBEDDING_SIZE];
        let mut add = |embeddings: Vec<f32>| {
            for row in embeddings.chunks_exact(EMBEDDING_SIZE) {
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += v;
                }
            }
        };
        let first = groups.next().unwrap_or_default();
        if threads == 1 {
            add(self.embed_partials(&mel, first));
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = groups
                    .map(|group| {
                        let mel = &mel;
                        scope.spawn(move || self.embed_partials(mel, group))
                    })
                    .collect();
                add(self.embed_partials(&mel, first));
                for handle in handles {
                    match handle.join() {
                        Ok(embeddings) => add(embeddings),
                        Err(panic) => std::panic::resume_unwind(panic),
                    }
                }
            });
        }
        // The mean's direction is the sum's.
        l2_normalize(&mut sum);
        sum
    }

    /// The 40-band mel frames (frames × 40, row-major), for tests.
    ///
    /// There are `1 + samples.len() / 160` frames, frame `t` centred on
    /// sample `160 t`; see the module documentation for the details.
    pub fn mel(samples: &[f32]) -> (Vec<f32>, usize) {
        let front = MelFrontEnd::get();
        let frames = 1 + samples.len() / HOP;
        let mut mel = vec![0.0f32; frames * N_MELS];
        // Centring: frame `t` covers samples `160 t - 200 .. 160 t + 200`,
        // zeros outside the clip (librosa's `pad_mode="constant"`).
        let mut padded = vec![0.0f32; samples.len() + N_FFT];
        padded[N_FFT / 2..N_FFT / 2 + samples.len()].copy_from_slice(samples);
        let mut frame = [0.0f64; N_FFT];
        let mut power = [0.0f64; N_FREQS];
        let mut work = front.fft.buffers();
        for (t, out) in mel.chunks_exact_mut(N_MELS).enumerate() {
            let chunk = &padded[t * HOP..t * HOP + N_FFT];
            if chunk.iter().all(|&s| s == 0.0) {
                continue;
            }
            for ((f, &s), &w) in frame.iter_mut().zip(chunk).zip(&front.window) {
                *f = f64::from(s) * w;
            }
            front.fft.power(&frame, &mut power, &mut work);
            for (m, (first, weights)) in out.iter_mut().zip(&front.filters) {
                *m = weights.iter().zip(&power[*first..]).map(|(w, p)| w * p).sum::<f64>() as f32;
            }
        }
        (mel, frames)
    }

    /// The L2-normalised embeddings (`starts.len() × EMBEDDING_SIZE`) of the
    /// partials that begin at mel frames `starts`, run as one batch.
    fn embed_partials(&self, mel: &[f32], starts: &[usize]) -> Vec<f32> {
        let batch = starts.len();
        let mut x = Vec::with_capacity(batch * PARTIAL_FRAMES * N_MELS);
        for &start in starts {
            x.extend_from_slice(&mel[start * N_MELS..(start + PARTIAL_FRAMES) * N_MELS]);
        }
        for (index, layer) in self.layers.iter().enumerate() {
            x = layer.run(&x, batch, PARTIAL_FRAMES, index + 1 < self.layers.len());
        }
        // `x` is now each partial's last hidden state of the last layer.
        let mut out = vec![0.0f32; batch * EMBEDDING_SIZE];
        for (hidden, embedding) in x.chunks_exact(HIDDEN).zip(out.chunks_exact_mut(EMBEDDING_SIZE)) {
            for ((e, row), b) in embedding
                .iter_mut()
                .zip(self.linear_weight.chunks_exact(HIDDEN))
                .zip(&self.linear_bias)
            {
                *e = (dot(row, hidden) + b).max(0.0);
            }
            l2_normalize(embedding);
        }
        out
    }
}

impl LstmLayer {
    /// Runs the layer over `batch` sequences of `steps` inputs each (`x`:
    /// `batch × steps × input`, row-major) from a zero state. Returns every
    /// hidden state (`batch × steps × HIDDEN`) when `all_steps`, else only
    /// the last one of each sequence (`batch × HIDDEN`).
    fn run(&self, x: &[f32], batch: usize, steps: usize, all_steps: bool) -> Vec<f32> {
        // W_ih · x + b_ih + b_hh for every frame at once.
        let rows = batch * steps;
        let mut projected = Vec::with_capacity(rows * GATES);
        for _ in 0..rows {
            projected.extend_from_slice(&self.bias);
        }
        self.w_ih.accumulate(&x[..rows * self.input], &mut projected);

        let mut h = vec![0.0f32; batch * HIDDEN];
        let mut c = vec![0.0f32; batch * HIDDEN];
        let mut gates = vec![0.0f32; batch * GATES];
        let mut out = if all_steps {
            vec![0.0f32; rows * HIDDEN]
        } else {
            Vec::new()
        };
        for t in 0..steps {
            for (b, g) in gates.chunks_exact_mut(GATES).enumerate() {
                g.copy_from_slice(&projected[(b * steps + t) * GATES..][..GATES]);
            }
            // + W_hh · h for every sequence; the state is zero at the first step.
            if t > 0 {
                self.w_hh.accumulate(&h, &mut gates);
            }
            for (b, ((g, hb), cb)) in gates
                .chunks_exact(GATES)
                .zip(h.chunks_exact_mut(HIDDEN))
                .zip(c.chunks_exact_mut(HIDDEN))
                .enumerate()
            {
                let (gi, rest) = g.split_at(HIDDEN);
                let (gf, rest) = rest.split_at(HIDDEN);
                let (gg, go) = rest.split_at(HIDDEN);
                let cells = cb.iter_mut().zip(hb.iter_mut()).zip(gi).zip(gf).zip(gg).zip(go);
                for (((((c, h), &i), &f), &g), &o) in cells {
                    let cell = sigmoid(f) * *c + sigmoid(i) * tanh(g);
                    *c = cell;
                    *h = sigmoid(o) * tanh(cell);
                }
                if all_steps {
                    out[(b * steps + t) * HIDDEN..][..HIDDEN].copy_from_slice(hb);
                }
            }
        }
        if all_steps { out } else { h }
    }
}

/// Raises the volume of `samples` to `target_dbfs` (the RMS relative to
/// 16-bit full scale, as Resemblyzer's `normalize_volume` with
/// `increase_only=True`); audio already that loud, and silence, is returned
/// unchanged. Samples are not clipped.
pub fn normalize_volume(samples: &[f32], target_dbfs: f32) -> Vec<f32> {
    if samples.is_empty() {
        return Vec::new();
    }
    let mean_square = samples
        .iter()
        .map(|&s| {
            let v = f64::from(s) * INT16_MAX;
            v * v
        })
        .sum::<f64>()
        / samples.len() as f64;
    if mean_square <= 0.0 {
        return samples.to_vec();
    }
    let dbfs = 10.0 * mean_square.log10() - 20.0 * INT16_MAX.log10();
    let change = f64::from(target_dbfs) - dbfs;
    if change <= 0.0 {
        return samples.to_vec();
    }
    let gain = 10f64.powf(change / 20.0) as f32;
    samples.iter().map(|&s| s * gain).collect()
}

/// Cuts long silences out of 16 kHz audio, as Resemblyzer's
/// `trim_long_silences` with an energy test in place of webrtcvad.
///
/// The audio is cut into 30 ms windows (a partial window at the end is
/// dropped, as Resemblyzer does). A window is voiced when its mean square is
/// above both the 95th percentile of all the windows' mean squares less
/// 40 dB and an absolute floor of -80 dB (full scale = 1). Then, as in
/// Resemblyzer, the flags are smoothed by a moving average over 8 windows
/// (window `j` stays voiced when more than half of windows `j - 3 ..= j + 4`
/// are, the result of its half-to-even rounding), the voiced regions are
/// widened by 3 windows on each side, and the voiced windows' samples are
/// returned in order. Audio under 30 ms gives an empty result.
pub fn trim_silences(samples: &[f32]) -> Vec<f32> {
    let windows = samples.len() / VAD_WINDOW;
    if windows == 0 {
        return Vec::new();
    }
    let energies: Vec<f64> = samples
        .chunks_exact(VAD_WINDOW)
        .map(|w| w.iter().map(|&s| f64::from(s) * f64::from(s)).sum::<f64>() / VAD_WINDOW as f64)
        .collect();
    let threshold =
        (percentile(&energies, VAD_PERCENTILE) * 10f64.powf(-VAD_RELATIVE_DB / 10.0)).max(VAD_FLOOR_MEAN_SQUARE);
    let voiced: Vec<bool> = energies.iter().map(|&e| e > threshold).collect();

    let before = (VAD_AVERAGE_WIDTH - 1) / 2;
    let after = VAD_AVERAGE_WIDTH / 2;
    let smoothed: Vec<bool> = (0..windows)
        .map(|j| {
            let span = &voiced[j.saturating_sub(before)..(j + after + 1).min(windows)];
            2 * span.iter().filter(|&&v| v).count() > VAD_AVERAGE_WIDTH
        })
        .collect();

    // The structuring element has `VAD_MAX_SILENCE + 1` (odd) windows, centred.
    let reach = VAD_MAX_SILENCE / 2;
    let mut kept = Vec::with_capacity(samples.len());
    for (j, window) in samples.chunks_exact(VAD_WINDOW).enumerate() {
        if smoothed[j.saturating_sub(reach)..(j + reach + 1).min(windows)].contains(&true) {
            kept.extend_from_slice(window);
        }
    }
    kept
}

/// Cosine similarity of two embeddings.
///
/// Zero when either vector is zero; only the common prefix is used when the
/// lengths differ.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        (ab / (aa.sqrt() * bb.sqrt())) as f32
    }
}

/// The first mel frame of each partial utterance of an `n_samples`-long clip
/// (Resemblyzer's `compute_partial_slices` with its default rate and
/// coverage); never empty.
fn partial_starts(n_samples: usize) -> Vec<usize> {
    let n_frames = (n_samples + 1).div_ceil(HOP);
    let step = (f64::from(SAMPLE_RATE) / PARTIALS_PER_SECOND / HOP as f64).round() as usize;
    let steps = (n_frames + step + 1).saturating_sub(PARTIAL_FRAMES).max(1);
    let mut starts: Vec<usize> = (0..steps).step_by(step).collect();
    if let [.., last] = starts[..] {
        let coverage = (n_samples as f64 - (last * HOP) as f64) / (PARTIAL_FRAMES * HOP) as f64;
        if coverage < MIN_COVERAGE && starts.len() > 1 {
            starts.pop();
        }
    }
    starts
}

/// Reads tensor `name`, checking its shape, as `f32`.
fn weights(tensors: &BTreeMap<String, Tensor>, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
    let tensor = tensors
        .get(name)
        .ok_or_else(|| format!("the speaker encoder has no tensor {name}"))?;
    if tensor.shape != shape {
        return Err(format!(
            "the speaker encoder's {name} has shape {:?}, not {shape:?}",
            tensor.shape
        ));
    }
    tensor
        .to_f32()
        .ok_or_else(|| format!("the speaker encoder's {name} is not floating point"))
}

/// `a · b` (`a.len() == b.len()`), eight lanes at a time.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ac, a_tail) = a.as_chunks::<8>();
    let (bc, b_tail) = b.as_chunks::<8>();
    let mut acc = [0.0f32; 8];
    for (x, y) in ac.iter().zip(bc) {
        for ((a, x), y) in acc.iter_mut().zip(x).zip(y) {
            *a += x * y;
        }
    }
    acc.iter().sum::<f32>() + dot_plain(a_tail, b_tail)
}

fn dot_plain(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The logistic function, from [`exp_approx`].
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_approx(-x))
}

/// The hyperbolic tangent as `2 σ(2x) - 1` (absolute error about 1e-7).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    2.0 * sigmoid(2.0 * x) - 1.0
}

/// `e^x` with Cephes' `expf` reduction and polynomial (relative error about
/// 1e-7), `x` clamped to `[-87, 88]`; branch-free plain arithmetic, so that
/// loops over it vectorise (libm's `expf` and `tanhf` do not).
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    /// 1.5 · 2²³: adding it rounds a float below 2²² in magnitude to an
    /// integer, which then sits in the low bits of the sum's mantissa.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n, built from the exponent bits; n is in -126 ..= 127.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    e * f32::from_bits(n_int.wrapping_add(127) << 23)
}

/// Scales `v` to unit length; a zero vector stays zero.
fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        let scale = (1.0 / norm) as f32;
        for x in v {
            *x *= scale;
        }
    }
}

/// `p`-th percentile of `values` with linear interpolation between the
/// closest ranks (NumPy's default); `values` is not empty.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

/// The window, FFT and mel filters of [`SpeakerEncoder::mel`], built once.
struct MelFrontEnd {
    /// Periodic Hann window of `N_FFT` samples.
    window: Vec<f64>,
    fft: RealFft,
    /// Each mel band's first frequency bin with a non-zero weight, and its
    /// weights from there on (rounded to `f32`, as librosa stores them).
    filters: Vec<(usize, Vec<f64>)>,
}

impl MelFrontEnd {
    fn get() -> &'static Self {
        static FRONT: OnceLock<MelFrontEnd> = OnceLock::new();
        FRONT.get_or_init(Self::new)
    }

    fn new() -> Self {
        let window = (0..N_FFT)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos())
            .collect();
        Self {
            window,
            fft: RealFft::new(N_FFT),
            filters: mel_filters(),
        }
    }
}

/// librosa's `filters.mel(sr=16000, n_fft=400, n_mels=40)`: triangles on the
/// Slaney mel scale from 0 Hz to 8 kHz, each scaled by 2 / its width in Hz;
/// stored from each band's first non-zero weight to its last.
fn mel_filters() -> Vec<(usize, Vec<f64>)> {
    let sample_rate = f64::from(SAMPLE_RATE);
    let max_mel = hz_to_mel(sample_rate / 2.0);
    let points = N_MELS + 2;
    let edges: Vec<f64> = (0..points)
        .map(|i| {
            let mel = if i + 1 == points {
                max_mel
            } else {
                i as f64 * max_mel / (points - 1) as f64
            };
            mel_to_hz(mel)
        })
        .collect();
    (0..N_MELS)
        .map(|m| {
            let norm = 2.0 / (edges[m + 2] - edges[m]);
            let row: Vec<f64> = (0..N_FREQS)
                .map(|k| {
                    let freq = k as f64 * sample_rate / N_FFT as f64;
                    let rising = (freq - edges[m]) / (edges[m + 1] - edges[m]);
                    let falling = (edges[m + 2] - freq) / (edges[m + 2] - edges[m + 1]);
                    f64::from((rising.min(falling).max(0.0) * norm) as f32)
                })
                .collect();
            let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
            let end = row.iter().rposition(|&w| w != 0.0).map_or(first, |last| last + 1);
            (first, row[first..end].to_vec())
        })
        .collect()
}

/// Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic
/// above (27 mels per factor 6.4).
fn hz_to_mel(hz: f64) -> f64 {
    let log_step = 6.4f64.ln() / 27.0;
    if hz >= 1000.0 {
        15.0 + (hz / 1000.0).ln() / log_step
    } else {
        hz * 3.0 / 200.0
    }
}

/// The inverse of [`hz_to_mel`].
fn mel_to_hz(mel: f64) -> f64 {
    let log_step = 6.4f64.ln() / 27.0;
    if mel >= 15.0 {
        1000.0 * (log_step * (mel - 15.0)).exp()
    } else {
        mel * 200.0 / 3.0
    }
}

/// Complex numbers as `(re, im)`.
type Complex = (f64, f64);

/// The power spectrum of real frames of one even length `n`, from a complex
/// FFT of `n / 2` points (even samples as real parts, odd as imaginary).
struct RealFft {
    half: Fft,
    /// `exp(-2πi k / n)` for `k` in `0 ..= n / 2`.
    twiddles: Vec<Complex>,
}

/// Work space of [`RealFft::power`].
struct FftBuffers {
    packed: Vec<Complex>,
    spectrum: Vec<Complex>,
    scratch: Vec<Complex>,
}

impl RealFft {
    fn new(n: usize) -> Self {
        let twiddles = (0..=n / 2)
            .map(|k| {
                let angle = -2.0 * std::f64::consts::PI * k as f64 / n as f64;
                (angle.cos(), angle.sin())
            })
            .collect();
        Self {
            half: Fft::new(n / 2),
            twiddles,
        }
    }

    fn buffers(&self) -> FftBuffers {
        let h = self.half.n;
        FftBuffers {
            packed: vec![(0.0, 0.0); h],
            spectrum: vec![(0.0, 0.0); h],
            scratch: vec![(0.0, 0.0); self.half.max_radix],
        }
    }

    /// `power[k] = |Σ_j frame[j] · exp(-2πi jk / n)|²` for `k` in `0 ..= n / 2`.
    fn power(&self, frame: &[f64], power: &mut [f64], work: &mut FftBuffers) {
        let h = self.half.n;
        let (pairs, _) = frame.as_chunks::<2>();
        for (z, pair) in work.packed.iter_mut().zip(pairs) {
            *z = (pair[0], pair[1]);
        }
        self.half.transform(&work.packed, &mut work.spectrum, &mut work.scratch);
        for (k, (p, &(tr, ti))) in power.iter_mut().zip(&self.twiddles).enumerate() {
            let (ar, ai) = work.spectrum[k % h];
            let (br, bi) = work.spectrum[(h - k % h) % h];
            // The even samples' spectrum (Z[k] + conj Z[h-k]) / 2 and the odd
            // samples' (Z[k] - conj Z[h-k]) / 2i, combined.
            let (er, ei) = (0.5 * (ar + br), 0.5 * (ai - bi));
            let (or, oi) = (0.5 * (ai + bi), -0.5 * (ar - br));
            let re = er + tr * or - ti * oi;
            let im = ei + tr * oi + ti * or;
            *p = re * re + im * im;
        }
    }
}

/// A complex FFT of one size, mixed radix (any factorisation; 200 is
/// 4·2·5·5), decimation in time, in `f64`.
struct Fft {
    n: usize,
    /// `(radix, remaining length)` of each stage, outermost first.
    stages: Vec<(usize, usize)>,
    max_radix: usize,
    /// `exp(-2πi j / n)`.
    twiddles: Vec<Complex>,
}

impl Fft {
    fn new(n: usize) -> Self {
        let mut stages = Vec::new();
        let mut rest = n;
        let mut radix = 4;
        while rest > 1 {
            while !rest.is_multiple_of(radix) {
                radix = match radix {
                    4 => 2,
                    2 => 3,
                    r => r + 2,
                };
            }
            rest /= radix;
            stages.push((radix, rest));
        }
        let twiddles = (0..n)
            .map(|j| {
                let angle = -2.0 * std::f64::consts::PI * j as f64 / n as f64;
                (angle.cos(), angle.sin())
            })
            .collect();
        Self {
            n,
            max_radix: stages.iter().map(|&(radix, _)| radix).max().unwrap_or(1),
            stages,
            twiddles,
        }
    }

    /// `output[k] = Σ_j input[j] · exp(-2πi jk / n)`; both of length `n`,
    /// `scratch` of length `max_radix`.
    fn transform(&self, input: &[Complex], output: &mut [Complex], scratch: &mut [Complex]) {
        if self.stages.is_empty() {
            output[..self.n].copy_from_slice(&input[..self.n]);
        } else {
            self.stage(output, input, 0, 1, 0, scratch);
        }
    }

    /// Transforms `input[offset], input[offset + stride], …` (`out.len()`
    /// values) into `out`, from stage `stage` on.
    fn stage(
        &self,
        out: &mut [Complex],
        input: &[Complex],
        offset: usize,
        stride: usize,
        stage: usize,
        scratch: &mut [Complex],
    ) {
        let (radix, m) = self.stages[stage];
        if m == 1 {
            for (q, o) in out[..radix].iter_mut().enumerate() {
                *o = input[offset + q * stride];
            }
        } else {
            for (q, part) in out[..radix * m].chunks_exact_mut(m).enumerate() {
                self.stage(part, input, offset + q * stride, stride * radix, stage + 1, scratch);
            }
        }
        // Combine the `radix` sub-transforms of length `m`.
        let scratch = &mut scratch[..radix];
        for u in 0..m {
            for (q, s) in scratch.iter_mut().enumerate() {
                *s = out[u + q * m];
            }
            for q1 in 0..radix {
                let k = u + q1 * m;
                let step = stride * k;
                let mut twiddle = 0;
                let (mut re, mut im) = scratch[0];
                for &(sr, si) in &scratch[1..] {
                    twiddle += step;
                    if twiddle >= self.n {
                        twiddle -= self.n;
                    }
                    let (tr, ti) = self.twiddles[twiddle];
                    re += sr * tr - si * ti;
                    im += sr * ti + si * tr;
                }
                out[k] = (re, im);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_spectrum_matches_the_definition() {
        let n = N_FFT;
        let frame: Vec<f64> = (0..n)
            .map(|j| (j as f64 * 0.37).sin() + (j as f64 * 0.011).cos() * 0.5)
            .collect();
        let fft = RealFft::new(n);
        let mut power = vec![0.0; n / 2 + 1];
        fft.power(&frame, &mut power, &mut fft.buffers());
        for (k, &p) in power.iter().enumerate() {
            let (mut re, mut im) = (0.0f64, 0.0f64);
            for (j, &x) in frame.iter().enumerate() {
                let angle = -2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                re += x * angle.cos();
                im += x * angle.sin();
            }
            let want = re * re + im * im;
            assert!((p - want).abs() < 1e-9 * want.max(1.0), "bin {k}: {p}, not {want}");
        }
    }

    #[test]
    fn activations_are_accurate() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.05;
            let want = f64::from(x).exp();
            let got = f64::from(exp_approx(x));
            if x > -87.0 && x < 88.0 {
                assert!((got / want - 1.0).abs() < 3e-7, "exp({x}) = {got}, not {want}");
            }
            assert!((f64::from(tanh(x)) - f64::from(x).tanh()).abs() < 3e-7, "tanh({x})");
            let logistic = 1.0 / (1.0 + (-f64::from(x)).exp());
            assert!((f64::from(sigmoid(x)) - logistic).abs() < 2e-7, "sigmoid({x})");
        }
        assert!((0.0..1e-37).contains(&sigmoid(-1e30)));
        assert_eq!(sigmoid(1e30), 1.0);
        assert_eq!(tanh(1e30), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
    }

    #[test]
    fn partials_follow_resemblyzer() {
        // compute_partial_slices(n, 1.3, 0.75), by hand from its formulas.
        assert_eq!(partial_starts(0), vec![0]);
        assert_eq!(partial_starts(16_000), vec![0]);
        assert_eq!(partial_starts(80_000), vec![0, 77, 154, 231, 308]);
        assert_eq!(partial_starts(81_000), vec![0, 77, 154, 231, 308, 385]);
        assert_eq!(partial_starts(43_000), vec![0, 77]);
        assert_eq!(partial_starts(123_456), vec![0, 77, 154, 231, 308, 385, 462, 539, 616]);
    }

    #[test]
    fn trimming_keeps_speech_and_drops_long_silence() {
        let tone: Vec<f32> = (0..VAD_WINDOW * 20).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
        let mut clip = tone.clone();
        clip.extend(std::iter::repeat_n(0.0, VAD_WINDOW * 30));
        clip.extend_from_slice(&tone);
        let trimmed = trim_silences(&clip);
        // 40 voiced windows, plus at most 3 on each side of each voiced run.
        assert!(trimmed.len() >= 40 * VAD_WINDOW && trimmed.len() <= 46 * VAD_WINDOW);
        assert!(trim_silences(&[0.1; 100]).is_empty());
    }

    #[test]
    fn volume_is_only_raised() {
        let quiet = vec![0.001f32; 1000];
        let raised = normalize_volume(&quiet, -30.0);
        let rms = (raised.iter().map(|s| s * s).sum::<f32>() / 1000.0).sqrt();
        assert!((20.0 * rms.log10() + 30.0).abs() < 0.01);
        let loud = vec![0.5f32; 10];
        assert_eq!(normalize_volume(&loud, -30.0), loud);
        assert_eq!(normalize_volume(&[0.0; 4], -30.0), vec![0.0; 4]);
    }
}
