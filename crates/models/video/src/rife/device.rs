//! IFNet on candle: the same blocks, scales and restart rule as the CPU
//! path of [`super`], as tensor operations on a candle device (a GPU in a
//! `cuda` build; candle's CPU device in the tests that hold this path to the
//! CPU kernels' frames).
//!
//! - the 3x3 convolutions are `conv2d` plus bias and PReLU
//!   (`relu(x) + alpha · min(x, 0)`), the block's last layer
//!   `conv_transpose2d`;
//! - a bilinear resize (`align_corners=False`, PyTorch's source index) is two
//!   products, with the interpolation weights built on the host from the
//!   same taps the CPU path uses;
//! - the backward warp (`grid_sample`, bilinear, border padding,
//!   `align_corners=True`) gathers the four neighbours of every pixel's
//!   source by index and blends them.

use candle_core::{D, DType, Device, Tensor};

use super::ops::{resized_len, taps};
use super::{LARGE_MOTION, RifeError, SCALES};

type Result<T> = candle_core::Result<T>;

/// A 3x3 convolution, padding 1, with bias and PReLU.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    stride: usize,
}

impl Conv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x
            .conv2d(&self.weight, 1, self.stride, 1, 1)?
            .broadcast_add(&self.bias)?;
        y.relu()? + y.minimum(0.0f32)?.broadcast_mul(&self.alpha)?
    }
}

/// One `IFBlock` on the device.
#[derive(Debug)]
struct Block {
    conv0: [Conv; 2],
    convblock: Vec<Conv>,
    last_weight: Tensor,
    last_bias: Tensor,
}

/// Host copy of one 3x3 convolution's weights.
pub(crate) struct ConvWeights {
    /// `cout × cin × 3 × 3`.
    pub(crate) weight: Vec<f32>,
    pub(crate) bias: Vec<f32>,
    /// PReLU's slope per output channel.
    pub(crate) alpha: Vec<f32>,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) stride: usize,
}

/// Host copies of one block's weights, as [`super::Rife::from_tensors`]
/// reads them.
pub(crate) struct BlockWeights {
    /// The ten 3x3 convolutions in order (`conv0.0`, `conv0.1`, `convblock.*`).
    pub(crate) convs: Vec<ConvWeights>,
    /// `lastconv`: `c × 5 × 4 × 4` and its 5 biases.
    pub(crate) last: (Vec<f32>, Vec<f32>, usize),
}

/// The network on one device.
#[derive(Debug)]
pub(crate) struct DeviceRife {
    device: Device,
    blocks: Vec<Block>,
}

fn channel(values: &[f32], device: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, (1, values.len(), 1, 1), device)
}

