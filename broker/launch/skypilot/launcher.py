"""The SkyPilot launcher: one SkyPilot cluster per attempt, in the place the
policy chose (SkyPilot's Python SDK, 0.14: client and API server).

The reconciler never waits on SkyPilot. `launch` sends the launch request
and returns at once with a handle that holds its request id; `status`
reads what the launcher's `Follower` last heard (a thread of its own asks
SkyPilot); `terminate` sends `sky.down` (after cancelling a launch still in
flight) without waiting for it.

A cluster is named from the broker's prefix and the attempt's id, so a
broker that died between sending a launch and storing its handle finds it
again by name (`api_status(cluster_name=...)`) rather than launching twice.
When SkyPilot's API server does not answer (`server.py`), `launch` raises
LauncherUnavailable and the reconciler tries again later; the attempt is
never failed for it.

While a launch is in flight `status` says PENDING; a refusal for capacity
(or a launch still waiting after `launch_timeout_s`) says FAILED with
`capacity=True`, which the reconciler turns into the next place at once;
a credentials or configuration error says FAILED with SkyPilot's message.
Once launched, the agent's heartbeat brings the attempt up; SkyPilot's own
view is the fallback: a cluster gone or stopped is GONE, its job's end is
the attempt's end.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.launch.base import Handle, LaunchError, LaunchRequest, UnknownPlace
from spotbroker.broker.launch.skypilot.errors import Outcome, one_line, server_unreachable
from spotbroker.broker.launch.skypilot.follow import GONE, IN_FLIGHT, LOST, Follower
from spotbroker.broker.launch.skypilot.node import node_program
from spotbroker.broker.launch.skypilot.server import ServerWatch
from spotbroker.broker.launch.skypilot.task import chosen_alternative, kept_resources, node_task
from spotbroker.broker.launch.skypilot.zones import ZoneNames
from spotbroker.broker.placement.placer import NO_CLOUD
from spotbroker.broker.pricing import gcp_n1
from spotbroker.broker.pricing.offers import Placement

log = logging.getLogger(__name__)

NAME_OK = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
# SkyPilot's cloud names -> the broker's (offers, placements).
CLOUD_NAMES = {"kubernetes": "k8s"}
JOB_FAILED = ("FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED")


def cluster_name(prefix: str, attempt_id: int) -> str:
    return f"{prefix}-{attempt_id}"


def check_prefix(prefix: str) -> str:
    """A prefix SkyPilot accepts in cluster names, and that no attempt id can extend into another's."""
    if not NAME_OK.match(prefix) or len(prefix) > 24:
        raise ValueError(f"{prefix!r}: a cluster prefix is lowercase letters, digits and '-', starts with a letter "
                         "and has at most 24 characters")
    return prefix


