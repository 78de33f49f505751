"""A RunPod serverless handler for Gantry's tests: echoes its input.

`sleep` (seconds) delays the answer, `fail: true` raises; `write`
({"name", "text"}) writes a file to the endpoint's network volume and `read`
(a name) reads one back (null when there is none). Written as any
RunPod user would write it; runs unmodified on runpod-python 1.12. It takes
up to 4 jobs at once (with one slot, the SDK waits a second after each take).
"""
import asyncio
import os

import runpod

VOLUME = "/runpod-volume"


async def handler(job):
    data = job["input"]
    if data.get("sleep"):
        await asyncio.sleep(float(data["sleep"]))
    if data.get("fail"):
        raise ValueError("asked to fail")
    result = {"echo": data, "worker": os.environ.get("RUNPOD_POD_ID")}
    if data.get("write"):
        path = os.path.join(VOLUME, os.path.basename(data["write"]["name"]))
        with open(path, "w") as f:
            f.write(data["write"]["text"])
    if data.get("read"):
        path = os.path.join(VOLUME, os.path.basename(data["read"]))
        result["read"] = open(path).read() if os.path.exists(path) else None
    return result


runpod.serverless.start({"handler": handler, "concurrency_modifier": lambda current: 4})
