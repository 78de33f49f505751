//! The CPU arithmetic the model crates share: a matrix product for
//! constant weights packed once ([`packed`], with AVX-512, AVX2 and baseline
//! kernels picked at run time), convolutions on it ([`conv`], [`winograd`]),
//! group norms and activations ([`norm`]), branch-free elementwise
//! functions ([`math`]) and portable normal samples ([`random`]). With the
//! `candle` feature, [`backend`] says whether a model runs on these kernels
//! or on candle's device.
//!
//! A library, not a model: model crates depend on it rather than on each
//! other (`docs/architecture.md`).

#[cfg(feature = "candle")]
pub mod backend;
pub mod conv;
pub mod math;
pub mod norm;
pub mod packed;
pub mod random;
pub mod winograd;
