#!/usr/bin/env python3
"""Plays a video file in headless Chromium and prints what the browser saw.

    play_in_chromium.py VIDEO.mp4 [TIMEOUT_S]

Prints one JSON object: {"ended": true, "duration": s, "width": w,
"height": h, "frames": n, "error": null}. Exits 1 unless the video played to
its end without a media error. Chromium is driven over its DevTools pipe
(--remote-debugging-pipe: NUL-separated JSON on file descriptors 3 and 4),
so no WebSocket client or driver package is needed.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

PAGE = """<!doctype html><html><body><video id="v" muted playsinline></video></body></html>"""

WATCH = """
new Promise((resolve) => {
  const v = document.getElementById('v');
  const done = (error) => {
    const q = v.getVideoPlaybackQuality ? v.getVideoPlaybackQuality() : {};
    resolve(JSON.stringify({ended: v.ended, duration: v.duration, width: v.videoWidth,
      height: v.videoHeight, frames: q.totalVideoFrames || 0, error}));
  };
  v.addEventListener('ended', () => done(null));
  v.addEventListener('error', () => done('media error ' + (v.error ? v.error.code + ' ' + v.error.message : '')));
  v.src = 'clip.mp4';
  v.play().catch((e) => done('play() refused: ' + e));
})
"""


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium on PATH (Debian: apt-get install chromium)")


def main():
    video = pathlib.Path(sys.argv[1]).resolve()
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        site = pathlib.Path(tmp)
        (site / "index.html").write_text(PAGE)
        shutil.copy(video, site / "clip.mp4")
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def wire():
            # copies first: a pipe end may already be 3 or 4, and dup2 onto
            # itself would keep its close-on-exec flag
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        proc = subprocess.Popen(
            [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--autoplay-policy=no-user-gesture-required", "--allow-file-access-from-files",
             f"--user-data-dir={site / 'profile'}", "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=wire,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        out = os.fdopen(to_browser_w, "wb", buffering=0)
        inp = os.fdopen(from_browser_r, "rb", buffering=0)
        pending = b""
        counter = [0]

        def call(method, params=None, session=None):
            counter[0] += 1
            message = {"id": counter[0], "method": method, "params": params or {}}
            if session:
                message["sessionId"] = session
            out.write(json.dumps(message).encode() + b"\0")
            nonlocal pending
            while True:
                while b"\0" not in pending:
                    chunk = inp.read(65536)
                    if not chunk:
                        raise RuntimeError("Chromium closed its DevTools pipe")
                    pending += chunk
                raw, pending = pending.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == counter[0]:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]

        import threading
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            target = call("Target.createTarget", {"url": (site / "index.html").as_uri()})["targetId"]
            session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            # The new tab starts on about:blank and then loads the page, which
            # replaces the JavaScript context: wait until the page's own is there.
            import time
            while True:
                try:
                    ready = call("Runtime.evaluate", {"expression": "document.readyState === 'complete' && !!document.getElementById('v')", "returnByValue": True}, session)
                    if ready["result"].get("value") is True:
                        break
                except RuntimeError as error:
                    if "context" not in str(error):
                        raise
                time.sleep(0.05)
            result = call("Runtime.evaluate", {"expression": WATCH, "awaitPromise": True, "returnByValue": True}, session)
            seen = json.loads(result["result"]["value"])
        except RuntimeError as error:
            seen = {"ended": False, "error": f"DevTools: {error}"}
        finally:
            killer.cancel()
            try:
                call("Browser.close")
            except Exception:
                pass
            proc.kill()
            proc.wait()
    print(json.dumps(seen))
    sys.exit(0 if seen.get("ended") and not seen.get("error") else 1)


if __name__ == "__main__":
    main()
