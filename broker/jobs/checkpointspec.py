"""A job's `checkpoint:` key: who sets the trainer's checkpoint interval.

    checkpoint: {interval: auto}   # the default: fitted to the zone's reclaim rate and the measured cost
    checkpoint: {interval: code}   # the trainer's own `every_seconds` / `every_steps`
    checkpoint: {interval: 900}    # a fixed interval, in seconds

The spec decides, not the code: under `auto` or a number the library takes
the broker's interval instead of its own (broker/recovery/intervals.py).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

AUTO, CODE = "auto", "code"
MIN_FIXED_S = 1.0
MAX_FIXED_S = 7 * 24 * 3600.0


class CheckpointSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    interval: Literal["auto", "code"] | float = AUTO

    @field_validator("interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in (AUTO, CODE):
            return value.strip().lower()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("'auto' (fitted to the place), 'code' (the trainer's own) or a number of seconds")
        if not MIN_FIXED_S <= value <= MAX_FIXED_S:
            raise ValueError(f"a fixed interval is from {MIN_FIXED_S:g} to {MAX_FIXED_S:g} seconds")
        return float(value)

    @property
    def mode(self) -> str:
        """auto, code or fixed."""
        return self.interval if isinstance(self.interval, str) else "fixed"
