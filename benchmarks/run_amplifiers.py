"""How much each `run --amplify` (and `--cache cold`) raises the rate at which a race shows in an unmodified run,
and what `run --fix` against its baseline says, on trainers given on the command line.

    python benchmarks/run_amplifiers.py --trials 4 \\
        --trainer eager=tests/run/programs/eager_workers.py \\
        --trainer inspect=/path/to/inspect_trainer.py --write

For every trainer and every setting (none, switch-interval, foreign-trace, cache cold) it runs
`dflash-doctor run --trials K [setting] -f json -- python TRAINER` and counts, per race (the hazard each finding
shows, supervise/proof.py hazards_in), the trials in which it showed. `--proof NAME=FIXES[@AMPLIFIERS]` adds a
`run --fix FIXES [--amplify AMPLIFIERS]` on that trainer (baseline and fix arms interleaved) and records its
verdicts. `--write` rewrites benchmarks/results/run_amplifiers.md with the table, the commands and the machine.
Trainers that are not in this repository are named by their file name only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "run_amplifiers.md"
SETTINGS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("none", ()),
    ("switch-interval", ("--amplify", "switch-interval")),
    ("foreign-trace", ("--amplify", "foreign-trace")),
    ("foreign-trace + switch-interval", ("--amplify", "foreign-trace,switch-interval")),
    ("cache cold", ("--cache", "cold")),
)


def _doctor(args: Sequence[str], timeout: float) -> Tuple[dict, float]:
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.json"
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "dflash_doctor", "run", *args[:args.index("--")], "-f", "json",
                        "-o", str(out), *args[args.index("--"):]], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=REPO)
        took = time.monotonic() - started
        return json.loads(out.read_text()), took


def _shown_per_trial(doc: dict) -> Dict[str, int]:
    """Race -> trials in which it showed (findings are per trial; a single trial's carry no trial number)."""
    from dflash_doctor.findings import Finding, Severity
    from dflash_doctor.supervise.proof import hazards_in

    by_trial: Dict[int, List[Finding]] = {}
    for f in doc["findings"]:
        finding = Finding(f["code"], f["name"], Severity(f["severity"]), f["message"], evidence=f["evidence"])
        by_trial.setdefault(int(f["evidence"].get("trial", 1)), []).append(finding)
    counts: Dict[str, int] = {}
    for findings in by_trial.values():
        for hazard in hazards_in(findings):
            counts[hazard] = counts.get(hazard, 0) + 1
    return counts


def _label(path: str) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else resolved.name


def measure(trainers: Dict[str, str], trials: int, timeout: float) -> List[dict]:
    rows = []
    for name, path in trainers.items():
        for setting, args in SETTINGS:
            doc, took = _doctor(["--trials", str(trials), *args, "--", sys.executable, path], timeout)
            rows.append({"trainer": name, "file": _label(path), "setting": setting, "trials": trials,
                         "shown": _shown_per_trial(doc), "seconds": round(took, 1),
                         "command": f"dflash-doctor run --trials {trials} {' '.join(args)} -- python "
                                    f"{_label(path)}".replace("  ", " ")})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def prove(trainers: Dict[str, str], proofs: Sequence[str], trials: int, timeout: float) -> List[dict]:
    rows = []
    for spec in proofs:
        name, rest = spec.split("=", 1)
        fixes, _, amplify = rest.partition("@")
        args = ["--fix", fixes, "--trials", str(trials)] + (["--amplify", amplify] if amplify else [])
        doc, took = _doctor([*args, "--", sys.executable, trainers[name]], timeout)
        proof = doc["facts"]["proof"]
        rows.append({"trainer": name, "fixes": fixes, "amplify": amplify or "none", "verdict": proof["verdict"],
                     "hazards": [(r["hazard"], r["baseline"], r["baseline_trials"], r["fix"], r["fix_trials"],
                                  r["verdict"]) for r in proof["hazards"]],
                     "seconds": round(took, 1),
                     "command": f"dflash-doctor run {' '.join(args)} -- python {_label(trainers[name])}"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: List[dict], proofs: List[dict], trials: int) -> str:
    import torch  # noqa: F401 - only for its version in the header

    lines = [
        "# `run --amplify`: how much each amplifier raises the rate of a race in an unmodified run",
        "",
        f"Measured {dt.date.today().isoformat()} on {platform.machine()}, {os.cpu_count()} cores (shared with "
        f"other work: rates under load), Python {platform.python_version()}, torch {sys.modules['torch'].__version__}. "
        "Each cell: trials in which the race showed / trials run. Command: "
        f"`python benchmarks/run_amplifiers.py --trials {trials} --trainer NAME=PATH ... --write`.",
        "",
        "| trainer | setting | races shown (trials) | wall s | command |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        shown = ", ".join(f"{hazard} {count}/{row['trials']}" for hazard, count in sorted(row["shown"].items()))
        shown = shown or f"none 0/{row['trials']}"
        lines.append(f"| {row['trainer']} (`{row['file']}`) | {row['setting']} | {shown} "
                     f"| {row['seconds']} | `{row['command']}` |")
    if proofs:
        lines += ["", "## `run --fix` against its baseline on the same trainers", "",
                  "| trainer | --fix | --amplify | per race: baseline -> with the fix, verdict | overall | wall s |",
                  "|---|---|---|---|---|---|"]
        for p in proofs:
            races = "; ".join(f"{h} {b}/{bt} -> {f}/{ft} {v}" for h, b, bt, f, ft, v in p["hazards"])
            lines.append(f"| {p['trainer']} | {p['fixes']} | {p['amplify']} | {races} | {p['verdict']} | "
                         f"{p['seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", action="append", default=[], help="NAME=PATH (repeat)")
    parser.add_argument("--proof", action="append", default=[], help="NAME=FIXES[@AMPLIFIERS] (repeat)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--proof-trials", type=int, default=3)
    parser.add_argument("--skip-rates", action="store_true", help="only the --proof runs")
    parser.add_argument("--timeout", type=float, default=1200.0, help="per dflash-doctor run")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    trainers = dict(item.split("=", 1) for item in args.trainer)
    rows = [] if args.skip_rates else measure(trainers, args.trials, args.timeout)
    proofs = prove(trainers, args.proof, args.proof_trials, args.timeout)
    text = table(rows, proofs, args.trials)
    print(text)
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
