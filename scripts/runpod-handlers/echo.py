"""A RunPod serverless handler for Gantry's tests: echoes its input.

`sleep` (seconds) delays the answer, `fail: true` raises. Written as any
RunPod user would write it; runs unmodified on runpod-python 1.12. It takes
up to 4 jobs at once (with one slot, the SDK waits a second after each take).
"""
import asyncio
import os

import runpod


async def handler(job):
    data = job["input"]
    if data.get("sleep"):
        await asyncio.sleep(float(data["sleep"]))
    if data.get("fail"):
        raise ValueError("asked to fail")
    return {"echo": data, "worker": os.environ.get("RUNPOD_POD_ID")}


runpod.serverless.start({"handler": handler, "concurrency_modifier": lambda current: 4})
