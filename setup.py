"""What pyproject.toml cannot say: the packages. Every package under the four
top-level folders is found (a new subpackage cannot be left out of the wheel
that nodes install) and installed under the one `spotbroker` namespace, so a
user's own `agent.py` or `api/` never shadows ours."""
from setuptools import find_packages, setup

TOP = ("broker", "agent", "api", "migrations")

setup(
    package_dir={f"spotbroker.{top}": top for top in TOP},
    packages=[f"spotbroker.{name}" for name in find_packages(include=[*TOP, *(f"{top}.*" for top in TOP)])],
)
