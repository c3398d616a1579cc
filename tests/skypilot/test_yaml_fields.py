"""Resource fields SkyPilot honours on the pinned place (disk_tier,
network_tier, labels, ports) reach the Task the SkyPilot launcher builds;
SkyPilot's max_hourly_cost is the broker's price bound; what the broker
cannot honour is refused saying what to do instead; alternatives on clouds
the broker does not place on are dropped with a warning in the answer.
Real SkyPilot, offline (the broker's bundled catalog rows)."""
from __future__ import annotations

import json

import pytest
import yaml

from spotbroker.broker.jobs import unhonoured
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot.task import chosen_alternative, kept_resources, task_from_spec
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.usecases import taskyaml

sky = pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")
YAML = {"Content-Type": "application/yaml"}

TIERED = """
name: tiered
resources:
  use_spot: true
  infra: aws/us-east-1
  accelerators: A10G:1
  disk_size: 256
  disk_tier: high
  network_tier: best
  labels: {team: ml, project: llama}
  ports: [8888, "6006-6010"]
run: python train.py
"""


def stored(text: str) -> JobSpec:
    spec = JobSpec.model_validate(taskyaml.to_spec(yaml.safe_load(text)))
    return JobSpec.model_validate(json.loads(json.dumps(spec.stored())))


def test_the_fields_are_stored_and_the_task_is_skypilots_own():
    spec = stored(TIERED)
    res = spec.resources
    assert (res.disk_tier, res.network_tier, res.labels, res.ports) == (
        "high", "best", {"team": "ml", "project": "llama"}, ["8888", "6006-6010"])
    (ours,) = task_from_spec(spec).resources
    (theirs,) = sky.Task.from_yaml_config(yaml.safe_load(TIERED)).resources
    for field in ("disk_tier", "network_tier", "labels", "ports", "disk_size"):
        assert getattr(ours, field) == getattr(theirs, field), field


def test_the_launchers_pinned_resources_keep_them():
    from spotbroker.broker.launch.skypilot.launcher import pinned_resources

    spec = stored(TIERED)
    where = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id=None, instance_type="g5.xlarge",
                      accelerator="A10G", accelerator_count=1, use_spot=True, price_per_hour=0.4)
    r = pinned_resources(sky, where, **kept_resources(chosen_alternative(spec, where), where))
    assert (str(r.disk_tier), str(r.network_tier)) == (str(sky.resources.resources_utils.DiskTier.HIGH),
                                                       str(sky.resources.resources_utils.NetworkTier.BEST))
    assert (r.labels, sorted(r.ports), r.disk_size, r.instance_type) == (
        {"team": "ml", "project": "llama"}, ["6006-6010", "8888"], 256, "g5.xlarge")


def test_thousands_of_errors_are_told_as_the_first_twenty_and_a_count():
    text = "run: x\nsecrets:\n" + "".join(f"  - S{i}\n" for i in range(3000))
    with pytest.raises(taskyaml.TaskFileError) as caught:
        taskyaml.parse(text.encode())
    errors = caught.value.errors
    assert len(errors) == taskyaml.MAX_ERRORS + 1 and errors[-1] == {"field": "body", "message": "and 2980 more errors"}
    assert all(e["line"] == 2 for e in errors[:-1]), errors[:3]


@pytest.mark.parametrize("text, field, says", [
    ("run: x\nresources:\n  labels:\n" + "".join(f"    l{i}: v\n" for i in range(65)), "resources.labels",
     "at most 64 labels"),
    ("run: x\nresources:\n  ordered:\n    - labels: {" + ", ".join(f"l{i}: v" for i in range(65)) + "}\n",
     "resources.ordered.0.labels", "at most 64 labels"),
    ("run: x\nfile_mounts:\n" + "".join(f"  /m{i}: s3://b/{i}\n" for i in range(65)), "file_mounts", "at most 64"),
    ("run: x\nenvs:\n" + "".join(f"  E{i}: x\n" for i in range(30000)), "envs", "at most 65536 bytes"),
])
def test_counts_over_the_specs_bounds_are_refused_before_skypilot_reads_the_file(text, field, says, monkeypatch):
    monkeypatch.setattr(taskyaml, "_skypilot", lambda *a: pytest.fail("SkyPilot read the file"))
    with pytest.raises(taskyaml.TaskFileError) as caught:
        taskyaml.parse(text.encode())
    (err,) = caught.value.errors
    assert err["field"] == field and says in err["message"] and err["line"] > 1, err


