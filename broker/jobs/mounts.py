"""A job's file mounts, checked at submission: each source is an upload of
the team's or a storage URI under the team's own prefix, never a path on the
broker's host nor another team's (or anyone's) bucket. The broker is
SkyPilot's client: a source it does not own would be copied to a tenant's
node with the broker's own identity."""
from __future__ import annotations

from typing import Any

from spotbroker.broker.jobs import uploads
from spotbroker.broker.jobs.spec import JobSpec, StorageMount, WorkdirUpload
from spotbroker.broker.settings import Settings


def team_prefix(settings: Settings, team: str) -> str:
    return f"{settings.checkpoint_uri.rstrip('/')}/{team}/"


def mount_errors(settings: Settings, team: str, spec: JobSpec) -> list[dict[str, Any]]:
    """Why the spec's file mounts cannot be used, as field errors (none: [])."""
    prefix = team_prefix(settings, team)
    errors = []
    for remote, source in spec.file_mounts.items():
        field = f"file_mounts.{remote}"
        if isinstance(source, WorkdirUpload):
            if uploads.size(settings, team, source.upload) is None:
                errors.append({"field": f"{field}.upload",
                               "message": f"your team has no upload {source.upload} (PUT /v1/uploads/{{sha256}})"})
            continue
        uri = source.source if isinstance(source, StorageMount) else source
        if not uri.startswith(prefix):
            errors.append({"field": f"{field}.source" if isinstance(source, StorageMount) else field,
                           "message": f"{uri!r} is not under your team's storage prefix {prefix}: the broker "
                                      "mounts only what your team owns there, or an upload"})
    return errors
