"""The agent's GPU energy reader: NVML's counters, in millijoules, through
nvidia-ml-py's own names and errors."""
import types

import pynvml

from spotbroker.agent.energy import GpuEnergy


def _fake_nvml(counters: list[list[int]], fail_at: int | None = None):
    """A stand-in for `pynvml` on a node with len(counters) GPUs; each read
    of GPU i returns its next counter value (mJ since the driver loaded)."""
    reads = [iter(c) for c in counters]
    calls = {"shutdown": 0}

    def energy(handle):
        if fail_at is not None and handle == fail_at:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return next(reads[handle])

    return types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(counters),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)), calls


def test_joules_since_start_over_all_gpus():
    nvml, calls = _fake_nvml([[1_000_000, 1_250_000, 1_400_000], [5_000, 205_000, 305_000]])
    reader = GpuEnergy(nvml)
    assert reader.start() and reader.gpus == 2
    assert reader.joules() == 250 + 200
    assert reader.joules() == 400 + 300
    reader.close()
    assert calls["shutdown"] == 1 and reader.joules() is None


def test_a_counter_that_restarts_counts_from_zero():
    nvml, _ = _fake_nvml([[9_000_000, 3_000]])  # the driver reloaded between reads
    reader = GpuEnergy(nvml)
    reader.start()
    assert reader.joules() == 3


def test_a_gpu_without_a_counter_is_not_measured():
    nvml, _ = _fake_nvml([[0, 1]], fail_at=0)
    reader = GpuEnergy(nvml)
    assert not reader.start() and "NVML" in reader.why_not
    assert reader.joules() is None


def test_no_driver_on_this_machine_says_why():
    # The real nvidia-ml-py: on a machine without the NVIDIA driver nvmlInit fails.
    reader = GpuEnergy(pynvml)
    started = reader.start()
    if not started:
        assert reader.why_not.startswith("NVML") and reader.joules() is None
    else:  # a GPU node: the counter is real and does not go backwards
        assert reader.joules() >= 0
        reader.close()