def test_max_hourly_cost_is_the_brokers_price_bound():
    spec = stored("run: x\nresources:\n  use_spot: true\n  any_of:\n    - {accelerators: A10G:1, max_hourly_cost: 2}\n"
                  "    - {accelerators: L4:1}\n")
    assert [a.max_price_per_hour for a in spec.resources.alternatives()] == [2, None]
    with pytest.raises(taskyaml.TaskFileError, match="not both"):
        taskyaml.to_spec({"run": "x", "resources": {"max_hourly_cost": 2, "max_price_per_hour": 3}})


@pytest.mark.parametrize("resources, field, message", [
    ({"ports": 70000}, "resources.ports", "65535"),
    ({"ports": "9000-8000"}, "resources.ports", "9000-8000"),
    ({"disk_tier": "fastest"}, "resources.disk_tier", "fastest"),
    ({"labels": {"team": {"a": 1}}}, "resources.labels", "labels"),
    ({"accelerators": "T4:x"}, "resources.accelerators", "'x' is not a number"),
    ({"any_of": [{"accelerators": "L4:1"}, {"accelerators": "T4:x"}]}, "resources.any_of.1.accelerators", "T4:x"),
    # SkyPilot's own words, which named no field ("body")
    ({"any_of": [{"accelerators": "T4"}, {"accelerators": "A100:0"}]}, "resources.any_of.1.accelerators",
     "more than 0"),
    ({"accelerators": "A100:1:2"}, "resources.accelerators", "NAME[:COUNT]"),
    ({"disk_size": -5}, "resources.disk_size", "positive"),
])
def test_a_bad_value_is_refused_naming_the_field(resources, field, message):
    from pydantic import ValidationError

    try:
        JobSpec.model_validate(taskyaml.to_spec({"run": "x", "resources": resources}))
    except taskyaml.TaskFileError as exc:
        assert exc.errors[0]["field"].startswith(field) and message in exc.errors[0]["message"], exc.errors
    except ValidationError as exc:
        assert field.split(".")[-1] in str(exc) and message in str(exc), str(exc)
    else:
        pytest.fail("accepted")


@pytest.mark.parametrize("doc, field, way_out", [
    ({"run": "x", "resources": {"job_recovery": "FAILOVER"}}, "resources.job_recovery", "max_restarts"),
    ({"run": "x", "resources": {"autostop": 10}}, "resources.autostop", "drop autostop"),
    ({"run": "x", "resources": {"accelerators": "tpu-v4-8", "accelerator_args": {"tpu_vm": True}}},
     "resources.accelerator_args", "GPU"),
    ({"run": "x", "resources": {"local_disk": "nvme:1000+"}}, "resources.local_disk", "instance_type"),
    ({"run": "x", "config": {"aws": {"use_internal_ips": True}}}, "config", "operator"),
    ({"run": "x", "volumes": {"/data": "vol"}}, "volumes", "file_mounts"),
])
def test_a_refusal_says_what_to_do_instead(doc, field, way_out):
    with pytest.raises(taskyaml.TaskFileError) as caught:
        taskyaml.to_spec(doc)
    err = next(e for e in caught.value.errors if e["field"] == field)
    assert "cannot honour it: " in err["message"] and way_out in err["message"], err


def test_every_field_skypilot_knows_is_honoured_or_refused_with_a_way_out():
    """No field falls through: SkyPilot's own schema lists them."""
    from sky.utils import schemas

    for key in schemas.get_task_schema()["properties"]:
        assert key in unhonoured.HONOURED or ": " in unhonoured.why(key, False)
    for key in schemas.get_resources_schema()["properties"]:
        if key not in unhonoured.HONOURED_RESOURCES and key not in ("max_hourly_cost",):
            assert unhonoured.why(key, True).split(": ", 1)[1], key


ELSEWHERE = b"""name: multi-cloud
resources:
  use_spot: true
  any_of:
    - {infra: lambda, accelerators: H100:1}
    - {infra: aws, accelerators: H100:1}
    - {cloud: runpod, accelerators: H100:1}
    - {infra: gcp/us-central1, accelerators: H100:1}
run: python train.py
"""


