"""``python -m spotbroker.agent.metadata_sim``: one simulated metadata service in
its own process, as the local launcher starts one per attempt. The first line
it prints is its URL. With SPOTBROKER_SIM_CONTROL_TOKEN set, its `/_sim/`
control endpoints answer only requests whose `X-Sim-Token` header carries it."""
from __future__ import annotations

import argparse
import os
import signal
import threading
from datetime import UTC, datetime

from spotbroker.agent.metadata_sim.instance import CLOUDS, FAULT_MODES, MetadataSimulator
from spotbroker.agent.protocol import ENV_SIM_CONTROL_TOKEN


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spotbroker.agent.metadata_sim",
                                     description="A metadata-service simulator that speaks AWS, GCP and Azure "
                                                 "as documented.")
    parser.add_argument("--cloud", choices=CLOUDS, default="aws")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--window", type=float, default=None,
                        help="notice window in seconds (default: the cloud's own)")
    parser.add_argument("--notice-after", type=float, default=None, help="publish the notice after this many seconds")
    parser.add_argument("--notice-at", default=None, help="publish the notice at this ISO 8601 time")
    parser.add_argument("--rebalance-after", type=float, default=None,
                        help="AWS rebalance recommendation after N seconds")
    parser.add_argument("--fault", choices=FAULT_MODES, default=None, help="answer metadata requests badly")
    parser.add_argument("--vm-name", default="spotbroker-vm-0")
    parser.add_argument("--instance-id", default="i-0123456789abcdef0")
    parser.add_argument("--kill-at-hard-stop", type=int, default=None, metavar="PID",
                        help="SIGKILL this process and every process below it, whatever their session, "
                             "when the notice window closes (the node is gone, this simulator with it)")
    return parser.parse_args(argv)


def _hard_stop(pid: int) -> None:
    from spotbroker.agent.proctree import kill_tree

    kill_tree(pid)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's metadata service goes with it


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    notice_at = datetime.fromisoformat(args.notice_at) if args.notice_at else None
    if notice_at is not None and notice_at.tzinfo is None:
        notice_at = notice_at.replace(tzinfo=UTC)
    sim = MetadataSimulator(
        args.cloud, host=args.host, port=args.port, notice_window=args.window,
        notice_after=args.notice_after, notice_at=notice_at, rebalance_after=args.rebalance_after,
        vm_name=args.vm_name, instance_id=args.instance_id,
        on_hard_stop=(lambda: _hard_stop(args.kill_at_hard_stop)) if args.kill_at_hard_stop else None,
        control_token=os.environ.get(ENV_SIM_CONTROL_TOKEN) or None,
    )
    if args.fault:
        sim.set_fault(args.fault)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    sim.start()
    print(sim.url, flush=True)  # the first line is the URL, for whoever started us
    stopped.wait()
    sim.stop()
