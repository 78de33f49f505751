"""Serverless endpoints, measured as a user sees them (bench/serverless/run.sh
runs this with the venv that has runpod-python and aiohttp).

1. Cold start: an endpoint at 0 workers, its image present; from the first
   `runsync` to its result, split into the container's start (the fleet
   reacting and `docker run`), the SDK's start (from the container's start to
   its first line of output) and the rest (first take, the job, the result).
2. Per-job cost at 1 worker: sequential `runsync` of a no-op handler, p50,
   through Gantry and through the minimal in-memory server of the same
   protocol (mini_server.py), with the same runpod-python worker.
3. Throughput with 8 no-op workers: 32 concurrent `runsync` loops, jobs/s
   through Gantry and through the mini server.
4. Gantry's memory per idle endpoint: RSS before and after creating 500
   endpoints (no workers), after a few reconciler ticks.

Workers of 2-4 run as host processes (`gantry endpoints worker-env`), so
both servers get the very same workers. Prints a Markdown report.

Usage: python run.py GANTRY_BINARY
"""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
IMAGE = "gantry-test/runpod-worker:1"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(check, what, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


class Gantry:
    def __init__(self, binary, work):
        self.binary = binary
        self.data = os.path.join(work, "data")
        os.makedirs(self.data)
        self.mgmt, self.pub, self.grpc = free_port(), free_port(), free_port()
        self.env = dict(
            os.environ,
            GANTRY_DATA_DIR=self.data,
            GANTRY_MANAGEMENT_ADDR=f"127.0.0.1:{self.mgmt}",
            GANTRY_PUBLIC_ADDR=f"127.0.0.1:{self.pub}",
            GANTRY_SCHEDULER__ADDR=f"127.0.0.1:{self.grpc}",
            GANTRY_SCHEDULER__BUNDLED_WORKERS="[]",
            GANTRY_PULL_ON_START="false",
            GANTRY_BILLING__REQUIRE_CREDIT="false",
            GANTRY_LOG="warn,gantry=info",
            GANTRY_SERVERLESS__DOCKER_HOST=os.environ["DOCKER_HOST"],
            **{f"GANTRY_RATE_LIMITS__{surface}__{window}": "100000000"
               for surface in ("PUBLIC", "MANAGEMENT") for window in ("MINUTE", "HOUR", "DAY")},
        )
        self.log = open(os.path.join(work, "serve.log"), "w")
        self.proc = subprocess.Popen([binary, "serve"], env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.key = None

        def ready():
            with open(self.log.name) as f:
                found = re.search(r"gk_[A-Za-z0-9]+", f.read())
            if found:
                self.key = found.group(0)
                return self.get("/healthz", auth=False) is not None
            return False

        wait_until(ready, "gantry serve")

    def request(self, method, url, body=None, auth=True):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=300) as res:
                text = res.read()
                return json.loads(text) if text else {}
        except OSError:
            return None

    def get(self, path, auth=True):
        return self.request("GET", f"http://127.0.0.1:{self.mgmt}{path}", auth=auth)

    def api(self, method, path, body=None):
        return self.request(method, f"http://127.0.0.1:{self.mgmt}{path}", body)

    def runsync(self, endpoint, payload):
        return self.request("POST", f"http://127.0.0.1:{self.pub}/v2/{endpoint}/runsync?wait=300000",
                            {"input": payload})

    def endpoint(self, name, workers):
        body = {"name": name, "type": "QUEUE", "image": IMAGE, "cpu": [{"id": "cpu3c", "vcpuCount": 2}],
                "workers": workers, "scaling": {"type": "QUEUE_DELAY", "queueDelay": 0.5}}
        created = self.api("POST", "/v2/serverless", body)
        if not created or "id" not in created:
            raise SystemExit(f"endpoint not created: {created}")
        return created["id"]

    def worker_env(self, endpoint, worker_id, base):
        out = subprocess.run([self.binary, "endpoints", "worker-env", endpoint, "--worker-id", worker_id,
                              "--base-url", base], env=self.env, check=True, capture_output=True, text=True)
        return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metric(self, series):
        """One sample of /metrics by its exact series (`name{labels}`), 0 when absent."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.mgmt}/metrics")
        with urllib.request.urlopen(req, timeout=30) as res:
            for line in res.read().decode().splitlines():
                if line.startswith(series + " "):
                    return float(line.split()[-1])
        return 0.0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def docker(*args):
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def engine_cpu_seconds():
    """CPU time of the container engine's daemon (dockerd), 0 when none is found."""
    out = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    total = 0.0
    for pid in out:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def rfc3339(text):
    """Seconds since the epoch of Docker's RFC 3339 time (nanoseconds cut to microseconds)."""
    text = text.strip().replace("Z", "+00:00")
    head, frac, zone = re.match(r"^(.*?T\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)$", text).groups()
    frac = (frac or "0")[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{head}.{frac}{zone}").timestamp()


def spawn_workers(envs, script):
    procs = []
    for env in envs:
        procs.append(subprocess.Popen([PY, "-u", os.path.join(HERE, script)], env=dict(os.environ, **env),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    return procs


def kill_workers(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def say(text):
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load(*args):
    say(f"load {' '.join(map(str, args[:1] + args[3:]))} against {args[1]}")
    out = subprocess.run([PY, os.path.join(HERE, "load.py"), *map(str, args)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)


def cold_starts(g, runs=3):
    rows = []
    for i in range(runs):
        ep = g.endpoint(f"cold-{i}", {"min": 0, "max": 1, "idleTimeout": 60})
        t0 = time.time()
        done = g.runsync(ep, {"cold": i})
        t1 = time.time()
        assert done and done.get("status") == "COMPLETED", done
        cid = docker("ps", "-q", "--filter", f"label=gantry.id={ep}")
        started = rfc3339(docker("inspect", "-f", "{{.State.StartedAt}}", cid))
        first_line = docker("logs", "--timestamps", cid).splitlines()
        first = rfc3339(first_line[0].split(" ", 1)[0]) if first_line else started
        rows.append({"total": t1 - t0, "container": started - t0, "sdk": first - started, "rest": t1 - first})
        g.api("DELETE", f"/v2/serverless/{ep}")
    return rows


def main():
    binary = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="gantry-bench-serverless-")
    g = Gantry(binary, work)
    report = {}
    try:
        say(f"gantry serve at {g.mgmt}/{g.pub}, work dir {work}")
        report["cold"] = cold_starts(g, runs=int(os.environ.get("COLD_RUNS", "3")))
        # The same workers against Gantry and against the mini server (a
        # fresh one per phase: it has no leases, so a job a killed worker
        # had taken would never come back).
        clients = int(os.environ.get("CLIENTS", "16"))
        for name in ("gantry", "mini"):
            for phase, workers in (("latency", 1), ("throughput", 8)):
                # An endpoint per phase: a killed worker's take may stay open
                # on the server (actix does not drop a handler whose client
                # went away), and it must not be handed the next phase's jobs.
                ep = g.endpoint(f"hot-{name}-{phase}", {"min": 0, "max": 0})
                mini = None
                if name == "mini":
                    port = free_port()
                    mini_log = open(os.path.join(work, f"mini-{phase}.log"), "w")
                    mini = subprocess.Popen([PY, os.path.join(HERE, "mini_server.py"), str(port)],
                                            stdout=mini_log, stderr=subprocess.STDOUT)
                    wait_until(lambda: socket.create_connection(("127.0.0.1", port)).close() is None,
                               "mini server")
                else:
                    port = g.pub
                base = f"http://127.0.0.1:{port}"
                url = f"{base}/v2/{ep}/runsync"
                procs = spawn_workers([g.worker_env(ep, f"wk_{name}_{phase}_{i}", base) for i in range(workers)],
                                      "noop.py")
                if phase == "latency":
                    report[f"latency_{name}"] = load("latency", url, g.key, int(os.environ.get("LATENCY_JOBS", "300")))
                else:
                    cpu, engine, looks = g.cpu_seconds(), engine_cpu_seconds(), g.metric("gantry_reconciler_looks_total")
                    result = load("throughput", url, g.key, clients, float(os.environ.get("SECONDS", "20")))
                    result["engine_cpu_ms_per_job"] = round((engine_cpu_seconds() - engine) * 1000 / result["jobs"], 2)
                    if name == "gantry":
                        result["gantry_cpu_ms_per_job"] = round((g.cpu_seconds() - cpu) * 1000 / result["jobs"], 2)
                        result["reconciler_looks_per_job"] = round(
                            (g.metric("gantry_reconciler_looks_total") - looks) / result["jobs"], 3)
                    report[f"throughput_{name}"] = result
                kill_workers(procs)
                if mini is not None:
                    mini.kill()
                    mini.wait()
        time.sleep(2)
        before = g.rss_kib()
        for i in range(500):
            g.endpoint(f"idle-{i}", {"min": 0, "max": 0})
        time.sleep(5)
        after = g.rss_kib()
        report["memory"] = {"before_kib": before, "after_kib": after, "endpoints": 500,
                            "per_endpoint_kib": round((after - before) / 500, 2)}
    finally:
        g.stop()
    cold = report["cold"]
    med = lambda key: statistics.median(r[key] for r in cold) * 1000
    print(json.dumps(report, indent=1))
    print()
    print("| measure | Gantry | mini server |")
    print("|---|---|---|")
    print(f"| cold start, first runsync to result (median of {len(cold)}) | {med('total'):.0f} ms "
          f"(container {med('container'):.0f}, SDK start {med('sdk'):.0f}, first take and job {med('rest'):.0f}) | |")
    lg, lm = report["latency_gantry"], report["latency_mini"]
    print(f"| runsync p50 / p90 at 1 worker (no-op) | {lg['p50_ms']} / {lg['p90_ms']} ms | "
          f"{lm['p50_ms']} / {lm['p90_ms']} ms |")
    tg, tm = report["throughput_gantry"], report["throughput_mini"]
    print(f"| jobs/s, 8 workers (4 slots each), {tg['concurrency']} clients | {tg['jobs_per_s']} ({tg['jobs_per_s'] / tm['jobs_per_s']:.2f}x) | "
          f"{tm['jobs_per_s']} |")
    print(f"| Gantry's CPU per job, 8 workers | {tg['gantry_cpu_ms_per_job']} ms | |")
    print(f"| the engine's (dockerd) CPU per job, 8 workers | {tg['engine_cpu_ms_per_job']} ms | "
          f"{tm['engine_cpu_ms_per_job']} ms |")
    print(f"| reconciler looks per job, 8 workers | {tg['reconciler_looks_per_job']} | |")
    m = report["memory"]
    print(f"| RSS per idle endpoint (500 endpoints) | {m['per_endpoint_kib']} KiB | |")


if __name__ == "__main__":
    main()
