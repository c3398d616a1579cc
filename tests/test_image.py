"""deploy/Dockerfile, without a Docker engine: the wheel is built from exactly
the files its COPY lines name (parsed from it, so a top-level file the build
needs and the Dockerfile forgets fails here, not in `docker build`), installed
into a fresh virtual environment, and run: `spotbroker --help` and the
migrations. The broker's dependencies come from this test run's own
environment (a path line in the fresh one's site-packages, never its .pth
hooks, so the editable install of the tree stays out): nothing is downloaded."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        word, _, rest = (pending + stripped).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def copies(text: str) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY in the build stage before the wheel
    is installed (the entrypoint, copied after, is not part of the build)."""
    found = []
    for word, rest in instructions(text):
        if word == "RUN" and "pip install" in rest:
            return found
        if word == "COPY":
            *sources, dest = [a for a in shlex.split(rest) if not a.startswith("--")]
            found.append((sources, dest))
    raise AssertionError("the Dockerfile never runs pip install")


def run(*cmd, **kw) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    """/app as the Dockerfile lays it out, from the COPY lines alone."""
    app = tmp_path_factory.mktemp("app")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for sources, dest in copies(DOCKERFILE.read_text()):
        for src in sources:
            path = REPO / src
            assert path.exists(), f"deploy/Dockerfile copies {src}, which does not exist"
            target = app / dest if not dest.endswith("/") else app / dest / path.name
            if path.is_dir():
                shutil.copytree(path, target, ignore=ignore)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return app


@pytest.fixture(scope="module")
def venv(context, tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    # --no-build-isolation: setuptools from this environment, not downloaded
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, context)
    (wheel,) = wheels.glob("spotbroker-*.whl")
    env = tmp_path_factory.mktemp("image") / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "zz-broker-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "-q", "--no-deps",
        "--no-index", wheel)
    return env


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTBROKER_", "PYTHON"))}
    env.update(SPOTBROKER_DATA_DIR=str(tmp_path / "data"), HOME=str(tmp_path))
    return env


def test_the_copied_files_build_a_wheel_that_runs(venv, tmp_path):
    env = clean_env(tmp_path)
    where = run(venv / "bin" / "python", "-c", "import spotbroker.broker.cli as c; print(c.__file__)",
                cwd=tmp_path, env=env)
    assert where.strip().startswith(str(venv)), f"spotbroker came from {where}, not the built wheel"
    assert "Usage: spotbroker" in run(venv / "bin" / "spotbroker", "--help", cwd=tmp_path, env=env)
    # The migrations are in the wheel (the scripts and alembic's template) and run from it.
    out = run(venv / "bin" / "spotbroker", "db", "upgrade", cwd=tmp_path, env=env)
    assert "database at revision" in out
    assert (tmp_path / "data" / "spotbroker.db").is_file()
    out = run(venv / "bin" / "spotbroker", "db", "current", cwd=tmp_path, env=env)
    database, code = (part.split(":")[1].strip() for part in out.strip().split(";"))
    assert database == code != "empty"


def test_the_image_runs_unprivileged_with_what_skypilot_needs():
    steps = instructions(DOCKERFILE.read_text())
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    for package in ("openssh-client", "rsync"):
        assert package in runs, f"the image lacks {package}, which the SkyPilot client runs"
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the broker must not run as root"
    env = " ".join(rest for word, rest in steps if word == "ENV")
    data_dir = next(w.split("=", 1)[1] for w in env.split() if w.startswith("SPOTBROKER_DATA_DIR="))
    assert any(data_dir in rest and "chown" in rest for word, rest in steps if word == "RUN"), \
        "the data directory must belong to the broker's user"
    assert ("ENTRYPOINT", '["spotbroker-entrypoint"]') in steps
