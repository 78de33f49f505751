"""A RunPod handler that does nothing: it returns its input.

It takes up to 4 jobs at once (`concurrency_modifier`): with one slot,
runpod-python sleeps a second after each take before it asks again, and the
benchmark would measure that sleep.
"""
import runpod


async def handler(job):
    return job["input"]


runpod.serverless.start({"handler": handler, "concurrency_modifier": lambda current: 4})
