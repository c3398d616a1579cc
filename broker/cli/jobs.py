"""Commands that talk to a running broker over HTTP (SPOTBROKER_URL,
SPOTBROKER_TOKEN): submit, jobs, job, logs, cancel."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from spotbroker.broker.cli import launchflags, progress
from spotbroker.broker.cli.access import token_client
from spotbroker.broker.cli.client import ApiError, Client
from spotbroker.broker.cli.output import printable, safe_markup

_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
_STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow", "RUNNING": "cyan",
                "PREEMPTING": "magenta", "RECOVERING": "magenta", "HELD": "yellow"}


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
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON (with --wait: the ended job; "
              "its output goes to stderr)")
@click.option("-f", "--wait", is_flag=True, help="follow the job's output until it ends; exit 0 only if it succeeded")
@launchflags.options
def submit(file: Path, as_json: bool, wait: bool, yes: bool, **launch: Any) -> None:
    """Submit a job from a JSON spec or a SkyPilot task YAML; '-' reads stdin.

    A YAML file is read by the broker with SkyPilot's own schema; its
    `workdir` and local `file_mounts` directories are uploaded first.
    SkyPilot's launch flags override the file as in `sky launch`."""
    from spotbroker.broker.jobs import overrides
    from spotbroker.broker.jobs.spec import SpecSyntaxError, load_document, load_raw

    data = sys.stdin.buffer.read() if str(file) == "-" else _read(file)
    fmt = "json" if file.suffix == ".json" else "yaml" if file.suffix in (".yaml", ".yml") else "auto"
    if fmt == "auto":
        fmt = "json" if data.lstrip().startswith(b"{") else "yaml"
    try:
        doc = load_raw(data, fmt) if fmt == "yaml" else load_document(data, fmt)
    except SpecSyntaxError as exc:
        where = f"{file}:{exc.line}" if exc.line else str(file)
        raise click.ClickException(f"{where}: {exc.message}") from None
    flags = launchflags.flags(**launch)
    if flags.any():
        doc = overrides.apply(doc, flags)
    filled = False
    if fmt == "yaml" and isinstance(doc, dict):  # its local paths as SkyPilot reads them, ${VAR} filled in
        before, doc = doc, overrides.fill_in_variables(doc)
        filled = doc != before
    # Relative local paths are read from the current directory, as `sky launch` reads them
    # (SkyPilot's docs say so); the file's own directory only helps say what was meant.
    base = Local(Path.cwd(), None if str(file) == "-" else file.resolve().parent)
    c = token_client()
    shown = progress.on_terminal(as_json)

    def at(field: str) -> str:
        """Where a field is, for a message about it: FILE:LINE."""
        from spotbroker.broker.usecases.taskyaml import line_of

        line = line_of(data.decode("utf-8", "replace"), field)
        return f"{file}:{line}" if line else str(file)

    if fmt == "yaml" and isinstance(doc, dict):  # the broker's first checks, before anything is uploaded
        from spotbroker.broker.usecases import taskyaml

        try:
            taskyaml.precheck(doc)
        except taskyaml.TaskFileError as exc:
            detail = f"invalid field(s): {', '.join(dict.fromkeys(e['field'] for e in exc.errors))}"
            raise click.ClickException(f"{file}: {_listed(detail, exc.errors, data, flags)}") from None
    try:
        doc, uploaded = _upload_local(c, doc, base, at, shown)
        if fmt == "json":
            with progress.waiting("submitting", shown):
                job = c.submit(doc)
        else:
            import yaml

            rewritten = uploaded or flags.any() or filled
            with progress.waiting("submitting: the broker reads the task file", shown):
                job = c.submit_yaml(yaml.safe_dump(doc, sort_keys=False).encode() if rewritten else data)
    except ApiError as exc:
        raise click.ClickException(f"{file}: {_located(exc, data if fmt == 'yaml' else None, flags)}") from None
    if fmt == "yaml" and not _says_use_spot(doc.get("resources")):  # (only of a job it took)
        click.echo(f"{file}: no use_spot: runs on on-demand, as in SkyPilot (add `use_spot: true` "
                   "under resources for spot)", err=True)
    for warning in job.get("warnings") or []:
        line = _line_in(data, str(warning.get("field"))) if fmt == "yaml" else None
        click.echo(f"{file}{f':{line}' if line else ''}: warning: {warning.get('field')}: {warning.get('message')}",
                   err=True)
    held = f" ({printable(job['reason'])})" if job["state"] == "HELD" and job.get("reason") else ""
    if not wait:
        if as_json:
            _echo_json(job)
        else:
            click.echo(f"submitted job {job['id']} ({job['name']}): {job['state']}{held}")
        return
    click.echo(f"submitted job {job['id']} ({job['name']}): {job['state']}{held}", err=as_json)
    ended = follow(c, job["id"], err=as_json)
    if as_json:
        _echo_json(ended)
    sys.exit(0 if ended["state"] == "SUCCEEDED" else 1)


