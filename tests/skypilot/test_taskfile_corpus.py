"""The corpus (tests/data/taskfiles/): task files written in every shape
SkyPilot's documentation and public recipes use, each with its expected
outcome in its header:

    # expect: accepted            (and `# warns: FIELD...` for what is dropped)
    # expect: refused FIELD "WAY OUT"
    # flags: --env KEY=VALUE ...  (spotbroker submit's launch flags)
    # changes-with: ENGINEER (...) (the outcome another part of issue #23 changes)

Each file goes the way `spotbroker submit FILE` sends it (local directories
uploaded, flags applied) through what POST /v1/jobs runs on it (the task
file read with SkyPilot's schema, the spec validated, the broker's own
checks, the mounts checked against the team's prefix). An accepted file is
stored as SkyPilot reads it: the Task made from the stored spec equals,
field by field, SkyPilot's own Task of the file (less the alternatives the
broker drops). A refused one names the field and the way out."""
from __future__ import annotations

import copy
import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from spotbroker.broker.jobs import mounts
from spotbroker.broker.jobs.alternatives import elsewhere
from spotbroker.broker.jobs.overrides import LaunchFlags, apply
from spotbroker.broker.jobs.spec import JobSpec, SpecShapeError, load_raw
from spotbroker.broker.launch.skypilot.task import task_from_spec
from spotbroker.broker.settings import Settings
from spotbroker.broker.usecases import taskyaml

sky = pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")

CORPUS = Path(__file__).resolve().parents[1] / "data" / "taskfiles"
FILES = sorted(p.name for p in CORPUS.glob("*.yaml"))
UPLOAD = "c" * 64
HOME = CORPUS / "home"  # the user's ~ that the corpus's single-file mounts name (`~/.ssh/sky-key`)
TEAM = "ml"
_EXPECT_RE = re.compile(r'^# expect: (accepted|refused (\S+) "([^"]+)")\s*$', re.M)


def header(path: Path) -> dict:
    text = path.read_text()
    m = _EXPECT_RE.search(text)
    assert m, f"{path.name}: no '# expect:' line"
    flags = re.search(r"^# flags: (.*)$", text, re.M)
    warns = re.search(r"^# warns: (.*)$", text, re.M)
    return {"accepted": m[1] == "accepted", "field": m[2], "way_out": m[3],
            "flags": shlex.split(flags[1]) if flags else [], "warns": warns[1].split() if warns else []}


def launch_flags(args: list[str]) -> LaunchFlags:
    """`spotbroker submit`'s flags as its parser reads them (KEY=VALUE forms only here)."""
    flags, it = LaunchFlags(), iter(args)
    for arg in it:
        if arg in ("--env", "--secret"):
            key, _, value = next(it).partition("=")
            (flags.envs if arg == "--env" else flags.secrets).append((key, value))
        elif arg in ("--use-spot", "--no-use-spot"):
            flags.use_spot = arg == "--use-spot"
        elif arg == "--num-nodes":
            flags.num_nodes = int(next(it))
        else:
            setattr(flags, arg.removeprefix("--").replace("-", "_"), next(it))
    return flags


def as_the_cli_sends(doc: dict, base: Path) -> dict:
    """The CLI's rewrite: a local workdir and local directories to mount
    become uploads; anything else is sent as written."""
    doc = copy.deepcopy(doc)
    if isinstance(doc.get("workdir"), str):
        doc["workdir"] = {"upload": UPLOAD}
    for remote, source in (doc.get("file_mounts") or {}).items():
        if isinstance(source, str) and "://" not in source:
            local = base / source.replace("~", str(HOME), 1) if source.startswith("~") else base / source
            if local.is_dir():
                doc["file_mounts"][remote] = {"upload": UPLOAD}
            elif local.is_file():
                doc["file_mounts"][remote] = {"upload": UPLOAD, "file": True}
    return doc


