#!/usr/bin/env python3
"""Load client of bench/text/run.sh: Gantry's text model as a user sees it.

    client.py measure --url http://127.0.0.1:18081 --key gk_... --pid PID [options] > result.json
    client.py cost --key gk_... --pid PID [--rounds 6] [--lengths 16,128] > cost.json
    client.py pairs --key gk_... --bench-cmd "gantry-llama-bench -m F -p 0 -n 128 -r 1 -o json" > pairs.json
    client.py combine --meta cpu=... [--pairs pairs.json] result.json native=llama-bench-native.json ... > latest.json
    client.py report latest.json                             # Markdown tables

`measure` sends OpenAI chat completions with `stream: true` to
/v2/{model}/openai/v1/chat/completions at each concurrency level (every
stream of a round starts together; rounds follow each other), then the same
request without streaming through /v2/{model}/runsync, one at a time. Per
request it records:

  ttft      send -> first `data:` chunk with non-empty delta content
  gen_tps   (completion_tokens - 1) / (last content chunk - first content chunk)
  pp_tps    prompt_tokens / ttft (an approximation: ttft also holds HTTP,
            queueing, scheduling and the chat template)

and per round the aggregate generation rate, sum(completion_tokens - 1) over
(latest last content chunk - earliest first content chunk), plus the
end-to-end rate, sum(completion_tokens) / round wall time. Token counts are
the server's `usage` (stream_options.include_usage). The server's VmRSS is
sampled every 50 ms; VmHWM is read at the end. With each paired runsync
request it also reads the server's CPU time from /proc, the text engine's
threads apart from the rest, so streaming's cost on the server is known
without this client's own CPU in it.

`cost` splits the server's CPU outside the text engine into a part per
request and a part per token, streamed and `runsync`: it alternates both
kinds of request at two lengths (--lengths 16,128) and fits a line through
the medians.

`pairs` alternates one streamed request with one llama.cpp run of the same
number of generated tokens while the server idles, for a single-stream
ratio that the machine's drift over minutes does not decide. Standard
library only.
"""

import argparse
import http.client
import json
import os
import shlex
import subprocess
import statistics
import sys
import threading
import time
import urllib.parse

# About 100 tokens once the chat template wraps it (usage.prompt_tokens says exactly).
PROMPT = (
    "You are helping a small town library plan its first open day. The library has a reading room, "
    "a children's corner with picture books, a local history shelf, two public computers and a garden "
    "with benches. About two hundred visitors are expected, many of them families. Write a detailed "
    "plan for the day, hour by hour, from opening at nine in the morning to closing at five, with one "
    "activity for each part of the library and what volunteers should do."
)


class Failure(Exception):
    pass


