"""deploy/ and docker-compose.yml. There is no Docker engine here, so: the
compose file parses and names only things that exist, and the image's entry
command runs as a plain process against a real PostgreSQL."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from helpers import create_pg_database, drop_pg_database, setting_names

REPO = Path(__file__).resolve().parents[1]


def test_compose_names_only_what_exists():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "broker", "s3"} <= set(services)
    build = services["broker"]["build"]
    dockerfile = REPO / build["context"] / build["dockerfile"]
    assert dockerfile.is_file()
    for dep in services["broker"]["depends_on"]:
        assert dep in services
    fields = setting_names()
    for name, service in services.items():
        for var in service.get("environment", {}):
            if var.startswith("SPOTBROKER_"):
                assert var in fields, f"{name}: {var} is not a setting"
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY"):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), f"{dockerfile.name} copies {src}, which does not exist"
    entry = REPO / "deploy" / "entrypoint.sh"
    assert os.access(entry, os.X_OK)
    assert re.search(r'ENTRYPOINT \["spotbroker-entrypoint"\]', dockerfile.read_text())


def test_image_entry_command_migrates_and_serves(pg_server, tmp_path):
    url = create_pg_database("spotbroker_deploy")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_DATA_DIR=str(tmp_path), SPOTBROKER_ADMIN_TOKEN="x",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    proc = subprocess.Popen([str(REPO / "deploy" / "entrypoint.sh"), "serve", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).json()["status"] == "ok":
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the entry command did not serve"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        drop_pg_database(url)


def entry_env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_DATA_DIR=str(tmp_path), SPOTBROKER_ADMIN_TOKEN="x",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}", **extra)
    return env


def test_with_a_migration_job_the_entry_waits_for_it_and_never_migrates(pg_server, tmp_path):
    """SPOTBROKER_MIGRATE_ON_START=false (deploy/kubernetes): `db ready` waits for
    the schema that a migration job writes, and says why it gave up."""
    url = create_pg_database("spotbroker_deploy")
    env = entry_env(url, tmp_path, SPOTBROKER_MIGRATE_ON_START="false", SPOTBROKER_DB_WAIT_SECONDS="1")
    try:
        done = subprocess.run(["spotbroker", "db", "ready"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert "the schema is at nothing" in done.stderr and "migration job" in done.stderr
        assert "Traceback" not in done.stderr
        assert "database: empty" in subprocess.run(["spotbroker", "db", "current"], env=env, capture_output=True,
                                                   text=True, timeout=60).stdout
        # the job runs while a pod waits: the pod goes on as soon as the schema is there
        waiting = subprocess.Popen(["spotbroker", "db", "ready"], env={**env, "SPOTBROKER_DB_WAIT_SECONDS": "60"},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            subprocess.run(["spotbroker", "db", "upgrade"], env=env, check=True, capture_output=True, timeout=60)
            assert waiting.wait(timeout=30) == 0
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        assert "database ready at revision" in waiting.stdout.read()
    finally:
        drop_pg_database(url)


def test_an_unreachable_database_is_waited_for_then_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = entry_env(f"postgresql://nobody:hunter2@127.0.0.1:{port}/x", tmp_path, SPOTBROKER_DB_WAIT_SECONDS="2")
    started = time.monotonic()
    done = subprocess.run([str(REPO / "deploy" / "entrypoint.sh"), "serve"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - started >= 2
    assert "the database does not answer" in done.stderr and "SPOTBROKER_DB_WAIT_SECONDS=2" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
