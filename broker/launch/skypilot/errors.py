"""What a failed SkyPilot launch means to the broker.

SkyPilot raises the same exception on the client that its API server met
(`sky.get`). Three outcomes matter to the reconciler:

- capacity: this place has no room now (`ResourcesUnavailableError`:
  capacity, quota, no feasible resources; or a node that never came up in
  time). The zone is folded into the placement history and the next place
  is tried at once.
- broken: credentials or configuration. Another place will not fix it: the
  attempt fails with SkyPilot's own message.
- cancelled: the request was cancelled (by the broker, after its bound).

Only the exception's class name and message are kept: they are what a
person reads, and what the reconciler stores in the attempt's events.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    CAPACITY = "capacity"
    BROKEN = "broken"
    CANCELLED = "cancelled"


# Credentials and configuration: no place will fix these.
_BROKEN = {
    "InvalidCloudCredentials", "InvalidCloudConfigs", "InvalidSkyPilotConfigError", "CloudUserIdentityError",
    "ClusterOwnerIdentityMismatchError", "NoCloudAccessError", "ProvisionPrechecksError", "NotSupportedError",
    "UserRequestRejectedByPolicy", "InvalidClusterNameError", "ValueError", "TypeError", "KeyError",
}


@dataclass(frozen=True)
class LaunchFailure:
    outcome: Outcome
    message: str
    zones: tuple[str, ...] = ()  # the zones SkyPilot tried, from its failover history


def classify(exc: BaseException) -> LaunchFailure:
    """The broker's reading of what `sky.get(launch)` raised."""
    name = type(exc).__name__
    message = one_line(exc) or name
    if name == "RequestCancelled":
        return LaunchFailure(Outcome.CANCELLED, message)
    if _is_a(exc, "ResourcesUnavailableError"):
        history = getattr(exc, "failover_history", None) or []
        zones = tuple(z for e in history for z in _zones_named(str(e)))
        return LaunchFailure(Outcome.CAPACITY, message, zones)
    if name in _BROKEN or _is_a(exc, "InvalidCloudCredentials"):
        return LaunchFailure(Outcome.BROKEN, f"{name}: {message}")
    # Anything else met while provisioning (SSH never answered, the cloud's
    # API failed): this place did not give us a node; another may.
    return LaunchFailure(Outcome.CAPACITY, f"{name}: {message}")


# What the SDK raises when SkyPilot's API server did not answer: nothing
# about the launch itself, and the same request may succeed in a moment.
# By module too: a cloud SDK's own "ConnectionError" (botocore's) met by the
# server while provisioning is the place's failure, not the server's.
_SKY_UNREACHABLE = {"ApiServerConnectionError", "ServerTemporarilyUnavailableError", "RequestInterruptedError"}
_TRANSPORT = {"requests.exceptions": {"ConnectionError", "Timeout", "ChunkedEncodingError"},
              "builtins": {"ConnectionError", "TimeoutError"}}


def server_unreachable(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) says SkyPilot's API server could not
    be reached or answered 5xx: a reason to ask again, never to fail."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for cls in type(exc).__mro__:
            if cls.__name__ in _SKY_UNREACHABLE and cls.__module__.startswith("sky."):
                return True
            if cls.__name__ in _TRANSPORT.get(cls.__module__, ()):
                return True
        response = getattr(exc, "response", None)
        if type(exc).__name__ == "HTTPError" and getattr(response, "status_code", 0) >= 500:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _is_a(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    # SkyPilot's messages carry terminal colours and several lines of advice.
    text = str(exc)
    for code in ("\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[33m", "\x1b[36m", "\x1b[2m", "\x1b[22m", "\x1b[39m"):
        text = text.replace(code, "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines)[:2000]


def _zones_named(text: str) -> list[str]:
    """Zone names such as us-east-1a found in one failover entry's message."""
    import re

    return re.findall(r"\b[a-z]{2}(?:-[a-z]+)+-\d[a-z]\b", text)
