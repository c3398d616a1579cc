"""Where a pre-flight runs: the cheapest priced CPU place the policy finds
for the trial's spec (kept to the job's infra), or the cheapest place with
the pre-flight's own accelerators, launched like any attempt (here by the
local launcher, which simulates the place)."""
from __future__ import annotations

import pytest
from sqlalchemy import select
from support.helpers import run_to_end

from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.preflight import trial
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.offers import rank_offers
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job
from spotbroker.broker.usecases import jobs


def spec(**fields) -> JobSpec:
    return JobSpec.model_validate({"run": "python train.py", **fields})


@pytest.mark.parametrize("resources, infra", [
    ({"accelerators": "A100:1"}, None),
    ({"accelerators": "A100:1", "infra": "aws/us-east-2"}, "aws/us-east-2"),
    ({"any_of": [{"accelerators": "A100:1", "infra": "gcp"}, {"accelerators": "L4:1", "infra": "gcp/us-east1"}]},
     "gcp"),
    ({"any_of": [{"accelerators": "A100:1", "infra": "gcp"}, {"accelerators": "A100:1", "infra": "aws"}]}, None),
    ({"accelerators": "A100:1", "infra": "k8s/my-cluster"}, None),  # its GPUs only: a CPU trial goes to the clouds
])
def test_the_trial_is_one_cpu_node_kept_to_the_jobs_infra(resources, infra):
    job = spec(resources=resources, num_nodes=4, max_restarts=3, preflight={"run": "python t.py --smoke"},
               estimated_hours=2, envs={"A": "1"})
    flight = trial(job)
    assert (flight.run, flight.num_nodes, flight.max_restarts, flight.deadline, flight.estimated_hours) == \
        ("python t.py --smoke", 1, 0, None, None)
    (want,) = flight.resources.alternatives()
    assert (want.accelerators, want.infra, flight.envs) == (None, infra, {"A": "1"})
    assert trial(spec(resources=resources, preflight={"accelerators": "T4:1"})).resources.accelerators == "T4:1"


def test_the_trial_keeps_the_disk_and_image_every_resource_set_names():
    same = trial(spec(preflight=True, resources={"disk_size": 500, "image_id": "ami-1", "any_of": [
        {"accelerators": "A100:1"}, {"accelerators": "H100:1"}]}))
    assert (same.resources.disk_size, same.resources.image_id, same.resources.accelerators) == (500, "ami-1", None)
    differ = trial(spec(preflight=True, resources={"any_of": [{"accelerators": "A100:1", "disk_size": 500},
                                                              {"accelerators": "H100:1", "disk_size": 100}]}))
    assert differ.resources.disk_size is None


def run(factory, settings, team_id: int, **fields) -> list[Attempt]:
    with transaction(factory) as s:
        job_id = jobs.submit(s, team_id, JobSpec.model_validate(fields)).id
    run_to_end(factory, settings, job_id, timeout=60)
    with factory() as s:
        assert s.get(Job, job_id).state == "SUCCEEDED", s.get(Job, job_id).reason
        attempts = list(s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id)))
        s.expunge_all()
    return attempts


def test_a_preflight_with_accelerators_runs_on_the_cheapest_such_gpu(env, job_scratch):
    factory, settings, team = env
    out = job_scratch / "seen"
    flight, gpu = run(factory, settings, team, run="true", resources={"accelerators": "A100:1"}, preflight={
        "accelerators": "T4:1", "run": f"echo CUDA=${{CUDA_VISIBLE_DEVICES-unset}} PF=$SPOTBROKER_PREFLIGHT > {out}"})
    assert (flight.preflight, flight.accelerator, gpu.preflight, gpu.accelerator) == (True, "T4", False, "A100")
    assert out.read_text().strip() == "CUDA=unset PF=1"  # a GPU is there to use: none hidden
    with factory() as s:
        cheapest = rank_offers(s, spec(resources={"accelerators": "T4:1"}))[0]
    assert (flight.instance_type, flight.price_per_hour) == (cheapest.instance_type, cheapest.price_per_hour)


