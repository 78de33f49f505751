//! Speech to text with Whisper: audio in (WAV, MP3, FLAC, Ogg Vorbis, as a URL
//! or inline), text and timed segments out, streamed segment by segment.
pub use gantry_media::audio;
pub mod engine;
mod factory;
pub mod input;
mod worker;

pub use factory::{TranscriptionFactory, TranscriptionSettings};
pub use worker::{LoadError, MAX_AUDIO_BYTES, Options, TranscriptionModel, runtime};
