"""The reconciler: moves every live job towards its goal, one small,
idempotent step at a time.

State lives in the database, never only here, so any number of broker
processes can run a reconciler on one database, and any of them can be
killed at any line. A pass has three phases:

1. observe: ask the launchers about every live attempt (no lease, no write
   unless something changed);
2. release: stop what attempts in a final state still hold (a cancelled
   job's processes, a vanished node's remaining nodes);
3. advance: claim the jobs that need a decision with a row lease
   (`FOR UPDATE SKIP LOCKED` on PostgreSQL) and step each of them.

Turning a decision into a launched attempt (the attempt row, the launch, the
fail-over, the handle, safe against a crash at any line) is
`broker/launch/launching.py`'s.

How an attempt ends and what its job does next (a preemption, a vanished
node, a move's drain, an exit, a capacity refusal) is `broker/recovery/attempts.py`'s:
the reconciler observes and launches, and hands each ending there. What a
node is given to run an attempt is `broker/launch/request.py`'s.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import ValidationError
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from spotbroker.broker.checkpoints import coldtier
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs import reasons
from spotbroker.broker.jobs.preflight import wanted as preflight_wanted
from spotbroker.broker.jobs.resources import KUBERNETES, Infra
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import (
    LIVE_ATTEMPT_STATES,
    LIVE_JOB_STATES,
    AttemptState,
    JobState,
    transition,
)
from spotbroker.broker.jobs.stored import spec_of
from spotbroker.broker.launch.base import Launcher
from spotbroker.broker.launch.launching import Launching
from spotbroker.broker.money import hardcap
from spotbroker.broker.placement.histories import record_probes
from spotbroker.broker.placement.host import host_reason, on_host, unlaunchable
from spotbroker.broker.placement.placer import NOT_CHECKED, Placer
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing.offers import LOCAL_PLACEMENT, Placement, why_none_fits
from spotbroker.broker.recovery import attempts as recovery
from spotbroker.broker.recovery import preflight
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import sealing
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.teampolicy import limits
from spotbroker.broker.ticker import Failures

log = logging.getLogger(__name__)

A, J = AttemptState, JobState
HINT_COALESCE = 0.1
# What the observe phase saw of a job's run: the attempt's id and its launcher's status.
Observed = tuple[int, RunStatus]


@dataclass
class PassStats:
    observed: int = 0
    changed: int = 0
    released: int = 0
    stepped: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, factory: sessionmaker[Session], launchers: dict[str, Launcher], settings: Settings,
                 clock: Clock = SYSTEM_CLOCK, owner: str | None = None) -> None:
        self.factory = factory
        self.launchers = launchers
        self.settings = settings
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._wake = threading.Event()
        self._step_failures: dict[int, Failures] = {}  # jobs whose step fails pass after pass
        self.placer = Placer(settings, launchers)
        self.keyring = sealing.keyring(settings)  # a job whose secrets it cannot open is held
        self.launching = Launching(factory, launchers, settings, clock, self.placer, self._on_observed)
        # No agent could reach this process before it started (a broker that
        # was down), nor while its passes failed (its database was): it judges
        # a node silent only after a whole heartbeat timeout of its own since,
        # or a node still delivering its last events would be taken for lost.
        self.started_at = clock.now()
        self._slots_told = 0.0  # when the queue was last told its places (monotonic)

    # --- running in the server ---------------------------------------------------------

    def hint(self) -> None:
        """Something changed (a job was submitted): look now, not at the next poll."""
        self._wake.set()

    def run_forever(self, stop: threading.Event) -> None:
        failures = Failures(log, "reconciler pass")
        while not stop.is_set():
            started = time.monotonic()
            try:
                stats = self.pass_once()
                busy = stats.stepped > 0 or stats.changed > 0
                failures.succeeded()
            except Exception:  # a pass must never kill the loop; the next one retries
                failures.failed()
                self.started_at, busy = self.clock.now(), False  # (see __init__)
            if not busy:
                self._wake.wait(self.settings.reconcile_interval)
            # Hints that arrive together (a burst of submissions) share one
            # pass: at most one pass per HINT_COALESCE seconds.
            stop.wait(max(0.0, HINT_COALESCE - (time.monotonic() - started)))
            self._wake.clear()

    def pass_once(self) -> PassStats:
        stats = PassStats()
        self.placer.new_pass()
        live, ended = self._attempts_with_runs()
        changed = self._observe(live, stats)
        self._release(ended, stats)
        for job_id in self._claim(changed):
            self._step_safely(job_id, changed.get(job_id), stats)
        self._forget_ended_failures()
        self._probe(self.placer.take_probes(self.clock.now()))
        return stats

    def _forget_ended_failures(self) -> None:
        """A job whose step failed until it ended (a cancel) is no longer told of."""
        if not self._step_failures:
            return
        with self.factory() as session:
            live = set(session.scalars(select(Job.id).where(Job.id.in_(list(self._step_failures)),
                                                            Job.state.in_([str(s) for s in LIVE_JOB_STATES]))))
        for job_id in set(self._step_failures) - live:
            del self._step_failures[job_id]

    # --- phase 1: observe ----------------------------------------------------------------

    def _attempts_with_runs(self) -> tuple[list, list]:
        """The attempts whose run the launchers hold: (the live ones, the ended
        ones not yet released), read together (one statement a pass, most of
        which find nothing to do)."""
        live_states = [str(s) for s in LIVE_ATTEMPT_STATES]
        with self.factory() as session:
            rows = session.execute(
                select(Attempt.id, Attempt.job_id, Attempt.state, Attempt.launcher, Attempt.handle,
                       Attempt.last_heartbeat_at, Attempt.version)
                .where(Attempt.handle.is_not(None),
                       or_(Attempt.state.in_(live_states), Attempt.released.is_(False)))
            ).all()
        live = [row for row in rows if row.state in live_states]
        return live, [row for row in rows if row.state not in live_states]

    def _observe(self, rows: list, stats: PassStats) -> dict[int, Observed]:
        """job id -> (attempt id, state, exit code) for attempts whose run changed."""
        changed = {}
        cutoff = self.clock.now() - timedelta(seconds=self.settings.heartbeat_timeout)
        silent_since = cutoff if self.started_at < cutoff else None
        for row in rows:
            launcher = self.launchers.get(row.launcher)
            if launcher is None:
                continue
            stats.observed += 1
            try:
                status = launcher.status(row.handle)
            except Exception as exc:
                log.warning("status of attempt %d failed: %s", row.id, exc)
                continue
            if (status.state == RunState.RUNNING and silent_since and row.last_heartbeat_at
                    and row.last_heartbeat_at < silent_since):
                status = RunStatus(RunState.GONE)  # its agent went silent: the node is lost
            if status.state == RunState.PENDING or (status.state == RunState.RUNNING and row.state == A.RUNNING):
                continue
            changed[row.job_id] = (row.id, status)
        stats.changed = len(changed)
        return changed

    # --- phase 2: release ----------------------------------------------------------------

    def _release(self, rows: list, stats: PassStats) -> None:
        for row in rows:
            launcher = self.launchers.get(row.launcher)
            if launcher is None:
                continue
            try:
                launcher.terminate(row.handle)
            except Exception as exc:
                log.warning("terminating attempt %d failed: %s", row.id, exc)
                continue
            with transaction(self.factory) as session:
                # Only if the row is unchanged: a handle stored meanwhile (see
                # _store_handle) must be released in its turn.
                session.execute(update(Attempt).where(Attempt.id == row.id, Attempt.version == row.version)
                                .values(released=True, version=Attempt.version + 1))
            stats.released += 1

    # --- phase 3: claim and step ---------------------------------------------------------

    def _claim(self, changed: dict[int, Observed]) -> list[int]:
        now = self.clock.now()
        with transaction(self.factory) as session:
            due = Job.next_check_at <= now
            if "skypilot" not in self.launchers and self.launching.local_nodes_free(session, lock=False) <= 0:
                # Every new attempt would run here and no slot is free: only
                # jobs that already hold an attempt can move; the others are told why they wait.
                due = and_(due, Job.state.not_in([str(J.PENDING), str(J.RECOVERING)]))
                if time.monotonic() - self._slots_told >= reasons.TELL_EVERY_S:  # (hints come per submission)
                    self._slots_told = time.monotonic()
                    reasons.mark_slot_waits(session, self.settings.local_max_running, now)
            wanted = or_(due, Job.id.in_(list(changed))) if changed else due
            query = (select(Job.id)
                     .where(Job.state.in_([str(s) for s in LIVE_JOB_STATES]), wanted,
                            or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now))
                     .order_by(Job.next_check_at.nulls_first(), Job.id)
                     .limit(200)
                     .with_for_update(skip_locked=True))
            ids = list(session.scalars(query))
            if ids:
                session.execute(update(Job).where(Job.id.in_(ids)).values(
                    lease_owner=self.owner,
                    lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds)))
        return ids

    def _step_safely(self, job_id: int, observed: Observed | None, stats: PassStats) -> None:
        try:
            self.step(job_id, observed)
            stats.stepped += 1
            if job_id in self._step_failures:
                self._step_failures.pop(job_id).succeeded()
        except StaleDataError:
            # Someone else (a cancel, another broker) changed the job first;
            # its lease is dropped below and the next pass looks again.
            stats.conflicts += 1
        except Exception as exc:
            self._step_failures.setdefault(job_id, Failures(log, f"step of job {job_id}")).failed()
            stats.errors.append(f"job {job_id}: {exc}")
        finally:
            with transaction(self.factory) as session:
                session.execute(update(Job).where(Job.id == job_id, Job.lease_owner == self.owner)
                                .values(lease_owner=None, lease_expires_at=None))

    def step(self, job_id: int, observed: Observed | None = None) -> None:
        """Take the one next step for a job we hold the lease of; `observed`
        is what the observe phase saw its run do, if anything changed."""
        with transaction(self.factory) as session:
            job = session.get(Job, job_id)
            if job is None or job.lease_owner != self.owner or job.state not in LIVE_JOB_STATES:
                return
            if observed is not None and not self._on_observed(session, job, *observed):
                return
            # (a launch refused after it was sent: the next place is launched in this pass, below)
            state = JobState(job.state)
            rest: tuple[Placement, ...] = ()
            if state in (J.PENDING, J.RECOVERING):
                attempt, rest = self._place(session, job)
            elif state in (J.LAUNCHING, J.RUNNING, J.PREEMPTING):
                attempt = self._unlaunched(job)
                if attempt is None:
                    self._watch(session, job, state)
            else:
                self._reconsider_hold(session, job)
                return
        if attempt is not None:
            self.launching.launch(job_id, attempt.id, rest)

    # --- deciding where to run -----------------------------------------------------------

    def _place(self, session: Session, job: Job) -> tuple[Attempt | None, tuple[Placement, ...]]:
        """The job's first attempt on what the policy chose, and the placements to
        fail over to; (None, ()) when it is to wait, or cannot run at all."""
        try:
            spec = spec_of(job)
        except ValidationError as exc:  # stored before a rule was tightened: it will never read
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            transition(session, job, J.FAILED, clock=self.clock,
                       reason=f"invalid_spec: {where}: {first['msg'].removeprefix('Value error, ')}")
            return None, ()
        now = self.clock.now()
        if recovery.recoveries_exhausted(session, job, recovery.Bounds.from_settings(self.settings), self.clock):
            return None, ()
        if (hold := self._why_held(session, job, spec)) is not None:
            transition(session, job, J.HELD, reason=hold, clock=self.clock)
            job.next_check_at = now + timedelta(seconds=self._hold_wait(hold))
            return None, ()
        if not on_host(spec, self.settings.cpu_jobs_on_host):
            choice = self.placer.choose(session, job, spec, now)
            if choice is None:
                why = why_none_fits(session, spec)  # (the reason's first word stays for scripts)
                if why is None and any(want.infra and Infra(want.infra).cloud == KUBERNETES[0]
                                       for want in spec.resources.alternatives()):
                    why = (self.placer.kubernetes.why_unfit(spec) if self.placer.kubernetes is not None else
                           "no Kubernetes place is configured (SPOTBROKER_KUBERNETES_PLACES)")
                transition(session, job, J.FAILED, reason="no_feasible_offer" + (f": {why}" if why else ""),
                           data={"resources": spec.resources.model_dump(exclude_none=True)}, clock=self.clock)
                return None, ()
            policy = limits.policy_of(session, job)
            within = tuple(p for p in choice.placements if limits.admits(p, spec, policy))
            if choice.action is not Action.LAUNCH or not within:  # wait (for spot); look again later
                self._wait(session, job, reasons.placement_wait(choice.reason) if choice.action is not Action.LAUNCH
                           else reasons.WAITING_LIMIT + limits.over(choice.placements[0], spec, policy))
                return None, ()
            placements, why = self.launching.bounded(within), choice.reason
        else:
            placements, why = (LOCAL_PLACEMENT,), host_reason(spec)
        if (flight := preflight_wanted(job, spec)):  # its trial run first, where a CPU job would run
            planned = preflight.plan(self.placer, self.launching, session, job, spec, placements[0])
            if planned is None or isinstance(planned, str):  # (failed: no place can run it; or it waits)
                if planned is not None:
                    self._wait(session, job, planned)
                return None, ()
            spec, placements, why = planned
        launcher = self.launching.launcher_for(placements[0])
        if launcher == "local" and self.launching.local_nodes_free(session) < spec.num_nodes:
            job.next_check_at = now + timedelta(seconds=self.settings.reconcile_interval)
            job.reason = reasons.slot_wait(reasons.slots_ahead(session, job.id, now), self.settings.local_max_running)
            return None, ()
        return self.launching.new_attempt(session, job, spec, placements[0], launcher, why, flight), placements[1:]

    def _wait(self, session: Session, job: Job, why: str) -> None:
        """The job waits to be placed; looked at again after the placement interval."""
        now = self.clock.now()
        job.next_check_at = now + timedelta(seconds=self.settings.placement_interval)
        if job.reason != why:  # said once, not every interval
            job.reason = why
            session.add(Event(job_id=job.id, type="waiting", at=now, data={"reason": why}))

    def _why_held(self, session: Session, job: Job, spec: JobSpec) -> str | None:
        """What holds the job before its next attempt, if anything does."""
        return (unlaunchable(job, spec, self.keyring, self.launchers, self.settings)
                or hardcap.budget_hold(session, job, self.clock)
                or limits.team_hold(session, job, spec, self.settings.cpu_jobs_on_host)
                or coldtier.resume_hold(session, job, self.clock.now()))

    def _hold_wait(self, hold: str) -> float:
        """Seconds until a held job is looked at again: soon where the hold ends
        soon (a team's GPUs free up as its attempts end; SkyPilot's first check
        answers within a minute of start-up), else the placement interval."""
        soon = limits.HELD in hold or hold == NOT_CHECKED
        return self.settings.reconcile_interval if soon else self.settings.placement_interval

    def _reconsider_hold(self, session: Session, job: Job) -> None:
        """A HELD job goes back to being placed once what held it is gone; it is
        looked at again every placement interval until then."""
        if (hold := self._why_held(session, job, spec_of(job))) is not None:
            job.next_check_at = self.clock.now() + timedelta(seconds=self._hold_wait(hold))
            if hold != job.reason:  # (e.g. "8 running" becoming "6 running")
                job.reason = hold
            return
        back = J.RECOVERING if job.attempts else J.PENDING
        transition(session, job, back, reason="nothing holds it now", clock=self.clock)
        job.next_check_at = self.clock.now()

    def _reconsider(self, session: Session, job: Job) -> None:
        """A running job with a deadline: ask the policy again whether to stay, or
        to move (to on-demand before the slack runs out, or to a cheaper zone).
        A move drains the attempt (the agent flushes a checkpoint) and then
        places the job again, so what replaces it is decided on what is known
        then (break before make: one attempt per job at a time)."""
        job.next_check_at = self.launching.deadline_check(job)
        if job.next_check_at is None:  # no deadline: nothing to watch
            return
        spec, now = spec_of(job), self.clock.now()
        attempt = next((a for a in job.attempts if a.state == A.RUNNING and a.handle is not None), None)
        if attempt is None or attempt.started_at is None:
            return
        choice = self.placer.choose(session, job, spec, now, running=attempt)
        if choice is None or choice.action is Action.KEEP:
            return
        towards = [f"{p.place} {'spot' if p.use_spot else 'on-demand'}" for p in choice.placements]
        recovery.start_move(session, job, attempt, choice.reason, towards, self.settings.drain_timeout, self.clock)

    def _unlaunched(self, job: Job) -> Attempt | None:
        """After a crash between creating an attempt and storing its handle.
        The attempt may even be RUNNING by now (its agent's first heartbeat,
        through another broker): launching it again returns the handle of
        what already runs."""
        pending = [a for a in job.attempts if a.state in LIVE_ATTEMPT_STATES and a.handle is None]
        return pending[-1] if pending else None

    def _watch(self, session: Session, job: Job, state: JobState) -> None:
        """A launched job: nothing to redo, unless a deadline is watched (RUNNING:
        ask the policy again; LAUNCHING: look again until it runs) or a move
        waits for its flush (PREEMPTING)."""
        job.next_check_at = None
        if preflight.watch(session, job, self.clock):
            return
        if state == J.RUNNING:
            self._reconsider(session, job)
        elif recovery.is_move(job):
            recovery.drain_timed_out(session, job, self.clock)
        elif state == J.LAUNCHING:
            job.next_check_at = self.launching.deadline_check(job)

    def _probe(self, placements: list[Placement]) -> None:
        """Ask for spot capacity where the policy wants to watch a zone's spell
        (launchers without `probe` are not asked); the answers are stored."""
        def probe_for(p: Placement):
            return getattr(self.launchers.get(self.launching.launcher_for(p)), "probe", None)

        record_probes(self.factory, placements, probe_for, self.clock.now)

    def _on_observed(self, session: Session, job: Job, attempt_id: int, status: RunStatus) -> bool:
        """Apply what a launcher said of an attempt's run. True when it was a
        capacity refusal after which the job is to be placed again now: the
        caller (`step`, holding the job's lease) launches the next place in
        the same pass, as `launch` does for a refusal it raises."""
        if status.state == RunState.PENDING:  # a launch still in flight
            return False
        if status.resend:
            why = status.error or "the launch was lost"
            if self.launching.resend(session, job, attempt_id, why):
                return True  # (the caller launches the attempt again, at its place, in this pass)
            status = RunStatus(RunState.FAILED, capacity=True, error=f"{why}; past the launch timeout: next place")
        if status.capacity:
            refused = recovery.refused_after_launch(session, job, attempt_id, status.error or "no capacity",
                                                    self.clock, self.launching.refusal_pause(job))
            if refused is None:
                return False
            self.placer.capacity_error(refused, self.clock.now())
            return job.state == J.RECOVERING and job.next_check_at <= self.clock.now()
        if recovery.on_status(session, job, attempt_id, status, self.clock,
                              recovery.Bounds.from_settings(self.settings)):
            self.hint()
        return False
