"""Fixtures of the SkyPilot tests, found by name."""
from skypilot.skyenv import sky_aws  # noqa: F401  (real SkyPilot against moto's EC2)