class SkyPilotLauncher:
    name = "skypilot"

    def __init__(self, wheelhouse: Path, prefix: str = "spotbroker", launch_timeout_s: float = 900.0,
                 poll_s: float = 1.0, cluster_poll_s: float = 15.0, sky: Any = None,
                 max_log_bytes: int = 0) -> None:
        if sky is None:
            import sky  # 1.5-3 s: only a broker that launches through SkyPilot pays it
        self.sky = sky
        self.prefix = check_prefix(prefix)
        self.wheelhouse = wheelhouse
        self.launch_timeout_s = launch_timeout_s
        self.max_log_bytes = max_log_bytes  # of a job's output, per node (0: no bound)
        self.server = ServerWatch(sky)
        self.follower = Follower(sky, poll_s=poll_s, cluster_poll_s=cluster_poll_s, server=self.server)
        self._clouds: frozenset[str] | None = None
        self._zones = ZoneNames()
        self.last_logged_clouds: frozenset[str] | None = None

    @classmethod
    def from_settings(cls, settings) -> SkyPilotLauncher:
        from spotbroker.broker.launch.skypilot import catalogs, server
        from spotbroker.broker.launch.skypilot.wheel import wheelhouse

        if server.local_server():
            # Before the first `sky check` (the janitor's), which starts the local server: offline,
            # a check without catalog rows enables no compute.
            catalogs.ensure()
        launcher = cls(wheelhouse(settings.data_dir / "wheels"), prefix=settings.skypilot_cluster_prefix,
                       launch_timeout_s=settings.skypilot_launch_timeout, max_log_bytes=settings.max_log_bytes)
        launcher.server.gate_until_seen = True  # the janitor's thread starts (or finds) the server first
        return launcher

    def set_on_change(self, callback) -> None:
        """Called (from the follower's thread) whenever SkyPilot said something new."""
        self.follower.on_change = callback

    # --- launching -----------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        """Send the launch; LauncherUnavailable when SkyPilot's API server
        cannot take it now (the reconciler tries again, with back-off)."""
        cluster = cluster_name(self.prefix, request.attempt_id)
        self.server.check_open()
        self.server.healthy_now()
        try:
            found = self._reattach(cluster)
        except Exception as exc:
            if server_unreachable(exc):
                raise self.server.unavailable(exc) from exc
            raise
        if found is not None:
            return found
        task = self.task(request)
        try:
            request_id = self.sky.launch(task, cluster_name=cluster, retry_until_up=False, down=False)
        except Exception as exc:  # refused before it was queued: the task itself (the server checks it again)
            if server_unreachable(exc):
                raise self.server.unavailable(exc) from None
            if _unknown_place(exc):  # not the job's fault: another place may launch
                raise UnknownPlace(f"SkyPilot does not know the place {request.placement.place} "
                                   f"({request.placement.instance_type}): {one_line(exc)}") from None
            raise LaunchError(f"SkyPilot refused the launch: {type(exc).__name__}: {exc}") from None
        self.server.answered()
        handle = {"cluster": cluster, "request_id": str(request_id), "submitted_at": time.time()}
        self.follower.watch(cluster, handle["request_id"])
        return handle

    def _reattach(self, cluster: str) -> Handle | None:
        """The launch of an earlier broker process for this cluster, if any
        (it died before storing the handle): follow it, never launch twice."""
        requests = [r for r in self.sky.api_status(cluster_name=cluster, all_status=True)
                    if r.name.endswith("launch") and r.cluster_name == cluster]
        if not requests:
            return None
        newest = max(requests, key=lambda r: r.created_at)
        log.info("cluster %s: re-attached to launch request %s (%s)", cluster, newest.request_id, newest.status)
        self.follower.watch(cluster, newest.request_id)
        return {"cluster": cluster, "request_id": newest.request_id, "submitted_at": newest.created_at}

    def task(self, request: LaunchRequest):
        """The SkyPilot task for `request`: the job's file as SkyPilot reads
        it, running the node program, pinned to the placement (an AWS zone
        known by its id only, by its name in this account: zones.py) with the
        chosen resource set's disk, image, cpus and memory."""
        program = node_program(request, str(self.wheelhouse), credentials=request.storage_env,
                               user_secrets=request.secrets, max_log_bytes=self.max_log_bytes)
        placement = request.placement
        if placement.zone is None and placement.zone_id is not None:
            # SkyPilot takes zone names only; an account's id -> name mapping is its own (and a job
            # that names the zone, `us-east-1b`, names it so: its resource set is found by the name)
            placement = replace(placement, zone=self._zones.name_of(placement))
        keep = {}
        if request.spec is not None:
            keep = kept_resources(chosen_alternative(request.spec, placement), placement)
        resources = pinned_resources(self.sky, placement, **keep)
        return node_task(request.spec, program, resources, request.num_nodes, f"attempt-{request.attempt_id}",
                         request.mounts)

    # --- the clouds SkyPilot can reach ---------------------------------------------------

    def enabled_clouds(self) -> frozenset[str] | None:
        """The clouds `sky check` last enabled, as the broker names them, and
        each Kubernetes context it enabled as `k8s/CONTEXT` (None until first
        asked): the placement policy chooses only among them. Never asks
        SkyPilot (the reconciler calls it every pass)."""
        return self._clouds

    def refresh_clouds(self) -> frozenset[str]:
        """Run `sky check` on SkyPilot's API server, then ask which clouds
        it enabled, Kubernetes expanded to its contexts (two requests,
        seconds: the janitor's thread calls it on each sweep, at start-up and
        then every janitor interval, never the reconciler)."""
        self.sky.get(self._sdk("check")(None, False))
        names = self.sky.get(self._sdk("enabled_clouds")(expand=True))
        self._clouds = frozenset(name for n in names for name in _broker_names(str(n)))
        return self._clouds

    def readiness(self) -> tuple[bool, str]:
        """Whether a launch can be sent now, and why (for `/readyz`): SkyPilot's
        API server answered last time it was asked, and `sky check` enabled a cloud."""
        if self.server.down_since is not None or not self.server.seen:
            return False, self.server.detail or "waiting for SkyPilot's API server to start"
        if self._clouds is None:
            return False, "waiting for SkyPilot's first `sky check`"
        if not self._clouds:
            return False, NO_CLOUD
        return True, "SkyPilot can launch on " + ", ".join(sorted(self._clouds))

    def _sdk(self, name: str):
        found = getattr(self.sky, name, None)
        if not callable(found):  # SkyPilot 0.14: `sky.check` is a module; the SDK calls live in sky.client.sdk
            from sky.client import sdk

            found = getattr(sdk, name)
        return found

    # --- observing and stopping ----------------------------------------------------------

    def status(self, handle: Handle) -> RunStatus:
        cluster = handle["cluster"]
        seen = self.follower.seen(cluster)
        if seen is None or seen.request_id != handle.get("request_id"):
            # a handle of an earlier broker process, or one another broker sent again after the
            # request this one follows was lost (sending it a third time would double the launch)
            self.follower.watch(cluster, handle.get("request_id"))
            return RunStatus(RunState.PENDING)
        if seen.request in IN_FLIGHT:
            waited = time.time() - float(handle.get("submitted_at") or time.time())
            if waited > self.launch_timeout_s:
                return RunStatus(RunState.FAILED, capacity=True,
                                 error=f"no node in {self.launch_timeout_s:g} s (launch still waiting): "
                                       "cancelled, trying the next place")
            return RunStatus(RunState.PENDING)
        if seen.request == LOST:
            return RunStatus(RunState.FAILED, resend=True,
                             error=f"SkyPilot's API server no longer knows launch request {seen.request_id} "
                                   "(it restarted): the launch is sent again")
        if seen.request == "FAILED":
            failure = seen.failure
            capacity = failure.outcome != Outcome.BROKEN
            return RunStatus(RunState.FAILED, error=failure.message, capacity=capacity)
        return _run_status(seen.cluster, seen.job)

    def terminate(self, handle: Handle) -> None:
        """`sky.down`, sent and not waited for (also after a failed launch,
        which leaves its cluster INIT and its instance running). A launch
        still in flight is cancelled first. What a failed `down` leaves
        behind, the janitor finds."""
        cluster = handle["cluster"]
        seen = self.follower.seen(cluster)
        request_id = handle.get("request_id")
        if request_id and (seen is None or seen.request in IN_FLIGHT):
            try:
                self.sky.api_cancel(request_id, silent=True)
            except Exception as exc:
                log.warning("cancelling the launch of %s failed: %s", cluster, exc)
        self.sky.down(cluster)
        self.follower.forget(cluster)

    def close(self) -> None:
        self.follower.close()


