"""A job's `secrets` as the database keeps them: the names in clear (the API
shows them), each value sealed (broker/store/sealing.py) and bound to the
job's team and the secret's name.

So a spec read back from the database (`spec_of(job)`, broker/jobs/stored.py)
holds sealed values; only the launch, which hands them to the job's process,
opens them (`opened`). A job whose secrets do not open is HELD saying why
(`problem`), never launched without them.
"""
from __future__ import annotations

from typing import Any

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.sealing import Keyring, SealError


def _context(team_id: int, name: str) -> str:
    return f"job secret|team {team_id}|{name}"


def seal(stored: dict[str, Any], team_id: int, keyring: Keyring) -> dict[str, Any]:
    """A stored spec (`JobSpec.stored()`) with its secrets' values sealed."""
    if not stored.get("secrets"):
        return stored
    return {**stored, "secrets": {name: keyring.seal(value, _context(team_id, name))
                                  for name, value in stored["secrets"].items()}}


def values(stored: dict[str, Any], team_id: int, keyring: Keyring) -> dict[str, str]:
    """The secrets' values of a stored spec; SealError names the one that does not open."""
    out = {}
    for name, sealed in (stored.get("secrets") or {}).items():
        try:
            out[name] = keyring.open(sealed, _context(team_id, name))
        except SealError as exc:
            raise SealError(f"secret {name}: {exc}") from None
    return out


def unsealed(stored: dict[str, Any], team_id: int, keyring: Keyring) -> dict[str, Any]:
    """A stored spec with its secrets' values opened (SealError if one does not)."""
    if not stored.get("secrets"):
        return stored
    return {**stored, "secrets": values(stored, team_id, keyring)}


def opened(job: Job, keyring: Keyring) -> JobSpec:
    """The job's spec with its secrets' values: what its process is given."""
    return JobSpec.model_validate(unsealed(job.spec, job.team_id, keyring))


def problem(job: Job, keyring: Keyring) -> str | None:
    """Why the job's secrets cannot be given to it, or None."""
    try:
        values(job.spec, job.team_id, keyring)
    except SealError as exc:
        return f"its secrets cannot be read: {exc}"
    return None


def resealed(stored: dict[str, Any], team_id: int, keyring: Keyring) -> dict[str, Any] | None:
    """The stored spec with every secret under the current key, or None when
    they all are already (key rotation: `spotbroker db reseal`)."""
    sealed = stored.get("secrets") or {}
    if all(keyring.is_current(v) for v in sealed.values()):
        return None
    return seal(unsealed(stored, team_id, keyring), team_id, keyring)
