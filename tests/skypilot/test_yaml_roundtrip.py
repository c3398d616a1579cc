"""Real-world SkyPilot task files (examples/skypilot/, written from SkyPilot's
documentation) round-trip: the file -> the job spec the broker stores ->
`task_from_spec` -> a Task equal, field by field, to what SkyPilot itself
parses from the file. Real SkyPilot, offline: the catalogs it reads are the
broker's bundled rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot.task import task_from_spec, upload_mounts
from spotbroker.broker.usecases import taskyaml

sky = pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "skypilot"
GOOD = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "typo.yaml")
UPLOAD = "a" * 64


def resources_of(task) -> list[dict]:
    """A Task's resources, each as the fields the broker keeps, in a stable order."""
    out = []
    for r in task.resources:
        out.append({"cloud": str(r.cloud).lower() if r.cloud else None, "region": r.region, "zone": r.zone,
                    "accelerators": r.accelerators, "use_spot": r.use_spot, "instance_type": r.instance_type,
                    "cpus": r.cpus, "memory": r.memory, "disk_size": r.disk_size, "image_id": r.image_id})
    return out if isinstance(task.resources, list) else sorted(out, key=lambda d: json.dumps(d, default=str))


def skypilot_part(doc: dict) -> dict:
    """The file less the keys spotbroker adds (SkyPilot refuses them)."""
    doc = {k: v for k, v in doc.items() if k not in taskyaml.OURS}
    if isinstance(doc.get("resources"), dict):
        doc["resources"] = {k: v for k, v in doc["resources"].items() if k != "max_price_per_hour"}
    return doc


def stored_spec(path: Path) -> JobSpec:
    """As the API stores it: what the CLI sends (a local workdir or mount as
    an upload), parsed, validated, stored as JSON and read back."""
    doc = yaml.safe_load(path.read_text())
    if isinstance(doc.get("workdir"), str):
        doc["workdir"] = {"upload": UPLOAD}
    spec = JobSpec.model_validate(taskyaml.to_spec(doc))
    return JobSpec.model_validate(json.loads(json.dumps(spec.stored())))


@pytest.mark.parametrize("name", GOOD)
def test_a_task_file_round_trips_field_by_field(name):
    path = EXAMPLES / name
    theirs = sky.Task.from_yaml_config(skypilot_part(yaml.safe_load(path.read_text())))
    ours = task_from_spec(stored_spec(path))
    assert (ours.name, ours.run, ours.setup, ours.num_nodes) == (theirs.name, theirs.run, theirs.setup,
                                                                 theirs.num_nodes)
    assert ours.envs == theirs.envs
    assert {k: v.get_secret_value() for k, v in ours.secrets.items()} == \
        {k: v.get_secret_value() for k, v in theirs.secrets.items()}
    assert type(ours.resources) is type(theirs.resources)  # a set for any_of, a list for ordered
    assert resources_of(ours) == resources_of(theirs)
    assert (ours.file_mounts or {}) == (theirs.file_mounts or {})
    # A bucket by name is the broker's to place (its home in the team's storage, resolved at launch).
    assert {k: (v.source, v.mode) for k, v in ours.storage_mounts.items()} == \
        {k: (v.source, v.mode) for k, v in theirs.storage_mounts.items() if v.source is not None}
    # the code is the upload the CLI made of the file's workdir, never a path of the broker's
    assert ours.workdir is None and (theirs.workdir is None) == (stored_spec(path).workdir is None)


def test_the_stored_spec_keeps_what_the_broker_adds():
    spec = stored_spec(EXAMPLES / "ordered_gpus.yaml")
    assert (spec.estimated_hours, spec.max_restarts, spec.resources.max_price_per_hour) == (12, 5, 40)
    assert spec.resources.is_ordered
    assert [a.accelerators for a in spec.resources.alternatives()] == ["H100:8", "A100-80GB:8", "A100:8"]


def test_without_use_spot_a_file_asks_for_on_demand_and_json_for_spot():
    spec = JobSpec.model_validate(taskyaml.to_spec({"run": "x", "resources": {"accelerators": {"A10G": 1, "L4": 1}}}))
    assert [a.use_spot for a in spec.resources.alternatives()] == [False, False]
    stored = JobSpec.model_validate(json.loads(json.dumps(spec.stored())))
    assert [a.use_spot for a in stored.resources.alternatives()] == [False, False]
    assert JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A10G:1"}}).resources.use_spot


def test_a_list_of_accelerators_is_ordered_as_in_skypilot():
    doc = {"run": "x", "resources": {"accelerators": ["H100:8", "A100:8"], "use_spot": True}}
    theirs = sky.Task.from_yaml_config(dict(doc))
    ours = task_from_spec(JobSpec.model_validate(taskyaml.to_spec(doc)))
    assert isinstance(ours.resources, list) and resources_of(ours) == resources_of(theirs)


def test_uploads_stay_with_the_broker():
    doc = {"run": "x", "file_mounts": {"/data": {"upload": UPLOAD}}}
    spec = JobSpec.model_validate(taskyaml.to_spec(doc))
    assert upload_mounts(spec) == {"/data": UPLOAD}
    assert not task_from_spec(spec).file_mounts


def test_cloud_region_zone_become_infra():
    doc = {"run": "x", "resources": {"cloud": "gcp", "zone": "us-central1-a", "accelerators": "A100:8",
                                     "memory": "64GB+"}}
    spec = JobSpec.model_validate(taskyaml.to_spec(doc))
    assert spec.resources.infra == "gcp/*/us-central1-a" and spec.resources.memory == "64.0+"
    assert resources_of(task_from_spec(spec)) == resources_of(sky.Task.from_yaml_config(doc))


@pytest.fixture
def catalog_session(tmp_path):
    from spotbroker.broker.pricing.offers import seed_from_catalog
    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate.upgrade(engine)
    with make_session_factory(engine)() as session:
        seed_from_catalog(session)
        session.commit()
        yield session
    engine.dispose()


def test_placement_honours_the_files_constraints(catalog_session):
    from spotbroker.broker.pricing.offers import rank_offers

    def places(doc):
        return rank_offers(catalog_session, JobSpec.model_validate(taskyaml.to_spec(doc)), limit=1000)

    typed = places({"run": "x", "resources": {"instance_type": "g5.xlarge", "use_spot": True}})
    assert typed and {p.instance_type for p in typed} == {"g5.xlarge"}
    imaged = places({"run": "x", "resources": {"infra": "aws", "accelerators": "A10G:1", "use_spot": True,
                                               "image_id": {"us-west-2": "ami-1", "eu-west-1": "ami-2"}}})
    assert imaged and {p.region for p in imaged} == {"us-west-2", "eu-west-1"}
    ordered = places({"run": "x", "resources": {"accelerators": ["H100:8", "A10G:1"], "use_spot": True}})
    assert ordered and {p.accelerator for p in ordered} == {"H100"}  # the first that has offers wins
    on_demand = places({"run": "x", "resources": {"accelerators": "A10G:1", "cpus": "16+"}})
    assert on_demand and not any(p.use_spot for p in on_demand)
