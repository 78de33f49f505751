//! Where a model's arithmetic runs, for the model crates that have both
//! paths: these kernels on the CPU, or candle on a device (a CUDA GPU in a
//! binary built with candle's `cuda` feature). One model definition either
//! way; the backend only decides where the arithmetic happens.

pub use candle_core::Device;

/// What runs a model's layers.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// This crate's kernels, on the CPU: the fastest CPU path.
    #[default]
    Kernels,
    /// candle's operations on its device: a CUDA device in a binary built
    /// with the `cuda` feature, or candle's CPU device.
    Candle(Device),
}

/// A backend that cannot be had (no such CUDA device, or no CUDA support in
/// this binary), or a name that is none.
#[derive(Debug)]
pub struct BackendError(String);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackendError {}

/// How logs and benchmarks name what runs a model: `kernels` (no device),
/// or `candle` and its device (`candle Cpu`, `candle Cuda(…)`).
pub fn name(device: Option<&Device>) -> String {
    match device {
        None => "kernels".to_owned(),
        Some(device) => format!("candle {device:?}"),
    }
}

impl Backend {
    /// The backend for a `cuda_device` setting: unset is the kernels on the
    /// CPU; a CUDA ordinal is candle on that GPU, and an error where this
    /// binary has no CUDA support or the machine has no such device.
    pub fn for_cuda_device(cuda_device: Option<usize>) -> Result<Self, BackendError> {
        match cuda_device {
            None => Ok(Self::Kernels),
            Some(ordinal) => Device::new_cuda(ordinal)
                .map(Self::Candle)
                .map_err(|e| BackendError(format!("no CUDA device {ordinal}: {e}"))),
        }
    }

    /// The backend a benchmark names: `kernels`, `candle` (candle's CPU
    /// device) or `cuda:N`.
    pub fn from_name(name: &str) -> Result<Self, BackendError> {
        match name {
            "kernels" => Ok(Self::Kernels),
            "candle" => Ok(Self::Candle(Device::Cpu)),
            other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(ordinal) => Self::for_cuda_device(Some(ordinal)),
                None => Err(BackendError(format!(
                    "a backend is kernels, candle or cuda:N, not {other}"
                ))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Backend, Device, name};

    #[test]
    fn a_cuda_device_this_build_cannot_reach_is_an_error_and_names_are_parsed() {
        assert!(matches!(Backend::for_cuda_device(None), Ok(Backend::Kernels)));
        // Without the `cuda` feature (CI's build) candle has no CUDA device
        // at all; with it, ordinal 4096 exists on no machine.
        let err = Backend::for_cuda_device(Some(4096)).unwrap_err().to_string();
        assert!(err.starts_with("no CUDA device 4096: "), "{err}");
        assert!(matches!(Backend::from_name("kernels"), Ok(Backend::Kernels)));
        assert!(matches!(Backend::from_name("candle"), Ok(Backend::Candle(Device::Cpu))));
        let err = Backend::from_name("cuda:4096").unwrap_err().to_string();
        assert!(err.starts_with("no CUDA device 4096: "), "{err}");
        let err = Backend::from_name("gpu").unwrap_err().to_string();
        assert_eq!(err, "a backend is kernels, candle or cuda:N, not gpu");
        assert_eq!(name(None), "kernels");
        assert_eq!(name(Some(&Device::Cpu)), "candle Cpu");
    }
}
