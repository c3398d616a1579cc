"""`spotbroker demo`: the whole product on one machine, on the embedded
defaults (SQLite file, local launcher, file:// checkpoints under a data
directory). It starts a real broker process, talks to it over REST like any
client, and stops it at the end."""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import click

from spotbroker.broker.cli.client import ApiError, Client
from spotbroker.broker.settings import get_settings

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
TRAIN_ARGS = ["--steps", "60", "--seed", "7", "--every-steps", "20", "--log-every", "1"]
NOTICE_WINDOW = 10  # seconds between the simulated notice and the hard stop (AWS gives 120)
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
    """Run the local demo end to end: a broker, a team, a training job on spot,
    a preemption, a resume elsewhere from the flushed checkpoint."""
    from spotbroker.broker.cli.jobs import print_job

    data_dir = (data_dir or _default_data_dir()).resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    port, admin = _free_port(), secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    # The demo's prices are the bundled snapshot's: it must run the same offline.
    env.update(SPOTBROKER_DATA_DIR=str(data_dir), SPOTBROKER_ADMIN_TOKEN=admin,
               SPOTBROKER_RECONCILE_INTERVAL="0.5", SPOTBROKER_LOCAL_NOTICE_WINDOW=str(NOTICE_WINDOW),
               SPOTBROKER_PRICES_SOURCES="catalog",
               SPOTBROKER_PRELOAD_SKYPILOT="false")  # its job is JSON: no task file for SkyPilot to read
    if not TRAIN.exists():
        raise click.ClickException(f"the demo runs {TRAIN}, which is not here: run it from a checkout")
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


def _default_data_dir() -> Path:
    """$SPOTBROKER_DATA_DIR/demo; as root, a fresh directory under /tmp instead:
    root's jobs run as an unprivileged user, who cannot enter root's home."""
    if os.geteuid() != 0:
        return get_settings().data_dir / "demo"
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="spotbroker-demo-"))
    path.chmod(0o711)
    return path / "data"


def _job_spec() -> dict:
    # `python` is the jobs' interpreter (the README says which), found on the job's PATH.
    run = " ".join(["python", shlex.quote(str(TRAIN)), *TRAIN_ARGS, "--step-seconds", "0.15"])
    return {"name": "demo-train", "run": run, "resources": {"accelerators": "T4:1", "use_spot": True}}


def _attempt_place(a: dict) -> str:
    return (f"{a['cloud']} {a['region']} {a['zone'] or a['zone_id'] or ''} {a['instance_type']} "
            f"{'spot' if a['use_spot'] else 'on-demand'} ${a['price_per_hour']:.4f}/h").replace("  ", " ")


def _run_job(c: Client, print_job) -> None:
    _step("submitting a training job over REST: POST /v1/jobs")
    job = c.submit(_job_spec())
    click.echo(f"job {job['id']}: examples/train.py {' '.join(TRAIN_ARGS)}, asks for T4:1 on spot")
    started = time.monotonic()
    while not (job := c.job(job["id"]))["attempts"] or job["state"] != "RUNNING":
        _deadline(started, job)
        time.sleep(0.1)
    first = job["attempts"][0]
    why = next((e["data"].get("why") for e in c.events(job["id"])
                if e["type"] == "job_state" and e["data"].get("attempt_id") == first["id"] and "why" in e["data"]), "")
    click.echo(f"placed by the policy ({why}): {_attempt_place(first)}")

    _step("training; its output comes back through the node agent")
    while "step=20 " not in (out := c.logs(job["id"])):
        _deadline(started, job)
        time.sleep(0.2)
    click.echo("".join(out.splitlines(keepends=True)[-3:]), nl=False)

    _step("the cloud reclaims the node: a preemption notice through the simulated metadata service")
    c.simulate_preemption(job["id"])
    while (job := c.job(job["id"]))["state"] not in TERMINAL:
        _deadline(started, job)
        time.sleep(0.2)
    events = c.events(job["id"])
    print_job(job, events)
    _timeline(job, events)

    _step("the same run without a preemption, for comparison")
    plain = subprocess.run([sys.executable, str(TRAIN), *TRAIN_ARGS], capture_output=True, text=True, timeout=300)
    resumed_loss = _final_loss(c.logs(job["id"]))
    plain_loss = _final_loss(plain.stdout)
    click.echo(f"final loss, preempted and resumed: {resumed_loss}\n"
               f"final loss, uninterrupted:         {plain_loss}  "
               + ("(equal)" if resumed_loss == plain_loss else "(DIFFERENT)"))
    if job["state"] != "SUCCEEDED" or resumed_loss != plain_loss:
        raise click.ClickException(f"the demo job ended {job['state']} ({job.get('reason')})")
    click.secho(f"\ndemo finished: job {job['id']} {job['state']} after {len(job['attempts'])} attempts, "
                f"cost ${job['cost']:.6f}", fg="green", bold=True)


def _deadline(started: float, job: dict) -> None:
    if time.monotonic() - started > 240:
        raise click.ClickException(f"job {job['id']} is still {job['state']} after 240 s")
    if job["state"] in ("FAILED", "CANCELLED"):
        raise click.ClickException(f"job {job['id']} ended {job['state']}: {job.get('reason')}")


def _final_loss(text: str) -> str:
    found = re.findall(r"final_loss=(\S+)", text)
    return found[-1] if found else "?"


def _timeline(job: dict, events: list[dict]) -> None:
    """Notice -> checkpoint committed -> new attempt running, in seconds."""
    def at(e: dict) -> datetime:
        return datetime.fromisoformat(e["at"])

    first, last = job["attempts"][0], job["attempts"][-1]
    notice = next(e for e in events if e["type"] == "preemption_notice")
    flush = next((e for e in events if e["type"] == "checkpoint_committed" and e["attempt_id"] == first["id"]
                  and e["data"].get("reason") != "periodic"), None)
    running = next(e for e in events if e["type"] == "attempt_state" and e["attempt_id"] == last["id"]
                   and e["data"]["to"] == "RUNNING")
    resumed = next((e for e in events if e["type"] == "resumed" and e["attempt_id"] == last["id"]), None)
    _step("timeline")
    t0 = at(notice)
    click.echo(f"  +0.00 s  preemption notice on attempt {first['id']} ({first['cloud']}, deadline "
               f"{notice['data'].get('deadline')})")
    if flush:
        d = flush["data"]
        click.echo(f"  +{(at(flush) - t0).total_seconds():.2f} s  checkpoint committed: step {d['step']}, "
                   f"{d['bytes'] / 1e6:.2f} MB in {d['seconds']:.2f} s")
    click.echo(f"  +{(at(running) - t0).total_seconds():.2f} s  attempt {last['id']} running on "
               f"{_attempt_place(last)}")
    if resumed:
        click.echo(f"  +{(at(resumed) - t0).total_seconds():.2f} s  trainer resumed from step "
                   f"{resumed['data'].get('step')}")
    if flush and resumed:
        # The flush happens at the first step boundary after the notice, so
        # the resumed run redoes nothing the first attempt had finished then.
        click.echo(f"  steps lost: {max(0, flush['data']['step'] - resumed['data']['step'])}")
