//! RIFE HDv3 frame interpolation (the IFNet of vsrife 2.0.0,
//! `IFNet_HDv3.py`), in plain Rust.
//!
//! The path reproduced is vsrife's `Model.inference(img0, img1, t,
//! scale=1.0)`: `IFNet.forward` with `scale_list=[8, 4, 2, 1]`,
//! `fastmode=True`, `ensemble=False`, in inference mode. Only `block0` ..
//! `block3` take part (the context net and U-Net of the slow mode do not).
//! Each block sees the two frames (the later blocks: warped by the flow so
//! far), a constant channel holding `t`, the blend mask and the flow so far,
//! all resized to `1/scale`; it returns a correction to the two flows (frame
//! 0 and frame 1 towards time `t`) and to the mask, at full resolution. The
//! output is the two frames warped by the final flows, blended by the
//! sigmoid of the mask.
//!
//! When the second block's flow correction exceeds 32 pixels in magnitude
//! for both frames, the pass restarts with every scale doubled (`[16, 8, 4,
//! 2]`), so that a large motion is estimated at a coarser resolution: PyTorch
//! recomputes blocks 0 and 1 at the doubled scales and goes on, which is the
//! same computation.
//!
//! Frames are padded with zeros on the right and bottom to a multiple of 128
//! (as vsrife's `F.pad`) and the result cropped back, so any size is taken.
//!
//! Nearly all the work is the 3x3 convolutions (2.6 G multiply-adds for a
//! 256x256 frame), which `ops` computes as products with weights packed
//! once at load ([`gantry_kernels::packed`]), the input taps gathered
//! straight into the product's packed layout. One 256x256 frame takes about
//! 65 ms on one core with AVX2 (onnxruntime on one thread: about 86 ms). The
//! buffers of a call are kept by the model for the next one (up to a size),
//! so a frame allocates nothing large. `bench/video/reference.py` checks the
//! output against onnxruntime running the same network.
//!
//! With [`Backend::Candle`] the same network runs on candle instead
//! ([`device`]): on a GPU with `video.cuda_device`.

mod device;
mod ops;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use gantry_manifest::torch::{self, Tensor};

use gantry_gan::Backend;
use gantry_kernels::conv::Conv2d;
use ops::{Deconv4, Scratch, conv3, resize_onto, resized_len, warp_into};

/// Frames are padded to a multiple of this (vsrife's `max(128, 128/scale)`
/// at scale 1).
const PAD_TO: usize = 128;

/// The scales of the four blocks (`scale_list`).
const SCALES: [f32; 4] = [8.0, 4.0, 2.0, 1.0];

/// Flow magnitude (pixels) of the second block's correction over which the
/// pass restarts at doubled scales.
const LARGE_MOTION: f32 = 32.0;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RifeError(pub String);

fn err(message: impl Into<String>) -> RifeError {
    RifeError(message.into())
}

/// One `IFBlock`: two stride-2 convolutions (to a quarter of the input's
/// side), eight more with a residual connection around them, and a
/// transposed convolution to half the input's side, whose five channels
/// (four of flow, one of mask) are then resized to the frame's.
#[derive(Debug)]
struct IfBlock {
    conv0: [Conv2d; 2],
    convblock: Vec<Conv2d>,
    lastconv: Deconv4,
}

/// The loaded IFNet (`block0` .. `block3`).
#[derive(Debug)]
pub struct Rife {
    /// The blocks on the CPU kernels; empty when the network is on candle.
    blocks: Vec<IfBlock>,
    /// The network on candle's device, with [`Backend::Candle`].
    device: Option<device::DeviceRife>,
    /// Workspaces of finished calls, for the next ones.
    pool: Mutex<Vec<Workspace>>,
}

/// Workspaces kept for reuse, at most (one per thread interpolating at once
/// is what the calls need).
const POOL_LEN: usize = 8;

