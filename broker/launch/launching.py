"""From a decision to a running attempt: the attempt row, the launch, the
fail-over on a capacity refusal, and the handle.

Launching is split so that a crash at any point is safe: the attempt row is
committed first (LAUNCHING, no handle), then the launcher is called (which is
idempotent per attempt), then the handle is stored. A job found LAUNCHING
without a handle after a crash is simply launched again: the launcher
returns what is already running, so there is one attempt per launch. The
reconciler decides when; this module does it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.auth import digest
from spotbroker.broker.clock import Clock
from spotbroker.broker.energy import footprint
from spotbroker.broker.jobs import logs, reasons
from spotbroker.broker.jobs.preflight import trial as preflight_trial
from spotbroker.broker.jobs.runs import RunStatus
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import (
    LIVE_ATTEMPT_STATES,
    LIVE_JOB_STATES,
    AttemptState,
    EndReason,
    JobState,
    transition,
)
from spotbroker.broker.jobs.stored import spec_of
from spotbroker.broker.launch.base import CapacityError, Launcher, LaunchError, LauncherUnavailable
from spotbroker.broker.launch.request import launch_request
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.recovery import attempts as recovery
from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.recovery.preflight import timeout_at as preflight_timeout_at
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import retrying, transaction
from spotbroker.broker.store.models import Attempt, Event, Job

log = logging.getLogger(__name__)

A, J = AttemptState, JobState
RETRYING = "launch waiting: "  # the job's reason while the launcher's service does not answer


class Launching:
    """Owned by a reconciler, sharing its launchers, placer and clock; `on_status`
    hands what a launcher says of a fresh launch back to it."""

    def __init__(self, factory: sessionmaker[Session], launchers: dict[str, Launcher], settings: Settings,
                 clock: Clock, placer: Placer, on_status: Callable[[Session, Job, int, RunStatus], None]) -> None:
        self.factory = factory
        self.launchers = launchers
        self.settings = settings
        self.clock = clock
        self.placer = placer
        self.on_observed = on_status
        self._dialect = factory.kw["bind"].dialect.name
        self._key = settings.signing_key()

    def bounded(self, placements: tuple[Placement, ...]) -> tuple[Placement, ...]:
        """At most launch_failover_limit placements, keeping an on-demand one the
        decision ends with (the deadline's safety net) if it would be cut."""
        limit = self.settings.launch_failover_limit
        if len(placements) <= limit:
            return placements
        od = next((p for p in placements[limit - 1:] if not p.use_spot), None)
        return placements[:limit] if od is None or od in placements[:limit] else (*placements[:limit - 1], od)

    def launcher_for(self, placement: Placement) -> str:
        # Until a cloud launcher is configured, the local launcher stands in
        # for every offer and simulates the chosen cloud and price.
        return "local" if placement.cloud == "local" or "skypilot" not in self.launchers else "skypilot"

    def local_nodes_free(self, session: Session, lock: bool = True) -> int:
        """Nodes the local launcher may still start: each node is processes on
        this host, so nodes are counted, not attempts (a 1,024-node job must not
        start 1,024 of them on one slot)."""
        if lock and self._dialect == "postgresql":
            # Serialise slot counting across broker processes (SQLite's
            # BEGIN IMMEDIATE already does).
            session.execute(text("SELECT pg_advisory_xact_lock(7041)"))
        running = session.scalar(
            select(func.coalesce(func.sum(Attempt.num_nodes), 0))
            .where(Attempt.launcher == "local", Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES])))
        return self.settings.local_max_running - running

    def new_attempt(self, session: Session, job: Job, spec: JobSpec, placement: Placement,
                     launcher: str, why: str, preflight: bool = False) -> Attempt:
        """`preflight`: the job's trial run (`spec` is then the trial's, broker/jobs/preflight.py)."""
        now = self.clock.now()
        logs.keep_within(session, job.id, self.settings.max_job_log_bytes, now)  # the ones before it have ended
        attempt = Attempt(job_id=job.id, state=A.LAUNCHING, launcher=launcher, cloud=placement.cloud,
                          region=placement.region, zone=placement.zone, zone_id=placement.zone_id,
                          instance_type=placement.instance_type, accelerator=placement.accelerator,
                          accelerator_count=placement.accelerator_count, use_spot=placement.use_spot,
                          num_nodes=spec.num_nodes, price_per_hour=placement.price_per_hour,
                          preflight=preflight, created_at=now, updated_at=now)
        footprint.attach(session, attempt, now)
        session.add(attempt)
        session.flush()
        attempt.agent_token_digest = digest(agent_token(self._key, attempt.id))
        if reasons.is_wait(job.reason):
            job.reason = None  # it waits no more
        transition(session, job, J.LAUNCHING, clock=self.clock, data={
            "attempt_id": attempt.id, "cloud": placement.cloud, "region": placement.region,
            "zone": placement.zone or placement.zone_id, "instance_type": placement.instance_type,
            "use_spot": placement.use_spot, "price_per_hour": placement.price_per_hour, "why": why,
            **({"preflight": True} if preflight else {})})
        # Due again only if we die before the launch is recorded.
        job.next_check_at = now + timedelta(seconds=self.settings.lease_seconds)
        return attempt

    def launch(self, job_id: int, attempt_id: int, rest: tuple[Placement, ...] = ()) -> None:
        """Launch the attempt; on a capacity error, fail over to `rest` in order."""
        for _ in range(self.settings.launch_failover_limit):
            try:
                with self.factory() as session:
                    attempt = session.get(Attempt, attempt_id)
                    request = launch_request(session, attempt, self.settings, self._key)
                    launcher = self.launchers[attempt.launcher]
                handle = launcher.launch(request)
            except (CapacityError, LauncherUnavailable) as exc:
                if isinstance(exc, LauncherUnavailable) and self._put_off(job_id, attempt_id, str(exc)):
                    return
                next_attempt = self._failover(job_id, attempt_id, str(exc), rest)
                if next_attempt is None:
                    return
                attempt_id, rest = next_attempt
                continue
            except LaunchError as exc:
                self._launch_failed(job_id, attempt_id, str(exc))
                return
            except SQLAlchemyError:
                raise  # the database's trouble, not the launch's: the step is retried
            except Exception as exc:
                # Whatever broke inside a launcher ends the attempt (and frees its
                # slot): an attempt must never stay LAUNCHING on an error that
                # every retry would meet again.
                log.exception("launching attempt %d failed", attempt_id)
                self._launch_failed(job_id, attempt_id, f"{type(exc).__name__}: {exc}")
                return
            self._store_handle(job_id, attempt_id, handle)
            return

    def _put_off(self, job_id: int, attempt_id: int, why: str) -> bool:
        """The launcher's service did not answer: the attempt stays LAUNCHING,
        the job saying why, and is launched again after a back-off that grows
        with the time it has waited (1 s, then half that time, at most
        `launch_retry_max`). False once it has waited the launch timeout:
        then it is a place that gave no node in time (the next is tried)."""
        with transaction(self.factory) as session:
            job, attempt = session.get(Job, job_id), session.get(Attempt, attempt_id)
            if attempt.state not in LIVE_ATTEMPT_STATES or job.state not in LIVE_JOB_STATES:
                return True  # cancelled or ended meanwhile: nothing to launch
            now = self.clock.now()
            waited = (now - attempt.created_at).total_seconds()
            if waited >= self.settings.skypilot_launch_timeout:
                log.warning("attempt %d: no launch in %g s (%s)", attempt_id, waited, why)
                return False
            delay = min(self.settings.launch_retry_max, max(1.0, waited / 2))
            reason = f"{RETRYING}{why}; the launch is tried again (waited {waited:.0f} s)"
            if not (job.reason or "").startswith(RETRYING):  # said once per outage, not every try
                session.add(Event(job_id=job.id, attempt_id=attempt.id, type="launch_retry", at=now,
                                  data={"reason": why}))
            if job.state == J.LAUNCHING:
                job.reason = reason
            job.next_check_at = now + timedelta(seconds=delay)
            log.info("attempt %d: launch put off %.0f s: %s", attempt_id, delay, why)
            return True

    def resend(self, session: Session, job: Job, attempt_id: int, why: str) -> bool:
        """The launcher lost the launch it sent (SkyPilot's API server
        restarted and forgot the request): True when the attempt keeps its
        place and is to be launched again now (by the caller); nothing is
        learned of the place. False when it has ended, or has waited the
        launch timeout: then it is a place that gave no node in time."""
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES or job.state not in LIVE_JOB_STATES:
            return False
        if (self.clock.now() - attempt.created_at).total_seconds() >= self.settings.skypilot_launch_timeout:
            return False
        attempt.handle = None  # the same attempt, the same cluster name: never a second node
        job.next_check_at = self.clock.now()  # (due, should the caller not launch it now)
        session.add(Event(job_id=job.id, attempt_id=attempt.id, type="launch_resent", at=self.clock.now(),
                          data={"reason": why}))
        log.warning("attempt %d: %s", attempt_id, why)
        return True

    def refusal_pause(self, job: Job) -> float:
        """Seconds before a job whose live attempt's launch was refused after it
        was sent (SkyPilot reports it later) is placed again: none, unless
        this refusal ends a round, `launch_failover_limit` attempts in a row
        refused within a placement interval (as many places as one `launch`
        tries); then it waits an interval, as when every place of a round
        refused. So a job launches at most one place per pass this way, and
        at most a round of them per interval."""
        limit = self.settings.launch_failover_limit
        since = self.clock.now() - timedelta(seconds=self.settings.placement_interval)
        ended = sorted((a for a in job.attempts if a.state not in LIVE_ATTEMPT_STATES), key=lambda a: a.id)
        earlier = ended[len(ended) - (limit - 1):] if limit > 1 else []
        if len(earlier) == limit - 1 and all(a.end_reason == EndReason.NO_CAPACITY and a.ended_at is not None
                                             and a.ended_at >= since for a in earlier):
            return self.settings.placement_interval
        return 0.0

    def _store_handle(self, job_id: int, attempt_id: int, handle: dict) -> None:
        # (retried: the nodes' first reports write the same rows, and a deadlock's victim lost the handle)
        retrying(self.factory, lambda session: self._write_handle(session, job_id, attempt_id, handle))

    def _write_handle(self, session: Session, job_id: int, attempt_id: int, handle: dict) -> None:
        attempt = session.get(Attempt, attempt_id)
        attempt.handle = handle
        attempt.released = False  # whatever it holds now must be released when it ends
        job = session.get(Job, job_id)
        if (job.reason or "").startswith(RETRYING):
            job.reason = None  # sent at last
        if job.state in (J.LAUNCHING, J.RUNNING) or (job.state == J.PREEMPTING and not recovery.is_move(job)):
            # The launch is recorded: nothing to redo, unless a deadline is watched.
            job.next_check_at = self.deadline_check(job) if job.state != J.PREEMPTING else None
        if attempt.state not in LIVE_ATTEMPT_STATES:
            return  # cancelled meanwhile: the release phase stops it
        status = self.launchers[attempt.launcher].status(handle)
        self.on_observed(session, job, attempt_id, status)

    def _failover(self, job_id: int, attempt_id: int, why: str,
                  rest: tuple[Placement, ...]) -> tuple[int, tuple[Placement, ...]] | None:
        """After a capacity refusal: the next place's attempt and the places
        left after it, or None when there is none (or the job moved on). A
        Kubernetes place that filled since the decision is passed over."""
        with transaction(self.factory) as session:
            job = session.get(Job, job_id)
            attempt = session.get(Attempt, attempt_id)
            spec = spec_of(job)
            if attempt.preflight:  # the next place of the pre-flight's round: a pre-flight too
                spec = preflight_trial(spec)
            while rest and not self.placer.has_room(session, rest[0], spec.num_nodes, self.clock.now()):
                rest = rest[1:]
            if recovery.capacity_refused(session, job, attempt, why, self.clock, last=not rest,
                                         retry_after_s=self.settings.placement_interval):
                self.placer.capacity_error(attempt, self.clock.now())
            if job.state != J.LAUNCHING or not rest:
                return None
            session.flush()
            return self.new_attempt(session, job, spec, rest[0], self.launcher_for(rest[0]),
                                     "the previous choice had no capacity", attempt.preflight).id, rest[1:]

    def _launch_failed(self, job_id: int, attempt_id: int, why: str) -> None:
        with transaction(self.factory) as session:
            recovery.launch_failed(session, session.get(Job, job_id), session.get(Attempt, attempt_id), why,
                                   self.clock)

    def deadline_check(self, job: Job) -> datetime | None:
        """When to ask the policy again about a launched job: each interval if it has a deadline."""
        if (preflight_due := preflight_timeout_at(job)) is not None:
            return preflight_due  # a pre-flight runs: its timeout is what is watched
        if job.spec.get("deadline") is None:
            return None
        return self.clock.now() + timedelta(seconds=self.settings.placement_interval)
