"""Run a DFD4xx rule example (an nvidia-smi CSV whose first comment line carries flags) through the analyzers.

First-line conventions: `# --roles R=0-2 --memory-total 97871` are `gpus` flags; `# live: 0:4242=zombie ...`
replays the CSV through the live NVML path with those processes (gpu:pid=psutil state).
"""
from __future__ import annotations

import shlex
from typing import Dict, List, Optional, Tuple

from dflash_doctor.findings import Finding, Report
from dflash_doctor.gpus.csv_snapshot import parse_memory_total, read_csv_snapshot
from dflash_doctor.gpus.nvml import RawSample
from dflash_doctor.gpus.processes import ProcessInfo
from dflash_doctor.gpus.roles import parse_roles
from dflash_doctor.gpus.sources import report_from_csv, report_from_nvml


class SnapshotDevices:
    """NvmlDevices that replays a CSV snapshot, with the given processes per GPU."""

    def __init__(self, readings, processes: Dict[int, List[Tuple[int, Optional[float]]]]) -> None:
        self._readings = {r.index: r for r in readings}
        self._processes = processes

    def device_count(self) -> int:
        return len(self._readings)

    def sample(self, index: int) -> RawSample:
        r = self._readings[index]
        return RawSample(index=index, utilization=r.utilization, memory_used_mib=r.memory_used_mib,
                         memory_total_mib=r.memory_total_mib,
                         processes=tuple(self._processes.get(index, ())))

    def shutdown(self) -> None:
        pass


def _directives(text: str) -> Tuple[dict, Dict[int, List[Tuple[int, str]]], bool]:
    first = text.splitlines()[0] if text.strip() else ""
    if not first.startswith("#"):
        return {}, {}, False
    body = first[1:].strip()
    live = body.startswith("live:")
    procs: Dict[int, List[Tuple[int, str]]] = {}
    if live:
        body, _, flags = body[len("live:"):].partition("--")
        for item in body.split():
            gpu, _, rest = item.partition(":")
            pid, _, state = rest.partition("=")
            procs.setdefault(int(gpu), []).append((int(pid), state))
        body = "--" + flags if flags else ""
    words = shlex.split(body)
    options = dict(zip(words[::2], words[1::2]))
    return options, procs, live


def run_example(text: str) -> Report:
    options, procs, live = _directives(text)
    roles = parse_roles(options.get("--roles"))
    memory_total = parse_memory_total(options.get("--memory-total"))
    lines = text.splitlines(keepends=True)
    if not live:
        return report_from_csv(lines, "<example>", roles=roles, memory_total_mib=memory_total)
    snapshot = read_csv_snapshot(lines, "<example>")
    states = {pid: state for entries in procs.values() for pid, state in entries}
    held = {gpu: [(pid, next(r.memory_used_mib for r in snapshot.readings if r.index == gpu)) for pid, _ in entries]
            for gpu, entries in procs.items()}
    return report_from_nvml(
        samples=1, interval=0.0, sleep=lambda _s: None,
        open_devices=lambda: SnapshotDevices(snapshot.readings, held),
        probe=lambda pid: ProcessInfo(states.get(pid, "gone"), name="python", threads=1),
        roles=roles, memory_total_mib=memory_total,
    )


def example_findings(text: str) -> List[Finding]:
    """An nvidia-smi rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    return run_example(text).findings
