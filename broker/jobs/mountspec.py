"""What a job's `workdir` and `file_mounts` may name, as the job spec
(`spec.py`) takes them: an upload of the team's, a bucket by name, or a
storage URI (where each comes from: `mounts.py`)."""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class WorkdirUpload(_Strict):
    """The job's working directory: an archive uploaded first (`PUT /v1/uploads/{sha256}`)."""

    upload: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="the sha256 of the uploaded archive")]


_MOUNT_URI_RE = re.compile(r"^(s3|gs|az|r2|cos|oci)://[^/?#]+(/[^?#]*)?\Z")


def storage_uri(value: str) -> str:
    """A file mount's source: a storage URI, never a path on the broker's host."""
    if not _MOUNT_URI_RE.match(value):
        raise ValueError(f"{value!r} is not a storage URI (s3://BUCKET/PATH, gs://, az://): a path would name the "
                         "broker's host; upload the directory (`spotbroker submit FILE` does it for you)")
    if "$" in value or any(part in (".", "..") for part in value.split("://", 1)[1].split("/")):
        raise ValueError(f"{value!r}: give the URI itself, without '.', '..' or '$'")
    return value


class UploadMount(WorkdirUpload):
    """A local directory, or with `file: true` one file, that `spotbroker
    submit` packed and uploaded: fetched, checked and placed at its path on
    every node before `setup` (agent/mounts.py)."""

    file: Literal[True] | None = Field(None, description="the archive holds one file, placed at the path itself")


BUCKET_NAME = r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$"  # a bucket name any of the clouds takes


class StorageMount(_Strict):
    """A bucket path mounted (or copied) on the node: SkyPilot's
    `file_mounts: {/data: {source: s3://..., mode: MOUNT}}`, or a bucket by
    its `name` (`{name: my-ckpts}`), which the broker keeps under the team's
    own storage (broker/jobs/mounts.py)."""

    source: str | None = None
    name: Annotated[str, Field(description=(
        "a bucket of your team's: the broker keeps it at {root}/{team}/buckets/{name}/, the same for every job "
        "of the team; 3-63 of a-z 0-9 . _ -, a letter or digit at each end"))] | None = None
    mode: Literal["MOUNT", "COPY", "MOUNT_CACHED"] = "MOUNT"
    # SkyPilot's: which cloud would hold the bucket, and whether it outlives the task. The
    # broker's storage holds a named bucket, for good: a different wish is refused.
    store: Literal["s3", "gcs", "azure"] | None = None
    persistent: Literal[True] | None = None

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        return None if value is None else storage_uri(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(BUCKET_NAME, value):
            empty = " (empty: was it an env variable left unset? `spotbroker submit --env NAME=VALUE`)" \
                if not value else ""
            raise ValueError(f"bucket name {value!r}{empty}: 3-63 characters of a-z 0-9 . _ -, "
                             "a letter or digit at each end (lower case)")
        return value

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("store", mode="before")
    @classmethod
    def _store(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_of(self) -> StorageMount:
        if (self.source is None) == (self.name is None):
            raise ValueError("give a bucket's name (your team's: the broker keeps it) or a source URI, one of the two")
        return self


FileMount = UploadMount | StorageMount | str
