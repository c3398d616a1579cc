"""A local stand-in for the three Google endpoints a gs:// root's scoped
credentials go through, real HTTP in their real shapes:

* ``POST /token``: OAuth 2.0's JWT-bearer grant (a service account key
  file's ``token_uri``): the broker's own source token;
* ``POST /v1/token``: Google's STS token exchange (RFC 8693), as
  `google.oauth2.sts.Client` sends it for a downscoped token. It checks the
  request: the grant type, the subject token (the broker's own), the token
  types, and an ``accessBoundary`` whose rules all name a bucket resource;
  the token it issues carries that boundary;
* the Cloud Storage XML API as obstore speaks it (``PUT``/``GET`` (ranged
  too)/``HEAD``/``DELETE /{bucket}/{object}``, ``GET /{bucket}?list-type=2&prefix=``),
  enforcing the boundary of the token presented: a request is allowed when a
  rule whose role covers it (objectViewer: read and list; objectAdmin: also
  write and delete) has a condition that holds. Conditions are judged for
  the subset of CEL that Google documents for downscoping
  (``resource.name.startsWith('…')``, ``resource.name == '…'``,
  ``api.getAttribute('storage.googleapis.com/objectListPrefix', '')
  .startswith('…')``, joined with ``||``); anything else is refused loudly,
  so a boundary the fake cannot judge fails the test rather than passing.
  The broker's own source token may do anything.
"""
from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

SOURCE_TOKEN = "broker-source-token"
_TERM = re.compile(r"""\s*(resource\.name\.startsWith|resource\.name ==|"""
                   r"""api\.getAttribute\('storage\.googleapis\.com/objectListPrefix', ''\)\.startsWith)"""
                   r"""\(?\s*'([^']*)'\)?\s*""")


class Unjudgeable(ValueError):
    pass


def holds(expression: str, resource: str, list_prefix: str | None) -> bool:
    """Whether a condition holds for `resource` (and a listing's prefix)."""
    result = False
    for term in expression.split("||"):
        m = _TERM.fullmatch(term)
        if m is None:
            raise Unjudgeable(f"the fake cannot judge {term!r}")
        op, value = m.groups()
        if op == "resource.name.startsWith":
            result |= resource.startswith(value)
        elif op == "resource.name ==":
            result |= resource == value
        else:
            result |= list_prefix is not None and list_prefix.startswith(value)
    return result


