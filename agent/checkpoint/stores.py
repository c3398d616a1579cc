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
from typing import Any

from obstore.store import LocalStore, S3Store, from_url

from spotbroker.agent.credentials import node_store


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
        endpoint, region = place.get("endpoint"), place.get("region")
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
    if scheme == "file":
        # automatic_cleanup removes directories left empty by a delete.
        return LocalStore(path, automatic_cleanup=True)
    # On a node, the attempt's checkpoint bucket: its scoped credentials, where the broker said.
    node = node_store(scheme, bucket)
    provider = {"credential_provider": node["credential_provider"]} if node else {}
    if scheme == "s3":
        return S3Store(bucket, prefix=path or None, **_s3_options(node["options"] if node else None), **provider)
    # gs:// and az:// otherwise take their credentials and accounts from the
    # standard environment (GOOGLE_*, AZURE_STORAGE_*), as obstore documents them.
    options: dict[str, Any] = dict(provider)
    endpoint = node["options"].get("endpoint") if node else os.environ.get("GOOGLE_BASE_URL")
    if scheme == "gs" and endpoint:
        if node:
            options["base_url"] = endpoint
        if endpoint.startswith("http://"):
            options["client_options"] = {"allow_http": True}  # a local stand-in
    return from_url(f"{scheme}://{bucket}/{path}".rstrip("/"), **options)
