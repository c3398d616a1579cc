"""A stored job spec as the SkyPilot Task its task file meant, before the
launcher pins it to the place the policy chose.

`task_from_spec` builds a SkyPilot task config from the spec and hands it to
SkyPilot's own parser (`sky.Task.from_yaml_config`), so the Task is what
SkyPilot itself would have made of the file: the round-trip tests compare the
two field by field. What SkyPilot cannot hold is left to the launcher:

* the job's code (`workdir: {upload: SHA256}`) and file mounts that are
  uploads (`upload_mounts`): archives in the team's storage prefix that the
  node fetches and unpacks; SkyPilot's `workdir` would ship a directory of
  the broker's own host;
* `resources.max_price_per_hour`, `estimated_hours`, `deadline`,
  `max_restarts`: the broker's placement and recovery.

The Task carries the user's secrets in `secrets` (never `envs`). SkyPilot's
`Task.to_yaml_config()` prints them in clear: never log or store its output.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotbroker.broker.jobs.spec import JobSpec, ResourceSet, WorkdirUpload

if TYPE_CHECKING:
    import sky

_PASSED = ("infra", "cpus", "memory", "disk_size", "instance_type", "image_id")


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


def task_config(spec: JobSpec) -> dict[str, Any]:
    """The spec as a SkyPilot task config (what `from_yaml_config` takes).
    It holds the secrets' values: never log it."""
    config: dict[str, Any] = {"name": spec.name, "run": spec.run, "num_nodes": spec.num_nodes}
    if spec.setup is not None:
        config["setup"] = spec.setup
    if spec.envs:
        config["envs"] = dict(spec.envs)
    if spec.secrets:
        config["secrets"] = spec.secret_values()
    mounts: dict[str, Any] = {}
    for remote, source in spec.file_mounts.items():
        if isinstance(source, str):
            mounts[remote] = source
        elif not isinstance(source, WorkdirUpload):
            mounts[remote] = {"source": source.source, "mode": source.mode}
    if mounts:
        config["file_mounts"] = mounts
    res = spec.resources
    alternatives = [resource_config(alt) for alt in res.alternatives()]
    if res.any_of is None and res.ordered is None:
        config["resources"] = alternatives[0]
    else:
        config["resources"] = {"ordered" if res.is_ordered else "any_of": alternatives}
    return config


def task_from_spec(spec: JobSpec) -> sky.Task:
    """The Task the job's file meant, through SkyPilot's own parser."""
    import sky

    from spotbroker.broker.launch.skypilot import catalogs

    catalogs.ensure()
    return sky.Task.from_yaml_config(task_config(spec))


def upload_mounts(spec: JobSpec) -> dict[str, str]:
    """File mounts that are uploads: remote path -> the upload's sha256."""
    return {remote: source.upload for remote, source in spec.file_mounts.items()
            if isinstance(source, WorkdirUpload)}
