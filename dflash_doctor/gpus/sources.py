"""Turn a GPU source (a CSV snapshot, live NVML) into the gpus Report: read, describe processes, analyze."""
from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

from dflash_doctor.findings import Problem, Report
from dflash_doctor.gpus.next_steps import next_steps
from dflash_doctor.gpus.analyze import Thresholds, analyze_gpus
from dflash_doctor.gpus.csv_snapshot import read_csv_snapshot
from dflash_doctor.gpus.facts import GpusFacts
from dflash_doctor.gpus.nvml import LiveSnapshot, NvmlDevices, NvmlUnavailable, PynvmlDevices, iter_samples
from dflash_doctor.gpus.processes import ProcessProbe, describe_processes, psutil_probe
from dflash_doctor.gpus.roles import RoleMap


def report_from_csv(
    lines: Iterable[str],
    source: str,
    *,
    columns: Optional[Sequence[str]] = None,
    roles: Optional[RoleMap] = None,
    thresholds: Thresholds = Thresholds(),
    memory_total_mib: Optional[float] = None,
) -> Report[GpusFacts]:
    snapshot = read_csv_snapshot(lines, source, columns)
    report = analyze_gpus(snapshot.readings, roles=roles, thresholds=thresholds, memory_total_mib=memory_total_mib,
                          path=source, source="csv")
    report.problems[:0] = snapshot.problems
    if not snapshot.readings:
        report.problems.append(Problem(source, "no GPU rows in the snapshot",
                                       "feed nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv"))
    report.facts.update({"columns": list(snapshot.columns), "header": snapshot.header, "rows": snapshot.rows,
                         "next_steps": next_steps(report.findings, source)})
    return report


MAX_CSV_LINE = 4096  # an nvidia-smi row is under 200 bytes; longer lines are cut (and then fail to parse)


def report_from_csv_input(
    path: str,
    *,
    columns: Optional[Sequence[str]] = None,
    roles: Optional[RoleMap] = None,
    thresholds: Thresholds = Thresholds(),
    memory_total_mib: Optional[float] = None,
) -> Report[GpusFacts]:
    """`report_from_csv` over a path (`-`: stdin), read like a log: only regular files, bounded lines, and
    anything else (a device, a FIFO, binary data) a Problem in the report, never a hang."""
    from dflash_doctor.logs.reader import iter_lines, open_log

    opened = open_log(path)
    if isinstance(opened, Problem):
        report: Report[GpusFacts] = Report(command="gpus", problems=[opened])
        report.facts = {"source": "csv", "path": opened.subject, "gpus": []}
        return report
    stream, name, _ = opened
    lines = (raw.decode("utf-8", "replace") for raw in iter_lines(stream, max_line=MAX_CSV_LINE, chunk=1 << 16))
    try:
        return report_from_csv(lines, name, columns=columns, roles=roles, thresholds=thresholds,
                               memory_total_mib=memory_total_mib)
    finally:
        if path != "-":
            stream.close()


def report_from_nvml(
    *,
    samples: Optional[int],
    interval: float,
    sleep: Callable[[float], None],
    open_devices: Callable[[], NvmlDevices] = PynvmlDevices.open,
    probe: ProcessProbe = psutil_probe,
    roles: Optional[RoleMap] = None,
    thresholds: Thresholds = Thresholds(),
    memory_total_mib: Optional[float] = None,
    on_sample: Optional[Callable[[Report[GpusFacts]], None]] = None,
) -> Report[GpusFacts]:
    """Sample NVML `samples` times (None: until KeyboardInterrupt), calling `on_sample` with each running report.

    No NVML or no GPU is a Problem in the returned report (exit bit 4), never an exception.
    """
    try:
        devices = open_devices()
    except NvmlUnavailable as exc:
        return _unavailable(exc)
    last: Optional[LiveSnapshot] = None
    report: Optional[Report[GpusFacts]] = None
    try:
        for last in iter_samples(devices, samples, interval, sleep):
            if on_sample is not None:
                report = _live_report(last, probe, roles, thresholds, memory_total_mib,
                                      (last.samples - 1) * interval)
                on_sample(report)
    except NvmlUnavailable as exc:
        return _unavailable(exc)
    except KeyboardInterrupt:
        if last is None:
            raise
    finally:
        devices.shutdown()
    if last is None:
        return _unavailable(NvmlUnavailable("stopped before the first sample"))
    if report is None or report.facts.get("samples") != last.samples:
        report = _live_report(last, probe, roles, thresholds, memory_total_mib, (last.samples - 1) * interval)
    return report


def _live_report(snapshot: LiveSnapshot, probe, roles, thresholds, memory_total_mib, span_s) -> Report[GpusFacts]:
    readings = describe_processes(snapshot.readings, probe)
    report = analyze_gpus(readings, roles=roles, thresholds=thresholds, memory_total_mib=memory_total_mib,
                          live=True, source="nvml", span_s=span_s)
    report.problems[:0] = snapshot.problems
    report.facts["samples"] = snapshot.samples
    report.facts["next_steps"] = next_steps(report.findings, "snapshot.csv")
    return report


def _unavailable(exc: Exception) -> Report[GpusFacts]:
    report: Report[GpusFacts] = Report(command="gpus")
    report.problems.append(Problem("nvml", str(exc), "use --from FILE with nvidia-smi CSV from the GPU machine"))
    report.facts = {"source": "nvml", "gpus": []}
    return report
