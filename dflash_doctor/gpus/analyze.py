"""DFD4xx: compare every GPU with its role peers, its capacity, and the processes holding it."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, cast

from dflash_doctor.findings import Problem, Report, Severity
from dflash_doctor.gpus.facts import GpusFacts, ThresholdFacts
from dflash_doctor.gpus.readings import GpuReading
from dflash_doctor.gpus.roles import RoleMap, role_of
from dflash_doctor.rules.gpus import (
    GPU_ALL_IDLE,
    GPU_IDLE_EMPTY_BESIDE_BUSY,
    GPU_IDLE_MEMORY_HELD,
    GPU_MEMORY_NEAR_CAPACITY,
    GPU_PROCESS_GONE,
    GPU_ROLE_IMBALANCE,
)

ALL_ROLE = "all"  # without --roles every GPU is a peer of every other
STAY_SAMPLES = 3  # DFD406 is a warning once this many samples ...
STAY_SECONDS = 30.0  # ... over at least this long (when the time between samples is known) show it idle


@dataclass(frozen=True)
class Thresholds:
    idle_util: float = 3.0  # percent at or below which a GPU counts as idle
    min_held_mib: float = 2048.0  # less than this is a CUDA context, not a worker's tensors
    imbalance_gap: float = 40.0  # points below the role's busy level ...
    imbalance_ratio: float = 0.5  # ... and at most this fraction of it
    near_capacity: float = 95.0  # percent of memory.total
    busy_util: float = 30.0  # percent above which a GPU holding memory is at work (a busy peer)


def _util(reading: GpuReading) -> float:
    return reading.utilization if reading.utilization is not None else 0.0


def _held(reading: GpuReading) -> float:
    return reading.memory_used_mib if reading.memory_used_mib is not None else 0.0


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


@dataclass(frozen=True)
class _Snapshot:
    """One averaged snapshot with each GPU's role: what every DFD4xx check reads, so each check is one function."""

    readings: Sequence[GpuReading]
    role: Dict[int, Optional[str]]
    thresholds: Thresholds
    path: Optional[str]

    def where(self, r: GpuReading) -> dict:
        return {"path": self.path, "line": r.line, "column": 1 if r.line else None}

    def evidence(self, r: GpuReading, **extra) -> dict:
        base = {"gpu": r.index, "role": self.role[r.index], "utilization": r.utilization,
                "memory_used_mib": r.memory_used_mib, "samples": r.samples}
        base.update(extra)
        return base

    def role_name(self, r: GpuReading) -> str:
        return self.role[r.index] or "no role"

    @property
    def usable(self) -> List[GpuReading]:
        return [r for r in self.readings if not r.lost and r.utilization is not None]

    @property
    def loaded(self) -> List[GpuReading]:
        """GPUs holding more than a bare CUDA context: the ones running the job."""
        return [r for r in self.usable if _held(r) >= self.thresholds.min_held_mib]

    @property
    def working(self) -> List[GpuReading]:
        return [r for r in self.loaded if _util(r) > self.thresholds.idle_util]


def analyze_gpus(
    readings: Sequence[GpuReading],
    *,
    roles: Optional[RoleMap] = None,
    thresholds: Thresholds = Thresholds(),
    memory_total_mib: Optional[float] = None,
    path: Optional[str] = None,
    live: bool = False,
    source: str = "csv",
    span_s: Optional[float] = None,
) -> Report[GpusFacts]:
    """The DFD4xx findings for one averaged snapshot; `span_s` is how long the samples covered, when known."""
    roles = roles or {}
    report: Report[GpusFacts] = Report(command="gpus")
    snapshot = _Snapshot(readings, _roles_for(readings, roles), thresholds, path)
    present = {r.index for r in readings}
    _roles_absent(roles, present, report)
    idle_held = _idle_memory_held(snapshot, span_s, report)
    _empty_beside_busy(snapshot, report)
    levels = _role_imbalance(snapshot, idle_held, report)
    skipped = _near_capacity(snapshot, memory_total_mib, report)
    if live:
        _processes_gone(readings, snapshot.role, report, snapshot.evidence)
    report.facts = {
        "source": source,
        "path": path,
        # (the role after the reading's keys; memory_total_mib keeps its place: `dict(reading, ...)` did the same)
        "gpus": [{**r.to_dict(), "role": snapshot.role[r.index],
                  "memory_total_mib": r.memory_total_mib or memory_total_mib} for r in readings],
        "roles": {name: list(indices) for name, indices in (roles or {ALL_ROLE: tuple(sorted(present))}).items()},
        "role_busy_level": levels,
        "thresholds": cast(ThresholdFacts, asdict(thresholds)),
        "skipped_checks": skipped,
    }
    return report