def proc_status(pid):
    """VmRSS and VmHWM of pid, in KiB (None when unreadable)."""
    out = {"VmRSS": None, "VmHWM": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


TICKS = os.sysconf("SC_CLK_TCK")


def stat_cpu(path):
    """utime + stime of a /proc stat file, in seconds (clock ticks, 10 ms)."""
    with open(path) as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu(pid, tid):
    """CPU seconds of one thread: schedstat's nanoseconds where the kernel has
    them (stat's clock ticks are too coarse for one request)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return stat_cpu(f"/proc/{pid}/task/{tid}/stat")


def server_cpu(pid):
    """CPU seconds of the server: the whole process (exited threads included)
    and, by thread id, its live threads that are not the text engine's. The
    engine thread is named text-engine-<model> and the threads of its ggml
    threadpool, started from it, inherit that name, so total minus the rest is
    the engine's share.
    Only the process total includes the decode threads that already ended, and
    the kernel keeps it in clock ticks: the engine's share is good to 10 ms per
    reading, the rest to the nanosecond."""
    total, others = None, {}
    try:
        total = stat_cpu(f"/proc/{pid}/stat")
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().startswith("text-engine"):
                        continue
                others[tid] = thread_cpu(pid, tid)
            except OSError:
                pass  # the thread ended meanwhile
    except OSError:
        return None
    return {"total": total, "others": others}


def server_cpu_delta(before, after):
    """(whole process, everything but the engine) CPU seconds between two
    server_cpu snapshots; a thread that ended in between counts as engine."""
    if not before or not after:
        return None
    rest = sum(t - before["others"].get(tid, 0.0) for tid, t in after["others"].items())
    return {"total": after["total"] - before["total"], "platform": rest}


class RssSampler:
    def __init__(self, pid, interval=0.05):
        self.pid, self.interval = pid, interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            rss = proc_status(self.pid)["VmRSS"]
            if rss:
                self.peak_kib = max(self.peak_kib, rss)
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak_kib = proc_status(self.pid)["VmRSS"] or 0
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def connect(url, timeout):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def chat_body(args, stream):
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def stream_once(args, deadline):
    """One streaming chat completion; times in seconds from the send."""
    path = f"/v2/{args.model}/openai/v1/chat/completions"
    conn = connect(args.url, args.timeout)
    try:
        t0 = time.perf_counter()
        conn.request(
            "POST",
            path,
            body=json.dumps(chat_body(args, True)),
            headers={
                "Authorization": f"Bearer {args.key}",
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
            },
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise Failure(f"HTTP {resp.status}: {resp.read(2000).decode(errors='replace')}")
        first = last = None
        chunks = 0
        usage = None
        finish = None
        text = []
        done = False
        while not done:
            if time.perf_counter() > deadline:
                raise Failure("request deadline passed")
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise Failure(f"error event: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter() - t0
                    if first is None:
                        first = now
                    last = now
                    chunks += 1
                    text.append(content)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        total = time.perf_counter() - t0
        if not done:
            raise Failure("the stream ended without [DONE]")
        if first is None or usage is None:
            raise Failure(f"no content or no usage (usage={usage})")
        return {
            "t_first": first,
            "t_last": last,
            "t_total": total,
            "chunks": chunks,
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "finish_reason": finish,
            "text": "".join(text),
        }
    finally:
        conn.close()


def runsync_once(args):
    path = f"/v2/{args.model}/runsync"
    body = {"input": {k: v for k, v in chat_body(args, False).items() if k != "model"}}
    conn = connect(args.url, args.timeout)
    try:
        t0 = time.perf_counter()
        conn.request(
            "POST",
            path,
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        raw = resp.read()
        total = time.perf_counter() - t0
        if resp.status != 200:
            raise Failure(f"HTTP {resp.status}: {raw[:2000].decode(errors='replace')}")
        view = json.loads(raw)
        if view.get("status") != "COMPLETED":
            raise Failure(f"job not completed: {str(view)[:2000]}")
        out = view.get("output") or {}
        usage = out.get("usage") or {}
        choice = (out.get("choices") or [{}])[0]
        return {
            "t_total": total,
            "prompt_tokens": usage.get("input"),
            "completion_tokens": usage.get("output"),
            "finish_reason": choice.get("finish_reason"),
            "execution_ms": view.get("executionTime"),
            "delay_ms": view.get("delayTime"),
            "text": choice.get("text", ""),
        }
    finally:
        conn.close()


def run_round(args, concurrency):
    """concurrency streams started together; returns per-request results and the round's aggregate."""
    results = [None] * concurrency
    errors = []
    barrier = threading.Barrier(concurrency)
    starts = [0.0] * concurrency

    def worker(i):
        try:
            barrier.wait(timeout=args.timeout)
            starts[i] = time.perf_counter()
            results[i] = stream_once(args, starts[i] + args.timeout)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.timeout + 10)
    wall = time.perf_counter() - t0
    if errors or any(r is None for r in results):
        raise Failure(f"{len(errors)} of {concurrency} requests failed: {errors[:3]}")
    base = min(starts)
    first = min(s - base + r["t_first"] for s, r in zip(starts, results))
    last = max(s - base + r["t_last"] for s, r in zip(starts, results))
    gen_after_first = sum(r["completion_tokens"] - 1 for r in results)
    return results, {
        "wall_s": wall,
        "aggregate_gen_tps": gen_after_first / (last - first) if last > first else None,
        "end_to_end_tps": sum(r["completion_tokens"] for r in results) / wall,
    }


