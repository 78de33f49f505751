//! The caller's audio file, decoded and brought to what Whisper hears: one
//! channel of `f32` samples at 16 kHz.
//!
//! Decoding is symphonia's (WAV, MP3, FLAC, Ogg Vorbis; all in Rust).
//! Channels are averaged. The sample rate is changed by a windowed-sinc
//! polyphase filter: for rates whose ratio to 16 kHz is `L/M` in lowest
//! terms, output sample `n` sits at input position `n·M/L`, whose fractional
//! part is one of `L` phases; each phase's taps are computed once. The
//! filter's cutoff is the lower of the two Nyquist frequencies, so nothing
//! above 8 kHz folds back when the rate goes down.
use std::f64::consts::PI;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{CODEC_TYPE_NULL, DecoderOptions};
use symphonia::core::errors::Error;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// The sample rate Whisper listens at.
pub const SAMPLE_RATE: u32 = 16_000;
/// Sample rates accepted on input.
const RATES: std::ops::RangeInclusive<u32> = 8_000..=192_000;
/// Zero crossings of the sinc on each side of the centre, at the cutoff.
const ZEROS: f64 = 16.0;
/// Packets that may fail to decode (a damaged frame) before the file is refused.
const MAX_BAD_PACKETS: usize = 16;

/// Decoded audio: mono, 16 kHz.
#[derive(Debug, Clone)]
pub struct Audio {
    pub samples: Vec<f32>,
    /// The file's own sample rate and channel count, for the logs.
    pub source_rate: u32,
    pub source_channels: usize,
}

impl Audio {
    /// Seconds of audio.
    pub fn duration(&self) -> f64 {
        self.samples.len() as f64 / f64::from(SAMPLE_RATE)
    }
}

/// Decodes `bytes` (WAV, MP3, FLAC or Ogg Vorbis), refusing audio longer
/// than `max_seconds`. Errors are meant for the caller: what is wrong with
/// their file.
pub fn decode(bytes: Vec<u8>, max_seconds: f64) -> Result<Audio, String> {
    let source = MediaSourceStream::new(Box::new(std::io::Cursor::new(bytes)), Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &Hint::new(),
            source,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(|e| format!("not a WAV, MP3, FLAC or Ogg Vorbis file ({e})"))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or("the file holds no audio track")?;
    let track_id = track.id;
    let rate = track
        .codec_params
        .sample_rate
        .ok_or("the audio track has no sample rate")?;
    if !RATES.contains(&rate) {
        return Err(format!(
            "sample rate {rate} Hz is outside {} to {} Hz",
            RATES.start(),
            RATES.end()
        ));
    }
    let too_long = |seconds: f64| format!("the audio is {seconds:.1} s long; at most {max_seconds} s is accepted");
    if let Some(frames) = track.codec_params.n_frames {
        let seconds = frames as f64 / f64::from(rate);
        if seconds > max_seconds + 0.5 {
            return Err(too_long(seconds));
        }
    }
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| format!("cannot decode this audio ({e})"))?;

    let limit = (max_seconds + 0.5) * f64::from(rate);
    let mut mono: Vec<f32> = Vec::new();
    let mut buffer: Option<SampleBuffer<f32>> = None;
    let mut channels = 0;
    let mut bad_packets = 0;
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(Error::ResetRequired) => break,
            Err(e) => return Err(format!("cannot read the audio ({e})")),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            Err(Error::DecodeError(e)) => {
                bad_packets += 1;
                if bad_packets > MAX_BAD_PACKETS {
                    return Err(format!("the audio is damaged ({e})"));
                }
                continue;
            }
            Err(e) => return Err(format!("cannot decode the audio ({e})")),
        };
        let spec = *decoded.spec();
        channels = spec.channels.count().max(1);
        let needed = decoded.capacity() * channels;
        let samples = match &mut buffer {
            Some(b) if b.capacity() >= needed => b,
            slot => slot.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        samples.copy_interleaved_ref(decoded);
        let scale = 1.0 / channels as f32;
        mono.extend(
            samples
                .samples()
                .chunks_exact(channels)
                .map(|f| f.iter().sum::<f32>() * scale),
        );
        if mono.len() as f64 > limit {
            return Err(too_long(mono.len() as f64 / f64::from(rate)));
        }
    }
    if mono.is_empty() {
        return Err("the file holds no audio samples".into());
    }
    if mono.iter().any(|s| !s.is_finite()) {
        return Err("the audio holds samples that are not numbers".into());
    }
    Ok(Audio {
        samples: resample(&mono, rate, SAMPLE_RATE),
        source_rate: rate,
        source_channels: channels,
    })
}

