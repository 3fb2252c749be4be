"""The verdicts table: each ground-truth row, what the plain loop did and what `dflash-doctor repro` said, both
read from their own JSON (benchmarks/gpu/repro_h200.sh writes them).

    python benchmarks/gpu/repro_table.py OUT_DIR [--loops LOOP_DIR]

OUT_DIR holds repro_rows/<case>.json (the tool's --format json) and loop_truth/<case>.json (plain_loop.py), or
the loop results come from LOOP_DIR when they were measured in another device call.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

# (row, the loop cases' name prefix, where the tool's answer is, the truth the loop established in earlier runs)
ROWS = (
    ("no mitigation, same shapes (the defaults)", "loop-same-t", ("run", "repro-default"), "deadlock"),
    ("no mitigation, different shapes", "loop-diff-t", ("row", "none"), "deadlock"),
    ("thread-local FX shim alone, different shapes", "loop-diff-shim-t", ("row", "threadlocal-flag"), "deadlock"),
    ("non-lazy backward alone, different shapes", "loop-diff-nonlazy-t", ("row", "non-lazy-backward"), "fx-error"),
    ("first-call lock, different shapes", "loop-diff-firstlock-t", ("row", "first-call-lock"), "fx-error (rare)"),
    ("shim + non-lazy backward, different shapes", "loop-diff-shim-nonlazy-t",
     ("row", "threadlocal-flag,non-lazy-backward"), "ok"),
    ("warm-up, different shapes", "loop-diff-warmup-t", ("row", "warmup"), "ok"),
    ("global lock, different shapes", "loop-diff-globallock-t", ("row", "global-lock"), "ok"),
    ("processes", None, ("row", "processes"), "ok"),
)
KIND_WORD = {"deadlock": "deadlock", "fx-flag-leak": "fx-error", "stuck-flag": "fx-error (stuck)"}


def _load(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def loop_outcome(doc: dict) -> str:
    if doc.get("outcome") == "hung":
        waiting = any(any(f.split(":")[-1] in ("compile_fx_backward", "bw_compiler") for f in frames)
                      for frames in (doc.get("stacks") or {}).values())
        return "deadlock" if waiting else "hung"
    if doc.get("outcome") == "error":
        return "fx-error" if any(t.get("fx_error") for t in doc.get("threads", [])) else "error"
    return "ok"


def loop_cell(out: Path, prefix: Optional[str]) -> str:
    if prefix is None:
        return "(not a loop: workers are processes)"
    outcomes = []
    for path in sorted((out / "loop_truth").glob(f"{prefix}*.json")):
        doc = _load(path)
        outcomes.append(loop_outcome(doc) if doc else "no result")
    if not outcomes:
        return "not run"
    counts = {o: outcomes.count(o) for o in dict.fromkeys(outcomes)}
    return ", ".join(f"{o} {n}/{len(outcomes)}" for o, n in counts.items())


def _cells(stresses: dict) -> str:
    parts = []
    for stress, entry in stresses.items():
        if entry.get("skipped") or not entry.get("ran"):
            continue
        kinds = " ".join(KIND_WORD.get(k, k) for k in entry.get("kinds") or {})
        parts.append(f"{stress} {entry['reproduced']}/{entry['ran']}{' ' + kinds if kinds else ''}")
    return ", ".join(parts)


def tool_cell(out: Path, where) -> tuple:
    """(the tool's answer in words, its failure kind or 'ok', seconds to verdict)."""
    how, name = where
    doc = _load(out / "repro_rows" / (f"{name}.json" if how == "run" else "repro-matrix.json"))
    if doc is None:
        return "no result", None, None
    facts = doc.get("facts") or {}
    if how == "run":
        kind = facts.get("kind")
        text = (f"{facts.get('verdict')}{' ' + KIND_WORD.get(kind, kind) if kind else ''}"
                f" ({_cells(facts.get('levels') or {})})")
        return text, KIND_WORD.get(kind, "ok") if kind else "ok", facts.get("time_to_verdict_s")
    row = next((r for r in facts.get("matrix") or [] if r.get("mitigation") == name), None)
    if row is None:
        return "no matrix row", None, None
    kind = row.get("kind")
    first = (facts.get("time_to_verdict_s") if name == "none" else None)
    return (f"{row.get('outcome')} ({_cells(row.get('stresses') or {})})", KIND_WORD.get(kind, "ok") if kind else "ok",
            first)


def matches(truth: str, tool_kind: Optional[str]) -> str:
    if tool_kind is None:
        return "no"
    return "yes" if truth.split(" ")[0] == tool_kind.split(" ")[0] else "NO"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0])
    loops = Path(args[args.index("--loops") + 1]) if "--loops" in args else out
    lines = ["| row | the plain loop (this run) | known truth | `dflash-doctor repro` (its JSON) | match | first verdict |",
             "|---|---|---|---|---|---|"]
    for title, prefix, where, truth in ROWS:
        tool, kind, ttv = tool_cell(out, where)
        lines.append(f"| {title} | {loop_cell(loops, prefix)} | {truth} | {tool} | {matches(truth, kind)} | "
                     f"{'%.1f s' % ttv if ttv is not None else '-'} |")
    matrix = _load(out / "repro_rows" / "repro-matrix.json")
    if matrix:
        lines.append(f"\nmatrix wall time: {(matrix.get('facts') or {}).get('wall_s')} s")
    cases = _load(out / "repro_rows" / "cases.json") or []
    for case in cases:
        lines.append(f"- `{case['command']}`: exit {case['rc']}, {case['wall_s']} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
