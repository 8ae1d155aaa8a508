"""A real headless Chromium driven over the DevTools protocol (no WebDriver, no browser download).

``chromium_binary()`` finds the Debian ``chromium`` package's binary, installing it with apt-get when
it is missing (root only); it returns ``(None, reason)`` when that is impossible, so tests can skip
with the reason. ``Browser`` launches it on a private profile, opens one page and exposes the few
DevTools calls the viewer tests need: navigate, evaluate, a real mouse click, a screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.request import urlopen

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _find() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


def chromium_binary() -> tuple[str | None, str]:
    """(path to a Chromium binary, "") or (None, why there is none)."""
    found = _find()
    if found:
        return found, ""
    if os.environ.get("MEMORYWALKER_NO_APT"):
        return None, "chromium not installed and MEMORYWALKER_NO_APT is set"
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return None, "chromium not installed and apt-get is unavailable or not root"
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=300, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, capture_output=True,
                       timeout=600, env=env)
    except (subprocess.SubprocessError, OSError) as e:
        tail = (getattr(e, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()[-1:]
        return None, f"chromium could not be installed with apt-get: {type(e).__name__} {' '.join(tail)}"
    found = _find()
    return (found, "") if found else (None, "apt-get installed chromium but no binary was found")


class Browser:
    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        import websocket  # websocket-client (dev extra)

        self.profile = tempfile.mkdtemp(prefix="mw-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             f"--window-size={width},{height}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urlopen(f"http://127.0.0.1:{port}/json", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params):
        i = next(self._ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str, ready: str = "document.body && document.body.dataset.ready === '1'",
             timeout: float = 60) -> float:
        """Open ``url`` and wait until ``ready`` is true; return the seconds it took."""
        t0 = time.monotonic()
        self.send("Page.navigate", url=url)
        while not self.eval(f"!!({ready})"):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{url} not ready after {timeout}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def eval(self, expression: str):
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails'].get('text')} "
                               f"{r['exceptionDetails'].get('exception', {}).get('description', '')}")
        return r["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed + released) at the centre of the first element matching ``selector``."""
        box = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                        " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
