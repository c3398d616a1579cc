"""A job's `early_stop`: when the broker stops a run whose metric has
stopped improving. A spotbroker key (taken out of a SkyPilot task file
before SkyPilot's schema reads it, like `deadline`)."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt

METRIC_NAME = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"  # the library's and the agent's rule too


class EarlyStopRule(BaseModel):
    """Stop when `metric` has not improved by more than `min_delta` for
    `patience` reports in a row, counting only reports at `min_steps` or
    later (so a curriculum phase may rise before it falls)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    metric: Annotated[str, Field(pattern=METRIC_NAME, description="a name the trainer reports: "
                                 "ckpt.report(step, val_loss=...)")]
    mode: Literal["min", "max"] = "min"
    patience: Annotated[StrictInt, Field(ge=1, le=100_000)] = 3
    min_delta: Annotated[StrictFloat, Field(ge=0, le=1e12, allow_inf_nan=False)] = 0.0
    min_steps: Annotated[StrictInt, Field(ge=0, le=2**62)] = 0

    def improves(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta

    def env_value(self) -> str:
        """SPOTBROKER_EARLY_STOP: what the library needs to keep the best weights."""
        return json.dumps(self.model_dump(), separators=(",", ":"))


def _off(value: Any) -> Any:
    """`early_stop: false` is none: a job switches off its team's default (as `preflight: false` does)."""
    return None if value is False else value


EarlyStopField = Annotated[EarlyStopRule | None, BeforeValidator(_off), Field(description=(
    "stop when the reported metric stops improving: {metric, mode, patience, min_delta, min_steps}; "
    "false: none, whatever the team's default"))]
