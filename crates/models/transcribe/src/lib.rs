//! Speech to text with Whisper: audio in (WAV, MP3, FLAC, Ogg Vorbis, as a URL
//! or inline), text and timed segments out, streamed segment by segment.
pub use gantry_media::audio;
pub mod engine;
pub mod input;
mod worker;

pub use worker::{LoadError, MAX_AUDIO_BYTES, Options, TranscriptionModel, runtime};
