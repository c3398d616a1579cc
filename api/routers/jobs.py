"""Jobs: submit, list, read, events, logs, cancel. Each route parses,
authorizes, calls one `broker` function and shapes the answer."""
from __future__ import annotations

import hashlib
import json
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm.exc import StaleDataError

from spotbroker.api.deps import MAX_ID, CheckpointId, CurrentTeam, JobId, SessionDep
from spotbroker.api.errors import Problem, field_errors, invalid, responses
from spotbroker.api.following import Followers, FollowResponse, TooManyFollowers, pages, while_authorized
from spotbroker.api.guard import bearer_token
from spotbroker.api.jobfollow import follow_job
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.schemas import (
    CheckpointList,
    CheckpointOut,
    EventList,
    EventOut,
    JobOut,
    JobPage,
    JobSubmitted,
    SubmitWarning,
)
from spotbroker.broker.checkpoints import records
from spotbroker.broker.checkpoints.uris import CheckpointUnverified
from spotbroker.broker.jobs import buckets, execlimits, mounts, resfields, uploads
from spotbroker.broker.jobs.spec import (
    MAX_NODES,
    MAX_SPEC_BYTES,
    JobSpec,
    SpecShapeError,
    SpecSyntaxError,
    load_document,
)
from spotbroker.broker.jobs.states import JobState
from spotbroker.broker.placement import host
from spotbroker.broker.store.db import retrying, transaction
from spotbroker.broker.usecases import intake, jobs, taskyaml

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=JSONBodyRoute)

MAX_BODY = 1 << 20
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
# Task files parsed at once per process. Reading one is pure Python holding
# the GIL (PyYAML, then SkyPilot's schema): a megabyte takes seconds of CPU,
# and a team posting dozens at once would starve the event loop (every
# team's requests, the agents' heartbeats). The others wait their turn
# without a thread, and a team parses one file at a time (`parse_turns`):
# four loops of a team's slow file held both places from the other teams.
YAML_PARSES = 2
CHECKPOINTS_PAGE = 1000  # a job's checkpoints listed at once (a trainer can commit thousands an attempt)
_READ = responses(401, 403, 404, 422)
# The most events one answer holds: a job's agent may write many, and an
# answer of all of them was once 72 MB (docs/security.md).
EVENTS_PAGE = 1000


def _not_found(job_id: int) -> Problem:
    return Problem(404, "Not found", f"no job {job_id}")


def _get(session, team, job_id: int):
    try:
        return jobs.get(session, team.team_id, job_id)
    except jobs.JobNotFound:
        raise _not_found(job_id) from None


async def _parse_task(request: Request, team_id: int, body: bytes) -> tuple[dict, list[dict]]:
    state = request.app.state
    limiter = getattr(state, "yaml_limiter", None)
    if limiter is None:  # made in the app's own event loop, which it belongs to
        limiter = state.yaml_limiter = anyio.CapacityLimiter(YAML_PARSES)
    async with state.parse_turns.turn(team_id):
        return await anyio.to_thread.run_sync(taskyaml.parse_warned, body, limiter=limiter)


async def _refused(request: Request, errors: list[dict]) -> Problem:
    """A 422 for a submitted spec's errors, each with its line in a task file."""
    return invalid(_with_lines(errors, await request.body(), _format_of(request)))


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "application/json").split(";")[0].strip().lower()


def _format_of(request: Request) -> str:
    return "yaml" if _content_type(request) in _YAML_TYPES else "json"


def _with_lines(errors: list[dict], body: bytes, fmt: str) -> list[dict]:
    """A task file's errors (the first few), each with the line of its field."""
    errors = taskyaml.capped(errors)
    if fmt == "yaml":
        lines = taskyaml.Lines(body.decode("utf-8"))
        for err in errors:
            if line := lines.of(err["field"]):
                err["line"] = line
    return errors