/// The largest workspace kept for reuse, in floats (128 MiB; a frame takes
/// about 68 floats per padded pixel, 70 MiB at 512x512, so frames up to
/// about 640x640; larger ones allocate afresh each call).
const POOL_FLOATS: usize = 32 << 20;

/// The buffers of one interpolation, kept by the model between calls: a
/// frame then allocates nothing large, and the memory it works in is already
/// mapped and in cache.
#[derive(Debug, Default)]
struct Workspace {
    img0: Vec<f32>,
    img1: Vec<f32>,
    /// A block's input.
    x: Vec<f32>,
    /// The flow and mask so far, and a block's corrections to them.
    flow: Vec<f32>,
    mask: Vec<f32>,
    f0: Vec<f32>,
    m0: Vec<f32>,
    /// The frames warped by the flow; the first ends as the output.
    warped0: Vec<f32>,
    warped1: Vec<f32>,
    block: BlockBuffers,
}

/// The buffers inside a block.
#[derive(Debug, Default)]
struct BlockBuffers {
    scratch: Scratch,
    a: Vec<f32>,
    b: Vec<f32>,
    feat: Vec<f32>,
    tmp: Vec<f32>,
}

impl Workspace {
    fn floats(&self) -> usize {
        let b = &self.block;
        [
            &self.img0,
            &self.img1,
            &self.x,
            &self.flow,
            &self.mask,
            &self.f0,
            &self.m0,
            &self.warped0,
            &self.warped1,
            &b.a,
            &b.b,
            &b.feat,
            &b.tmp,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum::<usize>()
            + b.scratch.floats()
    }
}

/// A frame pair at padded size, with the time, as the blocks see it.
struct Frames<'a> {
    img0: &'a [f32],
    img1: &'a [f32],
    h: usize,
    w: usize,
    t: f32,
}

impl Rife {
    /// Builds the network from its tensors (`block{i}.conv0.{j}.0.weight`
    /// ...), names optionally prefixed with `module.` as the published
    /// checkpoint has them. Tensors of other modules are ignored.
    pub fn from_tensors(tensors: &BTreeMap<String, Tensor>) -> Result<Rife, RifeError> {
        Self::from_tensors_on(tensors, &Backend::Kernels)
    }

