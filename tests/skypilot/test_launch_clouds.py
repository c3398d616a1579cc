"""The clouds SkyPilot reports enabled limit the places the policy may
choose. SkyPilot's answer is injected at the SDK boundary here (an object
answering `enabled_clouds` as SkyPilot's API server does); the real answer
against moto's AWS is test_launch_moto.py's."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.usecases import jobs


class CheckedSky:
    """SkyPilot's SDK as far as `sky check` goes: request ids, then their answers."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.asked = names, 0

    def check(self, infra_list, verbose):
        assert infra_list is None  # every cloud
        return "req-check"

    def enabled_clouds(self, expand=False):
        assert expand, "the broker asks for Kubernetes' contexts"
        self.asked += 1
        return "req-1"

    def get(self, request_id):
        assert request_id in ("req-check", "req-1")
        return list(self.names) if request_id == "req-1" else {}


def clouds_chosen(factory, settings, launchers) -> set[str]:
    placer = Placer(settings, launchers)
    placer.new_pass()
    with factory() as s:
        job = s.scalars(select(Job)).one()
        choice = placer.choose(s, job, JobSpec.model_validate(job.spec), Clock().now())
    return {p.cloud for p in choice.placements} if choice is not None else set()


def test_only_the_enabled_clouds_are_placed_on_and_the_local_launcher_changes_nothing(factory, settings, tmp_path):
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        jobs.submit(s, team.id, JobSpec.model_validate({"run": "true", "resources": {
            "any_of": [{"accelerators": "T4:1"}, {"accelerators": "A10G:1"}, {"accelerators": "L4:1"}],
            "use_spot": False}}))
    everywhere = clouds_chosen(factory, settings, {})
    assert len(everywhere) > 1, f"the catalog offers these GPUs on several clouds: {everywhere}"
    assert clouds_chosen(factory, settings, {"local": LocalLauncher(settings.data_dir, 1)}) == everywhere

    sky = CheckedSky(["AWS"])
    launcher = SkyPilotLauncher(tmp_path, prefix="sbclouds", sky=sky)
    try:
        # not asked yet: no limit (the janitor asks when the broker starts)
        assert clouds_chosen(factory, settings, {"skypilot": launcher}) == everywhere
        assert launcher.refresh_clouds() == frozenset({"aws"})
        asked = sky.asked
        assert clouds_chosen(factory, settings, {"skypilot": launcher}) == {"aws"}
        assert sky.asked == asked, "a reconciler pass never asks SkyPilot: the answer is cached"
        sky.names = ["gcp", "kubernetes/Lab-A"]  # as SkyPilot's server answers with expand=True
        assert launcher.refresh_clouds() == frozenset({"gcp", "k8s", "k8s/Lab-A"})
        assert clouds_chosen(factory, settings, {"skypilot": launcher}) == {"gcp"}
    finally:
        launcher.close()


def test_the_janitor_refreshes_the_clouds_on_each_sweep(factory, tmp_path):
    import threading

    from spotbroker.broker.launch.skypilot.janitor import run_janitor

    class Sky(CheckedSky):
        def status(self, **_):
            return ("status", [])

        def api_status(self, **_):
            return []

        def get(self, request_id):
            return request_id[1] if isinstance(request_id, tuple) else super().get(request_id)

    sky = Sky(["AWS", "Azure"])
    launcher = SkyPilotLauncher(tmp_path, prefix="sbclouds", sky=sky)
    stop = threading.Event()
    sweeps = []

    def on_sweep(downed):
        sweeps.append(downed)
        if len(sweeps) == 2:
            stop.set()

    run_janitor(launcher, factory, 0.05, stop, on_sweep=on_sweep)
    assert sky.asked == 2 and launcher.enabled_clouds() == frozenset({"aws", "azure"})


