"""The accelerator names some offer has: a job asking for another (a typo,
`V100` for `H100`, a name no cloud sells) is refused at submission naming
the field and the closest names, as `sky launch` does, instead of being
accepted and failing later with `no_feasible_offer`.

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

from spotbroker.broker.jobs.resources import Infra, parse_accelerator
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.normalise import accelerator_name
from spotbroker.broker.store.models import PriceOffer


class KnownAccelerators:
    def __init__(self, factory: sessionmaker[Session], also: Iterable[str] = (), ttl_s: float = 60.0) -> None:
        self._factory = factory
        self._also = frozenset(also)  # the operator's Kubernetes nodes' accelerators
        self._ttl_s = ttl_s
        self._names: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def errors(self, spec: JobSpec) -> list[dict[str, str]]:
        """One error per resource set (and pre-flight) whose accelerator no offer has."""
        asked: dict[str, str] = {}  # field -> accelerator name
        res = spec.resources
        alts = res.any_of if res.any_of is not None else res.ordered
        key = "any_of" if res.any_of is not None else "ordered"
        for i, want in enumerate(res.alternatives()):
            if want.accelerator is not None and not (want.infra and Infra(want.infra).cloud == "local"):
                # (an alternative holds the top level's accelerators when it names none)
                own = alts is not None and alts[i].accelerators not in (None, res.accelerators)
                asked.setdefault(f"resources.{key}.{i}.accelerators" if own else "resources.accelerators",
                                 want.accelerator[0])
        if spec.preflight is not None and spec.preflight.accelerators:
            asked["preflight.accelerators"] = parse_accelerator(spec.preflight.accelerators)[0]
        return [{"field": field, "message": self._why(name)} for field, name in asked.items()
                if not self._known(accelerator_name(name) or name)]

    def _known(self, name: str) -> bool:
        if name in self._also:
            return True
        names = self._read(fresh=False)
        return not names or name in names or name in self._read(fresh=True)

    def _read(self, fresh: bool) -> frozenset[str]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at > (1.0 if fresh else self._ttl_s):
                with self._factory() as session:
                    found = session.scalars(select(PriceOffer.accelerator).distinct()
                                            .where(PriceOffer.accelerator.is_not(None)))
                    self._names = frozenset(found)
                self._read_at = now
            return self._names

    def _why(self, asked: str) -> str:
        names = sorted(n for n in self._names | self._also if " " not in n)  # (a job cannot name `Radeon MI25`)
        close = difflib.get_close_matches(asked.upper(), [n.upper() for n in names], n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(n for n in names if n.upper() in close)}?" if close else ""
        return f"no cloud offers an accelerator named {asked!r}{hint} (offered: {', '.join(names)})"
