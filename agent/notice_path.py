"""The supervisor's notice path: watching for notices, and the flush each one asks for.

A notice (the cloud's, or the broker's drain, or a peer node's through the
broker) is reported at once; one that ends the node asks every process of
the trainer's checkpoint library to flush (:mod:`spotbroker.agent.flush`)
and waits for ``checkpoint_committed`` until the deadline, else reports
``no_flush`` with the reason; then acknowledges the notice where the cloud
wants it (Azure). Mixed into :class:`spotbroker.agent.runner.Supervisor`,
whose state it uses.
"""
from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from spotbroker.agent.flush import library_pids, request_flush
from spotbroker.agent.protocol import NO_FLUSH

if TYPE_CHECKING:
    from spotbroker.agent.notices import Notice

log = logging.getLogger("spotbroker.agent")


class NoticePath:
    """Notices and flushes; see the module's docstring."""

    def drain(self, seconds: float | None = None) -> None:
        """The broker is moving the attempt: checkpoint within `seconds` (the
        broker's own wait; else the notice window) as on a notice, once per attempt.

        Every later answer still says drain; only the first counts. The broker
        stops the trainer itself afterwards (a cancel).
        """
        if self._drain_requested or self._flush_requested or self._library_flushed:
            return  # this node's own notice, or the ranks' agreement, has flushed already
        self._drain_requested = True
        if self._stopping.is_set():  # the notice handler is gone: say so at once, or the broker waits in vain
            self.outbox.add(NO_FLUSH, {"reason": "the trainer had already exited"})
            return
        from spotbroker.agent.notices import drain_notice

        window = seconds or self.config.notice_window
        log.warning("the broker asked this attempt to drain: checkpointing within %.0f s", window)
        self._notices.put(drain_notice(window))  # the one notice path does the rest

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
        """Write flush.json and signal every process of the library; the reason when no flush can come."""
        if self._trainer_done.is_set():
            return "the trainer had already exited"
        if self.control_dir is None:
            return f"the agent could not set up its control channel ({self.control_error})"
        pids = self._library_pids()
        if not pids:  # (the library announces itself once the trainer makes its Checkpointer, after its imports)
            age = time.monotonic() - self._trainer_started_s
            return (f"the trainer does not use the checkpoint library, had not started it yet, or had closed "
                    f"it after its loop ({age:.0f} s after the trainer started)")
        if not request_flush(self.control_dir, pids, deadline, notice.kind):
            return f"the library's processes {pids} are gone"
        log.info("asked the library (pids %s) to flush by %s", pids, deadline.isoformat())
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

    def _library_pids(self) -> list[int]:
        return library_pids(self.control_dir, self.proc.pid if self.proc is not None else None)