def per_request_metrics(r):
    gen_span = r["t_last"] - r["t_first"]
    return {
        "ttft_s": r["t_first"],
        "gen_tps": (r["completion_tokens"] - 1) / gen_span if gen_span > 0 else None,
        "pp_tps": r["prompt_tokens"] / r["t_first"],
        "total_s": r["t_total"],
        "prompt_tokens": r["prompt_tokens"],
        "completion_tokens": r["completion_tokens"],
        "chunks": r["chunks"],
        "finish_reason": r["finish_reason"],
    }


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def measure(args):
    levels = [int(c) for c in args.concurrency.split(",")]
    t_start = time.perf_counter()
    out = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "prompt_chars": len(args.prompt),
        "rounds": args.rounds,
        "idle": proc_status(args.pid),
        "loadavg_before": open("/proc/loadavg").read().split()[:3],
        "streaming": [],
    }
    # Warm-up: the first request pays for lazy allocations in the engine and HTTP stack.
    for _ in range(args.warmup):
        try:
            stream_once(args, time.perf_counter() + args.timeout)
        except (Failure, OSError) as e:
            out["skipped"] = [f"warm-up: {e}"]
    reference_text = None
    out.setdefault("skipped", [])
    for c in levels:
        requests, rounds = [], []
        with RssSampler(args.pid) as rss:
            for k in range(args.rounds):
                if time.perf_counter() - t_start > args.budget:
                    out["skipped"].append(f"c={c} round {k + 1}: over the {args.budget:.0f} s budget")
                    break
                try:
                    results, agg = run_round(args, c)
                except Failure as e:
                    out["skipped"].append(f"c={c} round {k + 1}: {e}")
                    print(f"client: c={c}: {e}", file=sys.stderr)
                    break
                requests.extend(results)
                rounds.append(agg)
        if not requests:
            continue
        for r in requests:
            if reference_text is None:
                reference_text = r["text"]
            r["same_text_as_first"] = r["text"] == reference_text
        metrics = [per_request_metrics(r) for r in requests]
        level = {
            "concurrency": c,
            "requests": len(requests),
            "rounds": len(rounds),
            "ttft_s": summary([m["ttft_s"] for m in metrics]),
            "gen_tps_per_stream": summary([m["gen_tps"] for m in metrics]),
            "pp_tps": summary([m["pp_tps"] for m in metrics]),
            "aggregate_gen_tps": summary([a["aggregate_gen_tps"] for a in rounds]),
            "end_to_end_tps": summary([a["end_to_end_tps"] for a in rounds]),
            "total_s": summary([m["total_s"] for m in metrics]),
            "prompt_tokens": summary([m["prompt_tokens"] for m in metrics]),
            "completion_tokens": summary([m["completion_tokens"] for m in metrics]),
            "chunks_per_request": summary([m["chunks"] for m in metrics]),
            "finish_reasons": sorted({m["finish_reason"] for m in metrics}),
            "outputs_identical": all(r["same_text_as_first"] for r in requests),
            "rss_peak_kib": rss.peak_kib,
            "rounds_detail": rounds,
        }
        out["streaming"].append(level)
        print(
            f"client: c={c}: ttft {level['ttft_s']['median'] * 1000:.0f} ms, "
            f"{level['gen_tps_per_stream']['median']:.1f} tok/s per stream, "
            f"{level['aggregate_gen_tps']['median']:.1f} tok/s aggregate ({len(rounds)} rounds)",
            file=sys.stderr,
        )

    sync = []
    with RssSampler(args.pid) as rss:
        for k in range(args.rounds):
            # runsync always gets one request, budget or not: it is one single-stream request.
            if k > 0 and time.perf_counter() - t_start > args.budget:
                out["skipped"].append(f"runsync request {k + 1}: over the {args.budget:.0f} s budget")
                break
            try:
                # Each runsync request right after one streamed request, so the
                # two meet the same machine (its speed drifts over minutes).
                srv0, cpu0 = server_cpu(args.pid), time.process_time()
                paired = per_request_metrics(stream_once(args, time.perf_counter() + args.timeout))
                srv1, cpu1 = server_cpu(args.pid), time.process_time()
                sync.append(runsync_once(args))
                srv2 = server_cpu(args.pid)
                sync[-1]["paired_stream_total"] = paired["total_s"]
                sync[-1]["paired_stream_tokens"] = paired["completion_tokens"]
                # This client's own CPU time for each (it shares the cores with the server).
                sync[-1]["paired_stream_client_cpu"] = cpu1 - cpu0
                sync[-1]["client_cpu"] = time.process_time() - cpu1
                # The server's CPU time for each, the text engine's apart.
                sync[-1]["paired_stream_server_cpu"] = server_cpu_delta(srv0, srv1)
                sync[-1]["server_cpu"] = server_cpu_delta(srv1, srv2)
            except (Failure, OSError) as e:
                out["skipped"].append(f"runsync request {k + 1}: {e}")
                break
    if not sync:
        out["runsync"] = None
        sync_total = None
    stream1 = next((lvl for lvl in out["streaming"] if lvl["concurrency"] == 1), None)
    if sync:
        runsync_summary(out, sync, stream1, reference_text, rss.peak_kib)
    out["final"] = proc_status(args.pid)
    out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    out["client_wall_s"] = time.perf_counter() - t_start
    json.dump(out, sys.stdout, indent=2)
    print()


