"""Small stand-ins for what this machine lacks: an NVML library and GPUs."""
from __future__ import annotations

from types import SimpleNamespace


class FakeNVMLError(Exception):
    pass


class FakePynvml:
    """Shaped like the pynvml module: per-GPU values, fields that raise, GPUs that are lost."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus, init_error=None, broken=None, lost=()):
        self.gpus = gpus  # index -> dict(util=[...], used=..., total=..., procs=[(pid, bytes)])
        self.init_error = init_error
        self.broken = broken or {}  # index -> set of field names that raise
        self.lost = set(lost)
        self.calls = 0
        self.shut = False

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index in self.lost:
            raise FakeNVMLError("GPU is lost")
        return index

    def _check(self, index, field):
        if field in self.broken.get(index, ()):
            raise FakeNVMLError("Not Supported")

    def nvmlDeviceGetName(self, index):
        self._check(index, "name")
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, index):
        self._check(index, "memory")
        gpu = self.gpus[index]
        return SimpleNamespace(used=gpu["used"] * 2 ** 20, total=gpu["total"] * 2 ** 20)

    def nvmlDeviceGetUtilizationRates(self, index):
        self._check(index, "utilization")
        self.calls += 1
        gpu = self.gpus[index]
        series = gpu["util"]
        value = series[gpu.setdefault("_i", 0) % len(series)]
        gpu["_i"] += 1
        return SimpleNamespace(gpu=value, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, index):
        self._check(index, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[index].get("procs", [])]
