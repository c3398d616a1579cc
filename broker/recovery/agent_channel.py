"""The node agent's channel: what the broker does with an agent's reports.

Each attempt gets its own agent token at launch (only its digest is kept),
so an agent can post only for its own attempt. Events carry a sequence
number per attempt (per node of a multi-node attempt: the agents of nodes
above 0 say `node: N`); one already stored is ignored, so a buffered batch
can be re-sent safely. A seq may not run ahead of what an agent can have
counted to since its attempt was made (`SEQ_SLACK` plus `SEQS_PER_SECOND`
a second): an agent that jumped to the top of the range would have every
later report of its attempt ignored as already delivered. Smaller gaps are
an agent's ordinary life (it drops an event the broker refused; a node
above 0's heartbeats are not stored), so they are let through. What a notice or a flush does to the job (PREEMPTING,
then RECOVERING) is `broker/recovery/attempts.py`'s; the answer tells the agent
`drain: true` while the broker moves the job. Only the job's current
attempt moves anything: a late report from an attempt that was already
replaced is recorded (its checkpoint too: it lives under that attempt's own
prefix) but moves nothing.

A reported checkpoint must be at that attempt's own place for its step
(:mod:`spotbroker.broker.checkpoints.uris`); a batch with one that is not is
refused whole (nothing of it is stored), a `checkpoint_refused` event says so
on the job, and the agent re-sends the rest one by one. An attempt's token
works while it runs and for `agent_token_grace` seconds after it ended (the
flush that ends it is followed by the trainer's last words and logs); then
the token is *gone* and the agent stops.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from spotbroker.agent import logbound, protocol
from spotbroker.broker.auth import digest
from spotbroker.broker.checkpoints.uris import MAX_STEP, BadCheckpointUri, accepted_uri, attempt_prefix
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.energy import footprint
from spotbroker.broker.jobs import metrics
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, AttemptState, JobState, transition
from spotbroker.broker.recovery import attempts as recovery
from spotbroker.broker.recovery import earlystop, intervals
from spotbroker.broker.store.models import Attempt, Checkpoint, Event, Job, Team

A, J = AttemptState, JobState
AGENT_TOKEN_PREFIX = "sba_"
# Heartbeats are frequent and carry nothing new: they update the attempt, not the event log.
# Metrics have a table of their own (broker/jobs/metrics.py).
SILENT = {protocol.HEARTBEAT, protocol.METRICS, protocol.CHECKPOINTS_PRUNED}  # acted on, not stored
# The events whose data the agent writes itself: a trainer's own events
# (agent/trainer_process.py: checkpoints, resumed, ...) pass through with the
# data the trainer gave them, so a GPU energy figure in those is the job's say.
MEASURED_BY_AGENT = {protocol.HEARTBEAT, protocol.TRAINER_EXITED}
CHECKPOINT_REFUSED = "checkpoint_refused"  # the broker's event: a reported checkpoint it did not accept
MAX_BIG = 2**63 - 1
MAX_CHECKPOINTS_PER_ATTEMPT = 20_000  # a checkpoint a minute for two weeks: past it the oldest are forgotten
MAX_CHECKPOINT_BYTES = 2**50  # a pebibyte: no checkpoint is larger, and sums of them stay far from 2**63
MAX_REASON = 16  # the checkpoints.reason column
MAX_NODES = 4096
NODE_SEQ = "node_seq"  # stored with the events of nodes above 0: their agent's own seq
# An agent makes a heartbeat every 5 s and a few other events: 10 a second
# is far beyond it, and keeps a seq from reaching 2**31 for years.
SEQ_SLACK = 10_000
SEQS_PER_SECOND = 10
# What the job's history keeps of one event's data (the channel takes up to
# 64 KiB: api/routers/agent.py). The protocol's fields are a few hundred bytes;
# a trainer that pads its events (its control directory is its own) would
# otherwise store 64 KiB per event in the database and in every events read.
KEPT_DATA = 4 << 10
KEPT_STRING = 1 << 10  # past KEPT_DATA: each string cut to this many characters
# The events a trainer reports (its control directory's events.jsonl is its own) that the
# history stores per attempt; past it they still act (a checkpoint is still recorded) but are
# not stored, and one EVENTS_DROPPED says so. A checkpoint every minute for 16 hours fits.
TRAINER_TYPES = {protocol.CHECKPOINT_COMMITTED, protocol.RESUMED, protocol.NO_FLUSH, protocol.INTERVAL_ADOPTED}
MAX_KEPT_EVENTS = 1_000
EVENTS_DROPPED = "events_dropped"


@dataclass(frozen=True)
class AgentEvent:
    seq: int
    type: str
    at: datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    accepted: int
    last_seq: int
    cancel: bool
    drain: bool  # the broker is moving the job: flush a checkpoint now, then stop
    moved: bool  # a job changed state: the reconciler should look now
    drain_until: datetime | None = None  # a drain: when the broker stops waiting for the flush
    stop: bool = False  # the job's early_stop rule fired: checkpoint, then the trainer stops
    # Set when the batch was refused (nothing stored): [{"field": ..., "message": ...}], and why
    refused: list[dict[str, str]] = field(default_factory=list)
    refusal: str = ""
    checkpoint_interval_s: float | None = None  # the library's interval in force (None: the trainer's own)


def agent_token(key: bytes, attempt_id: int) -> str:
    """The attempt's agent token: derived, not random, so that a launch
    repeated after a broker crash hands the running agent the same token.
    Only its digest is stored (on the attempt)."""
    mac = hmac.new(key, f"spotbroker-agent:{attempt_id}".encode(), hashlib.sha256).digest()
    return AGENT_TOKEN_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def attempt_for_token(session: Session, token: str) -> Attempt | None:
    if not token.startswith(AGENT_TOKEN_PREFIX):
        return None
    return session.scalar(select(Attempt).where(Attempt.agent_token_digest == digest(token)))


def token_gone(attempt: Attempt, now: datetime, grace_seconds: float) -> bool:
    """Has the attempt's token expired: ended more than the grace window ago?"""
    return attempt.ended_at is not None and now - attempt.ended_at > timedelta(seconds=grace_seconds)


