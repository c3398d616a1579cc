"""A real headless Chromium (Debian's `chromium`), driven over the Chrome
DevTools Protocol's websocket: load a page, read the DOM as the browser
built it, submit a form, take a screenshot, and see every request the page
made. Every host but 127.0.0.1 resolves to nothing, so a page that fetches
a CDN script, a font or an image from outside fails to.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from websockets.sync.client import connect

BLOCK_OUTSIDE = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def chromium() -> str | None:
    return shutil.which("chromium")


class Browser:
    """One headless Chromium and one tab. Use as a context manager: the
    process (and its profile directory) is gone when it exits."""

    def __init__(self, width: int = 1440, height: int = 900) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="spotbroker-chromium-"))
        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
             f"--host-resolver-rules={BLOCK_OUTSIDE}", f"--window-size={width},{height}",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.events: list[dict] = []
        self._ids = itertools.count(1)
        try:
            self.ws = connect(self._endpoint(), max_size=None, open_timeout=20)
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log"):
                self.call(f"{domain}.enable", session=True)
        except BaseException:
            self.close()
            raise

    def _endpoint(self, timeout: float = 30) -> str:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} before it listened")
            if port_file.exists():
                lines = port_file.read_text().split()
                if len(lines) >= 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port")

    def call(self, method: str, session: bool = False, timeout: float = 30, **params) -> dict:
        msg_id = next(self._ids)
        message = {"id": msg_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, after: int, timeout: float = 30) -> dict:
        """The first `method` event after the first `after` events seen."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[after:]:
                if event["method"] == method:
                    return event
            reply = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if "method" in reply:
                self.events.append(reply)

    def _loaded(self, mark: int) -> None:
        """Wait for the navigation begun after `mark` to commit and load."""
        self.wait_event("Page.frameNavigated", mark)
        committed = next(i for i, e in enumerate(self.events) if i >= mark and e["method"] == "Page.frameNavigated")
        self.wait_event("Page.loadEventFired", committed + 1)

    def goto(self, url: str) -> None:
        mark = len(self.events)
        self.call("Page.navigate", session=True, url=url)
        self._loaded(mark)

    def submit(self, selector: str, fields: dict[str, str]) -> None:
        """Fill a form's fields and submit it as a person would (a POST
        navigation, with the browser's own Origin and cookies)."""
        mark = len(self.events)
        fill = "".join(f"f.elements[{json.dumps(k)}].value = {json.dumps(v)};" for k, v in fields.items())
        self.evaluate(f"(() => {{ const f = document.querySelector({json.dumps(selector)}); {fill} "
                      "f.requestSubmit(); return true; })()")
        self._loaded(mark)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page, not just the window."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def cookies(self) -> list[dict]:
        return self.call("Network.getCookies", session=True)["cookies"]

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        # Its renderers and helpers are in the group it leads (its own session): stop them all.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# What the dashboard's browser tests read from a page and from the API.
RECTS = """Array.from(document.querySelectorAll('#{chart} rect[data-amount]')).map(r => [r.dataset.day || null,
             r.dataset.key, parseFloat(r.dataset.amount)])"""


def api(site, team: str, group_by: str | None = None) -> dict:
    r = site.client.get(f"/v1/teams/{team}/costs", params={"group_by": group_by} if group_by else {},
                        headers=site.bearer(team))
    assert r.status_code == 200, r.text
    return r.json()


def only_local(browser: Browser) -> None:
    seen = browser.requests()
    assert seen, "the browser made no request"
    outside = [u for u in seen if urlsplit(u).scheme not in ("data", "about") and urlsplit(u).hostname != "127.0.0.1"]
    assert not outside, outside
