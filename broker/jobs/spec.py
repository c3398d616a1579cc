"""The job spec: what `POST /v1/jobs` takes, in JSON or as a SkyPilot task YAML.

The resource shapes are SkyPilot's (one set, or `any_of` / `ordered`
alternatives), so a SkyPilot task file maps onto a job one to one. Every
model forbids unknown fields, so a typo is a 422 naming the field rather
than a silently ignored option.
"""
from __future__ import annotations

import itertools
import math
import re
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

CLOUDS = ("aws", "gcp", "azure", "local")
_ACCEL_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9._-]*)(?::(?P<count>[^:]+))?$")
_AMOUNT_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<plus>\+)?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Bounds on what a submission may ask for: past them it is a mistake (or an
# attack), never a job; each is refused with a 422 naming the field.
MAX_ACCELERATORS = 1024        # per node
MAX_NODES = 1024
MAX_PRICE_PER_HOUR = 1000.0    # dollars, per node
MAX_AMOUNT = 1_000_000         # cpus, memory (GB)
MAX_DEADLINE_AHEAD = timedelta(days=365)
# A document's shape: how deep, and how large once YAML aliases are expanded
# (a small YAML can name one large string a thousand times). A stored spec is
# at most MAX_SPEC_BYTES too.
MAX_DEPTH = 16
MAX_SPEC_BYTES = 1 << 20


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


def parse_amount(value: str) -> tuple[float, bool]:
    """"8" -> (8, exact); "8+" -> (8, at least)."""
    match = _AMOUNT_RE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not N or N+ (for example '8' or '32+')")
    amount = float(match["n"])
    if not amount <= MAX_AMOUNT:
        raise ValueError(f"{value!r}: at most {MAX_AMOUNT:,}")
    return amount, bool(match["plus"])


class Infra:
    """"aws", "gcp/us-central1", "aws/us-east-1/us-east-1a" ("*" = any)."""

    def __init__(self, text: str) -> None:
        parts = [p.strip() for p in text.strip().split("/")]
        if not 1 <= len(parts) <= 3 or any(not p for p in parts):
            raise ValueError(f"{text!r} is not CLOUD[/REGION[/ZONE]]")
        cloud = parts[0].lower()
        if cloud not in (*CLOUDS, "*"):
            raise ValueError(f"{text!r}: unknown cloud {parts[0]!r} (one of {', '.join(CLOUDS)})")
        self.cloud = None if cloud == "*" else cloud
        self.region = parts[1] if len(parts) > 1 and parts[1] != "*" else None
        self.zone = parts[2] if len(parts) > 2 and parts[2] != "*" else None


class ResourceSet(_Strict):
    accelerators: str | None = None
    infra: str | None = None
    cpus: str | None = None
    memory: str | None = None
    use_spot: bool = True
    max_price_per_hour: Annotated[float, Field(gt=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)] | None = None

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        if isinstance(value, dict):  # SkyPilot's {"A100": 1} form, one entry
            if len(value) != 1:
                raise ValueError("give one accelerator here; alternatives go in any_of")
            (name, count), = value.items()
            value = f"{name}:{count}"
        if isinstance(value, str):
            name, count = parse_accelerator(value)
            return f"{name}:{count:g}"
        return value

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


class WorkdirUpload(_Strict):
    """The job's working directory: an archive uploaded first (`PUT /v1/uploads/{sha256}`)."""

    upload: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="the sha256 of the uploaded archive")]