def test_alternatives_elsewhere_are_dropped_with_a_warning_in_the_answer(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", content=ELSEWHERE, headers={**h, **YAML})
    assert r.status_code == 201, r.text
    body = r.json()
    assert [(w["field"], w["line"]) for w in body["warnings"]] == [("resources.any_of.0", 5),
                                                                  ("resources.any_of.2", 7)]
    assert "lambda" in body["warnings"][0]["message"] and "runpod" in body["warnings"][1]["message"]
    assert [a["infra"] for a in body["spec"]["resources"]["any_of"]] == ["aws", "gcp/us-central1"]
    assert "warnings" not in api.get(f"/v1/jobs/{body['id']}", headers=h).json()
    api.post(f"/v1/jobs/{body['id']}/cancel", headers=h)
    plain = api.post("/v1/jobs", content=b"run: x\nresources: {use_spot: true}\n", headers={**h, **YAML})
    assert plain.status_code == 201 and plain.json()["warnings"] == []
    api.post(f"/v1/jobs/{plain.json()['id']}/cancel", headers=h)


@pytest.mark.parametrize("body, field", [
    (b"run: x\nresources:\n  any_of:\n    - {infra: lambda, accelerators: H100:1}\n"
     b"    - {infra: fluidstack, accelerators: H100:1}\n", "resources.any_of"),
    (b"run: x\nresources:\n  infra: paperspace\n  accelerators: A100:1\n", "resources.infra"),
])
def test_with_no_alternative_left_it_is_refused(api, team_headers, body, field):
    h = team_headers()
    r = api.post("/v1/jobs", content=body, headers={**h, **YAML})
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == field and "aws, gcp, azure, k8s" in err["message"] and err["line"]
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []


@pytest.mark.parametrize("resources, message", [
    ({"ports": [22, 70000]}, "1-65535"),
    ({"ports": "9000-8000"}, "low-high"),
    ({"network_tier": "fast"}, "standard"),
    ({"labels": {"bad key!": "x"}}, "label's name"),
])
def test_a_json_spec_is_held_to_the_same_shapes(resources, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate({"run": "x", "resources": resources})
    ok = JobSpec.model_validate({"run": "x", "resources": {"ports": 8080, "labels": {"on": True}}})
    assert (ok.resources.ports, ok.resources.labels) == (["8080"], {"on": "true"})


@pytest.mark.parametrize("text, field, says", [
    ("run: x\nresources:\n  infra: azure\n  accelerators: A100:1\n  network_tier: best\n", "resources",
     "azure places cannot honour network_tier"),
    ("run: x\nresources:\n  infra: k8s/lab-a\n  accelerators: H100:1\n  disk_tier: high\n", "resources",
     "k8s places cannot honour disk_tier"),
    ("run: x\nresources:\n  network_tier: best\n  any_of:\n    - {infra: aws, accelerators: A100:1}\n"
     "    - {infra: azure, accelerators: A100:1}\n", "resources", "any_of.1: azure"),
])
def test_a_tier_the_named_place_cannot_give_is_refused_with_a_way_out(api, team_headers, text, field, says):
    r = api.post("/v1/jobs", content=text.encode(), headers={**team_headers(), **YAML})
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == field and says in err["message"] and "name aws or gcp" in err["message"], err


def test_placement_leaves_out_the_places_that_cannot_give_the_tier(tmp_path):
    """The tiers are not priced, but a place whose cloud cannot give them is
    never chosen: SkyPilot would refuse the launch there."""
    from spotbroker.broker.placement.kubernetes import Cluster, fits
    from spotbroker.broker.pricing.offers import rank_offers, seed_from_catalog
    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate.upgrade(engine)
    try:
        with make_session_factory(engine)() as session:
            seed_from_catalog(session)
            session.commit()

            def clouds(resources):
                spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "T4:1", **resources}})
                return {p.cloud for p in rank_offers(session, spec, limit=10_000)}

            assert "azure" in clouds({}) and "azure" in clouds({"disk_tier": "high"})
            assert clouds({"network_tier": "best"}) and "azure" not in clouds({"network_tier": "best"})
    finally:
        engine.dispose()
    lab = Cluster(context="lab-a", nodes=[{"accelerator": "H100", "gpus_per_node": 8, "count": 1}])
    want = lambda **kw: JobSpec.model_validate(  # noqa: E731
        {"run": "x", "resources": {"accelerators": "H100:1", **kw}}).resources.alternatives()[0]
    assert fits(want(), lab) and fits(want(disk_tier="best"), lab)
    assert fits(want(disk_tier="high"), lab) is None and fits(want(network_tier="best"), lab) is None


def test_a_gpu_on_an_n1_machine_is_launched_as_the_machine_type_with_the_gpus():
    """The offer `n1-highmem-8+T4:1` is the N1 type with a T4: SkyPilot gets both, apart."""
    from spotbroker.broker.launch.skypilot.launcher import pinned_resources

    spec = stored("resources: {infra: gcp/us-central1, accelerators: T4:1, instance_type: n1-highmem-8}\nrun: x\n")
    where = Placement(cloud="gcp", region="us-central1", zone="us-central1-a", zone_id=None,
                      instance_type="n1-highmem-8+T4:1", accelerator="T4", accelerator_count=1, use_spot=True,
                      price_per_hour=0.3)
    r = pinned_resources(sky, where, **kept_resources(chosen_alternative(spec, where), where))
    assert (r.instance_type, r.accelerators, r.zone, r.use_spot) == ("n1-highmem-8", {"T4": 1}, "us-central1-a", True)