# A broker restarted (a rolling update, another replica behind the same
# address taking over) ends its streams: how long a follower keeps trying.
RECONNECT_FOR_S = 300.0


def follow(c: Client, job_id: int, tail: int | None = None, node: int | None = None, err: bool = False) -> dict:
    """`_follow`, and Ctrl-C: the job goes on, so the user is told how to follow
    it again; exit status 130, as an interrupted command's (it was click's
    "Aborted!" and 1, a failed job's status: a user might submit it again)."""
    try:
        return _follow(c, job_id, tail, node, err)
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; job {job_id} goes on: spotbroker logs {job_id} -f follows it again, "
                   f"spotbroker cancel {job_id} stops it", err=True)
        sys.exit(130)


def _follow(c: Client, job_id: int, tail: int | None, node: int | None, err: bool) -> dict:
    """Print the job's output across its attempts until it ends (the server
    says what happens between them); the ended job. A stream that ends
    before the job (its broker went away) is followed again, from the
    newest output on, for up to RECONNECT_FOR_S: what was printed meanwhile
    may be missing, and a line on stderr says so."""
    lost_at: float | None = None
    while True:
        try:
            for chunk in c.follow_logs(job_id, tail, node):
                click.echo(chunk, nl=False, err=err)
                lost_at = None
            lost = "the broker ended the stream"
        except ApiError as exc:
            if exc.status:  # the broker answered (not found, no token...): nothing to follow again
                raise click.ClickException(str(exc)) from None
            lost = str(exc)
        try:
            job = c.job(job_id)
        except ApiError as exc:
            if exc.status:
                raise click.ClickException(str(exc)) from None
            job = None
        if job is not None and job["state"] in _ENDED:
            return job
        if lost_at is None:
            lost_at = time.monotonic()
            click.echo(f"\u2014 {lost} before job {job_id} ended; following it again, from its newest output "
                       f"(what it printed meanwhile: spotbroker logs {job_id}) \u2014", err=True)
        elif time.monotonic() - lost_at > RECONNECT_FOR_S:
            state = f" ({job['state']})" if job is not None else ""
            raise click.ClickException(f"{lost} before job {job_id} ended{state}, and no broker answered for "
                                       f"{RECONNECT_FOR_S:.0f} s: spotbroker logs {job_id} -f follows it again")
        time.sleep(1.0)
        tail = 0


def _line_in(data: bytes, field: str) -> int | None:
    from spotbroker.broker.usecases.taskyaml import line_of

    return line_of(data.decode("utf-8", "replace"), field)


def _says_use_spot(res: Any) -> bool:
    """Whether the file says spot or on-demand for every cloud it may run in
    (a Kubernetes alternative has no spot: it need not say)."""
    if not isinstance(res, dict):
        return False
    alts = [a for k in ("any_of", "ordered") for a in (res.get(k) or []) if isinstance(a, dict)]
    on_kubernetes = [a for a in alts if str(a.get("infra", res.get("infra", ""))).split("/")[0].lower()
                     in ("k8s", "kubernetes")]
    clouds = [a for a in alts if a not in on_kubernetes]
    return "use_spot" in res or (bool(alts) and all("use_spot" in a for a in clouds))


@dataclass(frozen=True)
class Local:
    """Where a task file's relative local paths are read: `cwd`, as
    `sky launch` reads them. `file_dir`: the file's own directory (None:
    stdin), named in the message when a path is missing there but not here."""
    cwd: Path
    file_dir: Path | None

    def path(self, given: str, at: str, field: str) -> Path:
        """`given` read from `cwd`; missing there but beside the file: said so."""
        local = self.cwd / Path(given).expanduser()
        beside = self.file_dir / Path(given).expanduser() if self.file_dir is not None else None
        if local.exists() or beside is None or beside == local or not beside.exists():
            return local
        raise click.ClickException(
            f"{at}: {field}: {local} does not exist; the task file's directory has {beside.name or beside}: "
            f"relative paths are read from the current directory, as `sky launch` reads them (run from "
            f"{self.file_dir}, or give the path from here)")


