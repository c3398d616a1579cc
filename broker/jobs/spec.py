"""The job spec: what `POST /v1/jobs` takes, in JSON or as a SkyPilot task YAML.

The resource shapes are SkyPilot's (one set, or `any_of` / `ordered`
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
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictFloat,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from spotbroker.agent import protocol
from spotbroker.broker.jobs import resfields
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

CLOUDS = ("aws", "gcp", "azure", "local")
KUBERNETES = ("k8s", "kubernetes")  # the operator's clusters (broker/placement/kubernetes.py), as SkyPilot spells them
_ACCEL_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9._-]*)(?::(?P<count>[^:]+))?\Z")
_AMOUNT_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<plus>\+)?\Z")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

# Bounds on what a submission may ask for: past them it is a mistake (or an
# attack), never a job; each is refused with a 422 naming the field.
MAX_ACCELERATORS = 1024        # per node
MAX_NODES = 1024
MAX_PRICE_PER_HOUR = 1000.0    # dollars, per node
MAX_CARBON_PRICE = 100_000.0   # dollars per tonne of CO2e (the dearest carbon markets ask ~$100)
MAX_AMOUNT = 1_000_000         # cpus, memory (GB)
MAX_DISK_GB = 65_536
MAX_DEADLINE_AHEAD = timedelta(days=365)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def parse_accelerator(value: str) -> tuple[str, float]:
    """"A100:2" -> ("A100", 2.0); "A100" -> ("A100", 1.0)."""
    match = _ACCEL_RE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not NAME[:COUNT] (for example 'A100:1')")
    count_text = match["count"]
    if count_text is None:
        return match["name"], 1.0
    try:
        count = float(count_text)
    except ValueError:
        raise ValueError(f"{value!r}: the count {count_text!r} is not a number") from None
    if not 0 < count <= MAX_ACCELERATORS:
        raise ValueError(f"{value!r}: the count must be more than 0 and at most {MAX_ACCELERATORS} per node")
    return match["name"], count


def one_accelerator(value: Any, many: str) -> Any:
    """`NAME[:COUNT]` or SkyPilot's `{NAME: COUNT}` as `NAME:COUNT`; `many`: what
    to say of a mapping with more than one entry. Anything else is left for
    the field's type to refuse."""
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(many)
        (name, count), = value.items()
        value = f"{name}:{count}"
    if isinstance(value, str):
        name, count = parse_accelerator(value)
        return f"{name}:{count:g}"
    return value


def parse_amount(value: str) -> tuple[float, bool]:
    """"8" -> (8, exact); "8+" -> (8, at least)."""
    match = _AMOUNT_RE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not N or N+ (for example '8' or '32+')")
    amount = float(match["n"])
    if not amount <= MAX_AMOUNT:
        raise ValueError(f"{value!r}: at most {MAX_AMOUNT:,}")
    return amount, bool(match["plus"])


_PLACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")  # us-east-1a, us-central1-a, eastus


class Infra:
    """"aws", "gcp/us-central1", "aws/us-east-1/us-east-1a" ("*" = any);
    "k8s" (or "kubernetes"): the broker's Kubernetes places, "k8s/CONTEXT"
    one of them (as in SkyPilot, the whole rest is the context, which may
    hold slashes)."""

    def __init__(self, text: str) -> None:
        parts = [p.strip() for p in text.strip().split("/")]
        if any(not p for p in parts):
            raise ValueError(f"{text!r} is not CLOUD[/REGION[/ZONE]]")
        cloud = parts[0].lower()
        if cloud in KUBERNETES:
            cloud, parts = KUBERNETES[0], [cloud, "/".join(parts[1:])] if len(parts) > 1 else [cloud]
        if len(parts) > 3:
            raise ValueError(f"{text!r} is not CLOUD[/REGION[/ZONE]]")
        if cloud not in (*CLOUDS, KUBERNETES[0], "*"):
            raise ValueError(f"{text!r}: unknown cloud {parts[0]!r} (one of {', '.join(CLOUDS)}, k8s)")
        self.cloud = None if cloud == "*" else cloud
        self.region = parts[1] if len(parts) > 1 and parts[1] != "*" else None
        self.zone = parts[2] if len(parts) > 2 and parts[2] != "*" else None
        if self.cloud != KUBERNETES[0]:  # a kube context is the operator's name; a cloud's places are not
            for what, name in (("region", self.region), ("zone", self.zone)):
                if name is not None and not _PLACE_NAME.fullmatch(name):
                    raise ValueError(f"{text!r}: {name!r} is not a {what} name (letters, digits and '-')")


