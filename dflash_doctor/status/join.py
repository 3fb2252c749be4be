"""Join the logs report and the gpus report into worker verdicts and next steps (data only; the view draws it).

Worker -> GPU: `--map NAME=GPU` first, then the GPU the log itself names for a dead worker (an OOM's 'GPU 7 has a
total capacity'), then a thread named ROLE-N runs on the N-th GPU of ROLE in --roles (see
dflash_doctor.gpus.roles.gpu_for_thread), then rankN on GPU N (one rank per GPU, the usual torchrun layout).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, cast

from dflash_doctor.findings import Report
from dflash_doctor.gpus.facts import GpusFacts
from dflash_doctor.gpus.next_steps import next_steps as gpu_steps
from dflash_doctor.gpus.roles import RoleMap, gpu_for_thread, role_of
from dflash_doctor.logs.facts import DeathFacts, LogsFacts, ThreadFacts
from dflash_doctor.logs.next_steps import next_steps as log_steps
from dflash_doctor.rules.gpus import IDLE_BESIDE_PEERS
from dflash_doctor.rules.logs import DEATH_CODES, LOG_FX_TRACE_RACE, LOG_THREAD_STALLED
from dflash_doctor.status.facts import CauseFacts, GpuStatusFacts, StatusFacts, WorkerFacts

_RANK = re.compile(r"^rank(?P<n>\d+)$")


def _gpu_codes(gpus_report: Report) -> Dict[int, List[str]]:
    codes: Dict[int, List[str]] = {}
    for finding in gpus_report.findings:
        gpu = finding.evidence.get("gpu")
        if gpu is not None:
            codes.setdefault(gpu, []).append(finding.code)
    return codes


def _state(thread: ThreadFacts, stalled: set, name: str) -> str:
    if thread.get("died"):
        return "dead"
    if name in stalled:
        return "stalled"
    return "progressing" if thread.get("last_step") is not None or thread.get("last_rate") else "unknown"


def worker_gpu(name: str, thread: ThreadFacts, roles: RoleMap,
               thread_map: Optional[Dict[str, int]]) -> Optional[int]:
    if thread_map and name in thread_map:
        return thread_map[name]
    death = thread.get("died")
    gpu_named = death.get("gpu") if death else None
    if gpu_named is not None:
        return int(gpu_named)
    gpu = gpu_for_thread(name, roles, thread_map)
    if gpu is not None:
        return gpu
    rank = _RANK.match(name)
    owned = role_of(roles)
    if rank is not None and (not roles or int(rank.group("n")) in owned):
        return int(rank.group("n"))
    return None


def _cause(death: Optional[DeathFacts]) -> Optional[CauseFacts]:
    if not death:
        return None
    return {"code": death.get("code"), "exception": death.get("exception"), "message": death.get("message"),
            "line": death.get("line"), "signal": death.get("signal"), "root_cause": death.get("root_cause")}


def join_status(logs_report: Report[LogsFacts], gpus_report: Report[GpusFacts], roles: RoleMap,
                thread_map: Optional[Dict[str, int]] = None) -> Report[StatusFacts]:
    report: Report[StatusFacts] = Report(command="status")
    report.findings = list(logs_report.findings) + list(gpus_report.findings)
    report.problems = list(logs_report.problems) + list(gpus_report.problems)
    gpus = {g["index"]: g for g in gpus_report.facts.get("gpus", [])}
    gpu_codes = _gpu_codes(gpus_report)
    stalled = {f.evidence.get("thread") for f in logs_report.findings if f.code == LOG_THREAD_STALLED.code}
    owner = role_of(roles)

    workers: List[WorkerFacts] = []
    claimed: Dict[int, str] = {}
    for name, thread in logs_report.facts.get("threads", {}).items():
        gpu = worker_gpu(name, thread, roles, thread_map)
        reading = gpus.get(gpu) if gpu is not None else None
        if gpu is not None:
            claimed[gpu] = name
        death = thread.get("died")
        workers.append({
            "thread": name,
            "state": _state(thread, stalled, name),
            "gpu": gpu,
            "role": owner.get(gpu) if gpu is not None else None,
            "cause": _cause(death),
            "last_step": thread.get("last_step"),
            "last_tok_s": thread.get("last_tok_s"),
            "gpu_utilization": reading.get("utilization") if reading else None,
            "gpu_memory_used_mib": reading.get("memory_used_mib") if reading else None,
            "gpu_findings": gpu_codes.get(gpu, []) if gpu is not None else [],
        })

    others: List[GpuStatusFacts] = [
        {"gpu": index, "role": g.get("role"), "thread": claimed.get(index), "utilization": g.get("utilization"),
         "memory_used_mib": g.get("memory_used_mib"), "findings": gpu_codes.get(index, [])}
        for index, g in sorted(gpus.items())
    ]
    dead_on = {w["gpu"] for w in workers if w["state"] == "dead"}
    unexplained = [index for index, codes in sorted(gpu_codes.items())
                   if set(IDLE_BESIDE_PEERS) & set(codes) and index not in dead_on]
    report.facts = {
        "log": logs_report.facts.get("path"),
        "gpu_source": gpus_report.facts.get("source"),
        "roles": {name: list(indices) for name, indices in roles.items()},
        "thread_map": dict(thread_map or {}),
        "workers": workers,
        "root_cause": logs_report.facts.get("root_cause"),
        "gpus": others,
        "unexplained_idle_gpus": unexplained,
        "next_steps": next_steps(logs_report, gpus_report, workers, roles, unexplained),
    }
    return report


def next_steps(logs_report: Report[LogsFacts], gpus_report: Report[GpusFacts], workers: List[WorkerFacts],
               roles: RoleMap,
               unexplained: List[int]) -> List[str]:
    dead = [w for w in workers if w["state"] == "dead"]
    race_role = next((w["role"] for w in dead
                      if w["cause"] and w["cause"]["code"] == LOG_FX_TRACE_RACE.code and w["role"]), None)
    count = len(roles.get(race_role, ())) if race_role else None
    # (log_steps reads the threads as plain dicts, which they are)
    steps = log_steps(logs_report.findings, cast(Dict[str, dict], logs_report.facts.get("threads", {})),
                      workers=count)
    if unexplained:
        if dead or any(f.code in DEATH_CODES for f in logs_report.findings):
            steps.append(f"GPU {', '.join(map(str, unexplained))} idle with no dead worker mapped to it: "
                         "--map WORKER=GPU to say which worker ran there")
        else:
            steps.append(f"GPU {', '.join(map(str, unexplained))} idle but the log shows no dead worker: pass the "
                         "full log, or --map WORKER=GPU")
    steps += [s for s in gpu_steps(gpus_report.findings) if not s.startswith("dflash-doctor status")]
    return list(dict.fromkeys(steps))
