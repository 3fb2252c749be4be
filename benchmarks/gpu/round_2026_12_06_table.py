"""Markdown tables for docs/gpu-results.md from the JSON that benchmarks/gpu/round_2026_12_06.sh leaves in $OUT.

    python benchmarks/gpu/round_2026_12_06_table.py OUT_FOLDER

Reads only the tool's JSON documents and the step metas (exit code, seconds); every figure comes from them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _first_line(text: Optional[str], cap: int = 110) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return (line[:cap] + "...") if len(line) > cap else line


def _codes(doc: Optional[dict]) -> str:
    if not doc:
        return "no JSON"
    codes = [f["code"] for f in doc.get("findings", [])]
    return ", ".join(codes) if codes else "no findings"


def _step_cell(step: Dict[str, Any]) -> str:
    meta = step.get("meta") or {}
    if meta.get("skipped"):
        return f"skipped ({meta['skipped']})"
    said = f"exit {meta.get('rc')}, {meta.get('seconds')} s"
    return said + (" (timed out)" if meta.get("timed_out") else "")


def dataparallel_table(block: dict) -> List[str]:
    lines = []
    repro = (block["steps"].get("B1_repro_dataparallel") or {})
    facts = ((repro.get("doc") or {}).get("facts")) or {}
    if facts:
        lines += [f"`repro --mode dataparallel --threads 3 --device cuda` ({_step_cell(repro)}; torch "
                  f"{facts.get('torch_version')}): verdict **{facts.get('verdict')}** ({facts.get('kind')})", "",
                  "| form | outcome | steps | graphs compiled | model intact | took s | fix | error |",
                  "|---|---|---|---|---|---|---|---|"]
        for form in facts.get("forms", []):
            fix = f"{form['fix']}: {form.get('fix_outcome')}" if form.get("fix") else "-"
            lines.append(f"| `{form['code']}` | {form['outcome']} | {form['steps']} | {form['graphs']} | "
                         f"{form['model_intact']} | {form['seconds']} | {fix} | {_first_line(form.get('error'))} |")
        lines.append("")
    else:
        lines += [f"`repro --mode dataparallel`: {_step_cell(repro)}, no facts", ""]
    lines += ["| `run` on benchmarks/gpu/dataparallel_loop.py | exit, time | findings | first finding |", "|---|---|---|---|"]
    for name, label in (("B2_run_inside", "--form inside"), ("B3_run_inside_caught", "--form inside --catch"),
                        ("B4_run_outside_fix", "--form outside (the fix), --expect clean")):
        step = block["steps"].get(name) or {}
        doc = step.get("doc")
        first = (doc or {}).get("findings") or [{}]
        lines.append(f"| {label} | {_step_cell(step)} | {_codes(doc)} | {_first_line(first[0].get('message'))} |")
    return lines


def _cycles(doc: Optional[dict]) -> str:
    """How each finding named the hang: its cycle and the threads in it (the same on every attach, issue 37)."""
    named = []
    for finding in (doc or {}).get("findings", []):
        evidence = finding.get("evidence") or {}
        if evidence.get("cycle"):
            named.append(f"{finding['code']} {evidence['cycle']} ({', '.join(map(str, evidence.get('threads') or []))})")
    return "; ".join(named) or "-"


def attach_table(block: dict) -> List[str]:
    lines = ["| step | exit, time | findings | cycle named | first finding |", "|---|---|---|---|---|"]
    for name, step in sorted(block["steps"].items()):
        doc = step.get("doc")
        first = (doc or {}).get("findings") or [{}]
        lines.append(f"| {name} | {_step_cell(step)} | {_codes(doc)} | {_cycles(doc)} | "
                     f"{_first_line(first[0].get('message'))} |")
    return lines


def repro_rows_table(block: dict) -> List[str]:
    lines = ["| row | exit, time | verdict | kind | outcome | reason |", "|---|---|---|---|---|---|"]
    for name, step in sorted(block["steps"].items()):
        facts = ((step.get("doc") or {}).get("facts")) or {}
        lines.append(f"| {facts.get('mitigation', name)} | {_step_cell(step)} | {facts.get('verdict')} | "
                     f"{facts.get('kind')} | {facts.get('outcome', '-')} | {_first_line(facts.get('outcome_reason'), 90)} |")
    return lines


def _pipeline_cell(facts: dict) -> str:
    if not facts:
        return "no facts"
    mfu = facts.get("mfu")
    return (f"MFU {mfu * 100:.1f} %" if mfu is not None else "no MFU") + (
        f", {facts.get('tokens_per_s') or 0:,.0f} tok/s, warm-up {round(facts['warmup_s'], 1) if facts.get('warmup_s') is not None else None} s")


def pipeline_table(block: dict) -> List[str]:
    """Q: the pipeline with threads and with processes (targets: MFU >= 45 %, warm-up <= 20 s, processes >= 0.95x
    threads' throughput), then run's share of the same step."""
    steps = block["steps"]
    facts = {name: ((steps.get(name) or {}).get("doc") or {}).get("facts") or {}
             for name in ("Q1_pipeline_threads", "Q2_pipeline_processes")}
    lines = ["| `pipeline --preset small --device cuda` | exit, time | measured | targets |", "|---|---|---|---|"]
    for name, label in (("Q1_pipeline_threads", "threads (the default)"), ("Q2_pipeline_processes", "--workers processes")):
        lines.append(f"| {label} | {_step_cell(steps.get(name) or {})} | {_pipeline_cell(facts[name])} | "
                     "MFU >= 45 %, warm-up <= 20 s |")
    threads, processes = (facts[n].get("tokens_per_s") for n in ("Q1_pipeline_threads", "Q2_pipeline_processes"))
    if threads and processes:
        lines.append(f"| processes / threads throughput | | {processes / threads:.3f}x | >= 0.95x |")
    overhead = (steps.get("Q3_run_overhead") or {}).get("doc") or {}
    if overhead:
        lines += ["", f"`benchmarks/run_overhead.py --device cuda --preset small` "
                  f"({_step_cell(steps['Q3_run_overhead'])}): median step bare "
                  f"{overhead['bare_median_step_s'] * 1e3:.2f} ms, under run {overhead['run_median_step_s'] * 1e3:.2f} ms "
                  f"(ratio of medians {overhead['end_to_end_ratio_of_medians']:.3f}); the watchdog's share of wall time "
                  f"{overhead['watchdog_share'] * 100:.4f} %, the blame hook {overhead['blame_hook_extra_s'] * 1e9:.0f} ns a "
                  f"compiled call; target <= 1 % of a step: {'met' if overhead['target_met'] else 'MISSED'}"]
    return lines


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def speed_table(block: dict) -> List[str]:
    """S: the anchors, then speed_ratios.py's own rows (measured, floor, ratio, target) as it wrote them."""
    steps = block["steps"]
    lines = []
    anchors = (steps.get("S1_anchors") or {}).get("doc") or {}
    if anchors:
        second = anchors.get("second") or {}
        lines += [f"Anchors (a fresh interpreter each, the second of two): import torch {second.get('import_torch_s')} s, "
                  f"torch._dynamo {second.get('import_dynamo_s')} s more.", ""]
    ratios = (steps.get("S2_ratios") or {}).get("doc") or {}
    lines += ["| row | measured s | floor | floor s | ratio | target | |", "|---|---|---|---|---|---|---|"]
    for row in ratios.get("rows", []):
        ratio = f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-"
        target = f"<= {row['target']}x" if row.get("target") is not None else "-"
        lines.append(f"| {row.get('what')} | {_seconds(row.get('measured_s'))} | {row.get('floor')} | "
                     f"{_seconds(row.get('floor_s'))} | "
                     f"{ratio} | {target} | {row.get('status')}{': ' + row['error'] if row.get('error') else ''} |")
    matrix = (ratios.get("measured") or {}).get("matrix") or {}
    if matrix.get("rows"):
        lines += ["", "Matrix rows (outcome per mitigation): " + ", ".join(
            f"{name}: {outcome}" for name, outcome in matrix["rows"].items())]
    lines.append(f"\n(speed_ratios.py: {_step_cell(steps.get('S2_ratios') or {})})")
    return lines


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    env = _load(out / "env.json") or {}
    print(f"Device: {env.get('gpu')}, torch {env.get('torch')} (CUDA {env.get('cuda')}), {env.get('py_spy')}\n")
    for filename, title, render in (("issue35_B.json", "Issue 35: nn.DataParallel over a compiled model", dataparallel_table),
                                    ("issue37_C.json", "Issue 37: run and attach on the deadlock loop", attach_table),
                                    ("issue34_A.json", "Issue 34: non-lazy-backward rows on torch 2.11", repro_rows_table),
                                    ("heldout_H.json", "Held-out trainers (plain run, run, logs)", attach_table),
                                    ("issue41_S.json", "Issue 41: floors and verdict targets", speed_table),
                                    ("issue41_Q.json", "Issue 41: the pipeline and run's share of a step", pipeline_table)):
        block = _load(out / filename)
        print(f"### {title}\n")
        print("\n".join(render(block)) if block else "(not run)")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
