"""Alternatives (`any_of`, `ordered`) on clouds the broker does not place on
(lambda, runpod, paperspace, fluidstack, ssh...): SkyPilot reads them, and a
file written for several clouds names them beside AWS, GCP or Azure. They
are dropped with a warning while one alternative remains; refused when none
does."""
from __future__ import annotations

from typing import Any

from spotbroker.broker.jobs.resources import CLOUDS, KUBERNETES

PLACED = ", ".join((*(c for c in CLOUDS if c != "local"), KUBERNETES[0]))


def cloud_of(infra: Any) -> str | None:
    """The cloud an `infra` names, lower-case; None for any."""
    if not isinstance(infra, str) or not infra.strip():
        return None
    cloud = infra.strip().split("/")[0].strip().lower()
    return None if cloud in ("", "*") else cloud


def elsewhere(infra: Any) -> str | None:
    """The cloud `infra` names when spotbroker does not place on it."""
    cloud = cloud_of(infra)
    return cloud if cloud is not None and cloud not in (*CLOUDS, *KUBERNETES) else None


def drop_other_clouds(res: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]], list[dict[str, str]]]:
    """`res` (the spec's resources, `infra` already in place of cloud/region/
    zone) without the alternatives on other clouds: (resources, warnings,
    errors), each a list of {"field", "message"}."""
    top = res.get("infra")
    key = next((k for k in ("any_of", "ordered") if isinstance(res.get(k), list)), None)
    if key is None:
        if cloud := elsewhere(top):
            return res, [], [{"field": "resources.infra", "message": (
                f"spotbroker does not place on {cloud}: name one of {PLACED}, or leave infra out and the broker "
                "chooses the cheapest place")}]
        return res, [], []
    kept, warnings, dropped = [], [], []
    for i, alt in enumerate(res[key]):
        infra = alt.get("infra", top) if isinstance(alt, dict) else top
        if cloud := elsewhere(infra):
            dropped.append(cloud)
            warnings.append({"field": f"resources.{key}.{i}", "message": (
                f"spotbroker does not place on {cloud}: this alternative is dropped (the others stay)")})
        else:
            kept.append(alt)
    if not dropped:
        return res, [], []
    if not kept:
        return res, [], [{"field": f"resources.{key}", "message": (
            f"every alternative names a cloud spotbroker does not place on ({', '.join(sorted(set(dropped)))}): "
            f"add one on {PLACED}, or leave infra out and the broker chooses")}]
    out = {**res, key: kept}
    if elsewhere(top):  # every kept alternative names its own place
        del out["infra"]
    return out, warnings, []
