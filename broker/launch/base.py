"""The launcher interface: what the reconciler needs from whatever starts
machines (local processes here; SkyPilot in the clouds).

Every method is idempotent per attempt: the reconciler may be killed at any
line and call `launch` again for the same attempt after a restart, and
`launch` must then return the handle of what is already running instead of
starting it twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from spotbroker.broker.jobs.runs import RunStatus
from spotbroker.broker.jobs.uploads import CodeRef
from spotbroker.broker.pricing.offers import Placement

if TYPE_CHECKING:
    from spotbroker.agent.mounts import Mount
    from spotbroker.broker.jobs.spec import JobSpec


class LaunchError(Exception):
    """The launch failed for a reason that another offer will not fix."""


class CapacityError(LaunchError):
    """No capacity or quota for this offer now: try the next offer."""


class UnknownPlace(CapacityError):
    """The launcher cannot launch in this place at all: a zone this AWS
    account does not have (a Local Zone it has not opted in to), a zone or
    region SkyPilot's catalog lacks. Another offer may launch: the next is
    tried, and placement counts the place refused, as for capacity."""


class LauncherUnavailable(Exception):
    """The service the launcher sends launches to cannot be reached now (its
    API server starting, restarting or gone; a 5xx): nothing about the job
    or the place is wrong. The launch is tried again later, the attempt
    staying LAUNCHING, within the launcher's launch timeout."""


@dataclass(frozen=True)
class LaunchRequest:
    attempt_id: int
    job_id: int
    team: str
    run: str
    setup: str | None
    envs: dict[str, str]
    num_nodes: int
    placement: Placement
    code: CodeRef | None = None  # the attempt's working directory, fresh on every node
    extra_env: dict[str, str] = field(default_factory=dict)  # broker-provided (ids, tokens)
    # The user's own secrets: the job's process gets them like envs; never
    # logged, hence out of the repr (a request is easy to log by mistake).
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    # The job's stored spec: what a launcher that speaks the task file's
    # language (SkyPilot) builds the node's task from. None: a bare request.
    spec: JobSpec | None = field(default=None, repr=False)
    # The node's own storage credentials, scoped to the job's prefix, as
    # environment variables (broker/launch/storage_credentials.py): secret.
    storage_env: dict[str, str] = field(default_factory=dict, repr=False)
    # The team's id in the database: on the local launcher, which uid the team's jobs run as.
    team_id: int | None = None
    # The job's file mounts, resolved (broker/jobs/mounts.py): each node places them before `setup`.
    # None: a request made without the broker's resolution (the spec's own storage mounts stand).
    mounts: tuple[Mount, ...] | None = None


Handle = dict[str, Any]


class Launcher(Protocol):
    """`probe(placement) -> bool` is optional: whether spot capacity is there
    now for that placement, asked without running a job (the placement policy
    asks for probes to watch a zone's spell of capacity).
    `simulate_preemption(handle)` is optional too: a launcher that simulates
    the cloud (the local one) makes the run's cloud send its notice."""

    name: str

    def launch(self, request: LaunchRequest) -> Handle: ...

    def status(self, handle: Handle) -> RunStatus: ...

    def terminate(self, handle: Handle) -> None: ...
