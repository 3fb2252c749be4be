"""How fast is `dflash-doctor scan` on the installed torch's own sources, next to the tools a user would try?

One command, every tool measured in the same run (so machine load hits all of them alike):

    python benchmarks/scan_bench.py [--semgrep PATH] [--torchfix PATH] [--torchfix-timeout S] [--rounds N]
                                    [--write FILE]

Anchors: `grep -rn -e checkpoint -e reentrant` (what the seeds' engineer ran), one-process `ast.parse` of every
file (the floor for a naive AST scanner), semgrep with one rule (checkpoint(...) without use_reentrant) and
TorchFix TOR003. Targets (issue 14): dflash-doctor (all rules) >= 8x faster than semgrep running one rule, and
<= 0.25x the ast.parse floor. A second table shows scan time is linear in the size of one file (issue 16: a 3.9 MB
file with 20k calls once took 180 s): generated files of 5k to 40k calls, time per 1k calls. `measure(torch_root)`
is importable for benchmarks/run.py.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional

SEMGREP_RULE = """\
rules:
  - id: checkpoint-without-use-reentrant
    languages: [python]
    severity: WARNING
    message: checkpoint without use_reentrant
    patterns:
      - pattern-either:
          - pattern: torch.utils.checkpoint.checkpoint(...)
          - pattern: torch.utils.checkpoint.checkpoint_sequential(...)
      - pattern-not: torch.utils.checkpoint.checkpoint(..., use_reentrant=$X, ...)
      - pattern-not: torch.utils.checkpoint.checkpoint_sequential(..., use_reentrant=$X, ...)
"""

SEMGREP_TARGET = 8  # at least this many times faster than semgrep with one rule
FLOOR_TARGET = 0.25  # at most this fraction of one process ast.parse-ing every file
LINEAR_SIZES = (5_000, 10_000, 20_000, 40_000)
# --write keeps what follows this heading in the file it rewrites: the profile written by hand (what the time went to,
# measured how, and the change it motivated) stays beside the figures it explains
PROFILE_HEADING = "## Where the time goes"

FLOOR_SCRIPT = """\
import ast, pathlib, sys
count = 0
for path in pathlib.Path(sys.argv[1]).rglob("*.py"):
    try:
        ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        pass
    count += 1
print(count)
"""


def torch_root() -> Path:
    """The installed torch package folder, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed in this interpreter; the benchmark scans its sources")
    return Path(list(spec.submodule_search_locations)[0])


def _timed(command: List[str], timeout: float, clock: Callable[[], float] = time.perf_counter) -> dict:
    started = clock()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": clock() - started, "rc": None, "stdout": "", "stderr": f"timed out after {timeout:.0f} s"}
    except OSError as exc:
        return {"seconds": None, "rc": None, "stdout": "", "stderr": str(exc)}
    return {"seconds": clock() - started, "rc": run.returncode, "stdout": run.stdout, "stderr": run.stderr}


def _dflash_doctor(root: Path, out: Path, select: Optional[str] = None) -> dict:
    command = [sys.executable, "-m", "dflash_doctor", "scan", str(root), "--no-config", "--format", "json", "-o",
               str(out)]
    title = "dflash-doctor scan (CLI, JSON, all rules)"
    if select:
        command += ["--select", select]
        title = f"dflash-doctor scan --select {select} (the checkpoint-call rules semgrep is compared with)"
    run = _timed(command, 600)
    row = {"tool": title, "seconds": run["seconds"], "found": None, "note": ""}
    if out.exists():
        document = json.loads(out.read_text())
        row["found"] = len(document["findings"])
        row["findings"] = [
            f"{os.path.relpath(f['path'], root.parent)}:{f['line']} {f['code']}" for f in document["findings"]
        ]
        facts = document["facts"]
        row["note"] = (
            f"{facts['files']} files, {facts['parsed']} parsed, {facts['loaded_for_call_chains']} loaded for call "
            f"chains, {facts['jobs']} jobs; " + ", ".join(f"{c}: {n}" for c, n in facts["rule_counts"].items() if n)
        )
    else:
        row["note"] = f"failed: {run['stderr'].strip()[-300:]}"
    return row


def _grep(root: Path) -> dict:
    run = _timed(["grep", "-rn", "-e", "checkpoint", "-e", "reentrant", str(root)], 120)
    return {"tool": "grep -rn -e checkpoint -e reentrant", "seconds": run["seconds"],
            "found": len(run["stdout"].splitlines()), "note": "lines, almost all weight checkpointing and prose"}