class ResourceSet(_Strict):
    accelerators: str | None = None
    infra: str | None = None
    cpus: str | None = None
    memory: str | None = None
    # A JSON spec asks for spot unless it says otherwise; a SkyPilot task
    # file asks for on-demand (SkyPilot's meaning): its parser sets this.
    use_spot: bool = True
    max_price_per_hour: Annotated[StrictFloat, Field(gt=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)] | None = None
    disk_size: Annotated[StrictInt, Field(ge=1, le=MAX_DISK_GB, description="the OS disk, in GB")] | None = None
    instance_type: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] \
        | None = None
    # One image, or one per region (`{us-east-1: ami-..., us-west-2: ami-...}`):
    # the regions named are then the only ones the job may run in.
    image_id: Annotated[str, Field(min_length=1, max_length=512)] \
        | Annotated[dict[str, Annotated[str, Field(min_length=1, max_length=512)]], Field(min_length=1)] | None = None
    # Honoured by SkyPilot on the pinned place (broker/jobs/resfields.py).
    disk_tier: resfields.DiskTier | None = None
    network_tier: resfields.NetworkTier | None = None
    labels: resfields.Labels | None = None
    ports: resfields.Ports | None = None

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        return one_accelerator(value, "give one accelerator here; alternatives go in any_of")

    @field_validator("cpus", "memory", mode="before")
    @classmethod
    def _amount(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number or 'N+'")
        if isinstance(value, int | float):
            value = str(value)
        if isinstance(value, str):
            parse_amount(value)
        return value

    @field_validator("infra")
    @classmethod
    def _infra(cls, value: str | None) -> str | None:
        if value is not None:
            Infra(value)
        return value

    @property
    def accelerator(self) -> tuple[str, float] | None:
        return parse_accelerator(self.accelerators) if self.accelerators else None

    @property
    def image_regions(self) -> frozenset[str] | None:
        """The regions a per-region `image_id` limits the job to (None: any)."""
        if isinstance(self.image_id, dict):
            return frozenset(self.image_id)
        return None


class Resources(ResourceSet):
    """One set of resources, or alternatives: `any_of` (cheapest wins) or
    `ordered` (first that can run wins)."""

    any_of: list[ResourceSet] | None = None
    ordered: list[ResourceSet] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> Resources:
        if self.any_of is not None and self.ordered is not None:
            raise ValueError("give any_of or ordered, not both")
        alternatives = self.any_of if self.any_of is not None else self.ordered
        if alternatives is not None and not alternatives:
            raise ValueError("any_of/ordered needs at least one resource set")
        if alternatives:
            # Each alternative carries what it inherits, so the stored spec
            # means what was submitted: `use_spot: false` above an alternative
            # once came back, after storage, as the alternative's default (spot).
            own = {k: getattr(self, k) for k in self.model_fields_set if k not in ("any_of", "ordered")}
            for alt in alternatives:
                for key, value in own.items():
                    if key not in alt.model_fields_set:
                        setattr(alt, key, value)
                        alt.model_fields_set.add(key)
                    elif key == "labels" and value and alt.labels is not None:  # added to, as SkyPilot does
                        alt.labels = {**value, **alt.labels}
        for i, want in enumerate(alternatives or [self]):  # a tier the named cloud cannot give
            if (problem := resfields.refusal(want, Infra(want.infra).cloud if want.infra else None)):
                key = "any_of" if self.any_of is not None else "ordered"
                raise ValueError(f"{key}.{i}: {problem}" if alternatives else problem)
        return self

    def alternatives(self) -> list[ResourceSet]:
        """The sets to consider, in order, with top-level fields as defaults
        for each alternative (as SkyPilot does)."""
        own = self.model_dump(exclude={"any_of", "ordered"}, exclude_unset=True)
        alts = self.any_of if self.any_of is not None else self.ordered
        if alts is None:
            return [ResourceSet(**own)]
        return [ResourceSet(**{**own, **alt.model_dump(exclude_unset=True)}) for alt in alts]

    @property
    def is_ordered(self) -> bool:
        return self.ordered is not None


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


class JobSpec(_Strict):
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
                if not isinstance(remote, str) or not (remote.startswith("/") or remote.startswith("~/")):
                    raise ValueError(f"{remote!r}: a remote path is absolute or starts with ~/")
                # `~/.` would be the home itself, `~//tmp` the host's /tmp: a node places mounts as root.
                parts = (remote[2:] if remote.startswith("~/") else remote[1:]).split("/")
                if remote.rstrip("/") != remote or "$" in remote or any(p in ("", ".", "..") for p in parts):
                    raise ValueError(f"{remote!r}: give the path itself, without a trailing '/', '.', '..', '//' "
                                     "or '$'")
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
