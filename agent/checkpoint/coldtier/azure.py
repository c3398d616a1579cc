"""Azure's cold tier: a block blob set to the Archive access tier (Set Blob
Tier). An archived blob cannot be read (409 BlobArchived) until it is
rehydrated: Set Blob Tier ``Hot`` with a rehydrate priority (Standard: up
to 15 hours; High: under one for small blobs), after which it is Hot again.

Credentials and endpoint from the environment, with the names the storage
layer (obstore) reads: ``AZURE_STORAGE_CONNECTION_STRING``; else the account
``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` (or, with
no key, azure-identity's DefaultAzureCredential) at
``https://{account}.blob.core.windows.net`` (``AZURE_STORAGE_ENDPOINT``
overrides it); ``AZURE_STORAGE_USE_EMULATOR=true`` speaks to Azurite at
``AZURITE_BLOB_STORAGE_URL`` (http://127.0.0.1:10000 by default)."""
from __future__ import annotations

import os
from typing import Any

from spotbroker.agent.checkpoint.coldtier import Tier

# Azurite's documented development account (public, the same in every copy).
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _service() -> Any:
    from azure.storage.blob import BlobServiceClient

    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection:
        return BlobServiceClient.from_connection_string(connection)
    emulator = os.environ.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true", "yes")
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or (EMULATOR_ACCOUNT if emulator else None)
    if not account:
        raise RuntimeError("az:// cold tier: set AZURE_STORAGE_ACCOUNT_NAME (or AZURE_STORAGE_CONNECTION_STRING)")
    if emulator:
        url = os.environ.get("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10000").rstrip("/") + f"/{account}"
    else:
        url = os.environ.get("AZURE_STORAGE_ENDPOINT") or f"https://{account}.blob.core.windows.net"
    key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY") or (EMULATOR_KEY if emulator else None)
    if key:
        credential: Any = {"account_name": account, "account_key": key}
    else:
        from azure.identity import DefaultAzureCredential
        credential = DefaultAzureCredential()
    return BlobServiceClient(url, credential=credential)


class AzureColdTier:
    cold_class = "Archive"
    standard_class = "Hot"
    needs_restore = True

    def __init__(self, container: str, root: str) -> None:
        self.root = root
        self.container = _service().get_container_client(container)

    def _blob(self, key: str) -> Any:
        return self.container.get_blob_client("/".join(p for p in (self.root, key.strip("/")) if p))

    def keys(self) -> list[str]:
        prefix = f"{self.root}/" if self.root else ""
        return [b.name[len(prefix):] for b in self.container.list_blobs(name_starts_with=prefix)]

    def tier(self, key: str) -> Tier:
        props = self._blob(key).get_blob_properties()
        tier = props.blob_tier or self.standard_class
        return Tier(tier, restoring=(props.archive_status or "").startswith("rehydrate-pending"),
                    readable=tier != self.cold_class)

    def archive(self, key: str) -> None:
        self._blob(key).set_standard_blob_tier(self.cold_class)

    def restore(self, key: str, days: int = 7, speed: str = "Standard") -> None:
        """Rehydrate to Hot (asked once: a rehydration under way is left to run).
        `days` does not apply: a rehydrated blob stays Hot until archived again."""
        if self.tier(key).restoring:
            return
        self._blob(key).set_standard_blob_tier(self.standard_class,
                                               rehydrate_priority="High" if speed == "Expedited" else "Standard")

    def warm(self, key: str) -> None:
        if self.tier(key).storage_class != self.standard_class:
            self._blob(key).set_standard_blob_tier(self.standard_class)
