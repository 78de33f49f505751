#!/usr/bin/env python3
"""The image models' generators in onnxruntime, from the same safetensors the
Rust engine loads, to check its output and to time it beside it.

The ONNX graph is built here from the weights with onnx.helper, layer by layer
as the published PyTorch modules define them (ConvTranspose2d 4x4 with stride
1/pad 0 first and stride 2/pad 1 after, BatchNormalization in inference mode,
Relu, Tanh at the end), so onnxruntime's own kernels compute every step.

    reference.py compare WEIGHTS PREFIX INPUTS.f32 BATCH RUST_OUTPUT.f32
        exits 1 unless the Rust output is within 1e-3 of onnxruntime's
    reference.py time WEIGHTS PREFIX INPUTS.f32 BATCH ROUNDS THREADS
        prints {"batch":..,"best_ms":..,"median_ms":..} for onnxruntime
    reference.py torch WEIGHTS PREFIX INPUTS.f32 BATCH ROUNDS DEVICE [RUST_OUTPUT.f32]
        the same network as PyTorch modules (ConvTranspose2d, BatchNorm2d, ReLU, Tanh) on DEVICE
        (cpu, cuda): the same JSON, plus max_abs_diff against the Rust output when one is given
        (exit 1 beyond 1e-3). TF32 is off, so both sides compute in float32.
"""
import json
import struct
import sys
import time

import numpy as np

try:  # the torch mode runs where onnx is not installed (the GPU machine)
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    onnx = None


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=kinds[info["dtype"]]).reshape(info["shape"])
    return out


def build(tensors, prefix):
    modules = sorted({int(k[len(prefix) + 1:].split(".")[0]) for k in tensors if k.startswith(prefix + ".")})
    nodes, inits = [], []
    current, first = "z", True
    for i in modules:
        name = f"{prefix}.{i}"
        if f"{name}.running_mean" in tensors:
            for part in ("weight", "bias", "running_mean", "running_var"):
                inits.append(numpy_helper.from_array(tensors[f"{name}.{part}"].astype(np.float32), f"{name}.{part}"))
            nodes.append(helper.make_node(
                "BatchNormalization",
                [current] + [f"{name}.{p}" for p in ("weight", "bias", "running_mean", "running_var")],
                [f"{name}.bn"], epsilon=1e-5))
            nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"]))
            current = f"{name}.relu"
        elif f"{name}.weight" in tensors and tensors[f"{name}.weight"].ndim == 4:
            inits.append(numpy_helper.from_array(tensors[f"{name}.weight"].astype(np.float32), f"{name}.weight"))
            stride, pad = (1, 0) if first else (2, 1)
            nodes.append(helper.make_node(
                "ConvTranspose", [current, f"{name}.weight"], [f"{name}.conv"],
                kernel_shape=[4, 4], strides=[stride, stride], pads=[pad] * 4))
            current, first = f"{name}.conv", False
    nodes.append(helper.make_node("Tanh", [current], ["image"]))
    channels = tensors[f"{prefix}.{modules[0]}.weight"].shape[0]
    graph = helper.make_graph(
        nodes, "generator",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", channels, 1, 1])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, "side", "side"])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, channels


def session(weights, prefix, threads):
    model, channels = build(read_safetensors(weights), prefix)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), channels


def torch_generator(tensors, prefix, device):
    import torch
    from torch import nn

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    modules = sorted({int(k[len(prefix) + 1:].split(".")[0]) for k in tensors if k.startswith(prefix + ".")})
    layers, first = [], True
    for i in modules:
        name = f"{prefix}.{i}"
        if f"{name}.running_mean" in tensors:
            bn = nn.BatchNorm2d(tensors[f"{name}.weight"].shape[0], eps=1e-5)
            for part in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, part).data = torch.from_numpy(tensors[f"{name}.{part}"].astype(np.float32).copy())
            layers += [bn, nn.ReLU()]
        elif f"{name}.weight" in tensors and tensors[f"{name}.weight"].ndim == 4:
            w = tensors[f"{name}.weight"]
            stride, pad = (1, 0) if first else (2, 1)
            conv = nn.ConvTranspose2d(w.shape[0], w.shape[1], 4, stride, pad, bias=False)
            conv.weight.data = torch.from_numpy(w.astype(np.float32).copy())
            layers.append(conv)
            first = False
    layers.append(nn.Tanh())
    return nn.Sequential(*layers).eval().to(device), tensors[f"{prefix}.{modules[0]}.weight"].shape[0]


def run_torch(weights, prefix, inputs, batch, rounds, device, rust_output):
    import torch

    net, channels = torch_generator(read_safetensors(weights), prefix, device)
    z = torch.from_numpy(np.fromfile(inputs, dtype="<f4").reshape(batch, channels, 1, 1)).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        out = net(z)  # warm-up
        sync()
        times = []
        for _ in range(max(rounds, 1)):
            started = time.perf_counter()
            out = net(z)
            sync()
            times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    result = {"batch": batch, "best_ms": round(times[0], 3), "median_ms": round(times[len(times) // 2], 3)}
    if rust_output:
        want = out.float().cpu().numpy()
        got = np.fromfile(rust_output, dtype="<f4").reshape(want.shape)
        result["max_abs_diff"] = float(np.abs(got - want).max())
    print(json.dumps(result))
    sys.exit(0 if result.get("max_abs_diff", 0.0) < 1e-3 else 1)


def main():
    mode, weights, prefix, inputs, batch = sys.argv[1:6]
    batch = int(batch)
    if mode == "torch":
        run_torch(weights, prefix, inputs, batch, int(sys.argv[6]), sys.argv[7], sys.argv[8] if len(sys.argv) > 8 else None)
    if mode == "compare":
        sess, channels = session(weights, prefix, 1)
        z = np.fromfile(inputs, dtype="<f4").reshape(batch, channels, 1, 1)
        want = sess.run(None, {"z": z})[0]
        got = np.fromfile(sys.argv[6], dtype="<f4").reshape(want.shape)
        diff = float(np.abs(got - want).max())
        print(json.dumps({"batch": batch, "shape": list(want.shape), "max_abs_diff": diff}))
        sys.exit(0 if diff < 1e-3 else 1)
    rounds, threads = int(sys.argv[6]), int(sys.argv[7])
    sess, channels = session(weights, prefix, threads)
    z = np.fromfile(inputs, dtype="<f4").reshape(batch, channels, 1, 1)
    sess.run(None, {"z": z})  # warm-up
    times = []
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        sess.run(None, {"z": z})
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    print(json.dumps({"batch": batch, "best_ms": round(times[0], 3), "median_ms": round(times[len(times) // 2], 3)}))


if __name__ == "__main__":
    main()