    /// [`Rife::from_tensors`], the network on `backend`.
    pub fn from_tensors_on(tensors: &BTreeMap<String, Tensor>, backend: &Backend) -> Result<Rife, RifeError> {
        let find =
            |name: &str| -> Option<&Tensor> { tensors.get(name).or_else(|| tensors.get(&format!("module.{name}"))) };
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>, RifeError> {
            let tensor = find(name).ok_or_else(|| err(format!("the weights have no tensor {name}")))?;
            if tensor.shape != shape {
                return Err(err(format!("{name} has shape {:?}, expected {shape:?}", tensor.shape)));
            }
            tensor
                .to_f32()
                .ok_or_else(|| err(format!("{name} is not a floating-point tensor")))
        };
        let conv = |name: &str, cin: usize, cout: usize, stride: usize| {
            Ok(device::ConvWeights {
                weight: get(&format!("{name}.0.weight"), &[cout, cin, 3, 3])?,
                bias: get(&format!("{name}.0.bias"), &[cout])?,
                alpha: get(&format!("{name}.1.weight"), &[cout])?,
                cin,
                cout,
                stride,
            })
        };
        let block = |i: usize, cin: usize, c: usize| -> Result<device::BlockWeights, RifeError> {
            let prefix = format!("block{i}");
            let mut convs = vec![
                conv(&format!("{prefix}.conv0.0"), cin, c / 2, 2)?,
                conv(&format!("{prefix}.conv0.1"), c / 2, c, 2)?,
            ];
            for j in 0..8 {
                convs.push(conv(&format!("{prefix}.convblock.{j}"), c, c, 1)?);
            }
            let last = (
                get(&format!("{prefix}.lastconv.weight"), &[c, 5, 4, 4])?,
                get(&format!("{prefix}.lastconv.bias"), &[5])?,
                c,
            );
            Ok(device::BlockWeights { convs, last })
        };
        let weights = vec![
            block(0, 7, 192)?,
            block(1, 12, 128)?,
            block(2, 12, 96)?,
            block(3, 12, 64)?,
        ];
        let (blocks, device) = match backend {
            Backend::Kernels => (weights.into_iter().map(IfBlock::new).collect(), None),
            Backend::Candle(on) => (
                Vec::new(),
                Some(device::DeviceRife::new(weights, on).map_err(|e| err(format!("cannot put RIFE on {on:?}: {e}")))?),
            ),
        };
        Ok(Rife {
            blocks,
            device,
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Where the network runs: `"kernels"` or candle's device.
    pub fn backend_name(&self) -> String {
        gantry_kernels::backend::name(self.device.as_ref().map(device::DeviceRife::device))
    }

    /// Loads `flownet.safetensors` (as the platform converts it) or the
    /// published PyTorch checkpoint (`flownet.pkl`).
    pub fn load(path: &Path) -> Result<Rife, RifeError> {
        Self::load_on(path, &Backend::Kernels)
    }

    /// [`Rife::load`], the network on `backend`.
    pub fn load_on(path: &Path, backend: &Backend) -> Result<Rife, RifeError> {
        let tensors = match torch::read_safetensors(path) {
            Ok(tensors) => tensors,
            Err(safetensors) => torch::load(path).map_err(|pytorch| {
                err(format!(
                    "{} is neither safetensors ({safetensors}) nor a PyTorch checkpoint ({pytorch})",
                    path.display()
                ))
            })?,
        };
        Self::from_tensors_on(&tensors, backend)
    }

    /// The frame at time `t` (0 < t < 1) between `img0` and `img1`, each
    /// planar RGB in [0, 1] (`3 × height × width`); the result has the same
    /// layout, values clamped to [0, 1].
    pub fn interpolate(
        &self,
        img0: &[f32],
        img1: &[f32],
        width: usize,
        height: usize,
        t: f32,
    ) -> Result<Vec<f32>, RifeError> {
        self.interpolate_traced(img0, img1, width, height, t)
            .map(|(frame, _)| frame)
    }

    /// [`Rife::interpolate`], also saying whether the pass restarted at
    /// doubled scales for a large motion.
    #[doc(hidden)]
    pub fn interpolate_traced(
        &self,
        img0: &[f32],
        img1: &[f32],
        width: usize,
        height: usize,
        t: f32,
    ) -> Result<(Vec<f32>, bool), RifeError> {
        let plane = width * height;
        assert_eq!(img0.len(), 3 * plane, "img0 is not 3 × {height} × {width}");
        assert_eq!(img1.len(), 3 * plane, "img1 is not 3 × {height} × {width}");
        if plane == 0 {
            return Ok((Vec::new(), false));
        }
        let (h, w) = (height.div_ceil(PAD_TO) * PAD_TO, width.div_ceil(PAD_TO) * PAD_TO);
        let mut ws = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        let pad = |img: &[f32], out: &mut Vec<f32>| {
            out.clear();
            out.resize(3 * h * w, 0.0);
            for c in 0..3 {
                for y in 0..height {
                    out[(c * h + y) * w..][..width].copy_from_slice(&img[(c * height + y) * width..][..width]);
                }
            }
        };
        let (mut p0, mut p1) = (std::mem::take(&mut ws.img0), std::mem::take(&mut ws.img1));
        pad(img0, &mut p0);
        pad(img1, &mut p1);
        if let Some(on) = &self.device {
            let interpolated = on.interpolate(&p0, &p1, (h, w), t);
            (ws.img0, ws.img1) = (p0, p1);
            self.keep(ws);
            let (merged, doubled) = interpolated?;
            return Ok((crop(&merged, (h, w), (height, width)), doubled));
        }
        let frames = Frames {
            img0: &p0,
            img1: &p1,
            h,
            w,
            t,
        };
        let doubled = !self.forward(&frames, SCALES, true, &mut ws);
        if doubled {
            let finished = self.forward(&frames, SCALES.map(|s| s * 2.0), false, &mut ws);
            assert!(finished, "the doubled pass does not restart");
        }
        let out = crop(&ws.warped0, (h, w), (height, width));
        (ws.img0, ws.img1) = (p0, p1);
        self.keep(ws);
        Ok((out, doubled))
    }

    /// Keeps a finished call's workspace for the next, within bounds.
    fn keep(&self, ws: Workspace) {
        if ws.floats() <= POOL_FLOATS {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.len() < POOL_LEN {
                pool.push(ws);
            }
        }
    }

    /// `IFNet.forward` at the given scales, leaving the blended frame in
    /// `ws.warped0`; `false` (and no frame) when `restart` is set and the
    /// second block asks for doubled scales.
    fn forward(&self, f: &Frames<'_>, scales: [f32; 4], restart: bool, ws: &mut Workspace) -> bool {
        let (h, w) = (f.h, f.w);
        let plane = h * w;
        let Workspace {
            x,
            flow,
            mask,
            f0,
            m0,
            warped0,
            warped1,
            block: buffers,
            ..
        } = ws;
        // Block 0: the two frames and the time.
        let s = scales[0];
        let factor = 1.0 / f64::from(s);
        let (hs, ws) = (resized_len(h, factor), resized_len(w, factor));
        x.clear();
        resize_onto(f.img0, 3, h, w, factor, 1.0, x);
        resize_onto(f.img1, 3, h, w, factor, 1.0, x);
        x.resize(7 * hs * ws, f.t);
        self.blocks[0].forward(x, (hs, ws), s, (h, w), buffers, flow, mask);
        warp_into(f.img0, 3, &flow[..plane], &flow[plane..2 * plane], h, w, warped0);
        warp_into(
            f.img1,
            3,
            &flow[2 * plane..3 * plane],
            &flow[3 * plane..],
            h,
            w,
            warped1,
        );
        for (i, block) in self.blocks.iter().enumerate().skip(1) {
            let s = scales[i];
            let factor = 1.0 / f64::from(s);
            let (hs, ws) = (resized_len(h, factor), resized_len(w, factor));
            let small = hs * ws;
            x.clear();
            resize_onto(warped0, 3, h, w, factor, 1.0, x);
            resize_onto(warped1, 3, h, w, factor, 1.0, x);
            x.resize(7 * small, f.t);
            resize_onto(mask, 1, h, w, factor, 1.0, x);
            resize_onto(flow, 4, h, w, factor, 1.0 / s, x);
            block.forward(x, (hs, ws), s, (h, w), buffers, f0, m0);
            if i == 1 && restart {
                let max = |v: &[f32]| v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                if max(&f0[..2 * plane]) > LARGE_MOTION && max(&f0[2 * plane..]) > LARGE_MOTION {
                    return false;
                }
            }
            flow.iter_mut().zip(f0.iter()).for_each(|(a, b)| *a += b);
            mask.iter_mut().zip(m0.iter()).for_each(|(a, b)| *a += b);
            warp_into(f.img0, 3, &flow[..plane], &flow[plane..2 * plane], h, w, warped0);
            warp_into(
                f.img1,
                3,
                &flow[2 * plane..3 * plane],
                &flow[3 * plane..],
                h,
                w,
                warped1,
            );
        }
        // merged = warped0 · σ(mask) + warped1 · (1 − σ(mask))
        for (c, merged) in warped0.chunks_exact_mut(plane).enumerate() {
            let other = &warped1[c * plane..][..plane];
            for ((m, o), logit) in merged.iter_mut().zip(other).zip(mask.iter()) {
                let a = 1.0 / (1.0 + (-logit).exp());
                *m = *m * a + o * (1.0 - a);
            }
        }
        true
    }
}

/// The frame `merged` (planar RGB at the padded `h × w`) cropped to
/// `height × width`, values clamped to [0, 1].
fn crop(merged: &[f32], (h, w): (usize, usize), (height, width): (usize, usize)) -> Vec<f32> {
    let mut out = vec![0.0f32; 3 * height * width];
    for c in 0..3 {
        for y in 0..height {
            let src = &merged[(c * h + y) * w..][..width];
            let dst = &mut out[(c * height + y) * width..][..width];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.clamp(0.0, 1.0);
            }
        }
    }
    out
}

impl IfBlock {
    /// The block on the CPU kernels, its weights packed.
    fn new(weights: device::BlockWeights) -> Self {
        let mut convs = weights
            .convs
            .into_iter()
            .map(|c| conv3(&c.weight, c.cin, c.cout, c.stride, c.bias, c.alpha));
        let mut next = || {
            convs
                .next()
                .unwrap_or_else(|| unreachable!("ten convolutions per block"))
        };
        let conv0 = [next(), next()];
        let convblock = convs.collect();
        let (weight, bias, c) = weights.last;
        IfBlock {
            conv0,
            convblock,
            lastconv: Deconv4::new(&weight, c, 5, bias),
        }
    }

    /// `IFBlock.forward` from its input already resized (`x`: `cin × hs ×
    /// ws`, the flow already divided by the scale); returns the flow (`4 ×
    /// h × w`, times `2·scale`) and the mask (`h × w`) at full resolution.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &[f32],
        (hs, ws): (usize, usize),
        scale: f32,
        (h, w): (usize, usize),
        buffers: &mut BlockBuffers,
        flow: &mut Vec<f32>,
        mask: &mut Vec<f32>,
    ) {
        let BlockBuffers {
            scratch,
            a,
            b,
            feat,
            tmp,
        } = buffers;
        self.conv0[0].forward_into(x, hs, ws, a, &mut scratch.conv);
        let (h1, w1) = (self.conv0[0].out_len(hs), self.conv0[0].out_len(ws));
        self.conv0[1].forward_into(a, h1, w1, feat, &mut scratch.conv);
        let (h2, w2) = (self.conv0[1].out_len(h1), self.conv0[1].out_len(w1));
        // The residual convolutions back and forth between two buffers.
        self.convblock[0].forward_into(feat, h2, w2, a, &mut scratch.conv);
        for conv in &self.convblock[1..] {
            conv.forward_into(a, h2, w2, b, &mut scratch.conv);
            std::mem::swap(a, b);
        }
        a.iter_mut().zip(feat.iter()).for_each(|(a, b)| *a += b);
        self.lastconv.forward_into(a, h2, w2, tmp, scratch);
        let (h3, w3) = (2 * h2, 2 * w2);
        let factor = f64::from(scale) * 2.0;
        let (ho, wo) = (resized_len(h3, factor), resized_len(w3, factor));
        assert!(
            ho == h && wo == w,
            "block output {ho}x{wo} does not match the frame {h}x{w}"
        );
        let plane3 = h3 * w3;
        flow.clear();
        resize_onto(&tmp[..4 * plane3], 4, h3, w3, factor, scale * 2.0, flow);
        mask.clear();
        resize_onto(&tmp[4 * plane3..], 1, h3, w3, factor, 1.0, mask);
    }
}

#[cfg(test)]
mod tests {
    use super::ops::warp;
    use super::*;
    use gantry_manifest::torch::DType;

