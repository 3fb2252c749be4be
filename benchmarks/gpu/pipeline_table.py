"""Summarise pipeline_small.sh's JSON reports: a markdown table on stdout, every run's facts in results.json."""
from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = ("small-threads", "small-processes", "seeds-threads")


def _fmt(value, pattern="{:.1f}", missing="-"):
    return missing if value is None else pattern.format(value)


def row(name: str, facts: dict, exit_code) -> str:
    workers = facts.get("workers", [])
    health = ", ".join(f"{w['name']}:{w['outcome']}" for w in workers if w["outcome"] != "ok") or "all ok"
    return " | ".join([
        name, str(exit_code), str(facts.get("steps")),
        _fmt(facts.get("tokens_per_s"), "{:,.0f}"),
        _fmt(facts.get("mfu"), "{:.1%}") if facts.get("mfu") is not None else "-",
        _fmt(facts.get("flops_per_token"), "{:.2e}"),
        f"{_fmt(facts.get('loss_first'), '{:.3f}')} -> {_fmt(facts.get('loss_last'), '{:.3f}')}",
        _fmt(facts.get("warmup_s")), _fmt(facts.get("wall_s")), str(facts.get("transport")), health,
    ])


def main(out: Path) -> int:
    print("| run | exit | steps | tok/s | MFU | FLOP/token | loss first -> last | warm-up s | wall s | transport "
          "| workers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for name in RUNS:
        path = out / f"{name}.json"
        if not path.is_file():
            print(f"| {name} | no report (timed out or skipped; see {name}.log) |" + " |" * 9)
            continue
        doc = json.loads(path.read_text())
        results[name] = doc
        print(f"| {row(name, doc['facts'], doc['exit_code'])} |")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
