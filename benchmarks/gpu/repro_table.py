"""Summarise benchmarks/gpu/repro_h200.sh: one row per run, expected vs got, time to verdict, the hang chain.

    python benchmarks/gpu/repro_table.py RUNS.txt OUT_DIR

RUNS.txt has one `name|expected|exit code|wall seconds|arguments` line per run; OUT_DIR holds `name.json`.
A run whose JSON is missing or unreadable (killed by its cap, crashed) gets a row saying so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def row_for(line: str, out_dir: Path) -> dict:
    name, expected, rc, wall, arguments = line.rstrip("\n").split("|", 4)
    row = {"name": name, "expected": expected, "rc": int(rc), "wall_s": float(wall or 0), "arguments": arguments,
           "got": "no report", "time_to_verdict_s": None, "detail": ""}
    try:
        doc = json.loads((out_dir / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        row["detail"] = f"no JSON report ({exc.__class__.__name__}); exit {rc}"
        return row
    facts = doc.get("facts") or {}
    verdict, kind = facts.get("verdict"), facts.get("kind")
    row["got"] = f"{verdict}/{kind}" if kind else str(verdict)
    row["time_to_verdict_s"] = facts.get("time_to_verdict_s")
    multi = facts.get("multi_thread") or {}
    hang = facts.get("hang") or {}
    if hang:
        row["detail"] = f"{hang.get('cycle')}: " + " | ".join(hang.get("chain") or [])
    elif facts.get("blame"):
        row["detail"] = "; ".join(f"{b['victim']} <- {b.get('holder')}" for b in facts["blame"])
    else:
        errors = [t.get("error") for t in multi.get("threads", []) if t.get("error")]
        row["detail"] = errors[0][:160] if errors else f"multi-thread {multi.get('outcome')}"
    if doc.get("problems"):
        row["detail"] += " · problems: " + "; ".join(p["reason"][:120] for p in doc["problems"])
    row["torch"] = facts.get("torch_version")
    return row


def render(rows) -> str:
    lines = ["| run | expected | got | match | time to verdict (s) | wall (s) | exit | detail |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        match = "yes" if row["got"] == row["expected"] else "NO"
        ttv = f"{row['time_to_verdict_s']:.1f}" if row["time_to_verdict_s"] is not None else "-"
        lines.append(f"| {row['name']} | {row['expected']} | {row['got']} | {match} | {ttv} | {row['wall_s']:.1f} | "
                     f"{row['rc']} | {row['detail']} |")
    torch_versions = sorted({r.get("torch") for r in rows if r.get("torch")})
    lines.append("")
    lines.append(f"torch: {', '.join(torch_versions) or 'unknown'}; arguments per run:")
    lines.extend(f"- {r['name']}: {r['arguments'] or '(none)'}" for r in rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    runs, out_dir = Path(argv[0]), Path(argv[1])
    rows = [row_for(line, out_dir) for line in runs.read_text(encoding="utf-8").splitlines() if line.strip()]
    sys.stdout.write(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
