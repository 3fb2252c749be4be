"""`status`: read the log and the GPUs with their own defaults, then join them (join.py)."""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Sequence

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Report
from dflash_doctor.status.facts import StatusFacts
from dflash_doctor.gpus.analyze import Thresholds
from dflash_doctor.gpus.roles import RoleMap
from dflash_doctor.logs.options import make_options
from dflash_doctor.status.join import join_status


def status_report(
    log: str,
    *,
    source: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    roles: Optional[RoleMap] = None,
    thread_map: Optional[Dict[str, int]] = None,
    memory_total_mib: Optional[float] = None,
    samples: int = 5,
    interval: float = 0.5,
    thread_pattern: Optional[str] = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Report[StatusFacts]:
    """The joined Report: the log scanned with the logs defaults, the GPUs from a CSV (`source`) or live NVML."""
    from dflash_doctor.gpus.sources import report_from_csv_input, report_from_nvml
    from dflash_doctor.logs.source import scan_log

    if log == "-" and source == "-":
        raise UsageError("--log and --from cannot both read stdin")
    roles = roles or {}
    logs_report = scan_log(log, make_options(thread_pattern))
    if source is not None:
        gpus_report = report_from_csv_input(source, columns=columns, roles=roles, thresholds=Thresholds(),
                                            memory_total_mib=memory_total_mib)
    else:
        gpus_report = report_from_nvml(samples=samples, interval=interval, sleep=sleep, roles=roles,
                                       memory_total_mib=memory_total_mib)
    return join_status(logs_report, gpus_report, roles, thread_map)
