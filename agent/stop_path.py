"""The supervisor's early stop: the broker's answer says ``stop`` once the
job's ``early_stop`` rule has fired.

The agent writes ``stop.json`` in the control directory, once; the library
checkpoints at the next step boundary (``checkpoint_committed``, reason
``early_stop``, on which the broker ends the job) and tells the trainer
``should_stop``. When no library can take the request, or none has answered
within the notice window, the agent reports ``no_flush`` and the broker ends
the job from its newest checkpoint all the same. Mixed into
:class:`spotbroker.agent.runner.Supervisor`, whose state it uses.
"""
from __future__ import annotations

import json
import logging
import os
import threading

from spotbroker.agent.protocol import EARLY_STOP, NO_FLUSH, STOP_FILE, now_iso

log = logging.getLogger("spotbroker.agent")


class StopPath:
    """See the module's docstring."""

    def stop_early(self) -> None:
        if self._stop_requested:
            return  # every later answer says stop too
        self._stop_requested = True
        reason = self._ask_library_to_stop()
        if reason is not None:
            log.warning("the broker stopped the run early, and %s", reason)
            self.outbox.add(NO_FLUSH, {"reason": reason, EARLY_STOP: True})
            return
        log.warning("the broker stopped the run early (its early_stop rule): the trainer checkpoints and stops")
        threading.Thread(target=self._await_stop, name="early-stop", daemon=True).start()

    def _ask_library_to_stop(self) -> str | None:
        """Write stop.json; the reason when no library can take it."""
        if self._trainer_done.is_set():
            return "the trainer had already exited"
        if self.control_dir is None:
            return f"the agent could not set up its control channel ({self.control_error})"
        if not self._library_pids():
            return "the trainer does not use the checkpoint library"
        tmp = self.control_dir / (STOP_FILE + ".tmp")
        tmp.write_text(json.dumps({"at": now_iso(), "reason": EARLY_STOP}))
        os.replace(tmp, self.control_dir / STOP_FILE)  # the library never reads half a file
        return None

    def _await_stop(self) -> None:
        if self._trainer_done.wait(self.config.notice_window):
            return  # it stopped: the broker has the checkpoint and the exit
        self.outbox.add(NO_FLUSH, {"reason": f"the trainer did not stop within {self.config.notice_window:g} s",
                                   EARLY_STOP: True})
