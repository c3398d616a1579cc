"""Fixtures of the SkyPilot tests, found by name."""
from support.skyenv import sky_aws, sky_world  # noqa: F401  (real SkyPilot against moto's EC2)
