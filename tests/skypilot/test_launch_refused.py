"""A launch that SkyPilot refuses for capacity after `launch` returned (the
launcher reports it through `status`: FAILED with `capacity=True`), driven
through the reconciler pass by pass.

The launcher here is a double that answers as the SkyPilot launcher does
(a handle at once, PENDING while in flight, then the refusal): the real
launcher's side of it (the refusal SkyPilot raises, mapped to that status)
is test_launch_moto.py's, against moto's EC2."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import EndReason
from spotbroker.broker.launch.base import LaunchRequest
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.placement.placer import attempt_key, load_histories
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store import sealing
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.usecases import jobs


class RefusedAfterLaunch:
    """SkyPilot's launcher as the reconciler sees it: the first launch is
    refused for capacity once it has been seen in flight; later ones stay in flight."""

    name = "skypilot"

    def __init__(self) -> None:
        self.passes = 0  # the reconciler pass now running (the test counts them)
        self.requests: list[tuple[int, LaunchRequest]] = []  # (pass, request)
        self.polled: dict[str, int] = {}
        self.refused_in_pass: int | None = None
        self.downed: list[str] = []

    def launch(self, request: LaunchRequest) -> dict:
        self.requests.append((self.passes, request))
        return {"cluster": f"sb-{request.attempt_id}", "request_id": f"r{request.attempt_id}"}

    def status(self, handle: dict) -> RunStatus:
        cluster = handle["cluster"]
        self.polled[cluster] = self.polled.get(cluster, 0) + 1
        if cluster == f"sb-{self.requests[0][1].attempt_id}" and self.polled[cluster] > 1:
            if self.refused_in_pass is None:
                self.refused_in_pass = self.passes
            return RunStatus(RunState.FAILED, capacity=True,
                             error="ResourcesUnavailableError: InsufficientInstanceCapacity in the zone")
        return RunStatus(RunState.PENDING)

    def terminate(self, handle: dict) -> None:
        self.downed.append(handle["cluster"])


def a_job_and_passes(factory, settings, sky: RefusedAfterLaunch, passes: int) -> tuple[int, Reconciler]:
    """An A10G job, then `passes` reconciler passes with `sky` as SkyPilot's launcher."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec.model_validate({
            "run": "python train.py", "resources": {"accelerators": "A10G:1"}})).id
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1), "skypilot": sky}, settings,
                     clock=Clock())
    for _ in range(passes):
        sky.passes += 1
        rec.pass_once()
    return job_id, rec


def test_a_refusal_after_launch_ends_no_capacity_counts_the_zone_and_launches_the_next_place(
        factory, settings):
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec.model_validate({
            "run": "python train.py", "resources": {"accelerators": "A10G:1", "disk_size": 300},
            "secrets": {"HF_TOKEN": "hf-value"}}), keyring=sealing.keyring(settings)).id
    sky = RefusedAfterLaunch()
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1), "skypilot": sky}, settings,
                     clock=Clock())
    while len(sky.requests) < 2 and sky.passes < 10:
        sky.passes += 1
        rec.pass_once()

    assert len(sky.requests) == 2, f"no second launch in {sky.passes} passes"
    (_, first_request), (second_pass, second_request) = sky.requests
    # the next place's launch request: in the pass that saw the refusal, not the next one
    assert sky.refused_in_pass is not None and second_pass == sky.refused_in_pass
    with factory() as s:
        first = s.get(Attempt, first_request.attempt_id)
        second = s.get(Attempt, second_request.attempt_id)
        assert (first.state, first.end_reason, first.reason) == ("FAILED", EndReason.NO_CAPACITY, "no_capacity")
        assert second.state == "LAUNCHING" and s.get(Job, job_id).state == "LAUNCHING"
        assert attempt_key(second) != attempt_key(first), "the refused place is not tried again at once"
        # the zone is counted: what the next passes' placement replays from the attempts
        history = load_histories(s, Clock().now(), settings)[attempt_key(first)]
        assert history.capacity_failures == 1
        assert len(list(s.scalars(select(Attempt).where(Attempt.job_id == job_id)))) == 2
    # the refused launch's cluster (left INIT by SkyPilot) is downed in the next pass's release phase
    sky.passes += 1
    rec.pass_once()
    assert sky.downed == [f"sb-{first.id}"]
    # each request carries the job's file, secrets included, for the node's Task
    assert second_request.spec.resources.disk_size == 300 and second_request.secrets == {"HF_TOKEN": "hf-value"}


