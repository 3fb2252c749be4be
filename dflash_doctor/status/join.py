"""Join the logs report and the gpus report into worker verdicts and next steps (data only; the view draws it).

Thread -> GPU: `--map THREAD=GPU` first, else a thread named ROLE-N runs on the N-th GPU of ROLE in --roles
(see dflash_doctor.gpus.roles.gpu_for_thread).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from dflash_doctor.findings import Report
from dflash_doctor.gpus.roles import RoleMap, gpu_for_thread, role_of


def _gpu_codes(gpus_report: Report) -> Dict[int, List[str]]:
    codes: Dict[int, List[str]] = {}
    for finding in gpus_report.findings:
        gpu = finding.evidence.get("gpu")
        if gpu is not None:
            codes.setdefault(gpu, []).append(finding.code)
    return codes


def _state(thread: dict, stalled: set, name: str) -> str:
    if thread.get("died"):
        return "dead"
    if name in stalled:
        return "stalled"
    return "progressing" if thread.get("last_step") is not None or thread.get("last_tok_s") else "unknown"


def join_status(logs_report: Report, gpus_report: Report, roles: RoleMap,
                thread_map: Optional[Dict[str, int]] = None) -> Report:
    report = Report(command="status")
    report.findings = list(logs_report.findings) + list(gpus_report.findings)
    report.problems = list(logs_report.problems) + list(gpus_report.problems)
    gpus = {g["index"]: g for g in gpus_report.facts.get("gpus", [])}
    gpu_codes = _gpu_codes(gpus_report)
    stalled = {f.evidence.get("thread") for f in logs_report.findings if f.code == "DFD507"}
    owner = role_of(roles)

    workers = []
    claimed = {}
    for name, thread in logs_report.facts.get("threads", {}).items():
        gpu = gpu_for_thread(name, roles, thread_map)
        reading = gpus.get(gpu) if gpu is not None else None
        if gpu is not None:
            claimed[gpu] = name
        death = thread.get("died")
        workers.append({
            "thread": name,
            "state": _state(thread, stalled, name),
            "gpu": gpu,
            "role": owner.get(gpu) if gpu is not None else None,
            "cause": None if not death else {k: death[k] for k in ("code", "exception", "message", "line")},
            "last_step": thread.get("last_step"),
            "last_tok_s": thread.get("last_tok_s"),
            "gpu_utilization": reading.get("utilization") if reading else None,
            "gpu_memory_used_mib": reading.get("memory_used_mib") if reading else None,
            "gpu_findings": gpu_codes.get(gpu, []),
        })

    others = [
        {"gpu": index, "role": g.get("role"), "thread": claimed.get(index), "utilization": g.get("utilization"),
         "memory_used_mib": g.get("memory_used_mib"), "findings": gpu_codes.get(index, [])}
        for index, g in sorted(gpus.items())
    ]
    report.facts = {
        "log": logs_report.facts.get("path"),
        "gpu_source": gpus_report.facts.get("source"),
        "roles": {name: list(indices) for name, indices in roles.items()},
        "thread_map": dict(thread_map or {}),
        "workers": workers,
        "gpus": others,
        "unexplained_idle_gpus": [
            index for index, codes in sorted(gpu_codes.items())
            if "DFD401" in codes and not any(w["gpu"] == index and w["state"] == "dead" for w in workers)
        ],
        "next_steps": next_steps(report.findings, workers, roles),
    }
    return report


def next_steps(findings, workers, roles: RoleMap) -> List[str]:
    codes = {f.code for f in findings}
    dead = [w for w in workers if w["state"] == "dead"]
    steps: List[str] = []
    if "DFD501" in codes:
        role = next((w["role"] for w in dead if w["cause"] and w["cause"]["code"] == "DFD501" and w["role"]), None)
        threads = len(roles.get(role, ())) if role else max(2, len(dead))
        steps.append("dflash-doctor guards: does the installed torch check a process-global FX-tracing flag on "
                     "every compiled call?")
        steps.append(f"dflash-doctor repro --threads {threads} --matrix: which mitigation (single-thread warm-up, "
                     "global step lock, processes) removes the race on this machine")
        steps.append("dflash-doctor scan <trainer dir>: find compiled calls reached from threads (DFD201)")
    if codes & {"DFD502", "DFD505", "DFD506"}:
        steps.append("dflash-doctor scan <trainer dir>: flex_attention reached uncompiled (DFD202) or the FX "
                     "error silenced (DFD301)")
    if "DFD507" in codes or any(w["state"] == "stalled" for w in workers):
        steps.append("py-spy dump --pid PID: where the stalled thread waits (a compile-lock deadlock shows "
                     "compile_fx_backward on one thread and autograd on another)")
    if "DFD504" in codes:
        steps.append("the rank with the lowest last step stopped first: start from its log")
    if "DFD401" in codes and not dead:
        steps.append("a GPU holds memory at 0 % but the log shows no dead thread: pass the full log, or --map "
                     "threads to GPUs")
    return steps
