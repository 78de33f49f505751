//! The file formats a voice's audio is written in: WAV (16-bit PCM), FLAC
//! (lossless, by the pure-Rust `flacenc`) and Ogg Vorbis (lossy, by the
//! aoTuV build of libvorbis that `vorbis_rs` compiles from its vendored
//! source). MP3 is not offered: the one maintained MP3 encoder, LAME, is
//! LGPL and would be linked statically into the binary.
use std::num::{NonZeroU8, NonZeroU32};

use serde::Deserialize;
use utoipa::ToSchema;

use crate::wav;

/// Vorbis quality, -0.2 ..= 1 (0.5 is about 80 kbit/s for mono speech at 22 kHz).
const VORBIS_QUALITY: f32 = 0.5;
/// The Ogg stream's serial number: fixed, so the same input gives the same bytes.
const OGG_SERIAL: i32 = 0x6761_6e74;
/// Samples handed to libvorbis at once (its documentation suggests about 1024).
const VORBIS_BLOCK: usize = 1024;

/// An audio file format of the speech models: a job's `format`, read by its
/// lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Wav,
    Flac,
    Ogg,
}

impl Format {
    /// The name a job's `format` gives.
    pub fn name(self) -> &'static str {
        match self {
            Self::Wav => "wav",
            Self::Flac => "flac",
            Self::Ogg => "ogg",
        }
    }

    /// The media type the file is served with.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Wav => "audio/wav",
            Self::Flac => "audio/flac",
            Self::Ogg => "audio/ogg",
        }
    }

    /// A mono file of `samples` at `sample_rate`.
    pub fn encode(self, samples: &[i16], sample_rate: u32) -> Result<Vec<u8>, String> {
        match self {
            Self::Wav => Ok(wav::encode(samples, sample_rate)),
            Self::Flac => flac(samples, sample_rate),
            Self::Ogg => vorbis(samples, sample_rate),
        }
    }
}

fn flac(samples: &[i16], sample_rate: u32) -> Result<Vec<u8>, String> {
    use flacenc::component::BitRepr as _;
    use flacenc::error::Verify as _;
    let config = flacenc::config::Encoder::default()
        .into_verified()
        .map_err(|(_, e)| format!("FLAC encoder settings: {e}"))?;
    let wide: Vec<i32> = samples.iter().map(|&s| i32::from(s)).collect();
    let source = flacenc::source::MemSource::from_samples(&wide, 1, 16, sample_rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size)
        .map_err(|e| format!("FLAC encoding failed: {e}"))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream
        .write(&mut sink)
        .map_err(|e| format!("FLAC encoding failed: {e}"))?;
    Ok(sink.as_slice().to_vec())
}

fn vorbis(samples: &[i16], sample_rate: u32) -> Result<Vec<u8>, String> {
    let failed = |e: vorbis_rs::VorbisError| format!("Ogg Vorbis encoding failed: {e}");
    let rate = NonZeroU32::new(sample_rate).ok_or("the sample rate is 0")?;
    let mut out = Vec::new();
    let mut builder = vorbis_rs::VorbisEncoderBuilder::new_with_serial(rate, NonZeroU8::MIN, &mut out, OGG_SERIAL);
    builder.bitrate_management_strategy(vorbis_rs::VorbisBitrateManagementStrategy::QualityVbr {
        target_quality: VORBIS_QUALITY,
    });
    let mut encoder = builder.build().map_err(failed)?;
    let floats: Vec<f32> = samples.iter().map(|&s| f32::from(s) / 32768.0).collect();
    for block in floats.chunks(VORBIS_BLOCK) {
        encoder.encode_audio_block([block]).map_err(failed)?;
    }
    encoder.finish().map_err(failed)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone() -> Vec<i16> {
        (0..22_050)
            .map(|i| ((i as f32 * 440.0 * std::f32::consts::TAU / 22_050.0).sin() * 12_000.0) as i16)
            .collect()
    }

    #[test]
    fn each_format_has_its_signature_and_is_deterministic() {
        let samples = tone();
        for (format, magic) in [
            (Format::Wav, &b"RIFF"[..]),
            (Format::Flac, b"fLaC"),
            (Format::Ogg, b"OggS"),
        ] {
            let file = format.encode(&samples, 22_050).unwrap();
            assert!(file.starts_with(magic), "{format:?}");
            assert_eq!(
                file,
                format.encode(&samples, 22_050).unwrap(),
                "{format:?}: same input, same bytes"
            );
            let named: Format = serde_json::from_value(serde_json::json!(format.name())).unwrap();
            assert_eq!(named, format);
        }
        // FLAC is lossless but smaller than the PCM; Vorbis far smaller.
        let wav = Format::Wav.encode(&samples, 22_050).unwrap().len();
        assert!(Format::Flac.encode(&samples, 22_050).unwrap().len() < wav);
        assert!(Format::Ogg.encode(&samples, 22_050).unwrap().len() * 4 < wav);
        assert!(serde_json::from_value::<Format>(serde_json::json!("mp3")).is_err());
    }
}
