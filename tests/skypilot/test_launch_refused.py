"""A launch that SkyPilot refuses for capacity after `launch` returned (the
launcher reports it through `status`: FAILED with `capacity=True`), driven
through the reconciler pass by pass.

The launcher here is a double that answers as the SkyPilot launcher does
(a handle at once, PENDING while in flight, then the refusal): the real
launcher's side of it (the refusal SkyPilot raises, mapped to that status)
is test_launch_moto.py's, against moto's EC2."""
from __future__ import annotations

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
from spotbroker.broker.store.models import Attempt, Job
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
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.launch_failover_limit = 3
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec.model_validate({
            "run": "python train.py", "resources": {"accelerators": "A10G:1"}})).id
    sky = RefusesEverything()
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1), "skypilot": sky}, settings,
                     clock=Clock())
    for _ in range(8):
        sky.passes += 1
        rec.pass_once()
    per_pass = [p for p, _ in sky.requests]
    assert len(sky.requests) == 3, per_pass
    assert len(set(per_pass)) == len(per_pass), f"at most one launch per job per pass: {per_pass}"
    assert per_pass == [1, 2, 3], "each refusal's next place is launched in the pass that saw it"
    with factory() as s:
        job = s.get(Job, job_id)
        assert job.state == "RECOVERING"
        wait = (job.next_check_at - Clock().now()).total_seconds()
        assert settings.placement_interval - 5 < wait <= settings.placement_interval