async def _read_spec(request: Request, team_id: int, policy) -> tuple[JobSpec, list[dict]]:
    """The submitted spec, the team `policy`'s defaults merged under it, and
    the warnings about what of it was dropped."""
    body = await _spec_body(request)
    ctype, fmt = _content_type(request), _format_of(request)
    if ctype not in _YAML_TYPES and ctype not in ("application/json", ""):
        raise Problem(415, "Unsupported media type", f"send application/json or application/yaml, not {ctype}")
    try:
        # A task file is read by SkyPilot's own schema (seconds for the first
        # one a process reads: `import sky`), off the event loop.
        doc, warnings = await _parse_task(request, team_id, body) if fmt == "yaml" else (load_document(body, fmt), [])
    except SpecShapeError as exc:
        err = {"field": exc.field, "message": exc.detail}
        if exc.line:  # a duplicate key: where the second one is
            err["line"] = exc.line
        raise invalid([err]) from None
    except SpecSyntaxError as exc:
        err = {"field": "body", "message": str(exc)}
        if exc.line:
            err["line"] = exc.line
        raise invalid([err]) from None
    except taskyaml.TaskFileError as exc:
        raise invalid(exc.errors) from None
    doc = intake.with_defaults(doc, policy)
    try:
        spec = JobSpec.model_validate(doc)
    except ValidationError as exc:
        errors = field_errors(exc.errors(), doc=doc)
        for err in errors:
            if err["field"] == "labels":
                err["message"] = resfields.MISPLACED_LABELS
        raise invalid(_with_lines(errors, body, fmt)) from None
    errors, passed_over = await run_in_threadpool(request.app.state.accelerators.judge, spec)
    if errors:
        raise invalid(_with_lines(errors, body, fmt))
    warnings = [*warnings, *_with_lines(passed_over, body, fmt)]
    if len(json.dumps(spec.stored())) > MAX_SPEC_BYTES:
        raise invalid([{"field": "body", "message": f"the stored spec would be over {MAX_SPEC_BYTES} bytes"}])
    return spec, warnings


@router.post("", status_code=201, response_model=JobSubmitted, responses=responses(
                 401, 403, 413, 415, 422, 429, s429="The team has as many unfinished jobs as it may have at once "
                 "(SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM)"),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
                 "application/yaml": {"schema": {"$ref": "#/components/schemas/JobSpec"}}}}})
async def submit_job(request: Request, team: CurrentTeam,
                     idempotency_key: Annotated[str | None, Header(
                         max_length=128, description="retries with the same key return the same job")] = None,
                     ) -> JobSubmitted:
    """Submit a job: a JSON job spec, or a SkyPilot task YAML
    (`Content-Type: application/yaml`), read with SkyPilot's own schema. A
    task file without `use_spot` runs on on-demand, as in SkyPilot; a JSON
    spec without it on spot. `warnings` says what of a task file was
    dropped (an alternative on a cloud the broker does not place on), and
    whether the job is HELD from the start (over budget, or over the team's
    GPUs at once). The team's policy (`PUT /v1/teams/{team}/policy`) adds its
    defaults and refuses a job that breaks one of its limits."""
    state = request.app.state
    known = await run_in_threadpool(intake.team_of, state.session_factory, team.team_id, state.clock.now(),
                                    state.settings.max_unfinished_jobs_per_team, idempotency_key)
    if known.full:  # before the spec is read: a full team's flood costs no parse
        raise Problem(429, "Too many requests", known.full, headers={"Retry-After": "60"})
    digest = await _request_digest(request) if idempotency_key is not None else None
    if known.keyed is not None and known.keyed.digest is not None:
        # A retry is answered by what it sends, before its spec meets today's policy and clock
        # (a deadline a few seconds nearer refused the retry of a request that had made its job).
        if known.keyed.digest != digest:
            raise invalid([{"field": "Idempotency-Key", "message": f"already used for job {known.keyed.job_id}, "
                            "made by another request; a retry must send the same body, a new job a new key"}])
        return await run_in_threadpool(_submitted, state, team, known.keyed.job_id)
    spec, warnings = await _read_spec(request, team.team_id, known.policy)
    if problems := spec.per_attempt_errors() + execlimits.size_errors(spec):
        raise await _refused(request, problems)
    problem = spec.deadline_error(state.clock.now(), state.settings.restart_overhead_seconds
                                  + state.settings.deadline_margin_seconds)
    if problem:
        raise await _refused(request, [{"field": "deadline", "message": problem}])
    if spec.workdir is not None:  # a look at storage: only for the jobs that need one
        problem = await run_in_threadpool(uploads.workdir_error, state.settings, team.team_name, spec.workdir)
        if problem:
            raise await _refused(request, [problem])
    if spec.file_mounts:
        problems = await run_in_threadpool(_mount_errors, state, team, spec)
        if problems:
            raise await _refused(request, problems)
        warnings = warnings + mounts.mount_warnings(state.settings, spec)
    admission = intake.without_policy(known) or await run_in_threadpool(
        intake.admit, state.session_factory, team.team_id, team.team_name, spec, known, state.settings.cpu_jobs_on_host)
    if admission.errors:
        raise await _refused(request, admission.errors)
    out = await request.app.state.batcher.submit(jobs.Submission(team.team_id, spec, idempotency_key,
                                                                 admission.hold, digest), team.team_name)
    if idempotency_key is not None and not jobs.same_spec(out.spec, spec):
        # The key named another request: answering with its job would tell the
        # caller that this one was submitted.
        raise invalid([{"field": "Idempotency-Key", "message": f"already used for job {out.id}, whose spec "
                        "differs from this one; a retry must send the same body, a new job a new key"}])
    if out.state == JobState.HELD:
        warnings = [*warnings, {"field": "state", "message": f"the job is HELD: {out.reason}"}]
    elif beyond := host.beyond_launchers(spec, state.launchers, state.settings):  # (held at the first look)
        warnings = [*warnings, {"field": beyond[0], "message": f"the job will be HELD: {beyond[1]}"}]
    # Already a JobOut: send it as it is, without validating it a second time.
    answer = JobSubmitted.model_construct(**dict(out), warnings=[SubmitWarning(**w) for w in warnings])
    return Response(answer.model_dump_json(), status_code=201, media_type="application/json")


