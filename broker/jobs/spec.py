"""The job spec: what `POST /v1/jobs` takes, in JSON or as a SkyPilot task YAML.

The resource shapes (broker/jobs/resources.py) are SkyPilot's (one set, or `any_of` / `ordered`
alternatives), so a SkyPilot task file maps onto a job one to one. Every
model forbids unknown fields, so a typo is a 422 naming the field rather
than a silently ignored option. Numbers are numbers (pydantic's strict int
and float, here and in the rules a spec holds): a boolean or a numeric
string, which lax validation took as 1 or 100, is a 422 naming the field;
an integer is a valid float.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    Field,
    SecretStr,
    StrictFloat,
    StrictInt,
    StringConstraints,
    field_validator,
)

from spotbroker.agent import protocol
from spotbroker.broker.jobs.checkpointspec import CheckpointSpec
from spotbroker.broker.jobs.mountspec import (  # noqa: F401  (importers of the mount models find them here too)
    BUCKET_NAME,
    FileMount,
    StorageMount,
    UploadMount,
    WorkdirUpload,
    storage_uri,
)
from spotbroker.broker.jobs.preflight import PreflightField
from spotbroker.broker.jobs.resources import Infra, Resources, StrictModel
from spotbroker.broker.jobs.specdoc import (  # noqa: F401  (the API and the CLI read documents through here)
    MAX_DEPTH,
    MAX_SPEC_BYTES,
    SpecShapeError,
    SpecSyntaxError,
    check_shape,
    load_document,
    load_raw,
)
from spotbroker.broker.jobs.stoprule import EarlyStopField

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

# Bounds on what a submission may ask for, past which it is a mistake (or an attack),
# never a job: each is refused with a 422 naming the field (the resources' own: resources.py).
MAX_NODES = 1024
MAX_CARBON_PRICE = 100_000.0   # dollars per tonne of CO2e (the dearest carbon markets ask ~$100)
MAX_DEADLINE_AHEAD = timedelta(days=365)

MAX_FILE_MOUNTS = 64  # each is a line of the node's SPOTBROKER_MOUNTS, which execve bounds


def _refuse_nested(remotes: list[str]) -> None:
    """A mount inside another's path would be placed through what the other
    placed (a bucket a job writes, links included): each takes its own path."""
    if len(remotes) > MAX_FILE_MOUNTS:
        raise ValueError(f"{len(remotes)} mounts: at most {MAX_FILE_MOUNTS} (mount a directory that holds them)")
    given = set(remotes)
    for remote in remotes:
        parts = remote.split("/")
        for outer in ("/".join(parts[:i]) for i in range(1, len(parts))):
            if outer in given:
                raise ValueError(f"{remote!r} lies inside {outer!r}: mount each at a path of its own")


def remote_path_error(remote: Any) -> str | None:
    """Why `remote` cannot be where a file mount is placed, if it cannot."""
    if isinstance(remote, str) and remote.strip() != remote:  # (the model strips str keys after this)
        return "give the path without surrounding whitespace"
    if not isinstance(remote, str) or not (remote.startswith("/") or remote.startswith("~/")):
        if isinstance(remote, str) and remote and not remote.startswith("~"):
            # SkyPilot places it under the task's workdir; a node here places mounts before the
            # attempt's fresh working directory exists, so there is no such place to put it.
            return (f"a remote path is absolute or starts with ~/ (SkyPilot would put a relative one under "
                    f"~/sky_workdir): mount it at ~/{remote} and `ln -s ~/{remote} {remote}` in run")
        return "a remote path is absolute or starts with ~/"
    # `~/.` would be the home itself, `~//tmp` the host's /tmp: a node places mounts as root.
    parts = (remote[2:] if remote.startswith("~/") else remote[1:]).split("/")
    if remote.rstrip("/") != remote or "$" in remote or any(p in ("", ".", "..") for p in parts):
        return "give the path itself, without a trailing '/', '.', '..', '//' or '$'"
    return None


def _check_env_name(key: Any) -> None:
    if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
        raise ValueError(f"{key!r} is not a valid environment variable name")


def env_values(value: dict, refuse: frozenset[str] = frozenset(), why: str = "") -> dict[str, str]:
    """`envs` as the process gets them: names checked (and none of `refuse`,
    saying `why`), values strings (a YAML number or boolean as written)."""
    out = {}
    for key, val in value.items():
        _check_env_name(key)
        if key in refuse:
            raise ValueError(f"{key} {why}")
        if val is None or isinstance(val, dict | list):
            raise ValueError(f"{key}: value must be a string or a number")
        out[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


class JobSpec(StrictModel):
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = "job"
    # Commands are kept as written (a file's `run: |` ends in a newline, and
    # the Task must equal what SkyPilot reads from the file).
    run: Annotated[str, StringConstraints(strip_whitespace=False, min_length=1)]
    setup: Annotated[str, StringConstraints(strip_whitespace=False)] | None = None
    envs: dict[str, str] = Field(default_factory=dict)
    # An upload. A path (SkyPilot's `workdir: .`) is the client's to pack and
    # upload; one left here would name the broker's host and is refused at submission.
    workdir: Annotated[WorkdirUpload | str | None, Field(description=(
        "The job's code: {\"upload\": SHA256} after PUT /v1/uploads/{sha256}. Each attempt runs in a fresh "
        "copy of it. A path is refused: `spotbroker submit FILE` uploads the directory it names"))] = None
    num_nodes: Annotated[StrictInt, Field(ge=1, le=MAX_NODES)] = 1
    max_restarts: Annotated[StrictInt, Field(ge=0, le=1000)] = 0
    # Productive hours the job needs (a guess is fine): what placement weighs
    # restarts and the deadline against. Required with a deadline.
    estimated_hours: Annotated[StrictFloat, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    deadline: AwareDatetime | None = None
    preflight: PreflightField = None
    early_stop: EarlyStopField = None  # stop when the reported metric stops improving (stoprule.py)
    checkpoint: CheckpointSpec | None = None  # None: interval auto (broker/jobs/checkpointspec.py)
    carbon_price_per_tonne: Annotated[StrictFloat, Field(ge=0, le=MAX_CARBON_PRICE, allow_inf_nan=False, description=(
        "dollars a tonne of CO2e is worth to the job (unset: 0): placement minimises dollars plus this price "
        "times the expected emissions (broker/placement/carbon.py)"))] | None = None
    resources: Resources = Field(default_factory=Resources)
    # Values go to the job's process as environment variables, like `envs`,
    # but are never shown by the API (`public()`) nor logged.
    secrets: dict[str, SecretStr] = Field(default_factory=dict)
    file_mounts: Annotated[dict[str, FileMount], Field(description=(
        "Remote path (absolute or ~/...) -> a bucket of your team's by name ({name: NAME, mode: MOUNT|COPY}), "
        "a storage URI under your team's prefix or one the admin lets it mount (GET /v1/teams/{team}/storage), "
        "plain or {source: URI, mode: MOUNT|COPY}, or {upload: SHA256} after PUT /v1/uploads/{sha256} "
        "(with file: true, one file placed at the path)"))] = Field(default_factory=dict)

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, value: Any) -> Any:
        return env_values(value) if isinstance(value, dict) else value

    @field_validator("run")
    @classmethod
    def _run(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("give a command to run")
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for key, val in value.items():
            _check_env_name(key)
            if val is None or isinstance(val, dict | list | bool):
                # never the value itself in the message: it is a secret
                raise ValueError(f"{key}: give the secret's value as a string")
        return {k: v if isinstance(v, SecretStr) else str(v) for k, v in value.items()}

    @field_validator("file_mounts", mode="before")
    @classmethod
    def _file_mounts(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for remote in value:
                error = remote_path_error(remote)
                if error:
                    raise ValueError(f"{remote!r}: {error}")
            _refuse_nested(list(value))
        return value

    @field_validator("file_mounts")
    @classmethod
    def _mount_sources(cls, value: dict[str, Any]) -> dict[str, Any]:
        for remote, source in value.items():
            if isinstance(source, str):
                try:
                    storage_uri(source)
                except ValueError as exc:
                    raise ValueError(f"{remote}: {exc}") from None
        return value

    def deadline_error(self, now: datetime, overhead_s: float) -> str | None:
        """Why a deadline cannot be kept, if it cannot: no estimate of the work
        to keep it against, or less time left than the work plus `overhead_s`
        (a restart and the broker's margin) even on on-demand from `now`.
        Checked at submission only: stored specs are never re-judged."""
        if self.deadline is None:
            return None
        if self.deadline > now + MAX_DEADLINE_AHEAD:
            return f"at most {MAX_DEADLINE_AHEAD.days} days from now"
        if self.estimated_hours is None:
            return "give estimated_hours too: how long the work takes is what a deadline is kept against"
        need = timedelta(hours=self.estimated_hours, seconds=overhead_s)
        if self.deadline < now + need:
            return (f"{self.deadline.isoformat()} is sooner than the work ({self.estimated_hours:g} h) plus a restart "
                    f"and the broker's margin ({overhead_s / 60:g} min) from now: no placement can keep it")
        return None

    def per_attempt_errors(self) -> list[dict[str, str]]:
        """`envs` and `secrets` that name a variable the broker sets for each
        attempt, as field errors (checked at submission; `without_per_attempt`
        is what a spec stored before gives the launch)."""
        return [{"field": field, "message": f"{name} is set by the broker for each attempt: a job may not set it"}
                for field, names in (("envs", self.envs), ("secrets", self.secrets))
                for name in sorted(names) if name in protocol.PER_ATTEMPT_ENV]

    def without_per_attempt(self) -> JobSpec:
        """The spec without `envs` or `secrets` named as the broker's own per-attempt variables."""
        if not self.per_attempt_errors():
            return self
        keep = lambda d: {k: v for k, v in d.items() if k not in protocol.PER_ATTEMPT_ENV}  # noqa: E731
        return self.model_copy(update={"envs": keep(self.envs), "secrets": keep(self.secrets)})

    @property
    def asks_for_host(self) -> bool:
        """Runs as the broker host's own job: every resource set says `infra: local`."""
        return all(alt.infra is not None and Infra(alt.infra).cloud == "local"
                   for alt in self.resources.alternatives())

    @property
    def wants_gpu(self) -> bool:
        """Placed on a cloud offer: it names accelerators or an instance type."""
        return any(alt.accelerators or alt.instance_type for alt in self.resources.alternatives())

    @property
    def labels(self) -> dict[str, str]:
        """What its costs are allocated by (`labels_of`, read from the model)."""
        res = self.resources
        alts = res.any_of if res.any_of is not None else res.ordered
        return _common([alt.labels or {} for alt in alts] if alts else [res.labels or {}])

    def secret_values(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.secrets.items()}

    def stored(self) -> dict[str, Any]:
        """What the database keeps: everything, secrets' values included
        (the launcher gives them to the job's process)."""
        out = self.model_dump(mode="json", exclude_none=True)
        if self.secrets:
            out["secrets"] = self.secret_values()
        elif "secrets" in out:
            del out["secrets"]
        if not out.get("file_mounts"):
            out.pop("file_mounts", None)
        return out


def labels_of(stored: dict[str, Any]) -> dict[str, str]:
    """A job's labels, what its costs are allocated by: `resources.labels`
    (SkyPilot's key, which it also gives the instances as tags); with
    alternatives, the labels every one of them carries (each carries the
    top level's). Read from a stored spec, so a job listing reads no table."""
    res = stored.get("resources") or {}
    alts = res.get("any_of") if res.get("any_of") is not None else res.get("ordered")
    return _common([alt.get("labels") or {} for alt in alts] if alts else [res.get("labels") or {}])


def _common(sets: list[dict[str, str]]) -> dict[str, str]:
    """The labels every set carries with the same value, sorted by name."""
    first, *rest = sets
    return {k: v for k, v in sorted(first.items()) if all(other.get(k) == v for other in rest)}


def public(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored spec as the API shows it: the secrets' names, never their values."""
    if "secrets" not in stored:
        return stored
    return {**stored, "secrets": sorted(stored["secrets"])}
