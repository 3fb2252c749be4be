"""Records -> DFD910: a worker thread that compiled reading a compile setting otherwise than the thread that started
it (runtime/thread_config.py `watch` records each as a recorder event; SettingGap is its codec)."""
from __future__ import annotations

from typing import List, Set, Tuple

from dflash_doctor.compile_settings import setting
from dflash_doctor.findings import Finding
from dflash_doctor.rules import live as rules
from dflash_doctor.outcomes import RecorderEventKind
from dflash_doctor.runtime.thread_config import SettingGap
from dflash_doctor.supervise.records import ProcessRecord


def setting_gap_findings(record: ProcessRecord) -> List[Finding]:
    findings: List[Finding] = []
    seen: Set[Tuple[str, str]] = set()
    for event in record.events:
        if event.kind != RecorderEventKind.COMPILE_SETTING:
            continue
        gap = SettingGap.from_detail(event.detail)
        if (gap.thread, gap.key) in seen:
            continue
        seen.add((gap.thread, gap.key))
        declared = setting(gap.key)
        relied = f" (relied on for: {declared.relied_on_as})" if declared is not None else ""
        findings.append(rules.RUN_SETTING_NOT_IN_THREAD.finding(
            f"thread {gap.thread} compiled reading {gap.key} = {gap.reads}, but {gap.starter}, which started it, "
            f"had {gap.starter_reads}{relied}: torch {record.torch_version or '?'} keeps compile settings per "
            "thread, so the value set there never reached this worker",
            evidence={"pid": record.pid, "rank": record.rank, "thread": gap.thread, "key": gap.key,
                      "reads": gap.reads, "starter": gap.starter, "starter_reads": gap.starter_reads,
                      "role": declared.role.value if declared is not None else None, "at_s": event.t},
        ))
    return findings
