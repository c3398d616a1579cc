"""Commands that talk to a running broker over HTTP (SPOTBROKER_URL,
SPOTBROKER_TOKEN): submit, jobs, job, logs, cancel."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from spotbroker.broker.cli.client import ApiError, Client
from spotbroker.broker.settings import get_settings

_STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow", "RUNNING": "cyan",
                "PREEMPTING": "magenta", "RECOVERING": "magenta", "HELD": "yellow"}


def client() -> Client:
    settings = get_settings()
    if settings.token is None:
        raise click.ClickException("set SPOTBROKER_TOKEN to a team token (spotbroker teams create NAME)")
    return Client(settings.url, settings.token.get_secret_value())


def call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        raise click.ClickException(str(exc)) from None


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def _where(a: dict[str, Any]) -> str:
    place = "/".join(p for p in (a["cloud"], a["region"], a["zone"] or a["zone_id"]) if p)
    kind = "spot" if a["use_spot"] else "on-demand"
    return f"{place} {a['instance_type'] or ''} {kind} ${a['price_per_hour']:.4f}/h".replace("  ", " ")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@click.option("--json", "as_json", is_flag=True)
def submit(file: Path, as_json: bool) -> None:
    """Submit a job from a JSON or YAML file (SkyPilot task shape); '-' reads stdin."""
    from spotbroker.broker.jobs.spec import SpecSyntaxError, load_document

    data = sys.stdin.buffer.read() if str(file) == "-" else _read(file)
    fmt = "json" if file.suffix == ".json" else "yaml" if file.suffix in (".yaml", ".yml") else "auto"
    try:
        doc = load_document(data, fmt)
    except SpecSyntaxError as exc:
        where = f"{file}:{exc.line}" if exc.line else str(file)
        raise click.ClickException(f"{where}: {exc.message}") from None
    base = Path.cwd() if str(file) == "-" else file.resolve().parent
    c = client()
    try:
        if isinstance(doc.get("workdir"), str):
            doc = {**doc, "workdir": {"upload": upload_workdir(c, base / Path(doc["workdir"]).expanduser())}}
        job = c.submit(doc)
    except ApiError as exc:
        raise click.ClickException(f"{file}: {exc}") from None
    if as_json:
        _echo_json(job)
    else:
        click.echo(f"submitted job {job['id']} ({job['name']}): {job['state']}")


def upload_workdir(c: Client, workdir: Path) -> str:
    """Pack a workdir (a path relative to the job's file, as SkyPilot reads
    it) and upload it; its sha256, which the job names. Problems with the
    directory are the user's to fix: a message naming it, no traceback."""
    import tempfile

    from spotbroker.broker.jobs.workdir import WorkdirError, pack

    with tempfile.TemporaryFile() as archive:
        try:
            packed = pack(workdir, archive)
        except WorkdirError as exc:
            raise click.ClickException(str(exc)) from None
        archive.flush()
        archive.seek(0)
        click.echo(f"uploading workdir {workdir}: {packed.files} files, {packed.file_bytes / 1e6:.1f} MB "
                   f"({packed.bytes / 1e6:.1f} MB packed)", err=True)
        c.upload(archive, packed.sha256)
    return packed.sha256


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"{file}: {exc.strerror}") from None


@click.command("jobs")
@click.option("--state", "states", multiple=True, help="filter (repeatable): PENDING, RUNNING, ...")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_jobs(states: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List your team's jobs, newest first."""
    page = call(client().jobs, [s.upper() for s in states], limit)
    if as_json:
        _echo_json(page)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("ID", "NAME", "STATE", "WHERE", "ATTEMPTS", "COST $", "SUBMITTED")
    for j in page["jobs"]:
        last = j["attempts"][-1] if j["attempts"] else None
        style = _STATE_STYLE.get(j["state"], "")
        table.add_row(str(j["id"]), j["name"], f"[{style}]{j['state']}[/]" if style else j["state"],
                      _where(last) if last else "-", str(len(j["attempts"])), f"{j['cost']:.4f}",
                      j["created_at"][:19].replace("T", " "))
    Console().print(table)


@click.command("job")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show_job(job_id: int, as_json: bool) -> None:
    """Show one job: state, attempts, cost and events."""
    c = client()
    job = call(c.job, job_id)
    if as_json:
        _echo_json(job)
        return
    print_job(job, call(c.events, job_id))


def print_job(job: dict[str, Any], events: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]job {job['id']}[/] {job['name']}: {job['state']}"
                  + (f" ({job['reason']})" if job.get("reason") else "") + f", cost ${job['cost']:.6f}")
    attempts = Table("ATTEMPT", "STATE", "WHERE", "STARTED", "ENDED", "COST $", title="attempts")
    for a in job["attempts"]:
        attempts.add_row(str(a["id"]), a["state"] + (f" ({a['reason']})" if a["reason"] else ""), _where(a),
                         (a["started_at"] or "-")[11:19], (a["ended_at"] or "-")[11:19], f"{a['cost']:.6f}")
    console.print(attempts)
    table = Table("AT", "EVENT", "ATTEMPT", "DETAIL", title="events")
    for e in events:
        data = {k: v for k, v in e["data"].items() if k not in ("raw", "agent_at")}  # cloud payloads: see --json
        change = f"{data.pop('from')} -> {data.pop('to')} " if "to" in data else ""
        detail = change + " ".join(f"{k}={v}" for k, v in data.items())
        table.add_row(e["at"][11:23], e["type"], str(e["attempt_id"] or ""), detail)
    console.print(table)


@click.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="keep printing until the attempt ends")
@click.option("--tail", type=int, default=None, help="only the last N lines")
@click.option("--attempt", type=int, default=None, help="an earlier attempt's log")
def logs(job_id: int, follow: bool, tail: int | None, attempt: int | None) -> None:
    """Print a job's output (its newest attempt's by default)."""
    c = client()
    if follow:
        try:
            for chunk in c.follow_logs(job_id, tail):
                click.echo(chunk, nl=False)
        except ApiError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        click.echo(call(c.logs, job_id, tail, attempt), nl=False)


@click.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def cancel(job_id: int, as_json: bool) -> None:
    """Cancel a job (what still runs gets SIGTERM, then SIGKILL)."""
    job = call(client().cancel, job_id)
    if as_json:
        _echo_json(job)
    else:
        click.echo(f"job {job['id']}: {job['state']}")


@click.command("simulate-preemption")
@click.argument("job_id", type=int)
def simulate_preemption(job_id: int) -> None:
    """Send a preemption notice to a job's running attempt (local launcher only)."""
    job = call(client().simulate_preemption, job_id)
    click.echo(f"job {job['id']}: preemption notice sent to attempt {job['attempts'][-1]['id']}")


@click.command("checkpoints")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def checkpoints(job_id: int, as_json: bool) -> None:
    """List a job's committed checkpoints, newest first."""
    found = call(client().checkpoints, job_id)
    if as_json:
        _echo_json(found)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("ID", "ATTEMPT", "STEP", "MB", "SECONDS", "REASON", "KEEP", "URI")
    for c in found:
        table.add_row(str(c["id"]), str(c["attempt_id"]), str(c["step"]), f"{c['bytes'] / 1e6:.1f}",
                      f"{c['seconds']:.2f}" if c["seconds"] is not None else "-", c["reason"] or "-",
                      "yes" if c["keep"] else "", c["uri"])
    Console().print(table)
