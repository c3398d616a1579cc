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
