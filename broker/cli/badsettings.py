"""A bad SPOTBROKER_* value, told as the environment variable it came
from: a traceback naming a Python field (`placement_interval`) is no
answer to an operator. Imported on the error path only."""
from __future__ import annotations

import re

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from spotbroker.broker.checkpoints.settings import CheckpointSettings
from spotbroker.broker.energy.settings import EnergySettings
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.settings import Settings

CLASSES = (Settings, PricingSettings, EnergySettings, CheckpointSettings)  # each knows its variables' prefix


def explain(exc: BaseException) -> str | None:
    """What a settings class refused, as the environment variables it read
    ("SPOTBROKER_PLACEMENT_INTERVAL: Input should be a valid number"); None
    when `exc` is not about settings. A bad variable was a traceback naming
    a Python field."""
    def variable(cls: type[BaseSettings], field: str) -> str:
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    if isinstance(exc, ValidationError):
        cls = next((c for c in CLASSES if c.__name__ == exc.title), None)
        if cls is None:
            return None
        return "; ".join(f"{variable(cls, '.'.join(str(p) for p in err['loc']))}: "
                         f"{str(err['msg']).removeprefix('Value error, ')}" for err in exc.errors())
    if isinstance(exc, SettingsError) and (m := re.search(r'for field "(\w+)"', str(exc))):
        cls = next((c for c in CLASSES if m[1] in c.model_fields), Settings)
        why = ("not valid JSON (a list or mapping is written as JSON: [\"a\", \"b\"], {\"k\": 1})"
               if "JSON" in type(exc.__cause__).__name__ else str(exc.__cause__ or exc))
        return f"{variable(cls, m[1])}: {why}"
    return None
