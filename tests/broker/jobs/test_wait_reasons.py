"""Every job that waits says why (#25): for one of the local launcher's
slots (with how many jobs are ahead of it, never whose), for capacity
after every place refused, from the moment it is submitted."""
from __future__ import annotations

import time

from support.helpers import submit

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.launch.base import CapacityError
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.usecases import jobs


def reconciler(factory, settings, launcher=None) -> Reconciler:
    return Reconciler(factory, {"local": launcher or LocalLauncher(settings.data_dir, 1)}, settings, clock=Clock())


def passes_until(rec, factory, predicate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            if predicate(s):
                return
        time.sleep(0.05)
    raise AssertionError("timed out")


def reason(factory, job_id: int) -> str | None:
    with factory() as s:
        return s.get(Job, job_id).reason


def test_jobs_behind_another_teams_run_wait_for_a_local_slot_with_how_many_are_ahead(env):
    factory, settings, team = env
    settings.local_max_running = 1
    with transaction(factory) as s:
        other, _ = auth.create_team(s, "other-team")
    rec = reconciler(factory, settings)
    busy = submit(factory, other.id, run="sleep 30")
    passes_until(rec, factory, lambda s: s.get(Job, busy).state in ("LAUNCHING", "RUNNING"))
    first, second = submit(factory, team, run="sleep 3"), submit(factory, team, run="true")
    assert reason(factory, first) == "queued: waiting to be placed"  # from the start
    rec.pass_once()
    assert reason(factory, first) == "waiting for a local slot: all 1 in use, no job ahead of it"
    assert reason(factory, second) == "waiting for a local slot: all 1 in use, 1 job ahead of it"
    with transaction(factory) as s:
        jobs.cancel(s, other.id, busy)
    passes_until(rec, factory, lambda s: s.get(Job, first).state in ("LAUNCHING", "RUNNING", "SUCCEEDED"))
    with factory() as s:
        assert s.get(Job, first).reason is None or "waiting" not in s.get(Job, first).reason
    # the queue moved up: told within a second (at most once a second, whatever the hints)
    passes_until(rec, factory, lambda s: s.get(Job, second).reason
                 == "waiting for a local slot: all 1 in use, no job ahead of it", timeout=5)
    passes_until(rec, factory, lambda s: s.get(Job, second).state == "SUCCEEDED")


class NoCapacity(LocalLauncher):
    def launch(self, request):
        raise CapacityError("InsufficientInstanceCapacity")


def test_a_job_every_place_refused_waits_for_capacity_saying_so(env):
    factory, settings, team = env
    job_id = submit(factory, team, run="true", resources={"accelerators": "A10G:1"})
    rec = reconciler(factory, settings, NoCapacity(settings.data_dir, 1))
    passes_until(rec, factory, lambda s: s.get(Job, job_id).state == "RECOVERING")
    assert reason(factory, job_id).startswith(
        "waiting for capacity: every place tried refused the launch (the last: InsufficientInstanceCapacity)")


def test_a_job_whose_chosen_places_break_the_teams_limits_waits_saying_which(env):
    """An instance type names no accelerator, so submission cannot refuse it:
    the places placement chose carry one the team may not use."""
    from spotbroker.broker.teampolicy import policy as policies

    factory, settings, team = env
    with transaction(factory) as s:
        policies.put(s, team, policies.Policy(allowed_accelerators=["L4"]))
    job_id = submit(factory, team, run="true", resources={"instance_type": "g4dn.xlarge"})
    rec = reconciler(factory, settings)
    rec.pass_once()
    with factory() as s:
        job = s.get(Job, job_id)
        assert (job.state, job.attempts) == ("PENDING", [])
        assert job.reason == "waiting for a place within the team's limits: T4 is not in allowed_accelerators (L4)"
