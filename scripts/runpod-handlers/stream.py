"""A RunPod generator handler for Gantry's tests: yields `n` pieces."""
import runpod


def handler(job):
    for i in range(int(job["input"].get("n", 3))):
        yield {"tok": i}


runpod.serverless.start({"handler": handler, "return_aggregate_stream": True})
