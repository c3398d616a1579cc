"""The accelerators some offer has: a job asking for another (a typo,
`V100` for `H100`, a name no cloud sells) or for a count per node that no
machine has (`A100:3`, `T4:0.5`; placement matches counts exactly, as
SkyPilot does) is refused at submission naming the field and the closest
names or the counts offered, as `sky launch` does, instead of being
accepted and failing later with `no_feasible_offer`. On Kubernetes
(`infra: k8s`, or an accelerator its nodes have) any count is taken: a
pod asks its node for a number of GPUs, not for a machine.

Submission is the API's hot path: the names are kept in memory and read
again at most every `ttl_s`; a name missing from them is looked up once
more before it is refused (an accelerator first listed a moment ago is
accepted). With no offer at all yet (prices not loaded) nothing is refused.
"""
from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.resources import KUBERNETES, Infra, parse_accelerator
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.normalise import asked_accelerator
from spotbroker.broker.store.models import PriceOffer


class KnownAccelerators:
    def __init__(self, factory: sessionmaker[Session], also: Iterable[str] = (), ttl_s: float = 60.0) -> None:
        self._factory = factory
        self._also = frozenset(also)  # the operator's Kubernetes nodes' accelerators
        self._ttl_s = ttl_s
        self._names: dict[str, frozenset[float]] = {}  # name -> counts per node offered
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def errors(self, spec: JobSpec) -> list[dict[str, str]]:
        return self.judge(spec)[0]

    def judge(self, spec: JobSpec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """(errors, warnings): an error for each accelerator no offer has
        (a name, or a count per node) when no resource set of the job fits,
        else a warning for each set passed over (a set that fits is where it
        runs: SkyPilot too passes over the others; `{L4, L40}` runs on L4
        where no cloud of the broker's sells L40); and an error for a
        pre-flight accelerator no offer has (one machine, which must exist)."""
        asked: dict[str, tuple[str, float | None]] = {}  # field -> (accelerator name, count; None: any)
        res = spec.resources
        alts = res.any_of if res.any_of is not None else res.ordered
        key = "any_of" if res.any_of is not None else "ordered"
        fits = False
        for i, want in enumerate(res.alternatives()):
            cloud = Infra(want.infra).cloud if want.infra else None
            if want.accelerator is None or cloud == "local":
                fits = True
                continue
            # (an alternative holds the top level's accelerators when it names none)
            own = alts is not None and alts[i].accelerators not in (None, res.accelerators)
            name, count = want.accelerator
            asked.setdefault(f"resources.{key}.{i}.accelerators" if own else "resources.accelerators",
                             (name, None if cloud == KUBERNETES[0] else count))  # a node takes any count
        unfit = []
        for field, (name, count) in asked.items():
            why = self._why_not(name, count)
            fits = fits or why is None
            if why is not None:
                unfit.append({"field": field, "message": why})
        errors, warnings = ([], [{**w, "message": f"{w['message']}: passed over, the others are placed"}
                                 for w in unfit]) if fits else (unfit, [])
        if spec.preflight is not None and spec.preflight.accelerators:
            why = self._why_not(*parse_accelerator(spec.preflight.accelerators))
            if why is not None:
                errors.append({"field": "preflight.accelerators", "message": why})
        return errors, warnings

    def unknown_names(self, names: list[str], field: str) -> list[dict[str, str]]:
        """An error for each name no offer has (a team policy's allowlist:
        a typo there allowed nothing, silently)."""
        return [{"field": f"{field}.{i}", "message": why} for i, name in enumerate(names)
                if (why := self._why_not(name, None))]

    def _why_not(self, asked: str, count: float | None) -> str | None:
        """Why no offer fits (None: one does)."""
        name = asked_accelerator(asked)
        if name in self._also:
            return None
        names = self._read(fresh=False)
        if names and not _has(names, name, count):
            names = self._read(fresh=True)
        if not names or _has(names, name, count):
            return None
        if name in names:
            offered = ", ".join(f"{c:g}" for c in sorted(names[name]))
            return f"no machine offers {count:g} {name} per node (offered: {offered})"
        known = sorted(n for n in {*names, *self._also} if " " not in n)  # (a job cannot name `Radeon MI25`)
        close = difflib.get_close_matches(asked.upper(), [n.upper() for n in known], n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(n for n in known if n.upper() in close)}?" if close else ""
        return f"no cloud offers an accelerator named {asked!r}{hint} (offered: {', '.join(known)})"

    def _read(self, fresh: bool) -> dict[str, frozenset[float]]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at > (1.0 if fresh else self._ttl_s):
                with self._factory() as session:
                    found: dict[str, set[float]] = {}
                    for name, count in session.execute(
                            select(PriceOffer.accelerator, PriceOffer.accelerator_count).distinct()
                            .where(PriceOffer.accelerator.is_not(None))):
                        found.setdefault(name, set()).add(count)
                    self._names = {name: frozenset(counts) for name, counts in found.items()}
                self._read_at = now
            return self._names


def _has(names: dict[str, frozenset[float]], name: str, count: float | None) -> bool:
    return name in names and (count is None or any(abs(c - count) < 1e-6 for c in names[name]))
