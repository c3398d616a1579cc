"""What the CLI's money and admin tests share: the environment a user's
shell gives `spotbroker`, pointed at the test's server."""
from __future__ import annotations

import os

import pytest


@pytest.fixture
def env(tmp_path, settings, api) -> dict[str, str]:
    # (no COLUMNS: xdist's workers have one, and the tables would fold to it)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_") and k not in ("COLUMNS", "LINES")}
    return {**clean, "HOME": str(tmp_path / "home"), "SPOTBROKER_URL": f"http://127.0.0.1:{settings.port}"}
