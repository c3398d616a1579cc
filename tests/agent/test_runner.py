"""The supervisor end to end: a real agent process, the metadata simulator, a fake broker."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    DRAIN_CLOUD,
    DRAIN_KIND,
    DRAIN_SOURCE,
    ENV_AGENT_TOKEN,
    ENV_ATTEMPT_ID,
    ENV_BROKER_URL,
    ENV_CHECKPOINT_URI,
    ENV_CLOUD,
    ENV_CONTROL_DIR,
    ENV_JOB_ID,
    ENV_METADATA_URL,
    ENV_RESUME_FROM,
    EVENT_LOG_BYTES,
    FLUSH_FILE,
    HEARTBEAT,
    NO_FLUSH,
    PREEMPTION_NOTICE,
    RESUMED,
    TRAINER_EXITED,
    TRAINER_STARTED,
)

TRAINER = Path(__file__).with_name("trainer_script.py")
TOKEN = "test-agent-token-7f3a"  # the fake broker's (conftest.AGENT_TOKEN)
FAST = ["--heartbeat-seconds", "0.2", "--poll-seconds", "0.05", "--metadata-timeout", "0.5",
        "--log-seconds", "0.1", "--retry-max-seconds", "0.3"]


class Agent:
    """`python -m spotbroker.agent.cli run ... -- python trainer_script.py ...` as a subprocess."""

    def __init__(self, tmp: Path, trainer_args: list[str], broker_url: str | None, sim_url: str | None,
                 cloud: str = "local", token: str = TOKEN, options: list[str] | None = None,
                 env: dict[str, str] | None = None, trainer: list[str] | None = None,
                 relative_work_dir: bool = False) -> None:
        self.work_dir = tmp / "agent"
        extra_env = env
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update({
            ENV_AGENT_TOKEN: token, ENV_JOB_ID: "job-1", ENV_ATTEMPT_ID: "att-1", ENV_CLOUD: cloud,
            ENV_CHECKPOINT_URI: "file:///ckpt/team/job-1/att-1", ENV_RESUME_FROM: "file:///ckpt/step-7",
        })
        env.update(extra_env or {})
        if broker_url:
            env[ENV_BROKER_URL] = broker_url
        if sim_url:
            env[ENV_METADATA_URL] = sim_url
        # A launcher may name the work dir relative to where it starts the agent.
        work_dir = "agent" if relative_work_dir else str(self.work_dir)
        command = [sys.executable, "-m", "spotbroker.agent.cli", "run", *FAST, *(options or []),
                   "--work-dir", work_dir, "--", *(trainer or [sys.executable, str(TRAINER)]), *trainer_args]
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:  # a bound on a hang, not a measure:
        # a whole suite on two cores once kept a preempted agent's flush and exit past 20 s
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def agent(tmp_path):
    started: list[Agent] = []

    def start(*trainer_args: str, **kwargs) -> Agent:
        process = Agent(tmp_path, list(trainer_args), **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def _assert_in_order(types: list[str], *expected: str) -> None:
    positions = [types.index(t) for t in expected]
    assert positions == sorted(positions), f"expected {expected} in this order in {types}"


def _library_seen(broker) -> bool:
    return any(e["type"] == HEARTBEAT and e["data"]["library"] for e in broker.ordered())


def _assert_seq_contiguous(broker) -> None:
    seqs = sorted(broker.events)
    assert seqs == list(range(1, len(seqs) + 1))


def _outboxed(process) -> list[str]:
    """The types of the events the agent has written to its outbox (whole lines only)."""
    path = process.work_dir / "outbox.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return [json.loads(line)["type"] for line in lines if line.endswith("\n")]


def _control_dir(process) -> Path:
    [control] = process.work_dir.glob("control-*")
    return control


def exit_of(broker) -> dict:
    """The trainer_exited event's data, less the log's length, which is checked:
    the exit says how long the log is, and the broker has all of it."""
    data = dict(broker.first(TRAINER_EXITED)["data"])
    assert data.pop(EVENT_LOG_BYTES) == len(broker.log_bytes)
    return data


def _assert_drain_notice(broker, window: float) -> dict:
    """The one preemption_notice a drain is reported as; its data."""
    notices = [e["data"] for e in broker.ordered() if e["type"] == PREEMPTION_NOTICE]
    assert len(notices) == 1, notices
    [notice] = notices
    assert (notice["kind"], notice["cloud"], notice["source"], notice["raw"]) == (
        DRAIN_KIND, DRAIN_CLOUD, DRAIN_SOURCE, None)
    deadline, seen = datetime.fromisoformat(notice["deadline"]), datetime.fromisoformat(notice["observed_at"])
    assert deadline - seen == timedelta(seconds=window)  # the agent's notice window from the drain
    return notice


@pytest.mark.parametrize("cloud", ["aws", "azure", "gcp"])
def test_notice_reaches_the_broker_then_the_commit_then_the_exit(cloud, agent, broker, make_sim, wait, tmp_path):
    sim = make_sim(cloud, notice_window=8)
    env_file = tmp_path / "env.json"
    process = agent("--library", "--env-file", str(env_file), broker_url=broker.url, sim_url=sim.url, cloud=cloud)
    wait(lambda: broker.first(TRAINER_STARTED) and broker.first(HEARTBEAT), what="trainer_started and a heartbeat")
    wait(lambda: sim.requests >= 2, what="the watchers to poll")
    sim.preempt()
    code, out, err = process.finish()
    assert code == 0, err
    types = broker.types()
    _assert_in_order(types, TRAINER_STARTED, PREEMPTION_NOTICE, CHECKPOINT_COMMITTED, TRAINER_EXITED)
    assert NO_FLUSH not in types
    notice = broker.first(PREEMPTION_NOTICE)["data"]
    assert notice["cloud"] == cloud and notice["kind"] == "preemption"
    if cloud != "gcp":  # GCP publishes no deadline; the agent assumes its --notice-window
        assert abs((datetime.fromisoformat(notice["deadline"]) - sim.deadline).total_seconds()) < 1
    committed = broker.first(CHECKPOINT_COMMITTED)["data"]
    assert committed["reason"] == "preemption" and committed["deadline"] == notice["deadline"]
    assert exit_of(broker) == {"exit_code": 0}
    _assert_seq_contiguous(broker)
    assert broker.refused == 0
    if cloud == "azure":
        assert sim.acknowledged == [notice["raw"]["EventId"]]
    # The trainer's environment: the attempt's, a fresh control dir, never the agent's token.
    seen = json.loads(env_file.read_text())
    assert seen[ENV_CHECKPOINT_URI] == "file:///ckpt/team/job-1/att-1"
    assert seen[ENV_RESUME_FROM] == "file:///ckpt/step-7"
    assert (seen[ENV_JOB_ID], seen[ENV_ATTEMPT_ID]) == ("job-1", "att-1")
    assert Path(seen[ENV_CONTROL_DIR]).parent == process.work_dir
    assert ENV_AGENT_TOKEN not in seen
    assert TOKEN not in out + err


def test_trainer_without_the_library_is_never_signalled(agent, broker, make_sim, wait, tmp_path):
    sim = make_sim("aws", notice_window=30)
    # Without the library SIGUSR1 would kill this trainer (exit 138); it runs until SIGTERM (exit 42).
    ready = tmp_path / "trainer-env.json"  # written once its handlers are in (a SIGTERM before: exit 143)
    process = agent("--env-file", str(ready), broker_url=broker.url, sim_url=sim.url, cloud="aws")
    wait(lambda: broker.first(TRAINER_STARTED), what="trainer_started")
    wait(ready.exists, what="the trainer's handlers")
    sim.preempt()
    wait(lambda: broker.first(NO_FLUSH), what="no_flush")
    process.proc.send_signal(signal.SIGTERM)
    code, _, err = process.finish()
    assert code == 42, err
    types = broker.types()
    _assert_in_order(types, PREEMPTION_NOTICE, NO_FLUSH, TRAINER_EXITED)
    # a notice in a trainer's first seconds may come before its library announced itself: said so too
    reason = broker.first(NO_FLUSH)["data"]["reason"]
    assert re.fullmatch(r"the trainer does not use the checkpoint library, had not started it yet, or had closed "
                        r"it after its loop \(\d+ s after the trainer started\)", reason)
    assert broker.first(TRAINER_STARTED)["data"]["library"] is False


def test_no_flush_when_the_deadline_passes(agent, broker, make_sim, wait):
    sim = make_sim("aws", notice_window=1)
    process = agent("--library", "--ignore-flush", broker_url=broker.url, sim_url=sim.url, cloud="aws")
    wait(lambda: _library_seen(broker), what="the library")
    sim.preempt()
    wait(lambda: broker.first(NO_FLUSH), what="no_flush")
    assert "deadline" in broker.first(NO_FLUSH)["data"]["reason"]
    process.proc.send_signal(signal.SIGTERM)
    code, _, err = process.finish()
    assert code == 42, err
    _assert_in_order(broker.types(), PREEMPTION_NOTICE, NO_FLUSH, TRAINER_EXITED)
    assert CHECKPOINT_COMMITTED not in broker.types()


def test_broker_down_then_up_gets_every_event_once_in_order(agent, broker_factory, free_port, wait, tmp_path):
    done = tmp_path / "trainer-done"
    process = agent("--steps", "10", "--lines", "3", "--resumed", "--exit-code", "3", "--done-file", str(done),
                    broker_url=f"http://127.0.0.1:{free_port}", sim_url=None)
    wait(lambda: done.exists(), what="the trainer to finish while the broker is down")
    wait(lambda: process.work_dir.joinpath("outbox.jsonl").exists(), what="the outbox on disk")
    broker = broker_factory(port=free_port)  # the broker comes back
    code, out, err = process.finish()
    assert code == 3, err
    types = broker.types(include_heartbeats=True)
    assert types[0] == TRAINER_STARTED and types[-1] == TRAINER_EXITED and RESUMED in types
    assert broker.first(RESUMED)["data"] == {"step": 7, "uri": "file:///ckpt/step-000000000007"}
    _assert_seq_contiguous(broker)
    arrived = [event["seq"] for _, event in broker.arrivals]
    assert len(arrived) == len(set(arrived))  # nothing delivered twice
    assert types.count(HEARTBEAT) <= 2  # heartbeats do not pile up while the broker is away
    outbox = [json.loads(line) for line in process.work_dir.joinpath("outbox.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in outbox] == sorted(broker.events)
    assert broker.log_bytes.count(b"out line") == 3


def test_logs_are_shipped_with_offsets_and_mirrored(agent, broker):
    process = agent("--lines", "200", "--steps", "5", broker_url=broker.url, sim_url=None)
    code, out, err = process.finish()
    assert code == 0, err
    shipped = bytes(broker.log_bytes).decode()
    for i in (0, 199):
        assert f"out line {i}\n" in shipped and f"err line {i}\n" in shipped
        assert f"out line {i}\n" in out and f"err line {i}\n" in out  # mirrored on the agent's stdout
    offsets = [0]
    for offset, length in broker.log_posts:
        assert offset == offsets[-1]  # each chunk starts where the broker's log ends
        offsets.append(offset + length)
    assert offsets[-1] == len(broker.log_bytes) == len((process.work_dir / "trainer.log").read_bytes())


def test_the_whole_log_reaches_the_broker_before_the_trainers_exit(agent, broker):
    """A script that waits for the job to end and then reads its log gets all
    of it: the broker hears of the exit only once it holds the output."""
    process = agent("--lines", "40000", "--steps", "1", options=["--log-seconds", "30"],
                    broker_url=broker.url, sim_url=None)
    code, _, err = process.finish(timeout=60)
    assert code == 0, err
    size = len((process.work_dir / "trainer.log").read_bytes())
    assert size > 1 << 20  # more than one request's chunk
    assert broker.log_size_at["trainer_exited"] == size


@pytest.mark.parametrize("trainer_code", [0, 7])
def test_exit_code_is_passed_through(agent, broker, trainer_code):
    code, _, err = agent("--steps", "3", "--exit-code", str(trainer_code), broker_url=broker.url,
                         sim_url=None).finish()
    assert code == trainer_code, err
    assert exit_of(broker) == {"exit_code": trainer_code}


@pytest.mark.parametrize("sig, trainer_code", [(signal.SIGTERM, 42), (signal.SIGINT, 43)])
def test_signals_are_forwarded_to_the_trainer(agent, broker, wait, tmp_path, sig, trainer_code):
    env_file = tmp_path / "env.json"
    process = agent("--env-file", str(env_file), broker_url=broker.url, sim_url=None)
    wait(env_file.exists, what="the trainer to run")
    process.proc.send_signal(sig)
    code, out, err = process.finish()
    assert code == trainer_code, err  # the trainer's handler exits 42 on SIGTERM, 43 on SIGINT
    assert f"trainer: got {sig.name}" in out
    assert exit_of(broker) == {"exit_code": trainer_code}


def test_a_gone_broker_stops_the_delivery_and_the_trainer_and_the_agent_exits(agent, broker, wait):
    """410: the broker ended this attempt long ago. The agent stops a trainer
    that still runs (as on a cancel), delivers nothing more, and exits."""
    broker.fail_status = 410
    started = time.monotonic()
    code, _, err = agent(broker_url=broker.url, sim_url=None).finish(timeout=30)
    assert code == 42, err  # the trainer's own answer to SIGTERM
    assert "410" in err and "Traceback" not in err
    assert time.monotonic() - started < 20


def test_a_gone_broker_after_the_trainer_exited_ends_the_delivery_at_once(agent, broker_factory, free_port,
                                                                          tmp_path, wait):
    done = tmp_path / "trainer-done"
    process = agent("--steps", "3", "--lines", "5", "--exit-code", "4", "--done-file", str(done),
                    broker_url=f"http://127.0.0.1:{free_port}", sim_url=None)
    wait(done.exists, what="the trainer to finish while the broker is down")
    time.sleep(1.0)
    assert process.proc.poll() is None  # still delivering
    broker = broker_factory(port=free_port)
    broker.fail_status = 410
    code, _, err = process.finish(timeout=15)
    assert code == 4, err
    assert not broker.events and "Traceback" not in err
    outbox = [json.loads(line) for line in process.work_dir.joinpath("outbox.jsonl").read_text().splitlines()]
    assert outbox[-1]["type"] == TRAINER_EXITED  # still on disk: never delivered, never lost


def test_sigterm_while_only_delivery_is_left_ends_it(agent, free_port, tmp_path, wait):
    done = tmp_path / "trainer-done"
    process = agent("--steps", "3", "--done-file", str(done), broker_url=f"http://127.0.0.1:{free_port}",
                    sim_url=None)
    wait(done.exists, what="the trainer to finish while the broker is down")
    # Only delivery is left once the agent has seen the trainer exit (it then records trainer_exited).
    wait(lambda: TRAINER_EXITED in _outboxed(process), what="the agent to see the trainer exit")
    process.proc.send_signal(signal.SIGTERM)
    code, _, err = process.finish(timeout=15)
    assert code == 0 and "Traceback" not in err, err


def test_an_agent_restarted_on_its_work_dir_delivers_what_it_buffered(agent, broker_factory, free_port):
    # First run: the broker is down the whole time; the events stay in the outbox.
    code, _, _ = agent("--steps", "2", "--exit-code", "5", broker_url=f"http://127.0.0.1:{free_port}",
                       sim_url=None, options=["--final-flush-seconds", "0.3"]).finish()
    assert code == 5
    broker = broker_factory(port=free_port)
    code, _, err = agent("--steps", "2", broker_url=broker.url, sim_url=None).finish()
    assert code == 0, err
    _assert_seq_contiguous(broker)
    exits = [e["data"]["exit_code"] for e in broker.ordered() if e["type"] == TRAINER_EXITED]
    assert exits == [5, 0]  # the first run's events first, in order


def test_cancel_from_the_broker_stops_the_trainer(agent, broker, wait):
    broker.cancel = True
    code, _, err = agent(broker_url=broker.url, sim_url=None).finish()
    assert code == 42, err
    assert exit_of(broker) == {"exit_code": 42}


def test_drain_flushes_once_however_often_the_broker_says_it(agent, broker, wait):
    process = agent("--library", "--stay", broker_url=broker.url, sim_url=None, options=["--notice-window", "15"])
    wait(lambda: _library_seen(broker), what="the library")
    broker.drain = True  # every answer from now on says drain
    committed = wait(lambda: broker.first(CHECKPOINT_COMMITTED), what="the flush commit")
    answered = broker.answers
    wait(lambda: broker.answers >= answered + 5, what="more answers saying drain")
    broker.cancel = True  # the broker moves the job: it stops this attempt
    code, out, err = process.finish()
    assert code == 42, err  # stopped by the cancel's SIGTERM, not by the drain
    types = broker.types()
    _assert_in_order(types, TRAINER_STARTED, PREEMPTION_NOTICE, CHECKPOINT_COMMITTED, TRAINER_EXITED)
    notice = _assert_drain_notice(broker, 15)
    assert types.count(CHECKPOINT_COMMITTED) == 1 and NO_FLUSH not in types
    assert committed["data"]["reason"] == DRAIN_KIND and committed["data"]["deadline"] == notice["deadline"]
    assert out.count("trainer: flush request") == 1  # signalled once
    assert err.count("asked the library") == 1
    flush = json.loads((_control_dir(process) / FLUSH_FILE).read_text())
    assert flush == {"deadline": notice["deadline"], "reason": DRAIN_KIND}
    _assert_seq_contiguous(broker)


def test_a_drain_takes_the_brokers_time_for_the_flush(agent, broker, wait):
    process = agent("--library", "--stay", broker_url=broker.url, sim_url=None, options=["--notice-window", "15"])
    wait(lambda: _library_seen(broker), what="the library")
    broker.drain, broker.drain_seconds = True, 150.0
    wait(lambda: broker.first(CHECKPOINT_COMMITTED), what="the flush commit")
    broker.cancel = True
    process.finish()
    _assert_drain_notice(broker, 150)  # not the agent's own 15 s notice window


def test_drain_without_a_commit_ends_in_no_flush_once(agent, broker, wait):
    process = agent("--library", "--ignore-flush", broker_url=broker.url, sim_url=None,
                    options=["--notice-window", "1"])
    wait(lambda: _library_seen(broker), what="the library")
    broker.drain = True
    wait(lambda: broker.first(NO_FLUSH), what="no_flush")
    answered = broker.answers
    wait(lambda: broker.answers >= answered + 5, what="more answers saying drain")
    broker.cancel = True
    code, out, err = process.finish()
    assert code == 42, err
    _assert_drain_notice(broker, 1)
    assert broker.types().count(NO_FLUSH) == 1 and "deadline" in broker.first(NO_FLUSH)["data"]["reason"]
    assert out.count("trainer: flush request") == 1


@pytest.mark.parametrize("drain", [None, False])  # None: the answer has no "drain" (an older broker)
def test_an_answer_without_drain_is_no_drain(agent, broker, drain, wait, tmp_path):
    broker.drain = drain
    stop = tmp_path / "stop"
    process = agent("--library", "--until-file", str(stop), broker_url=broker.url, sim_url=None)
    # Training goes on until the agent has heard a few such answers (however slowly they come).
    wait(lambda: broker.answers >= 3, what="three answers")
    stop.touch()
    code, out, err = process.finish()
    assert code == 0, err
    assert broker.answers >= 3
    types = broker.types()
    assert PREEMPTION_NOTICE not in types and NO_FLUSH not in types and CHECKPOINT_COMMITTED not in types
    assert "trainer: flush request" not in out and "asked this attempt to drain" not in err
    assert not (_control_dir(process) / FLUSH_FILE).exists()


def test_the_output_is_drained_when_the_log_file_cannot_be_opened(agent, broker, tmp_path):
    work_dir = tmp_path / "agent"
    work_dir.mkdir()
    (work_dir / "trainer.log").symlink_to(tmp_path / "no-such-dir" / "trainer.log")
    # Far more than a pipe holds: a trainer whose output nobody reads would block for ever.
    code, out, err = agent("--lines", "5000", "--steps", "2", broker_url=broker.url, sim_url=None).finish()
    assert code == 0, err
    assert "out line 4999\n" in out and "err line 4999\n" in out  # still mirrored
    assert "cannot open" in err and "trainer.log" in err
    assert exit_of(broker) == {"exit_code": 0}


def test_a_wrong_token_is_refused_and_the_trainer_still_runs(agent, broker):
    code, _, err = agent("--steps", "3", broker_url=broker.url, sim_url=None, token="wrong-token-5d1e",
                         options=["--final-flush-seconds", "0.5"]).finish()
    assert code == 0
    assert broker.refused > 0 and not broker.events
    assert "wrong-token-5d1e" not in err  # the token is never logged


def test_agent_entry_point_imports_stay_light():
    probe = ("import sys, spotbroker.agent.cli, spotbroker.agent.runner, spotbroker.agent.notices; "
             "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'sky', 'fastapi', 'sqlalchemy') "
             "or m.startswith(('spotbroker.broker', 'spotbroker.api'))])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.slow  # torch's import dominates: deselect with -m "not slow" for a quick run
def test_the_real_checkpoint_library_flushes_on_notice(agent, broker, make_sim, wait, tmp_path):
    """examples/train.py with the checkpoint library: notice -> SIGUSR1 -> flush committed -> reported."""
    pytest.importorskip("torch")
    train = [sys.executable, str(Path(__file__).parents[2] / "examples" / "train.py")]
    job_uri = (tmp_path / "ckpt").as_uri()
    first, sim = broker, make_sim("aws", notice_window=20)
    # No periodic saves: the one commit is the flush.
    process = agent("--steps", "100000", "--step-seconds", "0.005", "--every-steps", "1000000",
                    broker_url=first.url, sim_url=sim.url, cloud="aws", trainer=train,
                    env={ENV_CHECKPOINT_URI: f"{job_uri}/att-1", ENV_RESUME_FROM: ""})
    wait(lambda: _library_seen(first), timeout=30, what="the library to start")
    sim.preempt()
    wait(lambda: first.first(CHECKPOINT_COMMITTED), timeout=20, what="the flush commit")
    process.proc.send_signal(signal.SIGTERM)  # the node goes away
    code, _, err = process.finish()
    assert code == 128 + signal.SIGTERM, err
    _assert_in_order(first.types(), PREEMPTION_NOTICE, CHECKPOINT_COMMITTED, TRAINER_EXITED)
    flushed = first.first(CHECKPOINT_COMMITTED)["data"]
    assert flushed["reason"] == "flush" and flushed["step"] > 0 and NO_FLUSH not in first.types()


@pytest.mark.slow
def test_the_real_checkpoint_library_flushes_on_drain_once(agent, broker, wait, tmp_path):
    """examples/train.py: the broker's drain -> flush.json (reason drain) + SIGUSR1 -> one commit, reported."""
    pytest.importorskip("torch")
    train = [sys.executable, str(Path(__file__).parents[2] / "examples" / "train.py")]
    job_uri = (tmp_path / "ckpt").as_uri()
    process = agent("--steps", "100000", "--step-seconds", "0.005", "--every-steps", "1000000",
                    broker_url=broker.url, sim_url=None, trainer=train, options=["--notice-window", "20"],
                    env={ENV_CHECKPOINT_URI: f"{job_uri}/att-1", ENV_RESUME_FROM: ""})
    wait(lambda: _library_seen(broker), timeout=30, what="the library to start")
    broker.drain = True
    wait(lambda: broker.first(CHECKPOINT_COMMITTED), timeout=20, what="the flush commit")
    answered = broker.answers
    wait(lambda: broker.answers >= answered + 5, what="more answers saying drain")
    broker.cancel = True  # then the broker stops the attempt
    code, _, err = process.finish()
    assert code == 128 + signal.SIGTERM, err
    types = broker.types()
    _assert_in_order(types, PREEMPTION_NOTICE, CHECKPOINT_COMMITTED, TRAINER_EXITED)
    notice = _assert_drain_notice(broker, 20)
    assert types.count(CHECKPOINT_COMMITTED) == 1 and NO_FLUSH not in types
    flushed = broker.first(CHECKPOINT_COMMITTED)["data"]
    assert flushed["reason"] == "flush" and flushed["step"] > 0  # the library's name for any requested save
    flush = json.loads((_control_dir(process) / FLUSH_FILE).read_text())
    assert flush == {"deadline": notice["deadline"], "reason": DRAIN_KIND}
    # The library's own log line (shipped with the trainer's output): it took the request as a drain.
    assert bytes(broker.log_bytes).decode().count(f"flush requested ({DRAIN_KIND}, deadline {notice['deadline']})") == 1


