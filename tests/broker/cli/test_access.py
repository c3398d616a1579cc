"""Where a client command finds the broker and its token (broker/cli/access.py):
SPOTBROKER_URL, SPOTBROKER_TOKEN and SPOTBROKER_ADMIN_TOKEN, from the
environment or a `.env` file in the working directory (the environment
wins), as the broker's own settings are read; without loading those
settings, so that a server setting a client never uses cannot fail it."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ADMIN_TOKEN
from support.cli import spotbroker
from support.helpers import team_token


def test_a_dotenv_file_names_the_broker_and_the_token_and_the_environment_wins(api, env, tmp_path):
    token = team_token(api, "ml", ADMIN_TOKEN)
    api.post("/v1/jobs", json={"name": "seen", "run": "true"}, headers={"Authorization": f"Bearer {token}"})
    url = env.pop("SPOTBROKER_URL")
    (tmp_path / ".env").write_text(f"# the team's\nspotbroker_url={url}\nSPOTBROKER_TOKEN='{token}'\n")
    r = spotbroker("jobs", "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [j["name"] for j in json.loads(r.stdout)["jobs"]] == ["seen"]
    r = spotbroker("jobs", "--json", env={**env, "SPOTBROKER_TOKEN": "sbt_not-a-token"}, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr         # the environment's token won
    r = spotbroker("teams", "list", "--json", env={**env, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr                                   # the admin's from the environment
    assert [t["name"] for t in json.loads(r.stdout)] == ["ml"]
    r = spotbroker("jobs", env=env, cwd=tmp_path.parent)                 # no file there: the default broker
    assert r.returncode == 1 and "SPOTBROKER_TOKEN" in r.stderr and "Traceback" not in r.stderr


def test_a_client_command_loads_none_of_the_brokers_settings(api, env):
    token = team_token(api, "ml", ADMIN_TOKEN)
    # A server setting the client never reads, set wrong: the broker would refuse to start with it.
    shell = {**env, "SPOTBROKER_TOKEN": token, "SPOTBROKER_LOCAL_UID_RANGE": "not-a-range"}
    r = spotbroker("jobs", env=shell)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    probe = ("import sys; from spotbroker.broker.cli import cli\n"
             "try:\n    cli(['jobs', '--json'])\nexcept SystemExit:\n    pass\n"
             "print('spotbroker.broker.settings' in sys.modules, 'pydantic_settings' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", probe], env=shell, capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "False False", r.stderr
