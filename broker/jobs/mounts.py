"""A job's file mounts: checked at submission, resolved at launch.

Each source is one of

* an upload of the team's (`{upload: SHA256}`, a directory, or with
  `file: true` one file, that `spotbroker submit` packed);
* a bucket by name (`{name: NAME}`): SkyPilot would create or reuse a cloud
  bucket of that name; the broker gives the name a home in the team's own
  storage instead, `{root}/{team}/buckets/{name}/`, the same for every job of
  the team, so one job's writes are the next one's data, and no cloud bucket
  is made that the broker would have to own;
* a storage URI under the team's own prefix (read only: it holds the team's
  checkpoints), or under a prefix the admin lists for the team
  (`buckets.py`), for reading only where listed so.

Never a path on the broker's host nor a bucket no one allowed: the broker is
SkyPilot's client, and a source it was not told the team may use would reach
a tenant's node with the broker's own identity.
"""
from __future__ import annotations

from typing import Any

from spotbroker.agent.mounts import Mount
from spotbroker.broker.jobs import uploads
from spotbroker.broker.jobs.buckets import Allowed, holding, outside_credentials
from spotbroker.broker.jobs.spec import JobSpec, StorageMount, UploadMount, WorkdirUpload
from spotbroker.broker.settings import Settings

_STORES = {"s3": "s3", "gcs": "gs", "azure": "az"}


def team_prefix(settings: Settings, team: str) -> str:
    return f"{settings.checkpoint_uri.rstrip('/')}/{team}/"


def bucket_uri(settings: Settings, team: str, name: str) -> str:
    """Where the team's bucket `name` lives: in its own storage, for good."""
    return f"{team_prefix(settings, team)}buckets/{name}/"


def mount_warnings(settings: Settings, spec: JobSpec) -> list[dict[str, Any]]:
    """What of the mounts is taken otherwise than written: a bucket by name
    whose `store` is not the broker's storage lives there all the same (a
    task file written for SkyPilot names its store; refusing it would refuse
    most of them on a broker whose storage is elsewhere)."""
    root_scheme = settings.checkpoint_uri.split("://", 1)[0].lower()
    return [{"field": f"file_mounts.{remote}.store", "message": (
                f"your team's buckets are kept in the broker's storage ({root_scheme}://), so {source.name!r} "
                f"lives there, not in {source.store}")}
            for remote, source in spec.file_mounts.items()
            if isinstance(source, StorageMount) and source.name is not None and source.store is not None
            and _STORES[source.store] != root_scheme]


def _where(remote: str, source: Any) -> str:
    return f"file_mounts.{remote}.source" if isinstance(source, StorageMount) else f"file_mounts.{remote}"


def mount_errors(settings: Settings, team: str, spec: JobSpec, allow: list[Allowed]) -> list[dict[str, Any]]:
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
        if isinstance(source, StorageMount) and source.name is not None:
            continue  # a bucket by name lives in the team's storage (a `store` elsewhere: mount_warnings)
        uri = source.source if isinstance(source, StorageMount) else source
        if (why := outside_credentials(uri, settings.checkpoint_uri)) is not None:
            errors.append({"field": _where(remote, source), "message": why})
            continue
        if not uri.startswith(prefix) and holding(allow, uri) is None:
            listed = ", ".join(a.uri + (" (read only)" if a.read_only else "") for a in allow) or "none"
            errors.append({"field": _where(remote, source), "message": (
                f"{uri!r} is not a bucket your team may mount: your team's own storage is {prefix} (a bucket by "
                f"name, `{{name: NAME}}`, lives there), and the admin lets it mount: {listed} "
                "(`spotbroker teams storage`)")})
    return errors


def resolved(settings: Settings, team: str, spec: JobSpec, allow: list[Allowed]) -> list[Mount]:
    """What each node is given to place: every mount's URI (an upload's
    archive, a named bucket's home) and whether the job may write there.
    A mount no longer allowed (the admin changed the list since the job was
    submitted) is left out of the credentials: its node cannot reach it."""
    prefix = team_prefix(settings, team)
    out = []
    for remote, source in spec.file_mounts.items():
        if isinstance(source, WorkdirUpload):
            ref = uploads.code_ref(settings, team, source.upload)
            kind = "file" if isinstance(source, UploadMount) and source.file else "dir"
            out.append(Mount(remote, kind, ref.uri, sha256=ref.sha256))
            continue
        mode = source.mode if isinstance(source, StorageMount) else "COPY"
        if isinstance(source, StorageMount) and source.name is not None:
            out.append(Mount(remote, "bucket", bucket_uri(settings, team, source.name), mode=mode))
            continue
        uri = source.source if isinstance(source, StorageMount) else source
        listed = holding(allow, uri)
        # The team's own prefix holds its checkpoints: mounted, it is read; its jobs write their own attempts.
        read_only = uri.startswith(prefix) and not uri.startswith(f"{prefix}buckets/") \
            or (listed is not None and listed.read_only)
        if uri.startswith(prefix) or listed is not None:
            out.append(Mount(remote, "bucket", uri, mode=mode, read_only=read_only))
    return out
