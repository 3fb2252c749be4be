"""How `dflash-doctor logs` reads issue 38's held-back set: logs of the shapes the issue names (threads dying at once,
logger formats, per-GPU prefixes, DataParallel replicas, recompile storms under threads, the tool's own `run` lines).

    python benchmarks/logs_heldback/evaluate.py                 # one line per log on stdout
    python benchmarks/logs_heldback/evaluate.py --json FILE     # ... and the rows as JSON (results.md quotes them)

manifest.json labels each log (written before the tool ran on it). A log is right when the judge of
benchmarks/logs_heldout says so (every expected finding, nothing unexpected), the workers the facts say died are
exactly 'dead' (when given), and no worker in 'never' is named by a finding or the facts. These logs are not test
fixtures and the reader was not tuned on them; results.md keeps the first contact (before issue 38's reader) and the
figures after it.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# The logs themselves live with the fixtures (the repository keeps log files there only); no test reads them.
LOGS = REPO / "fixtures" / "logs" / "heldback"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "logs_heldout"))

from evaluate import judge  # noqa: E402  (benchmarks/logs_heldout's judge: one meaning of 'right')


def _check(entry: Dict[str, Any], report: Dict[str, Any]) -> Tuple[str, List[str]]:
    findings = report["findings"]
    outcome, why = judge(entry, findings)
    threads = report["facts"]["threads"]
    if "dead" in entry:
        dead = sorted(name for name, facts in threads.items() if facts.get("died"))
        if dead != sorted(entry["dead"]):
            why.append(f"dead {dead}, expected {sorted(entry['dead'])}")
    named = set(threads) | {f["evidence"].get("thread") for f in findings}
    for name in entry.get("never", []):
        if name in named:
            why.append(f"names worker {name!r}")
    return ("right" if not why else outcome if outcome != "right" else "wrong"), why


def evaluate() -> List[Dict[str, Any]]:
    from dflash_doctor.logs.options import LogOptions
    from dflash_doctor.logs.source import scan_stream
    from dflash_doctor.render.json_format import envelope

    rows = []
    for entry in json.loads((HERE / "manifest.json").read_text())["logs"]:
        data = (LOGS / f"{entry['id']}.log").read_bytes()
        report = json.loads(json.dumps(envelope(scan_stream(io.BytesIO(data), entry["id"], LogOptions()), 0),
                                       default=str))
        outcome, why = _check(entry, report)
        rows.append({"id": entry["id"], "outcome": outcome, "why": why,
                     "found": sorted({f"{f['code']} {f['evidence'].get('thread')}" for f in report["findings"]})})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = evaluate()
    for row in rows:
        print(f"{row['id']}: {row['outcome']}  found: {', '.join(row['found']) or '-'}")
        for why in row["why"]:
            print(f"    {why}")
    right = sum(row["outcome"] == "right" for row in rows)
    print(f"{right} of {len(rows)} right")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
