"""CPU places: a job without accelerators is placed on a cloud's CPU machine
by the same policy as a GPU job, and runs on the broker's host only when it
says `infra: local` (or the operator says so for every such job)."""
from __future__ import annotations

import io
import time

import pytest
from sqlalchemy import select

from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.pricing import catalog
from spotbroker.broker.pricing.catalog import snapshot_rows
from spotbroker.broker.pricing.offers import rank_offers
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.usecases import jobs


def spec(**resources) -> JobSpec:
    return JobSpec.model_validate({"run": "x", "resources": resources})


def cpu_rows(cloud: str | None = None):
    return [r for r in snapshot_rows() if r.accelerator is None and (cloud is None or r.cloud == cloud)]


# --- the snapshot ---------------------------------------------------------------------------


def test_the_snapshot_carries_cpu_offers_of_every_cloud():
    rows = cpu_rows()
    assert {r.cloud for r in rows} == {"aws", "gcp", "azure"}
    assert all(r.accelerator_count == 0 and r.vcpus and r.memory_gib and r.ondemand_price for r in rows)
    assert {"m5.2xlarge", "c6i.4xlarge", "n2-standard-8", "Standard_D8s_v5"} <= {r.instance_type for r in rows}
    # AWS rows carry zone ids (the catalog's), GCP zone names, Azure neither (regional)
    assert all(r.zone_id and not r.zone for r in cpu_rows("aws"))
    assert all(r.zone and not r.zone_id for r in cpu_rows("gcp"))
    assert all(not r.zone and not r.zone_id for r in cpu_rows("azure"))


def test_a_gpu_host_or_an_n_series_row_is_never_a_cpu_offer():
    gcp = ("InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,"
           "SpotPrice\n"
           "g2-standard-8,8.0,32.0,,,,us-central1,us-central1-a,0.85,0.3\n"
           "n2-standard-8,8.0,32.0,,,,us-central1,us-central1-a,0.38847,0.12701\n"
           "n2-standard-2,2.0,8.0,,,,us-central1,us-central1-b,0.0,\n")
    assert [r.instance_type for r in catalog.cpu_rows("gcp", io.StringIO(gcp))] == ["n2-standard-8"]
    azure = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
             "Generation\n"
             "Standard_NP10s,,,10.0,168,,1.65,,eastus,V2\n"
             "Standard_D8s_v5,,,8.0,32,,0.384,0.04224,eastus,\"V1,V2\"\n")
    assert [r.instance_type for r in catalog.cpu_rows("azure", io.StringIO(azure))] == ["Standard_D8s_v5"]


# --- ranking ------------------------------------------------------------------------------


@pytest.fixture
def session(factory, catalog_offers):
    with factory() as s:
        yield s


def cheapest(rows, pred, spot: bool) -> float:
    return min(p for r in rows if pred(r) and (p := r.spot_price if spot else r.ondemand_price) is not None)


def test_a_cpu_job_gets_skypilots_default_shape_at_the_cheapest_place(session):
    # Neither cpus nor memory: at least 8 vCPUs and 4 GiB per vCPU, as SkyPilot gives such a task.
    best = rank_offers(session, spec())[0]
    assert best.accelerator is None and best.cloud != "local" and best.use_spot
    fit = lambda r: r.vcpus >= 8 and r.memory_gib >= 4 * r.vcpus  # noqa: E731
    assert best.price_per_hour == cheapest(cpu_rows(), fit, spot=True)
    on_aws = rank_offers(session, spec(infra="aws", use_spot=False))[0]
    assert (on_aws.cloud, on_aws.instance_type, on_aws.use_spot) == ("aws", "m5.2xlarge", False)
    assert on_aws.price_per_hour == cheapest(cpu_rows("aws"), fit, spot=False)


def test_cpus_and_memory_select_among_cpu_types(session):
    # 16 vCPUs at 4 GiB each (memory unsaid) is m5.4xlarge (or the 8 GiB/vCPU r6i.4xlarge, dearer),
    # never the 2 GiB/vCPU c6i.4xlarge
    ranked = rank_offers(session, spec(infra="aws", cpus="16"), limit=100)
    assert {p.instance_type for p in ranked} == {"m5.4xlarge", "r6i.4xlarge"}
    assert ranked[0].instance_type == "m5.4xlarge"
    # saying the memory lifts the ratio: the compute type is cheaper
    best = rank_offers(session, spec(infra="aws/us-east-2", cpus="16", memory="32+"))[0]
    assert (best.instance_type, best.region) == ("c6i.4xlarge", "us-east-2")
    assert {p.instance_type for p in rank_offers(session, spec(infra="gcp", cpus="32+"), limit=100)} \
        == {"n2-standard-32", "n2-standard-64"}
    named = rank_offers(session, spec(infra="azure", instance_type="Standard_D4s_v5"), limit=100)
    assert {(p.cloud, p.instance_type) for p in named} == {("azure", "Standard_D4s_v5")}
    assert rank_offers(session, spec(cpus="1000")) == []  # no such machine: nothing, never the host