def runsync_summary(out, sync, stream1, reference_text, rss_peak_kib):
    sync_total = summary([s["t_total"] for s in sync])
    sync_tokens = summary([s["completion_tokens"] for s in sync])
    out["runsync"] = {
        "requests": len(sync),
        "total_s": sync_total,
        "completion_tokens": sync_tokens,
        "prompt_tokens": summary([s["prompt_tokens"] for s in sync]),
        "execution_ms": summary([s["execution_ms"] for s in sync]),
        "delay_ms": summary([s["delay_ms"] for s in sync]),
        "end_to_end_tps": summary([s["completion_tokens"] / s["t_total"] for s in sync]),
        "same_text_as_streaming": reference_text is not None and all(s["text"] == reference_text for s in sync),
        "finish_reasons": sorted({str(s["finish_reason"]) for s in sync}),
        "rss_peak_kib": rss_peak_kib,
    }
    paired = [s["paired_stream_total"] for s in sync if "paired_stream_total" in s]
    if paired:
        # Same prompt, same greedy tokens, one right after the other: the
        # difference of total time is the cost of streaming them.
        out["runsync"]["paired_stream_total_s"] = summary(paired)
        out["runsync"]["paired_stream_client_cpu_s"] = summary([s["paired_stream_client_cpu"] for s in sync])
        out["runsync"]["client_cpu_s"] = summary([s["client_cpu"] for s in sync])
        diff = summary(paired)["median"] - sync_total["median"]
        out["runsync"]["sse_overhead_s"] = diff
        out["runsync"]["sse_overhead_ms_per_token"] = 1000 * diff / sync_tokens["median"]
        server_cpu_summary(out["runsync"], sync)
    elif stream1:
        diff = stream1["total_s"]["median"] - sync_total["median"]
        out["runsync"]["sse_overhead_s"] = diff
        out["runsync"]["sse_overhead_ms_per_token"] = 1000 * diff / sync_tokens["median"]


def server_cpu_summary(rs, sync):
    """The server's CPU per generated token outside the text engine, streamed
    and runsync, and the difference as a share of a token's decode time."""
    pairs = [s for s in sync if s.get("paired_stream_server_cpu") and s.get("server_cpu")
             and s.get("paired_stream_tokens") and s.get("completion_tokens")]
    if not pairs:
        return
    stream_ms = [1000 * s["paired_stream_server_cpu"]["platform"] / s["paired_stream_tokens"] for s in pairs]
    sync_ms = [1000 * s["server_cpu"]["platform"] / s["completion_tokens"] for s in pairs]
    engine_ms = [1000 * (s["server_cpu"]["total"] - s["server_cpu"]["platform"]) / s["completion_tokens"]
                 for s in pairs]
    token_ms = [1000 * s["t_total"] / s["completion_tokens"] for s in pairs]
    extra = [a - b for a, b in zip(stream_ms, sync_ms)]
    rs["server_cpu"] = {
        "platform_ms_per_token_stream": summary(stream_ms),
        "platform_ms_per_token_runsync": summary(sync_ms),
        "engine_ms_per_token_runsync": summary(engine_ms),
        "wall_ms_per_token_runsync": summary(token_ms),
        "stream_extra_ms_per_token": summary(extra),
        # CPU the server spends on streaming a token, over the wall time of a token
        "stream_extra_over_token_time": summary([e / t for e, t in zip(extra, token_ms)]),
        "platform_stream_over_token_time": summary([p / t for p, t in zip(stream_ms, token_ms)]),
    }