def _upload_local(c: Client, doc: dict[str, Any], base: Local,
                  at: Callable[[str], str], shown: bool = False) -> tuple[dict[str, Any], bool]:
    """The document with its local directories (workdir, file mount sources:
    relative paths from the current directory, as SkyPilot reads them)
    uploaded and named by their sha256; and whether anything was.
    `at(field)`: its FILE:LINE. `shown`: progress bars (on a terminal)."""
    doc, uploaded = dict(doc), False
    if isinstance(doc.get("workdir"), str):
        workdir = base.path(doc["workdir"], at("workdir"), "workdir")
        doc["workdir"] = {"upload": upload_workdir(c, workdir, at("workdir"), shown=shown)}
        uploaded = True
    mounts = doc.get("file_mounts")
    if isinstance(mounts, dict):
        mounts = dict(mounts)
        for remote, source in mounts.items():
            if isinstance(source, str) and "://" not in source:
                field = f"file_mounts.{remote}"
                local = base.path(source, at(field), field)
                if local.is_file():  # one file (`~/.ssh/id_rsa: ~/.ssh/sky-key`): placed at the path itself
                    mounts[remote] = {"upload": upload_workdir(c, local, at(field), field, one_file=True,
                                                               shown=shown), "file": True}
                elif local.is_dir():
                    mounts[remote] = {"upload": upload_workdir(c, local, at(field), field, shown=shown)}
                else:
                    raise click.ClickException(f"{at(field)}: {field}: {local} does not exist (or is not a file "
                                               "or directory): the broker mounts a directory or a file (uploaded) "
                                               "or a storage URI")
                uploaded = True
        doc["file_mounts"] = mounts
    return doc, uploaded


def _located(exc: ApiError, text: bytes | None, flags) -> str:
    """The API's message, each field error with its line in the user's file
    (the broker may have read a re-written copy, with uploads in it), or the
    flag that set the field; one line per flag and message."""
    errors = exc.body.get("errors") or []
    if not errors or (text is None and not flags.any()):
        return str(exc)
    return _listed(exc.body.get("detail") or str(exc.status), errors, text, flags)


def _listed(detail: str, errors: list[dict], text: bytes | None, flags) -> str:
    from spotbroker.broker.jobs import overrides
    from spotbroker.broker.usecases.taskyaml import Lines

    where = Lines(text.decode("utf-8", "replace")) if text is not None else None
    out, told = [detail], set()
    for err in errors:
        field, message = str(err.get("field")), err.get("message")
        if (flag := overrides.flag_of(field, flags)) is not None:
            if (flag, message) not in told:
                told.add((flag, message))
                out.append(f"  {flag}: {message}")
            continue
        line = where.of(field) if where is not None else None
        out.append(f"  {f'line {line}: ' if line else ''}{field}: {message}")
    return "\n".join(out)


def upload_workdir(c: Client, workdir: Path, where: str, field: str = "workdir", one_file: bool = False,
                   shown: bool = False) -> str:
    """Pack a workdir and upload it, with progress bars when `shown`; its sha256, which
    the job names. Problems with the directory are the user's to fix: a
    message naming it, the field (at `where` in the file), no traceback."""
    import tempfile

    from spotbroker.broker.jobs.workdir import WorkdirError, pack, pack_file

    what = "file" if one_file else "workdir" if field == "workdir" else "directory"
    with tempfile.TemporaryFile() as archive:
        try:
            with progress.bar(f"packing {what}", None, shown) as packing:
                packed = (pack_file if one_file else pack)(workdir, archive, packing if shown else None)
        except WorkdirError as exc:  # its message says "workdir {path} ...": a file mount says its own field
            message = str(exc) if field == "workdir" else f"{field}: {str(exc).removeprefix('workdir ')}"
            raise click.ClickException(f"{where}: {message}") from None
        archive.flush()
        archive.seek(0)
        click.echo(f"uploading {what} {workdir}: {packed.files} files, {packed.file_bytes / 1e6:.1f} MB "
                   f"({packed.bytes / 1e6:.1f} MB packed)", err=True)
        with progress.bar(f"uploading {what}", packed.bytes, shown) as sending:
            c.upload(archive, packed.sha256, packed.bytes, sending if shown else None)
    return packed.sha256


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"{file}: {exc.strerror}") from None


