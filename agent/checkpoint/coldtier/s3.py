"""S3's cold tier: an object copied onto itself in an archival storage class
(GLACIER, DEEP_ARCHIVE), restored with RestoreObject before it can be read,
then copied back to STANDARD.

boto3 reads the same standard AWS environment as the storage layer
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` included, path-style then)."""
from __future__ import annotations

import os
from typing import Any

from spotbroker.agent.checkpoint.coldtier import Tier

# S3 storage classes whose objects must be restored before they can be read.
COLD_CLASSES = ("GLACIER", "DEEP_ARCHIVE")


def _client() -> Any:
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint or None,
                        config=Config(s3={"addressing_style": "path"} if endpoint else {},
                                      retries={"max_attempts": 3}))


class S3ColdTier:
    standard_class = "STANDARD"
    needs_restore = True

    def __init__(self, bucket: str, root: str, cold_class: str = "GLACIER") -> None:
        if cold_class not in COLD_CLASSES:
            raise ValueError(f"S3 cold class {cold_class!r}: use one of {', '.join(COLD_CLASSES)}")
        self.bucket, self.root, self.cold_class = bucket, root, cold_class
        self.client = _client()

    def _key(self, key: str) -> str:
        return "/".join(p for p in (self.root, key.strip("/")) if p)

    def keys(self) -> list[str]:
        prefix = f"{self.root}/" if self.root else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
        return out

    def tier(self, key: str) -> Tier:
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        cls, restore = head.get("StorageClass") or "STANDARD", head.get("Restore") or ""
        if cls not in COLD_CLASSES:
            return Tier(cls)
        return Tier(cls, restoring='ongoing-request="true"' in restore,
                    readable='ongoing-request="false"' in restore)

    def _copy(self, key: str, storage_class: str) -> None:
        full = self._key(key)
        self.client.copy_object(Bucket=self.bucket, Key=full, CopySource={"Bucket": self.bucket, "Key": full},
                                StorageClass=storage_class, MetadataDirective="COPY")

    def archive(self, key: str) -> None:
        self._copy(key, self.cold_class)

    def restore(self, key: str, days: int = 7, speed: str = "Standard") -> None:
        """S3 answers 409 RestoreAlreadyInProgress to a second ask: not an error here."""
        try:
            self.client.restore_object(Bucket=self.bucket, Key=self._key(key), RestoreRequest={
                "Days": days, "GlacierJobParameters": {"Tier": speed}})
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") != "RestoreAlreadyInProgress":
                raise

    def warm(self, key: str) -> None:
        self._copy(key, self.standard_class)