    /// A network of the right shapes with small deterministic weights; the
    /// transposed convolutions that end the blocks have zero weights and the
    /// given biases when `biases` is set, so each block's flow and mask are
    /// constants that the tests can follow by hand.
    fn synthetic(biases: Option<[[f32; 5]; 4]>) -> BTreeMap<String, Tensor> {
        let mut tensors = BTreeMap::new();
        let mut seed = 0usize;
        let mut add = |name: String, shape: &[usize], values: &dyn Fn(usize, usize) -> f32| {
            seed += 1;
            let numel: usize = shape.iter().product();
            let data = (0..numel).flat_map(|i| values(i, seed).to_le_bytes()).collect();
            tensors.insert(
                format!("module.{name}"),
                Tensor {
                    dtype: DType::F32,
                    shape: shape.to_vec(),
                    data,
                },
            );
        };
        let pseudo = |scale: f32| {
            move |i: usize, seed: usize| (((i + seed * 104_729) * 7919 % 2003) as f32 / 2003.0 - 0.5) * scale
        };
        for (i, cin, c) in [(0, 7, 192), (1, 12, 128), (2, 12, 96), (3, 12, 64)] {
            let mut conv = |name: String, ci: usize, co: usize| {
                let fan = (ci * 9) as f32;
                add(format!("{name}.0.weight"), &[co, ci, 3, 3], &pseudo(2.0 / fan.sqrt()));
                add(format!("{name}.0.bias"), &[co], &pseudo(0.1));
                add(format!("{name}.1.weight"), &[co], &pseudo(0.5));
            };
            conv(format!("block{i}.conv0.0"), cin, c / 2);
            conv(format!("block{i}.conv0.1"), c / 2, c);
            for j in 0..8 {
                conv(format!("block{i}.convblock.{j}"), c, c);
            }
            match biases {
                Some(biases) => {
                    add(format!("block{i}.lastconv.weight"), &[c, 5, 4, 4], &|_, _| 0.0);
                    let bias = biases[i];
                    add(format!("block{i}.lastconv.bias"), &[5], &|k, _| bias[k]);
                }
                None => {
                    add(
                        format!("block{i}.lastconv.weight"),
                        &[c, 5, 4, 4],
                        &pseudo(0.2 / (c as f32).sqrt()),
                    );
                    add(format!("block{i}.lastconv.bias"), &[5], &pseudo(0.1));
                }
            }
        }
        tensors
    }

