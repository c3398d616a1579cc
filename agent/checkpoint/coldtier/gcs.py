"""GCS's cold tier: an object rewritten onto itself in the ARCHIVE storage
class (``objects.rewrite`` of the JSON API: an object's class cannot be
patched). Archive objects are read at once, at a retrieval fee, so a resume
needs no restore: the broker rewrites them back to STANDARD before it
launches.

The endpoint is ``https://storage.googleapis.com`` with Application Default
Credentials (google-auth), or ``STORAGE_EMULATOR_HOST`` (the variable
Google's own clients read), which is spoken to without credentials."""
from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import quote

import httpx

from spotbroker.agent.checkpoint.coldtier import Tier

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
TIMEOUT = 60.0


class _Auth(httpx.Auth):
    """A bearer token from Application Default Credentials, refreshed when stale."""

    def __init__(self) -> None:
        import google.auth

        self.credentials, _ = google.auth.default(scopes=[SCOPE])
        self.lock = threading.Lock()

    def auth_flow(self, request: httpx.Request):
        from google.auth.transport.requests import Request

        with self.lock:
            if not self.credentials.valid:
                self.credentials.refresh(Request())
            request.headers["Authorization"] = f"Bearer {self.credentials.token}"
        yield request


class GcsColdTier:
    cold_class = "ARCHIVE"
    standard_class = "STANDARD"
    needs_restore = False   # Archive is read at once

    def __init__(self, bucket: str, root: str) -> None:
        self.bucket, self.root = bucket, root
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        base = emulator if emulator else "https://storage.googleapis.com"
        if "://" not in base:
            base = f"http://{base}"
        self.http = httpx.Client(base_url=base.rstrip("/") + "/storage/v1", timeout=TIMEOUT,
                                 auth=None if emulator else _Auth())

    def _object(self, key: str) -> str:
        name = "/".join(p for p in (self.root, key.strip("/")) if p)
        return f"/b/{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"

    def _json(self, method: str, url: str, **kw: Any) -> dict[str, Any]:
        r = self.http.request(method, url, **kw)
        r.raise_for_status()
        return r.json()

    def keys(self) -> list[str]:
        prefix = f"{self.root}/" if self.root else ""
        out, token = [], None
        while True:
            params = {"prefix": prefix, "fields": "items(name),nextPageToken"}
            if token:
                params["pageToken"] = token
            page = self._json("GET", f"/b/{quote(self.bucket, safe='')}/o", params=params)
            out += [item["name"][len(prefix):] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return out

    def tier(self, key: str) -> Tier:
        meta = self._json("GET", self._object(key), params={"fields": "storageClass"})
        return Tier(meta.get("storageClass") or self.standard_class)

    def _rewrite(self, key: str, storage_class: str) -> None:
        """Rewrite the object onto itself in `storage_class`; a large object
        takes several calls, each carrying on with the token of the last."""
        url = f"{self._object(key)}/rewriteTo{self._object(key)}"
        token = None
        while True:
            params = {"rewriteToken": token} if token else {}
            answer = self._json("POST", url, params=params, json={"storageClass": storage_class})
            if answer.get("done"):
                return
            token = answer["rewriteToken"]

    def archive(self, key: str) -> None:
        self._rewrite(key, self.cold_class)

    def restore(self, key: str, days: int = 7, speed: str = "Standard") -> None:
        """Nothing to ask: an Archive object is readable as it is."""

    def warm(self, key: str) -> None:
        if self.tier(key).storage_class != self.standard_class:
            self._rewrite(key, self.standard_class)
