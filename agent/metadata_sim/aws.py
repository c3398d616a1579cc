"""AWS's instance metadata service, IMDSv2: a token from ``PUT /latest/api/token``
(its TTL header required, 1..21600 s), then reads with that token; the spot
notice (``spot/instance-action``) and the rebalance recommendation answer 404
until they are published."""
from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spotbroker.agent.metadata_sim.server import Reply

if TYPE_CHECKING:
    from spotbroker.agent.metadata_sim.instance import MetadataSimulator

TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL = 21600


def aws_time(at: datetime) -> str:
    """AWS writes `2026-11-21T00:50:02Z`."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def handle(sim: MetadataSimulator, method: str, path: str, headers: dict[str, str]) -> Reply:
    if path == "/latest/api/token":
        if method != "PUT":
            return Reply(405, b"Method Not Allowed\n")
        return _token(sim, headers)
    if not path.startswith("/latest/"):
        return Reply(404, b"Not Found\n")
    if method != "GET":
        return Reply(405, b"Method Not Allowed\n")
    token = headers.get(TOKEN_HEADER.lower())
    with sim.changed:
        expiry = sim.tokens.get(token or "")
    if expiry is None or expiry <= time.monotonic():
        return Reply(401, b"Unauthorized\n")
    value = _value(sim, path)
    return Reply(404, b"Not Found\n") if value is None else Reply(200, value.encode())


def _token(sim: MetadataSimulator, headers: dict[str, str]) -> Reply:
    if "x-forwarded-for" in headers:  # IMDSv2 refuses tokens through a proxy
        return Reply(403, b"Forbidden\n")
    raw_ttl = headers.get(TOKEN_TTL_HEADER.lower())
    if raw_ttl is None or not raw_ttl.strip().isdigit():
        return Reply(400, b"Bad Request\n")
    ttl = int(raw_ttl)
    if not 1 <= ttl <= MAX_TOKEN_TTL:
        return Reply(400, b"Bad Request\n")
    token = secrets.token_urlsafe(40)
    with sim.changed:
        now = time.monotonic()
        sim.tokens = {t: e for t, e in sim.tokens.items() if e > now}
        sim.tokens[token] = now + ttl
    return Reply(200, token.encode(), headers={TOKEN_TTL_HEADER: str(ttl)})


def _value(sim: MetadataSimulator, path: str) -> str | None:
    region = sim.zone[:-1]
    with sim.changed:
        deadline, rebalance = sim.deadline, sim.rebalance_time
    values: dict[str, str | None] = {
        "/latest/meta-data/instance-id": sim.instance_id,
        "/latest/meta-data/instance-type": "p4d.24xlarge",
        "/latest/meta-data/instance-life-cycle": "spot",
        "/latest/meta-data/placement/availability-zone": sim.zone,
        "/latest/meta-data/placement/region": region,
        "/latest/meta-data/spot/instance-action": (
            json.dumps({"action": "terminate", "time": aws_time(deadline)}) if deadline else None
        ),
        "/latest/meta-data/spot/termination-time": aws_time(deadline) if deadline else None,
        "/latest/meta-data/events/recommendations/rebalance": (
            json.dumps({"noticeTime": aws_time(rebalance)}) if rebalance else None
        ),
    }
    if path in ("/latest/meta-data", "/latest/meta-data/"):
        return "instance-id\ninstance-life-cycle\ninstance-type\nplacement/\nspot/\nevents/"
    return values.get(path)