    fn frame(w: usize, h: usize, seed: usize) -> Vec<f32> {
        (0..3 * w * h)
            .map(|i| ((i * 31 + seed * 17) % 97) as f32 / 96.0)
            .collect()
    }

    #[test]
    fn loads_with_or_without_the_module_prefix_and_rejects_wrong_shapes() {
        let tensors = synthetic(None);
        assert!(Rife::from_tensors(&tensors).is_ok());
        let bare: BTreeMap<String, Tensor> = tensors
            .iter()
            .map(|(k, v)| (k.trim_start_matches("module.").to_string(), v.clone()))
            .collect();
        assert!(Rife::from_tensors(&bare).is_ok());
        let mut broken = bare.clone();
        broken.remove("block2.convblock.3.1.weight");
        let e = Rife::from_tensors(&broken).unwrap_err();
        assert!(e.0.contains("block2.convblock.3.1.weight"), "{e}");
        let mut wrong = bare;
        if let Some(t) = wrong.get_mut("block1.lastconv.bias") {
            t.shape = vec![4];
        }
        assert!(Rife::from_tensors(&wrong).is_err());
    }

    #[test]
    fn loads_a_safetensors_file_and_says_why_a_file_is_neither_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flownet.safetensors");
        gantry_manifest::torch::write_safetensors(&synthetic(None), &path).unwrap();
        assert!(Rife::load(&path).is_ok());
        let junk = dir.path().join("flownet.pkl");
        std::fs::write(&junk, b"not a model").unwrap();
        let e = Rife::load(&junk).unwrap_err();
        assert!(e.0.contains("neither safetensors"), "{e}");
    }

