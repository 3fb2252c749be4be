"""Who holds each GPU: psutil's view (name, threads, state) of the PIDs NVML reports."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional, Tuple

from dflash_doctor.gpus.readings import GpuProcess, GpuReading


@dataclass(frozen=True)
class ProcessInfo:
    state: str  # psutil status (running, sleeping, disk-sleep, zombie, ...), or gone / unknown
    name: Optional[str] = None
    threads: Optional[int] = None


ProcessProbe = Callable[[int], ProcessInfo]


def psutil_probe(pid: int) -> ProcessInfo:
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            status = proc.status()
            if status == psutil.STATUS_ZOMBIE:
                return ProcessInfo("zombie", name=proc.name())
            return ProcessInfo(status, name=proc.name(), threads=proc.num_threads())
    except psutil.ZombieProcess:
        return ProcessInfo("zombie")
    except psutil.NoSuchProcess:
        return ProcessInfo("gone")
    except psutil.AccessDenied:
        return ProcessInfo("unknown")


def describe_processes(readings: Iterable[GpuReading], probe: ProcessProbe = psutil_probe) -> Tuple[GpuReading, ...]:
    """Fill in name, thread count and state of every process NVML listed, one probe per PID."""
    cache: dict = {}

    def described(proc: GpuProcess) -> GpuProcess:
        if proc.pid not in cache:
            cache[proc.pid] = probe(proc.pid)
        info = cache[proc.pid]
        return replace(proc, name=info.name or proc.name, threads=info.threads, state=info.state)

    return tuple(replace(r, processes=tuple(described(p) for p in r.processes)) for r in readings)
