"""A fresh broker's first task file waited 5-6 s for `import sky` (issue
#25): the server imports it in the background once it has started, and
answers meanwhile. In a fresh interpreter (this one may have imported sky
already), on the embedded default database."""
from __future__ import annotations

import os
import subprocess
import sys

SERVER = """
import sys, threading, time
from fastapi.testclient import TestClient
from spotbroker.api.app import create_app
from spotbroker.broker.settings import Settings

settings = Settings(admin_token="a" * 32, secret_key="k", preload_skypilot=sys.argv[1] == "on", _env_file=None)
with TestClient(create_app(settings, run_reconciler=False)) as client:
    assert client.get("/healthz").status_code == 200
    preloading = [t for t in threading.enumerate() if t.name == "preload-skypilot"]
    print("answered while preloading" if any(t.is_alive() for t in preloading) else "answered")
    for t in preloading:
        t.join(120)
    print("sky imported" if "sky" in sys.modules else "sky not imported")
"""


def run(preload: str, home) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    r = subprocess.run([sys.executable, "-c", SERVER, preload], env={**env, "HOME": str(home)},
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")[:2]


def test_the_server_answers_at_once_and_imports_skypilot_in_the_background(tmp_path):
    assert run("on", tmp_path / "on") == ["answered while preloading", "sky imported"]
    assert run("off", tmp_path / "off") == ["answered", "sky not imported"]
