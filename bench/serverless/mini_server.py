"""The smallest server of the RunPod worker protocol: the baseline of
bench/serverless/run.sh.

Everything in memory, one asyncio loop: `POST /v2/<ep>/runsync` puts a job
on a queue and waits for its result; the workers' `job-take` long-polls the
queue; `job-done` resolves the waiting request. No storage, no leases, no
billing, no authentication: what is left is the protocol's own cost, so
Gantry's figures beside it show what the platform adds.

Usage: python mini_server.py PORT   (runs until killed)
"""
import asyncio
import itertools
import json
import sys

from aiohttp import web

queue: asyncio.Queue = asyncio.Queue()
waiting: dict[str, asyncio.Future] = {}
ids = itertools.count()


async def runsync(request: web.Request) -> web.Response:
    body = await request.json()
    job_id = f"job-{next(ids)}"
    done = asyncio.get_running_loop().create_future()
    waiting[job_id] = done
    await queue.put({"id": job_id, "input": body.get("input", {})})
    output = await done
    return web.json_response({"id": job_id, "status": "COMPLETED", "output": output})


async def take_one(timeout: float):
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except asyncio.TimeoutError:
        return None


async def job_take(request: web.Request) -> web.Response:
    job = await take_one(20)
    return web.Response(status=204) if job is None else web.json_response(job)


async def job_take_batch(request: web.Request) -> web.Response:
    size = int(request.query.get("batch_size", "1"))
    first = await take_one(20)
    if first is None:
        return web.Response(status=204)
    jobs = [first]
    while len(jobs) < size and not queue.empty():
        jobs.append(queue.get_nowait())
    return web.json_response(jobs)


async def job_done(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    if body.get("status") != "IN_PROGRESS":
        future = waiting.pop(request.match_info["job"], None)
        if future is not None and not future.done():
            future.set_result(body.get("output", body.get("error")))
    return web.json_response({})


async def ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({})


async def job_stop(request: web.Request) -> web.Response:
    await asyncio.sleep(20)
    return web.Response(status=204)


def main() -> None:
    app = web.Application()
    app.router.add_post("/v2/{ep}/runsync", runsync)
    app.router.add_get("/v2/{ep}/job-take/{worker}", job_take)
    app.router.add_get("/v2/{ep}/job-take-batch/{worker}", job_take_batch)
    app.router.add_post("/v2/{ep}/job-done/{worker}/{job}", job_done)
    app.router.add_post("/v2/{ep}/job-stream/{worker}/{job}", ok)
    app.router.add_get("/v2/{ep}/ping/{worker}", ok)
    app.router.add_get("/v2/{ep}/job-stop/{worker}", job_stop)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
