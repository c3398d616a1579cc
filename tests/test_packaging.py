"""The wheel a GPU node installs: built from this tree, installed into a clean
virtual environment without the broker extra, every module of the agent
imports, and the broker's own dependencies are not there."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def run(*cmd: str | Path, **kw) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy without build outputs: setuptools reuses a stale build/lib, which would put modules
    # that the tree no longer has into the wheel.
    source = tmp_path_factory.mktemp("source") / "spotbroker"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".tools", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, source)
    (path,) = out.glob("spotbroker-*.whl")
    return path


def test_the_wheel_holds_every_package_of_the_tree(wheel):
    in_tree = {str(p.parent.relative_to(REPO)) for top in ("broker", "agent", "api", "migrations")
               for p in (REPO / top).rglob("__init__.py")}
    in_wheel = {str(Path(n).parent.relative_to("spotbroker")) for n in zipfile.ZipFile(wheel).namelist()
                if n.startswith("spotbroker/") and n.endswith("/__init__.py")}
    assert in_wheel == in_tree


def test_the_wheel_holds_the_price_snapshot_and_its_date(wheel):
    """The bundled prices are the broker's offline source, and SNAPSHOT_DATE
    is what says how old they are: a wheel without either misleads."""
    data = REPO / "broker" / "pricing" / "catalog_data"
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p.name for p in data.iterdir()
               if p.is_file() and f"spotbroker/broker/pricing/catalog_data/{p.name}" not in names]
    assert not missing and (data / "SNAPSHOT_DATE").exists()


def agent_modules_in_the_tree() -> set[str]:
    """spotbroker.agent.* for every module and subpackage under agent/."""
    names = set()
    for path in (REPO / "agent").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1:
            names.add(".".join(("spotbroker", *parts)))
    return names


def test_every_agent_module_imports_without_the_broker_extra(wheel, tmp_path):
    venv = tmp_path / "node"
    run(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    run(py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    check = (
        "import importlib, importlib.util, json, pkgutil, spotbroker.agent as a\n"
        "names = [m.name for m in pkgutil.walk_packages(a.__path__, 'spotbroker.agent.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "missing = [d for d in ('fastapi', 'sqlalchemy', 'alembic', 'uvicorn') if importlib.util.find_spec(d)]\n"
        "assert not missing, missing\n"
        "print(json.dumps(names))\n"
    )
    imported = run(py, "-c", check, cwd=tmp_path)  # not from the repo, whose folders would shadow the wheel
    names = set(json.loads(imported))
    # Every module of the tree, those of its subpackages (the checkpoint library, the simulator) included.
    assert names == agent_modules_in_the_tree()
    assert {"spotbroker.agent.checkpoint.checkpointer", "spotbroker.agent.metadata_sim.instance"} <= names
