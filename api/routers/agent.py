"""The node agent's channel (authenticated by the per-attempt agent token,
never by a team token): events and the trainer's output.

A token is its attempt's alone: whatever it sends lands on that attempt. It
works while the attempt runs and for `agent_token_grace` seconds after it
ended; then every route answers 410 Gone, on which the agent stops."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm.exc import StaleDataError

from spotbroker.agent import protocol
from spotbroker.api.errors import Problem, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.schemas import BoundedData
from spotbroker.broker.jobs import logs
from spotbroker.broker.jobs.spec import MAX_NODES
from spotbroker.broker.launch import storage_credentials
from spotbroker.broker.recovery import agent_channel
from spotbroker.broker.store.db import retrying, transaction
from spotbroker.broker.store.models import Attempt

router = APIRouter(tags=["agent"], route_class=JSONBodyRoute)
_bearer = HTTPBearer(auto_error=False, description="the attempt's agent token")
MAX_LOG_CHUNK = 4 << 20
MAX_EVENT_DATA = 64 << 10  # bytes of JSON in one event's data
DRAIN_REPORT_S = 15.0  # of a drain's time, kept for the agent's report of the commit to reach us
MINT_INTERVAL_S = 10.0  # an attempt's nodes asking within this share one mint of storage credentials


class AgentEventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1, le=2**31 - 1)
    type: str
    at: datetime
    data: BoundedData = Field(default_factory=dict)

    @field_validator("at")
    @classmethod
    def _in_range(cls, at: datetime) -> datetime:
        try:
            at.astimezone(UTC)  # (year 1 at +14:00 is no instant the database can hold)
        except (OverflowError, ValueError):
            raise ValueError("not an instant in range") from None
        return at

    @field_validator("data")
    @classmethod
    def _small(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An event is a few fields: far less than a job document may be."""
        if len(json.dumps(data)) > MAX_EVENT_DATA:
            raise ValueError(f"at most {MAX_EVENT_DATA} bytes of JSON")
        return data


