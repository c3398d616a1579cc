"""A tiny stand-in trainer for the supervisor's tests (run as a subprocess).

With --library it behaves like a trainer using the checkpoint library: it
writes library.json and, on SIGUSR1, reads flush.json and appends a
checkpoint_committed event (with flush.json's reason) at its next step
boundary, then stops (or, with --stay, trains on). Without it, SIGUSR1
keeps its default action (the process dies), so a wrong signal shows.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    ENV_CONTROL_DIR,
    FLUSH_FILE,
    LIBRARY_FILE,
    RESUMED,
    append_event,
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", action="store_true")
    parser.add_argument("--ignore-flush", action="store_true", help="use the library but never commit")
    parser.add_argument("--stay", action="store_true", help="train on after a flush commit")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--until-file", help="stop training (as after the last step) once this file exists")
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--lines", type=int, default=0, help="print this many lines to stdout and stderr first")
    parser.add_argument("--env-file", help="write the environment seen here as JSON")
    parser.add_argument("--done-file", help="touch this file just before exiting")
    parser.add_argument("--resumed", action="store_true", help="report a resumed event at start")
    args = parser.parse_args()

    control = Path(os.environ[ENV_CONTROL_DIR]) if ENV_CONTROL_DIR in os.environ else None
    flush_asked = []

    def on_signal(signum: int, frame: object) -> None:
        print(f"trainer: got {signal.Signals(signum).name}", flush=True)
        sys.exit(42 if signum == signal.SIGTERM else 43)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.env_file:  # after the handlers: tests signal the trainer as soon as they see it
        Path(args.env_file).write_text(json.dumps(dict(os.environ)))
    if args.library and control is not None:  # as the library: nothing to announce without an agent
        signal.signal(signal.SIGUSR1, lambda *_: flush_asked.append(time.monotonic()))
        tmp = control / (LIBRARY_FILE + ".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "version": 1}))
        os.replace(tmp, control / LIBRARY_FILE)
    if args.resumed:
        append_event(control, {"type": RESUMED, "data": {"step": 7, "uri": "file:///ckpt/step-000000000007"}})

    for i in range(args.lines):
        print(f"out line {i}", flush=True)
        print(f"err line {i}", file=sys.stderr, flush=True)

    step = handled = 0
    while step < args.steps and not (args.until_file and os.path.exists(args.until_file)):
        time.sleep(args.step_seconds)
        step += 1
        if len(flush_asked) > handled:  # the next step boundary after the signal
            handled = len(flush_asked)
            print(f"trainer: flush request {handled}", flush=True)
            if args.ignore_flush:
                continue
            flush = json.loads((control / FLUSH_FILE).read_text())
            append_event(control, {"type": CHECKPOINT_COMMITTED, "data": {
                "step": step, "uri": f"file:///ckpt/step-{step:012d}", "bytes": 1234,
                "seconds": round(time.monotonic() - flush_asked[-1], 3), "reason": flush["reason"],
                "deadline": flush["deadline"],
            }})
            print(f"trainer: committed step {step}", flush=True)
            if not args.stay:
                break
    if args.done_file:
        Path(args.done_file).touch()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
