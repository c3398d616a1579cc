"""A local stand-in for Azure Blob Storage on an account with hierarchical
namespace, for what Azurite cannot judge: directory SAS tokens (``sr=d``).
Real HTTP, the Blob endpoint's paths and shapes as obstore speaks them,
path-style (``/{account}/{container}/{blob}``, as Azurite's):

* Put Blob, Put Block and Put Block List; Get Blob (ranged too) and Get
  Blob Properties; Delete Blob; List Blobs (``restype=container&comp=list``,
  ``prefix``); Blob Batch (``comp=batch``: deletes), each sub-request
  authorized on its own.

What it enforces, on every request: a service SAS in the query, signed with
the account's key over the documented string-to-sign (the fields from
``sp`` to ``rsct``; a user delegation SAS is refused), not expired (``se``,
``st``). The signed resource decides the canonical resource the signature
must match: ``sr=b`` the blob requested; ``sr=d`` the directory made of the
first ``sdd`` segments of the blob requested (or of a listing's
``prefix``), so a token signed for one directory has a wrong signature
anywhere else, as on Azure; ``sr=c`` the container. Then the permission the
operation needs: ``r`` to read, ``l`` to list, ``c`` or ``w`` to create,
``w`` to overwrite, ``d`` to delete.

What it does not: shared-key requests (the tests write what the broker
would with the account's key straight into ``objects``); ``sip``, ``spr``,
stored access policies (``si``), snapshots, leases, ACLs; a batch's outer
request (whether Azure lets it carry a directory SAS is not known here: the
fake wants a SAS on it and judges each deletion in it by its own SAS).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

ACCOUNT = "ckptaccount"
# The fields of a service SAS's string-to-sign after the canonical resource, in order (version 2020-12-06 on).
_AFTER_RESOURCE = ("si", "sip", "spr", "sv", "sr", "sst", "ses", "rscc", "rscd", "rsce", "rscl", "rsct")
_DELEGATION = ("skoid", "sktid", "skt", "ske", "sks", "skv")


class Refused(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status, self.code = status, code


@dataclass
class AzureFake:
    port: int = 0
    account: str = ACCOUNT
    key: str = field(default_factory=lambda: base64.b64encode(secrets.token_bytes(64)).decode())
    objects: dict[tuple[str, str], bytes] = field(default_factory=dict)     # (container, blob) -> bytes
    blocks: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # uncommitted blocks
    requests: list[tuple[str, str, str]] = field(default_factory=list)      # (operation, blob or prefix, sr)

    # --- the SAS -----------------------------------------------------------------------------

    def authorize(self, query: dict[str, str], container: str, path: str, permission: str,
                  listing: bool = False) -> str:
        """The signed resource of a valid SAS allowing `permission` on the blob
        `path` (a listing's prefix when `listing`), or Refused."""
        if "sig" not in query or "sv" not in query:
            raise Refused(403, "NoAuthenticationInformation")
        if any(k in query for k in _DELEGATION):
            raise Refused(403, "AuthenticationFailed")  # user delegation SAS: not judged here
        now = datetime.now(UTC)
        expiry = datetime.fromisoformat(query.get("se", "").replace("Z", "+00:00") or "1970-01-01T00:00:00+00:00")
        start = query.get("st")
        if expiry <= now or (start and datetime.fromisoformat(start.replace("Z", "+00:00")) > now):
            raise Refused(403, "AuthenticationFailed")
        signed = query.get("sr")
        parts = path.rstrip("/").split("/") if path.strip("/") else []
        depth = int(query.get("sdd") or 0)
        if signed == "b" and path and not listing:
            resource = f"{container}/{path}"
        elif signed == "d" and depth >= 1 and (len(parts) >= depth if listing else len(parts) > depth):
            resource = f"{container}/" + "/".join(parts[:depth])  # the directory: the first sdd segments
        elif signed == "c":
            resource = container
        else:
            raise Refused(403, "AuthenticationFailed")
        fields = [query.get("sp", ""), query.get("st", ""), query.get("se", ""),
                  f"/blob/{self.account}/{resource}", *(query.get(k, "") for k in _AFTER_RESOURCE)]
        digest = hmac.new(base64.b64decode(self.key), "\n".join(fields).encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(base64.b64encode(digest).decode(), query["sig"]):
            raise Refused(403, "AuthenticationFailed")
        if not set(permission) & set(query.get("sp", "")):
            raise Refused(403, "AuthorizationPermissionMismatch")
        return signed

    # --- the server --------------------------------------------------------------------------

    def start(self) -> AzureFake:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in {"x-ms-request-id": str(uuid.uuid4()), "x-ms-version": "2023-11-03",
                                    "content-length": str(len(body)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _refuse(self, refused: Refused) -> None:
                body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{refused.code}</Code>'
                        "<Message>refused by the fake</Message></Error>").encode()
                self._answer(refused.status, body, {"content-type": "application/xml",
                                                    "x-ms-error-code": refused.code})

            def _target(self) -> tuple[str, str, dict[str, str]]:
                url = urlsplit(self.path)
                account, _, rest = url.path.lstrip("/").partition("/")
                container, _, blob = rest.partition("/")
                if account != fake.account:
                    raise Refused(400, "InvalidUri")
                return container, unquote(blob), {k: v[0] for k, v in parse_qs(url.query).items()}

            def _body(self) -> bytes:
                n = int(self.headers.get("content-length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self) -> None:
                body = self._body()
                try:
                    container, blob, query = self._target()
                    status, payload, headers = fake.serve(self.command, container, blob, query, body,
                                                          dict(self.headers.items()))
                except Refused as refused:
                    return self._refuse(refused)
                self._answer(status, payload, headers)

            do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def endpoint(self) -> str:
        """What obstore's `endpoint` (and AZURE_STORAGE_ENDPOINT) name: the account's Blob endpoint."""
        return f"http://127.0.0.1:{self.port}/{self.account}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the operations ----------------------------------------------------------------------

    def serve(self, method: str, container: str, blob: str, query: dict[str, str], body: bytes,
              headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        lower = {k.lower(): v for k, v in headers.items()}
        if method == "POST" and query.get("comp") == "batch":
            if "sig" not in query:
                raise Refused(403, "NoAuthenticationInformation")
            return self._batch(container, body, lower.get("content-type", ""))
        if not blob:
            if method == "GET" and query.get("comp") == "list":
                prefix = query.get("prefix", "")
                signed = self.authorize(query, container, prefix, "l", listing=True)
                self.requests.append(("list", prefix, signed))
                return self._listing(container, prefix)
            raise Refused(400, "UnsupportedOperation")
        if method in ("GET", "HEAD"):
            signed = self.authorize(query, container, blob, "r")
            self.requests.append(("read", blob, signed))
            return self._read(container, blob, lower.get("range") or lower.get("x-ms-range"), method)
        if method == "PUT":
            exists = (container, blob) in self.objects
            signed = self.authorize(query, container, blob, "w" if exists else "cw")
            self.requests.append(("write", blob, signed))
            if query.get("comp") == "block":
                self.blocks[(container, blob, query["blockid"])] = body
            elif query.get("comp") == "blocklist":
                ids = re.findall(r"<(?:Uncommitted|Latest|Committed)>([^<]*)</", body.decode())
                self.objects[(container, blob)] = b"".join(self.blocks.pop((container, blob, i)) for i in ids)
            else:
                self.objects[(container, blob)] = body
            return 201, b"", {"etag": '"0x1"', "last-modified": _http_date()}
        if method == "DELETE":
            signed = self.authorize(query, container, blob, "d")
            self.requests.append(("delete", blob, signed))
            if self.objects.pop((container, blob), None) is None:
                raise Refused(404, "BlobNotFound")
            return 202, b"", {}
        raise Refused(400, "UnsupportedOperation")

    def _read(self, container: str, blob: str, wanted: str | None, method: str) -> tuple[int, bytes, dict]:
        data = self.objects.get((container, blob))
        if data is None:
            raise Refused(404, "BlobNotFound")
        headers = {"etag": '"0x1"', "last-modified": _http_date(), "content-type": "application/octet-stream",
                   "x-ms-blob-type": "BlockBlob"}
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted or "")
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2) or len(data) - 1), len(data) - 1)
            headers["content-range"] = f"bytes {start}-{end}/{len(data)}"
            return 206, data[start:end + 1], headers
        if method == "HEAD":
            return 200, b"", {**headers, "content-length": str(len(data))}
        return 200, data, headers

    def _listing(self, container: str, prefix: str) -> tuple[int, bytes, dict]:
        names = sorted(b for c, b in self.objects if c == container and b.startswith(prefix))
        items = "".join(f"<Blob><Name>{n}</Name><Properties><Last-Modified>{_http_date()}</Last-Modified>"
                        f"<Etag>0x1</Etag><Content-Length>{len(self.objects[(container, n)])}</Content-Length>"
                        "<Content-Type>application/octet-stream</Content-Type>"
                        "<BlobType>BlockBlob</BlobType></Properties></Blob>" for n in names)
        body = (f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ContainerName="{container}">'
                f"<Prefix>{prefix}</Prefix><Blobs>{items}</Blobs><NextMarker /></EnumerationResults>")
        return 200, body.encode(), {"content-type": "application/xml"}

    def _batch(self, container: str, body: bytes, ctype: str) -> tuple[int, bytes, dict]:
        boundary = ctype.split("boundary=", 1)[1].strip('"')
        answers = []
        for index, part in enumerate(p for p in body.split(f"--{boundary}".encode()) if b" HTTP/1.1" in p):
            request_line = re.search(rb"(DELETE) (\S+) HTTP/1.1", part)
            try:
                if request_line is None:
                    raise Refused(400, "InvalidInput")
                url = urlsplit(request_line.group(2).decode())
                _, _, rest = url.path.lstrip("/").partition("/")
                sub_container, _, blob = rest.partition("/")
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if sub_container != container:
                    raise Refused(400, "InvalidInput")
                status, _, _ = self.serve("DELETE", container, unquote(blob), query, b"", {})
                line, extra = f"HTTP/1.1 {status} Accepted", "x-ms-delete-type-permanent: true\r\n"
            except Refused as refused:
                line, extra = f"HTTP/1.1 {refused.status} {refused.code}", f"x-ms-error-code: {refused.code}\r\n"
            answers.append(f"--batchresponse_{boundary}\r\nContent-Type: application/http\r\nContent-ID: {index}\r\n"
                           f"\r\n{line}\r\n{extra}x-ms-version: 2023-11-03\r\nContent-Length: 0\r\n\r\n")
        payload = ("".join(answers) + f"--batchresponse_{boundary}--\r\n").encode()
        return 202, payload, {"content-type": f"multipart/mixed; boundary=batchresponse_{boundary}"}


def _http_date() -> str:
    return format_datetime(datetime(2026, 10, 21, 7, 28, tzinfo=UTC), usegmt=True)