    #[test]
    fn without_flow_the_frames_are_blended_by_the_sigmoid_of_the_mask_at_any_size() {
        // Every flow is zero; the mask is block 0's bias, 1.0.
        let mut biases = [[0.0; 5]; 4];
        biases[0][4] = 1.0;
        let rife = Rife::from_tensors(&synthetic(Some(biases))).unwrap();
        let (w, h) = (37, 21);
        let (a, b) = (frame(w, h, 1), frame(w, h, 2));
        let (out, doubled) = rife.interpolate_traced(&a, &b, w, h, 0.3).unwrap();
        assert!(!doubled);
        assert_eq!(out.len(), 3 * w * h);
        let alpha = 1.0 / (1.0 + (-1.0f32).exp());
        for ((o, a), b) in out.iter().zip(&a).zip(&b) {
            let want = a * alpha + b * (1.0 - alpha);
            assert!((o - want).abs() < 1e-6, "{o} vs {want}");
        }
    }

    /// The frames padded to `side`, warped by constant flows, blended
    /// half and half, cropped.
    fn shifted_blend(a: &[f32], b: &[f32], w: usize, h: usize, side: usize, f0: f32, f1: f32) -> Vec<f32> {
        let pad = |img: &[f32]| {
            let mut out = vec![0.0; 3 * side * side];
            for c in 0..3 {
                for y in 0..h {
                    out[(c * side + y) * side..][..w].copy_from_slice(&img[(c * h + y) * w..][..w]);
                }
            }
            out
        };
        let plane = side * side;
        let wa = warp(&pad(a), 3, &vec![f0; plane], &vec![f0; plane], side, side);
        let wb = warp(&pad(b), 3, &vec![f1; plane], &vec![f1; plane], side, side);
        let mut out = Vec::with_capacity(3 * w * h);
        for c in 0..3 {
            for y in 0..h {
                let row = (c * side + y) * side;
                out.extend((0..w).map(|x| (wa[row + x] * 0.5 + wb[row + x] * 0.5).clamp(0.0, 1.0)));
            }
        }
        out
    }