def _roles_absent(roles: RoleMap, present: Set[int], report: Report) -> None:
    for name, indices in roles.items():
        absent = [i for i in indices if i not in present]
        if absent:
            report.problems.append(Problem(
                "--roles", f"role {name!r} names GPU {', '.join(map(str, absent))}, not in the snapshot",
                "those GPUs were not compared"))


def _idle_memory_held(snapshot: _Snapshot, span_s: Optional[float], report: Report) -> Set[int]:
    """DFD406 when every loaded GPU is idle, else DFD401 for each idle one beside working peers; returns the GPUs
    reported as idle with memory held (the imbalance check skips them: one finding per stalled GPU)."""
    loaded, working = snapshot.loaded, snapshot.working
    if loaded and not working:
        _all_idle(loaded, report, span_s, snapshot)
        return {r.index for r in loaded}
    idle_held: Set[int] = set()
    busiest = ", ".join(str(w.index) for w in sorted(working, key=lambda w: -_util(w))[:4])
    for r in loaded:
        if working and _util(r) <= snapshot.thresholds.idle_util:
            idle_held.add(r.index)
            report.findings.append(GPU_IDLE_MEMORY_HELD.finding(
                f"GPU {r.index} ({snapshot.role_name(r)}) holds {_gib(_held(r))} at "
                f"{_util(r):.0f} % utilization over {r.samples} sample(s) while GPU {busiest} work: a stalled "
                "or dead worker",
                evidence=snapshot.evidence(r), **snapshot.where(r)))
    return idle_held


def _empty_beside_busy(snapshot: _Snapshot, report: Report) -> None:
    """DFD405: an idle GPU holding (almost) nothing while peers of its role work."""
    role, thresholds = snapshot.role, snapshot.thresholds
    loaded_indices = {r.index for r in snapshot.loaded}
    working = snapshot.working
    for r in snapshot.usable:
        if r.index in loaded_indices or _util(r) > thresholds.idle_util or role[r.index] is None:
            continue
        busy = [p for p in working if role[p.index] == role[r.index] and _util(p) >= thresholds.busy_util]
        if busy:
            report.findings.append(GPU_IDLE_EMPTY_BESIDE_BUSY.finding(
                f"GPU {r.index} ({role[r.index]}) idle at {_util(r):.0f} % holding only "
                f"{_gib(_held(r))} while its peers GPU {', '.join(str(p.index) for p in busy[:4])} "
                "work: likely a worker that died and freed it",
                evidence=snapshot.evidence(r, busy_peers=[p.index for p in busy]), **snapshot.where(r)))


def _role_imbalance(snapshot: _Snapshot, idle_held: Set[int], report: Report) -> Dict[str, float]:
    """DFD402 per role; returns each role's busy level. A GPU holding less than min_held (a bare CUDA context) is
    not running the job: it is nobody's peer."""
    loaded, role, thresholds = snapshot.loaded, snapshot.role, snapshot.thresholds
    levels: Dict[str, float] = {}
    for name in sorted({name for name in (role[r.index] for r in loaded) if name is not None}):
        peers = [r for r in loaded if role[r.index] == name]
        level = busy_level([_util(r) for r in peers])
        if level is None:
            continue
        levels[name] = level
        for r in peers:
            if r.index in idle_held:
                continue
            if level - _util(r) >= thresholds.imbalance_gap and _util(r) <= thresholds.imbalance_ratio * level:
                report.findings.append(GPU_ROLE_IMBALANCE.finding(
                    f"GPU {r.index} ({name}) at {_util(r):.0f} % while its role peers run at {level:.0f} % "
                    f"(median of the busiest half of {len(peers)} GPUs)",
                    evidence=snapshot.evidence(r, role_busy_level=level,
                                               peers=[p.index for p in peers if p is not r]),
                    **snapshot.where(r)))
    return levels


