"""The table of benchmarks/gpu/own_run.sh, read only from the tool's own JSON reports in the results folder.

    python benchmarks/gpu/own_run_table.py RESULTS_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = (("A", "A_run.json", "plain loop, same shapes, no fix"),
        ("B", "B_different_run.json", "plain loop, different shapes, --fix threadlocal-flag,non-lazy-backward"),
        ("B", "B_same_run.json", "plain loop, same shapes, --fix threadlocal-flag,non-lazy-backward"),
        ("C", "C_attach.json", "plain loop outside run, attach PID"),
        ("D", "D_run.json", "seeds-like trainer, no fix"))


def _row(step: str, path: Path, what: str) -> str:
    if not path.exists():
        return f"| {step} | {what} | (no report) | | | |"
    doc = json.loads(path.read_text(encoding="utf-8"))
    facts = doc.get("facts", {})
    trial = (facts.get("trials") or [{}])[0]
    codes = ", ".join(f["code"] for f in doc.get("findings", [])) or "none"
    who, latency = [], []
    for finding in doc.get("findings", []):
        evidence = finding.get("evidence", {})
        if evidence.get("holder"):
            who.append(f"{evidence.get('worker')} <- held by {evidence['holder']} (rank {evidence.get('rank')})")
        elif evidence.get("threads"):
            who.append("cycle: " + ", ".join(evidence["threads"]))
        if evidence.get("detected_at_s") is not None:
            latency.append(f"finding at {evidence['detected_at_s']:.1f} s, last clear sample at "
                           f"{evidence.get('last_clear_sample_at_s')}, last event at {evidence.get('last_event_at_s')}, "
                           f"latency {evidence.get('latency_s')} s")
    code = trial.get("exit_code", "attach")
    seconds = trial.get("seconds", facts.get("seconds"))
    return f"| {step} | {what} | {codes} | {'; '.join(who)} | {'; '.join(latency)} | exit {code}, {seconds} s |"


def main(argv=None) -> int:
    root = Path((argv or sys.argv[1:])[0])
    lines = ["| step | run | findings | who | cycle -> finding | outcome |", "|---|---|---|---|---|---|"]
    lines += [_row(step, root / name, what) for step, name, what in RUNS]
    overhead = root / "E_overhead.md"
    if overhead.exists():
        lines += ["", overhead.read_text(encoding="utf-8")]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
