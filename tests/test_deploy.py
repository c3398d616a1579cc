"""deploy/ and docker-compose.yml. There is no Docker engine here, so: the
compose file parses and names only things that exist, and the image's entry
command runs as a plain process against a real PostgreSQL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from support.helpers import create_pg_database, drop_pg_database, setting_names
from support.ports import free_port
from support.s3fixtures import moto_endpoint  # noqa: F401

from spotbroker.broker.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_names_only_what_exists():
    services = compose()["services"]
    assert {"postgres", "broker", "moto", "moto-init", "migrate"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            dockerfile = REPO / build["context"] / build["dockerfile"]
            assert dockerfile.is_file(), f"{name} builds {dockerfile}, which does not exist"
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on {dep}, which is no service"
        for var in service.get("environment", {}):
            if var.startswith("SPOTBROKER_"):
                assert var in setting_names(), f"{name}: {var} is not a setting"
        image = service.get("image")
        assert image is None or (":" in image and not image.endswith(":latest")), f"{name}: pin {image}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert not source.startswith(".") or (REPO / source).exists(), f"{name} mounts {source}: missing"
    assert services["moto"]["image"] == "motoserver/moto:5.2.5"  # the version the tests run (FIELD-NOTES)
    # one migration, before the broker serves; the broker itself does not migrate
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["broker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["broker"]["environment"]["SPOTBROKER_MIGRATE_ON_START"] == "false"
    entry = REPO / "deploy" / "entrypoint.sh"
    assert os.access(entry, os.X_OK)


def test_compose_settings_launch_with_scoped_credentials(moto_endpoint, monkeypatch):  # noqa: F811
    """An s3:// checkpoint root needs a node role to mint from (else every launch
    is refused): what compose's moto-init makes is what its broker names, and
    the broker's AWS settings assume it and write into the bucket."""
    services = compose()["services"]
    broker = {k: str(v) for k, v in services["broker"]["environment"].items()}
    init = {**os.environ, **{k: str(v) for k, v in services["moto-init"]["environment"].items()},
            "AWS_ENDPOINT_URL": moto_endpoint}
    subprocess.run([sys.executable, str(REPO / "deploy" / "compose" / "moto_init.py")], env=init, check=True,
                   timeout=60, capture_output=True)
    for name, value in broker.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    settings = Settings()  # every value parses
    assert settings.checkpoint_uri.startswith("s3://") and settings.node_role_arn
    assert settings.migrate_on_start is False
    import boto3

    session = boto3.client("sts").assume_role(RoleArn=settings.node_role_arn, RoleSessionName="compose")
    given = session["Credentials"]
    s3 = boto3.client("s3", aws_access_key_id=given["AccessKeyId"], aws_secret_access_key=given["SecretAccessKey"],
                      aws_session_token=given["SessionToken"])
    bucket = settings.checkpoint_uri.removeprefix("s3://").split("/")[0]
    s3.put_object(Bucket=bucket, Key="team/1/1/probe", Body=b"x")
    # and a second `docker compose up` finds them made
    subprocess.run([sys.executable, str(REPO / "deploy" / "compose" / "moto_init.py")], env=init, check=True,
                   timeout=60, capture_output=True)


def test_image_entry_command_migrates_and_serves(pg_server, tmp_path):
    url = create_pg_database("spotbroker_deploy")
    port = free_port()
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
    port = free_port()
    env = entry_env(f"postgresql://nobody:hunter2@127.0.0.1:{port}/x", tmp_path, SPOTBROKER_DB_WAIT_SECONDS="2")
    started = time.monotonic()
    done = subprocess.run([str(REPO / "deploy" / "entrypoint.sh"), "serve"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - started >= 2
    assert "the database does not answer" in done.stderr and "SPOTBROKER_DB_WAIT_SECONDS=2" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