def pairs(args):
    """One streamed request and one llama.cpp generation run, alternately
    (which goes first alternates too), so that both meet the same machine:
    this VM's speed drifts over minutes, more than the difference measured.
    Unless --depth is given, llama.cpp generates after as many prompt tokens
    (-d) as the streamed request had, so both attend to the same cells."""
    cmd = shlex.split(args.bench_cmd)
    if args.depth is not None:
        cmd += ["-d", str(args.depth)]
    rows = []
    for k in range(args.pairs):
        row = {}
        for side in ("gantry", "llama") if k % 2 == 0 else ("llama", "gantry"):
            if side == "gantry":
                r = per_request_metrics(stream_once(args, time.perf_counter() + args.timeout))
                row["gantry_gen_tps"], row["gantry_tokens"] = r["gen_tps"], r["completion_tokens"]
                if args.depth is None and "-d" not in cmd:
                    cmd += ["-d", str(r["prompt_tokens"])]
            else:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=True)
                row["llama_tg_tps"] = next(x["avg_ts"] for x in json.loads(proc.stdout) if x.get("n_gen"))
        row["ratio"] = row["gantry_gen_tps"] / row["llama_tg_tps"]
        rows.append(row)
        print(f"client: pair {k + 1}: gantry {row['gantry_gen_tps']:.1f} tok/s, llama.cpp {row['llama_tg_tps']:.1f} "
              f"tok/s, ratio {row['ratio']:.2f}", file=sys.stderr)
    json.dump({"bench_cmd": shlex.join(cmd), "pairs": rows,
               "gantry_gen_tps": summary([r["gantry_gen_tps"] for r in rows]),
               "llama_tg_tps": summary([r["llama_tg_tps"] for r in rows]),
               "ratio": summary([r["ratio"] for r in rows])}, sys.stdout, indent=2)
    print()


def cost(args):
    """The platform's (non-engine threads') CPU per request and per token,
    streamed and runsync, from requests of two lengths."""
    short, long_ = (int(x) for x in args.lengths.split(","))
    samples = {}
    for k in range(args.rounds):
        for n in (short, long_):
            args.max_tokens = n
            for mode in ("stream", "runsync") if k % 2 == 0 else ("runsync", "stream"):
                before = server_cpu(args.pid)
                if mode == "stream":
                    r = stream_once(args, time.perf_counter() + args.timeout)
                else:
                    r = runsync_once(args)
                # the engine's threads spin a moment after the last decode,
                # and the settlement lands just after the answer
                time.sleep(args.settle)
                d = server_cpu_delta(before, server_cpu(args.pid))
                if d is None:
                    raise Failure("the server's /proc entries are gone")
                samples.setdefault(f"{mode}@{n}", []).append(
                    {"platform_ms": d["platform"] * 1000, "tokens": r["completion_tokens"]})
    fits = {}
    for mode in ("stream", "runsync"):
        a, b = samples[f"{mode}@{short}"], samples[f"{mode}@{long_}"]
        cpu_a = statistics.median(x["platform_ms"] for x in a)
        cpu_b = statistics.median(x["platform_ms"] for x in b)
        tok_a = statistics.median(x["tokens"] for x in a)
        tok_b = statistics.median(x["tokens"] for x in b)
        if tok_b <= tok_a:
            raise Failure(f"{mode}: the long requests ended as early as the short ones ({tok_a} tokens)")
        per_token = (cpu_b - cpu_a) / (tok_b - tok_a)
        fits[mode] = {"per_token_ms": per_token, "per_request_ms": cpu_a - per_token * tok_a}
        print(f"client: {mode}: {per_token * 1000:.0f} us per token, {fits[mode]['per_request_ms']:.1f} ms per request "
              f"(platform CPU, medians of {len(a)} at {tok_a:.0f} and {tok_b:.0f} tokens)", file=sys.stderr)
    json.dump({"samples": samples, "fits": fits}, sys.stdout, indent=2)
    print()


# ---------------------------------------------------------------- report


def fmt(v, digits=1, scale=1.0):
    return "–" if v is None else f"{v * scale:.{digits}f}"


def med(d, key):
    return (d.get(key) or {}).get("median")


def spread(d, key, digits=1, scale=1.0):
    """median (min–max), to show how much a figure moved between requests or rounds."""
    v = d.get(key) or {}
    if v.get("median") is None:
        return "–"
    if v.get("n", 1) < 2:
        return fmt(v["median"], digits, scale)
    return f"{fmt(v['median'], digits, scale)} ({fmt(v['min'], digits, scale)}–{fmt(v['max'], digits, scale)})"