@click.command("jobs")
@click.option("--state", "states", multiple=True, help="filter (repeatable): PENDING, RUNNING, ...")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500), help="jobs a page")
@click.option("--all", "every", is_flag=True, help="every page (a script that acts on each job: one page missed "
              "the rest silently)")
@click.option("--json", "as_json", is_flag=True)
def list_jobs(states: tuple[str, ...], limit: int, every: bool, as_json: bool) -> None:
    """List your team's jobs, newest first."""
    c = token_client()
    page = call(c.jobs, [s.upper() for s in states], limit)
    while every and page.get("next_cursor"):
        more = call(c.jobs, [s.upper() for s in states], limit, page["next_cursor"])
        page = {**more, "jobs": page["jobs"] + more["jobs"]}
    if as_json:
        _echo_json(page)
        return
    if page.get("next_cursor"):
        click.echo(f"(the newest {len(page['jobs'])}: --all lists every page)", err=True)
    from rich.table import Table

    from spotbroker.broker.cli.output import console

    table = Table("ID", "NAME", "STATE", "REASON", "WHERE", "ATTEMPTS", "COST $", "SUBMITTED")
    for j in page["jobs"]:
        last = j["attempts"][-1] if j["attempts"] else None
        style = _STATE_STYLE.get(j["state"], "")
        table.add_row(str(j["id"]), j["name"], f"[{style}]{j['state']}[/]" if style else j["state"],
                      short_reason(j), _where(last) if last else "-", str(len(j["attempts"])), f"{j['cost']:.4f}",
                      j["created_at"][:19].replace("T", " "))
    console().print(table)


REASON_WIDTH = 44  # the list stays narrow: `spotbroker job ID` says the whole reason


def short_reason(job: dict[str, Any]) -> str:
    """Why a job that does not run waits, in a column's width ('-' for a running or succeeded one)."""
    reason = job.get("reason")
    if not reason or job["state"] in ("RUNNING", "SUCCEEDED"):
        return "-"
    reason = safe_markup(reason)  # a table cell is markup
    return reason if len(reason) <= REASON_WIDTH else reason[:REASON_WIDTH - 1] + "…"


@click.command("job")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show_job(job_id: int, as_json: bool) -> None:
    """Show one job: state, attempts, cost and events."""
    c = token_client()
    job = call(c.job, job_id)
    if as_json:
        _echo_json(job)
        return
    print_job(job, call(c.events, job_id))


def interval_line(interval: dict[str, Any]) -> str:
    """The checkpoint interval in force, and why (broker/recovery/intervals.py)."""
    seconds = interval.get("seconds")
    what = f"{seconds / 60:.1f} min" if seconds else "the trainer's own"
    return f"checkpoint interval: {what} ({interval.get('mode')}): {interval.get('why', '')}"