/// `input` at `from` Hz, resampled to `to` Hz (see the module's notes).
pub fn resample(input: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || input.is_empty() {
        return input.to_vec();
    }
    let g = gcd(from, to);
    let (up, down) = ((to / g) as usize, (from / g) as usize);
    // Cutoff as a fraction of the input's Nyquist frequency.
    let cutoff = (f64::from(to) / f64::from(from)).min(1.0);
    let half = (ZEROS / cutoff).ceil() as usize;
    let taps = 2 * half;
    // Phase p: output at input position base + p/up; tap j is input base - half + 1 + j.
    let mut table = vec![0.0f32; up * taps];
    for p in 0..up {
        let frac = p as f64 / up as f64;
        let row = &mut table[p * taps..(p + 1) * taps];
        let mut sum = 0.0;
        for (j, weight) in row.iter_mut().enumerate() {
            let distance = frac - (j as f64 + 1.0 - half as f64);
            let w = kernel(distance, cutoff, half as f64);
            *weight = w as f32;
            sum += w;
        }
        // Unit gain at DC for every phase.
        if sum.abs() > 1e-12 {
            row.iter_mut().for_each(|w| *w = (f64::from(*w) / sum) as f32);
        }
    }
    let out_len = (input.len() as u64 * up as u64).div_ceil(down as u64) as usize;
    let mut out = Vec::with_capacity(out_len);
    for n in 0..out_len {
        let position = n * down;
        let (base, phase) = (position / up, position % up);
        let row = &table[phase * taps..(phase + 1) * taps];
        let first = base as isize + 1 - half as isize;
        let mut acc = 0.0f32;
        if first >= 0 && first as usize + taps <= input.len() {
            let window = &input[first as usize..first as usize + taps];
            acc = window.iter().zip(row).map(|(x, w)| x * w).sum();
        } else {
            for (j, w) in row.iter().enumerate() {
                let k = first + j as isize;
                if k >= 0 && (k as usize) < input.len() {
                    acc += input[k as usize] * w;
                }
            }
        }
        out.push(acc);
    }
    out
}

/// A Blackman-windowed sinc low-pass at `cutoff` (of the input Nyquist),
/// `half` input samples wide on each side.
fn kernel(distance: f64, cutoff: f64, half: f64) -> f64 {
    if distance.abs() >= half {
        return 0.0;
    }
    let x = PI * cutoff * distance;
    let sinc = if x.abs() < 1e-9 { 1.0 } else { x.sin() / x };
    let phase = PI * (distance / half + 1.0);
    let window = 0.42 - 0.5 * phase.cos() + 0.08 * (2.0 * phase).cos();
    cutoff * sinc * window
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(freq: f64, rate: u32, seconds: f64) -> Vec<f32> {
        let n = (seconds * f64::from(rate)) as usize;
        (0..n)
            .map(|i| (2.0 * PI * freq * i as f64 / f64::from(rate)).sin() as f32 * 0.5)
            .collect()
    }

    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
    }

    /// A 16-bit PCM WAV file.
    fn wav(samples: &[f32], rate: u32, channels: u16) -> Vec<u8> {
        let data: Vec<u8> = samples
            .iter()
            .flat_map(|s| {
                let v = (s.clamp(-1.0, 1.0) * 32767.0) as i16;
                std::iter::repeat_n(v.to_le_bytes(), usize::from(channels)).flatten()
            })
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * 2 * u32::from(channels)).to_le_bytes());
        out.extend_from_slice(&(2 * channels).to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
        out
    }

    #[test]
    fn a_tone_keeps_its_level_and_frequency_through_resampling() {
        for from in [8_000, 22_050, 44_100, 48_000] {
            let out = resample(&tone(440.0, from, 1.0), from, SAMPLE_RATE);
            assert_eq!(out.len(), 16_000, "{from} Hz");
            let expected = tone(440.0, SAMPLE_RATE, 1.0);
            // Away from the edges the resampled tone is the tone at 16 kHz.
            let error: f64 = out[400..15_600]
                .iter()
                .zip(&expected[400..15_600])
                .map(|(a, b)| f64::from(a - b).abs())
                .fold(0.0, f64::max);
            assert!(error < 2e-3, "{from} Hz: max error {error}");
        }
    }

    #[test]
    fn frequencies_above_the_new_nyquist_are_removed() {
        // 11 kHz at 44.1 kHz would alias to 5 kHz at 16 kHz.
        let out = resample(&tone(11_000.0, 44_100, 1.0), 44_100, SAMPLE_RATE);
        assert!(rms(&out[400..15_600]) < 0.005, "rms {}", rms(&out));
    }

    #[test]
    fn wav_files_are_decoded_mixed_down_and_resampled() {
        let audio = decode(wav(&tone(300.0, 22_050, 2.0), 22_050, 2), 60.0).unwrap();
        assert_eq!((audio.source_rate, audio.source_channels), (22_050, 2));
        assert!((audio.duration() - 2.0).abs() < 1e-3, "{}", audio.duration());
        assert!((rms(&audio.samples) - 0.5 / 2f64.sqrt()).abs() < 0.01);
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let err = decode(b"these bytes are no sound file at all".to_vec(), 60.0).unwrap_err();
        assert!(err.contains("not a WAV, MP3, FLAC or Ogg Vorbis file"), "{err}");
        let err = decode(wav(&tone(300.0, 16_000, 3.0), 16_000, 1), 2.0).unwrap_err();
        assert!(err.contains("at most 2 s"), "{err}");
        let err = decode(wav(&[], 16_000, 1), 2.0).unwrap_err();
        assert!(err.contains("no audio samples"), "{err}");
        let err = decode(wav(&tone(300.0, 4_000, 1.0), 4_000, 1), 60.0).unwrap_err();
        assert!(err.contains("outside 8000 to 192000 Hz"), "{err}");
    }
}
