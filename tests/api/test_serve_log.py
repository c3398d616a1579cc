"""`spotbroker serve --log-level` is the broker's log level. SkyPilot, which
the server imports in the background, configures Python's root logger at
INFO on import: every INFO line of every library then reached the log
whatever the level, and each readiness probe (a Kubernetes probe every few
seconds) added two of Alembic's."""
from __future__ import annotations

import httpx
from conftest import ADMIN_TOKEN


def test_a_server_at_warning_logs_no_info_line_and_its_probes_log_nothing(serve_process):
    with serve_process(log_level="warning", SPOTBROKER_PRELOAD_SKYPILOT="true") as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/teams", json={"name": "ml"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        # A task file is read by SkyPilot: once it is answered, sky is imported.
        r = client.post("/v1/jobs", content=b"run: echo hi\n", headers={**headers, "Content-Type": "application/yaml"})
        assert r.status_code == 201, r.text
        before = server.output()
        for _ in range(5):
            assert client.get("/readyz").json()["status"] == "ok"
        after = server.output()
    assert after == before, after[len(before):]
    assert not [line for line in after.splitlines() if "INFO" in line], after
