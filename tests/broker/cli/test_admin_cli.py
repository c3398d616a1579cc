"""`teams list`, `teams token rotate|revoke`, `alerts` and `silences`, run as
a user runs them (a real process) against a real server: tables like every
other command, `--json` as the API answers, the admin's commands sent with
SPOTBROKER_ADMIN_TOKEN even when a team token is exported too."""
from __future__ import annotations

import json
from datetime import UTC, datetime

from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.brokerproc import broker_env
from support.cli import cells, spotbroker
from support.helpers import team_token

from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Team
from spotbroker.broker.store.moneymodels import Alert


def test_teams_list_and_token_rotation(api, env):
    old = team_token(api, "ml", ADMIN_TOKEN)
    team_token(api, "cv", ADMIN_TOKEN)
    both = {**env, "SPOTBROKER_TOKEN": old, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    mine = {**env, "SPOTBROKER_TOKEN": old}

    r = spotbroker("teams", "list", env=both)
    assert r.returncode == 0, r.stderr
    assert cells(r.stdout, "ml")[1] == "ml" and cells(r.stdout, "cv")[1] == "cv" and "CREATED" in r.stdout
    listed = json.loads(spotbroker("teams", "list", "--json", env=both).stdout)
    assert [t["name"] for t in listed] == ["ml", "cv"]
    r = spotbroker("teams", "list", env=mine)                                  # a team's token: refused
    assert r.returncode == 1 and "SPOTBROKER_ADMIN_TOKEN" in r.stderr and "Traceback" not in r.stderr

    def works(token: str) -> bool:
        return api.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 200

    assert works(old)                       # and now cached by the server: rotation must still end it
    r = spotbroker("teams", "token", "rotate", "ml", env=both)
    assert r.returncode == 0, r.stderr
    new = r.stdout.strip().splitlines()[-1]
    assert new.startswith("sbt_") and new != old and "no longer work" in r.stderr
    assert not works(old) and works(new)

    r = spotbroker("teams", "token", "rotate", "ml", "--json", env={**env, "SPOTBROKER_TOKEN": new})
    assert r.returncode == 0, r.stderr                                         # a team rotates its own
    newer = json.loads(r.stdout)["token"]
    assert not works(new) and works(newer)
    r = spotbroker("teams", "token", "rotate", "cv", env={**env, "SPOTBROKER_TOKEN": newer})
    assert r.returncode == 1 and "own team" in r.stderr                       # ...and no other team's

    r = spotbroker("teams", "token", "revoke", "ml", env={**env, "SPOTBROKER_TOKEN": newer})
    assert r.returncode == 1 and "SPOTBROKER_ADMIN_TOKEN" in r.stderr and works(newer)
    r = spotbroker("teams", "token", "revoke", "ml", env=both)
    assert r.returncode == 0, r.stderr
    assert "1 token(s) revoked" in r.stdout and "teams token rotate ml" in r.stdout
    assert not works(newer)
    r = spotbroker("teams", "token", "rotate", "ml", "--json", env=both)      # the admin gives it one again
    assert works(json.loads(r.stdout)["token"])
    for cmd in ("rotate", "revoke"):
        r = spotbroker("teams", "token", cmd, "nobody", env=both)
        assert r.returncode == 1 and "nobody" in r.stderr and "Traceback" not in r.stderr


def test_alerts_and_silences(api, env, factory):
    token = team_token(api, "ml", ADMIN_TOKEN)
    team_token(api, "cv", ADMIN_TOKEN)
    with transaction(factory) as s:
        ml, cv = (s.scalar(select(Team.id).where(Team.name == n)) for n in ("ml", "cv"))
        now = datetime.now(UTC).replace(microsecond=0)
        s.add_all([
            Alert(team_id=ml, rule="fast_burn", open_key=f"{ml}:fast_burn", severity="page",
                  summary="spending 40x the budget's pace", advice="look at the running jobs", value=40.0,
                  threshold=14.4, fired_at=now),
            Alert(team_id=cv, rule="spend_50", open_key=None, severity="info", summary="half the budget spent",
                  advice="nothing yet", value=0.5, threshold=0.5, fired_at=now, resolved_at=now)])
    admin = {**env, "SPOTBROKER_TOKEN": token, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    mine = {**env, "SPOTBROKER_TOKEN": token}

    r = spotbroker("alerts", env=mine)                                         # the team's own only
    assert r.returncode == 0, r.stderr
    row = cells(r.stdout, "fast_burn")
    assert row[1:6] == ["ml", "fast_burn", "open", "page", "40"] and "spend_50" not in r.stdout
    r = spotbroker("alerts", "--team", "cv", "--state", "resolved", "--json",
                   env={**env, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN})
    assert [(a["team"], a["rule"], a["state"]) for a in json.loads(r.stdout)] == [("cv", "spend_50", "resolved")]
    r = spotbroker("alerts", "--team", "cv", env=mine)
    assert r.returncode == 1 and "own team" in r.stderr and "Traceback" not in r.stderr

    r = spotbroker("silences", "add", "ml", "fast_burn", "--minutes", "90", env=mine)
    assert r.returncode == 1 and "SPOTBROKER_ADMIN_TOKEN" in r.stderr
    r = spotbroker("silences", "add", "ml", "fast_burn", "--minutes", "90", "--json", env=admin)
    assert r.returncode == 0, r.stderr
    silence = json.loads(r.stdout)
    r = spotbroker("silences", env=mine)                                       # list is the default
    assert r.returncode == 0, r.stderr
    assert cells(r.stdout, "fast_burn")[:3] == [str(silence["id"]), "ml", "fast_burn"]
    r = spotbroker("silences", "add", "ml", "no_such_rule", "--minutes", "5", env=admin)
    assert r.returncode == 1 and "rule" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("silences", "expire", str(silence["id"]), env=admin)
    assert r.returncode == 0 and f"silence {silence['id']}" in r.stdout, r.stderr
    assert json.loads(spotbroker("silences", "list", "--json", env=mine).stdout) == []
    listed = json.loads(spotbroker("silences", "list", "--expired", "--json", env=mine).stdout)
    assert [s["id"] for s in listed] == [silence["id"]]
    r = spotbroker("silences", "--team", "ml", "--expired", "--json", env=admin)  # as docs/money.md writes it
    assert r.returncode == 0 and [s["id"] for s in json.loads(r.stdout)] == [silence["id"]], r.stderr
    r = spotbroker("silences", "add", "ml", "fast_burn", "--minutes", "nan", env=admin)
    assert r.returncode == 2 and "not a finite number" in r.stderr and "Traceback" not in r.stderr


def test_teams_create_goes_through_the_broker_named_by_spotbroker_url(api, env):
    # The user's shell names a remote broker and holds the admin token: the
    # team is made there, not in a database of this host's own.
    remote = {**env, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    r = spotbroker("teams", "create", "research", env=remote)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip().splitlines()[-1]
    assert api.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()["name"] == "research"
    r = spotbroker("teams", "create", "research", "--json", env=remote)
    assert r.returncode == 1 and "research" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("teams", "create", "other", "--json", env=remote)
    assert json.loads(r.stdout)["team"] == "other"
    # no admin token: made in this host's database, and the user is told so (it went there silently)
    r = spotbroker("teams", "create", "local", "--json", env={k: v for k, v in env.items()
                                                              if k != "SPOTBROKER_ADMIN_TOKEN"})
    assert r.returncode == 0 and json.loads(r.stdout)["team"] == "local", r.stderr
    assert "this host's database" in r.stderr and "SPOTBROKER_ADMIN_TOKEN" in r.stderr, r.stderr


def test_a_bad_setting_is_named_by_its_variable_without_a_traceback(tmp_path):
    """A SPOTBROKER_* value of the wrong form was a traceback naming a Python
    field (`placement_interval`), and a bad Kubernetes places file failed
    `serve` after it said it was serving."""
    base = broker_env(SPOTBROKER_DATA_DIR=str(tmp_path / "data"))
    for name, value, says in (("SPOTBROKER_PLACEMENT_INTERVAL", "abc", "valid number"),
                              ("SPOTBROKER_LAUNCHER", "bogus", "'local' or 'skypilot'"),
                              ("SPOTBROKER_EGRESS_USD_PER_GB", "notjson", "JSON"),
                              ("SPOTBROKER_ENCRYPTION_KEYS", "short", "32 random characters"),
                              ("SPOTBROKER_DATABASE_URL", "garbage", "not a database URL"),
                              ("SPOTBROKER_DATABASE_URL", "mysql://u:pw@h/db", "runs on PostgreSQL")):
        r = spotbroker("db", "current", env={**base, name: value})
        assert r.returncode == 2 and f"Error: {name}: " in r.stderr and says in r.stderr, r.stderr
        # (and not the value: it may be a secret)
        assert "Traceback" not in r.stderr and value not in r.stderr.replace(name, ""), r.stderr
    places = tmp_path / "places.yaml"
    places.write_text("places:\n  - {name: x}\n")
    r = spotbroker("serve", "--port", "0", env={**base, "SPOTBROKER_KUBERNETES_PLACES": str(places)})
    assert r.returncode == 1 and "SPOTBROKER_KUBERNETES_PLACES" in r.stderr and "clusters" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "serving on" not in r.stderr, r.stderr


def test_a_database_out_of_reach_is_one_line_not_a_traceback(tmp_path):
    """`serve`, `db current` and `db upgrade` at a database that does not
    answer printed about 135 lines of traceback (`db ready` said it in one)."""
    env = broker_env(SPOTBROKER_DATA_DIR=str(tmp_path / "data"),
                     SPOTBROKER_DATABASE_URL="postgresql://postgres:the-password@127.0.0.1:1/nowhere")
    for command in (("db", "current"), ("db", "upgrade"), ("serve", "--port", "0")):
        r = spotbroker(*command, env=env)
        assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) <= 3, r.stderr
        assert "Error: the database does not answer (SPOTBROKER_DATABASE_URL): " in r.stderr, r.stderr
        assert "the-password" not in r.stderr
