"""What every price source gives the tracker, and how it says "not here"."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.normalise import QualityReport
from spotbroker.broker.pricing.store import Scope


class SourceUnavailable(Exception):
    """No credentials, no network, or no endpoint: the source is skipped
    (one log line) and the offers it owned keep their last prices."""


@dataclass
class SourceAnswer:
    """A source's complete answer: every offer it lists in `scope`. A
    source that cannot give the whole answer raises instead."""

    rows: list[OfferRow]
    scope: Scope
    report: QualityReport = field(default_factory=QualityReport)
    # Published risk for offers another source prices: (cloud, region,
    # instance type) -> (risk, its source name); see store.apply_risks.
    risks: dict[tuple[str, str, str], tuple[float, str]] = field(default_factory=dict)


class Source(Protocol):
    name: str

    def fetch(self) -> SourceAnswer: ...
