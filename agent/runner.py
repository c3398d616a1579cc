"""The supervisor behind `spotbroker agent run -- CMD...`.

It starts the trainer in its own process group, with the attempt's
environment and a fresh control directory, and then, until the trainer exits:

* forwards SIGTERM/SIGINT to the trainer's process group;
* mirrors the trainer's output (stdout and stderr, merged) to its own stdout
  and ships it to the broker by byte offset;
* forwards the library's events (`events.jsonl`: checkpoint_committed,
  resumed, ...) and its own (trainer_started, heartbeat, preemption_notice,
  no_flush, trainer_exited) through an on-disk outbox, in seq order, so that
  a broker that is down gets everything, once, when it is back;
* on a preemption notice: reports it at once; if the trainer uses the
  checkpoint library, writes `flush.json` and sends SIGUSR1 to every process
  that announced the library within the trainer's process tree, whatever its
  session (torchrun's workers), never a process outside it (the ranks then
  agree on one step); waits for `checkpoint_committed` until the cloud's
  deadline (else reports `no_flush` with the reason); then acknowledges the
  notice where the cloud wants it (Azure);
* on a drain (the broker's answer says ``drain``: it is moving the job, or
  another node of this job had a notice): does the same, once, as for a
  notice of kind ``drain`` whose deadline is the notice window from now.

On node N > 0 of a multi-node job (``--node-rank``) every event carries
``node: N`` and the trainer's output stays in the node's own log.

It exits with the trainer's exit code (128 + N when the trainer died of
signal N; 127, reported as trainer_exited too, when the command cannot be
started). Start-up is kept light: httpx and the watchers are imported only
after the trainer is running.

This module is the orchestration. What it is told: :mod:`.config`; the outbox:
:mod:`.outbox`; the threads that deliver it and the trainer's log: :mod:`.delivery`;
the notice path: :mod:`.notice_path` (which processes to ask to flush: :mod:`.flush`);
reading the trainer's events and output: :mod:`.trainer_process`.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotbroker.agent import proctree
from spotbroker.agent.config import RunnerConfig
from spotbroker.agent.credentials import CredentialsKeeper
from spotbroker.agent.delivery import (
    BrokerClient,
    BrokerGone,
    BrokerRejected,
    Delivery,
    EventSender,
    LogShipper,
    log_size,
)
from spotbroker.agent.energy import GpuEnergy
from spotbroker.agent.flush import write_interval_file
from spotbroker.agent.metricsfold import MetricsFolder
from spotbroker.agent.notice_path import NoticePath
from spotbroker.agent.outbox import OUTBOX_FILE, Outbox
from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    CONTROL_UNAVAILABLE,
    ENV_AGENT_TOKEN,
    ENV_AGENT_TOKEN_FD,
    ENV_ATTEMPT_ID,
    ENV_CONTROL_DIR,
    ENV_JOB_ID,
    ENV_TRAINER_ENV_FD,
    EVENT_LOG_BYTES,
    EVENTS_FILE,
    GPU_JOULES,
    GPU_SECONDS,
    HEARTBEAT,
    METRICS,
    TRAINER_EXITED,
    TRAINER_STARTED,
)
from spotbroker.agent.stop_path import StopPath
from spotbroker.agent.trainer_process import (
    TRAINER_EVENT_TYPES,
    EventTail,
    event_data,
    pump_output,
    signal_name,
    terminate_with,
)

if TYPE_CHECKING:
    from spotbroker.agent.notices import Notice, Watchers

log = logging.getLogger("spotbroker.agent")

TRAINER_LOG_FILE = "trainer.log"
COMMAND_NOT_STARTED = 127  # the shell's code for a command that could not be run
LOG_BEFORE_EXIT_SECONDS = 10.0  # the longest the exit waits for the log to be shipped


class Supervisor(NoticePath, StopPath):
    def __init__(self, config: RunnerConfig) -> None:
        if not config.command:
            raise ValueError("no trainer command given (spotbroker agent run -- CMD...)")
        self.config = config
        # Absolute: the trainer is handed paths below it and may change directory.
        self.work_dir = Path(config.work_dir or tempfile.mkdtemp(prefix="spotbroker-agent-")).absolute()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.control_dir: Path | None = None
        self.control_error: str | None = None
        try:
            self.control_dir = Path(tempfile.mkdtemp(prefix="control-", dir=self.work_dir))
        except OSError as exc:  # the trainer still runs; no flush can be asked of it
            self.control_error = f"cannot create a control directory in {self.work_dir}: {exc.strerror or exc}"
        self.log_path = self.work_dir / TRAINER_LOG_FILE
        self.outbox = Outbox(self.work_dir)
        self.metrics = MetricsFolder(self.outbox, config.metrics_interval)
        self.tail = EventTail(self.control_dir / EVENTS_FILE if self.control_dir else None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._trainer_started_s = 0.0  # monotonic
        self.client: BrokerClient | None = None
        self.credentials: CredentialsKeeper | None = None  # the attempt's storage credentials, if launched with any
        self.watchers: Watchers | None = None
        self._threads: list[threading.Thread] = []
        self._deliveries: list[Delivery] = []
        self._finish_by: float | None = None  # monotonic: delivery ends then (final_flush_timeout)
        self._notices: queue.Queue[Notice | None] = queue.Queue()
        self._trainer_done = threading.Event()
        self._early_signal: int | None = None  # a SIGTERM/SIGINT that came before the trainer had started
        self._stopping = threading.Event()
        self._committed = threading.Event()
        self._flush_requested = False
        self._flush_over = False
        self._cancelled = False
        self._drain_requested = False
        self._stop_requested = False
        self._library_flushed = False
        self._watchers_lock = threading.Lock()
        self._forward_lock = threading.Lock()
        self._interval: float | None = None  # the broker's checkpoint interval, as last written for the library
        self.energy = GpuEnergy()
        self._energy_since: float | None = None  # monotonic: when the GPUs' counters were first read

    # --- the whole run -------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:  # first: else a signal before them ends the agent and strands the trainer
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._forward_signal)
        try:
            self._start_trainer()
            if self._early_signal is not None:
                self._signal_group(self._early_signal)
        except OSError as exc:  # no such command, not executable: the broker must still hear of it
            reason = f"cannot start {self.config.command[0]!r}: {exc.strerror or exc}"
            log.error("%s", reason)
            self.outbox.add(TRAINER_EXITED, {"exit_code": COMMAND_NOT_STARTED, "error": reason})
            self._start_deliveries()
            self._deliver_and_close()
            return COMMAND_NOT_STARTED
        if self.energy.start():
            self._energy_since = time.monotonic()
        else:
            log.info("the GPUs' energy is not measured here (%s): the broker estimates it", self.energy.why_not)
        if self.control_error:
            log.error("the control channel is not set up (%s): preemption notices cannot be flushed",
                      self.control_error)
            self.outbox.add(CONTROL_UNAVAILABLE, {"reason": self.control_error})
        self.outbox.add(TRAINER_STARTED, {"pid": self.proc.pid, "library": bool(self._library_pids())})
        self._heartbeat()  # the first at once: the broker counts the attempt as running from it
        self._start_threads()
        returncode = self.proc.wait()
        return self._finish(returncode)

    def _start_trainer(self) -> None:
        env = dict(os.environ)
        env.pop(ENV_AGENT_TOKEN, None)  # the trainer never needs the agent's credential
        env.pop(ENV_AGENT_TOKEN_FD, None)
        env.pop(ENV_TRAINER_ENV_FD, None)
        env.update(self.config.trainer_env)
        env.pop(ENV_CONTROL_DIR, None)  # only this agent's own
        if self.control_dir is not None:
            env[ENV_CONTROL_DIR] = str(self.control_dir)
        if self.config.job_id:
            env[ENV_JOB_ID] = self.config.job_id
        if self.config.attempt_id:
            env[ENV_ATTEMPT_ID] = self.config.attempt_id
        env.setdefault("PYTHONUNBUFFERED", "1")  # a Python trainer's output arrives as it is written
        self.credentials = CredentialsKeeper.start_for(self.control_dir, env,  # names its file in env
                                                       lead=self.config.credentials_lead)
        self.proc = subprocess.Popen(
            self.config.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,  # its own group: signals reach all its processes
            preexec_fn=terminate_with(os.getpid()),
        )
        self._trainer_started_s = time.monotonic()
        log.info("trainer started, pid %d, control dir %s", self.proc.pid, self.control_dir)

    def _start_threads(self) -> None:
        self._spawn(self._pump_output, "trainer-output")
        self._spawn(self._tail_events, "event-tail")
        self._spawn(self._heartbeats, "heartbeat")
        self._spawn(self._handle_notices, "notice-handler")
        self._spawn(self._start_watchers, "watchers-start")
        self._start_deliveries()

    def _start_deliveries(self) -> None:
        if self.config.broker_url:
            self.client = BrokerClient(self.config.broker_url, self.config.token, self.config.request_timeout)
            self._deliveries = [
                EventSender(self.outbox, self.client, self.config, self.cancel, self.drain, on_gone=self.gone,
                            node=self.config.node_rank, on_stop=self.stop_early, on_interval=self.set_interval),
            ]
            self._deliveries.append(LogShipper(self.log_path, self.client, self.config, on_gone=self.gone,
                                               node=self.config.node_rank))
            for delivery in self._deliveries:
                delivery.start()
            if self.credentials is not None:
                self._spawn(lambda: self.credentials.run(self.client.post_credentials, self._trainer_done,
                                                         gone=(BrokerGone, BrokerRejected)), "credentials")
        else:
            log.warning("no broker URL: events stay in %s", self.work_dir / OUTBOX_FILE)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _finish(self, returncode: int) -> int:
        self._trainer_done.set()
        exit_code = 128 - returncode if returncode < 0 else returncode
        log.info("trainer exited with code %d", exit_code)
        self._join("trainer-output", 2.0)  # a child still holding the pipe must not keep us here
        self._stopping.set()
        self._forward_trainer_events()  # what the library wrote last
        self.metrics.flush()
        self._notices.put(None)
        self._join("notice-handler", 10.0)  # it may still acknowledge (Azure): watchers stop after
        self._stop_watchers()
        data: dict[str, Any] = {"exit_code": exit_code, EVENT_LOG_BYTES: log_size(self.log_path),
                                **self._energy_used()}
        self.energy.close()
        if returncode < 0:
            data["signal"] = signal_name(-returncode)
        self._ship_log_first()
        self.outbox.add(TRAINER_EXITED, data)
        self._deliver_and_close()
        return exit_code

    def _ship_log_first(self) -> None:
        """The trainer's output reaches the broker before its exit does: a
        script that waits for the job to end and then reads the log gets all
        of it. Bounded: a broker that cannot take the log now still hears of
        the exit (the log follows, as everything left does)."""
        deadline = self._final_deadline()
        for shipper in (d for d in self._deliveries if isinstance(d, LogShipper)):
            shipper.finish(deadline)
            shipper.join(LOG_BEFORE_EXIT_SECONDS)

    def _final_deadline(self) -> float | None:
        if self._finish_by is None and self.config.final_flush_timeout is not None:
            self._finish_by = time.monotonic() + self.config.final_flush_timeout
        return self._finish_by

    def _deliver_and_close(self) -> None:
        """Give the broker everything (within final_flush_timeout, if set), unless
        it says the attempt is gone; what is left stays on disk."""
        timeout = self.config.final_flush_timeout
        deadline = self._final_deadline()
        for delivery in self._deliveries:
            delivery.finish(deadline)
        if any(d.is_alive() for d in self._deliveries):
            log.info("delivering what is left to the broker%s",
                     "" if deadline is None else f" (for at most {timeout:g} s)")
        for delivery in self._deliveries:
            delivery.join(None if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0)
        if self.client is not None:
            self.client.close()
        self.outbox.close()

    def _join(self, name: str, timeout: float) -> None:
        for thread in self._threads:
            if thread.name == name:
                thread.join(timeout)

    # --- signals and cancel --------------------------------------------------------

    def _forward_signal(self, signum: int, frame: object) -> None:
        if self._trainer_done.is_set():  # only delivery is left: the signal ends it (the outbox stays on disk)
            log.warning("%s while delivering to the broker: stopping", signal.Signals(signum).name)
            for delivery in self._deliveries:
                delivery.stop()
            return
        if self.proc is None:  # forwarded once it has started
            self._early_signal = signum
            return
        log.info("forwarding %s to the trainer", signal.Signals(signum).name)
        self._signal_group(signum)

    def gone(self) -> None:
        """The broker answered 410: it ended this attempt long ago and takes
        nothing more. Deliver nothing more; a trainer still running is stopped
        as on a cancel, and the agent then exits with its code."""
        for delivery in self._deliveries:
            delivery.stop()
        if not self._trainer_done.is_set():
            self.cancel()

    def set_interval(self, seconds: float | None) -> None:
        """The broker's checkpoint interval: written for the library when it changes."""
        if seconds == self._interval or self.control_dir is None:
            return
        try:
            write_interval_file(self.control_dir, seconds)
            self._interval = seconds
        except OSError as exc:
            log.warning("cannot hand the checkpoint interval to the library: %s", exc)

    def _signal_group(self, signum: int) -> None:
        """The trainer's group and its whole tree (torchrun's workers run in sessions of their own)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        proctree.signal_group_and_tree(self.proc.pid, signum)

    def cancel(self) -> None:
        """The broker cancelled the attempt: SIGTERM the trainer, SIGKILL it after a grace."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._stop_requested:  # an early stop: the trainer leaves its loop by itself, or is stopped after a grace
            grace = threading.Timer(self.config.kill_grace, self._terminate)
            grace.daemon = True
            grace.start()
            return
        self._terminate()

    def _terminate(self) -> None:
        if self._trainer_done.is_set():
            return
        log.warning("the broker cancelled this attempt: stopping the trainer")
        self._signal_group(signal.SIGTERM)
        timer = threading.Timer(self.config.kill_grace, self._signal_group, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    # --- the trainer's output and events --------------------------------------------

    def _pump_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        pump_output(self.proc.stdout.fileno(), self.log_path, self.config.max_log_bytes)

    def _tail_events(self) -> None:
        while not self._stopping.is_set():
            self._forward_trainer_events()
            self.metrics.flush(force=False)
            self._stopping.wait(self.config.tail_interval)

    def _forward_trainer_events(self) -> None:
        # One reader at a time, from reading a line to acting on it: the notice handler's
        # last look must not miss a commit that the tail thread has read but not yet flagged.
        with self._forward_lock:
            self._forward_new_events()

    def _forward_new_events(self) -> None:
        for event in self.tail.read_new():
            event_type = event.get("type")
            if event_type not in TRAINER_EVENT_TYPES:
                log.warning("ignoring a library event of type %r", event_type)
                continue
            data = event_data(event)
            if event_type == METRICS:
                self.metrics.add(data)
                continue
            at = event.get("at") if isinstance(event.get("at"), str) else None
            self.outbox.add(event_type, data, at)
            if event_type == CHECKPOINT_COMMITTED and data.get("reason") == "flush":
                self._library_flushed = True  # (the ranks may flush for another node's notice)
            if event_type == CHECKPOINT_COMMITTED and self._flush_requested and data.get("reason") != "periodic":
                self._committed.set()

    def _heartbeats(self) -> None:
        while not self._trainer_done.wait(self.config.heartbeat_interval):
            self._heartbeat()

    def _heartbeat(self) -> None:
        if self.outbox.has_pending(HEARTBEAT):
            return  # the broker has not had the last one: one pending heartbeat says enough
        self.outbox.add(HEARTBEAT, {"pid": self.proc.pid if self.proc else None,
                                    "library": bool(self._library_pids()), **self._energy_used()})

    def _energy_used(self) -> dict[str, float]:
        """The GPUs' measured energy so far, for the broker's ledger; nothing when not measured."""
        joules = self.energy.joules() if self._energy_since is not None else None
        if joules is None:
            return {}
        return {GPU_JOULES: joules, GPU_SECONDS: time.monotonic() - self._energy_since}

def run(config: RunnerConfig, install_signal_handlers: bool = True) -> int:
    """Supervise one trainer; return its exit code."""
    return Supervisor(config).run(install_signal_handlers)
