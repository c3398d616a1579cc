"""What a hostile task file costs the broker to refuse, and what the
accelerator-name check adds to a submission.

Task files (`broker/usecases/taskyaml.py`, the path of `POST /v1/jobs` with
`Content-Type: application/yaml`): seconds to refuse files with thousands
of errors (unset secrets, one error each) or counts over the spec's bounds
(labels, file mounts, envs), each parsed as the API parses it.

Accelerator names (`broker/pricing/known.py`): microseconds per submission
with the names in memory, and the milliseconds of a re-read of the names
from the bundled price snapshot's offers.

    python bench/submission_checks.py              # SQLite and PostgreSQL
    python bench/submission_checks.py --db sqlite
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from _db import temporary_database

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.known import KnownAccelerators
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.usecases import taskyaml

HEAD = "name: hostile\nrun: echo\nresources:\n  accelerators: T4\n"
FILES = {
    "1,000 unset secrets": HEAD + "secrets:\n" + "".join(f"  - S{i}\n" for i in range(1000)),
    "4,000 unset secrets": HEAD + "secrets:\n" + "".join(f"  - S{i}\n" for i in range(4000)),
    "40,000 labels (1 MB)": HEAD + "  labels:\n" + "".join(f"    l{i}: v\n" for i in range(40000)),
    "40,000 file mounts": HEAD + "file_mounts:\n" + "".join(f"  /m{i}: s3://b/{i}\n" for i in range(40000)),
    "60,000 envs": HEAD + "envs:\n" + "".join(f"  E{i}: x\n" for i in range(60000)),
}


def task_files() -> None:
    taskyaml.preload()  # SkyPilot's import and catalogs: the first file's cost, not these
    print("task file refused                    seconds   errors told")
    for name, text in FILES.items():
        data = text.encode()
        started = time.perf_counter()
        try:
            taskyaml.parse(data)
            told = 0
        except taskyaml.TaskFileError as exc:
            told = len(exc.errors)
        print(f"{name:<36} {time.perf_counter() - started:7.2f}   {told}")


def accelerator_names(url: str, n: int) -> None:
    engine = make_engine(url)
    migrate.upgrade(engine)
    factory = make_session_factory(engine)
    with transaction(factory) as session:
        seed_from_catalog(session)
    known = KnownAccelerators(factory)
    spec = JobSpec.model_validate({"run": "python train.py", "resources": {"accelerators": "A100:1"}})
    assert known.errors(spec) == []
    started = time.perf_counter()
    for _ in range(n):
        known.errors(spec)
    per_call_us = (time.perf_counter() - started) / n * 1e6
    rereads = []
    for _ in range(20):
        known._read_at = float("-inf")
        started = time.perf_counter()
        known._read(fresh=False)
        rereads.append((time.perf_counter() - started) * 1e3)
    rereads.sort()
    print(f"{engine.dialect.name:<10} names in memory: {per_call_us:5.1f} us a submission; "
          f"a re-read of {len(known._names)} names: median {rereads[10]:.2f} ms")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    task_files()
    for kind in ("sqlite", "postgresql"):
        if args.db in (kind, "both"):
            with tempfile.TemporaryDirectory() as d:
                url, drop = temporary_database(kind, Path(d))
                try:
                    accelerator_names(url, args.n)
                finally:
                    drop()


if __name__ == "__main__":
    main()
