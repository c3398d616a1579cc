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
  checkpoint library (`library.json`), writes `flush.json` and sends SIGUSR1
  to the library's pid only, then waits for `checkpoint_committed` until the
  cloud's deadline (else reports `no_flush` with the reason); then
  acknowledges the notice where the cloud wants it (Azure);
* on a drain (the broker's answer says ``drain``: it is moving the job):
  does the same, once, as for a notice of kind ``drain`` whose deadline is
  the notice window from now; the broker then cancels the attempt.

It exits with the trainer's exit code (128 + N when the trainer died of
signal N; 127, reported as trainer_exited too, when the command cannot be
started). Start-up is kept light: httpx and the watchers are imported only
after the trainer is running.

This module is the orchestration; the outbox is :mod:`spotbroker.agent.outbox`,
the threads that deliver it and the trainer's log are in
:mod:`spotbroker.agent.delivery`, and the helpers that read the trainer's
events and vet its pids are in :mod:`spotbroker.agent.trainer_process`.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotbroker.agent.delivery import (
    BrokerClient,
    Delivery,
    EventSender,
    LogShipper,
)
from spotbroker.agent.outbox import OUTBOX_FILE, Outbox
from spotbroker.agent.protocol import (
    CHECKPOINT_COMMITTED,
    CONTROL_UNAVAILABLE,
    ENV_AGENT_TOKEN,
    ENV_ATTEMPT_ID,
    ENV_CONTROL_DIR,
    ENV_JOB_ID,
    EVENTS_FILE,
    FLUSH_FILE,
    FLUSH_SIGNAL,
    HEARTBEAT,
    LIBRARY_FILE,
    NO_FLUSH,
    TRAINER_EXITED,
    TRAINER_STARTED,
)
from spotbroker.agent.trainer_process import (
    TRAINER_EVENT_TYPES,
    EventTail,
    event_data,
    pid_alive,
    signal_name,
    terminate_with,
)

if TYPE_CHECKING:
    from spotbroker.agent.notices import Notice, Watchers

log = logging.getLogger("spotbroker.agent")

TRAINER_LOG_FILE = "trainer.log"
COMMAND_NOT_STARTED = 127  # the shell's code for a command that could not be run


@dataclass
class RunnerConfig:
    """Everything the supervisor needs; the CLI fills it from options and the environment."""

    command: list[str]
    broker_url: str | None = None
    token: str | None = field(default=None, repr=False)  # a secret: never logged
    job_id: str | None = None
    attempt_id: str | None = None
    cloud: str | None = None            # aws | gcp | azure | local; None = detect
    metadata_url: str | None = None     # stand-in for the cloud's metadata endpoint
    work_dir: Path | None = None        # outbox, trainer log, control dirs; a fresh temp dir if None
    heartbeat_interval: float = 5.0
    tail_interval: float = 0.1          # events.jsonl is read this often
    log_interval: float = 1.0           # the trainer's output is shipped this often
    poll_interval: float = 1.0          # metadata polls
    metadata_timeout: float = 2.0
    notice_window: float = 30.0         # assumed when a notice carries no deadline (GCP preempted), and a drain
    request_timeout: float = 5.0        # broker requests
    retry_initial: float = 0.2          # broker back-off, jittered
    retry_max: float = 5.0
    # At exit: how long to keep delivering to the broker. None: until it has
    # everything (through any outage) or answers 410 Gone.
    final_flush_timeout: float | None = None
    kill_grace: float = 10.0            # after a cancel: SIGTERM, then SIGKILL this much later


