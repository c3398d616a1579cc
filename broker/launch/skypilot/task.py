"""A stored job spec as the SkyPilot Task its task file meant, before the
launcher pins it to the place the policy chose.

`task_from_spec` builds a SkyPilot task config from the spec and hands it to
SkyPilot's own parser (`sky.Task.from_yaml_config`), so the Task is what
SkyPilot itself would have made of the file: the round-trip tests compare the
two field by field. What SkyPilot cannot hold is left to the launcher:

* the job's code (`workdir: {upload: SHA256}`) and file mounts that are
  uploads (`upload_mounts`): archives in the team's storage prefix that the
  node fetches and places before `setup` (`node.py`, `agent/mounts.py`);
  SkyPilot's `workdir` would ship a directory of the broker's own host;
* a bucket by name (`{name: NAME}`), which SkyPilot would create: the node's
  Task mounts its home in the team's storage instead (`broker/jobs/mounts.py`);
* `resources.max_price_per_hour`, `estimated_hours`, `deadline`,
  `max_restarts`, `early_stop`: the broker's placement and recovery.

The Task carries the user's secrets in `secrets` (never `envs`). SkyPilot's
`Task.to_yaml_config()` prints them in clear: never log or store its output.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotbroker.agent.mounts import Mount
from spotbroker.broker.jobs import resfields
from spotbroker.broker.jobs.resources import Infra, ResourceSet
from spotbroker.broker.jobs.spec import JobSpec, StorageMount, WorkdirUpload
from spotbroker.broker.launch.base import LaunchError
from spotbroker.broker.launch.skypilot.node import NodeProgram
from spotbroker.broker.pricing import gcp_n1
from spotbroker.broker.pricing.normalise import asked_accelerator
from spotbroker.broker.pricing.offers import Placement

if TYPE_CHECKING:
    import sky

_PASSED = ("infra", "cpus", "memory", "disk_size", "instance_type", "image_id", *resfields.PASSED)


def resource_config(want: ResourceSet) -> dict[str, Any]:
    """One resource set in SkyPilot's YAML shape (spot or not, always said)."""
    out: dict[str, Any] = {"use_spot": want.use_spot}
    if want.accelerator is not None:
        name, count = want.accelerator
        out["accelerators"] = {name: int(count) if count.is_integer() else count}
    for key in _PASSED:
        value = getattr(want, key)
        if value is not None:
            out[key] = dict(value) if isinstance(value, dict) else value
    return out


def task_config(spec: JobSpec, mounts: tuple[Mount, ...] | None = None) -> dict[str, Any]:
    """The spec as a SkyPilot task config (what `from_yaml_config` takes).
    It holds the secrets' values: never log it. `mounts`: the job's file
    mounts as the broker resolved them for a launch; its cloud buckets are
    the Task's storage mounts (without: the file's own, buckets by name left out)."""
    config: dict[str, Any] = {"name": spec.name, "run": spec.run, "num_nodes": spec.num_nodes}
    if spec.setup is not None:
        config["setup"] = spec.setup
    if spec.envs:
        config["envs"] = dict(spec.envs)
    if spec.secrets:
        config["secrets"] = spec.secret_values()
    storage = _storage_mounts(spec, mounts)
    if storage:
        config["file_mounts"] = storage
    res = spec.resources
    alternatives = [resource_config(alt) for alt in res.alternatives()]
    if res.any_of is None and res.ordered is None:
        config["resources"] = alternatives[0]
    else:
        config["resources"] = {"ordered" if res.is_ordered else "any_of": alternatives}
    return config