@dataclass
class GoogleFake:
    port: int = 0
    objects: dict[tuple[str, str], bytes] = field(default_factory=dict)
    boundaries: dict[str, dict] = field(default_factory=dict)  # issued token -> its access boundary
    exchanges: list[dict] = field(default_factory=list)         # every STS request's form, as received
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # storage: (method, object or listing, token)

    def allowed(self, token: str, write: bool, bucket: str, name: str | None, list_prefix: str | None) -> bool:
        if token == SOURCE_TOKEN:
            return True
        boundary = self.boundaries.get(token)
        if boundary is None:
            return False
        resource = f"projects/_/buckets/{bucket}" + (f"/objects/{name}" if name is not None else "")
        for rule in boundary["accessBoundaryRules"]:
            if rule["availableResource"] != f"//storage.googleapis.com/projects/_/buckets/{bucket}":
                continue
            roles = rule["availablePermissions"]
            if write and "inRole:roles/storage.objectAdmin" not in roles:
                continue
            condition = rule.get("availabilityCondition")
            if condition is None or holds(condition["expression"], resource, list_prefix):
                return True
        return False

    def start(self) -> GoogleFake:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: bytes = b"", ctype: str = "application/json",
                        headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.send_header("etag", '"e"')
                self.send_header("last-modified", "Wed, 21 Oct 2026 07:28:00 GMT")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _body(self) -> bytes:
                n = int(self.headers.get("content-length") or 0)
                return self.rfile.read(n) if n else b""

            def do_POST(self):
                form = {k: v[0] for k, v in parse_qs(self._body().decode()).items()}
                if self.path == "/token":  # a service account's signed JWT for the broker's own token
                    ok = form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer" \
                        and form.get("assertion", "").count(".") == 2
                    return self._answer(200 if ok else 400, json.dumps(
                        {"access_token": SOURCE_TOKEN, "expires_in": 3600, "token_type": "Bearer"} if ok
                        else {"error": "invalid_grant"}).encode())
                if self.path == "/v1/token":
                    fake.exchanges.append(form)
                    options = json.loads(unquote(form.get("options") or "{}"))  # URL-quoted JSON, in the form
                    rules = options.get("accessBoundary", {}).get("accessBoundaryRules", [])
                    ok = (form.get("grant_type") == "urn:ietf:params:oauth:grant-type:token-exchange"
                          and form.get("subject_token") == SOURCE_TOKEN
                          and form.get("subject_token_type") == "urn:ietf:params:oauth:token-type:access_token"
                          and form.get("requested_token_type") == "urn:ietf:params:oauth:token-type:access_token"
                          and rules and all(r["availableResource"].startswith("//storage.googleapis.com/projects/_/"
                                                                               "buckets/") for r in rules))
                    if not ok:
                        return self._answer(400, b'{"error": "invalid_request"}')
                    token = "downscoped-" + secrets.token_hex(8)
                    fake.boundaries[token] = options["accessBoundary"]
                    return self._answer(200, json.dumps({
                        "access_token": token, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                        "token_type": "Bearer", "expires_in": 3600}).encode())
                return self._answer(501)

            def _storage(self, write: bool) -> None:
                url = urlparse(self.path)
                bucket, _, name = url.path.lstrip("/").partition("/")
                token = self.headers.get("authorization", "").removeprefix("Bearer ")
                query = parse_qs(url.query)
                fake.requests.append((self.command, unquote(name) or f"?prefix={query.get('prefix', [''])[0]}", token))
                if not name and self.command == "GET":  # a listing
                    prefix = query.get("prefix", [""])[0]
                    if not fake.allowed(token, False, bucket, None, prefix):
                        return self._answer(403, b"<Error><Code>AccessDenied</Code></Error>", "application/xml")
                    keys = sorted(k for b, k in fake.objects if b == bucket and k.startswith(prefix))
                    items = "".join(f"<Contents><Key>{k}</Key><Size>{len(fake.objects[(bucket, k)])}</Size>"
                                    "<LastModified>2026-10-21T07:28:00.000Z</LastModified><ETag>\"e\"</ETag>"
                                    "</Contents>" for k in keys)
                    body = (f"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>{bucket}</Name>"
                            f"<Prefix>{prefix}</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>"
                            f"<IsTruncated>false</IsTruncated>{items}</ListBucketResult>")
                    return self._answer(200, body.encode(), "application/xml")
                name = unquote(name)
                if not fake.allowed(token, write, bucket, name, None):
                    return self._answer(403, b"<Error><Code>AccessDenied</Code></Error>", "application/xml")
                if self.command == "PUT":
                    fake.objects[(bucket, name)] = self._body()
                    return self._answer(200)
                if self.command == "DELETE":
                    fake.objects.pop((bucket, name), None)
                    return self._answer(204)
                data = fake.objects.get((bucket, name))
                if data is None:
                    return self._answer(404, b"<Error><Code>NoSuchKey</Code></Error>", "application/xml")
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("range") or "")
                if wanted and self.command == "GET":  # a ranged read, as a resume makes
                    start = int(wanted.group(1))
                    end = min(int(wanted.group(2) or len(data) - 1), len(data) - 1)
                    return self._answer(206, data[start:end + 1], "application/octet-stream",
                                        {"content-range": f"bytes {start}-{end}/{len(data)}"})
                return self._answer(200, data, "application/octet-stream")

            def do_GET(self):
                self._storage(write=False)

            def do_HEAD(self):
                self._storage(write=False)

            def do_PUT(self):
                self._storage(write=True)

            def do_DELETE(self):
                self._storage(write=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def adc_file(self, path) -> str:
        """A service account's key file (the broker's application default
        credentials), with a fresh RSA key and this fake as its token_uri."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path.write_text(json.dumps({
            "type": "service_account", "project_id": "broker", "private_key_id": "k1", "private_key": key.decode(),
            "client_email": "broker@broker.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": f"{self.url}/token"}))
        return str(path)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
