"""Local HTTP fakes of the clouds' price APIs, with the real response shapes
and paging, for the tests, the demo and bench/prices.py. Their prices come
from the bundled snapshot (real catalog rows), so what a test reads back is
what a cloud once charged.

One server answers every API on its own path:
- Azure Retail Prices: `GET /api/retail/prices` (`Items`, `NextPageLink`);
- Azure management: `GET /subscriptions/{id}/providers/Microsoft.Compute/skus`,
  and Resource Graph `POST /providers/Microsoft.ResourceGraph/resources`
  (a bearer token required; `data`, `$skipToken`);
- GCP Cloud Billing Catalog: `GET /v1/services/{service}/skus` (`nextPageToken`);
- GCP Compute Engine: `GET /compute/v1/projects/{p}/aggregated/machineTypes`
  and `.../aggregated/acceleratorTypes` (`items` by zone scope, a
  `NO_RESULTS_ON_PAGE` warning for an empty scope, `maxResults`,
  `pageToken`, and the `name eq 'regex'` filter);
- AWS Pricing API: `POST /` with `X-Amz-Target: AWSPriceListService.GetProducts`,
  and EC2 `GetSpotPlacementScores` (form-encoded, XML answer) on `/ec2`;
- AWS Price List Bulk API: `GET /offers/v1.0/aws/AmazonEC2/…` (the region
  index and each region's CSV offer file, see price_list.py);
- the Spot Instance Advisor feed `GET /spot-advisor-data.json` (with an ETag).
A test can make a page fail (`fail_page`) to check that nothing half-written
lands.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from spotbroker.broker.pricing.fakes.price_list import PREFIX, PriceListFiles


@dataclass
class FakeClouds:
    azure_items: list[dict[str, Any]] = field(default_factory=list)
    azure_skus: list[dict[str, Any]] = field(default_factory=list)
    azure_evictions: list[dict[str, Any]] = field(default_factory=list)  # SpotResources rows
    gcp_skus: list[dict[str, Any]] = field(default_factory=list)
    gcp_machine_types: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (zone, entry)
    gcp_accelerator_types: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    aws_products: list[dict[str, Any]] = field(default_factory=list)
    aws_scores: dict[str, tuple[str, int]] = field(default_factory=dict)  # zone id -> (region, score 1..10)
    aws_advisor: dict[str, Any] = field(default_factory=dict)  # the Spot Instance Advisor feed
    aws_price_list: PriceListFiles | None = None   # the Bulk API's files
    page_size: int = 100
    fail_page: int | None = None        # this page (1-based) of any list answers 500
    requests: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeClouds:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                fake._answer(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                fake._answer(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-clouds").start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    # --- dispatch ------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if method == "POST" else b""
        self.requests.append(f"{method} {url.path}")
        if url.path == "/spot-advisor-data.json":
            self._advisor(h)
        elif url.path.startswith(PREFIX) and self.aws_price_list is not None:
            self.aws_price_list.answer(h, url.path)
        elif url.path == "/api/retail/prices":
            self._azure_prices(h, query)
        elif method == "POST" and url.path == "/providers/Microsoft.ResourceGraph/resources":
            self._azure_graph(h, json.loads(body or b"{}"))
        elif url.path.endswith("/providers/Microsoft.Compute/skus"):
            self._send(h, 200, {"value": self.azure_skus})
        elif url.path.startswith("/v1/services/") and url.path.endswith("/skus"):
            self._gcp_skus(h, query)
        elif url.path.startswith("/compute/v1/projects/") and "/aggregated/" in url.path:
            self._gcp_aggregated(h, url.path.rsplit("/", 1)[1], query)
        elif method == "POST" and h.headers.get("X-Amz-Target", "").endswith("GetProducts"):
            self._aws_products(h, json.loads(body or b"{}"))
        elif method == "POST" and b"Action=GetSpotPlacementScores" in body:
            self._aws_scores(h, {k: v[-1] for k, v in parse_qs(body.decode()).items()})
        else:
            self._send(h, 404, {"error": f"no fake for {method} {url.path}"})

    def _page(self, items: list[Any], start: int) -> tuple[list[Any], int | None, bool]:
        """(this page, the next start or None, whether this page fails)."""
        page_no = start // self.page_size + 1
        chunk = items[start:start + self.page_size]
        nxt = start + self.page_size if start + self.page_size < len(items) else None
        return chunk, nxt, self.fail_page == page_no

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: Any, content_type: str = "application/json") -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    # --- the APIs ------------------------------------------------------------------------

    def _advisor(self, h: BaseHTTPRequestHandler) -> None:
        """The feed is an S3 object: an ETag, and 304 to a matching If-None-Match."""
        body = json.dumps(self.aws_advisor).encode()
        etag = f'"{hashlib.md5(body).hexdigest()}"'
        if h.headers.get("If-None-Match") == etag:
            h.send_response(304)
            h.send_header("ETag", etag)
            h.end_headers()
            return
        h.send_response(200)
        for k, v in (("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("ETag", etag)):
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _azure_prices(self, h: BaseHTTPRequestHandler, query: dict[str, str]) -> None:
        items = self.azure_items
        flt = query.get("$filter", "")
        if "armRegionName eq '" in flt:
            region = flt.split("armRegionName eq '")[1].split("'")[0]
            items = [i for i in items if i["armRegionName"] == region]
        chunk, nxt, fail = self._page(items, int(query.get("$skip", 0)))
        if fail:
            return self._send(h, 500, {"error": "internal"})
        next_link = None
        if nxt is not None:
            host, port = h.server.server_address[:2]
            next_link = f"http://{host}:{port}/api/retail/prices?" + urlencode(
                {"api-version": query.get("api-version", ""), "$filter": flt, "$skip": nxt})
        self._send(h, 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default",
                            "CustomerEntityType": "Retail", "Items": chunk, "NextPageLink": next_link,
                            "Count": len(chunk)})

    def _azure_graph(self, h: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        if not h.headers.get("Authorization", "").startswith("Bearer "):
            return self._send(h, 401, {"error": {"code": "AuthenticationFailed", "message": "no token"}})
        if "skuspotevictionrate" not in req.get("query", ""):
            return self._send(h, 400, {"error": {"code": "BadRequest", "message": "no fake for this query"}})
        options = req.get("options") or {}
        size = min(int(options.get("$top") or 100), 1000, self.page_size)
        start = int(base64.b64decode(options["$skipToken"])) if options.get("$skipToken") else 0
        chunk, nxt = self.azure_evictions[start:start + size], start + size
        if self.fail_page == start // size + 1:
            return self._send(h, 500, {"error": {"code": "InternalServerError", "message": "internal"}})
        body: dict[str, Any] = {"totalRecords": len(self.azure_evictions), "count": len(chunk),
                                "resultTruncated": "false", "facets": [], "data": chunk}
        if nxt < len(self.azure_evictions):
            body["$skipToken"] = base64.b64encode(str(nxt).encode()).decode()
        self._send(h, 200, body)

    def _gcp_skus(self, h: BaseHTTPRequestHandler, query: dict[str, str]) -> None:
        chunk, nxt, fail = self._page(self.gcp_skus, int(query.get("pageToken") or 0))
        if fail:
            return self._send(h, 500, {"error": {"code": 500, "message": "internal", "status": "INTERNAL"}})
        self._send(h, 200, {"skus": chunk, "nextPageToken": "" if nxt is None else str(nxt)})

    def _gcp_aggregated(self, h: BaseHTTPRequestHandler, kind: str, query: dict[str, str]) -> None:
        entries = {"machineTypes": self.gcp_machine_types, "acceleratorTypes": self.gcp_accelerator_types}.get(kind)
        if entries is None:
            return self._send(h, 404, {"error": {"code": 404, "message": f"no {kind}", "status": "NOT_FOUND"}})
        match = re.fullmatch(r"name eq '(.*)'", query.get("filter", ""))
        if match:
            entries = [(z, e) for z, e in entries if re.fullmatch(match[1], e["name"])]
        size = int(query.get("maxResults") or self.page_size)
        start = int(query.get("pageToken") or 0)
        chunk, nxt = entries[start:start + size], (start + size if start + size < len(entries) else None)
        if self.fail_page == start // size + 1:
            return self._send(h, 500, {"error": {"code": 500, "message": "internal", "status": "INTERNAL"}})
        items: dict[str, Any] = {"zones/us-east7-z": {"warning": {  # a scope with nothing, as the API says it
            "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/us-east7-z' on this page.",
            "data": [{"key": "scope", "value": "zones/us-east7-z"}]}}}
        for zone, entry in chunk:
            items.setdefault(f"zones/{zone}", {kind: []})[kind].append(entry)
        body = {"kind": f"compute#{kind[:-1]}AggregatedList", "id": f"projects/fake/aggregated/{kind}", "items": items,
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/fake/aggregated/{kind}"}
        if nxt is not None:
            body["nextPageToken"] = str(nxt)
        self._send(h, 200, body)

    def _aws_products(self, h: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        wanted = {f["Field"]: f["Value"] for f in req.get("Filters", [])}
        items = [p for p in self.aws_products
                 if all(p["product"]["attributes"].get(k) == v for k, v in wanted.items())]
        chunk, nxt, fail = self._page(items, int(req.get("NextToken") or 0))
        if fail:
            return self._send(h, 500, {"__type": "InternalErrorException", "Message": "internal"},
                              "application/x-amz-json-1.1")
        body: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in chunk]}
        if nxt is not None:
            body["NextToken"] = str(nxt)
        self._send(h, 200, body, "application/x-amz-json-1.1")

    def _aws_scores(self, h: BaseHTTPRequestHandler, form: dict[str, str]) -> None:
        regions = {v for k, v in form.items() if k.startswith("RegionName")}
        rows = "".join(
            f"<item><region>{region}</region><availabilityZoneId>{zone_id}</availabilityZoneId>"
            f"<score>{score}</score></item>"
            for zone_id, (region, score) in sorted(self.aws_scores.items())
            if not regions or region in regions)
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><GetSpotPlacementScoresResponse '
               f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>fake</requestId>'
               f"<spotPlacementScoreSet>{rows}</spotPlacementScoreSet></GetSpotPlacementScoresResponse>")
        self._send(h, 200, xml.encode(), "text/xml")


@contextmanager
def moto_spot_prices(prices: dict[tuple[str, str], list[tuple[datetime, float]]]) -> Iterator[None]:
    """Make moto's EC2 (running in this process) answer
    `describe_spot_price_history` with these samples, keyed by (zone name,
    instance type), instead of its placeholder 0.00001 of 2006."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    original = SpotInstances.describe_spot_price_history

    def answer(self: Any) -> ActionResult:
        types = set(self._get_param("InstanceTypes", []))
        region = self.region
        history = [{"InstanceType": itype, "ProductDescription": "Linux/UNIX", "SpotPrice": f"{price:.6f}",
                    "AvailabilityZone": zone, "Timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.000Z")}
                   for (zone, itype), samples in prices.items()
                   if zone.startswith(region) and (not types or itype in types) for at, price in samples]
        return ActionResult({"SpotPriceHistory": history})

    SpotInstances.describe_spot_price_history = answer
    try:
        yield
    finally:
        SpotInstances.describe_spot_price_history = original
