"""Which jobs run as the broker host's own job rather than on a placed offer.

A job without accelerators is placed on a cloud's CPU machine like any other
job (broker/pricing/offers.py `fitting`). Only a job that asks for the host
(`infra: local` on every resource set) runs here, or, when the operator
makes this host the CPU pool (`SPOTBROKER_CPU_JOBS_ON_HOST`), every job
that names no accelerator and no instance type.
"""
from __future__ import annotations

from spotbroker.broker.jobs.spec import JobSpec


def on_host(spec: JobSpec, cpu_jobs_on_host: bool) -> bool:
    return spec.asks_for_host or (cpu_jobs_on_host and not spec.wants_gpu)


def host_reason(spec: JobSpec) -> str:
    """Why a job runs on the broker's host, as its launch event says it."""
    if spec.asks_for_host:
        return "it asks for the broker's host (infra: local)"
    return "a job without accelerators runs on the broker's host (SPOTBROKER_CPU_JOBS_ON_HOST)"


def unlaunchable(job, spec: JobSpec, keyring, launchers: dict, settings) -> str | None:
    """Why this broker cannot launch the job now (its launchers, its keys), if it cannot."""
    from spotbroker.broker.jobs import sealed
    from spotbroker.broker.placement.placer import NO_CLOUD, NOT_CHECKED, enabled_clouds

    if spec.secrets and (unreadable := sealed.problem(job, keyring)):
        return f"{unreadable}; a broker given the key that sealed them releases it"
    here = on_host(spec, settings.cpu_jobs_on_host)
    clouds = enabled_clouds(launchers)
    if not here and clouds == frozenset():
        return NO_CLOUD  # (not FAILED no_feasible_offer: credentials may come)
    if not here and clouds is None and hasattr(launchers.get("skypilot"), "enabled_clouds"):
        return NOT_CHECKED  # a broker just started: placed now, it could pick a cloud SkyPilot refuses
    beyond = beyond_launchers(spec, launchers, settings)
    return beyond[1] if beyond else None


def beyond_launchers(spec: JobSpec, launchers: dict, settings) -> tuple[str, str] | None:
    """(the spec's field, why) this broker's launchers, as configured, cannot
    run the job (until the configuration changes), if they cannot: also said
    when it is submitted."""
    here = on_host(spec, settings.cpu_jobs_on_host)
    if not here and not {"local", "skypilot"} & set(launchers):
        return "resources", ("no launcher can run it: this broker runs no cloud launcher, and the local launcher "
                             "is off (it is on by default only when serving on loopback; "
                             "SPOTBROKER_LOCAL_LAUNCHER=true runs jobs on the broker's host)")
    if here and "local" not in launchers:
        return "resources", (f"no launcher can run it: {host_reason(spec)}, and the local "
                             "launcher is off (SPOTBROKER_LOCAL_LAUNCHER=true turns it on)")
    local_only = "local" in launchers and ("skypilot" not in launchers or here)
    if local_only and spec.num_nodes > settings.local_max_running:
        return "num_nodes", (f"it needs {spec.num_nodes} nodes, and the local launcher runs at most "
                             f"{settings.local_max_running} at once (SPOTBROKER_LOCAL_MAX_RUNNING)")
    return None
