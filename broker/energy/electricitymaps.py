"""Live grid carbon intensity from Electricity Maps (`/v3/carbon-intensity/latest`).

It needs the operator's API key (`SPOTBROKER_ELECTRICITYMAPS_TOKEN`, sent as
the `auth-token` header). Without one, or when the service cannot be
reached or refuses the key, the caller keeps the snapshot's figures and
logs one line: a live figure is a refinement, never a dependency.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

BASE_URL = "https://api.electricitymaps.com/v3"
SOURCE = "electricitymaps"


class Unavailable(Exception):
    """The service gave nothing usable this time (offline, key refused)."""


@dataclass(frozen=True)
class Reading:
    zone: str
    g_per_kwh: float
    at: datetime
    estimated: bool   # Electricity Maps' own flag: the hour was modelled, not measured
    factor: str       # "lifecycle" or "direct" emission factors


def parse(body: dict) -> Reading:
    """One `/carbon-intensity/latest` answer; ValueError when it is not one."""
    try:
        return Reading(zone=str(body["zone"]), g_per_kwh=float(body["carbonIntensity"]),
                       at=datetime.fromisoformat(str(body["datetime"]).replace("Z", "+00:00")),
                       estimated=bool(body.get("isEstimated", False)),
                       factor=str(body.get("emissionFactorType", "lifecycle")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a carbon-intensity answer: {exc}") from exc


class Client:
    def __init__(self, token: str, base_url: str = BASE_URL, timeout: float = 10.0) -> None:
        self.token, self.base_url, self.timeout = token, base_url.rstrip("/"), timeout

    def latest(self, zones: list[str]) -> dict[str, Reading]:
        """The latest reading of each zone it has; a zone it does not know is left out."""
        import httpx  # here: a broker without an Electricity Maps key starts without it

        out: dict[str, Reading] = {}
        with httpx.Client(base_url=self.base_url, timeout=self.timeout,
                          headers={"auth-token": self.token}) as http:
            for zone in sorted(set(zones)):
                try:
                    answer = http.get("/carbon-intensity/latest", params={"zone": zone})
                except httpx.TransportError as exc:
                    raise Unavailable(f"Electricity Maps unreachable at {self.base_url} ({type(exc).__name__})") \
                        from exc
                if answer.status_code in (401, 403):
                    raise Unavailable(f"Electricity Maps refused the key (HTTP {answer.status_code})")
                if answer.status_code == 429:
                    raise Unavailable("Electricity Maps rate limit reached (HTTP 429)")
                if answer.status_code != 200:
                    continue  # a zone outside the key's plan or unknown to the service
                try:
                    out[zone] = parse(answer.json())
                except ValueError:
                    continue
        return out