def record(session: Session, attempt: Attempt, events: list[AgentEvent], checkpoint_root: str,
           clock: Clock = SYSTEM_CLOCK, *, interval_refresh_s: float = 60.0, history_days: float = 7.0) -> Outcome:
    """Store a batch of the agent's events (`checkpoint_root`: the broker's
    setting, from which the attempt's own prefix is built); the answer carries
    the checkpoint interval in force (broker/recovery/intervals.py)."""
    job = session.get(Job, attempt.job_id)
    strangers = _stranger_nodes(attempt, events)
    if strangers:
        return Outcome(accepted=0, last_seq=attempt.agent_seq, cancel=attempt.state not in LIVE_ATTEMPT_STATES,
                       drain=False, moved=False, refused=strangers,
                       refusal="an event names a node this attempt does not have")
    node = _node(events)
    last = _node_last_seq(session, attempt, node) if node else attempt.agent_seq
    runaway = _runaway_seqs(attempt, events, last, clock.now())
    if runaway:
        return Outcome(accepted=0, last_seq=last, cancel=attempt.state not in LIVE_ATTEMPT_STATES,
                       drain=False, moved=False, refused=runaway,
                       refusal="a seq runs ahead of what this attempt's agent can have counted to")
    uris, refused = {}, []
    if any(e.type == protocol.CHECKPOINT_COMMITTED for e in events):  # (heartbeats need no team lookup)
        prefix = attempt_prefix(checkpoint_root, session.get(Team, job.team_id).name, job.id, attempt.id)
        uris, refused = _checkpoint_uris(session, job, attempt, events, prefix, last, clock)
    if refused:
        return Outcome(accepted=0, last_seq=last, cancel=attempt.state not in LIVE_ATTEMPT_STATES,
                       drain=False, moved=False, refused=refused,
                       refusal="a reported checkpoint is not at this attempt's own place")
    accepted, moved, reports = 0, False, []
    for event in sorted(events, key=lambda e: e.seq):
        if event.seq <= last:
            continue  # delivered before: a re-sent batch
        last = event.seq
        if not node:
            attempt.agent_seq = event.seq
        accepted += 1
        if event.type not in SILENT and _keep(session, job, attempt, event, clock):
            data = {**kept(event.data), "agent_at": event.at.isoformat(), **({NODE_SEQ: event.seq} if node else {})}
            session.add(Event(job_id=job.id, attempt_id=attempt.id, type=event.type, at=clock.now(), data=data))
        if event.seq in uris:
            _add_checkpoint(session, job, attempt, event.data, uris[event.seq], clock)
        if event.type == protocol.CHECKPOINTS_PRUNED:
            _forget_pruned(session, attempt, event.data)
        if event.type == protocol.METRICS:
            reports.append((event.data, event.at))  # stored together below: one write for the batch
        if not node and event.type in MEASURED_BY_AGENT and protocol.GPU_JOULES in event.data:
            footprint.record_report(session, attempt, event.data)
        moved |= _apply(session, job, attempt, event, clock, checkpoint_root)
    if accepted and attempt.state == A.RUNNING and _is_current(job, attempt):
        # any word of its agent says the node is there: one delivering a backlog of a trainer's
        # events holds its heartbeat behind them, and the node was taken for vanished
        attempt.last_heartbeat_at = clock.now()
    if reports:
        metrics.record_many(session, job, attempt, reports, clock.now())
    if reports and _is_current(job, attempt):  # judged even when the points' bounds dropped them
        earlystop.after_metrics(session, job, attempt, reports, clock)
    live = attempt.state in LIVE_ATTEMPT_STATES
    move = live and recovery.is_move(job)
    drain = move or (live and recovery.peers_drain(job, attempt))
    interval = intervals.refresh(session, job, attempt, events, clock.now(), refresh_s=interval_refresh_s,
                                 history_days=history_days) if _is_current(job, attempt) else None
    return Outcome(accepted=accepted, last_seq=last, cancel=not live, drain=drain, moved=moved,
                   drain_until=job.next_check_at if move else None, checkpoint_interval_s=interval,
                   stop=live and earlystop.stop_wanted(session, job, attempt))


