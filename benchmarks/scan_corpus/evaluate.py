"""Precision and recall of `dflash-doctor scan` on the corpus (corpus.json), against the labels judged by hand.

    python benchmarks/scan_corpus/download.py [--git-mirror DIR]     # once: brings the pinned code into src/
    python benchmarks/scan_corpus/evaluate.py [--src DIR] [--split NAME] [--write benchmarks/scan_corpus/results.md]

Each entry is scanned on its own, from its root, with no configuration and with the transformers release unknown
(so DFD104 is judged the same on every machine). Warnings and errors count; info findings do not. labels/NAME.json
holds, for every warning or error the scan ever reported there, `tp` or `fp` with the reason, plus the hazards it
missed (`missed`) and what was judged out of scope. A finding with no label stops the evaluation: it must be
judged first (with --json the per-entry results, every reported key included, are written before it stops). A `tp`
label the scan no longer reports counts as a miss. --split NAME judges only that split's entries (only they need to be
downloaded).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from dflash_doctor.findings import Severity  # noqa: E402 - the repository root is put on the path first
from dflash_doctor.scan import scan_paths  # noqa: E402
from dflash_doctor.scan.config import ScanConfig  # noqa: E402


def reported(root: Path) -> tuple:
    cwd = os.getcwd()
    os.chdir(root)
    try:
        started = time.perf_counter()
        report = scan_paths(["."], config=ScanConfig(), transformers=lambda: None)
        seconds = time.perf_counter() - started
    finally:
        os.chdir(cwd)
    keys = {f"{os.path.normpath(f.path)}:{f.line}:{f.code}" for f in report.findings
            if f.severity is not Severity.INFO and f.path}
    return keys, report, seconds


def chosen_entries(split=None) -> list:
    corpus = json.loads((HERE / "corpus.json").read_text())["entries"]
    return [e for e in corpus if split is None or e["split"] == split]


def evaluate(src: Path, split=None) -> dict:
    corpus = chosen_entries(split)
    rows, unjudged = [], []
    for entry in corpus:
        labels = json.loads((HERE / "labels" / f"{entry['name']}.json").read_text())
        keys, report, seconds = reported(src / entry["name"])
        judged = labels["judged"]
        tps = {k for k, v in judged.items() if v["verdict"] == "tp"}
        fps = {k for k, v in judged.items() if v["verdict"] == "fp"}
        unjudged += [f"{entry['name']}: {k}" for k in sorted(keys - tps - fps)]
        expected = tps | set(labels["missed"])
        rows.append({
            "name": entry["name"], "split": entry["split"], "files": report.facts["files"],
            "seconds": round(seconds, 2), "tp": sorted(keys & expected), "fp": sorted(keys & fps),
            "missed": sorted(expected - keys), "problems": len(report.problems),
            "why": {k: v["why"] for k, v in judged.items()} | labels["missed"],
            "info": sum(1 for f in report.findings if f.severity is Severity.INFO),
            "reported": sorted(keys),
            "info_keys": sorted(f"{os.path.normpath(f.path)}:{f.line}:{f.code}" for f in report.findings
                                if f.severity is Severity.INFO and f.path),
        })
    return {"rows": rows, "unjudged": unjudged}


def totals(rows: list) -> dict:
    tp = sum(len(r["tp"]) for r in rows)
    fp = sum(len(r["fp"]) for r in rows)
    fn = sum(len(r["missed"]) for r in rows)
    return {"tp": tp, "fp": fp, "fn": fn, "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0, "files": sum(r["files"] for r in rows)}


def render(result: dict) -> str:
    rows = result["rows"]
    lines = ["| entry | split | files | s | TP | FP | missed | info | problems |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['split']} | {r['files']} | {r['seconds']:.2f} | {len(r['tp'])} | "
                     f"{len(r['fp'])} | {len(r['missed'])} | {r['info']} | {r['problems']} |")
    lines += ["", "| split | files | TP | FP | missed | precision | recall |", "|---|---:|---:|---:|---:|---:|---:|"]
    splits = list(dict.fromkeys(r["split"] for r in rows))
    for split in splits + ["all"]:
        chosen = [r for r in rows if split == "all" or r["split"] == split]
        t = totals(chosen)
        lines.append(f"| {split} | {t['files']} | {t['tp']} | {t['fp']} | {t['fn']} | {t['precision']:.3f} | "
                     f"{t['recall']:.3f} |")
    lines += ["", "False alarms (warnings and errors judged wrong):", ""]
    lines += [f"- {r['name']} `{k}`: {r['why'][k]}" for r in rows for k in r["fp"]] or ["- none"]
    lines += ["", "Misses (hazards judged real that the scan does not report as a warning or error):", ""]
    lines += [f"- {r['name']} `{k}`: {r['why'][k]}" for r in rows for k in r["missed"]] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=HERE / "src")
    parser.add_argument("--write", type=Path, default=None, help="also write the tables to this file")
    parser.add_argument("--json", type=Path, default=None, help="also write the per-entry results as JSON")
    parser.add_argument("--split", default=None, help="judge only the entries of this split")
    args = parser.parse_args(argv)
    missing = [e["name"] for e in chosen_entries(args.split) if not (args.src / e["name"]).is_dir()]
    if missing:
        sys.stderr.write(f"not downloaded: {', '.join(missing)}; run benchmarks/scan_corpus/download.py first\n")
        return 2
    result = evaluate(args.src, args.split)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if result["unjudged"]:
        sys.stderr.write("findings without a label (judge them in labels/NAME.json):\n" +
                         "".join(f"  {k}\n" for k in result["unjudged"]))
        return 1
    table = render(result)
    sys.stdout.write(table)
    if args.write:
        args.write.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
