//! `terrain-128`: a one-step consistency model (a UNet distilled from a
//! diffusion model) that turns noise at the largest noise level into a
//! 128x128 heightfield, conditioned on a difficulty from 1 to 100. The graph
//! is ONNX and runs on ONNX Runtime ([`gantry_onnx`]).
//!
//! The model works in a normalised space: heights `h` in metres (0 to
//! `height_range`) map to `2·asinh(h/s)/asinh(range/s) − 1` with `s` =
//! `asinh_scale`, so [-1, 1]. A sample is the graph's denoising of pure
//! noise scaled by `sigma`, mapped back to metres, clipped to the range and
//! shifted so that its lowest point is 0.

use std::path::Path;
use std::sync::Mutex;

use gantry_onnx::{Session, Tensor};
use serde_json::Value;

use crate::LoadError;

/// Side of the heightfields the graph produces.
pub const SIDE: usize = 128;

/// How a manifest entry describes the model (its `engine` table).
#[derive(Debug, Clone, PartialEq)]
pub struct TerrainSpec {
    /// Noise level the one step starts from.
    pub sigma: f32,
    /// Difficulty levels (1 to `levels`).
    pub levels: u32,
    /// Heights span 0 to this many metres.
    pub height_range: f32,
    /// Scale of the asinh companding of heights.
    pub asinh_scale: f32,
}

impl TerrainSpec {
    pub fn from_engine(engine: &serde_json::Map<String, Value>) -> Result<Self, String> {
        let number = |name: &str| -> Result<f64, String> {
            engine
                .get(name)
                .and_then(Value::as_f64)
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("engine.{name} must be a positive number"))
        };
        let levels = number("levels")?;
        if levels.fract() != 0.0 || levels < 2.0 {
            return Err("engine.levels must be an integer of at least 2".into());
        }
        Ok(Self {
            sigma: number("sigma")? as f32,
            levels: levels as u32,
            height_range: number("height_range")? as f32,
            asinh_scale: number("asinh_scale")? as f32,
        })
    }

    /// Metres of a value of the model's normalised space.
    #[cfg(test)]
    fn height_of(&self, value: f32) -> f32 {
        self.metres()(value)
    }

    /// The map from the model's normalised space to metres (its constant
    /// computed once, not per pixel).
    fn metres(&self) -> impl Fn(f32) -> f32 + use<> {
        let (scale, range) = (self.asinh_scale, self.height_range);
        let top = (range / scale).asinh();
        move |value| {
            let unit = ((value + 1.0) * 0.5).clamp(0.0, 1.0);
            (scale * (unit * top).sinh()).clamp(0.0, range)
        }
    }
}

/// The loaded graph.
pub struct Terrain {
    spec: TerrainSpec,
    session: Mutex<Session>,
    device: gantry_onnx::Device,
}

impl Terrain {
    /// Loads `graph` on ONNX Runtime from `runtime_library`, with `threads`
    /// intra-op threads (0: one per core), on `device`.
    pub fn load(
        runtime_library: &Path,
        graph: &Path,
        threads: usize,
        device: gantry_onnx::Device,
        spec: TerrainSpec,
    ) -> Result<Self, LoadError> {
        gantry_onnx::init(runtime_library).map_err(|e| LoadError::new(e.to_string()))?;
        let session = gantry_onnx::session_on(graph, threads, device).map_err(|e| LoadError::new(e.to_string()))?;
        Ok(Self {
            spec,
            session: Mutex::new(session),
            device,
        })
    }

    /// Where the graph runs.
    pub fn device(&self) -> gantry_onnx::Device {
        self.device
    }

    pub fn spec(&self) -> &TerrainSpec {
        &self.spec
    }

    /// Heightfields (metres, `SIDE × SIDE` each, row-major) from unit-variance
    /// `noise` (`difficulties.len() × SIDE × SIDE`).
    pub fn generate(&self, noise: &[f32], difficulties: &[u32]) -> Result<Vec<Vec<f32>>, String> {
        let n = difficulties.len();
        let plane = SIDE * SIDE;
        if noise.len() != n * plane {
            return Err("noise has the wrong size".into());
        }
        let spec = &self.spec;
        let noisy: Vec<f32> = noise.iter().map(|v| v * spec.sigma).collect();
        let labels: Vec<f32> = difficulties
            .iter()
            .map(|d| (d.saturating_sub(1)) as f32 / (spec.levels - 1) as f32)
            .collect();
        let failed = |e: gantry_onnx::ort::Error| format!("the terrain graph failed: {e}");
        let noisy = Tensor::from_array(([n, 1, SIDE, SIDE], noisy)).map_err(failed)?;
        let sigmas = Tensor::from_array(([n], vec![spec.sigma; n])).map_err(failed)?;
        let labels = Tensor::from_array(([n], labels)).map_err(failed)?;
        let mut session = self.session.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let outputs = session
            .run(gantry_onnx::ort::inputs![
                "noisy" => noisy,
                "sigma" => sigmas,
                "difficulty" => labels,
            ])
            .map_err(failed)?;
        let (_, denoised) = outputs["denoised"].try_extract_tensor::<f32>().map_err(failed)?;
        if denoised.len() != n * plane {
            return Err(format!(
                "the terrain graph returned {} values, not {}",
                denoised.len(),
                n * plane
            ));
        }
        let metres = spec.metres();
        Ok(denoised
            .chunks_exact(plane)
            .map(|values| {
                let mut heights: Vec<f32> = values.iter().map(|v| metres(*v)).collect();
                let floor = heights.iter().copied().fold(f32::INFINITY, f32::min);
                heights.iter_mut().for_each(|h| *h -= floor);
                heights
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heights_follow_the_asinh_companding() {
        let spec = TerrainSpec {
            sigma: 80.0,
            levels: 100,
            height_range: 22.168_64,
            asinh_scale: 0.1,
        };
        assert_eq!(spec.height_of(-1.0), 0.0);
        assert!((spec.height_of(1.0) - 22.168_64).abs() < 1e-3);
        assert_eq!(spec.height_of(5.0), spec.height_of(1.0));
        // The middle of the normalised space is far below half the range: companding.
        let mid = spec.height_of(0.0);
        assert!(mid > 0.0 && mid < 2.0, "{mid}");
    }
}
