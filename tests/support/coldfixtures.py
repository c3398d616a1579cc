"""GCS and Azure Blob for the cold tier's tests, over real HTTP on loopback.

- Azure: Azurite, Microsoft's emulator (npm; `make test` installs it under
  .tools/azurite, scripts/ensure-azurite), one per test session, in memory.
- GCS: no emulator keeps storage classes through a rewrite, so a small fake
  of the JSON API calls the cold tier makes (objects.list, objects.get,
  objects.rewrite), in the real paths and shapes, checking each request as
  the real API would (a storage class it knows; a rewrite onto the same
  object; a rewrite token from its own previous answer).

Test modules import the fixtures by name::

    from support.coldfixtures import az_uri, azurite_endpoint, gcs_fake, gs_uri
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from spotbroker.agent.checkpoint.coldtier.azure import EMULATOR_ACCOUNT, EMULATOR_KEY
from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count(1)


# --- Azure: Azurite ------------------------------------------------------------------------


def _azurite() -> str | None:
    local = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory) -> Iterator[str]:
    binary = _azurite()
    if binary is None:
        message = "Azurite is not installed (make test installs it with npm: scripts/ensure-azurite)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)  # CI has the npm registry: a missing emulator is a broken set-up
        pytest.skip(message)
    port = free_port()
    log = tmp_path_factory.mktemp("azurite") / "azurite.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                                 "--skipApiVersionCheck", "--loose", "--silent"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Azurite did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def az_uri(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh container, with this process's Azure environment pointing at
    Azurite (as obstore and the cold tier read it): ``az://<container>``."""
    from azure.storage.blob import BlobServiceClient

    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURE_STORAGE_ACCOUNT_NAME": EMULATOR_ACCOUNT,
           "AZURE_STORAGE_ACCOUNT_KEY": EMULATOR_KEY, "AZURITE_BLOB_STORAGE_URL": azurite_endpoint}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    container = f"ckpt-{os.getpid()}-{next(_names)}"
    BlobServiceClient(f"{azurite_endpoint}/{EMULATOR_ACCOUNT}", credential={
        "account_name": EMULATOR_ACCOUNT, "account_key": EMULATOR_KEY}).create_container(container)
    return f"az://{container}"


# --- GCS: a fake of the JSON API's object calls ----------------------------------------------

CLASSES = {"STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"}
REWRITE_CHUNK = 1024 * 1024     # a larger object takes several rewrite calls, as on GCS
PAGE = 2                        # list pages are small, so the client must follow nextPageToken


class GcsFake:
    """Buckets of objects (name -> {data, storageClass, generation}) behind
    the JSON API, and every request it was sent."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, dict]] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.lock = threading.Lock()
        self._tokens: dict[str, tuple[str, str, str, int]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._answer(self, "GET")

            def do_POST(self) -> None:
                fake._answer(self, "POST")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def put(self, bucket: str, name: str, data: bytes) -> None:
        with self.lock:
            self.buckets.setdefault(bucket, {})[name] = {"data": data, "storageClass": "STANDARD", "generation": 1}

    def storage_class(self, bucket: str, name: str) -> str:
        return self.buckets[bucket][name]["storageClass"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # The API, as https://cloud.google.com/storage/docs/json_api/v1/objects describes it.

    @staticmethod
    def _resource(bucket: str, name: str, obj: dict) -> dict:
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(obj["data"])),
                "storageClass": obj["storageClass"], "generation": str(obj["generation"])}

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = None
        if method == "POST":
            raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
            body = json.loads(raw) if raw else {}
        self.requests.append((method, h.path, body))
        parts = url.path.split("/")   # raw: an object's name is one percent-encoded segment
        status, answer = 404, {"error": {"code": 404, "message": "Not Found"}}
        with self.lock:
            if parts[:4] == ["", "storage", "v1", "b"] and len(parts) == 6 and parts[5] == "o" and method == "GET":
                status, answer = self._list(unquote(parts[4]), query)
            elif parts[:4] == ["", "storage", "v1", "b"] and len(parts) == 7 and method == "GET":
                bucket, name = unquote(parts[4]), unquote(parts[6])
                obj = self.buckets.get(bucket, {}).get(name)
                if obj is not None:
                    status, answer = 200, self._fields(self._resource(bucket, name, obj), query.get("fields"))
            elif len(parts) == 12 and parts[7] == "rewriteTo" and method == "POST":
                status, answer = self._rewrite(unquote(parts[4]), unquote(parts[6]), unquote(parts[9]),
                                               unquote(parts[11]), query, body or {})
        data = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _fields(resource: dict, fields: str | None) -> dict:
        if not fields or "(" in fields:
            return resource
        return {k: v for k, v in resource.items() if k in fields.split(",")}

    def _list(self, bucket: str, query: dict) -> tuple[int, dict]:
        if bucket not in self.buckets:
            return 404, {"error": {"code": 404, "message": "The specified bucket does not exist."}}
        names = sorted(n for n in self.buckets[bucket] if n.startswith(query.get("prefix", "")))
        start = int(query.get("pageToken", "0"))
        page = {"kind": "storage#objects", "items": [{"name": n} for n in names[start:start + PAGE]]}
        if start + PAGE < len(names):
            page["nextPageToken"] = str(start + PAGE)
        return 200, page

    def _rewrite(self, bucket: str, name: str, dest_bucket: str, dest: str, query: dict,
                 body: dict) -> tuple[int, dict]:
        obj = self.buckets.get(bucket, {}).get(name)
        if obj is None:
            return 404, {"error": {"code": 404, "message": "No such object"}}
        wanted = body.get("storageClass", obj["storageClass"])
        if wanted not in CLASSES:
            return 400, {"error": {"code": 400, "message": f"Invalid storage class {wanted!r}"}}
        if (dest_bucket, dest) != (bucket, name):
            return 400, {"error": {"code": 400, "message": "this fake rewrites an object onto itself only"}}
        done = 0
        if "rewriteToken" in query:   # carries on the rewrite it was given for, and only that one
            saved = self._tokens.pop(query["rewriteToken"], None)
            if saved is None or saved[:3] != (bucket, name, wanted):
                return 400, {"error": {"code": 400, "message": "Invalid rewrite token"}}
            done = saved[3]
        done = min(len(obj["data"]), done + REWRITE_CHUNK)
        size = str(len(obj["data"]))
        if done < len(obj["data"]):
            token = f"t{len(self._tokens)}-{done}"
            self._tokens[token] = (bucket, name, wanted, done)
            return 200, {"kind": "storage#rewriteResponse", "totalBytesRewritten": str(done), "objectSize": size,
                         "done": False, "rewriteToken": token}
        obj["storageClass"], obj["generation"] = wanted, obj["generation"] + 1
        return 200, {"kind": "storage#rewriteResponse", "totalBytesRewritten": size, "objectSize": size,
                     "done": True, "resource": self._resource(bucket, name, obj)}


@pytest.fixture
def gcs_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsFake]:
    fake = GcsFake()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def gs_uri(gcs_fake: GcsFake) -> str:
    bucket = f"ckpt-{os.getpid()}-{next(_names)}"
    gcs_fake.buckets[bucket] = {}
    return f"gs://{bucket}"
