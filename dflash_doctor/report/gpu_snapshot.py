"""The GPU section of a bug report: one NVML reading per GPU through the gpus package, or why there is none."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from dflash_doctor.gpus.facts import GpuFacts
    from dflash_doctor.gpus.nvml import NvmlDevices


def _row(gpu: GpuFacts) -> dict:
    processes = gpu.get("processes") or []
    return {
        "index": gpu.get("index"),
        "name": gpu.get("name"),
        "utilization %": gpu.get("utilization"),
        "memory used MiB": gpu.get("memory_used_mib"),
        "memory total MiB": gpu.get("memory_total_mib"),
        "processes": ", ".join(f"{p.get('pid')} ({p.get('state')})" for p in processes) or "-",
        "lost": gpu.get("lost"),
    }


def gpu_snapshot(open_devices: Optional[Callable[[], NvmlDevices]] = None,
                 sleep: Callable[[float], None] = time.sleep) -> dict:
    """{"gpus": [one row per GPU], "reason": why the list is empty, "findings": the gpus rules that fired}.

    `open_devices` is the gpus package's NVML opener (a fake in tests); no NVML or no GPU is not an error here.
    """
    from dflash_doctor.gpus.nvml import PynvmlDevices
    from dflash_doctor.gpus.sources import report_from_nvml

    report = report_from_nvml(samples=1, interval=0.0, sleep=sleep, open_devices=open_devices or PynvmlDevices.open)
    gpus = [_row(gpu) for gpu in report.facts.get("gpus", [])]
    reason = "; ".join(p.reason for p in report.problems) if not gpus else ""
    return {
        "gpus": gpus,
        "reason": reason or ("NVML sees no GPU" if not gpus else ""),
        "findings": [f.to_dict() for f in report.sorted_findings()],
        "problems": [p.to_dict() for p in report.problems],
    }
