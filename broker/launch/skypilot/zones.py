"""An AWS zone ID (`use1-az2`) as the zone name SkyPilot launches in.

Offers from SkyPilot's catalog name AWS zones by ID, the same physical zone
in every account; SkyPilot's `infra` takes zone names (`us-east-1a`), which
each account maps to IDs its own way. Sending only the region lets SkyPilot
pick the zone: the launch must name the zone the policy chose, so the ID is
mapped through the account's own EC2 API (`DescribeAvailabilityZones`,
with the broker's AWS credentials, as for spot prices), once per region.
"""
from __future__ import annotations

import threading

from spotbroker.broker.launch.base import LaunchError, LauncherUnavailable, UnknownPlace
from spotbroker.broker.pricing.offers import Placement

_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 2}}


class ZoneNames:
    """Zone ID -> zone name per AWS region, asked of EC2 once per region."""

    def __init__(self, session=None) -> None:
        self._session = session
        self._names: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def name_of(self, p: Placement) -> str:
        """The zone name of `p.zone_id` in `p.region` (the place's cloud is AWS)."""
        if p.cloud != "aws":
            raise LaunchError(f"the place {p.place} names a zone ID ({p.zone_id}) on {p.cloud}: only AWS zones "
                              "are chosen by ID")
        with self._lock:
            names = self._names.get(p.region)
        if names is None or p.zone_id not in names:
            names = self._ask(p.region)
            with self._lock:
                self._names[p.region] = names
        if p.zone_id not in names:
            raise UnknownPlace(f"zone ID {p.zone_id} is not a zone of {p.region} in this AWS account "
                              f"(its zones: {', '.join(sorted(names)) or 'none'})")
        return names[p.zone_id]

    def _ask(self, region: str) -> dict[str, str]:
        import boto3
        import botocore.config
        import botocore.exceptions as errors

        session = self._session or boto3.session.Session()
        try:
            ec2 = session.client("ec2", region_name=region, config=botocore.config.Config(**_TIMEOUTS))
            zones = ec2.describe_availability_zones(
                Filters=[{"Name": "region-name", "Values": [region]}])["AvailabilityZones"]
        except (errors.NoCredentialsError, errors.PartialCredentialsError) as exc:
            raise LaunchError(f"cannot pin the launch to an AWS zone ID: the broker has no AWS credentials to ask "
                              f"EC2 which zone name it is in this account ({exc})") from None
        except errors.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
                raise LauncherUnavailable(f"EC2 DescribeAvailabilityZones in {region}: {code}") from None
            raise LaunchError(f"cannot pin the launch to an AWS zone ID: EC2 DescribeAvailabilityZones in "
                              f"{region} was refused ({code}); the broker's AWS identity needs "
                              "ec2:DescribeAvailabilityZones") from None
        except errors.BotoCoreError as exc:  # EC2 not reachable now: the launch is tried again
            raise LauncherUnavailable(f"EC2 DescribeAvailabilityZones in {region}: {exc}") from None
        return {z["ZoneId"]: z["ZoneName"] for z in zones if z.get("ZoneId") and z.get("ZoneName")}