async def _spec_body(request: Request) -> bytes:
    body = await request.body()  # (read once: Starlette keeps it for the next call)
    if len(body) > MAX_BODY:
        raise Problem(413, "Payload too large", f"a job spec is at most {MAX_BODY} bytes")
    return body


async def _request_digest(request: Request) -> str:
    """What a retry is compared by: the body as sent, and whether it is JSON or a task file."""
    return hashlib.sha256(_format_of(request).encode() + b"\0" + await _spec_body(request)).hexdigest()


def _submitted(state, team, job_id: int) -> Response:
    """The answer to a retried submission: its job, as the first answer showed it."""
    with state.session_factory() as session:
        out = JobOut.of(jobs.get(session, team.team_id, job_id), team.team_name, state.clock.now())
    answer = JobSubmitted.model_construct(**dict(out), warnings=[])
    return Response(answer.model_dump_json(), status_code=201, media_type="application/json")


def _mount_errors(state, team, spec) -> list[dict]:
    with state.session_factory() as session:
        allow = buckets.allowed(session, team.team_id)
    return mounts.mount_errors(state.settings, team.team_name, spec, allow)


@router.get("", response_model=JobPage, responses=responses(401, 403, 422))
def list_jobs(request: Request, session: SessionDep, team: CurrentTeam,
              state: Annotated[list[JobState] | None, Query(description="repeat to filter by several")] = None,
              cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,19}$", description="a page's next_cursor")] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50) -> JobPage:
    """Jobs of the caller's team, newest first."""
    if cursor is not None and int(cursor) > MAX_ID:
        raise invalid([{"field": "cursor", "message": f"at most {MAX_ID}"}])
    found = jobs.list_jobs(session, team.team_id, states=state or (),
                           before=int(cursor) if cursor else None, limit=limit + 1)
    now = request.app.state.clock.now()
    page = [JobOut.of(j, team.team_name, now) for j in found[:limit]]
    return JobPage(jobs=page, next_cursor=str(page[-1].id) if len(found) > limit else None)


@router.get("/{job_id}", response_model=JobOut, responses=_READ)
def get_job(request: Request, job_id: JobId, session: SessionDep, team: CurrentTeam) -> JobOut:
    return JobOut.of(_get(session, team, job_id), team.team_name, request.app.state.clock.now())