class Supervisor:
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
        self.tail = EventTail(self.control_dir / EVENTS_FILE if self.control_dir else None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: BrokerClient | None = None
        self.watchers: Watchers | None = None
        self._threads: list[threading.Thread] = []
        self._deliveries: list[Delivery] = []
        self._notices: queue.Queue[Notice | None] = queue.Queue()
        self._trainer_done = threading.Event()
        self._stopping = threading.Event()
        self._committed = threading.Event()
        self._flush_requested = False
        self._flush_over = False
        self._cancelled = False
        self._drain_requested = False
        self._watchers_lock = threading.Lock()
        self._forward_lock = threading.Lock()

    # --- the whole run -------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> int:
        try:
            self._start_trainer()
        except OSError as exc:  # no such command, not executable: the broker must still hear of it
            reason = f"cannot start {self.config.command[0]!r}: {exc.strerror or exc}"
            log.error("%s", reason)
            self.outbox.add(TRAINER_EXITED, {"exit_code": COMMAND_NOT_STARTED, "error": reason})
            self._start_deliveries()
            self._deliver_and_close()
            return COMMAND_NOT_STARTED
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._forward_signal)
        if self.control_error:
            log.error("the control channel is not set up (%s): preemption notices cannot be flushed",
                      self.control_error)
            self.outbox.add(CONTROL_UNAVAILABLE, {"reason": self.control_error})
        self.outbox.add(TRAINER_STARTED, {"pid": self.proc.pid, "library": self._library_pid() is not None})
        self._heartbeat()  # the first at once: the broker counts the attempt as running from it
        self._start_threads()
        returncode = self.proc.wait()
        return self._finish(returncode)

    def _start_trainer(self) -> None:
        env = dict(os.environ)
        env.pop(ENV_AGENT_TOKEN, None)  # the trainer never needs the agent's credential
        env.pop(ENV_CONTROL_DIR, None)  # only this agent's own
        if self.control_dir is not None:
            env[ENV_CONTROL_DIR] = str(self.control_dir)
        if self.config.job_id:
            env[ENV_JOB_ID] = self.config.job_id
        if self.config.attempt_id:
            env[ENV_ATTEMPT_ID] = self.config.attempt_id
        env.setdefault("PYTHONUNBUFFERED", "1")  # a Python trainer's output arrives as it is written
        self.proc = subprocess.Popen(
            self.config.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,  # its own group: signals reach all its processes
            preexec_fn=terminate_with(os.getpid()),
        )
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
                EventSender(self.outbox, self.client, self.config, self.cancel, self.drain, on_gone=self.gone),
                LogShipper(self.log_path, self.client, self.config, on_gone=self.gone),
            ]
            for delivery in self._deliveries:
                delivery.start()
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
        self._notices.put(None)
        self._join("notice-handler", 10.0)  # it may still acknowledge (Azure): watchers stop after
        self._stop_watchers()
        data: dict[str, Any] = {"exit_code": exit_code}
        if returncode < 0:
            data["signal"] = signal_name(-returncode)
        self.outbox.add(TRAINER_EXITED, data)
        self._deliver_and_close()
        return exit_code

    def _deliver_and_close(self) -> None:
        """Give the broker everything (within final_flush_timeout, if set), unless
        it says the attempt is gone; what is left stays on disk."""
        timeout = self.config.final_flush_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
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

    def _signal_group(self, signum: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        """The broker cancelled the attempt: SIGTERM the trainer, SIGKILL it after a grace."""
        if self._cancelled:
            return
        self._cancelled = True
        log.warning("the broker cancelled this attempt: stopping the trainer")
        self._signal_group(signal.SIGTERM)
        timer = threading.Timer(self.config.kill_grace, self._signal_group, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def drain(self, seconds: float | None = None) -> None:
        """The broker is moving the attempt: checkpoint within `seconds` (the
        broker's own wait; else the notice window) as on a notice, once per attempt.

        Every later answer still says drain; only the first counts. The broker
        stops the trainer itself afterwards (a cancel).
        """
        if self._drain_requested:
            return
        self._drain_requested = True
        if self._stopping.is_set():  # the notice handler is gone: say so at once, or the broker waits in vain
            self.outbox.add(NO_FLUSH, {"reason": "the trainer had already exited"})
            return
        from spotbroker.agent.notices import drain_notice

        window = seconds or self.config.notice_window
        log.warning("the broker asked this attempt to drain: checkpointing within %.0f s", window)
        self._notices.put(drain_notice(window))  # the one notice path does the rest

    # --- the trainer's output and events --------------------------------------------

    def _pump_output(self) -> None:
        """Copy the trainer's output to our stdout and to the log file the shipper reads.

        The pipe is drained whatever fails downstream: a trainer blocked on a full
        pipe would stop training.
        """
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        sinks: dict[str, Any] = {}
        try:
            sinks["log"] = open(self.log_path, "ab")  # noqa: SIM115 - closed below, when the pipe ends
        except OSError as exc:
            log.error("trainer output: cannot open %s (%s): it is not shipped to the broker", self.log_path, exc)
        sinks["stdout"] = sys.stdout.buffer
        while chunk := os.read(fd, 65536):
            for name, sink in list(sinks.items()):
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError) as exc:
                    log.warning("trainer output: %s no longer writable (%s)", name, exc)
                    del sinks[name]
        if "log" in sinks:
            sinks["log"].close()

    def _tail_events(self) -> None:
        while not self._stopping.is_set():
            self._forward_trainer_events()
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
            at = event.get("at") if isinstance(event.get("at"), str) else None
            self.outbox.add(event_type, data, at)
            if event_type == CHECKPOINT_COMMITTED and self._flush_requested and data.get("reason") != "periodic":
                self._committed.set()

    def _heartbeats(self) -> None:
        while not self._trainer_done.wait(self.config.heartbeat_interval):
            self._heartbeat()

    def _heartbeat(self) -> None:
        if self.outbox.has_pending(HEARTBEAT):
            return  # the broker has not had the last one: one pending heartbeat says enough
        self.outbox.add(HEARTBEAT, {"pid": self.proc.pid if self.proc else None,
                                    "library": self._library_pid() is not None})

    # --- notices and the flush ---------------------------------------------------

    def _start_watchers(self) -> None:
        from spotbroker.agent.notices import WatchConfig, build_watchers, resolve_cloud

        try:
            cloud = resolve_cloud(self.config.cloud, self.config.metadata_url)
        except ValueError as exc:
            log.error("not watching for preemption notices: %s", exc)
            return
        if cloud is None:
            log.info("no cloud metadata service found: not watching for preemption notices")
            return
        config = WatchConfig(
            poll_interval=self.config.poll_interval, request_timeout=self.config.metadata_timeout,
            gcp_preempt_window=self.config.notice_window, azure_default_window=self.config.notice_window,
        )
        with self._watchers_lock:
            if self._stopping.is_set():
                return
            self.watchers = build_watchers(cloud, self._notices.put, self.config.metadata_url, config)
            self.watchers.start()
        log.info("watching %s preemption notices at %s", cloud, self.config.metadata_url or "the cloud's endpoint")

    def _stop_watchers(self) -> None:
        with self._watchers_lock:
            if self.watchers is not None:
                self.watchers.stop()

    def _handle_notices(self) -> None:
        while (notice := self._notices.get()) is not None:
            try:
                self._handle_notice(notice)
            except Exception:  # one bad notice must not stop the next one
                log.exception("handling a %s notice failed", notice.kind)

    def _handle_notice(self, notice: Notice) -> None:
        self.outbox.add(notice.event_type, notice.event_data())  # first, at once
        if not notice.ends_node:
            return
        if self._flush_requested:
            log.info("another notice (%s) while the flush is under way: reported", notice.source)
            if self._flush_over:
                self._acknowledge(notice)
            return
        self._flush_requested = True
        deadline = notice.deadline or datetime.now(UTC) + timedelta(seconds=self.config.notice_window)
        reason = self._request_flush(notice, deadline)
        if reason is None:
            reason = self._wait_for_commit(deadline)
        if reason is not None:
            log.warning("no flush: %s", reason)
            self.outbox.add(NO_FLUSH, {"reason": reason, "deadline": deadline.isoformat()})
        self._flush_over = True
        self._acknowledge(notice)

    def _request_flush(self, notice: Notice, deadline: datetime) -> str | None:
        """Write flush.json and signal the library; the reason when no flush can come."""
        if self._trainer_done.is_set():
            return "the trainer had already exited"
        if self.control_dir is None:
            return f"the agent could not set up its control channel ({self.control_error})"
        pid = self._library_pid()
        if pid is None:
            return "the trainer does not use the checkpoint library"
        flush = {"deadline": deadline.isoformat(), "reason": notice.kind}
        tmp = self.control_dir / (FLUSH_FILE + ".tmp")
        tmp.write_text(json.dumps(flush))
        os.replace(tmp, self.control_dir / FLUSH_FILE)  # the library never reads half a file
        try:
            os.kill(pid, getattr(signal, FLUSH_SIGNAL))
        except ProcessLookupError:
            return f"the library's process {pid} is gone"
        log.info("asked the library (pid %d) to flush by %s", pid, deadline.isoformat())
        return None

    def _wait_for_commit(self, deadline: datetime) -> str | None:
        while not self._committed.is_set():
            left = (deadline - datetime.now(UTC)).total_seconds()
            if self._trainer_done.is_set():
                self._forward_trainer_events()  # the commit may be its very last line
                if self._committed.is_set():
                    break
                return "the trainer exited before the checkpoint was committed"
            if left <= 0:
                return "the deadline passed before the checkpoint was committed"
            self._committed.wait(min(left, 0.05))
        log.info("flush committed before the deadline")
        return None

    def _acknowledge(self, notice: Notice) -> None:
        if self.watchers is not None and self.watchers.acknowledge(notice):
            log.info("acknowledged the %s notice", notice.cloud)

    def _library_pid(self) -> int | None:
        """The library's pid from library.json, if it is alive and one of the trainer's processes."""
        if self.control_dir is None:
            return None
        try:
            info = json.loads((self.control_dir / LIBRARY_FILE).read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if pid <= 1 or self.proc is None or not pid_alive(pid):
            return None
        try:
            # Never signal a process outside the trainer's group or session (a stale or forged pid).
            ours = self.proc.pid in (os.getpgid(pid), os.getsid(pid))
        except ProcessLookupError:
            return None
        if not ours:
            log.warning("library.json names pid %d, which is not one of the trainer's processes", pid)
            return None
        return pid


def run(config: RunnerConfig, install_signal_handlers: bool = True) -> int:
    """Supervise one trainer; return its exit code."""
    return Supervisor(config).run(install_signal_handlers)