def _floor(root: Path) -> dict:
    run = _timed([sys.executable, "-c", FLOOR_SCRIPT, str(root)], 600)
    return {"tool": "ast.parse of every file, one process", "seconds": run["seconds"],
            "found": None, "note": f"{run['stdout'].strip()} files parsed (the floor for a naive AST scanner)"}


def _semgrep(root: Path, semgrep: Optional[str], workdir: Path, timeout: float) -> dict:
    row = {"tool": "semgrep, one rule (checkpoint without use_reentrant)", "seconds": None, "found": None}
    if not semgrep:
        row["note"] = "not installed (pip install semgrep, ideally in its own venv): not measured"
        return row
    rule = workdir / "rule.yaml"
    rule.write_text(SEMGREP_RULE)
    run = _timed([semgrep, "scan", "--config", str(rule), "--json", "--metrics=off", "--disable-version-check",
                  "--no-git-ignore", "--jobs", str(os.cpu_count() or 1), str(root)], timeout)
    if run["rc"] is None or not run["stdout"].strip():
        row["note"] = f"could not run: {run['stderr'].strip()[-300:]}"
        return row
    results = json.loads(run["stdout"]).get("results", [])
    row.update(seconds=run["seconds"], found=len(results), note="; ".join(
        sorted({f"{os.path.relpath(r['path'], root.parent)}:{r['start']['line']}" for r in results})))
    return row


def _torchfix(root: Path, torchfix: Optional[str], timeout: float) -> dict:
    row = {"tool": "TorchFix --select TOR003", "seconds": None, "found": None}
    if not torchfix:
        row["note"] = "not installed (pip install torchfix): not measured"
        return row
    run = _timed([torchfix, "--select", "TOR003", str(root)], timeout)
    if run["rc"] is None:
        row["note"] = run["stderr"]
        return row
    hits = [line for line in (run["stdout"] + run["stderr"]).splitlines() if "TOR003" in line]
    row.update(seconds=run["seconds"], found=len(hits), note="; ".join(
        os.path.relpath(h.split(":")[0], root.parent) + ":" + h.split(":")[1] for h in hits))
    return row


def measure(root: Optional[Path] = None, *, semgrep: Optional[str] = None, torchfix: Optional[str] = None,
            torchfix_timeout: float = 600, semgrep_timeout: float = 600, rounds: int = 1) -> List[dict]:
    """Wall time of each tool on `root` (default: the installed torch). With `rounds` > 1 the tools run in turn,
    round after round (so a burst of load on a shared machine hits them alike), and each row keeps the median and
    every round's time; TorchFix, minutes long, runs once."""
    root = Path(root or torch_root())
    with tempfile.TemporaryDirectory(prefix="scan-bench-") as tmp:
        workdir = Path(tmp)
        runs: List[List[dict]] = []
        for _ in range(max(1, rounds)):
            runs.append([
                _dflash_doctor(root, workdir / "scan.json"),
                _dflash_doctor(root, workdir / "scan-checkpoint.json", select="DFD101,DFD102,DFD103"),
                _grep(root),
                _floor(root),
                _semgrep(root, semgrep, workdir, semgrep_timeout),
            ])
        rows = [_median_row([run[i] for run in runs]) for i in range(len(runs[0]))]
        rows.append(_torchfix(root, torchfix, torchfix_timeout))
    ours = rows[0]["seconds"]
    for row in rows:
        row["ratio"] = (ours / row["seconds"]) if ours and row["seconds"] else None
    return rows