impl DeviceRife {
    pub(crate) fn new(weights: Vec<BlockWeights>, device: &Device) -> Result<Self> {
        let blocks = weights
            .into_iter()
            .map(|b| {
                let mut convs = b
                    .convs
                    .iter()
                    .map(|c| {
                        Ok(Conv {
                            weight: Tensor::from_slice(&c.weight, (c.cout, c.cin, 3, 3), device)?,
                            bias: channel(&c.bias, device)?,
                            alpha: channel(&c.alpha, device)?,
                            stride: c.stride,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let convblock = convs.split_off(2);
                let second = convs
                    .pop()
                    .ok_or_else(|| candle_core::Error::Msg("no conv0.1".into()))?;
                let first = convs
                    .pop()
                    .ok_or_else(|| candle_core::Error::Msg("no conv0.0".into()))?;
                let (w, bias, c) = &b.last;
                Ok(Block {
                    conv0: [first, second],
                    convblock,
                    last_weight: Tensor::from_slice(w, (*c, 5, 4, 4), device)?,
                    last_bias: channel(bias, device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            device: device.clone(),
            blocks,
        })
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// [`super::Rife::interpolate_traced`] on the device: `img0`, `img1`
    /// already padded to `h × w` (planar RGB).
    pub(crate) fn interpolate(
        &self,
        img0: &[f32],
        img1: &[f32],
        (h, w): (usize, usize),
        t: f32,
    ) -> std::result::Result<(Vec<f32>, bool), RifeError> {
        let run = || -> Result<(Vec<f32>, bool)> {
            let img0 = Tensor::from_slice(img0, (1, 3, h, w), &self.device)?;
            let img1 = Tensor::from_slice(img1, (1, 3, h, w), &self.device)?;
            let warp = Warp::new(h, w, &self.device)?;
            let (merged, doubled) = match self.forward(&img0, &img1, &warp, t, SCALES, true)? {
                Some(merged) => (merged, false),
                None => {
                    let doubled = SCALES.map(|s| s * 2.0);
                    let merged = self
                        .forward(&img0, &img1, &warp, t, doubled, false)?
                        .ok_or_else(|| candle_core::Error::Msg("the doubled pass restarted".into()))?;
                    (merged, true)
                }
            };
            Ok((merged.flatten_all()?.to_vec1::<f32>()?, doubled))
        };
        run().map_err(|e| RifeError(format!("RIFE failed on {:?}: {e}", self.device)))
    }

    /// `IFNet.forward` at `scales`: the blended frame (`1 × 3 × h × w`), or
    /// `None` when `restart` is set and the second block asks for doubled
    /// scales.
    fn forward(
        &self,
        img0: &Tensor,
        img1: &Tensor,
        warp: &Warp,
        t: f32,
        scales: [f32; 4],
        restart: bool,
    ) -> Result<Option<Tensor>> {
        let (h, w) = (warp.h, warp.w);
        let time = |hs: usize, ws: usize| Tensor::full(t, (1, 1, hs, ws), &self.device);
        let s = scales[0];
        let factor = 1.0 / f64::from(s);
        let (hs, ws) = (resized_len(h, factor), resized_len(w, factor));
        let x = Tensor::cat(
            &[&resize(img0, factor, 1.0)?, &resize(img1, factor, 1.0)?, &time(hs, ws)?],
            1,
        )?;
        let (mut flow, mut mask) = self.blocks[0].forward(&x, s, (h, w))?;
        let mut warped0 = warp.apply(img0, &flow.narrow(1, 0, 2)?)?;
        let mut warped1 = warp.apply(img1, &flow.narrow(1, 2, 2)?)?;
        for (i, block) in self.blocks.iter().enumerate().skip(1) {
            let s = scales[i];
            let factor = 1.0 / f64::from(s);
            let (hs, ws) = (resized_len(h, factor), resized_len(w, factor));
            let x = Tensor::cat(
                &[
                    &resize(&warped0, factor, 1.0)?,
                    &resize(&warped1, factor, 1.0)?,
                    &time(hs, ws)?,
                    &resize(&mask, factor, 1.0)?,
                    &resize(&flow, factor, 1.0 / s)?,
                ],
                1,
            )?;
            let (f0, m0) = block.forward(&x, s, (h, w))?;
            if i == 1 && restart {
                let largest = |f: Tensor| -> Result<f32> { f.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>() };
                if largest(f0.narrow(1, 0, 2)?)? > LARGE_MOTION && largest(f0.narrow(1, 2, 2)?)? > LARGE_MOTION {
                    return Ok(None);
                }
            }
            flow = (flow + f0)?;
            mask = (mask + m0)?;
            warped0 = warp.apply(img0, &flow.narrow(1, 0, 2)?)?;
            warped1 = warp.apply(img1, &flow.narrow(1, 2, 2)?)?;
        }
        // merged = warped0 · σ(mask) + warped1 · (1 − σ(mask))
        let alpha = (mask.neg()?.exp()? + 1.0)?.recip()?;
        let merged = (warped0.broadcast_mul(&alpha)? + warped1.broadcast_mul(&alpha.affine(-1.0, 1.0)?)?)?;
        Ok(Some(merged))
    }
}

impl Block {
    /// `IFBlock.forward` from its input already resized: the flow (`1 × 4 ×
    /// h × w`, times `2·scale`) and the mask (`1 × 1 × h × w`).
    fn forward(&self, x: &Tensor, scale: f32, (h, w): (usize, usize)) -> Result<(Tensor, Tensor)> {
        let feat = self.conv0[1].forward(&self.conv0[0].forward(x)?)?;
        let mut y = feat.clone();
        for conv in &self.convblock {
            y = conv.forward(&y)?;
        }
        let y = (y + feat)?;
        let out = y
            .conv_transpose2d(&self.last_weight, 1, 0, 2, 1)?
            .broadcast_add(&self.last_bias)?;
        let factor = f64::from(scale) * 2.0;
        let (_, _, h3, w3) = out.dims4()?;
        let (ho, wo) = (resized_len(h3, factor), resized_len(w3, factor));
        if (ho, wo) != (h, w) {
            candle_core::bail!("block output {ho}x{wo} does not match the frame {h}x{w}");
        }
        let flow = resize(&out.narrow(1, 0, 4)?, factor, scale * 2.0)?;
        let mask = resize(&out.narrow(1, 4, 1)?, factor, 1.0)?;
        Ok((flow, mask))
    }
}

/// The bilinear resize of [`super::ops::resize_onto`] on `1 × c × h × w`:
/// each value the blend of its two rows' blends of two columns, as products
/// with the interpolation weights, then times `multiplier`.
fn resize(x: &Tensor, scale_factor: f64, multiplier: f32) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    let (oh, ow) = (resized_len(h, scale_factor), resized_len(w, scale_factor));
    if oh == h && ow == w {
        return if multiplier == 1.0 {
            Ok(x.clone())
        } else {
            x.affine(f64::from(multiplier), 0.0)
        };
    }
    // `in_len × out_len`: column `o` holds output `o`'s two weights.
    let weights = |in_len: usize, out_len: usize| -> Result<Tensor> {
        let mut m = vec![0.0f32; in_len * out_len];
        for (o, tap) in taps(in_len, out_len, scale_factor).iter().enumerate() {
            m[tap.i0 * out_len + o] += 1.0 - tap.lambda;
            m[tap.i1 * out_len + o] += tap.lambda;
        }
        Tensor::from_vec(m, (in_len, out_len), x.device())
    };
    let c = x.dim(1)?;
    // The columns first, then the rows, as the CPU path blends them; each a
    // plain product of contiguous matrices.
    let y = x.contiguous()?.reshape((c * h, w))?.matmul(&weights(w, ow)?)?;
    let y = y
        .reshape((c, h, ow))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((c * ow, h))?;
    let y = y.matmul(&weights(h, oh)?)?;
    let y = y
        .reshape((c, ow, oh))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((1, c, oh, ow))?;
    if multiplier == 1.0 {
        Ok(y)
    } else {
        y.affine(f64::from(multiplier), 0.0)
    }
}

/// The backward warp's pixel grid for one frame size.
struct Warp {
    h: usize,
    w: usize,
    /// Each pixel's column and row, `1 × 1 × h × w`.
    xs: Tensor,
    ys: Tensor,
}

impl Warp {
    fn new(h: usize, w: usize, device: &Device) -> Result<Self> {
        let xs = Tensor::arange(0u32, w as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((1, 1, 1, w))?
            .broadcast_as((1, 1, h, w))?
            .contiguous()?;
        let ys = Tensor::arange(0u32, h as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((1, 1, h, 1))?
            .broadcast_as((1, 1, h, w))?
            .contiguous()?;
        Ok(Self { h, w, xs, ys })
    }

    /// `img` (`1 × c × h × w`) sampled at each pixel plus `flow` (`1 × 2 ×
    /// h × w`: x then y, in pixels), coordinates clamped to the image; the
    /// top-left neighbour kept one short of the last row and column, where
    /// the far neighbours then weigh 1 (the CPU path's rule).
    fn apply(&self, img: &Tensor, flow: &Tensor) -> Result<Tensor> {
        let (h, w) = (self.h, self.w);
        let (_, c, _, _) = img.dims4()?;
        let sx = (&self.xs + flow.narrow(1, 0, 1)?)?.clamp(0.0f32, (w - 1) as f32)?;
        let sy = (&self.ys + flow.narrow(1, 1, 1)?)?.clamp(0.0f32, (h - 1) as f32)?;
        let x0 = sx.floor()?.minimum(w.saturating_sub(2) as f32)?;
        let y0 = sy.floor()?.minimum(h.saturating_sub(2) as f32)?;
        let (ax, ay) = ((sx - &x0)?, (sy - &y0)?);
        let (dx, dy) = (f64::from(u8::from(w > 1)), if h > 1 { w as f64 } else { 0.0 });
        let top_left = (y0.affine(w as f64, 0.0)? + x0)?;
        let flat = img.flatten_from(2)?.contiguous()?;
        let pick = |offset: f64| -> Result<Tensor> {
            let index = top_left
                .affine(1.0, offset)?
                .to_dtype(DType::U32)?
                .flatten_from(2)?
                .broadcast_as((1, c, h * w))?
                .contiguous()?;
            flat.gather(&index, D::Minus1)?.reshape((1, c, h, w))
        };
        let (bx, by) = (ax.affine(-1.0, 1.0)?, ay.affine(-1.0, 1.0)?);
        let nw = pick(0.0)?.broadcast_mul(&(&bx * &by)?)?;
        let ne = pick(dx)?.broadcast_mul(&(&ax * &by)?)?;
        let sw = pick(dy)?.broadcast_mul(&(&bx * &ay)?)?;
        let se = pick(dx + dy)?.broadcast_mul(&(&ax * &ay)?)?;
        (nw + ne)? + (sw + se)?
    }
}