def test_a_memory_heavy_cpu_task_gets_a_memory_optimized_machine(session):
    """`cpus: 2, memory: 16` (8 GiB per vCPU) found no machine: only the
    general-purpose and compute families were offered, not SkyPilot's
    memory-optimized defaults."""
    ranked = rank_offers(session, spec(cpus="2", memory="16"), limit=1000)
    assert {(p.cloud, p.instance_type) for p in ranked} == {
        ("aws", "r6i.large"), ("gcp", "n2-highmem-2"), ("azure", "Standard_E2s_v5")}


def test_a_cpu_alternative_never_takes_a_gpu_offer(session):
    ranked = rank_offers(session, spec(any_of=[{"cpus": "8+"}, {"accelerators": "T4:1"}]), limit=1000)
    assert {p.accelerator for p in ranked} == {None, "T4"}
    gpu_free = rank_offers(session, spec(cpus="8+"), limit=1000)
    assert gpu_free and all(p.accelerator is None and p.accelerator_count == 0 for p in gpu_free)


def test_infra_local_is_no_cloud_offer(session):
    assert rank_offers(session, spec(infra="local")) == []
    assert spec(infra="local").asks_for_host and not spec(infra="aws").asks_for_host and not spec().asks_for_host


# --- the reconciler ----------------------------------------------------------------------


def run(factory, settings, team_id, **spec_fields) -> tuple[Job, Attempt, dict]:
    with transaction(factory) as s:
        job_id = jobs.submit(s, team_id, JobSpec.model_validate(spec_fields)).id
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1)}, settings, clock=Clock())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            if job.state in ("SUCCEEDED", "FAILED"):
                break
        time.sleep(0.05)
    with factory() as s:
        job = s.get(Job, job_id)
        (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id))
        launched = next(e.data for e in s.scalars(select(Event).where(Event.job_id == job_id))
                        if e.type == "job_state" and (e.data or {}).get("to") == "LAUNCHING")
        s.expunge_all()
    return job, attempt, launched


def test_a_cpu_job_naming_a_cloud_is_placed_there_and_the_local_launcher_simulates_it(env, tmp_path):
    factory, settings, team = env
    out = tmp_path / "where"
    job, attempt, launched = run(factory, settings, team, run=f"echo $SPOTBROKER_CLOUD/$SPOTBROKER_REGION > {out}",
                                 resources={"infra": "azure", "disk_size": 512})
    assert job.state == "SUCCEEDED", job.reason
    assert (attempt.cloud, attempt.launcher, attempt.accelerator) == ("azure", "local", None)
    assert attempt.instance_type == "Standard_D8s_v5" and attempt.price_per_hour > 0
    assert launched["cloud"] == "azure" and "broker's host" not in launched["why"]
    assert out.read_text().strip() == f"azure/{attempt.region}"  # the node saw the place it simulates


def test_infra_local_runs_on_the_brokers_host(env):
    factory, settings, team = env
    job, attempt, launched = run(factory, settings, team, run="true", resources={"infra": "local"})
    assert job.state == "SUCCEEDED"
    assert (attempt.cloud, attempt.price_per_hour) == ("local", 0.0)
    assert launched["why"] == "it asks for the broker's host (infra: local)"


def test_the_operator_may_keep_cpu_jobs_on_the_host(env):
    factory, settings, team = env
    settings.cpu_jobs_on_host = True
    job, attempt, launched = run(factory, settings, team, run="true")
    assert job.state == "SUCCEEDED" and attempt.cloud == "local"
    assert "SPOTBROKER_CPU_JOBS_ON_HOST" in launched["why"]
    _, gpu, _ = run(factory, settings, team, run="true", resources={"accelerators": "T4:1"})
    assert gpu.cloud != "local"  # the setting is for jobs without accelerators only


def test_the_launcher_takes_a_cpu_resource_set_only_for_a_cpu_offer():
    from dataclasses import replace

    from spotbroker.broker.launch.skypilot.task import chosen_alternative
    from spotbroker.broker.pricing.offers import Placement

    both = spec(infra="aws", any_of=[{"cpus": "8+", "disk_size": 512}, {"accelerators": "T4:1"}])
    gpu = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id=None, instance_type="g4dn.xlarge",
                    accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)
    cpu = replace(gpu, instance_type="m5.2xlarge", accelerator=None, accelerator_count=0)
    assert chosen_alternative(both, gpu).accelerators == "T4:1"  # not the CPU set listed first
    assert (chosen_alternative(both, cpu).accelerators, chosen_alternative(both, cpu).disk_size) == (None, 512)
