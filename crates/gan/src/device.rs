//! The generator's layers on candle: each one `conv_transpose2d` with its
//! folded bias and activation, on whatever device candle was given. A
//! `cuda` build puts them on a GPU; candle's CPU device runs the very same
//! graph, which is how the tests hold this path to the kernels' output and
//! to onnxruntime's on a machine without a GPU.
//!
//! On the CPU the crate's own kernels stay the default: candle's CPU
//! transposed convolution is far slower on these layers (the figures are in
//! `docs/benchmarks.md`, "Image models").

use candle_core::{Device, Tensor};

use crate::{Activation, Layer};

/// A layer as tensors on the device.
#[derive(Debug)]
struct DeviceLayer {
    /// `cin × cout × k × k`, batch norm folded in.
    weight: Tensor,
    /// `1 × cout × 1 × 1`.
    bias: Tensor,
    stride: usize,
    pad: usize,
    activation: Activation,
}

/// The whole generator on one device.
#[derive(Debug)]
pub(crate) struct Net {
    device: Device,
    layers: Vec<DeviceLayer>,
}

impl Net {
    /// Copies the folded weights of `layers` to `device`.
    pub(crate) fn new(layers: &[Layer], device: &Device) -> candle_core::Result<Self> {
        let layers = layers
            .iter()
            .map(|l| {
                Ok(DeviceLayer {
                    weight: Tensor::from_slice(&l.weight, (l.cin, l.cout, l.k, l.k), device)?,
                    bias: Tensor::from_slice(&l.bias, (1, l.cout, 1, 1), device)?,
                    stride: l.stride,
                    pad: l.pad,
                    activation: l.activation,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            device: device.clone(),
            layers,
        })
    }

    /// The device the layers are on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Runs `n` input vectors of `width` values and returns the output
    /// channel-major (`channels × n × side × side`), as the kernels do.
    pub(crate) fn forward(&self, inputs: &[f32], n: usize, width: usize) -> candle_core::Result<Vec<f32>> {
        let mut x = Tensor::from_slice(inputs, (n, width, 1, 1), &self.device)?;
        for layer in &self.layers {
            x = x
                .conv_transpose2d(&layer.weight, layer.pad, 0, layer.stride, 1)?
                .broadcast_add(&layer.bias)?;
            x = match layer.activation {
                Activation::Relu => x.relu()?,
                Activation::Tanh => x.tanh()?,
            };
        }
        x.transpose(0, 1)?.contiguous()?.flatten_all()?.to_vec1::<f32>()
    }
}