@router.get("/{job_id}/events", response_model=EventList, responses=_READ)
def job_events(job_id: JobId, session: SessionDep, team: CurrentTeam,
               after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="only events with a larger id")]
               = None,
               limit: Annotated[int, Query(ge=1, le=EVENTS_PAGE)] = EVENTS_PAGE) -> EventList:
    """The job's history, oldest first, a page at a time (`next_after`)."""
    try:
        found = jobs.events(session, team.team_id, job_id, after=after, limit=limit + 1)
    except jobs.JobNotFound:
        raise _not_found(job_id) from None
    page = [EventOut.of(e) for e in found[:limit]]
    return EventList(events=page, next_after=page[-1].id if len(found) > limit else None)


@router.get("/{job_id}/logs", response_class=PlainTextResponse, responses={
    **responses(401, 403, 404, 410, 422, 429, s410="the attempt's log was removed to keep the job's logs "
                "within SPOTBROKER_MAX_JOB_LOG_BYTES (its `log_removed` event)"),
    200: {"content": {"text/plain": {}}, "description": "the attempt's output (following: the job's)"}})
async def job_logs(request: Request, job_id: JobId, team: CurrentTeam,
                   attempt: Annotated[int | None, Query(ge=1, le=MAX_ID, description="default: the newest attempt")]
                   = None,
                   tail: Annotated[int | None, Query(ge=0, le=1_000_000, description="last N lines; default all")]
                   = None,
                   node: Annotated[int, Query(ge=0, le=MAX_NODES - 1, description="the node's rank; default 0")] = 0,
                   follow: Annotated[bool, Query(description="keep streaming until the job ends (with `attempt`: "
                                                         "until that attempt ends)")] = False):
    """An attempt's output, streamed (a read holds a page of it, never the
    whole log). Following without `attempt` follows the job: every
    attempt's output in order (from the newest's last `tail` lines when
    given), a line "— ... —" at each change (why an attempt ended, where
    the next runs, why the job waits), until the job ends, with its final
    state. Following holds no thread and no database connection, ends when
    the client goes, and is bounded per team (429). The stream's end is not
    the job's word: a broker that restarts, or a token revoked, ends it too
    (the last line says why where it can), and a job can print any line:
    read `GET /v1/jobs/{id}` for its state, as `spotbroker logs -f` does."""
    state = request.app.state
    try:
        start = await run_in_threadpool(jobs.log_start, state.session_factory, team.team_id, job_id, attempt, tail,
                                        node)
    except jobs.JobNotFound:
        raise _not_found(job_id) from None
    except jobs.AttemptNotFound as exc:
        raise Problem(404, "Not found", str(exc)) from None
    except jobs.LogRemoved as exc:
        raise Problem(410, "Gone", str(exc)) from None
    followers: Followers = state.followers
    if not follow and start is None:
        return PlainTextResponse("")
    # Every stream takes one of the team's places, a whole read too: a client
    # that reads slowly holds its stream's page (~1 MB) while it lasts, and
    # 1,000 of them grew the broker by 1.1 GB.
    try:
        followers.admit(team.team_id)
    except TooManyFollowers:
        raise Problem(429, "Too many requests", f"a team reads or follows at most {followers.per_team} logs at once "
                      "on this server", headers={"Retry-After": "5"}) from None
    if not follow:
        return FollowResponse(followers, team.team_id, pages(state.session_factory, (start.attempt_id, start.rank),
                                                             start.offset, start.end, followers.reads))
    token = bearer_token(request.scope) or ""

    def stands() -> bool:  # (a rotation ends what the old token opened, as it ends the token's logins)
        with state.session_factory() as session:
            return state.tokens.resolve(session, token) == team

    if attempt is not None:
        stream = followers.stream((start.attempt_id, start.rank), start.offset)
    else:
        first = (start.attempt_id, start.offset) if start is not None and tail is not None else None
        stream = follow_job(followers, team.team_id, job_id, node, first)
    return FollowResponse(followers, team.team_id, while_authorized(stream, stands))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=_READ)
