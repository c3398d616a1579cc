"""The cold tier of checkpoint storage: an object moved to an archival S3
storage class (GLACIER, DEEP_ARCHIVE) costs a fraction of STANDARD per
GB-month, and must be restored before it can be read again.

obstore (the storage layer's client) does not speak storage classes or
restores, so this uses boto3, which reads the same standard AWS environment
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` included, path-style then,
as the storage layer does)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from spotbroker.agent.checkpoint.storage import Storage

# S3 storage classes whose objects must be restored before they can be read.
COLD_CLASSES = ("GLACIER", "DEEP_ARCHIVE")


@dataclass(frozen=True)
class Tier:
    """An object's storage class (``STANDARD`` when S3 names none) and, for a
    cold one, whether a restored copy is readable now (``restoring``: asked
    for, not ready)."""

    storage_class: str
    restoring: bool = False
    readable: bool = True


def _s3_client() -> Any:
    """boto3 for what obstore does not speak (storage classes, restores);
    it reads the same standard AWS environment, endpoint included."""
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint or None,
                        config=Config(s3={"addressing_style": "path"} if endpoint else {},
                                      retries={"max_attempts": 3}))


class ColdTier:
    """Moving a storage root's objects between S3 storage classes: a copy of
    the object onto itself with another class (what S3 lifecycle rules do,
    done by the broker so that it knows which checkpoints are cold), and a
    restore of a cold object before it is read again. Only ``s3://``: GCS's
    Archive and Azure's Archive tier are not built (NotImplementedError says so)."""

    def __init__(self, storage: Storage) -> None:
        if storage.scheme != "s3":
            raise NotImplementedError(f"the cold tier is built for s3:// only, not {storage.scheme}://")
        self.bucket, self.root = storage.location
        self.client = _s3_client()

    def _key(self, key: str) -> str:
        return "/".join(p for p in (self.root, key.strip("/")) if p)

    def tier(self, key: str) -> Tier:
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        cls, restore = head.get("StorageClass") or "STANDARD", head.get("Restore") or ""
        if cls not in COLD_CLASSES:
            return Tier(cls)
        ready = 'ongoing-request="false"' in restore
        return Tier(cls, restoring='ongoing-request="true"' in restore, readable=ready)

    def move(self, key: str, storage_class: str) -> None:
        """Copy ``key`` onto itself in ``storage_class`` (a cold object must be
        restored first to move it back)."""
        full = self._key(key)
        self.client.copy_object(Bucket=self.bucket, Key=full, CopySource={"Bucket": self.bucket, "Key": full},
                                StorageClass=storage_class, MetadataDirective="COPY")

    def restore(self, key: str, days: int = 7, speed: str = "Standard") -> None:
        """Ask for a readable copy of a cold object for ``days`` (S3 answers
        409 RestoreAlreadyInProgress to a second ask: not an error here)."""
        try:
            self.client.restore_object(Bucket=self.bucket, Key=self._key(key), RestoreRequest={
                "Days": days, "GlacierJobParameters": {"Tier": speed}})
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") != "RestoreAlreadyInProgress":
                raise