def _near_capacity(snapshot: _Snapshot, memory_total_mib: Optional[float], report: Report) -> List[str]:
    """DFD403; returns the checks skipped for want of memory.total."""
    unknown_total = []
    for r in snapshot.readings:
        if r.lost or r.memory_used_mib is None:
            continue
        total = r.memory_total_mib or memory_total_mib
        if not total:
            unknown_total.append(r.index)
            continue
        percent = 100.0 * r.memory_used_mib / total
        if percent >= snapshot.thresholds.near_capacity:
            report.findings.append(GPU_MEMORY_NEAR_CAPACITY.finding(
                f"GPU {r.index} ({snapshot.role_name(r)}) uses {_gib(r.memory_used_mib)} of {_gib(total)} "
                f"({percent:.1f} %)",
                evidence=snapshot.evidence(r, memory_total_mib=total, memory_percent=round(percent, 1)),
                **snapshot.where(r)))
    if not unknown_total:
        return []
    return [f"{GPU_MEMORY_NEAR_CAPACITY.code} on GPU {', '.join(map(str, unknown_total))}: memory.total "
            "unknown (add memory.total to the query or pass --memory-total)"]


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


def _all_idle(loaded: Sequence[GpuReading], report: Report, span_s: Optional[float], snapshot: _Snapshot) -> None:
    loaded = sorted(loaded, key=lambda r: r.index)
    samples = min(r.samples for r in loaded)
    stayed = samples >= STAY_SAMPLES and (span_s is None or span_s >= STAY_SECONDS)
    over = f"{samples} samples" + (f" over {span_s:.0f} s" if span_s is not None else "")
    indices = ", ".join(str(r.index) for r in loaded)
    if stayed:
        message = (f"GPU {indices}: all hold memory and stayed idle across {over}: the job is stuck (a hang, or "
                   "every worker dead)")
    else:
        message = (f"GPU {indices}: all hold memory and are idle in {over}: possibly still loading or compiling; "
                   f"sample again over time (--samples) to tell")
    first = loaded[0]
    report.findings.append(GPU_ALL_IDLE.finding(
        message, severity=Severity.WARNING if stayed else Severity.INFO,
        evidence=snapshot.evidence(first, gpus=[r.index for r in loaded], stayed=stayed, span_s=span_s,
                          min_samples=samples), **snapshot.where(first)))


def make_thresholds(idle_util: float = 3.0, min_held: str = "2048", imbalance_gap: float = 40.0,
                    imbalance_ratio: float = 0.5, near_capacity: float = 95.0, busy_util: float = 30.0) -> Thresholds:
    """Checked thresholds from the options' raw values (ranges, finite numbers; a bad one is a UsageError)."""
    from dflash_doctor.errors import UsageError
    from dflash_doctor.gpus.csv_snapshot import BadValue, parse_mib

    for option, value, low, high in (("--idle-util", idle_util, 0.0, 100.0), ("--busy-util", busy_util, 0.0, 100.0),
                                     ("--imbalance-gap", imbalance_gap, 0.0, 100.0),
                                     ("--near-capacity", near_capacity, 0.0, 100.0)):
        if not (math.isfinite(value) and low <= value <= high):
            raise UsageError(f"{option} must be a number in {low:g}-{high:g}, got {value:g}")
    if not (math.isfinite(imbalance_ratio) and 0 < imbalance_ratio <= 1):
        raise UsageError(f"--imbalance-ratio must be in (0, 1], got {imbalance_ratio:g}")
    try:
        held = parse_mib(min_held)
    except BadValue:
        held = None
    if held is None or not math.isfinite(held):
        raise UsageError(f"--min-held {min_held[:40]!r}: expected a size like 2048 (MiB) or 2GiB")
    return Thresholds(idle_util=idle_util, min_held_mib=held, imbalance_gap=imbalance_gap,
                      imbalance_ratio=imbalance_ratio, near_capacity=near_capacity, busy_util=busy_util)