def cancel_job(request: Request, job_id: JobId, team: CurrentTeam) -> JobOut:
    """Cancel a job; what still runs is stopped right after (SIGTERM, then SIGKILL)."""
    state = request.app.state

    def cancel(session) -> JobOut:
        try:
            job = jobs.cancel(session, team.team_id, job_id, clock=state.clock)
        except jobs.JobNotFound:
            raise _not_found(job_id) from None
        return JobOut.of(job, team.team_name, state.clock.now())
    try:
        out = retrying(state.session_factory, cancel)
    except StaleDataError:
        raise Problem(503, "Unavailable", "the job changed under every try: cancel again",
                      headers={"Retry-After": "1"}) from None
    state.reconciler.hint()
    return out


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, responses=_READ)
def list_checkpoints(job_id: JobId, session: SessionDep, team: CurrentTeam,
                     cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,19}\.[0-9]{1,19}$",
                                                         description="a page's next_cursor")] = None,
                     limit: Annotated[int, Query(ge=1, le=CHECKPOINTS_PAGE)] = CHECKPOINTS_PAGE) -> CheckpointList:
    """Committed checkpoints (every attempt's), newest step first, a page at a time."""
    before = tuple(int(n) for n in cursor.split(".")) if cursor else None
    if before is not None and max(before) > MAX_ID:
        raise invalid([{"field": "cursor", "message": f"two whole numbers of at most {MAX_ID}"}])
    try:
        found = jobs.checkpoints(session, team.team_id, job_id, limit + 1, before)
    except jobs.JobNotFound:
        raise _not_found(job_id) from None
    page = found[:limit]
    more = f"{page[-1].step}.{page[-1].id}" if len(found) > limit else None
    return CheckpointList(checkpoints=[_checkpoint_out(c) for c in page], next_cursor=more)


@router.post("/{job_id}/checkpoints/{checkpoint_id}/keep", response_model=CheckpointOut, responses=responses(
    401, 403, 404, 409, 422, s409="The checkpoint cannot be confirmed in storage (its manifest)"))
def keep_checkpoint(request: Request, job_id: JobId, checkpoint_id: CheckpointId, team: CurrentTeam) -> CheckpointOut:
    """Mark a checkpoint `keep` (the gold weights): never deleted or archived."""
    state = request.app.state
    with transaction(state.session_factory) as session:
        try:
            kept = jobs.keep_checkpoint(session, team.team_id, job_id, checkpoint_id, state.settings.checkpoint_uri)
            return _checkpoint_out(kept)
        except jobs.JobNotFound:
            raise _not_found(job_id) from None
        except records.CheckpointNotFound:
            raise Problem(404, "Not found", f"job {job_id} has no checkpoint {checkpoint_id}") from None
        except CheckpointUnverified as exc:
            raise Problem(409, "Conflict", f"checkpoint {checkpoint_id} cannot be kept: {exc}") from None


@router.post("/{job_id}/simulate-preemption", status_code=202, response_model=JobOut, responses=responses(
    401, 403, 404, 409, 422, s409="the job has no running attempt on the local launcher"))
def simulate_preemption(request: Request, job_id: JobId, team: CurrentTeam) -> JobOut:
    """Make the running attempt's simulated cloud send its preemption notice
    (local launcher only: a real cloud's notice cannot be forged)."""
    state = request.app.state
    try:
        jobs.await_simulated_cloud(state.session_factory, team.team_id, job_id, state.launchers)
        # a write from the start: on SQLite a read transaction that then writes fails at once
        # when another writer (the agent, the reconciler) came in between
        with transaction(state.session_factory) as session:
            job = jobs.simulate_preemption(session, team.team_id, job_id, state.launchers)
            return JobOut.of(job, team.team_name, state.clock.now())
    except jobs.JobNotFound:
        raise _not_found(job_id) from None
    except jobs.NotPreemptible as exc:
        raise Problem(409, "Conflict", str(exc)) from None


def _checkpoint_out(c) -> CheckpointOut:
    return CheckpointOut(id=c.id, attempt_id=c.attempt_id, step=c.step, uri=c.uri, bytes=c.bytes,
                         seconds=c.seconds, reason=c.reason, keep=c.keep, committed_at=c.committed_at)