def _median_row(samples: List[dict]) -> dict:
    times = sorted(s["seconds"] for s in samples if s["seconds"] is not None)
    row = dict(samples[-1])
    row["seconds"] = times[len(times) // 2] if times else None
    if len(samples) > 1:
        row["rounds"] = [round(s["seconds"], 2) if s["seconds"] is not None else None for s in samples]
    return row


def targets(rows: List[dict]) -> List[str]:
    """The issue's two targets, for the full scan and for the one-rule scan semgrep is compared with."""
    by_tool = {row["tool"].split(" ")[0]: row for row in rows[2:]}
    floor = by_tool["ast.parse"]["seconds"]
    semgrep = by_tool["semgrep,"]["seconds"]
    verdicts = []
    for row in rows[:2]:
        ours = row["seconds"]
        if not ours:
            verdicts.append(f"{row['tool']}: did not run")
            continue
        verdicts.append(f"{row['tool']}: {ours / floor:.2f}x the ast.parse floor (target <= {FLOOR_TARGET}x: "
                        f"{'met' if ours <= FLOOR_TARGET * floor else 'MISSED'})")
        if semgrep:
            verdicts.append(f"{row['tool']}: {semgrep / ours:.1f}x faster than semgrep (target >= {SEMGREP_TARGET}x: "
                            f"{'met' if semgrep >= SEMGREP_TARGET * ours else 'MISSED'})")
    return verdicts


def _generated_source(calls: int) -> str:
    """A trainer-like file of `calls` checkpoint calls bound to fresh names, threads reaching a compiled step and a
    long function: the shapes that once made the scan quadratic (names bound on candidate lines, one noqa test per
    finding, linear binding searches)."""
    head = ("import threading\nimport torch\nfrom torch.utils.checkpoint import checkpoint\n"
            "step = torch.compile(lambda x: x)\n\ndef worker(x):\n")
    body = "".join(f"    y{i} = checkpoint(f{i % 50}, x, use_reentrant=False)\n" for i in range(calls // 2))
    tail = "".join(f"h{i} = checkpoint(g, h, use_reentrant=False)\n" for i in range(calls // 2))
    return head + body + "    return step(x)\n\n" + tail + "threading.Thread(target=worker, args=(1,)).start()\n"


def linear(workdir: Path, sizes=LINEAR_SIZES) -> List[dict]:
    """One-file CLI scans of generated files: flat seconds per 1k calls means linear time."""
    rows = []
    for calls in sizes:
        path = workdir / f"calls_{calls}.py"
        path.write_text(_generated_source(calls))
        run = _timed([sys.executable, "-m", "dflash_doctor", "scan", str(path), "--no-config", "--format", "json",
                      "-o", str(workdir / f"calls_{calls}.json")], 600)
        rows.append({"calls": calls, "bytes": path.stat().st_size, "seconds": run["seconds"], "rc": run["rc"]})
    return rows


def render_linear(rows: List[dict]) -> str:
    lines = ["| calls | file size | wall (s) | s per 1k calls |", "|---:|---:|---:|---:|"]
    for row in rows:
        per = row["seconds"] / (row["calls"] / 1000) if row["seconds"] else None
        lines.append(f"| {row['calls']:,} | {row['bytes'] / 1e6:.2f} MB | {row['seconds']:.2f} | "
                     f"{per:.3f} |" if per is not None else f"| {row['calls']:,} | - | - | - |")
    return "\n".join(lines) + "\n"


def render(rows: List[dict], root: Path) -> str:
    lines = [
        f"torch sources: `{root}` ({sum(1 for _ in root.rglob('*.py'))} .py files); "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores",
        "",
        "| tool | wall (s), median | each round (s) | dflash-doctor / tool | found | notes |",
        "|---|---:|---|---:|---:|---|",
    ]
    for row in rows:
        seconds = f"{row['seconds']:.2f}" if row["seconds"] is not None else "-"
        ratio = f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-"
        found = "-" if row["found"] is None else str(row["found"])
        each = ", ".join("-" if r is None else f"{r:.2f}" for r in row.get("rounds", [])) or "-"
        lines.append(f"| {row['tool']} | {seconds} | {each} | {ratio} | {found} | {row.get('note', '')} |")
    lines += ["", "Targets:", ""] + [f"- {v}" for v in targets(rows)] + ["", "dflash-doctor findings (all rules):", ""]
    lines += [f"- `{f}`" for f in rows[0].get("findings", [])] or ["- (none)"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-root", type=Path, default=None, help="default: the installed torch package")
    parser.add_argument("--semgrep", default=shutil.which("semgrep"), help="semgrep executable")
    parser.add_argument("--torchfix", default=shutil.which("torchfix"), help="torchfix executable")
    parser.add_argument("--torchfix-timeout", type=float, default=600)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--write", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    root = args.torch_root or torch_root()
    rows = measure(root, semgrep=args.semgrep, torchfix=args.torchfix, torchfix_timeout=args.torchfix_timeout,
                   rounds=args.rounds)
    table = render(rows, root)
    with tempfile.TemporaryDirectory(prefix="scan-linear-") as tmp:
        table += "\nOne file, growing (CLI, JSON; start-up included):\n\n" + render_linear(linear(Path(tmp)))
    sys.stdout.write(table)
    if args.write:
        args.write.write_text(table + kept_profile(args.write))
    return 0


def kept_profile(path: Path) -> str:
    """The hand-written profile section of an earlier results file (from PROFILE_HEADING on), or ""."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    at = text.find("\n" + PROFILE_HEADING)
    return text[at:] if at != -1 else ""


if __name__ == "__main__":
    sys.exit(main())