def test_a_command_that_cannot_start_is_reported(agent, broker):
    code, _, err = agent(broker_url=broker.url, sim_url=None, trainer=["/nonexistent/train"]).finish()
    assert code == 127
    [exited] = broker.ordered()
    assert exited["type"] == TRAINER_EXITED and exited["data"]["exit_code"] == 127
    assert "/nonexistent/train" in exited["data"]["error"] and "cannot start" in err


def test_the_cloud_is_detected_from_the_metadata_url(agent, broker, make_sim, wait):
    sim = make_sim("azure", notice_window=30)
    process = agent(broker_url=broker.url, sim_url=sim.url, cloud="")  # SPOTBROKER_CLOUD unset: detect
    wait(lambda: sim.hits["/metadata/scheduledevents"], what="the agent to watch Scheduled Events")
    sim.preempt()
    wait(lambda: broker.first(NO_FLUSH), what="the notice to be handled")
    assert broker.first(PREEMPTION_NOTICE)["data"]["cloud"] == "azure"
    process.proc.send_signal(signal.SIGTERM)
    assert process.finish()[0] == 42


def test_an_event_the_broker_rejects_is_dropped_alone(agent, broker):
    broker.reject_types = {RESUMED}
    code, _, err = agent("--resumed", "--steps", "3", broker_url=broker.url, sim_url=None).finish()
    assert code == 0, err
    types = broker.types()
    assert RESUMED not in types and types[0] == TRAINER_STARTED and types[-1] == TRAINER_EXITED
    assert "rejected event" in err


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie nobody reaped yet
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_the_trainer_does_not_outlive_a_killed_agent(agent, broker, wait):
    process = agent(broker_url=broker.url, sim_url=None)
    started = wait(lambda: broker.first(TRAINER_STARTED), what="trainer_started")
    process.proc.kill()  # SIGKILL: no chance to forward anything
    process.proc.communicate()
    wait(lambda: _gone(started["data"]["pid"]), what="the trainer to be terminated")