def print_job(job: dict[str, Any], events: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from spotbroker.broker.cli.money import energy_line
    from spotbroker.broker.cli.output import console

    out = console()
    out.print(f"[bold]job {job['id']}[/] {job['name']}: {job['state']}"
              + (f" ({safe_markup(job['reason'])})" if job.get("reason") else "") + f", cost ${job['cost']:.6f}")
    if job.get("energy") and any(a.get("started_at") for a in job["attempts"]):  # a job that never ran: none
        out.print(energy_line(job), markup=False)
    if job.get("labels"):
        out.print("labels: " + ", ".join(f"{k}={v}" for k, v in job["labels"].items()), markup=False)
    if job.get("preflight"):
        print_preflight(out, job["preflight"])
    attempts = Table("ATTEMPT", "STATE", "WHERE", "STARTED", "ENDED", "COST $", title="attempts")
    for a in job["attempts"]:
        attempts.add_row(str(a["id"]) + (" pre-flight" if a.get("preflight") else ""),
                         a["state"] + (f" ({safe_markup(a['reason'])})" if a["reason"] else ""), _where(a),
                         (a["started_at"] or "-")[11:19], (a["ended_at"] or "-")[11:19], f"{a['cost']:.6f}")
    out.print(attempts)
    if job.get("early_stop"):
        from spotbroker.broker.cli.metrics import early_stop_lines

        out.print(printable("\n".join(early_stop_lines(job["early_stop"]))), markup=False)
    if job.get("checkpoint_interval"):
        out.print(interval_line(job["checkpoint_interval"]))
    table = Table("AT", "EVENT", "ATTEMPT", "DETAIL", title="events")
    for e in events:
        # cloud payloads, and a failed pre-flight's output (printed above): see --json
        data = {k: v for k, v in e["data"].items() if k not in ("raw", "agent_at", "tail")}
        change = f"{data.pop('from')} -> {data.pop('to')} " if "to" in data else ""
        detail = change + " ".join(f"{k}={v}" for k, v in data.items())
        table.add_row(e["at"][11:23], e["type"], str(e["attempt_id"] or ""), safe_markup(detail))
    out.print(table)


def print_preflight(out: Any, pf: dict[str, Any]) -> None:
    """The pre-flight's outcome, its cost, and what the GPU launch would have cost by then."""
    status = pf["status"] + (f" ({pf['why']})" if pf.get("why") else "")
    line = f"pre-flight: {status}"
    if "seconds" in pf:
        line += f" in {pf['seconds']:.1f} s on {pf.get('instance_type') or '-'}, cost ${pf['cost']:.6f}"
    if "gpu_would_have_cost" in pf:
        line += (f"; the GPU launch ({pf['gpu_instance_type']} at {pf['gpu_place']}, ${pf['gpu_price_per_hour']:.4f}/h"
                 f" x {pf['num_nodes']} node{'s' if pf['num_nodes'] != 1 else ''}) would have cost "
                 f"${pf['gpu_would_have_cost']:.6f} by then")
    out.print(safe_markup(line))
    if pf.get("tail"):  # the trainer's output: no control sequence of its own reaches the terminal
        out.print(safe_markup(pf["tail"].rstrip("\n")), style="red")


@click.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", "follows", is_flag=True,
              help="keep printing, across attempts, until the job ends; exit 0 only if it succeeded")
@click.option("--tail", type=int, default=None, help="only the last N lines (following: of the newest attempt)")
@click.option("--attempt", type=int, default=None, help="an earlier attempt's log (following: until it ends)")
@click.option("--node", type=click.IntRange(min=0), default=None, help="another node's output (its rank; default 0)")
def logs(job_id: int, follows: bool, tail: int | None, attempt: int | None, node: int | None) -> None:
    """Print a job's output (its newest attempt's, node 0's, by default).

    With -f, every attempt's output in order from the first (from the
    newest's last --tail lines when given), a line at each change (why an
    attempt ended, where the next runs, why the job waits) until it ends."""
    c = token_client()
    if follows and attempt is None:
        sys.exit(0 if follow(c, job_id, tail, node)["state"] == "SUCCEEDED" else 1)
    if follows:
        try:
            for chunk in c.follow_logs(job_id, tail, node, attempt):
                click.echo(chunk, nl=False)
        except ApiError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        click.echo(call(c.logs, job_id, tail, attempt, node), nl=False)


@click.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def cancel(job_id: int, as_json: bool) -> None:
    """Cancel a job (what still runs gets SIGTERM, then SIGKILL)."""
    job = call(token_client().cancel, job_id)
    if as_json:
        _echo_json(job)
    elif job["state"] in ("SUCCEEDED", "FAILED"):  # (a cancel is idempotent: one already ended is left as it is)
        click.echo(f"job {job['id']}: {job['state']}: it had already ended, nothing was cancelled")
    else:
        click.echo(f"job {job['id']}: {job['state']}")


@click.command("simulate-preemption")
@click.argument("job_id", type=int)
def simulate_preemption(job_id: int) -> None:
    """Send a preemption notice to a job's running attempt (local launcher only)."""
    job = call(token_client().simulate_preemption, job_id)
    click.echo(f"job {job['id']}: preemption notice sent to attempt {job['attempts'][-1]['id']}")


@click.command("checkpoints")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def checkpoints(job_id: int, as_json: bool) -> None:
    """List a job's committed checkpoints, newest first."""
    found = call(token_client().checkpoints, job_id)
    if as_json:
        _echo_json(found)
        return
    from rich.table import Table

    from spotbroker.broker.cli.output import console

    table = Table("ID", "ATTEMPT", "STEP", "MB", "SECONDS", "REASON", "KEEP", "URI")
    for c in found:
        table.add_row(str(c["id"]), str(c["attempt_id"]), str(c["step"]), f"{c['bytes'] / 1e6:.1f}",
                      f"{c['seconds']:.2f}" if c["seconds"] is not None else "-", c["reason"] or "-",
                      "yes" if c["keep"] else "", c["uri"])
    console().print(table)
