"""What minting a node's scoped S3 credentials costs the broker, per launch.

Each launch (and each renewal an agent asks for) is one STS AssumeRole with
the attempt's session policy (`broker/launch/storage_credentials.mint`).
moto's server runs in its own process, so this process's CPU time is the
broker's alone; the wall time is loopback to moto, not AWS (real STS adds
its network round trip, typically tens of milliseconds).

    python bench/mint_credentials.py                 # 200 mints
    python bench/mint_credentials.py --mints 50
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, endpoint
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("moto's server did not start") from None
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mints", type=int, default=200)
    args = parser.parse_args()
    proc, endpoint = start_moto()
    try:
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_REGION="us-east-1")
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="node", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                    "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
        from spotbroker.broker.launch import storage_credentials as sc
        from spotbroker.broker.settings import Settings

        settings = Settings(data_dir=Path(tempfile.mkdtemp()), checkpoint_root="s3://bench-bucket/root",
                            node_role_arn=role, _env_file=None)
        walls, cpus = [], []
        for attempt in range(1, args.mints + 1):
            scope = sc.scope(settings.checkpoint_uri, "team", 7, attempt,
                             (f"{settings.checkpoint_uri}/team/uploads/{'a' * 64}.tar.gz",))
            wall, cpu = time.perf_counter(), time.process_time()
            sc.mint(settings, scope, sc.session_name("team", 7, attempt))
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    walls.sort()
    print(f"mints: {args.mints} (AssumeRole with the attempt's session policy, moto on loopback)")
    print(f"wall per mint: median {statistics.median(walls) * 1e3:.1f} ms, "
          f"p95 {walls[int(0.95 * (len(walls) - 1))] * 1e3:.1f} ms")
    print(f"broker CPU per mint: median {statistics.median(cpus) * 1e3:.1f} ms, "
          f"mean {statistics.mean(cpus) * 1e3:.1f} ms (the first, making the STS client: {cpus[0] * 1e3:.0f} ms)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
