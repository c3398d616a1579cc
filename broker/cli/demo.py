"""`spotbroker demo`: the whole product on one machine, on the embedded
defaults (SQLite file, local launcher, file:// checkpoints under a data
directory). It starts a real broker process, talks to it over REST like any
client, and stops it at the end."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from spotbroker.broker.client import ApiError, Client
from spotbroker.broker.settings import get_settings

DEMO_JOB = {
    "name": "demo-train",
    "run": ('echo "training on $SPOTBROKER_CLOUD $SPOTBROKER_ZONE ($SPOTBROKER_INSTANCE_TYPE)"; '
            'for step in 1 2 3 4 5; do echo "step $step/5"; sleep 0.4; done; echo done'),
    "envs": {"SEED": "7"},
    "resources": {"accelerators": "A10G:1", "use_spot": True},
}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, server: subprocess.Popen, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise click.ClickException(f"the broker exited with code {server.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise click.ClickException(f"the broker did not become ready within {timeout:.0f} s")


def _step(text: str) -> None:
    click.secho(f"\n== {text}", bold=True)


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where the demo broker keeps its state [default: $SPOTBROKER_DATA_DIR/demo]")
def demo(data_dir: Path | None) -> None:
    """Run the local demo end to end: a broker, a team, a job, its logs and cost."""
    from spotbroker.broker.cli.jobs import print_job

    data_dir = (data_dir or get_settings().data_dir / "demo").resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    port, admin = _free_port(), secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATA_DIR=str(data_dir), SPOTBROKER_ADMIN_TOKEN=admin,
               SPOTBROKER_RECONCILE_INTERVAL="0.5")
    _step(f"starting the broker on {url} (SQLite and logs in {data_dir})")
    server_log = (data_dir / "broker.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--port", str(port),
                               "--log-level", "warning"], env=env, stdout=server_log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(url, server)
        with Client(url, admin) as admin_client:
            token = admin_client.create_team("demo")["token"]
        with Client(url, token) as c:
            _run_job(c, print_job)
    except ApiError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        server_log.close()


def _run_job(c: Client, print_job) -> None:
    _step("submitting a job over REST: POST /v1/jobs")
    job = c.submit(DEMO_JOB)
    click.echo(f"job {job['id']} ({job['name']}) asks for {DEMO_JOB['resources']['accelerators']} on spot: "
               f"{job['state']}")
    _step("following its output: GET /v1/jobs/{id}/logs?follow=true")
    started = time.monotonic()
    while not c.job(job["id"])["attempts"]:
        time.sleep(0.1)
    for chunk in c.follow_logs(job["id"]):
        click.echo(chunk, nl=False)
    while (job := c.job(job["id"]))["state"] not in TERMINAL:
        if time.monotonic() - started > 120:
            raise click.ClickException(f"job {job['id']} is still {job['state']} after 120 s")
        time.sleep(0.2)
    _step("its events and cost: GET /v1/jobs/{id}, /events")
    print_job(job, c.events(job["id"]))
    attempt = job["attempts"][-1]
    click.echo(f"placed on the cheapest feasible spot offer: {attempt['cloud']} {attempt['region']} "
               f"{attempt['zone'] or attempt['zone_id'] or ''} {attempt['instance_type']} at "
               f"${attempt['price_per_hour']:.4f}/h; cost ${job['cost']:.6f}")
    if job["state"] != "SUCCEEDED":
        raise click.ClickException(f"the demo job ended {job['state']}: {job.get('reason')}")
    click.secho(f"\ndemo finished: job {job['id']} {job['state']}", fg="green", bold=True)
