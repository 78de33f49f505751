#!/usr/bin/env python3
"""The Stable Diffusion pipeline in diffusers (PyTorch, CPU), timed the way
crates/models/diffusion/examples/sd_bench.rs times Gantry's: load once, then
`runs` images from the same starting latents, one line per run and the
median, in milliseconds.

    python3 sd_reference.py <dir> <sd-1.5|sd-turbo|sdxl> <width> <height> <steps> <guidance> <runs> [threads]

SD_DEVICE=cuda runs it on the GPU and SD_HALF=1 in float16 (the default is
the CPU in float32). Needs torch, diffusers, transformers and safetensors. The scheduler is DDIM
with the timesteps Gantry uses (trailing for SD-Turbo, leading otherwise).
"""

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch


def main():
    args = sys.argv[1:]
    if len(args) not in (7, 8):
        sys.exit(__doc__)
    folder, variant = Path(args[0]), args[1]
    width, height, steps, guidance, runs = int(args[2]), int(args[3]), int(args[4]), float(args[5]), int(args[6])
    torch.set_num_threads(int(args[7]) if len(args) == 8 else 2)
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "crates/models/diffusion/tests/reference"))
    from reference import ddim

    started = time.perf_counter()
    scheduler = ddim(variant)
    cls = StableDiffusionXLPipeline if variant == "sdxl" else StableDiffusionPipeline
    extra = {} if variant == "sdxl" else {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer(
        str(folder / "tokenizer/vocab.json"), str(folder / "tokenizer/merges.txt"), pad_token="!", model_max_length=77
    )
    if variant == "sdxl":
        extra["tokenizer_2"] = tokenizer
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    if variant == "sdxl":
        extra["text_encoder_2"] = CLIPTextModelWithProjection.from_pretrained(folder / "text_encoder_2")
    pipe = cls(
        vae=AutoencoderKL.from_pretrained(folder / "vae"),
        text_encoder=CLIPTextModel.from_pretrained(folder / "text_encoder"),
        tokenizer=tokenizer,
        unet=UNet2DConditionModel.from_pretrained(folder / "unet"),
        scheduler=scheduler,
        **extra,
    )
    pipe.set_progress_bar_config(disable=True)
    device = os.environ.get("SD_DEVICE", "cpu") or "cpu"
    dtype = torch.float16 if os.environ.get("SD_HALF") == "1" else torch.float32
    pipe = pipe.to(device, dtype)
    print(f"load {(time.perf_counter() - started) * 1e3:.0f} ms")
    print(f"device {device} {dtype}")
    latents = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 4, height // 8, width // 8), dtype=np.float32))
    latents = latents.to(device, dtype)
    times = []
    for run in range(runs):
        started = time.perf_counter()
        with torch.inference_mode():
            image = pipe(
                prompt="a lighthouse at dusk, oil painting",
                num_inference_steps=steps,
                guidance_scale=guidance,
                width=width,
                height=height,
                latents=latents,
                output_type="np",
            ).images[0]
        ms = (time.perf_counter() - started) * 1e3
        print(f"run {run} {ms:.0f} ms ({image.shape[1]}x{image.shape[0]})")
        times.append(ms)
    print(f"median {sorted(times)[len(times) // 2]:.0f} ms")


if __name__ == "__main__":
    main()
