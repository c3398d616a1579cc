"""What the node's GPUs burned, read from NVML's energy counters.

NVML (through `nvidia-ml-py`, module `pynvml`) keeps, per GPU, the energy
used since the driver loaded, in millijoules (Volta and newer). The agent
reads every GPU's counter when the trainer starts and again whenever it
reports, and sends the difference: joules this attempt's GPUs used, which
the broker turns into kWh with the place's PUE. Where NVML is missing (no
driver, no GPU, the package not installed) or a GPU has no counter, the
reader says so once and the broker estimates from rated power instead.
"""
from __future__ import annotations

import logging
from types import ModuleType

log = logging.getLogger("spotbroker.agent")


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuEnergy:
    """Joules used by this node's GPUs since `start()`; None when not measurable."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml  # loaded by start(): the agent's start-up stays light
        self._handles: list = []
        self._start_mj: list[int] = []
        self.why_not: str | None = None

    def start(self) -> bool:
        if self._nvml is None:
            self._nvml = _load_nvml()
        nvml = self._nvml
        if nvml is None:
            self.why_not = "nvidia-ml-py is not installed"
            return False
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._start_mj = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
        except nvml.NVMLError as exc:  # no driver, or a GPU without an energy counter (pre-Volta)
            self.why_not = f"NVML: {exc}"
            self._handles = []
            return False
        if not self._handles:
            self.why_not = "NVML sees no GPU"
            return False
        return True

    @property
    def gpus(self) -> int:
        return len(self._handles)

    def joules(self) -> float | None:
        """Energy since start() over all GPUs, in joules (a counter that went
        backwards, i.e. the driver reloaded, counts from zero)."""
        if not self._handles:
            return None
        nvml = self._nvml
        try:
            now = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
        except nvml.NVMLError as exc:
            log.warning("reading the GPUs' energy counters failed: %s", exc)
            return None
        return sum(n - s if n >= s else n for n, s in zip(now, self._start_mj)) / 1000.0

    def close(self) -> None:
        if self._handles:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._handles = []