    #[test]
    fn a_large_correction_from_the_second_block_restarts_at_doubled_scales() {
        let (w, h) = (64, 48);
        let (a, b) = (frame(w, h, 3), frame(w, h, 4));
        // Block 1's flow is its bias times 2·scale: ±5 · 8 = ±40 pixels for
        // both frames, over 32, so the pass restarts at scales [16, 8, 4,
        // 2], where block 1 gives 5 · 16 = 80.
        let mut biases = [[0.0; 5]; 4];
        biases[1] = [5.0, 5.0, -5.0, -5.0, 0.0];
        let rife = Rife::from_tensors(&synthetic(Some(biases))).unwrap();
        let (out, doubled) = rife.interpolate_traced(&a, &b, w, h, 0.5).unwrap();
        assert!(doubled);
        let want = shifted_blend(&a, &b, w, h, 128, 80.0, -80.0);
        for (o, w) in out.iter().zip(&want) {
            assert!((o - w).abs() < 1e-5, "{o} vs {w}");
        }
        // Only one frame's flow over 32 (frame 1's is 1 · 8 = 8): no restart.
        biases[1] = [5.0, 5.0, -1.0, -1.0, 0.0];
        let rife = Rife::from_tensors(&synthetic(Some(biases))).unwrap();
        let (out, doubled) = rife.interpolate_traced(&a, &b, w, h, 0.5).unwrap();
        assert!(!doubled);
        let want = shifted_blend(&a, &b, w, h, 128, 40.0, -8.0);
        for (o, w) in out.iter().zip(&want) {
            assert!((o - w).abs() < 1e-5, "{o} vs {w}");
        }
    }

