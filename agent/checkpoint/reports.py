"""Metrics the trainer reports, and the library's side of early stopping.

``ckpt.report(step, val_loss=0.41)`` appends a ``metrics`` event for the
agent, which forwards it to the broker (folding reports that come more
often than every few seconds).

With ``early_stop`` on (``SPOTBROKER_EARLY_STOP``) the library counts the
rule over every report, since only it sees them all: the best report so far
(from ``min_steps``) and how many came since that did not beat it by more
than ``min_delta``. Each report carries that standing; the broker fires the
rule on it once ``patience`` is reached, and the agent writes ``stop.json``:
at the next step boundary the library checkpoints (reason ``early_stop``)
and ``ckpt.should_stop`` turns True. Each report that improves the metric is
checkpointed with reason ``best``, unless the previous upload is still
running (then the broker keeps the newest committed checkpoint at or after
the best step). The standing travels in ``ckpt.extra`` (``BEST_KEY``,
``SINCE_KEY``), so a resumed attempt counts on from its checkpoint's step,
as the run it repeats did.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotbroker.agent import protocol

if TYPE_CHECKING:
    from spotbroker.agent.checkpoint.checkpointer import Checkpointer

log = logging.getLogger("spotbroker.checkpoint")

METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}\Z")  # the broker's rule too
MAX_METRICS = 32  # names in one report
BEST_KEY = "spotbroker.best"    # in ckpt.extra: [step, value] of the best report so far
SINCE_KEY = "spotbroker.since"  # in ckpt.extra: [step, n]: the newest counted report, n since the best


@dataclass(frozen=True)
class Rule:
    """The job's ``early_stop``, as far as the library needs it."""

    metric: str
    mode: str = "min"
    min_delta: float = 0.0
    min_steps: int = 0
    patience: int = 3

    @classmethod
    def from_env(cls, value: str | None) -> Rule | None:
        if not value:
            return None
        try:
            doc = json.loads(value)
            return cls(str(doc["metric"]), str(doc.get("mode", "min")), float(doc.get("min_delta", 0.0)),
                       int(doc.get("min_steps", 0)), int(doc.get("patience", 3)))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s (%s): best checkpoints are off", protocol.ENV_EARLY_STOP, exc)
            return None

    def improves(self, value: float, best: float | None) -> bool:
        """Better than `best` by more than min_delta (any value beats none)."""
        if best is None:
            return True
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta

    def count(self, extra: dict[str, Any], step: int, value: float) -> dict[str, Any] | None:
        """Count one report of the metric into `extra` (BEST_KEY, SINCE_KEY); its
        standing, or None for a report the rule does not count (before
        min_steps, or a step not after the last counted)."""
        best, seen = extra.get(BEST_KEY), extra.get(SINCE_KEY)
        best = tuple(best) if isinstance(best, list | tuple) and len(best) == 2 else None
        last, since = tuple(seen) if isinstance(seen, list | tuple) and len(seen) == 2 else (-1, 0)
        if step < self.min_steps or step <= last:
            return None
        if self.improves(value, best[1] if best else None):
            best, since = (step, value), 0
            extra[BEST_KEY] = [step, value]
        else:
            since += 1
        extra[SINCE_KEY] = [step, since]
        return {"best_step": int(best[0]), "best_value": float(best[1]), "since": since,
                "met": since >= self.patience}


def clean_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The reportable part: names the broker takes, finite numbers; the rest is dropped with a warning."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if len(out) >= MAX_METRICS:
            log.warning("report(): more than %d metrics; %r and the rest are dropped", MAX_METRICS, name)
            break
        if not METRIC_NAME.match(name):
            log.warning("report(): %r is not a metric name (letters, digits, _ . / -, at most 64)", name)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            log.warning("report(): %s=%r is not a number", name, value)
            continue
        if not math.isfinite(number):
            log.warning("report(): %s=%r is not finite", name, value)
            continue
        out[name] = number
    return out


def stop_file_mtime(control_dir: Path | None) -> int:
    if control_dir is None:
        return 0
    try:
        return (control_dir / protocol.STOP_FILE).stat().st_mtime_ns
    except OSError:
        return 0


class Reports:
    """The checkpointer's reports and early stop; see the module's docstring."""

    def __init__(self, ckpt: Checkpointer) -> None:
        self.ckpt = ckpt
        self.rule = Rule.from_env(os.environ.get(protocol.ENV_EARLY_STOP))
        self.should_stop = False
        self._stop_mtime = stop_file_mtime(ckpt.control_dir)  # a request older than us is not ours

    def report(self, step: int, metrics: dict[str, Any]) -> bool:
        values = clean_metrics(metrics)
        if values and self.ckpt.ranks.writer:
            data: dict[str, Any] = {"step": int(step), "values": values}
            rule = self.rule
            standing = rule.count(self.ckpt.extra, int(step), values[rule.metric]) \
                if rule is not None and rule.metric in values else None
            if standing is not None:
                data[protocol.EARLY_STOP] = standing
            self.ckpt._control.emit(protocol.METRICS, data)
            if standing is not None and standing["best_step"] == int(step):
                self._keep_best(int(step))
        self.at_boundary(step)
        return not self.should_stop

    def _keep_best(self, step: int) -> None:
        uploader = self.ckpt._uploader
        if uploader is None or self.ckpt._ranked is not None:
            return
        if uploader.busy():
            log.info("step %d is the best so far, but the previous upload is still running: "
                     "a later checkpoint stands for it", step)
            return
        self.ckpt.save(step, reason="best", wait=False)

    def at_boundary(self, step: int) -> None:
        """A stop request from the agent: checkpoint this step, then should_stop."""
        if self.should_stop or self.ckpt._ranked is not None:
            return  # (under torch.distributed the ranks would have to agree on the step: the agent stops them)
        mtime = stop_file_mtime(self.ckpt.control_dir)
        if mtime == self._stop_mtime:
            return
        self._stop_mtime = mtime
        self.should_stop = True
        log.warning("the broker stopped the run early (its early_stop rule): checkpointing step %d", step)
        ckpt = self.ckpt
        if ckpt._uploader is None:
            return  # checkpoints are off
        last = ckpt.wait()  # a best save in flight first: it may be this very step
        if last is not None and last.step == step:
            ckpt._emit_committed(last, protocol.EARLY_STOP)
        elif ckpt.save(step, reason=protocol.EARLY_STOP, wait=True) is None:
            ckpt._control.emit(protocol.NO_FLUSH, {"reason": f"the checkpoint of step {step} failed"})