def _keep(session: Session, job: Job, attempt: Attempt, event: AgentEvent, clock: Clock) -> bool:
    """Whether the history stores the event: the agent's own always, the
    trainer's up to MAX_KEPT_EVENTS an attempt (the first one past it stores
    EVENTS_DROPPED instead, once)."""
    if event.type not in TRAINER_TYPES:
        return True
    attempt.events_kept += 1
    if attempt.events_kept == MAX_KEPT_EVENTS + 1:
        session.add(Event(job_id=job.id, attempt_id=attempt.id, type=EVENTS_DROPPED, at=clock.now(), data={
            "kept": MAX_KEPT_EVENTS, "reason": f"the trainer reported more than {MAX_KEPT_EVENTS} events in this "
            "attempt: the later ones act (checkpoints are recorded) but are not stored"}))
    return attempt.events_kept <= MAX_KEPT_EVENTS


def kept(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data as the job's history keeps it: whole up to KEPT_DATA
    bytes of JSON; past that, strings cut to KEPT_STRING characters and the
    smallest fields kept while they fit (the protocol's: a step, a node, a
    URI), with `cut` saying how many bytes the agent sent. The event still
    does what it does; only what is stored is bounded."""
    size = len(json.dumps(data))
    if size <= KEPT_DATA:
        return data
    fields = {k: v[:KEPT_STRING] if isinstance(v, str) else v for k, v in data.items()}
    costs = {k: len(json.dumps({k: v})) for k, v in fields.items()}
    room, keep = KEPT_DATA - len(json.dumps({"cut": size})), set()
    for key in sorted(fields, key=costs.__getitem__):
        if costs[key] > room:
            break
        keep.add(key)
        room -= costs[key]
    return {**{k: v for k, v in fields.items() if k in keep}, "cut": size}


def _runaway_seqs(attempt: Attempt, events: list[AgentEvent], last: int, now: datetime) -> list[dict[str, str]]:
    """Field errors of the new events whose seq is beyond what the attempt's
    agent can have reached by now (see the module's docstring)."""
    age = max((now - attempt.created_at).total_seconds(), 0.0)
    ceiling = max(last, SEQ_SLACK + int(age * SEQS_PER_SECOND))
    return [{"field": f"events.{i}.seq", "message": (
        f"{e.seq} is beyond {ceiling}, as far as this attempt's agent can have counted by now: "
        "seqs count up by one per event from 1")} for i, e in enumerate(events) if e.seq > ceiling]


def _stranger_nodes(attempt: Attempt, events: list[AgentEvent]) -> list[dict[str, str]]:
    """Field errors of events naming a node outside the attempt's 0..num_nodes-1
    (a node's events would be counted, and its seqs kept, for no node at all)."""
    errors = []
    for i, e in enumerate(events):
        if protocol.EVENT_NODE not in e.data:
            continue
        node = e.data[protocol.EVENT_NODE]
        if not (_is_int(node) and 0 <= node < attempt.num_nodes):
            errors.append({"field": f"events.{i}.data.node", "message": (
                f"{node!r} is no node of this attempt: it has nodes 0 to {attempt.num_nodes - 1}")})
    return errors


def _node(events: list[AgentEvent]) -> int:
    """The node whose agent sent the batch: 0, or N > 0 (its events say `node: N`)."""
    node = events[0].data.get(protocol.EVENT_NODE) if events else None
    return node if _is_int(node) and 0 < node <= MAX_NODES else 0


def _node_last_seq(session: Session, attempt: Attempt, node: int) -> int:
    """The last seq stored from node `node`'s agent: each node's agent counts
    its own (the attempt's own counter is node 0's). Heartbeats are not
    stored; one taken twice changes nothing."""
    stored = session.scalars(select(Event.data).where(Event.attempt_id == attempt.id))
    seqs = [d[NODE_SEQ] for d in stored
            if isinstance(d, dict) and d.get(protocol.EVENT_NODE) == node and _is_int(d.get(NODE_SEQ))]
    return max(seqs, default=0)


def _is_current(job: Job, attempt: Attempt) -> bool:
    return attempt.state in LIVE_ATTEMPT_STATES and job.state in (J.LAUNCHING, J.RUNNING, J.PREEMPTING)


def _apply(session: Session, job: Job, attempt: Attempt, event: AgentEvent, clock: Clock, root: str) -> bool:
    """What the event moves, for the job's current attempt only: the agent's
    first word brings it up; the end of an early stop is earlystop's; a notice
    or a flush is recovery's."""
    if not _is_current(job, attempt):
        return False
    if earlystop.on_agent_event(session, job, attempt, event.type, event.data, clock, root):
        return True
    if event.type in (protocol.HEARTBEAT, protocol.TRAINER_STARTED):
        attempt.last_heartbeat_at = clock.now()
        if attempt.state == A.LAUNCHING:  # the agent's first word: the node is up
            transition(session, attempt, A.RUNNING, clock=clock)
            transition(session, job, J.RUNNING, data={"attempt_id": attempt.id}, clock=clock)
            return True
        return False
    return recovery.on_agent_event(session, job, attempt, event.type, event.data, clock)


def _checkpoint_uris(session: Session, job: Job, attempt: Attempt, events: list[AgentEvent], prefix: str,
                     last: int, clock: Clock) -> tuple[dict[int, str], list[dict[str, str]]]:
    """The URI to store for each new checkpoint_committed event (by seq), and
    the field errors of those that cannot be accepted; each refused one is
    told on the job once (the agent re-sends a refused batch one by one)."""
    uris, errors = {}, []
    for i, event in enumerate(events):
        if event.type != protocol.CHECKPOINT_COMMITTED or event.seq <= last:
            continue
        field_name, message = _check_committed(event.data)
        if field_name is None:
            try:
                uris[event.seq] = accepted_uri(event.data["uri"], prefix, event.data["step"])
                continue
            except BadCheckpointUri as exc:
                field_name, message = "uri", str(exc)
        errors.append({"field": f"events.{i}.data.{field_name}", "message": message})
        _tell_refused(session, job, attempt, event, message, clock)
    return uris, errors


def _check_committed(data: dict[str, Any]) -> tuple[str | None, str]:
    """(field, message) of the first wrong field of a checkpoint_committed event, or (None, "")."""
    step, size, seconds, reason = data.get("step"), data.get("bytes"), data.get("seconds"), data.get("reason")
    if not _is_int(step) or not 0 <= step <= MAX_STEP:
        return "step", f"an integer from 0 to {MAX_STEP}"
    if "uri" not in data:
        return "uri", "the checkpoint's URI is required"
    if size is not None and (not _is_int(size) or not 0 <= size <= MAX_CHECKPOINT_BYTES):
        return "bytes", f"an integer from 0 to {MAX_CHECKPOINT_BYTES}"
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                or not math.isfinite(seconds) or not 0 <= seconds <= 1e9):
        return "seconds", "a finite number of seconds, at least 0"
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        return "reason", f"a string of at most {MAX_REASON} characters"
    return None, ""


def log_truncated(session: Session, job_id: int, attempt_id: int, limit: int, clock: Clock = SYSTEM_CLOCK) -> None:
    """The attempt's log reached its bound (it ends with the marker): the job's events say so."""
    session.add(Event(job_id=job_id, attempt_id=attempt_id, type=logbound.TRUNCATED_EVENT, at=clock.now(),
                      data={"bytes": limit, "setting": "SPOTBROKER_MAX_LOG_BYTES"}))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tell_refused(session: Session, job: Job, attempt: Attempt, event: AgentEvent, message: str,
                  clock: Clock) -> None:
    told = session.scalars(select(Event.data).where(Event.attempt_id == attempt.id,
                                                    Event.type == CHECKPOINT_REFUSED))
    if any(isinstance(d, dict) and d.get("seq") == event.seq for d in told):
        return
    uri = event.data.get("uri")
    session.add(Event(job_id=job.id, attempt_id=attempt.id, type=CHECKPOINT_REFUSED, at=clock.now(),
                      data={"seq": event.seq, "step": event.data.get("step") if _is_int(event.data.get("step"))
                            else None, "uri": uri[:512] if isinstance(uri, str) else None, "reason": message}))


def _add_checkpoint(session: Session, job: Job, attempt: Attempt, data: dict[str, Any], uri: str,
                    clock: Clock) -> None:
    step = data["step"]
    exists = session.scalar(select(Checkpoint.id).where(Checkpoint.attempt_id == attempt.id,
                                                        Checkpoint.step == step))
    if exists is None:
        session.add(Checkpoint(job_id=job.id, attempt_id=attempt.id, step=step, uri=uri,
                               bytes=data.get("bytes") or 0, seconds=data.get("seconds"),
                               reason=data.get("reason"), committed_at=clock.now()))
        _forget_oldest(session, attempt)


def _forget_pruned(session: Session, attempt: Attempt, data: dict[str, Any]) -> None:
    """The attempt's checkpoints its trainer's keep_last deleted: forgotten, so
    that the list, the dashboard and `keep` name only what exists. Only this
    attempt's rows, and never one the broker keeps."""
    steps = data.get("steps")
    if not isinstance(steps, list) or not 0 < len(steps) <= protocol.MAX_PRUNED_STEPS \
            or not all(_is_int(s) for s in steps):
        return
    session.execute(delete(Checkpoint).where(Checkpoint.attempt_id == attempt.id, Checkpoint.step.in_(steps),
                                             Checkpoint.keep.is_(False)))


def _forget_oldest(session: Session, attempt: Attempt) -> None:
    """An attempt's rows past MAX_CHECKPOINTS_PER_ATTEMPT: its oldest steps
    not kept are forgotten (their objects are the trainer's `keep_last` to
    delete), as a trainer reporting 200 a second made 20,000 rows in 100 s."""
    session.flush()
    count = session.scalar(select(func.count()).select_from(Checkpoint).where(Checkpoint.attempt_id == attempt.id))
    if count <= MAX_CHECKPOINTS_PER_ATTEMPT:
        return
    oldest = select(Checkpoint.id).where(Checkpoint.attempt_id == attempt.id, Checkpoint.keep.is_(False)).order_by(
        Checkpoint.step, Checkpoint.id).limit(count - MAX_CHECKPOINTS_PER_ATTEMPT)
    session.execute(delete(Checkpoint).where(Checkpoint.id.in_(list(session.scalars(oldest)))))