def t4_job(factory, settings) -> int:
    """The catalog's offers, a team and its job for one T4: the job's id."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        return jobs.submit(s, team.id, JobSpec.model_validate(
            {"run": "true", "resources": {"accelerators": "T4:1"}})).id


def test_with_no_cloud_enabled_a_gpu_job_is_held_saying_so_and_released_once_one_is(factory, settings, tmp_path):
    from spotbroker.broker.placement.placer import NO_CLOUD
    from spotbroker.broker.reconciler import Reconciler

    job_id = t4_job(factory, settings)
    sky = CheckedSky([])  # `sky check` found no credentials anywhere
    launcher = SkyPilotLauncher(tmp_path, prefix="sbclouds", sky=sky)
    rec = Reconciler(factory, {"skypilot": launcher}, settings)
    try:
        assert launcher.refresh_clouds() == frozenset()
        assert launcher.readiness() == (False, "waiting for SkyPilot's API server to start")
        launcher.server.answered()
        assert launcher.readiness() == (False, NO_CLOUD)
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            assert (job.state, job.reason) == ("HELD", NO_CLOUD)  # not FAILED no_feasible_offer
            s.execute(update(Job).where(Job.id == job_id).values(next_check_at=Clock().now()))
            s.commit()
        rec.pass_once()
        with factory() as s:
            assert s.get(Job, job_id).state == "HELD", "held while no cloud is enabled"
            s.execute(update(Job).where(Job.id == job_id).values(next_check_at=Clock().now()))
            s.commit()
        sky.names = ["AWS"]  # the next check finds credentials
        launcher.refresh_clouds()
        assert launcher.readiness() == (True, "SkyPilot can launch on aws")
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            assert (job.state, job.reason) == ("PENDING", "nothing holds it now")
    finally:
        launcher.close()


def test_a_job_submitted_before_the_first_check_waits_for_it(factory, settings, tmp_path):
    """A broker just started placed a job before `sky check` had answered:
    on a cloud SkyPilot then refused ("requires azure which is not
    enabled"), again and again, until the job failed."""
    from spotbroker.broker.placement.placer import NOT_CHECKED
    from spotbroker.broker.reconciler import Reconciler

    job_id = t4_job(factory, settings)
    sky = CheckedSky(["AWS"])
    launcher = SkyPilotLauncher(tmp_path, prefix="sbclouds", sky=sky)
    rec = Reconciler(factory, {"skypilot": launcher}, settings)
    try:
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            assert (job.state, job.reason, job.attempts) == ("HELD", NOT_CHECKED, [])
            assert job.next_check_at <= Clock().now() + timedelta(seconds=settings.reconcile_interval + 1)
            s.execute(update(Job).where(Job.id == job_id).values(next_check_at=Clock().now()))
            s.commit()
        launcher.refresh_clouds()  # the janitor's first check
        rec.pass_once()
        with factory() as s:
            assert (s.get(Job, job_id).state, s.get(Job, job_id).reason) == ("PENDING", "nothing holds it now")
    finally:
        launcher.close()


def test_a_first_check_that_failed_is_asked_again_within_seconds(factory, tmp_path):
    """Readiness waits for `sky check`'s first answer: one that failed (a
    replica starting beside another on a loaded host) is not left for the
    next check interval (two minutes by default)."""
    import threading
    import time

    from spotbroker.broker.launch.skypilot.janitor import run_janitor

    class FlakySky(CheckedSky):
        def __init__(self, names):
            super().__init__(names)
            self.checks = 0

        def check(self, infra_list, verbose):
            self.checks += 1
            if self.checks == 1:
                raise TimeoutError("the API server took too long to answer")
            return super().check(infra_list, verbose)

        def status(self, **_):
            return "req-status"

        def api_status(self, **_):
            return []

        def get(self, request_id):
            return [] if request_id == "req-status" else super().get(request_id)

    sky = FlakySky(["AWS"])
    launcher = SkyPilotLauncher(tmp_path, prefix="sbretry", sky=sky)
    stop = threading.Event()
    thread = threading.Thread(target=run_janitor, args=(launcher, factory, 300.0, stop),
                              kwargs={"check_interval": 120.0}, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        while launcher.readiness()[0] is False and time.monotonic() - started < 30:
            time.sleep(0.1)
        assert launcher.readiness() == (True, "SkyPilot can launch on aws"), launcher.readiness()
        assert sky.checks == 2 and time.monotonic() - started < 10
    finally:
        stop.set()
        thread.join(10)
        launcher.close()
