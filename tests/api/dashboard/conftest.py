"""The dashboard's tests run against `site` (support/site.py): a broker on a
real socket with two teams' money seeded."""
from support.site import site  # noqa: F401  (a fixture, found by name)
