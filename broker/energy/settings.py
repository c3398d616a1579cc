"""Energy settings, from `SPOTBROKER_ENERGY_*` environment variables.

The bundled grid snapshot needs nothing. With an Electricity Maps key the
broker also reads each grid's live carbon intensity, keeps it as history
(`grid_readings`), and an attempt launched while a reading is fresh is
charged at it instead of the snapshot's yearly figure.
"""
from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotbroker.broker.energy.electricitymaps import BASE_URL


class EnergySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_ENERGY_", env_file=".env", extra="ignore",
                                      hide_input_in_errors=True)

    electricitymaps_token: SecretStr | None = None   # unset: the snapshot's figures only
    electricitymaps_url: str = BASE_URL
    # Zones read (Electricity Maps' names); empty: every zone the snapshot maps a region to.
    zones: str = ""
    refresh_interval: float = Field(3_600.0, gt=0)   # grids change hourly; the free plan allows few calls
    reading_max_age: float = Field(3 * 3_600.0, gt=0)  # older, and the snapshot's figure is used again
    timeout: float = Field(10.0, gt=0)


@lru_cache
def energy_settings() -> EnergySettings:
    return EnergySettings()
