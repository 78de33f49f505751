"""Load for bench/serverless/run.sh: runsync requests against Gantry or the
mini server, from an independent client.

  python load.py latency URL KEY N            sequential runsyncs: p50/p90/p99 in ms
  python load.py throughput URL KEY C SECONDS C concurrent loops of runsync: jobs/s

URL is the endpoint's runsync URL. Prints one JSON line.
"""
import asyncio
import json
import sys
import time

import aiohttp


async def one(session, url, key, i):
    async with session.post(url, json={"input": {"i": i}}, headers={"Authorization": f"Bearer {key}"}) as res:
        body = await res.json()
        if res.status != 200 or body.get("status") != "COMPLETED":
            raise RuntimeError(f"job failed: {res.status} {body}")


async def latency(url, key, n):
    times = []
    async with aiohttp.ClientSession() as session:
        for i in range(5):  # warm-up
            await one(session, url, key, i)
        for i in range(n):
            t0 = time.perf_counter()
            await one(session, url, key, i)
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    pick = lambda q: round(times[min(len(times) - 1, int(q * len(times)))], 2)
    return {"n": n, "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99)}


async def throughput(url, key, concurrency, seconds):
    done = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm-up: every connection and every worker once.
        await asyncio.gather(*(one(session, url, key, i) for i in range(concurrency)))
        stop = time.perf_counter() + seconds

        async def loop():
            nonlocal done
            i = 0
            while time.perf_counter() < stop:
                await one(session, url, key, i)
                done += 1
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"concurrency": concurrency, "jobs": done, "seconds": round(elapsed, 2), "jobs_per_s": round(done / elapsed, 1)}


def main():
    mode, url, key = sys.argv[1:4]
    if mode == "latency":
        result = asyncio.run(latency(url, key, int(sys.argv[4])))
    else:
        result = asyncio.run(throughput(url, key, int(sys.argv[4]), float(sys.argv[5])))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
