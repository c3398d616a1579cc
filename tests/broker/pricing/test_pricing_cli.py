"""`spotbroker prices`, run as a user runs it: a real process against a real server."""
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, time

from spotbroker.broker.pricing.catalog import snapshot_date
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine


def spotbroker(*args, env):
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "prices", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def user_env(**extra):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    return {**clean, "COLUMNS": "200", **extra}


def test_prices_lists_offers_and_history_from_the_broker(api, team_headers, settings):
    token = team_headers()["Authorization"].split()[1]
    env = user_env(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}", SPOTBROKER_TOKEN=token)
    r = spotbroker("A100:8", "--limit", "5", env=env)
    assert r.returncode == 0, r.stderr
    assert "SPOT $/h" in r.stdout and "catalog" in r.stdout and "A100:8" in r.stdout
    # The bundled snapshot says its own date, not when the broker last re-read the file.
    taken = snapshot_date()
    rows = [line for line in r.stdout.splitlines() if " A100:8 " in line]
    assert taken is not None and len(rows) == 5
    assert all(f"snapshot {taken.isoformat()}" in row for row in rows), r.stdout
    assert "RISK: no interruption figures" in r.stdout             # offline: why every RISK is '-'
    r = spotbroker("H100:8", "--cloud", "gcp", "--on-demand", "--json", env=env)
    offers = json.loads(r.stdout)["offers"]
    assert offers and all(o["cloud"] == "gcp" for o in offers)
    age = (datetime.now(UTC) - datetime.combine(taken, time(), UTC)).total_seconds()
    for o in offers:
        assert (o["age_class"], o["snapshot_date"]) == ("snapshot", taken.isoformat())
        assert abs(o["age_seconds"] - age) < 600                     # as old as the snapshot
    first = offers[0]
    r = spotbroker("--history", "--cloud", "gcp", "--zone", first["zone"], "--instance-type",
                   first["instance_type"], env=env)
    assert r.returncode == 0 and "1 price changes" in r.stdout, r.stdout + r.stderr
    r = spotbroker("A100:eight", env=env)
    assert r.returncode == 2 and "NAME:COUNT" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("--history", "--cloud", "aws", env=env)
    assert r.returncode == 2 and "--zone" in r.stderr
    # nothing to show is said (an empty table and exit 0 were all), and a place without the offer is named
    r = spotbroker("FOO:1", env=env)
    assert r.returncode == 0 and "no offer matches accelerator FOO, count 1" in r.stderr, r.stderr
    r = spotbroker("--history", "--cloud", "aws", "--zone", "nope-zone", "--instance-type", "p4d.24xlarge", env=env)
    assert r.returncode == 1 and "no offer of p4d.24xlarge in nope-zone; it has one in: " in r.stderr, r.stderr


def test_piped_into_a_file_the_table_keeps_every_column_whole(api, team_headers, settings):
    """No terminal, no COLUMNS (a pipe, a file, cron): the rows are not
    folded to 80 columns, so `grep p4d` and a reader see whole values."""
    token = team_headers()["Authorization"].split()[1]
    env = {k: v for k, v in user_env(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}",
                                     SPOTBROKER_TOKEN=token).items() if k not in ("COLUMNS", "LINES")}
    r = spotbroker("A100:8", "--limit", "5", "--json", env=env)
    offers = json.loads(r.stdout)["offers"]
    r = spotbroker("A100:8", "--limit", "5", env=env)
    assert r.returncode == 0, r.stderr
    assert "ON-DEMAND $/h" in r.stdout
    rows = [line for line in r.stdout.splitlines() if " A100:8 " in line]
    assert len(rows) == len(offers) == 5
    for offer, row in zip(offers, rows):
        assert offer["instance_type"] in row and offer["region"] in row


def test_refresh_runs_once_and_prints_what_changed(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    env = user_env(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_PRICES_SOURCES="catalog")
    r = spotbroker("--refresh", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("catalog: ") and " new, 0 changed" in r.stdout
    changes = [line for line in r.stdout.splitlines()[1:] if line.startswith("  ")]
    assert len(changes) == 50 and all("spot" in line and "on-demand" in line for line in changes)
    again = spotbroker("--refresh", "--source", "catalog", "--json", env=env)
    assert json.loads(again.stdout)["catalog"]["new"] == 0
    assert json.loads(again.stdout)["catalog"]["changed"] == 0
    assert r.stdout.splitlines()[-1] == "reachable: catalog; not: none"

    # A source that cannot be reached says so, by name; the others still refresh.
    dead = {**env, "SPOTBROKER_PRICES_AWS_ADVISOR_URL": "http://127.0.0.1:9/spot-advisor-data.json"}
    r = spotbroker("--refresh", "--source", "catalog", "--source", "aws-advisor", env=dead)
    assert r.returncode == 0, r.stderr
    assert "aws-advisor: unreachable, not refreshed (" in r.stdout and "127.0.0.1:9" in r.stdout
    assert r.stdout.splitlines()[-1] == "reachable: catalog; not: aws-advisor"
    r = spotbroker("--refresh", "--source", "catalog", "--source", "aws-advisor", "--json", env=dead)
    answer = json.loads(r.stdout)
    assert answer["catalog"]["outcome"] == "reachable" and answer["aws-advisor"]["outcome"] == "unreachable"
    assert "127.0.0.1:9" in answer["aws-advisor"]["error"]
    r = spotbroker("--refresh", "--source", "ibm", env=env)
    assert r.returncode == 2 and "unknown source" in r.stderr
