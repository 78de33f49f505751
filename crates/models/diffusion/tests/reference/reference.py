#!/usr/bin/env python3
"""Computes what diffusers and transformers make of the tiny test weights.

The Rust test `reference` (tests/reference.rs) runs the same components on
the same inputs and compares. Regenerate the fixtures after any change to
the tiny architectures or to how their weights are drawn:

    crates/models/diffusion/tests/reference/regenerate.sh

which writes each variant's tiny directory with the `write_tiny_weights`
example and runs this script on it:

    python3 reference.py <sd-1.5|sd-turbo|sdxl> <tiny dir> <out.safetensors>

Needs torch, diffusers, transformers and safetensors (versions are recorded
in the output's metadata). Nothing here is run by CI; the fixtures are.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

BOS, EOS = 49406, 49407


def ids_for(text_ids, pad_with_end):
    """The 77 ids of one prompt: start, the tokens, end, then padding."""
    ids = [BOS] + text_ids + [EOS]
    pad = EOS if pad_with_end else 0
    return ids + [pad] * (77 - len(ids))


class TanhGelu:
    """Within it, torch's GELU is the tanh approximation, which candle's
    GEGLU (the UNet's feed-forward) uses; diffusers' own is exact."""

    def __enter__(self):
        import torch.nn.functional as F

        self.exact = F.gelu
        F.gelu = lambda x, approximate="none": self.exact(x, approximate="tanh")

    def __exit__(self, *_):
        import torch.nn.functional as F

        F.gelu = self.exact


def encoder(directory, with_projection):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return cls.from_pretrained(directory).eval()


# What each variant's pipeline check asks for: SD 1.5 with guidance and a
# negative prompt, SD-Turbo at three steps (trailing timesteps, no
# guidance), SDXL with guidance and no negative prompt (zeros).
PIPELINE_CASES = {
    "sd-1.5": {"prompt": "the cat", "negative_prompt": "a dog", "steps": 4, "guidance_scale": 7.5, "height": 64, "width": 48},
    "sd-turbo": {"prompt": "the cat", "negative_prompt": "", "steps": 3, "guidance_scale": 0.0, "height": 64, "width": 64},
    "sdxl": {"prompt": "the dog", "negative_prompt": "", "steps": 3, "guidance_scale": 5.0, "height": 64, "width": 56},
}


def ddim(variant):
    """diffusers' DDIMScheduler configured as Gantry's DDIM (src/ddim.rs)."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
        timestep_spacing="trailing" if variant == "sd-turbo" else "leading",
    )


