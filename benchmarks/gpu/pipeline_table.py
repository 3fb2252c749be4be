"""Summarise a pipeline GPU script's JSON reports (pipeline_h200.sh, pipeline_small.sh): a markdown table of every
run in "$OUT/runs.txt" order, the issue's targets checked where their runs are present, and every run's facts in
"$OUT/results.json". Usage: python benchmarks/gpu/pipeline_table.py OUT"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

COLUMNS = ("run", "exit", "findings", "steps", "tok/s", "MFU", "step p50 / p90 ms", "set-up s (corpus s, decode)",
           "warm-up s", "first step since process start s", "wall s", "target forward", "transport", "workers")
MFU_TARGET, WARMUP_TARGET_S, FIRST_STEP_TARGET_S, PROCESSES_RATIO_TARGET = 0.30, 30.0, 60.0, 0.9


def _fmt(value, pattern="{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def run_names(out: Path) -> List[str]:
    """Runs in the order the script ran them (runs.txt), else every report in the folder."""
    listed = out / "runs.txt"
    names = []
    if listed.is_file():
        names = [line.split()[0] for line in listed.read_text().splitlines() if line and " rc=" in line]
    return names or sorted(p.stem for p in out.glob("*.json") if p.stem != "results")


def since_start(facts: dict) -> Optional[float]:
    """Process start (interpreter, torch import) to the first drafter step's end."""
    if facts.get("warmup_s") is None:
        return None
    return (facts.get("startup_s") or 0.0) + facts["warmup_s"]


def row(name: str, doc: dict) -> str:
    facts = doc["facts"]
    steps = facts.get("step_time_s") or {}
    corpus = facts.get("corpus") or {}
    setup = _fmt(facts.get("setup_s"))
    if corpus:
        setup += f" ({corpus.get('seconds', 0):.1f}, {corpus.get('decode')})"
    unhealthy = [f"{w['name']}:{w['outcome']}" for w in facts.get("workers", []) if w["outcome"] != "ok"]
    findings = ", ".join(f"{f['code']} {f['name']}" for f in doc.get("findings", [])) or "none"
    return " | ".join([
        name, str(doc.get("exit_code")), findings, str(facts.get("steps")), _fmt(facts.get("tokens_per_s"), "{:,.0f}"),
        _fmt(facts.get("mfu"), "{:.1%}"),
        f"{_fmt(steps.get('p50') and 1000 * steps['p50'], '{:.0f}')} / "
        f"{_fmt(steps.get('p90') and 1000 * steps['p90'], '{:.0f}')}",
        setup, _fmt(facts.get("warmup_s")), _fmt(since_start(facts)), _fmt(facts.get("wall_s")),
        str(facts.get("target_forward")),
        str(facts.get("transport")), ", ".join(unhealthy) or "all ok",
    ])


def _check(label: str, ok: Optional[bool], got: str) -> str:
    verdict = "not run" if ok is None else ("met" if ok else "MISSED")
    return f"| {label} | {got} | {verdict} |"


def targets(docs: Dict[str, dict]) -> List[str]:
    """The issue's targets, each from the run it is about (absent runs: not run)."""
    facts = {name: doc["facts"] for name, doc in docs.items()}
    lines = ["| target | got | |", "|---|---|---|"]
    none, fixed = docs.get("seeds-none"), facts.get("seeds-fixed")
    if none is not None:
        codes = [f["code"] for f in none.get("findings", [])]
        named = any(code in ("DFD803", "DFD804") for code in codes)
        lines.append(_check("seeds, no mitigation: a named race (DFD803 or DFD804)", named, ", ".join(codes) or "none"))
    else:
        lines.append(_check("seeds, no mitigation: a named race (DFD803 or DFD804)", None, "-"))
    ok = None if fixed is None else fixed.get("steps") == 20 and fixed.get("failed_worker") is None
    lines.append(_check("seeds, threadlocal-flag,non-lazy-backward: trains 20 steps", ok,
                        "-" if fixed is None else f"{fixed.get('steps')} steps"))
    first = None if fixed is None else since_start(fixed)
    lines.append(_check(f"seeds: first drafter step within {FIRST_STEP_TARGET_S:.0f} s of the process start",
                        None if first is None else first <= FIRST_STEP_TARGET_S, _fmt(first, "{:.1f} s")))
    threads, processes = facts.get("small-threads"), facts.get("small-processes")
    mfu = None if threads is None else threads.get("mfu")
    lines.append(_check(f"small, threads: MFU >= {MFU_TARGET:.0%}", None if mfu is None else mfu >= MFU_TARGET,
                        _fmt(mfu, "{:.1%}")))
    warm = None if threads is None else threads.get("warmup_s")
    lines.append(_check(f"small, threads: warm-up <= {WARMUP_TARGET_S:.0f} s",
                        None if warm is None else warm <= WARMUP_TARGET_S, _fmt(warm, "{:.1f} s")))
    rates = [f.get("tokens_per_s") if f else None for f in (threads, processes)]
    ratio = rates[1] / rates[0] if all(rates) else None
    lines.append(_check(f"small: processes >= {PROCESSES_RATIO_TARGET}x threads (tok/s)",
                        None if ratio is None else ratio >= PROCESSES_RATIO_TARGET, _fmt(ratio, "{:.2f}x")))
    return lines


def main(out: Path) -> int:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    docs = {}
    for name in run_names(out):
        path = out / f"{name}.json"
        if not path.is_file():
            print(f"| {name} | no report (see {name}.log) |" + " |" * (len(COLUMNS) - 2))
            continue
        docs[name] = json.loads(path.read_text())
        print(f"| {row(name, docs[name])} |")
    print()
    print("\n".join(targets(docs)))
    (out / "results.json").write_text(json.dumps(docs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
