//! The DDIM sampler (deterministic: eta 0), with the numbers of diffusers'
//! `DDIMScheduler` as Stable Diffusion configures it: 1000 training steps,
//! betas on the "scaled linear" schedule from 0.00085 to 0.012, timesteps
//! offset by one when "leading", `set_alpha_to_one = false`.
//!
//! candle-transformers has a DDIM scheduler, but its "trailing" timesteps
//! are not diffusers': for a step count that does not divide 1000 (SD-Turbo
//! at 3 steps) it makes one step too many and ends at timestep 0.

use candle_core::{Result, Tensor};

/// Training steps of every Stable Diffusion model.
const TRAIN_STEPS: usize = 1000;
const BETA_START: f64 = 0.00085;
const BETA_END: f64 = 0.012;

/// Where the inference timesteps sit among the training ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spacing {
    /// `k × (1000 / n) + 1` for `k` from `n - 1` down to 0 (SD 1.5, SDXL).
    Leading,
    /// `round(1000 − k × 1000 / n) − 1` for `k` from 0 to `n - 1`, so the
    /// first step is at the last training timestep (SD-Turbo).
    Trailing,
}

/// A DDIM sampler for one image's run, for a UNet that predicts the noise
/// (SD 1.5, SD-Turbo, SDXL base; not SD 2.x's 768-pixel v-prediction).
pub struct Ddim {
    alphas_cumprod: Vec<f64>,
    timesteps: Vec<usize>,
    /// `1000 / n`, rounded down: how far back each step goes.
    stride: usize,
}

impl Ddim {
    /// The sampler for `steps` steps (at least 1, at most 1000).
    pub fn new(steps: usize, spacing: Spacing) -> Self {
        let steps = steps.clamp(1, TRAIN_STEPS);
        let (lo, hi) = (BETA_START.sqrt(), BETA_END.sqrt());
        let mut alphas_cumprod = Vec::with_capacity(TRAIN_STEPS);
        let mut product = 1.0;
        for i in 0..TRAIN_STEPS {
            let root = lo + (hi - lo) * i as f64 / (TRAIN_STEPS - 1) as f64;
            product *= 1.0 - root * root;
            alphas_cumprod.push(product);
        }
        let stride = TRAIN_STEPS / steps;
        let timesteps = match spacing {
            Spacing::Leading => (0..steps).rev().map(|k| k * stride + 1).collect(),
            Spacing::Trailing => {
                let ratio = TRAIN_STEPS as f64 / steps as f64;
                (0..steps)
                    .map(|k| ((TRAIN_STEPS as f64 - k as f64 * ratio).round() as usize).saturating_sub(1))
                    .collect()
            }
        };
        Self {
            alphas_cumprod,
            timesteps,
            stride,
        }
    }

    /// The timesteps to run, first to last.
    pub fn timesteps(&self) -> &[usize] {
        &self.timesteps
    }

    /// The latents after the step at `timestep`, given the noise the UNet
    /// predicted in `sample` at that timestep.
    pub fn step(&self, epsilon: &Tensor, timestep: usize, sample: &Tensor) -> Result<Tensor> {
        let t = timestep.min(TRAIN_STEPS - 1);
        let alpha = self.alphas_cumprod[t];
        // Past the first training step, diffusers (with `set_alpha_to_one =
        // false`) uses the first step's ᾱ.
        let alpha_prev = self.alphas_cumprod[t.saturating_sub(self.stride)];
        // The clean latents this prediction implies, moved back to the
        // previous timestep along the same noise.
        let original = ((sample - (epsilon * (1.0 - alpha).sqrt())?)? / alpha.sqrt())?;
        (original * alpha_prev.sqrt())? + (epsilon * (1.0 - alpha_prev).sqrt())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timesteps_are_diffusers() {
        // DDIMScheduler(steps_offset=1, timestep_spacing=...).set_timesteps(n).timesteps
        let leading = |n| Ddim::new(n, Spacing::Leading).timesteps;
        let trailing = |n| Ddim::new(n, Spacing::Trailing).timesteps;
        assert_eq!(leading(4), [751, 501, 251, 1]);
        assert_eq!(leading(3), [667, 334, 1]);
        assert_eq!(leading(1), [1]);
        assert_eq!(trailing(1), [999]);
        assert_eq!(trailing(2), [999, 499]);
        assert_eq!(trailing(3), [999, 666, 332]);
        assert_eq!(trailing(4), [999, 749, 499, 249]);
        assert_eq!(leading(30).len(), 30);
        assert_eq!(trailing(7).len(), 7);
    }

    #[test]
    fn the_schedule_is_stable_diffusions() {
        let ddim = Ddim::new(1, Spacing::Leading);
        // 1 - 0.00085, and the product of all 1000 (diffusers, in float32:
        // 0.9991499781608582 and 0.00466009508818388)
        assert!((ddim.alphas_cumprod[0] - 0.99915).abs() < 1e-12);
        assert!(
            (ddim.alphas_cumprod[999] - 0.004_660_095).abs() < 1e-7,
            "{}",
            ddim.alphas_cumprod[999]
        );
    }
}
