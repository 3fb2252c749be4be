"""What one GPU looked like over a sampling window: the data every source (NVML, CSV) produces."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from dflash_doctor.gpus.facts import ProcessFacts, ReadingFacts


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: Optional[float] = None
    name: Optional[str] = None
    threads: Optional[int] = None
    state: str = "unknown"  # running | sleeping | zombie | gone | unknown (psutil's status, or why it is unknown)

    def to_dict(self) -> ProcessFacts:
        return {"pid": self.pid, "used_mib": self.used_mib, "name": self.name, "threads": self.threads,
                "state": self.state}


@dataclass(frozen=True)
class GpuReading:
    """One GPU, averaged over `samples` readings. None means the field could not be read (N/A, NVML error)."""

    index: int
    utilization: Optional[float] = None  # percent, mean over the samples
    memory_used_mib: Optional[float] = None  # the highest reading: capacity is about the peak
    memory_total_mib: Optional[float] = None
    name: Optional[str] = None
    samples: int = 1
    lost: bool = False  # NVML could not reach the GPU at all: a placeholder row
    processes: Tuple[GpuProcess, ...] = field(default_factory=tuple)
    line: Optional[int] = None  # CSV line of the GPU's first row

    def to_dict(self) -> ReadingFacts:
        return {
            "index": self.index,
            "name": self.name,
            "utilization": None if self.utilization is None else round(self.utilization, 1),
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "samples": self.samples,
            "lost": self.lost,
            "processes": [p.to_dict() for p in self.processes],
        }


class ReadingAccumulator:
    """Folds repeated readings of one GPU (NVML samples, `nvidia-smi -l` rows) into one averaged GpuReading."""

    def __init__(self, index: int, line: Optional[int] = None) -> None:
        self.index = index
        self.line = line
        self._util_sum = 0.0
        self._util_n = 0
        self._mem_max: Optional[float] = None
        self._total: Optional[float] = None
        self._name: Optional[str] = None
        self._samples = 0
        self._lost = False
        self._processes: Tuple[GpuProcess, ...] = ()

    def add(self, *, utilization=None, memory_used_mib=None, memory_total_mib=None, name=None, lost=False,
            processes=None) -> None:
        self._samples += 1
        if utilization is not None:
            self._util_sum += utilization
            self._util_n += 1
        if memory_used_mib is not None:
            self._mem_max = memory_used_mib if self._mem_max is None else max(self._mem_max, memory_used_mib)
        if memory_total_mib is not None:
            self._total = memory_total_mib
        if name:
            self._name = name
        if processes is not None:
            self._processes = tuple(processes)  # the latest list: processes come and go
        self._lost = self._lost or lost

    def reading(self) -> GpuReading:
        return GpuReading(
            index=self.index,
            utilization=self._util_sum / self._util_n if self._util_n else None,
            memory_used_mib=self._mem_max,
            memory_total_mib=self._total,
            name=self._name,
            samples=self._samples,
            lost=self._lost and self._util_n == 0 and self._mem_max is None,
            processes=self._processes,
            line=self.line,
        )