def _broker_names(infra: str) -> tuple[str, ...]:
    """SkyPilot's name of an enabled infra -> the broker's: `AWS` -> aws;
    `kubernetes/CONTEXT` -> k8s and k8s/CONTEXT (a context keeps its case)."""
    cloud, _, context = infra.partition("/")
    cloud = CLOUD_NAMES.get(cloud.lower(), cloud.lower())
    return (cloud, f"{cloud}/{context}") if context else (cloud,)


def _unknown_place(exc: BaseException) -> bool:
    """SkyPilot's catalog has no such region or zone (`validate_region_zone`'s
    ValueError), or not the instance type there (its catalog's "No instance
    type X found."): the broker's prices and SkyPilot's catalog are of
    different dates, and another place may launch."""
    return isinstance(exc, ValueError) and str(exc).startswith(
        ("Invalid zone ", "Invalid region ", "No instance type ", "Invalid instance type "))


def _run_status(cluster: str | None, job: str | None) -> RunStatus:
    """A launched cluster's run: its job's end, or the cluster gone."""
    if job == "SUCCEEDED":
        return RunStatus(RunState.SUCCEEDED, 0)
    if job in JOB_FAILED:
        return RunStatus(RunState.FAILED, 1)
    if cluster in (GONE, "STOPPED"):
        return RunStatus(RunState.GONE)
    return RunStatus(RunState.RUNNING)


def pinned_resources(sky, p: Placement, **keep: Any):
    """Resources pinned to the place the policy chose: one cloud, region and
    zone, one instance type, the spot market or not; `keep`: what else the
    chosen resource set asks of it (`task.kept_resources`)."""
    count = int(p.accelerator_count) if float(p.accelerator_count).is_integer() else p.accelerator_count
    accelerators = {p.accelerator: count} if p.accelerator and count else None
    if p.cloud in ("k8s", "kubernetes"):
        return sky.Resources(infra="k8s" + (f"/{p.region}" if p.region else ""), accelerators=accelerators, **keep)
    infra = "/".join(part for part in (p.cloud, p.region, p.zone) if part)
    return sky.Resources(infra=infra, instance_type=gcp_n1.machine_type(p.instance_type) if p.instance_type else None,
                         accelerators=accelerators, use_spot=p.use_spot, **keep)
