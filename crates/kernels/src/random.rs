//! Random numbers that are the same on every platform, for the generators'
//! noise.

/// Standard normal samples from a seed, the same on every platform:
/// SplitMix64 for uniform bits, Box-Muller for the normal pairs.
#[derive(Debug, Clone)]
pub struct Normal {
    state: u64,
    spare: Option<f32>,
}

impl Normal {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed,
            spare: None,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// The next standard normal sample.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> f32 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        self.spare = Some((r * theta.sin()) as f32);
        (r * theta.cos()) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_samples_are_standard_and_repeatable() {
        let mut a = Normal::new(42);
        let samples: Vec<f32> = (0..20_000).map(|_| a.next()).collect();
        let mean = samples.iter().sum::<f32>() / samples.len() as f32;
        let var = samples.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / samples.len() as f32;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        let mut b = Normal::new(42);
        assert_eq!(samples[..8], (0..8).map(|_| b.next()).collect::<Vec<_>>()[..]);
        let mut c = Normal::new(43);
        assert_ne!(samples[0], c.next());
    }
}