def pipeline(variant, tiny, unet, vae):
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    scheduler = ddim(variant)

    def tokenizer(pad):
        folder = tiny / "tokenizer"
        return CLIPTokenizer(
            str(folder / "vocab.json"), str(folder / "merges.txt"), pad_token=pad, model_max_length=77
        )

    # The pads of Gantry's tiny architectures (Architecture::tiny).
    first = tokenizer("<|endoftext|>" if variant == "sd-1.5" else "!")
    text_encoder = encoder(tiny / "text_encoder", False)
    if variant == "sdxl":
        return StableDiffusionXLPipeline(
            vae=vae,
            text_encoder=text_encoder,
            text_encoder_2=encoder(tiny / "text_encoder_2", True),
            tokenizer=first,
            tokenizer_2=tokenizer("!"),
            unet=unet,
            scheduler=scheduler,
            force_zeros_for_empty_prompt=True,
        )
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=first,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def main():
    variant, tiny, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    import diffusers
    import transformers
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    rng = np.random.default_rng(20261127)
    tensors = {}
    # Two prompts (a batch of two), token ids within the tiny vocabulary.
    prompts = [[320, 1125, 539, 1237, 17], [513, 300, 42]]

    encoders = [("text_encoder", "clip")]
    if (tiny / "text_encoder_2").is_dir():
        encoders.append(("text_encoder_2", "clip2"))
    # SD 1.5 pads its prompts with the end token, SD 2.x and SDXL with "!"
    # (id 0); the fixture carries the ids so both sides read the same.
    pad_with_end = variant == "sd-1.5"
    for folder, name in encoders:
        config = json.loads((tiny / folder / "config.json").read_text())
        projected = "CLIPTextModelWithProjection" in config.get("architectures", [])
        model = encoder(tiny / folder, projected)
        ids = torch.tensor([ids_for(p, pad_with_end) for p in prompts], dtype=torch.long)
        with torch.no_grad():
            result = model(input_ids=ids, output_hidden_states=True)
        tensors[f"{name}.ids"] = ids.numpy().astype(np.uint32)
        tensors[f"{name}.last"] = result.last_hidden_state.numpy()
        tensors[f"{name}.penultimate"] = result.hidden_states[-2].numpy()
        if projected:
            tensors[f"{name}.pooled"] = result.text_embeds.numpy()

    unet = UNet2DConditionModel.from_pretrained(tiny / "unet").eval()
    cross = unet.config.cross_attention_dim
    # One size the down path halves evenly and one it does not (the
    # upsamplers then meet the skips' sizes).
    for label, (h, w) in [("even", (8, 8)), ("odd", (9, 7))]:
        latents = rng.standard_normal((2, 4, h, w), dtype=np.float32)
        context = rng.standard_normal((2, 16, cross), dtype=np.float32)
        kwargs = {}
        if unet.config.addition_embed_type == "text_time":
            pooled = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim
            text_embeds = rng.standard_normal((2, pooled), dtype=np.float32)
            time_ids = np.array([[h * 8, w * 8, 0, 0, h * 8, w * 8], [1024, 768, 16, 32, 512, 512]], dtype=np.float32)
            tensors[f"unet.{label}.text_embeds"] = text_embeds
            tensors[f"unet.{label}.time_ids"] = time_ids
            kwargs["added_cond_kwargs"] = {
                "text_embeds": torch.from_numpy(text_embeds),
                "time_ids": torch.from_numpy(time_ids),
            }
        def run():
            with torch.no_grad():
                return unet(
                    torch.from_numpy(latents), 601, encoder_hidden_states=torch.from_numpy(context), **kwargs
                ).sample.numpy()

        tensors[f"unet.{label}.latents"] = latents
        tensors[f"unet.{label}.context"] = context
        tensors[f"unet.{label}.out"] = run()
        with TanhGelu():
            tensors[f"unet.{label}.out_tanh_gelu"] = run()

    vae = AutoencoderKL.from_pretrained(tiny / "vae").eval()
    latents = rng.standard_normal((1, 4, 8, 8), dtype=np.float32)
    with torch.no_grad():
        decoded = vae.decode(torch.from_numpy(latents)).sample
    tensors["vae.latents"] = latents
    tensors["vae.out"] = decoded.numpy()

    # The whole pipeline: diffusers' own, with DDIM configured as Gantry's,
    # from given starting noise (Gantry draws its own from the seed).
    case = PIPELINE_CASES[variant]
    noise = rng.standard_normal((1, 4, case["height"] // 8, case["width"] // 8), dtype=np.float32)
    image = pipeline(variant, tiny, unet, vae)(
        prompt=case["prompt"],
        negative_prompt=case["negative_prompt"] or None,
        num_inference_steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        height=case["height"],
        width=case["width"],
        latents=torch.from_numpy(noise),
        output_type="np",
    ).images[0]
    tensors["pipeline.noise"] = noise
    tensors["pipeline.image"] = np.asarray(image, dtype=np.float32)

    metadata = {
        "variant": variant,
        "pipeline": json.dumps(case),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "unet timestep": "601",
    }
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, out, metadata=metadata)
    print(f"{out}: {len(tensors)} tensors ({variant}; torch {torch.__version__}, diffusers {diffusers.__version__})")


if __name__ == "__main__":
    main()
