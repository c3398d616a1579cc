"""The operator's Kubernetes clusters as priced places
(broker/placement/kubernetes.py): preferred while they have room, spilled
from when full (capacity counted from the database across jobs, nodes and
brokers), released when attempts end, limited to the teams and contexts
allowed, and refused configs said clearly. Driven through the reconciler;
the launcher is a double that records requests and answers as a launcher
does (the local launcher's whole run on a cluster is tests/e2e's)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.base import CapacityError, LaunchRequest
from spotbroker.broker.placement.kubernetes import PlacesFileError, load
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.usecases import jobs

H100_8 = {"accelerators": "H100:8"}
LAB = {"context": "lab-a", "nodes": [{"accelerator": "H100", "gpus_per_node": 8, "count": 2}]}


class Recorder:
    """A launcher as the reconciler sees it: every launch recorded, each run
    RUNNING until the test ends it (`finish`) or refuses it (`refuse`)."""

    name = "skypilot"

    def __init__(self) -> None:
        self.requests: list[LaunchRequest] = []
        self.ends: dict[int, RunStatus] = {}
        self.refuse_at_launch: set[str] = set()  # clouds whose launches raise CapacityError
        self.on_launch = None
        self.until_ended = RunStatus(RunState.RUNNING)  # PENDING: a launch SkyPilot still follows

    def launch(self, request: LaunchRequest) -> dict:
        self.requests.append(request)
        if self.on_launch is not None:
            self.on_launch(request)
        if request.placement.cloud in self.refuse_at_launch:
            raise CapacityError(f"no capacity in {request.placement.place}")
        return {"attempt": request.attempt_id}

    def status(self, handle: dict) -> RunStatus:
        return self.ends.get(handle["attempt"], self.until_ended)

    def terminate(self, handle: dict) -> None:
        pass

    def finish(self, attempt_id: int) -> None:
        self.ends[attempt_id] = RunStatus(RunState.SUCCEEDED, 0)

    def refuse(self, attempt_id: int) -> None:
        self.ends[attempt_id] = RunStatus(RunState.FAILED, capacity=True, error="pods unschedulable")


def places_file(tmp_path: Path, *clusters: dict, name: str = "places.yaml") -> Path:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump({"clusters": list(clusters)}))
    return path


@pytest.fixture
def env(factory, settings, tmp_path, catalog_offers):
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        ml, _ = auth.create_team(s, "ml")
        vision, _ = auth.create_team(s, "vision")
    settings.kubernetes_places = places_file(tmp_path, LAB)
    return settings, {"ml": ml.id, "vision": vision.id}


def submit(factory, team_id: int, **spec) -> int:
    with transaction(factory) as s:
        return jobs.submit(s, team_id, JobSpec.model_validate({"run": "python train.py", **spec})).id


def live_attempt(factory, job_id: int) -> Attempt | None:
    with factory() as s:
        return s.scalars(select(Attempt).where(Attempt.job_id == job_id, Attempt.ended_at.is_(None))).first()


def job_of(factory, job_id: int) -> Job:
    with factory() as s:
        return s.get(Job, job_id)


def test_the_paid_for_cluster_is_preferred_then_spilled_from_when_full_and_released_when_attempts_end(
        factory, env):
    settings, teams = env
    sky = Recorder()
    rec = Reconciler(factory, {"skypilot": sky}, settings, clock=Clock())
    # 16 H100 in two nodes of 8: a 2-node job of 8 per node takes all of them
    big = submit(factory, teams["ml"], resources=H100_8, num_nodes=2)
    rec.pass_once()
    first = live_attempt(factory, big)
    assert (first.cloud, first.region, first.use_spot, first.price_per_hour) == ("k8s", "lab-a", False, 0.0)
    assert (first.accelerator, first.accelerator_count, first.num_nodes) == ("H100", 8, 2)
    # full: another team's job spills to the cheapest cloud place at once, saying why
    small = submit(factory, teams["vision"], resources={"accelerators": "H100:1"})
    rec.pass_once()
    spilled = live_attempt(factory, small)
    assert spilled.cloud in ("aws", "gcp", "azure") and spilled.use_spot
    with factory() as s:
        events = s.scalars(select(Event.data).where(Event.job_id == small, Event.type == "job_state")).all()
    why = next(e["why"] for e in events if e["to"] == "LAUNCHING")
    assert "Kubernetes full: lab-a has 0 of 16 H100 free" in why
    # the big job ends: its GPUs are free again for the next job
    sky.finish(first.id)
    rec.pass_once()
    assert job_of(factory, big).state == "SUCCEEDED"
    again = submit(factory, teams["ml"], resources=H100_8)
    rec.pass_once()
    assert (live_attempt(factory, again).cloud, live_attempt(factory, again).region) == ("k8s", "lab-a")


def test_capacity_is_counted_across_jobs_and_brokers(factory, env):
    settings, teams = env
    sky_a, sky_b = Recorder(), Recorder()
    brokers = [Reconciler(factory, {"skypilot": sky}, settings, clock=Clock(), owner=name)
               for name, sky in (("a", sky_a), ("b", sky_b))]
    ids = []
    for i in range(5):  # the brokers take turns, each deciding on what the other wrote
        ids.append(submit(factory, teams["ml"] if i % 2 else teams["vision"], resources={"accelerators": "H100:4"}))
        brokers[i % 2].pass_once()
    assert len(sky_a.requests) == 3 and len(sky_b.requests) == 2
    clouds = [live_attempt(factory, j).cloud for j in ids]
    assert clouds.count("k8s") == 4 and clouds[4] != "k8s", clouds  # 4 x 4 = 16 GPUs, then the clouds


def test_a_priced_cluster_goes_where_its_price_ranks(factory, env, tmp_path):
    settings, teams = env
    # $2/GPU-hour: $16 per node-hour for H100:8, above spot (~$10) and below on-demand (~$43)
    settings.kubernetes_places = places_file(tmp_path, {**LAB, "price_per_gpu_hour": 2})
    placer = Placer(settings)
    placer.new_pass()
    job_id = submit(factory, teams["ml"], resources=H100_8)
    on_demand = submit(factory, teams["ml"], resources={**H100_8, "use_spot": False})
    with factory() as s:
        spot_choice = placer.choose(s, s.get(Job, job_id), JobSpec.model_validate(s.get(Job, job_id).spec),
                                    Clock().now())
        od_choice = placer.choose(s, s.get(Job, on_demand), JobSpec.model_validate(s.get(Job, on_demand).spec),
                                  Clock().now())
    spot_places = [(p.cloud, p.price_per_hour) for p in spot_choice.placements]
    assert spot_places[0][0] != "k8s" and ("k8s", 16.0) in spot_places
    k8s_at = spot_places.index(("k8s", 16.0))
    assert all(price <= 16.0 for _, price in spot_places[:k8s_at])
    assert [p.cloud for p in od_choice.placements][0] == "k8s", "cheaper than every on-demand place"


def test_only_the_teams_a_cluster_names_may_use_it(factory, env, tmp_path):
    settings, teams = env
    settings.kubernetes_places = places_file(tmp_path, {**LAB, "teams": ["vision"]})
    sky = Recorder()
    rec = Reconciler(factory, {"skypilot": sky}, settings, clock=Clock())
    ml_job = submit(factory, teams["ml"], resources=H100_8)
    vision_job = submit(factory, teams["vision"], resources=H100_8)
    rec.pass_once()
    assert live_attempt(factory, ml_job).cloud != "k8s"
    assert live_attempt(factory, vision_job).cloud == "k8s"


def test_infra_k8s_runs_only_on_the_clusters_and_waits_while_they_are_full(factory, env, tmp_path):
    settings, teams = env
    settings.kubernetes_places = places_file(tmp_path, LAB, {**LAB, "context": "lab-b"})
    sky = Recorder()
    rec = Reconciler(factory, {"skypilot": sky}, settings, clock=Clock())
    pinned = submit(factory, teams["ml"], resources={**H100_8, "infra": "k8s/lab-b"})
    anywhere = [submit(factory, teams["ml"], resources={**H100_8, "infra": "kubernetes"}) for _ in range(4)]
    waiting = submit(factory, teams["ml"], resources={**H100_8, "infra": "k8s"})
    cloud_only = submit(factory, teams["ml"], resources={**H100_8, "infra": "aws"})
    rec.pass_once()
    assert (live_attempt(factory, pinned).cloud, live_attempt(factory, pinned).region) == ("k8s", "lab-b")
    assert sorted(live_attempt(factory, j).region for j in anywhere[:3]) == ["lab-a", "lab-a", "lab-b"]
    assert live_attempt(factory, cloud_only).cloud == "aws"
    # 4 clusters' worth asked of 2 clusters: the rest wait (never a cloud), saying why once
    for job_id in (anywhere[3], waiting):
        job = job_of(factory, job_id)
        assert live_attempt(factory, job_id) is None and job.state == "PENDING", job.state
        assert job.reason == ("waiting for capacity: no Kubernetes place that fits has room: lab-a has 0 of 16 H100 "
                              "free; lab-b has 0 of 16 H100 free")
    # a job no cluster can ever fit (more GPUs per node than a node has) fails as an unfit job does
    too_big = submit(factory, teams["ml"], resources={"accelerators": "H100:16", "infra": "k8s"})
    rec.pass_once()
    assert (job_of(factory, too_big).state, job_of(factory, too_big).reason) == (
        "FAILED", "no_feasible_offer: no Kubernetes node has 16 H100 (at most 8)")  # (was a bare no_feasible_offer)


def test_a_cluster_that_refused_counts_as_full_for_an_interval(factory, env):
    settings, teams = env
    sky = Recorder()
    sky.until_ended = RunStatus(RunState.PENDING)
    rec = Reconciler(factory, {"skypilot": sky}, settings, clock=Clock())
    job_id = submit(factory, teams["ml"], resources=H100_8)
    rec.pass_once()
    refused = live_attempt(factory, job_id)
    assert refused.cloud == "k8s"
    sky.refuse(refused.id)  # SkyPilot could not schedule the pods (Kubernetes' own capacity)
    rec.pass_once()
    spilled = live_attempt(factory, job_id)
    assert spilled.cloud != "k8s", "the next place is a cloud's, in the same pass"
    assert len(sky.requests) == 2


def test_a_cluster_that_filled_during_a_launch_round_is_passed_over(factory, env, tmp_path):
    """The decision lists [cloud spot, cluster, cloud spot...]; the first
    cloud refuses at launch and meanwhile another broker filled the cluster:
    the round goes on to the next cloud place, never to a full cluster."""
    settings, teams = env
    # $10.40 per node-hour: just above the cheapest H100:8 spot place ($10.24), second in the round
    settings.kubernetes_places = places_file(tmp_path, {**LAB, "price_per_gpu_hour": 1.3})
    filler = submit(factory, teams["vision"], resources={"accelerators": "H100:8", "infra": "k8s"}, num_nodes=2)
    job_id = submit(factory, teams["ml"], resources=H100_8)
    with transaction(factory) as s:  # the filler is another broker's, later
        s.get(Job, filler).next_check_at = Clock().now().replace(year=2100)
    sky = Recorder()
    sky.refuse_at_launch = {"aws", "gcp", "azure"}

    def another_broker_fills_the_cluster(request: LaunchRequest) -> None:
        sky.on_launch = None
        with transaction(factory) as s:
            s.get(Job, filler).next_check_at = Clock().now()
        Reconciler(factory, {"skypilot": Recorder()}, settings, clock=Clock(), owner="other").pass_once()

    sky.on_launch = another_broker_fills_the_cluster
    rec = Reconciler(factory, {"skypilot": sky}, settings, clock=Clock())
    with factory() as s:
        planned = rec.placer.choose(s, s.get(Job, job_id), JobSpec.model_validate(s.get(Job, job_id).spec),
                                    Clock().now())
    assert [p.cloud for p in planned.placements][1] == "k8s"
    rec.pass_once()
    assert live_attempt(factory, filler).cloud == "k8s"
    tried = [r.placement.cloud for r in sky.requests if r.job_id == job_id]
    assert tried and "k8s" not in tried, tried


def test_a_cluster_skypilot_has_not_enabled_is_not_placed_on(factory, env, tmp_path):
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    settings, teams = env
    settings.kubernetes_places = places_file(tmp_path, LAB, {**LAB, "context": "lab-b"})

    class Sky:
        def check(self, infra_list, verbose):
            return "check"

        def enabled_clouds(self, expand=False):
            return "enabled"

        def get(self, request_id):
            return ["aws", "kubernetes/lab-b"] if request_id == "enabled" else {}

    launcher = SkyPilotLauncher(tmp_path, prefix="sbk8s", sky=Sky())
    try:
        launcher.refresh_clouds()
        placer = Placer(settings, {"skypilot": launcher})
        placer.new_pass()
        k8s_only = submit(factory, teams["ml"], resources={**H100_8, "infra": "k8s/lab-a"})
        anywhere = submit(factory, teams["ml"], resources=H100_8)
        with factory() as s:
            only = placer.choose(s, s.get(Job, k8s_only), JobSpec.model_validate(s.get(Job, k8s_only).spec),
                                 Clock().now())
            any_ = placer.choose(s, s.get(Job, anywhere), JobSpec.model_validate(s.get(Job, anywhere).spec),
                                 Clock().now())
    finally:
        launcher.close()
    assert only.action.name == "WAIT" and "lab-a is not enabled in SkyPilot (sky check)" in only.reason
    assert [(p.cloud, p.region) for p in any_.placements[:1]] == [("k8s", "lab-b")]
    assert {p.cloud for p in any_.placements} <= {"k8s", "aws"}


@pytest.mark.parametrize("text, says", [
    ("clusters: []", "clusters: List should have at least 1 item"),
    ("clusters: [{context: lab, nodes: []}]", "clusters.0.nodes: List should have at least 1 item"),
    ("clusters: [{context: lab, price_per_gpu_hour: -1, nodes: [{accelerator: H100, gpus_per_node: 8, count: 1}]}]",
     "clusters.0.price_per_gpu_hour: Input should be greater than or equal to 0"),
    ("clusters: [{context: lab, nodes: [{accelerator: H100, gpus_per_node: 0, count: 1}]}]",
     "clusters.0.nodes.0.gpus_per_node: Input should be greater than or equal to 1"),
    ("clusters: [{context: 'my lab', nodes: [{accelerator: H100, gpus_per_node: 8, count: 1}]}]",
     "clusters.0.context: String should match pattern"),
    ("clusters: [{context: lab, gpus: 8, nodes: [{accelerator: H100, gpus_per_node: 8, count: 1}]}]",
     "clusters.0.gpus: Extra inputs are not permitted"),
    ("clusters:\n- {context: lab, nodes: [{accelerator: H100, gpus_per_node: 8, count: 1}]}\n"
     "- {context: lab, nodes: [{accelerator: A100, gpus_per_node: 8, count: 1}]}",
     "clusters.1.context: 'lab' is listed twice"),
    ("clusters: [{context: lab", "not YAML or JSON"),
])
def test_a_config_that_cannot_be_used_is_refused_naming_the_file_and_field(tmp_path, text, says):
    path = tmp_path / "k8s.yaml"
    path.write_text(text)
    with pytest.raises(PlacesFileError) as caught:
        load(path)
    assert str(caught.value).startswith(f"SPOTBROKER_KUBERNETES_PLACES ({path}): ")
    assert says in str(caught.value)


def test_the_broker_does_not_start_on_a_missing_file(settings, tmp_path):
    settings.kubernetes_places = tmp_path / "nowhere.yaml"
    with pytest.raises(PlacesFileError, match="nowhere.yaml.*cannot read it"):
        Placer(settings)


def test_a_json_config_reads_the_same_and_names_are_the_offers(tmp_path):
    path = tmp_path / "k8s.json"
    path.write_text(json.dumps({"clusters": [{"context": "arn:aws:eks:us-east-1:1:cluster/gpu", "nodes": [
        {"accelerator": "nvidia-a100-80gb", "gpus_per_node": 8, "count": 3, "cpus": 96, "memory_gib": 1152}]}]}))
    cluster = load(path).clusters[0]
    assert cluster.price_per_gpu_hour == 0 and cluster.teams is None
    assert (cluster.nodes[0].accelerator, cluster.gpus("A100-80GB")) == ("A100-80GB", 24)