def test_a_drain_that_comes_after_the_trainer_exited_is_answered_with_no_flush(tmp_path):
    """Answers keep coming while the last events are delivered; a drain then
    must not wait on a notice handler that is gone."""
    from spotbroker.agent.config import RunnerConfig
    from spotbroker.agent.runner import Supervisor

    supervisor = Supervisor(RunnerConfig(command=["true"], work_dir=tmp_path))
    supervisor._stopping.set()  # as _finish leaves it, before the last delivery
    supervisor.drain(60.0)
    supervisor.drain(60.0)
    types = [e["type"] for e in supervisor.outbox.batch()]
    assert types == [NO_FLUSH] and supervisor._notices.empty()
    supervisor.outbox.close()


@pytest.mark.parametrize("shape", ["cd", "grandchild", "setup-then-cd"])
def test_the_flush_reaches_a_trainer_that_changed_directory(shape, agent, broker, make_sim, wait, tmp_path):
    """The agent's work dir is given relative to where it starts (as the local
    launcher did), and the trainer runs elsewhere: the control channel must
    still work, and nothing is written where the trainer runs."""
    sim = make_sim("aws", notice_window=8)
    user_dir = tmp_path / "checkout" / "src"
    user_dir.mkdir(parents=True)
    trainer = f"{shlex.quote(sys.executable)} {shlex.quote(str(TRAINER))} --library"
    script = {"cd": f"cd {shlex.quote(str(user_dir))} && exec {trainer}",
              "grandchild": f"cd {shlex.quote(str(user_dir))} && bash -c {shlex.quote(trainer)}",
              "setup-then-cd": f"cd {shlex.quote(str(user_dir.parent))} && (echo setting up) && cd src && {trainer}"}
    process = agent(broker_url=broker.url, sim_url=sim.url, cloud="aws", relative_work_dir=True,
                    trainer=["bash", "-c", script[shape]])
    wait(lambda: _library_seen(broker), what="the library to be seen")
    sim.preempt()
    code, _, err = process.finish()
    assert code == 0, err
    assert NO_FLUSH not in broker.types(), broker.first(NO_FLUSH)
    _assert_in_order(broker.types(), PREEMPTION_NOTICE, CHECKPOINT_COMMITTED, TRAINER_EXITED)
    assert [p.name for p in user_dir.parent.rglob("*")] == ["src"]  # nothing written into the user's tree


