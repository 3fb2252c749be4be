"""The one guarded NVML entry point (gpustat's shape): a failing field reads None, a lost GPU is a placeholder.

pynvml is imported only inside `PynvmlDevices.open`, never at module import. Tests inject any object that
follows `NvmlDevices` (a fake NVML); `PynvmlDevices` itself takes the pynvml module as a parameter so its error
handling is tested with a small stand-in module too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Protocol, Tuple

from dflash_doctor.findings import Problem
from dflash_doctor.gpus.readings import GpuProcess, GpuReading, ReadingAccumulator

_MIB = 1024 * 1024


class NvmlUnavailable(Exception):
    """NVML cannot be used here: no library, no driver, or no GPU. One line for the user, exit bit 4."""


@dataclass(frozen=True)
class RawSample:
    index: int
    utilization: Optional[float] = None
    memory_used_mib: Optional[float] = None
    memory_total_mib: Optional[float] = None
    name: Optional[str] = None
    processes: Optional[Tuple[Tuple[int, Optional[float]], ...]] = None  # (pid, used MiB or None)
    lost: bool = False
    errors: Tuple[str, ...] = field(default_factory=tuple)


class NvmlDevices(Protocol):
    def device_count(self) -> int: ...

    def sample(self, index: int) -> RawSample: ...

    def shutdown(self) -> None: ...


class PynvmlDevices:
    """NvmlDevices over the real nvidia-ml-py (or any module with the same functions and NVMLError)."""

    def __init__(self, nvml) -> None:
        self._nvml = nvml
        self._handles: dict = {}

    @classmethod
    def open(cls, module=None) -> "PynvmlDevices":
        if module is None:
            try:
                import pynvml

                module = pynvml
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not importable ({exc}); pip install nvidia-ml-py") from exc
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not start ({exc}): no NVIDIA driver or GPU here") from exc
        return cls(module)

    def device_count(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not count GPUs ({exc})") from exc

    def _field(self, errors: list, what: str, read: Callable):
        try:
            return read()
        except self._nvml.NVMLError as exc:
            errors.append(f"{what}: {exc}")
            return None

    def sample(self, index: int) -> RawSample:
        nvml = self._nvml
        errors: list = []
        handle = self._handles.get(index)
        if handle is None:
            handle = self._field(errors, "handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index))
            if handle is None:
                return RawSample(index=index, lost=True, errors=tuple(errors))
            self._handles[index] = handle
        name = self._field(errors, "name", lambda: nvml.nvmlDeviceGetName(handle))
        memory = self._field(errors, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        rates = self._field(errors, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        procs = self._field(errors, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if memory is None and rates is None and errors and all("lost" in e.lower() for e in errors):
            return RawSample(index=index, lost=True, errors=tuple(errors))
        return RawSample(
            index=index,
            utilization=None if rates is None else float(rates.gpu),
            memory_used_mib=None if memory is None else memory.used / _MIB,
            memory_total_mib=None if memory is None else memory.total / _MIB,
            name=name.decode() if isinstance(name, bytes) else name,
            processes=None if procs is None else tuple(
                (int(p.pid), None if getattr(p, "usedGpuMemory", None) is None else p.usedGpuMemory / _MIB)
                for p in procs
            ),
            errors=tuple(errors),
        )

    def shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # shutting down a half-broken NVML must not hide the report


@dataclass
class LiveSnapshot:
    readings: List[GpuReading]
    problems: List[Problem]
    samples: int


def iter_samples(
    devices: NvmlDevices,
    samples: Optional[int],
    interval: float,
    sleep: Callable[[float], None],
) -> Iterator[LiveSnapshot]:
    """Yield the running average after every sample round; `samples=None` samples until the caller stops."""
    count = devices.device_count()
    if count <= 0:
        raise NvmlUnavailable("NVML sees no GPU on this machine")
    gpus = [ReadingAccumulator(i) for i in range(count)]
    field_errors: dict = {}
    taken = 0
    while samples is None or taken < samples:
        if taken:
            sleep(interval)
        for gpu in gpus:
            raw = devices.sample(gpu.index)
            if raw.errors:
                field_errors[gpu.index] = raw.errors
            gpu.add(
                utilization=raw.utilization,
                memory_used_mib=raw.memory_used_mib,
                memory_total_mib=raw.memory_total_mib,
                name=raw.name,
                lost=raw.lost,
                processes=None if raw.processes is None else [GpuProcess(pid, used) for pid, used in raw.processes],
            )
        taken += 1
        readings = [gpu.reading() for gpu in gpus]
        problems = [
            Problem(f"GPU {r.index}", "lost: NVML cannot reach it (" + "; ".join(field_errors.get(r.index, ())) + ")",
                    "check `nvidia-smi` and dmesg for Xid errors")
            for r in readings if r.lost
        ]
        yield LiveSnapshot(readings=readings, problems=problems, samples=taken)


def sample_live(devices: NvmlDevices, samples: int, interval: float,
                sleep: Callable[[float], None]) -> LiveSnapshot:
    snapshots = iter_samples(devices, samples, interval, sleep)
    last = next(snapshots)  # samples >= 1: there is always a first round
    for last in snapshots:
        pass
    return last
