"""Pods, measured as a user sees them (bench/pods/run.sh runs this).

1. Start: from `POST /v2/pods` to the pod reading RUNNING (polled every
   5 ms), its image present, beside `docker run -d` of the same image and
   command on the same engine, alternating, N rounds each; p50 and max.
2. Listing: `GET /v2/pods` of an account with 100 pods, over one keep-alive
   connection, 200 requests; p50 and p99.

Uses the `Gantry` process wrapper of bench/serverless/run.py (the release
binary as its own process, `gantry serve` with the embedded SQLite).
Prints a Markdown report.

Usage: python run.py GANTRY_BINARY
"""
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serverless"))
from run import Gantry  # noqa: E402

IMAGE = "gantry-test/busybox:1"
ROUNDS = int(os.environ.get("ROUNDS", "15"))
LISTED = 100


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def pod_body(name):
    return {"name": name, "image": IMAGE, "args": "sleep 3600", "cpu": {"id": "cpu3c", "vcpuCount": 2}}


def start_once(g, i):
    t0 = time.perf_counter()
    pod = g.api("POST", "/v2/pods", pod_body(f"bench-{i}"))
    if not pod or "id" not in pod:
        raise SystemExit(f"pod not created: {pod}")
    while True:
        view = g.get(f"/v2/pods/{pod['id']}")
        if view and view.get("status") == "RUNNING":
            elapsed = time.perf_counter() - t0
            break
        if view and view.get("status") == "ERROR":
            raise SystemExit(f"pod failed: {view}")
        time.sleep(0.005)
    g.api("DELETE", f"/v2/pods/{pod['id']}")
    return elapsed


def docker_once(i):
    name = f"bench-docker-{os.getpid()}-{i}"
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", IMAGE, "sleep", "3600"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - t0
    subprocess.run(["docker", "rm", "-f", name], check=True, capture_output=True)
    return elapsed


def wait_gone(g):
    for _ in range(600):
        out = subprocess.run(["docker", "ps", "-aq", "--filter", "label=gantry.kind=pod"],
                             capture_output=True, text=True).stdout.split()
        if not out:
            return
        time.sleep(0.1)


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        g = Gantry(binary, work)
        try:
            ours, theirs = [], []
            start_once(g, -1)  # warm: the image check, the first connections
            docker_once(-1)
            for i in range(ROUNDS):
                ours.append(start_once(g, i))
                theirs.append(docker_once(i))
            wait_gone(g)

            ids = []
            for i in range(LISTED):
                pod = g.api("POST", "/v2/pods", pod_body(f"listed-{i}"))
                ids.append(pod["id"])
            conn = http.client.HTTPConnection("127.0.0.1", g.mgmt)
            headers = {"Authorization": f"Bearer {g.key}"}
            lat = []
            for _ in range(200):
                t0 = time.perf_counter()
                conn.request("GET", "/v2/pods", headers=headers)
                body = conn.getresponse().read()
                lat.append(time.perf_counter() - t0)
            listed = len(json.loads(body)["pods"])
            for pod_id in ids:
                g.api("DELETE", f"/v2/pods/{pod_id}")
            wait_gone(g)
        finally:
            g.stop()

    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    print(f"# Pods on Docker, {datetime.now().strftime('%Y-%m-%d')}\n")
    print("| measure | Gantry | peer | goal |")
    print("|---|---|---|---|")
    diff = statistics.median(ours) - statistics.median(theirs)
    print(f"| start to RUNNING, p50 (max) of {ROUNDS} | {ms(statistics.median(ours))} ({ms(max(ours))}) "
          f"| `docker run -d`: {ms(statistics.median(theirs))} ({ms(max(theirs))}) "
          f"| within 300 ms of docker run: {'met' if diff <= 0.3 else 'missed'} ({diff * 1000:+.0f} ms) |")
    print(f"| `GET /v2/pods` of {listed} pods, p50 (p99) | {lat and f'{statistics.median(lat) * 1000:.2f} ms'} "
          f"({pct(lat, 0.99) * 1000:.2f} ms) | | under 5 ms p50: "
          f"{'met' if statistics.median(lat) < 0.005 else 'missed'} |")


if __name__ == "__main__":
    main()
