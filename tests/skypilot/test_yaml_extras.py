"""SkyPilot's other clouds are extras of spotbroker (`gcp`, `azure`,
`kubernetes`), not installed for the tests: pip must still resolve them
with the project's pins (click<8.2, uvicorn<0.36, skypilot==0.14.1) on top
of what is installed. Needs the package index (CI has it); about 90 s."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_cloud_extras_resolve_with_the_projects_pins(tmp_path):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-input",
                        "--report", str(report), f"{REPO}[gcp,azure,kubernetes]"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    wanted = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    # each cloud's own SDK comes in, and nothing the project pins is moved
    assert {"google-api-python-client", "azure-cli", "kubernetes"} <= set(wanted), sorted(wanted)
    assert not {"click", "uvicorn", "skypilot", "fastapi", "pydantic"} & set(wanted), sorted(wanted)