def test_a_control_channel_that_cannot_be_set_up_is_reported_at_start(broker, make_sim, wait, tmp_path,
                                                                       monkeypatch):
    """The agent cannot make its control directory (here: a full disk): the
    trainer still runs, the broker hears why at start, and a notice gets a
    no_flush naming the cause at once, never a silent "no library"."""
    import errno
    import threading

    from spotbroker.agent import runner
    from spotbroker.agent.protocol import CONTROL_UNAVAILABLE

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner.tempfile, "mkdtemp", full_disk)
    sim = make_sim("aws", notice_window=8)
    env_file = tmp_path / "env.json"
    config = runner.RunnerConfig(
        command=[sys.executable, str(TRAINER), "--library", "--env-file", str(env_file), "--steps", "100"],
        broker_url=broker.url, token=TOKEN, cloud="aws", metadata_url=sim.url, work_dir=tmp_path / "agent",
        heartbeat_interval=0.2, poll_interval=0.05, metadata_timeout=0.5, log_interval=0.1, retry_max=0.3)
    supervisor = runner.Supervisor(config)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", supervisor.run(False)))
    thread.start()
    wait(lambda: broker.first(CONTROL_UNAVAILABLE), what="control_unavailable")
    sim.preempt()
    wait(lambda: broker.first(NO_FLUSH), what="no_flush")
    thread.join(timeout=30)
    assert result["code"] == 0  # the trainer ran to its end
    reason = broker.first(CONTROL_UNAVAILABLE)["data"]["reason"]
    assert "No space left on device" in reason
    assert "control channel" in broker.first(NO_FLUSH)["data"]["reason"]
    _assert_in_order(broker.types(), CONTROL_UNAVAILABLE, PREEMPTION_NOTICE, NO_FLUSH, TRAINER_EXITED)
    assert ENV_CONTROL_DIR not in json.loads(env_file.read_text())