class JobSpec(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = "job"
    run: Annotated[str, Field(min_length=1)]
    setup: str | None = None
    envs: dict[str, str] = Field(default_factory=dict)
    # An upload. A path (SkyPilot's `workdir: .`) is the client's to pack and
    # upload; one left here would name the broker's host and is refused at submission.
    workdir: Annotated[WorkdirUpload | str | None, Field(description=(
        "The job's code: {\"upload\": SHA256} after PUT /v1/uploads/{sha256}. Each attempt runs in a fresh "
        "copy of it. A path is refused: `spotbroker submit FILE` uploads the directory it names"))] = None
    num_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 0
    # Productive hours the job needs (a guess is fine): what placement weighs
    # restarts and the deadline against. Required with a deadline.
    estimated_hours: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    deadline: AwareDatetime | None = None
    resources: Resources = Field(default_factory=Resources)

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for key, val in value.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if val is None or isinstance(val, dict | list):
                raise ValueError(f"{key}: value must be a string or a number")
            out[key] = str(val).lower() if isinstance(val, bool) else str(val)
        return out

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

    @property
    def wants_gpu(self) -> bool:
        return any(alt.accelerators for alt in self.resources.alternatives())

    def stored(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class SpecSyntaxError(ValueError):
    """A job document that is not valid JSON/YAML; `line` is 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f"line {line}" + (f", column {column}" if column else "") + ": " if line else ""
        super().__init__(where + message)
        self.line, self.column, self.message = line, column, message


class SpecShapeError(SpecSyntaxError):
    """A document nested too deeply, too large once its YAML aliases are
    expanded, or with a NUL byte in a string; `field` says where, `detail`
    what (`message` says both)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


def load_document(data: bytes, fmt: str = "auto") -> dict[str, Any]:
    """Parse a job document (JSON, or a SkyPilot-style YAML) into a dict.

    `fmt` is "json", "yaml" or "auto" (JSON if it starts with '{').
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecSyntaxError(f"not UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    if fmt == "auto":
        fmt = "json" if text.lstrip().startswith("{") else "yaml"
    if fmt == "json":
        import json

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecSyntaxError(exc.msg, exc.lineno, exc.colno) from None
        except RecursionError:
            raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels") from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise SpecSyntaxError(str(exc)) from None
    else:
        import yaml

        try:
            _refuse_deep_yaml(text)
            doc = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            raise SpecSyntaxError(str(exc.problem or exc), mark.line + 1 if mark else None,
                                  mark.column + 1 if mark else None) from None
        except yaml.YAMLError as exc:
            raise SpecSyntaxError(str(exc)) from None
        except RecursionError:
            raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels") from None
        except SpecShapeError:
            raise
        except (ValueError, OverflowError) as exc:  # a number or date out of range
            raise SpecSyntaxError(str(exc)) from None
    if not isinstance(doc, dict):
        raise SpecSyntaxError("the document must be a mapping of fields (name, run, resources, ...)")
    check_shape(doc)
    return _accelerator_alternatives(doc)


_YAML_QUOTED_RE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"")
_BRACKET_RE = re.compile(r"[\[\]{}]")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_YAML_FLOW_DEPTH = 256


def _refuse_deep_yaml(text: str) -> None:
    """Refuse YAML whose flow collections (`[[[...`) open far more levels than
    MAX_DEPTH, before PyYAML reads it: its scanner holds every token of a
    deep flow collection before the first event (200,000 levels took 0.7 s
    and left the server 10 % larger). Brackets in quoted strings are not
    counted; past MAX_DEPTH but not this far, `check_shape` names the field."""
    if text.count("[") + text.count("{") <= _YAML_FLOW_DEPTH:
        return
    steps = map(_BRACKET_STEP.__getitem__, _BRACKET_RE.findall(_YAML_QUOTED_RE.sub("", text)))
    if max(itertools.accumulate(steps), default=0) > _YAML_FLOW_DEPTH:
        raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels")


def check_shape(doc: Any) -> None:
    """Walk the document as a JSON encoder would, each YAML alias expanded,
    and stop at the first string holding a NUL byte (no process can take it:
    the launch would fail), the first level past MAX_DEPTH, or once past
    MAX_SPEC_BYTES. Without recursion, and in time bounded by the size limit
    whatever the aliases multiply."""
    budget = MAX_SPEC_BYTES
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        if len(path) > MAX_DEPTH:
            raise SpecShapeError(_dotted(path[:MAX_DEPTH + 1]), f"nested more than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            budget -= 2
            for key, value in node.items():
                _no_nul(path + (key,), key)
                budget -= len(str(key)) + 4
                stack.append((path + (key,), value))
        elif isinstance(node, list):
            budget -= 2 + len(node)
            stack.extend((path + (i,), value) for i, value in enumerate(node))
        elif isinstance(node, str):
            _no_nul(path, node)
            budget -= len(node) + 2
        elif isinstance(node, float) and not math.isfinite(node):
            raise SpecShapeError(_dotted(path), "must be a finite number")
        else:
            budget -= 8
        if budget < 0:
            raise SpecShapeError("body", f"larger than {MAX_SPEC_BYTES} bytes once YAML aliases are expanded")


def _no_nul(path: tuple[Any, ...], value: Any) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise SpecShapeError(_dotted(path), "contains a NUL byte")


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "body"


def _accelerator_alternatives(doc: dict[str, Any]) -> dict[str, Any]:
    """SkyPilot's `accelerators: {A10G: 1, L4: 1}` (or a list) means "any of"."""
    res = doc.get("resources")
    if isinstance(res, dict):
        acc = res.get("accelerators")
        many = (isinstance(acc, dict) and len(acc) > 1) or isinstance(acc, list)
        if many and "any_of" not in res and "ordered" not in res:
            items = acc.items() if isinstance(acc, dict) else ((a, None) for a in acc)
            rest = {k: v for k, v in res.items() if k != "accelerators"}
            doc = {**doc, "resources": {**rest, "any_of": [
                {"accelerators": name if count is None else f"{name}:{count}"} for name, count in items]}}
    return doc
