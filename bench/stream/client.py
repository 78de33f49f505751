#!/usr/bin/env python3
"""Live-stream latency client: N concurrent echo jobs, each followed over SSE.

Each job streams CHUNKS chunks, INTERVAL ms apart, after a short sleep (so
its reader is attached before the first chunk); each chunk carries the wall
clock time the worker sent it (`timestamps: true`). The latency of a chunk is
the reader's wall clock when the SSE event is parsed minus that time: worker
-> gRPC -> scheduler -> live feed -> SSE writer -> client, all on this box.

Standard library only (asyncio streams, HTTP/1.1 by hand), so nothing is
installed for it. Prints one JSON object.
"""
import argparse
import asyncio
import json
import time


async def http(host, port, method, path, key, body=None, headers=()):
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Authorization: Bearer {key}",
            f"Content-Length: {len(data)}", "Content-Type: application/json", *headers, "", ""]
    writer.write("\r\n".join(head).encode() + data)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    fields = {}
    while True:
        line = (await reader.readline()).decode().strip()
        if not line:
            break
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return status, fields, reader, writer


async def body_of(fields, reader):
    if "content-length" in fields:
        return await reader.readexactly(int(fields["content-length"]))
    out = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            return out
        out += await reader.readexactly(size)
        await reader.readline()


async def chunked(reader):
    """The pieces of a chunked body as they arrive."""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            return
        piece = await reader.readexactly(size)
        await reader.readline()
        yield piece


async def one(args, host, port, latencies, problems):
    job = {"input": {"sleep_ms": args.sleep_ms, "stream": args.chunks,
                     "stream_interval_ms": args.interval_ms, "timestamps": True}}
    status, fields, reader, writer = await http(host, port, "POST", f"/v2/{args.model}/run", args.key, job)
    submitted = json.loads(await body_of(fields, reader))
    writer.close()
    if status != 200:
        problems.append(f"submit answered {status}: {submitted}")
        return
    job_id = submitted["id"]
    status, fields, reader, writer = await http(
        host, port, "GET", f"/v2/{args.model}/stream/{job_id}", args.key,
        headers=("Accept: text/event-stream",))
    if status != 200:
        problems.append(f"stream answered {status}")
        return
    pending, seen, final = "", [], None
    async for piece in chunked(reader):
        now_us = time.time_ns() // 1000
        pending += piece.decode()
        while "\n\n" in pending:
            block, pending = pending.split("\n\n", 1)
            name, data = "message", ""
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data += line[6:]
            if name == "chunk":
                output = json.loads(data)["output"]
                seen.append(output["chunk"])
                latencies.append((now_us - output["sent_at_us"]) / 1000.0)
            elif name == "status":
                final = json.loads(data)["status"]
    writer.close()
    if seen != list(range(args.chunks)):
        problems.append(f"{job_id}: chunks not once and in order ({len(seen)} seen)")
    if final != "COMPLETED":
        problems.append(f"{job_id}: ended {final}")


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="public listener, host:port")
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", default="gantry-echo")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--interval-ms", type=int, default=20)
    parser.add_argument("--sleep-ms", type=int, default=1000)
    args = parser.parse_args()
    host, port = args.base.rsplit(":", 1)
    latencies, problems = [], []
    started = time.monotonic()
    await asyncio.gather(*(one(args, host, int(port), latencies, problems) for _ in range(args.streams)))
    wall = time.monotonic() - started
    result = {
        "streams": args.streams, "chunks_per_stream": args.chunks, "interval_ms": args.interval_ms,
        "chunks": len(latencies), "wall_s": round(wall, 2),
        "chunks_per_s": round(len(latencies) / max(wall - args.sleep_ms / 1000.0, 1e-9), 1),
        "problems": problems[:5], "problem_count": len(problems),
    }
    if latencies:
        result.update({f"p{p}_ms": round(percentile(latencies, p), 2) for p in (50, 90, 99)})
        result["max_ms"] = round(max(latencies), 2)
    print(json.dumps(result))


asyncio.run(main())