def submitted(path: Path) -> tuple[JobSpec | None, list[dict], list[dict]]:
    """(the stored spec, the warnings, the errors) for the file, as the API judges it."""
    meta = header(path)
    try:
        raw = load_raw(path.read_bytes(), "yaml")
    except SpecShapeError as exc:
        return None, [], [{"field": exc.field, "message": exc.detail}]
    if meta["flags"]:
        raw = apply(raw, launch_flags(meta["flags"]))
    warnings: list[dict] = []
    try:
        doc = taskyaml.to_spec(as_the_cli_sends(raw, path.parent), warnings)
    except taskyaml.TaskFileError as exc:
        return None, [], exc.errors
    spec = JobSpec.model_validate(doc)
    spec = JobSpec.model_validate(json.loads(json.dumps(spec.stored())))
    if problem := spec.deadline_error(datetime.now(UTC), overhead_s=0):
        return None, [], [{"field": "deadline", "message": problem}]
    settings = Settings(checkpoint_root="s3://sb-ckpt", _env_file=None)
    stored_mounts = {k: v for k, v in spec.file_mounts.items() if not isinstance(v, dict) and
                     getattr(v, "upload", None) is None}
    errors = spec.per_attempt_errors() + mounts.mount_errors(
        settings, TEAM, spec.model_copy(update={"file_mounts": stored_mounts}), allow=[])
    return (None if errors else spec), warnings, errors


def skypilots_task(path: Path):
    """SkyPilot's own Task of the file (and the same flags, as `sky launch` applies them)."""
    meta = header(path)
    doc = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k not in taskyaml.OURS and k != "workdir"}
    flags = launch_flags(meta["flags"])
    res = doc.get("resources")
    if isinstance(res, dict):
        doc["resources"] = {k: v for k, v in res.items() if k not in ("max_price_per_hour", "max_hourly_cost")}
    task = sky.Task.from_yaml_config(doc, env_overrides=flags.envs or None, secrets_overrides=flags.secrets or None)
    override: dict = {}
    if flags.gpus:
        override["accelerators"] = flags.gpus
    if flags.use_spot is not None:
        override["use_spot"] = flags.use_spot
    if flags.infra:
        from sky.utils import infra_utils, registry

        info = infra_utils.InfraInfo.from_str(flags.infra)
        override.update(cloud=registry.CLOUD_REGISTRY.from_str(info.cloud), region=info.region, zone=info.zone)
    if override:
        task.set_resources_override(override)
    if flags.num_nodes:
        task.num_nodes = flags.num_nodes
    if flags.name:
        task.name = flags.name
    return task


def resources_of(task) -> list[str]:
    out = set()
    for r in task.resources:
        cloud = str(r.cloud).lower() if r.cloud else None
        if elsewhere(cloud):
            continue  # dropped by the broker, with a warning
        out.add(json.dumps({"cloud": cloud, "region": r.region, "zone": r.zone, "accelerators": r.accelerators,
                            "use_spot": r.use_spot, "instance_type": r.instance_type, "cpus": r.cpus,
                            "memory": r.memory, "disk_size": r.disk_size, "image_id": r.image_id,
                            "disk_tier": r.disk_tier, "network_tier": r.network_tier, "labels": r.labels,
                            "ports": sorted(r.ports or [])}, default=str, sort_keys=True))
    return sorted(out)


def test_the_corpus_has_at_least_30_files_of_each_kind():
    metas = [header(CORPUS / name) for name in FILES]
    assert len(FILES) >= 30
    assert sum(m["accepted"] for m in metas) >= 20 and sum(not m["accepted"] for m in metas) >= 8


def test_the_corpus_uses_every_field_skypilot_documents():
    """Every task and resources field of SkyPilot's schema that its YAML
    reference documents appears in some file (accepted or refused)."""
    from sky.utils import schemas

    used_top, used_res = set(), set()
    for name in FILES:
        try:
            doc = yaml.safe_load((CORPUS / name).read_text())
        except yaml.YAMLError:
            continue
        used_top |= set(doc)
        res = doc.get("resources") or {}
        for level in [res, *(res.get("any_of") or []), *(res.get("ordered") or [])]:
            used_res |= set(level)
    internal = {"_metadata", "file_mounts_mapping", "api_server_access", "event_callback", "inputs", "outputs",
                "pool", "managed_secrets", "volume_mounts"}
    documented_top = set(schemas.get_task_schema()["properties"]) - internal
    documented_res = {k for k in schemas.get_resources_schema()["properties"] if not k.startswith("_")} - {
        "local_disk", "ephemeral_storage", "priority", "priority_class", "volumes", "spot_recovery"}
    assert documented_top - used_top == set()
    assert documented_res - used_res == set()