class RefusesEverything(RefusedAfterLaunch):
    """Every launch is refused for capacity the second time it is looked at."""

    def status(self, handle: dict) -> RunStatus:
        cluster = handle["cluster"]
        self.polled[cluster] = self.polled.get(cluster, 0) + 1
        if self.polled[cluster] > 1:
            return RunStatus(RunState.FAILED, capacity=True, error="ResourcesUnavailableError: no capacity")
        return RunStatus(RunState.PENDING)


def test_refusals_after_launch_are_bounded_like_a_fail_over_round(factory, settings):
    """Each refusal launches the next place in the same pass, one per job per
    pass; after launch_failover_limit refusals in a row within a placement
    interval the job waits an interval, as a round whose every place refused."""
    settings.launch_failover_limit = 3
    sky = RefusesEverything()
    job_id, _ = a_job_and_passes(factory, settings, sky, 8)
    per_pass = [p for p, _ in sky.requests]
    assert len(sky.requests) == 3, per_pass
    assert len(set(per_pass)) == len(per_pass), f"at most one launch per job per pass: {per_pass}"
    assert per_pass == [1, 2, 3], "each refusal's next place is launched in the pass that saw it"
    with factory() as s:
        job = s.get(Job, job_id)
        assert job.state == "RECOVERING"
        wait = (job.next_check_at - Clock().now()).total_seconds()
        assert settings.placement_interval - 5 < wait <= settings.placement_interval


class ForgetsTheFirstLaunch(RefusedAfterLaunch):
    """SkyPilot's API server restarted after the first launch and forgot its
    request: the launcher reports it lost (`resend`) until it is sent again."""

    def status(self, handle: dict) -> RunStatus:
        self.polled[handle["request_id"]] = self.polled.get(handle["request_id"], 0) + 1
        if handle["request_id"] == "r-first" and self.polled["r-first"] > 1:  # in flight at the first look
            return RunStatus(RunState.FAILED, resend=True, error="SkyPilot's API server no longer knows it")
        return RunStatus(RunState.PENDING)

    def launch(self, request: LaunchRequest) -> dict:
        handle = super().launch(request)
        return {**handle, "request_id": "r-first" if len(self.requests) == 1 else "r-again"}


def test_a_launch_the_restarted_api_server_forgot_is_sent_again_to_the_same_place(factory, settings):
    """Nothing is learned of the place, no attempt ends: the same attempt is
    launched again, at its place, in the pass that saw it lost; past the
    launch timeout it is a place that gave no node in time (the next is tried)."""
    sky = ForgetsTheFirstLaunch()
    job_id, rec = a_job_and_passes(factory, settings, sky, 4)
    assert [(p, r.attempt_id, r.placement) for p, r in sky.requests] == [
        (1, sky.requests[0][1].attempt_id, sky.requests[0][1].placement),
        (2, sky.requests[0][1].attempt_id, sky.requests[0][1].placement)]
    with factory() as s:
        attempt = s.get(Attempt, sky.requests[0][1].attempt_id)
        assert attempt.state == "LAUNCHING" and attempt.handle["request_id"] == "r-again"
        assert s.get(Job, job_id).state == "LAUNCHING"
        events = s.scalars(select(Event).where(Event.job_id == job_id, Event.type == "launch_resent")).all()
        assert [e.data["reason"] for e in events] == ["SkyPilot's API server no longer knows it"]
        learned = load_histories(s, Clock().now(), settings).get(attempt_key(attempt))
        assert learned is None or learned.capacity_failures == 0, "nothing learned of the place"
    assert sky.downed == [], "the same cluster, launched again: nothing to release"

    # Lost again once the launch timeout has passed: the next place.
    sky.requests.pop()
    with transaction(factory) as s:
        attempt = s.get(Attempt, attempt.id)
        attempt.handle = {**attempt.handle, "request_id": "r-first"}
        attempt.created_at -= timedelta(seconds=settings.skypilot_launch_timeout)
    sky.passes += 1
    rec.pass_once()
    with factory() as s:
        first = s.get(Attempt, attempt.id)
        assert (first.state, first.end_reason) == ("FAILED", EndReason.NO_CAPACITY)
    assert len(sky.requests) == 2 and sky.requests[-1][1].attempt_id != attempt.id
