"""DFD4xx: compare every GPU with its role peers, its capacity, and the processes holding it."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence

from dflash_doctor.findings import Problem, Report
from dflash_doctor.gpus.readings import GpuReading
from dflash_doctor.gpus.roles import RoleMap, role_of
from dflash_doctor.rules.gpus import (
    GPU_IDLE_MEMORY_HELD,
    GPU_MEMORY_NEAR_CAPACITY,
    GPU_PROCESS_GONE,
    GPU_ROLE_IMBALANCE,
)

ALL_ROLE = "all"  # without --roles every GPU is a peer of every other


@dataclass(frozen=True)
class Thresholds:
    idle_util: float = 3.0  # percent at or below which a GPU counts as idle
    min_held_mib: float = 2048.0  # less than this is a CUDA context, not a worker's tensors
    imbalance_gap: float = 40.0  # points below the role's busy level ...
    imbalance_ratio: float = 0.5  # ... and at most this fraction of it
    near_capacity: float = 95.0  # percent of memory.total


def _gib(mib: float) -> str:
    return f"{mib:.0f} MiB ({mib / 1024:.1f} GiB)"


def busy_level(utilizations: Sequence[float]) -> Optional[float]:
    """The median of the busiest half of a role: robust to one outlier and to a starved majority."""
    if len(utilizations) < 2:
        return None
    ordered = sorted(utilizations, reverse=True)
    return float(statistics.median(ordered[: math.ceil(len(ordered) / 2)]))


def _roles_for(readings: Sequence[GpuReading], roles: RoleMap) -> Dict[int, Optional[str]]:
    if not roles:
        return {r.index: ALL_ROLE for r in readings}
    owner = role_of(roles)
    return {r.index: owner.get(r.index) for r in readings}


def analyze_gpus(
    readings: Sequence[GpuReading],
    *,
    roles: Optional[RoleMap] = None,
    thresholds: Thresholds = Thresholds(),
    memory_total_mib: Optional[float] = None,
    path: Optional[str] = None,
    live: bool = False,
    source: str = "csv",
) -> Report:
    roles = roles or {}
    report = Report(command="gpus")
    role = _roles_for(readings, roles)
    present = {r.index for r in readings}
    for name, indices in roles.items():
        absent = [i for i in indices if i not in present]
        if absent:
            report.problems.append(Problem(
                "--roles", f"role {name!r} names GPU {', '.join(map(str, absent))}, not in the snapshot",
                "those GPUs were not compared"))

    def where(r: GpuReading) -> dict:
        return {"path": path, "line": r.line, "column": 1 if r.line else None}

    def evidence(r: GpuReading, **extra) -> dict:
        base = {"gpu": r.index, "role": role[r.index], "utilization": r.utilization,
                "memory_used_mib": r.memory_used_mib, "samples": r.samples}
        base.update(extra)
        return base

    usable = [r for r in readings if not r.lost and r.utilization is not None]
    idle_held = set()
    for r in usable:
        if r.utilization <= thresholds.idle_util and (r.memory_used_mib or 0) >= thresholds.min_held_mib:
            idle_held.add(r.index)
            report.findings.append(GPU_IDLE_MEMORY_HELD.finding(
                f"GPU {r.index} ({role[r.index] or 'no role'}) holds {_gib(r.memory_used_mib)} at "
                f"{r.utilization:.0f} % utilization over {r.samples} sample(s): a stalled or dead worker",
                evidence=evidence(r), **where(r)))

    # A GPU holding less than min_held (a bare CUDA context) is not running the job: it is nobody's peer.
    in_use = [r for r in usable if (r.memory_used_mib or 0) >= thresholds.min_held_mib]
    levels: Dict[str, float] = {}
    for name in sorted({role[r.index] for r in in_use if role[r.index] is not None}):
        peers = [r for r in in_use if role[r.index] == name]
        level = busy_level([r.utilization for r in peers])
        if level is None:
            continue
        levels[name] = level
        for r in peers:
            if r.index in idle_held:
                continue
            if level - r.utilization >= thresholds.imbalance_gap and r.utilization <= thresholds.imbalance_ratio * level:
                report.findings.append(GPU_ROLE_IMBALANCE.finding(
                    f"GPU {r.index} ({name}) at {r.utilization:.0f} % while its role peers run at {level:.0f} % "
                    f"(median of the busiest half of {len(peers)} GPUs)",
                    evidence=evidence(r, role_busy_level=level, peers=[p.index for p in peers if p is not r]),
                    **where(r)))

    skipped: List[str] = []
    unknown_total = []
    for r in readings:
        if r.lost or r.memory_used_mib is None:
            continue
        total = r.memory_total_mib or memory_total_mib
        if not total:
            unknown_total.append(r.index)
            continue
        percent = 100.0 * r.memory_used_mib / total
        if percent >= thresholds.near_capacity:
            report.findings.append(GPU_MEMORY_NEAR_CAPACITY.finding(
                f"GPU {r.index} ({role[r.index] or 'no role'}) uses {_gib(r.memory_used_mib)} of {_gib(total)} "
                f"({percent:.1f} %)",
                evidence=evidence(r, memory_total_mib=total, memory_percent=round(percent, 1)), **where(r)))
    if unknown_total:
        skipped.append(f"{GPU_MEMORY_NEAR_CAPACITY.code} on GPU {', '.join(map(str, unknown_total))}: memory.total "
                       "unknown (add memory.total to the query or pass --memory-total)")

    if live:
        _processes_gone(readings, role, report, evidence)

    report.facts = {
        "source": source,
        "path": path,
        "gpus": [dict(r.to_dict(), role=role[r.index], memory_total_mib=r.memory_total_mib or memory_total_mib)
                 for r in readings],
        "roles": {name: list(indices) for name, indices in (roles or {ALL_ROLE: tuple(sorted(present))}).items()},
        "role_busy_level": levels,
        "thresholds": asdict(thresholds),
        "skipped_checks": skipped,
    }
    return report


def _processes_gone(readings: Iterable[GpuReading], role: dict, report: Report, evidence) -> None:
    processes = [(r, p) for r in readings for p in r.processes]
    # NVML reports host PIDs: if none of them resolves here we are in another PID namespace and "gone" means
    # "invisible", so only zombies (which are visible by definition) can be trusted.
    resolved = any(p.state not in ("gone", "unknown") for _, p in processes)
    invisible = False
    for r, p in processes:
        if p.state == "zombie" or (p.state == "gone" and resolved):
            held = f"{p.used_mib:.0f} MiB" if p.used_mib is not None else "memory"
            report.findings.append(GPU_PROCESS_GONE.finding(
                f"GPU {r.index} ({role[r.index] or 'no role'}): PID {p.pid} holds {held} but is {p.state}",
                evidence=evidence(r, pid=p.pid, process_state=p.state, process_used_mib=p.used_mib)))
        elif p.state == "gone":
            invisible = True
    if invisible:
        report.problems.append(Problem(
            "GPU processes", "none of the PIDs NVML reports exists in this PID namespace (a container?)",
            "run on the host, or with the host PID namespace, to check DFD404"))