    #[test]
    fn reused_workspaces_give_the_same_frames_as_fresh_ones_on_any_thread() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Rife>();
        let tensors = synthetic(None);
        let rife = Rife::from_tensors(&tensors).unwrap();
        let sizes = [(150, 40), (64, 64), (130, 20), (150, 40)];
        let fresh: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&(w, h)| {
                let rife = Rife::from_tensors(&tensors).unwrap();
                rife.interpolate(&frame(w, h, 7), &frame(w, h, 8), w, h, 0.4).unwrap()
            })
            .collect();
        // One after the other on one model, sizes going down and up again.
        for (&(w, h), want) in sizes.iter().zip(&fresh) {
            assert_eq!(
                &rife.interpolate(&frame(w, h, 7), &frame(w, h, 8), w, h, 0.4).unwrap(),
                want
            );
        }
        // At the same time on several threads.
        let rife = &rife;
        std::thread::scope(|scope| {
            let handles: Vec<_> = sizes
                .iter()
                .map(|&(w, h)| {
                    scope.spawn(move || rife.interpolate(&frame(w, h, 7), &frame(w, h, 8), w, h, 0.4).unwrap())
                })
                .collect();
            for (handle, want) in handles.into_iter().zip(&fresh) {
                assert_eq!(&handle.join().unwrap(), want);
            }
        });
    }

    #[test]
    fn random_weights_give_finite_frames_in_range() {
        let rife = Rife::from_tensors(&synthetic(None)).unwrap();
        let (w, h) = (130, 20);
        let out = rife.interpolate(&frame(w, h, 5), &frame(w, h, 6), w, h, 0.7).unwrap();
        assert_eq!(out.len(), 3 * w * h);
        assert!(out.iter().all(|v| (0.0..=1.0).contains(v)));
    }

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn candle_on_the_cpu_gives_the_kernels_frames_and_restarts_alike() {
        let cpu = Backend::Candle(gantry_gan::Device::Cpu);
        let tensors = synthetic(None);
        let kernels = Rife::from_tensors(&tensors).unwrap();
        let candle = Rife::from_tensors_on(&tensors, &cpu).unwrap();
        assert_eq!(
            (kernels.backend_name().as_str(), candle.backend_name().as_str()),
            ("kernels", "candle Cpu")
        );
        assert!(
            candle.blocks.is_empty(),
            "no packed copy of the weights beside the device's"
        );
        // 150x40 pads to 256x128: every block's resizes, warps and the
        // transposed convolution on a frame that is not square.
        let (w, h) = (150, 40);
        let (a, b) = (frame(w, h, 5), frame(w, h, 6));
        let (want, want_doubled) = kernels.interpolate_traced(&a, &b, w, h, 0.7).unwrap();
        let (got, got_doubled) = candle.interpolate_traced(&a, &b, w, h, 0.7).unwrap();
        assert_eq!(got_doubled, want_doubled);
        assert!(want.iter().any(|v| *v > 0.01 && *v < 0.99), "a frame not all clamped");
        let diff = worst(&got, &want);
        assert!(diff < 1e-4, "candle and the kernels differ by {diff}");

        // Flows that move the frames by fractions of a pixel (the warp's
        // bilinear blend) and a second block that asks for doubled scales.
        let mut biases = [[0.0; 5]; 4];
        biases[0] = [0.3, -0.2, 0.15, 0.4, 0.5];
        biases[1] = [5.0, 5.0, -5.0, -5.0, 0.0];
        biases[3] = [0.05, 0.0, -0.3, 0.1, -0.2];
        let tensors = synthetic(Some(biases));
        let kernels = Rife::from_tensors(&tensors).unwrap();
        let candle = Rife::from_tensors_on(&tensors, &cpu).unwrap();
        let (w, h) = (64, 48);
        let (a, b) = (frame(w, h, 3), frame(w, h, 4));
        let (want, want_doubled) = kernels.interpolate_traced(&a, &b, w, h, 0.5).unwrap();
        let (got, got_doubled) = candle.interpolate_traced(&a, &b, w, h, 0.5).unwrap();
        assert!(want_doubled && got_doubled);
        let diff = worst(&got, &want);
        assert!(diff < 1e-4, "after the restart candle and the kernels differ by {diff}");
    }
}
