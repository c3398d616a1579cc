"""`spotbroker submit`'s launch flags applied to a job document, as `sky
launch` applies its own to a task file: `--name`, `--num-nodes`; `--gpus`,
`--infra` and `--use-spot/--no-use-spot` on every resource set (each
alternative of `any_of`/`ordered` included); `--env` over `--env-file` over
the file's `envs`, `--secret` over the file's `secrets`.

One difference from SkyPilot, for the secrets' sake: SkyPilot puts each
`--env-file` value in both `envs` and `secrets`; here a name the file (or
`--secret`) declares a secret is filled in as a secret only, and the others
go to `envs`, so that no secret's value is shown with the job's envs."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

_ALTERNATIVES = ("any_of", "ordered")
_PLACE_KEYS = ("infra", "cloud", "region", "zone")


@dataclass
class LaunchFlags:
    name: str | None = None
    num_nodes: int | None = None
    gpus: str | None = None
    infra: str | None = None
    use_spot: bool | None = None
    envs: list[tuple[str, str]] = field(default_factory=list)
    secrets: list[tuple[str, str]] = field(default_factory=list)
    env_file: dict[str, str] = field(default_factory=dict)

    def any(self) -> bool:
        return any(v not in (None, [], {}) for v in vars(self).values())


def apply(doc: dict[str, Any], flags: LaunchFlags) -> dict[str, Any]:
    """`doc` (a task file or a JSON spec, as loaded) with the flags applied."""
    doc = copy.deepcopy(doc)
    if flags.name is not None:
        doc["name"] = flags.name
    if flags.num_nodes is not None:
        doc["num_nodes"] = flags.num_nodes
    _variables(doc, flags)
    if flags.gpus is not None or flags.infra is not None or flags.use_spot is not None:
        res = doc.get("resources")
        doc["resources"] = _resources(dict(res) if isinstance(res, dict) else {}, flags)
    return doc


_VARIABLE = re.compile(r"\$\{?\b([a-zA-Z_][a-zA-Z0-9_]*)\b\}?")  # ${NAME} or $NAME, as SkyPilot reads them


def fill_in_variables(doc: dict[str, Any]) -> dict[str, Any]:
    """`workdir` and `file_mounts` (paths, bucket names, sources) with the
    file's `envs` filled in, as SkyPilot does when it reads a task (a name
    it does not define stays as written). Unlike SkyPilot, not its secrets:
    a path or a bucket name is stored and shown, a secret's value never is."""
    envs = doc.get("envs")
    values = {str(k): str(v) for k, v in envs.items() if v is not None} if isinstance(envs, dict) else {}
    if not values:
        return doc

    def fill(node: Any) -> Any:
        if isinstance(node, str):
            return _VARIABLE.sub(lambda m: values.get(m[1], m[0]), node)
        if isinstance(node, dict):
            return {fill(k): fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        return node

    return {**doc, **{key: fill(doc[key]) for key in ("workdir", "file_mounts") if doc.get(key) is not None}}


def flag_of(field: str, flags: LaunchFlags) -> str | None:
    """The flag that set a field of the applied document, as the user typed
    it (an error about that field is the flag's, not a line of the file)."""
    parts = field.split(".")
    last = parts[-1]
    in_resources = parts[0] == "resources" and len(parts) > 1 and (len(parts) == 2 or parts[1] in _ALTERNATIVES)
    if field == "name" and flags.name is not None:
        return f"--name {flags.name}"
    if field == "num_nodes" and flags.num_nodes is not None:
        return f"--num-nodes {flags.num_nodes}"
    if in_resources and last == "accelerators" and flags.gpus is not None:
        return f"--gpus {flags.gpus}"
    if in_resources and last in _PLACE_KEYS and flags.infra is not None:
        return f"--infra {flags.infra}"
    if in_resources and last == "use_spot" and flags.use_spot is not None:
        return "--use-spot" if flags.use_spot else "--no-use-spot"
    if len(parts) == 2 and parts[0] in ("envs", "secrets"):
        given = flags.envs if parts[0] == "envs" else flags.secrets
        if any(k == last for k, _ in given):
            return f"--{parts[0][:-1]} {last}"
        if last in flags.env_file:
            return "--env-file"
    return None


def _variables(doc: dict[str, Any], flags: LaunchFlags) -> None:
    secrets = doc.get("secrets")
    if isinstance(secrets, list):  # SkyPilot's `secrets: [NAME]`: values given at launch
        secrets = {str(k): None for k in secrets}
    secrets = dict(secrets) if isinstance(secrets, dict) else {}
    envs = dict(doc["envs"]) if isinstance(doc.get("envs"), dict) else {}
    secret_names = set(secrets) | {k for k, _ in flags.secrets}
    for key, value in flags.env_file.items():
        (secrets if key in secret_names else envs)[key] = value
    envs.update(flags.envs)
    secrets.update(flags.secrets)
    if envs or "envs" in doc:
        doc["envs"] = envs
    if secrets or "secrets" in doc:
        doc["secrets"] = secrets


def _resources(res: dict[str, Any], flags: LaunchFlags) -> dict[str, Any]:
    """Each resource set overridden alike (SkyPilot's `Resources.copy(**overrides)`
    on every one); a top-level field an alternative would inherit is set once."""
    alternatives = next((k for k in _ALTERNATIVES if isinstance(res.get(k), list)), None)
    levels = [res]
    if alternatives is not None:
        res[alternatives] = [dict(a) if isinstance(a, dict) else a for a in res[alternatives]]
        levels += [a for a in res[alternatives] if isinstance(a, dict)]
    for level in levels:
        if flags.gpus is not None:
            level.pop("accelerators", None)
        if flags.infra is not None:
            for key in _PLACE_KEYS:
                level.pop(key, None)
        if flags.use_spot is not None:
            level.pop("use_spot", None)
    if flags.gpus is not None and flags.gpus.lower() != "none":
        for level in levels[1:] or levels:
            level["accelerators"] = flags.gpus
    if flags.infra is not None and flags.infra.lower() != "none":
        res["infra"] = flags.infra
    if flags.use_spot is not None:
        res["use_spot"] = flags.use_spot
    return res