@pytest.mark.parametrize("name", FILES)
def test_each_file_is_stored_as_skypilot_reads_it_or_refused_with_a_way_out(name):
    path = CORPUS / name
    meta = header(path)
    spec, warnings, errors = submitted(path)
    if not meta["accepted"]:
        assert spec is None, f"{name}: accepted, expected a refusal of {meta['field']}"
        matching = [e for e in errors if e["field"] == meta["field"]]
        assert matching, f"{name}: refused for {errors}, not {meta['field']}"
        assert meta["way_out"] in matching[0]["message"], matching[0]
        return
    assert spec is not None, f"{name}: refused: {errors}"
    assert [w["field"] for w in warnings] == meta["warns"]
    ours, theirs = task_from_spec(spec), skypilots_task(path)
    assert (ours.name or "job", ours.run, ours.setup, ours.num_nodes) == (
        theirs.name or "job", theirs.run, theirs.setup, theirs.num_nodes)
    assert ours.envs == theirs.envs
    assert {k: v.get_secret_value() for k, v in ours.secrets.items()} == {
        k: v.get_secret_value() for k, v in theirs.secrets.items()}
    assert resources_of(ours) == resources_of(theirs)
    named = {k for k, v in theirs.storage_mounts.items() if v.source is None}
    storage = {k: (v.source, v.mode) for k, v in theirs.storage_mounts.items() if k not in named}
    assert {k: (v.source, v.mode) for k, v in ours.storage_mounts.items()} == storage
    # A bucket by name keeps SkyPilot's name (its ${ENV} filled in); the launcher gives it the team's storage.
    assert {k: spec.file_mounts[k].name for k in named} == {k: theirs.storage_mounts[k].name for k in named}
    local = {k for k, v in (theirs.file_mounts or {}).items() if "://" not in v}
    assert (ours.file_mounts or {}) == {k: v for k, v in (theirs.file_mounts or {}).items() if k not in local}
    uploads = {k for k, v in spec.file_mounts.items() if getattr(v, "upload", None)}
    assert uploads == local  # a local directory reaches the node as the CLI's upload


def test_the_corpus_through_the_cli_and_the_api(api, team_headers, monkeypatch):
    """Every file the way `spotbroker submit` sends it (its code: local
    directories packed and uploaded for real, flags applied, the YAML
    re-written) to the API on a socket: the same outcome as above, the same
    warnings, and the stored spec the same. Files mounting the prefix the
    test above gives the team (s3://sb-ckpt/ml), or any s3:// bucket, are
    left out here: this server's storage is a file:// directory."""
    import click

    from spotbroker.broker.cli.client import ApiError, Client
    from spotbroker.broker.cli.jobs import Local, _upload_local

    monkeypatch.setenv("HOME", str(HOME))
    h = team_headers(TEAM)
    c = Client(str(api.base_url), h["Authorization"].removeprefix("Bearer "))
    checked = 0
    for name in FILES:
        path = CORPUS / name
        if "s3://" in path.read_text():  # this server's storage is file://: no s3:// mount can be given
            continue
        meta = header(path)
        try:
            raw = load_raw(path.read_bytes(), "yaml")
        except SpecShapeError as exc:  # the CLI refuses it before any request
            assert not meta["accepted"] and exc.field == meta["field"], name
            continue
        if meta["flags"]:
            raw = apply(raw, launch_flags(meta["flags"]))
        try:
            doc, _ = _upload_local(c, raw, Local(path.parent, path.parent), lambda field, path=path: str(path))
            job = c.submit_yaml(yaml.safe_dump(doc, sort_keys=False).encode())
        except click.ClickException as exc:  # a local path that is no directory: named by the CLI
            assert not meta["accepted"] and meta["field"] in exc.message, (name, exc.message)
            continue
        except ApiError as exc:
            assert not meta["accepted"], (name, exc.body)
            fields = {e["field"]: e["message"] for e in exc.body.get("errors") or []}
            assert meta["way_out"] in fields.get(meta["field"], ""), (name, fields)
            checked += 1
            continue
        assert meta["accepted"], (name, job)
        # This server's storage is file://: a bucket by name asked in another store is kept there, with a warning.
        warned = [w["field"] for w in job["warnings"] if not w["field"].endswith(".store")]
        assert warned == meta["warns"], name
        spec, _, _ = submitted(path)
        stored = {k: v for k, v in job["spec"].items() if k not in ("secrets", "file_mounts", "workdir")}
        expected = {k: v for k, v in spec.stored().items() if k not in ("secrets", "file_mounts", "workdir")}
        assert stored == expected, name
        assert job["spec"].get("secrets", []) == sorted(spec.secrets), name
        c.cancel(job["id"])
        checked += 1
    assert checked >= 30