def _storage_mounts(spec: JobSpec, mounts: tuple[Mount, ...] | None) -> dict[str, Any]:
    """What SkyPilot mounts itself: cloud buckets (a URI the file gave as a
    string is copied, object or prefix, as SkyPilot copies it)."""
    out: dict[str, Any] = {}
    if mounts is None:
        for remote, source in spec.file_mounts.items():
            if isinstance(source, str):
                out[remote] = source
            elif isinstance(source, StorageMount) and source.source is not None:
                out[remote] = {"source": source.source, "mode": source.mode}
        return out
    for mount in mounts:
        if mount.kind != "bucket" or mount.uri.startswith("file://"):
            continue  # the node program places uploads and file:// buckets
        given = spec.file_mounts.get(mount.path)
        out[mount.path] = mount.uri if isinstance(given, str) else {"source": mount.uri, "mode": mount.mode}
    return out


def task_from_spec(spec: JobSpec, mounts: tuple[Mount, ...] | None = None) -> sky.Task:
    """The Task the job's file meant, through SkyPilot's own parser."""
    import sky

    from spotbroker.broker.launch.skypilot import catalogs

    catalogs.ensure()
    return sky.Task.from_yaml_config(task_config(spec, mounts))


def upload_mounts(spec: JobSpec) -> dict[str, str]:
    """File mounts that are uploads: remote path -> the upload's sha256."""
    return {remote: source.upload for remote, source in spec.file_mounts.items()
            if isinstance(source, WorkdirUpload)}


def chosen_alternative(spec: JobSpec, placement: Placement) -> ResourceSet:
    """The resource set of `spec` that `placement` was chosen for: the first
    whose accelerator, instance type, infra and image regions it fits (what
    the placement was chosen from; cpus and memory were matched against the offer
    and are not repeated on a placement)."""
    for want in spec.resources.alternatives():
        if _fits(want, placement):
            return want
    raise LaunchError(f"the place {placement.place} ({placement.instance_type}) fits none of the job's resource "
                      "sets: it was chosen for another spec")


def _fits(want: ResourceSet, p: Placement) -> bool:
    if want.accelerator is None and want.instance_type is None and p.accelerator:
        return False  # a set for a CPU machine was not what a GPU offer was chosen for
    if want.accelerator is not None:
        name, count = want.accelerator
        if (p.accelerator or "").lower() != asked_accelerator(name).lower() \
                or float(p.accelerator_count) != float(count):
            return False
    if want.instance_type is not None and want.instance_type != gcp_n1.machine_type(p.instance_type or ""):
        return False
    if want.infra is not None:
        infra = Infra(want.infra)
        if (infra.cloud and infra.cloud != p.cloud) or (infra.region and infra.region != p.region) \
                or (infra.zone and infra.zone not in (p.zone, p.zone_id)):
            return False
    regions = want.image_regions
    return regions is None or p.region in regions


def kept_resources(want: ResourceSet, p: Placement) -> dict[str, Any]:
    """What the chosen resource set says beyond the place itself, kept on
    the pinned resources: the disk (its size and tier), the image (of the
    placement's region when one is given per region), cpus and memory, the
    network tier, labels and ports."""
    out: dict[str, Any] = {}
    for key in ("cpus", "memory", "disk_size", *resfields.PASSED):
        if getattr(want, key) is not None:
            out[key] = getattr(want, key)
    if isinstance(want.image_id, dict):
        out["image_id"] = {p.region: want.image_id[p.region]}
    elif want.image_id is not None:
        out["image_id"] = want.image_id
    return out


def node_task(spec: JobSpec | None, program: NodeProgram, resources: sky.Resources, num_nodes: int,
              name: str, mounts: tuple[Mount, ...] | None = None) -> sky.Task:
    """The node's Task: the job's file as SkyPilot reads it (`task_from_spec`:
    its name, envs, secrets and storage mounts), with the node program's
    setup, run, envs, secrets and file mounts, on `resources` (one place).
    Without a spec (a bare request), the node program alone under `name`."""
    import sky

    if spec is None:
        task = sky.Task(name=name, num_nodes=num_nodes)
    else:
        task = task_from_spec(spec, mounts)
    task.setup = program.setup
    task.run = program.run
    task.update_envs(program.envs)
    task.update_secrets(program.secrets)
    task.set_file_mounts({**(task.file_mounts or {}), **program.file_mounts})
    task.set_resources(resources)
    return task
