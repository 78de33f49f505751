//! 16-bit PCM WAV, and the float-to-integer steps of the voices.

/// Float samples of one utterance to 16-bit PCM, as Piper does by default:
/// scaled so the loudest sample is full scale (a silent utterance stays
/// silent), then rounded and clipped.
pub fn to_pcm16(audio: &[f32]) -> Vec<i16> {
    let peak = audio
        .iter()
        .fold(0f32, |m, s| if s.is_finite() { m.max(s.abs()) } else { m });
    if peak < 1e-8 {
        return vec![0; audio.len()];
    }
    let scale = 32767.0 / peak;
    audio
        .iter()
        .map(|&s| {
            let s = if s.is_finite() { s } else { 0.0 };
            (s * scale).round().clamp(-32768.0, 32767.0) as i16
        })
        .collect()
}

/// Float samples to 16-bit PCM at their own level: clipped to ±1, scaled
/// by 32767 and rounded (what hibari's own WAV writer does).
pub fn clip_pcm16(audio: &[f32]) -> Vec<i16> {
    audio
        .iter()
        .map(|&s| {
            let s = if s.is_finite() { s.clamp(-1.0, 1.0) } else { 0.0 };
            (s * 32767.0).round() as i16
        })
        .collect()
}

/// A mono 16-bit PCM WAV file (RIFF, `fmt ` and `data` chunks) of `samples`.
pub fn encode(samples: &[i16], sample_rate: u32) -> Vec<u8> {
    let data_len = u32::try_from(samples.len() * 2).unwrap_or(u32::MAX - 36) & !1;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVE");
    out.extend_from_slice(b"fmt ");
    out.extend_from_slice(&16u32.to_le_bytes()); // size of the fmt chunk
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate * 2).to_le_bytes()); // bytes per second
    out.extend_from_slice(&2u16.to_le_bytes()); // bytes per frame
    out.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in &samples[..data_len as usize / 2] {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_samples_are_little_endian_pcm() {
        let wav = encode(&[0, 1, -1, i16::MAX, i16::MIN], 22050);
        assert_eq!(wav.len(), 44 + 10);
        assert_eq!(&wav[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes(wav[4..8].try_into().unwrap()), 36 + 10);
        assert_eq!(&wav[8..16], b"WAVEfmt ");
        assert_eq!(u16::from_le_bytes([wav[20], wav[21]]), 1);
        assert_eq!(u16::from_le_bytes([wav[22], wav[23]]), 1);
        assert_eq!(u32::from_le_bytes(wav[24..28].try_into().unwrap()), 22050);
        assert_eq!(u32::from_le_bytes(wav[28..32].try_into().unwrap()), 44100);
        assert_eq!(u16::from_le_bytes([wav[34], wav[35]]), 16);
        assert_eq!(&wav[36..40], b"data");
        assert_eq!(u32::from_le_bytes(wav[40..44].try_into().unwrap()), 10);
        assert_eq!(&wav[44..], &[0, 0, 1, 0, 0xff, 0xff, 0xff, 0x7f, 0x00, 0x80]);
    }

    #[test]
    fn pcm_is_peak_normalised_and_silence_stays_silent() {
        assert_eq!(to_pcm16(&[0.0, 0.25, -0.5]), [0, 16384, -32767]);
        assert_eq!(to_pcm16(&[0.0, 0.0]), [0, 0]);
        assert_eq!(to_pcm16(&[f32::NAN, 1.0]), [0, 32767]);
    }
}