class AgentEvents(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[AgentEventIn] = Field(max_length=1000)


class AgentAnswer(BaseModel):
    accepted: int
    last_seq: int
    cancel: bool = Field(description="the attempt is over: stop the trainer")
    drain: bool = Field(False, description="the broker moves the job: flush a checkpoint now, as on a "
                                           "preemption notice; the attempt is then stopped")
    drain_seconds: float | None = Field(None, description="a drain: the flush must be committed within this")
    stop: bool = Field(False, description="the job's early_stop rule fired: checkpoint at the next step "
                                          "boundary and stop (the library's stop.json)")
    checkpoint_interval_s: float | None = Field(None, description="the checkpoint library's periodic interval in "
                                                "force, in seconds, instead of the trainer's own; null: its own")


class CredentialsAnswer(BaseModel):
    provider: str = Field(description="s3, gs or az")
    expires_at: datetime
    bucket: str = Field(description="the checkpoint root's bucket (Azure: container): the only one they are for")
    options: dict[str, str] = Field(description="where the bucket is, when not the provider's default: "
                                                "endpoint, region (Azure: account, endpoint)")
    credentials: dict[str, str] = Field(description="obstore's fields for the provider (S3: access_key_id, "
                                                    "secret_access_key, token; GCS: token; Azure: a SAS token per "
                                                    "place, by its path, a directory's ending with '/')")


class LogAnswer(BaseModel):
    size: int = Field(description="the offset of the trainer's output up to which the broker has it (past "
                                  "SPOTBROKER_MAX_LOG_BYTES, taken and dropped)")


@dataclass(frozen=True)
class AttemptRef:
    id: int
    job_id: int
    num_nodes: int = 1


def current_attempt(request: Request,
                    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> AttemptRef:
    if creds is None or not creds.credentials:
        raise Problem(401, "Unauthorized", "send 'Authorization: Bearer <agent token>'",
                      headers={"WWW-Authenticate": "Bearer"})
    state = request.app.state
    with state.session_factory() as session:
        attempt = agent_channel.attempt_for_token(session, creds.credentials)
        if attempt is None:
            raise Problem(401, "Unauthorized", "unknown agent token", headers={"WWW-Authenticate": "Bearer"})
        grace = state.settings.agent_token_grace
        if agent_channel.token_gone(attempt, state.clock.now(), grace):
            raise Problem(410, "Gone", f"attempt {attempt.id} ended more than {grace:g} s ago: "
                          "its agent token no longer works, and nothing more is taken from it")
        return AttemptRef(attempt.id, attempt.job_id, attempt.num_nodes)


CurrentAttempt = Annotated[AttemptRef, Depends(current_attempt)]
_GONE = "The attempt ended longer ago than the grace window: stop delivering"


@router.post(protocol.EVENTS_PATH, response_model=AgentAnswer, responses=responses(401, 410, 422, 503, s410=_GONE))
async def post_events(request: Request, body: AgentEvents, attempt: CurrentAttempt) -> AgentAnswer:
    """Report events, in order; a re-sent event (same seq) is ignored. A batch
    with a checkpoint that is not at this attempt's own place for its step is
    refused whole (422 naming it; a `checkpoint_refused` event on the job)."""
    for e in body.events:
        if e.type not in protocol.AGENT_EVENT_TYPES:
            raise Problem(422, "Invalid request", f"unknown event type {e.type!r}",
                          errors=[{"field": "events.type", "message": f"one of {sorted(protocol.AGENT_EVENT_TYPES)}"}])
    state = request.app.state
    events = [agent_channel.AgentEvent(e.seq, e.type, e.at, e.data) for e in body.events]

    def store() -> agent_channel.Outcome:
        # Another writer of the job (the reconciler, another broker) may win the
        # race for its row: take the batch again on the new row (events are
        # idempotent by seq) rather than answer a 500.
        try:
            return retrying(state.session_factory, lambda session: agent_channel.record(
                session, session.get(Attempt, attempt.id), events, state.settings.checkpoint_uri,
                clock=state.clock, interval_refresh_s=state.settings.placement_interval,
                history_days=state.settings.placement_history_days))
        except StaleDataError:
            raise Problem(503, "Unavailable", "the job changed under every try: send the batch again",
                          headers={"Retry-After": "1"}) from None

    outcome = await run_in_threadpool(store)
    if outcome.refused:
        raise Problem(422, "Invalid request", f"{outcome.refusal}: nothing of the batch was stored",
                      errors=outcome.refused)
    if outcome.moved:
        state.reconciler.hint()
    drain_seconds = None
    if outcome.drain_until is not None:  # leave time for the commit's report to arrive
        left = (outcome.drain_until - state.clock.now()).total_seconds() - DRAIN_REPORT_S
        drain_seconds = max(left, 1.0)
    return AgentAnswer(accepted=outcome.accepted, last_seq=outcome.last_seq, cancel=outcome.cancel,
                       drain=outcome.drain, drain_seconds=drain_seconds, stop=outcome.stop,
                       checkpoint_interval_s=outcome.checkpoint_interval_s)


@router.post(protocol.LOGS_PATH, response_model=LogAnswer, responses=responses(401, 410, 413, 422, s410=_GONE))
async def post_logs(request: Request, attempt: CurrentAttempt,
                    offset: Annotated[int, Header(alias=protocol.LOG_OFFSET_HEADER, ge=0, le=2**63 - 1)],
                    node: Annotated[int, Header(alias=protocol.LOG_NODE_HEADER, ge=0, le=MAX_NODES - 1)] = 0,
                    ) -> LogAnswer:
    """Append node `X-Log-Node`'s output (default 0) at `X-Log-Offset`. A
    chunk that starts past the end is refused (the answer says where to
    resume); one that overlaps what is stored adds only its new bytes. The
    log keeps at most SPOTBROKER_MAX_LOG_BYTES: the chunk that reaches it
    ends the log with a marker and a `log_truncated` event, and what comes
    after is dropped. The log lives in the database: any replica serves it."""
    if node >= attempt.num_nodes:
        raise Problem(422, "Invalid request", f"the attempt has {attempt.num_nodes} node(s): no node {node}",
                      errors=[{"field": protocol.LOG_NODE_HEADER, "message": f"at most {attempt.num_nodes - 1}"}])
    chunk = await request.body()
    if len(chunk) > MAX_LOG_CHUNK:
        raise Problem(413, "Payload too large", f"send at most {MAX_LOG_CHUNK} bytes at a time")
    state = request.app.state
    appended = await run_in_threadpool(logs.append_at, state.session_factory, attempt.id, node, offset, chunk,
                                       state.settings.max_log_bytes)
    if appended.cut:
        def record() -> None:
            with transaction(state.session_factory) as session:
                agent_channel.log_truncated(session, attempt.job_id, attempt.id, state.settings.max_log_bytes,
                                            state.clock)

        await run_in_threadpool(record)
    return LogAnswer(size=appended.size)


_mints_lock = threading.Lock()


def _recently_minted(state: Any, attempt_id: int, mint: Callable[[], dict[str, Any] | None],
                     seconds: float) -> dict[str, Any] | None:
    """Each mint is a call to the cloud's STS, on the broker's own rate: an
    attempt asking again within `seconds` (its other nodes renewing at the
    same time, or a node asking in a loop) gets the same credentials."""
    now = time.monotonic()
    with _mints_lock:
        recent: dict[int, tuple[float, dict[str, Any] | None]] = getattr(state, "credential_mints", None) or {}
        state.credential_mints = recent
        found = recent.get(attempt_id)
        if found is not None and now - found[0] < seconds:
            return found[1]
        for key in [k for k, (t, _) in recent.items() if now - t >= seconds]:  # never kept longer than that
            del recent[key]
    document = mint()
    with _mints_lock:
        recent[attempt_id] = (now, document)
    return document


@router.post(protocol.CREDENTIALS_PATH, response_model=CredentialsAnswer,
             responses=responses(401, 404, 409, 410, 503, s404="The checkpoint root needs no credentials (file://)",
                                 s409="The attempt has ended", s410=_GONE))
async def post_credentials(request: Request, attempt: CurrentAttempt) -> JSONResponse:
    """Fresh storage credentials for the attempt's node, scoped to its job as
    at launch (write its attempt's prefix, read its job's and its code)."""
    state = request.app.state

    def mint() -> dict[str, Any] | None:
        with state.session_factory() as session:
            live = storage_credentials.live_attempt(session, attempt.id)

            def fresh() -> dict[str, Any] | None:
                minted = storage_credentials.for_attempt(session, live, state.settings)
                return minted.document() if minted else None

            return _recently_minted(state, attempt.id, fresh, MINT_INTERVAL_S)

    try:
        document = await run_in_threadpool(mint)
    except storage_credentials.AttemptEnded as exc:
        raise Problem(409, "Conflict", str(exc)) from None
    except storage_credentials.NoCredentials as exc:
        raise Problem(503, "Unavailable", str(exc), headers={"Retry-After": "15"}) from None
    if document is None:
        raise Problem(404, "Not found", "this attempt's checkpoint root is a local directory: no credentials")
    return JSONResponse(document, headers={"Cache-Control": "no-store"})
