"""The demo's preemption story, timed, for two shapes of job; and what it
costs to send a job's code.

1. A real `spotbroker serve` on the embedded defaults (as `spotbroker demo`
   starts it, 10 s notice window), a team, and `examples/train.py` (60
   steps) on a spot T4, preempted through the simulated metadata service at
   step 20, submitted two ways:
   - the demo's own: `python /abs/path/examples/train.py ...`, no workdir;
   - an uploaded workdir: the trainer's project packed and uploaded as
     `spotbroker submit` does, and `python examples/train.py ...` run in it.
   For each, from the broker's events: notice -> flush committed -> next
   attempt running -> trainer resumed, and the steps lost.
2. A 50 MB workdir (incompressible files, gzip's worst case) from the
   client's side: pack, `PUT /v1/uploads/{sha256}` (hashed, checked and
   stored by the broker), and on the node's side: fetch, verify, unpack;
   and how far this repository's own `broker/` packs.

    python bench/preemption_timeline.py [--runs 3] [--upload-mb 50]
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from spotbroker.agent.code import fetch_code
from spotbroker.broker.cli.client import Client
from spotbroker.broker.cli.demo import NOTICE_WINDOW, TRAIN, TRAIN_ARGS, _free_port, _wait_ready
from spotbroker.broker.jobs.workdir import pack

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str, str]:
    port, admin = _free_port(), "bench-admin-token"
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATA_DIR=str(data_dir), SPOTBROKER_ADMIN_TOKEN=admin,
               SPOTBROKER_RECONCILE_INTERVAL="0.5", SPOTBROKER_LOCAL_NOTICE_WINDOW=str(NOTICE_WINDOW),
               SPOTBROKER_PRICES_SOURCES="catalog")  # no network
    log = (data_dir / "broker.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--port", str(port),
                               "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    _wait_ready(url, server)
    with Client(url, admin) as c:
        token = c.create_team("bench")["token"]
    return server, url, token


def upload(c: Client, root: Path) -> tuple[str, float, float]:
    """sha256, seconds to pack, seconds to upload (as `spotbroker submit` does both)."""
    with tempfile.TemporaryFile() as archive:
        t0 = time.perf_counter()
        packed = pack(root, archive)
        archive.flush()
        archive.seek(0)
        t1 = time.perf_counter()
        c.upload(archive, packed.sha256)
        return packed.sha256, t1 - t0, time.perf_counter() - t1


def wait(c: Client, job_id: int, done, what: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.job(job_id)
        if done(job):
            return job
        if job["state"] in TERMINAL:
            raise SystemExit(f"job {job_id} ended {job['state']} ({job.get('reason')}) waiting for {what}")
        time.sleep(0.1)
    raise SystemExit(f"job {job_id}: no {what} within {timeout:.0f} s")


def timeline(c: Client, spec: dict) -> dict[str, float]:
    job_id = c.submit(spec)["id"]
    wait(c, job_id, lambda j: j["state"] == "RUNNING", "RUNNING")
    deadline = time.monotonic() + 240
    while "step=20 " not in c.logs(job_id):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} never reached step 20")
        time.sleep(0.1)
    c.simulate_preemption(job_id)
    job = wait(c, job_id, lambda j: j["state"] in TERMINAL, "the end")
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"job {job_id} ended {job['state']}")
    events = c.events(job_id)
    first, last = job["attempts"][0], job["attempts"][-1]

    def at(e: dict) -> float:
        return datetime.fromisoformat(e["at"]).timestamp()

    notice = next(e for e in events if e["type"] == "preemption_notice")
    flush = next(e for e in events if e["type"] == "checkpoint_committed" and e["attempt_id"] == first["id"]
                 and e["data"].get("reason") != "periodic")
    running = next(e for e in events if e["type"] == "attempt_state" and e["attempt_id"] == last["id"]
                   and e["data"]["to"] == "RUNNING")
    resumed = next(e for e in events if e["type"] == "resumed" and e["attempt_id"] == last["id"])
    return {"committed": at(flush) - at(notice), "running": at(running) - at(notice),
            "resumed": at(resumed) - at(notice),
            "lost": max(0, flush["data"]["step"] - resumed["data"]["step"]), "step": flush["data"]["step"]}


def project(into: Path) -> Path:
    """The trainer's project as a user has it: examples/train.py and a .gitignore'd venv."""
    (into / "examples").mkdir(parents=True)
    shutil.copy(TRAIN, into / "examples" / "train.py")
    (into / ".gitignore").write_text(".venv/\n__pycache__/\n")
    (into / ".venv").mkdir()
    (into / ".venv" / "pyvenv.cfg").write_text("home = /nowhere\n")
    return into


def big_workdir(into: Path, mb: int) -> Path:
    into.mkdir(parents=True)
    for i in range(mb):
        (into / f"shard-{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    return into


def print_timelines(rows: dict[str, list[dict[str, float]]]) -> None:
    print(f"\nnotice -> ..., seconds (median of {len(next(iter(rows.values())))} runs; "
          f"{NOTICE_WINDOW} s notice window)")
    print(f"{'shape':<34} {'committed':>10} {'next running':>13} {'resumed':>8} {'steps lost':>10}")
    for shape, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("committed", "running", "resumed")}
        lost = max(r["lost"] for r in runs)
        print(f"{shape:<34} {med['committed']:>10.2f} {med['running']:>13.2f} {med['resumed']:>8.2f} {lost:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="preemptions per shape")
    parser.add_argument("--upload-mb", type=int, default=50)
    opts = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    base.chmod(0o711)  # as root, jobs run as a user who must enter the data dir
    data_dir = base / "data"
    data_dir.mkdir()
    server, url, token = start_broker(data_dir)
    try:
        with Client(url, token) as c:
            args = " ".join([*TRAIN_ARGS, "--step-seconds", "0.15"])
            sha, _, _ = upload(c, project(base / "project"))
            shapes = {
                "absolute path (the demo's)": {"run": f"python {shlex.quote(str(TRAIN))} {args}"},
                "uploaded workdir, relative run": {"workdir": {"upload": sha},
                                                   "run": f"python examples/train.py {args}"},
            }
            rows: dict[str, list[dict[str, float]]] = {name: [] for name in shapes}
            for _ in range(opts.runs):
                for name, spec in shapes.items():
                    rows[name].append(timeline(c, {"name": "bench", **spec, "resources": {
                        "accelerators": "T4:1", "use_spot": True}}))
            print_timelines(rows)
            measure_upload(c, base, opts.upload_mb, data_dir)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def measure_upload(c: Client, base: Path, mb: int, data_dir: Path) -> None:
    packs, puts, fetches = [], [], []
    for i in range(3):
        root = big_workdir(base / f"big-{i}", mb)  # new bytes each time: nothing is deduplicated
        sha, packed_s, put_s = upload(c, root)
        packs.append(packed_s)
        puts.append(put_s)
        uri = (data_dir / "checkpoints" / "bench" / "uploads" / f"{sha}.tar.gz").as_uri()
        t0 = time.perf_counter()
        fetch_code(uri, sha, base / f"node-{i}" / "workdir")
        fetches.append(time.perf_counter() - t0)
        shutil.rmtree(root)
        shutil.rmtree(base / f"node-{i}")
    import io

    source = Path(__file__).resolve().parents[1] / "broker"
    t0 = time.perf_counter()
    code = pack(source, io.BytesIO())
    print(f"\nsource code: {source} ({code.file_bytes / 1e6:.2f} MB) packs to {code.bytes / 1e6:.2f} MB "
          f"in {time.perf_counter() - t0:.2f} s")
    pack_s, put_s = statistics.median(packs), statistics.median(puts)
    print(f"\nworkdir of {mb} MB ({mb} incompressible files), median of 3: pack {pack_s:.2f} s, "
          f"upload {put_s:.2f} s (client total {pack_s + put_s:.2f} s); "
          f"node: fetch + verify + unpack {statistics.median(fetches):.2f} s")


if __name__ == "__main__":
    main()
