//! Media files in and out, shared by the model crates: audio decoded from
//! the caller's files (WAV, MP3, FLAC, Ogg Vorbis) and resampled
//! ([`audio`]), and generated images encoded as PNG, JPEG or WebP
//! ([`image`]).
//!
//! A library, not a model: model crates depend on it rather than on each
//! other (`docs/architecture.md`).

pub mod audio;
pub mod image;
