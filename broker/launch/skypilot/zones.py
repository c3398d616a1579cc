"""AWS zone names for placements that know only a zone id.

The bundled snapshot and the public price list name AWS zones by id
(`use1-az1`: the same place in every account), while SkyPilot pins a zone
by its name (`us-east-1b`), which differs from account to account. The
account SkyPilot launches in is the one boto3's standard chain reaches from
this process, so the broker asks EC2 there (`describe_availability_zones`
with `ZoneIds`), once per zone id. Unresolved (no credentials, a zone id
the account lacks), the place stays pinned to its region only, and a log
line says so once per zone id.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from threading import Lock

from spotbroker.broker.pricing.offers import Placement

log = logging.getLogger(__name__)


class AwsZoneNames:
    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._names: dict[str, str | None] = {}  # zone id -> name (None: asked, not found)
        self._lock = Lock()

    def named(self, p: Placement) -> Placement:
        """`p` with its zone's name when it has only an AWS zone id."""
        if p.cloud != "aws" or p.zone or not p.zone_id or not p.region:
            return p
        with self._lock:
            if p.zone_id not in self._names:
                self._names[p.zone_id] = self._ask(p.region, p.zone_id)
            name = self._names[p.zone_id]
        return replace(p, zone=name) if name else p

    def _ask(self, region: str, zone_id: str) -> str | None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        config = Config(connect_timeout=self.timeout_s, read_timeout=self.timeout_s, retries={"max_attempts": 2})
        try:
            ec2 = boto3.session.Session().client("ec2", region_name=region, config=config)
            zones = ec2.describe_availability_zones(ZoneIds=[zone_id])["AvailabilityZones"]
        except (BotoCoreError, ClientError) as exc:
            log.warning("zone %s (%s): no name from EC2 (%s); the launch is pinned to the region only",
                        zone_id, region, type(exc).__name__)
            return None
        name = next((z["ZoneName"] for z in zones if z.get("ZoneId") == zone_id), None)
        if name is None:
            log.warning("zone %s: not a zone of this account's %s; the launch is pinned to the region only",
                        zone_id, region)
        return name
