"""A job row's spec, typed: `spec_of(job)` parses `jobs.spec` (a JSON
column) into a `JobSpec` once per value of the column and hands the same
object back until the column is replaced (a write, or a reload after a
commit). Callers read it and never change it.

The spec is the one stored: its `secrets` are sealed (broker/jobs/sealed.py
opens them, for the launch alone).
"""
from __future__ import annotations

from typing import Any

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.store.models import Job

_PARSED = "_spotbroker_parsed_spec"  # on the row: (the column's value parsed, its parse)


def spec_of(job: Job) -> JobSpec:
    stored: Any = job.spec
    parsed = job.__dict__.get(_PARSED)
    if parsed is None or parsed[0] is not stored:
        parsed = (stored, JobSpec.model_validate(stored))
        job.__dict__[_PARSED] = parsed
    return parsed[1]