def llama_bench_summary(rows):
    """{"pp": t/s, "tg": t/s, ...} from gantry-llama-bench's (or upstream llama-bench's) JSON rows."""
    entry = {}
    for row in rows:
        kind = "pp" if row.get("n_prompt") and not row.get("n_gen") else "tg"
        if (row.get("n_parallel") or 1) > 1:
            kind = f"tg_npl{row['n_parallel']}"
        entry[kind] = row["avg_ts"]
        entry[kind + "_stddev"] = row.get("stddev_ts")
        entry[kind + "_test"] = row.get("test") or f"{kind}{row.get('n_prompt') or row.get('n_gen')}"
        entry["threads"] = row.get("n_threads")
        entry["system_info"] = row.get("system_info")
    return entry


def combine(args):
    """One document: meta (KEY=VALUE pairs), the client's result, llama-bench runs and the ratios."""
    doc = {"meta": dict(kv.split("=", 1) for kv in args.meta), "gantry": json.load(open(args.client))}
    bench = {}
    for item in args.llama_bench:
        label, path = item.split("=", 1)
        try:
            rows = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"client: cannot read {path}: {e}", file=sys.stderr)
            continue
        bench[label] = {"summary": llama_bench_summary(rows), "rows": rows}
    doc["llama_bench"] = bench
    if args.pairs:
        try:
            doc["pairs"] = json.load(open(args.pairs))
        except (OSError, ValueError) as e:
            print(f"client: cannot read {args.pairs}: {e}", file=sys.stderr)
    g = doc["gantry"]
    s1 = next((lvl for lvl in g["streaming"] if lvl["concurrency"] == 1), None)
    agg = {lvl["concurrency"]: med(lvl, "aggregate_gen_tps") for lvl in g["streaming"]}
    ratios = {}
    if agg.get(1):
        for c, v in agg.items():
            if c != 1 and v:
                ratios[f"aggregate_gen_at_{c}_over_single"] = v / agg[1]
    for label, b in bench.items():
        tg, pp = b["summary"].get("tg"), b["summary"].get("pp")
        if s1 and tg:
            ratios[f"single_stream_gen_over_llama_bench_tg_{label}"] = med(s1, "gen_tps_per_stream") / tg
        if s1 and pp:
            ratios[f"single_stream_prompt_tps_over_llama_bench_pp_{label}"] = med(s1, "pp_tps") / pp
        for c in agg:
            npl = b["summary"].get(f"tg_npl{c}")
            if npl and tg:
                ratios[f"llama_bench_{label}_tg_npl{c}_over_tg"] = npl / tg
            if npl and agg[c]:
                ratios[f"aggregate_gen_at_{c}_over_llama_bench_tg_npl{c}_{label}"] = agg[c] / npl
    doc["ratios"] = ratios
    json.dump(doc, sys.stdout, indent=2)
    print()