def test_a_cpu_preflight_runs_on_the_cheapest_cpu_place_in_the_jobs_region(env, job_scratch):
    factory, settings, team = env
    out = job_scratch / "seen"
    flight, gpu = run(factory, settings, team, run="true", preflight=True,
                      resources={"accelerators": "T4:1", "infra": "aws/us-east-2"},
                      setup=f"echo $SPOTBROKER_REGION CUDA=[${{CUDA_VISIBLE_DEVICES-unset}}] >> {out}")
    assert (flight.preflight, flight.accelerator, flight.cloud, flight.region) == (True, None, "aws", "us-east-2")
    with factory() as s:
        cheapest = rank_offers(s, trial(spec(resources={"accelerators": "T4:1", "infra": "aws/us-east-2"},
                                             preflight=True)))[0]
    assert (flight.instance_type, flight.price_per_hour) == (cheapest.instance_type, cheapest.price_per_hour)
    assert (gpu.preflight, gpu.accelerator, gpu.region) == (False, "T4", "us-east-2")
    # the job's setup ran twice: in the pre-flight, with no GPU visible; then in the GPU attempt
    assert out.read_text().splitlines() == ["us-east-2 CUDA=[]", "us-east-2 CUDA=[unset]"]


@pytest.mark.parametrize("run_state, job_after, attempt_after, again", [
    ("SUCCEEDED", "RECOVERING", "SUCCEEDED", False),  # it passed: the next attempt is the GPU's
    ("FAILED", "RECOVERING", "PREEMPTED", True),      # its node was reclaimed: the pre-flight is tried again
])
def test_a_preflight_ending_as_a_notice_comes(env, run_state, job_after, attempt_after, again):
    """A notice during the pre-flight: a pass still counts (the job never ends
    SUCCEEDED on its trial's exit 0), a failure is the reclaim's."""
    from datetime import UTC, datetime

    from spotbroker.broker.jobs import preflight
    from spotbroker.broker.jobs.runs import RunState, RunStatus
    from spotbroker.broker.jobs.states import transition
    from spotbroker.broker.recovery import attempts as recovery

    factory, settings, team = env
    clock = Clock()
    with transaction(factory) as s:
        job = jobs.submit(s, team, spec(preflight=True, resources={"accelerators": "T4:1"}))
        now = datetime.now(UTC)
        attempt = Attempt(job_id=job.id, state="LAUNCHING", launcher="local", cloud="aws", instance_type="m5.2xlarge",
                          use_spot=True, num_nodes=1, price_per_hour=0.1, preflight=True, created_at=now,
                          updated_at=now)
        s.add(attempt)
        s.flush()
        for to in ("LAUNCHING", "RUNNING", "PREEMPTING"):
            transition(s, job, to, clock=clock)
        transition(s, attempt, "RUNNING", clock=clock)
        attempt.end_reason = "preempted"
        recovery.on_status(s, job, attempt.id, RunStatus(RunState(run_state), exit_code=0 if run_state == "SUCCEEDED"
                                                         else 143), clock)
        assert (job.state, attempt.state) == (job_after, attempt_after)
        job_id = job.id
    with factory() as s:
        job = s.get(Job, job_id)
        assert preflight.wanted(job, JobSpec.model_validate(job.spec)) is again


def test_a_preflights_own_place_meets_the_teams_price_limit(env):
    """The team's limits filtered the job's places, then the pre-flight's own
    took their place unfiltered: a pre-flight whose places are all over the
    team's $/h is not launched; the job waits (or is held) with the limit."""
    from spotbroker.broker.launch.local import LocalLauncher
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.recovery import preflight
    from spotbroker.broker.teampolicy import policy as policies

    factory, settings, team = env
    job_spec = spec(resources={"accelerators": "T4:1"}, preflight={"accelerators": "A100:1"})
    with factory() as s:
        t4 = rank_offers(s, job_spec)[0]
        a100 = rank_offers(s, trial(job_spec))[0]
    assert t4.price_per_hour < a100.price_per_hour
    limit = (t4.price_per_hour + a100.price_per_hour) / 2  # the job's places within it, the pre-flight's not
    with transaction(factory) as s:
        policies.put(s, team, policies.Policy(max_price_per_hour=limit))
        job_id = jobs.submit(s, team, job_spec).id
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1)}, settings, clock=Clock())
    with transaction(factory) as s:  # (what `_place` does once nothing holds the job)
        job = s.get(Job, job_id)
        waits = preflight.plan(rec.placer, rec.launching, s, job, job_spec, t4)
        assert isinstance(waits, str) and waits.startswith("waiting for a place within the team's limits: its "
                                                           "pre-flight: ") and "over max_price_per_hour" in waits
        assert job.state == "PENDING" and job.attempts == []
    rec.pass_once()
    with factory() as s:
        job = s.get(Job, job_id)
        assert job.state == "HELD" and job.attempts == [], (job.state, job.reason)
        assert job.reason.startswith("held by a limit: max_price_per_hour:") and "for its pre-flight" in job.reason
