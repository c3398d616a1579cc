"""Opening obstore's store for a bucket: where it is and whose credentials.

Off a node, and for every bucket but the attempt's checkpoint bucket, the
standard environment decides, as obstore documents it (``AWS_*``,
``GOOGLE_*``, ``AZURE_STORAGE_*``). On a node launched with credentials
scoped to its job, the checkpoint bucket is reached with those and at the
endpoint and region the broker named (`spotbroker.agent.credentials`), never
with the user's own keys, and the user's own buckets never with them.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from obstore.store import AzureStore, GCSStore, LocalStore, S3Store, from_url

from spotbroker.agent.credentials import Document, NodeCredentials, node_store


def _s3_options(place: dict[str, str] | None = None) -> dict[str, Any]:
    """Endpoint and region: `place`'s (the broker's word for its checkpoint
    bucket), else the standard AWS environment's.

    obstore reads the credentials itself; an endpoint needs two extra
    settings that it does not derive: path-style requests and plain HTTP.
    """
    if place is None:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    else:
        region = place.get("region") or "us-east-1"
        # Always an endpoint: obstore would otherwise take one from the environment, where a
        # user's AWS_ENDPOINT_URL points at their own data store (R2, MinIO), not the checkpoints'.
        # S3's own is what obstore uses by default (path-style).
        suffix = ".cn" if region.startswith("cn-") else ""
        endpoint = place.get("endpoint") or f"https://s3.{region}.amazonaws.com{suffix}"
    options: dict[str, Any] = {}
    if endpoint:
        options["endpoint"] = endpoint
        options["virtual_hosted_style_request"] = False
        if endpoint.startswith("http://"):
            options["client_options"] = {"allow_http": True}
        elif "AWS_UNSIGNED_PAYLOAD" not in os.environ:
            options["unsigned_payload"] = True
    elif "AWS_UNSIGNED_PAYLOAD" not in os.environ:
        # Over HTTPS, TLS already protects the body (boto3 skips signing it
        # there too): hashing every byte for the signature would only cost CPU.
        options["unsigned_payload"] = True
    if region:
        options["region"] = region
    return options


def open_store(scheme: str, bucket: str, path: str) -> Any:
    """obstore's store for `path` in `bucket` (a `Places` on an Azure node)."""
    if scheme == "file":
        # automatic_cleanup removes directories left empty by a delete.
        return LocalStore(path, automatic_cleanup=True)
    node = node_store(scheme, bucket)
    if node is None:  # not the attempt's checkpoint bucket, or off a node: the standard environment
        if scheme == "s3":
            return S3Store(bucket, prefix=path or None, **_s3_options())
        local = os.environ.get("GOOGLE_BASE_URL", "").startswith("http://") and scheme == "gs"
        return from_url(f"{scheme}://{bucket}/{path}".rstrip("/"),
                        **({"client_options": {"allow_http": True}} if local else {}))
    # The attempt's checkpoint bucket on a node: its scoped credentials, where the broker said.
    if scheme == "s3":
        return S3Store(bucket, prefix=path or None, **_s3_options(node.options),
                       credential_provider=NodeCredentials("s3"))
    if scheme == "gs":  # always a base URL, as for S3: never the user's GOOGLE_BASE_URL
        endpoint = node.options.get("endpoint") or "https://storage.googleapis.com"
        return GCSStore(bucket, prefix=path or None, credential_provider=NodeCredentials("gs"), base_url=endpoint,
                        **_http(endpoint))
    return Places(bucket, path, node)


def _http(endpoint: str | None) -> dict[str, Any]:
    """Plain HTTP is for a local stand-in, and only when its endpoint says so."""
    return {"client_options": {"allow_http": True}} if endpoint and endpoint.startswith("http://") else {}


class Places:
    """An Azure node's checkpoint container. Its credentials are one SAS per
    place (a directory, or one blob: broker/launch/azure_sas.py), and obstore
    gives a store one credential, so there is one store per place, each
    rooted at the same path, made on first use; `for_key` is the one whose
    place holds the object. An object no place holds goes to the widest
    place's store, and Azure refuses it."""

    def __init__(self, container: str, root: str, held: Document) -> None:
        self.container = container
        self.root = root.strip("/")
        self.account = held.options.get("account")
        # Always an endpoint, as for S3: never the user's AZURE_STORAGE_ENDPOINT.
        self.endpoint = held.options.get("endpoint") or f"https://{self.account}.blob.core.windows.net"
        self.places = sorted(held.credentials, key=len, reverse=True)  # the narrowest first
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def place_of(self, key: str) -> str:
        """The place holding `key` (relative to the root; a listing's prefix ends with '/')."""
        full = f"{self.root}/{key}" if self.root else key
        return next((p for p in self.places if (full.startswith(p) if p.endswith("/") else full == p)),
                    self.places[-1])

    def for_key(self, key: str) -> Any:
        place = self.place_of(key)
        with self._lock:
            store = self._stores.get(place)
            if store is None:
                store = self._stores[place] = AzureStore(
                    self.container, prefix=self.root or None, account_name=self.account, use_emulator=False,
                    credential_provider=NodeCredentials("az", place), endpoint=self.endpoint, **_http(self.endpoint))
            return store
