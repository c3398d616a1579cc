"""An az:// root: a node's storage credentials are SAS tokens, one per place.

Azure has no policy document to narrow a token with. The least scope it
offers for a prefix is a *directory* SAS (``sr=d``, with ``sdd``: the
directory's depth), which an account with hierarchical namespace (ADLS
Gen2) honours on the Blob endpoint too: it reaches that directory and what
is below it, and nothing else. A container SAS (``sr=c``) cannot be limited
to a prefix, so it would hand a node every team's checkpoints; it is never
minted. So a node gets one token per place it may touch:

* the attempt's directory: read, add, create, write, delete, list;
* the job's directory: read and list (resume from an earlier attempt);
* each upload the job names: read, that blob only (``sr=b``).

The checkpoint library picks, for each request, the token whose place holds
the object (`agent/checkpoint/stores.py`). They are signed with the storage
account's key (a service SAS), the broker's own, which never leaves it; the
broker finds the account as the storage layer does (obstore's variables:
``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_ENDPOINT``; ``AZURE_STORAGE_USE_EMULATOR`` for Azurite). A
token lasts ``SPOTBROKER_NODE_CREDENTIALS_SECONDS`` and is renewed like the
other clouds' credentials. Signing with a user delegation key (Microsoft
Entra ID instead of the account key) is not done: without a key, the launch
is refused, saying what to set.
"""
from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotbroker.broker.launch.storage_credentials import NodeCredentials, Scope
    from spotbroker.broker.settings import Settings

# Azurite's documented development account (public, the same in every copy).
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def account() -> tuple[str | None, str | None, str | None]:
    """(account name, account key, endpoint or None for Azure's own) from the
    broker's environment, with the names obstore and the cold tier read."""
    if os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        parts = dict(part.split("=", 1) for part in os.environ["AZURE_STORAGE_CONNECTION_STRING"].split(";")
                     if "=" in part)
        return parts.get("AccountName"), parts.get("AccountKey"), parts.get("BlobEndpoint")
    emulator = os.environ.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true", "yes")
    name = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or (EMULATOR_ACCOUNT if emulator else None)
    key = next((os.environ[k] for k in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY",
                                        "AZURE_STORAGE_MASTER_KEY") if os.environ.get(k)),
               EMULATOR_KEY if emulator else None)
    endpoint = os.environ.get("AZURE_STORAGE_ENDPOINT") or os.environ.get("AZURE_ENDPOINT")
    if emulator and not endpoint:
        endpoint = os.environ.get("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10000").rstrip("/") + f"/{name}"
    return name, key, endpoint


def mint(settings: Settings, scope: Scope) -> NodeCredentials:
    """One SAS per place `scope` allows (the module's doc), all ending together."""
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    from spotbroker.broker.launch.storage_credentials import NoCredentials, NodeCredentials

    name, key, endpoint = account()
    if not name or not key:
        raise NoCredentials(
            f"the checkpoint root {settings.checkpoint_uri} is in Azure, and nodes get only SAS tokens scoped to "
            "their own job's directories, signed with the storage account's key: set AZURE_STORAGE_ACCOUNT_NAME "
            "and AZURE_STORAGE_ACCOUNT_KEY (see docs/skypilot.md, 'Storage credentials'); the broker never "
            "hands out the key itself")
    expires = (datetime.now(UTC) + timedelta(seconds=settings.node_credentials_seconds)).replace(microsecond=0)
    write = BlobSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True)
    places = {scope.write: write, scope.read: BlobSasPermissions(read=True, list=True)}
    for grant in scope.mounts:  # its file mounts' directories: in the checkpoint root's container only
        if grant.bucket != scope.bucket or not grant.prefix:
            raise NoCredentials(f"a file mount of az://{grant.bucket}/{grant.prefix}: on Azure, nodes get "
                                f"directory SAS tokens in the checkpoint root's container ({scope.bucket}) only")
        places.setdefault(grant.prefix, BlobSasPermissions(read=True, list=True) if grant.read_only else write)
    tokens = {}
    for directory, permission in places.items():  # never the container: team/job[/attempt] at least
        tokens[directory] = generate_blob_sas(name, scope.bucket, directory.rstrip("/"), account_key=key,
                                              permission=permission, expiry=expires, is_directory=True)
    for blob in scope.objects:
        tokens[blob] = generate_blob_sas(name, scope.bucket, blob, account_key=key,
                                         permission=BlobSasPermissions(read=True), expiry=expires)
    return NodeCredentials("az", expires, scope.bucket, {"account": name, **({"endpoint": endpoint} if endpoint
                                                                            else {})}, tokens)
