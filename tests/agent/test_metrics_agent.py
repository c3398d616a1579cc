"""The agent's side of metrics and early stop, with the real library in the
trainer and a fake broker: reports are folded on their way, and the
broker's `stop` makes the trainer checkpoint and leave its loop."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    EARLY_STOP,
    EVENT_LOG_BYTES,
    METRICS,
    NO_FLUSH,
    TRAINER_EXITED,
)

TOKEN = "test-agent-token-7f3a"  # the fake broker's (conftest.AGENT_TOKEN)

REPORTER = """
import sys, time
from spotbroker.agent.checkpoint import Checkpointer
ckpt = Checkpointer(uri=sys.argv[1], every_seconds=None)
step = 0
while step < int(sys.argv[2]) and not ckpt.should_stop:
    step += 1
    ckpt.report(step, loss=1.0 / step, acc=step / 1000)
    ckpt.step(step)
    time.sleep(float(sys.argv[3]))
print("left the loop at", step, "should_stop", ckpt.should_stop, flush=True)
ckpt.close()
"""


class Agent:
    """`spotbroker agent run` over a real-library trainer, as a subprocess."""

    def __init__(self, tmp: Path, broker_url: str, trainer: list[str], metrics_seconds: float,
                 env: dict[str, str]) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}, **env}
        env.update({"SPOTBROKER_AGENT_TOKEN": TOKEN, "SPOTBROKER_URL": broker_url, "SPOTBROKER_CLOUD": "local"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spotbroker.agent.cli", "run", "--heartbeat-seconds", "0.2",
             "--log-seconds", "0.1", "--retry-max-seconds", "0.3", "--metrics-seconds", str(metrics_seconds),
             "--work-dir", str(tmp / "agent"), "--", *trainer],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


@pytest.fixture
def agent(tmp_path):
    started: list[Agent] = []

    def start(broker_url: str, trainer: list[str], metrics_seconds: float, **env: str) -> Agent:
        started.append(Agent(tmp_path, broker_url, trainer, metrics_seconds, env))
        return started[-1]

    yield start
    for process in started:
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.communicate()


def test_reports_more_often_than_the_interval_are_folded(agent, broker, tmp_path):
    trainer = [sys.executable, "-c", REPORTER, f"file://{tmp_path}/ckpt", "200", "0.01"]
    code, _, err = agent(broker.url, trainer, 1.0).finish(timeout=60)
    assert code == 0, err
    points = [e["data"] for e in broker.ordered() if e["type"] == METRICS]
    # 200 reports in 2+ s: the first at once, one a second after, and the last at the exit.
    assert 2 <= len(points) <= 6, (points, broker.types(), err[-3000:])
    assert points[0] == {"step": 1, "values": {"loss": 1.0, "acc": 0.001}}
    assert points[-1] == {"step": 200, "values": {"loss": 1.0 / 200, "acc": 0.2}}
    assert sorted(broker.events) == list(range(1, len(broker.events) + 1))


def test_the_library_counts_the_rule_over_every_report_and_the_report_that_meets_it_goes_at_once(
        agent, broker, tmp_path):
    # loss falls to 0.02 at step 50 and stays: patience 3 is met at step 53, between two folds 30 s apart.
    plateau = REPORTER.replace("loss=1.0 / step", "loss=1.0 / min(step, 50)")
    trainer = [sys.executable, "-c", plateau, f"file://{tmp_path}/ckpt", "200", "0.01"]
    rule = '{"metric": "loss", "mode": "min", "patience": 3, "min_delta": 0.0, "min_steps": 0}'
    code, _, err = agent(broker.url, trainer, 30.0, SPOTBROKER_EARLY_STOP=rule).finish(timeout=60)
    assert code == 0, err
    points = [e["data"] for e in broker.ordered() if e["type"] == METRICS]
    assert [p["step"] for p in points] == [1, 53, 200], points
    assert points[1][EARLY_STOP] == {"best_step": 50, "best_value": 0.02, "since": 3, "met": True}
    assert points[2][EARLY_STOP] == {"best_step": 50, "best_value": 0.02, "since": 150, "met": True}


def test_the_brokers_stop_checkpoints_and_ends_the_trainers_loop(agent, broker, wait, tmp_path):
    trainer = [sys.executable, "-c", REPORTER, f"file://{tmp_path}/ckpt", "100000", "0.01"]
    process = agent(broker.url, trainer, 0.2)
    wait(lambda: broker.first(METRICS), timeout=30, what="a report")
    broker.stop_run = True  # every answer from now on says stop
    code, out, err = process.finish(timeout=60)
    assert code == 0, err  # the trainer left its loop by itself
    assert "should_stop True" in out
    committed = [e["data"] for e in broker.ordered() if e["type"] == CHECKPOINT_COMMITTED]
    assert [c["reason"] for c in committed] == [EARLY_STOP]
    assert f"left the loop at {committed[0]['step']} " in out
    assert err.count("the broker stopped the run early") == 1 and NO_FLUSH not in broker.types()
    assert broker.first(TRAINER_EXITED)["data"] == {"exit_code": 0, EVENT_LOG_BYTES: len(broker.log_bytes)}


def test_a_number_no_float_holds_is_dropped_not_fatal():
    from spotbroker.agent.metricsfold import Report, clean

    # A hand-written events line (not the library's report()) may hold any JSON integer.
    big = {"big": 10**400, "loss": 0.5, "nan": float("nan")}
    assert clean({"step": 1, "values": big}) == Report(1, {"loss": 0.5}, None)
    assert clean({"step": 1, "values": {"big": 10**400}}) is None
