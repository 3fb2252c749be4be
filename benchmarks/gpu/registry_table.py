"""The tables of benchmarks/gpu/registry_h200.sh for docs/gpu-results.md, from the tool's own JSON reports.

    python benchmarks/gpu/registry_table.py OUT_DIR > table.md

OUT_DIR holds results.json (every run's report by name, as the script leaves it) or the runs' <name>.json files.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

REPRO_RUNS = ("repro-sta", "repro-sta-shim")
PIPELINE_RUNS = ("seeds-winner", "seeds-nonlazy", "trace-none", "trace-isolated")


def load(folder: Path) -> Dict[str, dict]:
    combined = folder / "results.json"
    if combined.is_file():
        return json.loads(combined.read_text())
    reports = {}
    for path in sorted(folder.glob("*.json")):
        try:
            reports[path.stem] = json.loads(path.read_text())
        except ValueError:
            reports[path.stem] = {"unreadable": path.name}
    return reports


def _counts(tally: dict) -> str:
    cells = []
    for stress, entry in (tally or {}).items():
        if entry.get("skipped"):
            cells.append(f"{stress} skipped")
            continue
        kinds = ", ".join(f"{kind} {n}" for kind, n in (entry.get("kinds") or {}).items())
        cells.append(f"{stress} {entry.get('reproduced', 0)}/{entry.get('ran', 0)}" + (f" ({kinds})" if kinds else ""))
    return "; ".join(cells) or "-"


def repro_table(reports: Dict[str, dict]) -> List[str]:
    lines = ["| run | mitigation | outcome | reason | row: reproduced/ran per stress | baseline: reproduced/ran per "
             "stress | steps/s (3 threads) | wall s |", "|---|---|---|---|---|---|---|---|"]
    for name in REPRO_RUNS:
        doc = reports.get(name)
        if doc is None:
            lines.append(f"| {name} | - | not run | | | | | |")
            continue
        facts = doc.get("facts") or {}
        multi = facts.get("multi_thread") or {}
        lines.append(f"| {name} | {facts.get('mitigation', '-')} | {facts.get('outcome') or facts.get('verdict') or doc.get('unreadable', '?')} | "
                     f"{facts.get('outcome_reason', '')} | {_counts(facts.get('levels'))} | "
                     f"{_counts(facts.get('baseline_levels'))} | {multi.get('steps_per_s') or '-'} | "
                     f"{facts.get('wall_s', '-')} |")
    return lines


def _workers(facts: dict) -> str:
    bad = [f"{w['name']}:{w['outcome']}" + (f" ({(w.get('error') or '')[:80]})" if w.get("error") else "")
           for w in facts.get("workers") or [] if w.get("outcome") != "ok"]
    return "; ".join(bad) or "all ok"


def pipeline_table(reports: Dict[str, dict]) -> List[str]:
    lines = ["| run | mitigation | tracing thread | exit | findings | steps | tok/s | MFU | warm-up s | wall s | "
             "autograd multithreading in workers | workers |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in PIPELINE_RUNS:
        doc = reports.get(name)
        if doc is None:
            lines.append(f"| {name} | | | not run | | | | | | | | |")
            continue
        facts = doc.get("facts") or {}
        workers = facts.get("workers") or []
        tracer = next((w for w in workers if w.get("role") == "tracer"), None)
        switches = sorted({str(w.get("autograd_multithreading")) for w in workers if w.get("role") == "drafter"})
        tok = facts.get("tokens_per_s")
        mfu = facts.get("mfu")
        warm = facts.get("warmup_s")
        findings = ", ".join(f"{f['code']} {f['name']}" for f in doc.get("findings") or []) or "none"
        lines.append(
            f"| {name} | {facts.get('mitigation', '-')} | {'yes, ' + str(tracer['steps']) + ' traces' if tracer else 'no'}"
            f" | {doc.get('exit_code', '?')} | {findings} | {facts.get('steps', '-')} | "
            f"{f'{tok:,.0f}' if tok else '-'} | {f'{mfu:.1%}' if mfu else '-'} | {f'{warm:.1f}' if warm else '-'} | "
            f"{facts.get('wall_s', 0):.1f} | {', '.join(switches) or '-'} | {_workers(facts)} |")
    return lines


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__)
        return 2
    reports = load(Path(argv[0]))
    print("### single-thread-autograd through repro's ladder (3 threads, --shapes per-thread, --trials 2)\n")
    print("\n".join(repro_table(reports)))
    print("\n### The reference pipeline, seeds preset, 20 steps\n")
    print("\n".join(pipeline_table(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
