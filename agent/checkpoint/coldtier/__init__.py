"""The cold tier of checkpoint storage: objects moved to a cloud's archival
class cost a fraction of the standard one per GB-month, and (on S3 and
Azure) must be restored before they can be read again.

One interface, one module per cloud (the storage layer's client, obstore,
speaks none of this):

- ``s3://`` (``s3``, boto3): copied onto itself in ``GLACIER`` or
  ``DEEP_ARCHIVE``; restored with RestoreObject (hours), then copied back
  to ``STANDARD``;
- ``gs://`` (``gcs``, the JSON API): rewritten onto itself in ``ARCHIVE``;
  read at once (no restore), rewritten back to ``STANDARD`` on resume;
- ``az://`` (``azure``, azure-storage-blob): Set Blob Tier ``Archive``;
  rehydrated by Set Blob Tier ``Hot`` with a priority (hours).

Each reads its cloud's standard environment for credentials and endpoints
(so a local emulator works with no code change); see each module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import _scheme_and_path


@dataclass(frozen=True)
class Tier:
    """An object's storage class in its cloud's words and whether it can be
    read now (``restoring``: a restore was asked for and is not done)."""

    storage_class: str
    restoring: bool = False
    readable: bool = True


class ColdTier(Protocol):
    """What the broker asks of a checkpoint's storage root (keys are
    relative to it)."""

    cold_class: str       # the class `archive` moves objects to
    standard_class: str   # the class `warm` moves them back to
    needs_restore: bool   # cold objects cannot be read before a restore

    def keys(self) -> list[str]:
        """Every object under the root."""

    def tier(self, key: str) -> Tier: ...

    def archive(self, key: str) -> None:
        """Move the object to the cold class."""

    def restore(self, key: str, days: int, speed: str) -> None:
        """Ask for the object to become readable (idempotent). `speed` is
        S3's Expedited/Standard/Bulk; Azure maps Expedited to High."""

    def warm(self, key: str) -> None:
        """Move a readable object back to the standard class."""


def data_keys(cold: ColdTier) -> list[str]:
    """A checkpoint's objects but its manifest, which stays in the standard
    class so what the checkpoint holds can still be read and verified."""
    return [k for k in cold.keys() if k != protocol.MANIFEST]


def cold_tier(uri: str, s3_class: str = "GLACIER") -> ColdTier:
    """The cold tier of the storage root `uri`; NotImplementedError for a
    local disk (there is nothing cheaper to move it to)."""
    scheme, bucket, path = _scheme_and_path(uri)
    if scheme == "s3":
        from spotbroker.agent.checkpoint.coldtier.s3 import S3ColdTier
        return S3ColdTier(bucket, path, s3_class)
    if scheme == "gs":
        from spotbroker.agent.checkpoint.coldtier.gcs import GcsColdTier
        return GcsColdTier(bucket, path)
    if scheme == "az":
        from spotbroker.agent.checkpoint.coldtier.azure import AzureColdTier
        return AzureColdTier(bucket, path)
    raise NotImplementedError(f"{scheme}:// has no cold tier")
