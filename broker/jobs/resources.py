"""A job's resources: one set (accelerators, infra, cpus, memory, price cap,
disk, image, SkyPilot's tiers) or alternatives (`any_of`: cheapest wins,
`ordered`: first that can run wins), as SkyPilot reads them; part of the job
spec (broker/jobs/spec.py)."""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from spotbroker.broker.jobs import resfields

CLOUDS = ("aws", "gcp", "azure", "local")
KUBERNETES = ("k8s", "kubernetes")  # the operator's clusters (broker/placement/kubernetes.py), as SkyPilot spells them
ACCELERATOR_NAME = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9._-]*)(?::(?P<count>[^:]+))?\Z")
_AMOUNT_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<plus>\+)?\Z")

# Bounds on what a submission may ask for: past them it is a mistake (or an
# attack), never a job; each is refused with a 422 naming the field.
MAX_ACCELERATORS = 1024        # per node
MAX_PRICE_PER_HOUR = 1000.0    # dollars, per node
MAX_AMOUNT = 1_000_000         # cpus, memory (GB)
MAX_DISK_GB = 65_536
MAX_ALTERNATIVES = 64          # resource sets in `any_of` or `ordered`


class StrictModel(BaseModel):
    """Unknown fields are refused (a typo is a 422 naming it, not an ignored option)."""
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def parse_accelerator(value: str) -> tuple[str, float]:
    """"A100:2" -> ("A100", 2.0); "A100" -> ("A100", 1.0)."""
    match = ACCELERATOR_NAME.match(value.strip())
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


class ResourceSet(StrictModel):
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

    # A few alternatives in practice; each is placed against every offer, so a
    # document of 40,000 once held two parsing slots for 15 s.
    any_of: Annotated[list[ResourceSet], Field(max_length=MAX_ALTERNATIVES)] | None = None
    ordered: Annotated[list[ResourceSet], Field(max_length=MAX_ALTERNATIVES)] | None = None

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
