"""Resource fields SkyPilot honours on the place the broker pins (the disk's
and the network's tier, the instance's labels, the ports it opens): kept in
the job spec as SkyPilot reads them and passed to the SkyPilot task the
launcher builds. Placement does not weigh them: every place a cloud offers
can take them (SkyPilot says so at launch when one cannot)."""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

DiskTier = Literal["low", "medium", "high", "ultra", "best"]
NetworkTier = Literal["standard", "best"]
MAX_PORTS = 64
MAX_LABELS = 64

_PORT_RE = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?\Z")
# SkyPilot's rules for AWS tags, the loosest of its clouds' (`is_label_valid`):
# a key of at most 127 characters, a value of at most 255, no spaces; a key
# here is also plain (no ':', so never AWS's reserved `aws:`).
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,126}\Z")
MAX_LABEL_VALUE = 255


def _ports(value: Any) -> Any:
    """`8080`, `"8000-8010"` or a list of them -> ["8080", "8000-8010"], each
    port 1-65535 and each range low-high (SkyPilot's shapes)."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_PORTS:
        raise ValueError(f"at most {MAX_PORTS} ports or ranges")
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise ValueError(f"{item!r}: a port is a number (8080) or a range ('8000-8010')")
        m = _PORT_RE.match(str(item).strip())
        low, high = (int(m[1]), int(m[2] or m[1])) if m else (0, 0)
        if not (m and 1 <= low <= high <= 65535):
            raise ValueError(f"{item!r}: a port is 1-65535 (8080) or a range low-high ('8000-8010')")
        out.append(str(item).strip())
    return out


def _labels(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if len(value) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise ValueError(f"{key!r}: a label's name is letters, digits, '.', '_', '-' or '/' (at most 127)")
        if isinstance(val, dict | list) or val is None:
            raise ValueError(f"{key}: a label's value is a string")
        text = str(val).lower() if isinstance(val, bool) else str(val)
        if len(text) > MAX_LABEL_VALUE or not all(c.isprintable() and not c.isspace() for c in text):
            raise ValueError(f"{key}: a label's value is at most {MAX_LABEL_VALUE} characters, without spaces "
                             "(SkyPilot gives it to the instances as a tag)")
        if text == NO_LABEL:
            raise ValueError(f"{key}: {NO_LABEL} is how costs name the jobs without the label: give another value")
        out[key] = text
    return out


NO_LABEL = "(none)"  # the costs' group of the jobs that do not carry a label (no job's value)

# A job's labels are SkyPilot's `resources.labels`; SkyPilot has no top-level key.
MISPLACED_LABELS = ("labels go under resources, where SkyPilot reads them: resources: {labels: {project: NAME}} "
                    "(in JSON, {\"resources\": {\"labels\": {\"project\": \"NAME\"}}})")

Ports = Annotated[list[str], BeforeValidator(_ports)]
Labels = Annotated[dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]], BeforeValidator(_labels)]
PASSED = ("disk_tier", "network_tier", "labels", "ports")

# What a cloud's places cannot take (SkyPilot's unsupported features per
# cloud): a disk tier other than `best` needs custom disk tiers, network tier
# `best` a custom network tier.
_CANNOT = {"k8s": ("disk_tier", "network_tier"), "azure": ("network_tier",)}


def asks(want: Any) -> set[str]:
    """The fields of a resource set that only some clouds' places honour."""
    out = set()
    if getattr(want, "disk_tier", None) not in (None, "best"):
        out.add("disk_tier")
    if getattr(want, "network_tier", None) == "best":
        out.add("network_tier")
    return out


def clouds_refusing(want: Any) -> list[str]:
    """The clouds (as the broker names them) whose places cannot honour the set."""
    wanted = asks(want)
    return sorted(cloud for cloud, cannot in _CANNOT.items() if wanted & set(cannot))


def refusal(want: Any, cloud: str | None) -> str | None:
    """Why a set naming `cloud` cannot run there, with the way out; None when it can."""
    fields = sorted(asks(want) & set(_CANNOT.get(cloud or "", ())))
    if not fields:
        return None
    return (f"{cloud} places cannot honour {' and '.join(fields)}: drop it, or name aws or gcp"
            + (" (disk_tier: best works everywhere)" if "disk_tier" in fields else ""))
