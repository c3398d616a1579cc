"""What a launcher saw of a run: the word every launcher reports in and
recovery reads, below both (broker/launch/base.py's `Launcher.status`)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RunState(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    GONE = "GONE"        # the node vanished without an exit code
    PENDING = "PENDING"  # a launch still in flight (SkyPilot): nothing to do yet


@dataclass(frozen=True)
class RunStatus:
    state: RunState
    exit_code: int | None = None
    error: str | None = None  # FAILED before the job's command ran (provisioning): why
    capacity: bool = False    # with `error`: the place had no room (try the next one), not a broken launch
    # with `error`: the launcher lost the launch it sent (SkyPilot's API server
    # restarted and forgot it): send it again, to the same place; nothing is
    # learned of the place
    resend: bool = False