def report(args):
    doc = json.load(open(args.result))
    res, bench, meta, ratios = doc["gantry"], doc.get("llama_bench", {}), doc.get("meta", {}), doc.get("ratios", {})
    lines = []
    add = lines.append
    add(f"Machine: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores; gantry {meta.get('binary', '?')}, "
        f"GANTRY_TEXT__THREADS={meta.get('threads', '?')}; load average before {' '.join(res['loadavg_before'])}, "
        f"after {' '.join(res['loadavg_after'])}")
    add("")
    p_tok = med(res["streaming"][0], "prompt_tokens") if res["streaming"] else None
    add(f"Streaming chat completions (OpenAI route), max_tokens {res['max_tokens']}, temperature 0, "
        f"{fmt(p_tok, 0)} prompt tokens after the chat template, up to {res['rounds']} rounds per level; medians (min–max over requests, or rounds for aggregate):")
    add("")
    add("| streams | rounds | TTFT ms | prompt tok/s (≈ prompt/TTFT) | gen tok/s per stream | aggregate gen tok/s "
        "| end-to-end tok/s | completion tokens | peak RSS MiB |")
    add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lvl in res["streaming"]:
        add(f"| {lvl['concurrency']} | {lvl.get('rounds', '?')} | {spread(lvl, 'ttft_s', 0, 1000)} | {fmt(med(lvl, 'pp_tps'))} "
            f"| {spread(lvl, 'gen_tps_per_stream')} | {spread(lvl, 'aggregate_gen_tps')} "
            f"| {fmt(med(lvl, 'end_to_end_tps'))} | {fmt(med(lvl, 'completion_tokens'), 0)} "
            f"| {fmt(lvl['rss_peak_kib'], 1, 1 / 1024)} |")
    rs = res.get("runsync") or {}
    s1 = next((lvl for lvl in res["streaming"] if lvl["concurrency"] == 1), None)
    add("")
    add("One request at a time, streamed vs not (medians, min–max):")
    add("")
    add("| route | total s | completion tokens | end-to-end tok/s | job execution ms |")
    add("| --- | ---: | ---: | ---: | ---: |")
    if s1:
        add(f"| openai chat, stream | {spread(s1, 'total_s', 3)} | {fmt(med(s1, 'completion_tokens'), 0)} "
            f"| {fmt(med(s1, 'completion_tokens') / med(s1, 'total_s'))} | – |")
    if rs.get("paired_stream_total_s"):
        add(f"| openai chat, stream, each just before a runsync | {spread(rs, 'paired_stream_total_s', 3)} "
            f"| {fmt(med(rs, 'completion_tokens'), 0)} "
            f"| {fmt(med(rs, 'completion_tokens') / med(rs, 'paired_stream_total_s'))} | – |")
    if rs:
        add(f"| runsync | {spread(rs, 'total_s', 3)} | {fmt(med(rs, 'completion_tokens'), 0)} "
            f"| {fmt(med(rs, 'end_to_end_tps'))} | {fmt(med(rs, 'execution_ms'), 0)} |")
        if "sse_overhead_ms_per_token" in rs:
            add("")
            add(f"SSE overhead, (paired stream total − runsync total) / tokens: {rs['sse_overhead_ms_per_token']:.3f} ms "
                f"per token ({rs['sse_overhead_s'] * 1000:.1f} ms per request); same text both ways: "
                f"{rs['same_text_as_streaming']}")
            if rs.get("paired_stream_client_cpu_s"):
                add(f"This client's own CPU time per request (it shares the cores with the server): streamed "
                    f"{med(rs, 'paired_stream_client_cpu_s') * 1000:.1f} ms, runsync {med(rs, 'client_cpu_s') * 1000:.1f} ms")
            sc = rs.get("server_cpu")
            if sc:
                add(f"The server's own CPU time per generated token outside the text engine (threads not named "
                    f"text-engine-*): streamed {med(sc, 'platform_ms_per_token_stream'):.3f} ms, runsync "
                    f"{med(sc, 'platform_ms_per_token_runsync'):.3f} ms; streaming adds "
                    f"{med(sc, 'stream_extra_ms_per_token'):.3f} ms per token = "
                    f"{100 * med(sc, 'stream_extra_over_token_time'):.2f} % of a token's time "
                    f"({med(sc, 'wall_ms_per_token_runsync'):.2f} ms); all of the platform's CPU while streaming is "
                    f"{100 * med(sc, 'platform_stream_over_token_time'):.2f} % of it. The engine's threads used "
                    f"{med(sc, 'engine_ms_per_token_runsync'):.2f} ms of CPU per token.")
    add("")
    for note in res.get("skipped") or []:
        add(f"Not measured: {note}")
    if res.get("skipped"):
        add("")
    add(f"Server memory: VmRSS idle with the model loaded {fmt(res['idle']['VmRSS'], 1, 1 / 1024)} MiB, "
        f"at the end {fmt(res['final']['VmRSS'], 1, 1 / 1024)} MiB, VmHWM {fmt(res['final']['VmHWM'], 1, 1 / 1024)} MiB")
    if bench:
        add("")
        add(f"Plain llama.cpp, same weights and source (llama-bench method, -p/-n as listed, "
            f"{next(iter(bench.values()))['summary'].get('threads')} threads, run after the server stopped):")
        add("")
        add("| llama.cpp build | pp t/s | tg t/s | gantry gen/stream@1 ÷ tg | gantry prompt t/s@1 ÷ pp |")
        add("| --- | ---: | ---: | ---: | ---: |")
        for label, b in bench.items():
            sm = b["summary"]
            add(f"| {label} | {sm.get('pp_test', 'pp')}: {fmt(sm.get('pp'))} ± {fmt(sm.get('pp_stddev'))} "
                f"| {sm.get('tg_test', 'tg')}: {fmt(sm.get('tg'))} ± {fmt(sm.get('tg_stddev'))} "
                f"| {fmt(ratios.get(f'single_stream_gen_over_llama_bench_tg_{label}'), 2)} "
                f"| {fmt(ratios.get(f'single_stream_prompt_tps_over_llama_bench_pp_{label}'), 2)} |")
    pr = doc.get("pairs")
    if pr and pr.get("pairs"):
        add("")
        add(f"Single stream against llama.cpp, alternating (one streamed request, then `{pr['bench_cmd']}` "
            f"with the server idle, {len(pr['pairs'])} pairs): gantry {spread(pr, 'gantry_gen_tps')} tok/s, llama.cpp "
            f"{spread(pr, 'llama_tg_tps')} tok/s, ratio per pair {spread(pr, 'ratio', 2)} (median, min–max)")
    agg_ratios = [(k, v) for k, v in ratios.items() if k.startswith("aggregate_gen_at_") and k.endswith("_over_single")]
    if agg_ratios:
        add("")
        add("Aggregate gen tok/s over single stream, gantry: " + ", ".join(
            f"@{k.split('_')[3]}: {v:.2f}" for k, v in agg_ratios))
    levels = sorted({lvl["concurrency"] for lvl in res["streaming"]} - {1})
    if any(b["summary"].get(f"tg_npl{c}") for b in bench.values() for c in levels):
        add("")
        add("Same streams as one llama.cpp batch (gantry-llama-bench --npl: one token for each of N sequences "
            "per decode, from an empty cache):")
        add("")
        add("| llama.cpp build | " + " | ".join(f"tg@{c} t/s | ÷ tg | gantry aggregate@{c} ÷ it" for c in levels) + " |")
        add("| --- |" + " ---: | ---: | ---: |" * len(levels))
        for label, b in bench.items():
            cells = []
            for c in levels:
                cells += [fmt(b["summary"].get(f"tg_npl{c}")),
                          fmt(ratios.get(f"llama_bench_{label}_tg_npl{c}_over_tg"), 2),
                          fmt(ratios.get(f"aggregate_gen_at_{c}_over_llama_bench_tg_npl{c}_{label}"), 2)]
            add(f"| {label} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    # what every subcommand that sends requests takes
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--url", default="http://127.0.0.1:18081")
    server.add_argument("--key", required=True)
    server.add_argument("--model", default="smollm2-135m-instruct")
    server.add_argument("--max-tokens", type=int, default=128)
    server.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    server.add_argument("--prompt", default=PROMPT)
    m = sub.add_parser("measure", parents=[server])
    m.add_argument("--pid", type=int, required=True, help="the server's pid, for its memory and CPU time")
    m.add_argument("--concurrency", default="1,4,16")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--warmup", type=int, default=1)
    m.add_argument("--budget", type=float, default=300.0,
                   help="seconds; no new round starts after this (one runsync request always runs)")
    pa = sub.add_parser("pairs", parents=[server])
    pa.add_argument("--pairs", type=int, default=6)
    pa.add_argument("--bench-cmd", required=True, help="a llama-bench command line with -o json (one tg test)")
    pa.add_argument("--depth", type=int,
                    help="llama.cpp's -d (default: the streamed request's prompt tokens)")
    co = sub.add_parser("cost", parents=[server])
    co.add_argument("--pid", type=int, required=True, help="the server's pid, for its CPU time")
    co.add_argument("--rounds", type=int, default=6)
    co.add_argument("--lengths", default="16,128", help="two max_tokens values (they replace --max-tokens)")
    co.add_argument("--settle", type=float, default=0.3, help="seconds to wait after each request")
    c = sub.add_parser("combine")
    c.add_argument("--pairs", help="the pairs subcommand's output")
    c.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("client", help="measure's output")
    c.add_argument("llama_bench", nargs="*", metavar="LABEL=FILE", help="llama-bench -o json outputs")
    r = sub.add_parser("report")
    r.add_argument("result", help="combine's output")
    args = ap.parse_args()
    try:
        {"measure": measure, "cost": cost, "pairs": pairs, "combine": combine, "report": report}[args.cmd](args)
    except Failure as e:
        print(f"client: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
