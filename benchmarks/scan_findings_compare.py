"""A canonical dump of what `scan` reports on the code this repository holds, to compare before and after a change
that must not change a finding (a refactoring of scan/engine.py or scan/graph.py, say).

    python benchmarks/scan_findings_compare.py --out /tmp/before.jsonl      # on the commit before
    python benchmarks/scan_findings_compare.py --check /tmp/before.jsonl    # after: exit 1 and the first difference
    ... [--torch]          # also the installed torch's own sources (cross-file call chains at scale; slower)
    ... [--sources DIR]    # scan DIR's copy of the repository instead of this checkout's files

Every scan is the CLI of this checkout (`python -P -m dflash_doctor scan -f json ...`, this checkout first on the
path), run from the root of the scanned copy: fixtures/scan as a folder, each of its subfolders, each of its .py
files named alone (a named file is a program: its imports are followed, a syntax error is a problem), fixtures/,
benchmarks/scan_corpus, dflash_doctor/ and tests/ (in-process and on a process pool: `-j 1` and `-j 2`), and a few
option variants (--select, --ignore, --no-config, --baseline). One JSON line per scan: the report with the run's
timing (facts.seconds) removed, its exit code and stderr, the scanned copy's path written <sources>, keys in the
report's order, so equal behaviour gives equal bytes.

A change to the scanner changes dflash_doctor/ itself, which is scanned: the pool's byte-balanced shares (and so
facts.loaded_for_call_chains) and the lines of findings in changed files move with it. To compare the scanner alone,
scan one frozen copy both times, each time with the scanner of the commit being compared:

    git archive BASE | tar -x -C /tmp/sources          # the files scanned, both times
    git archive BASE | tar -x -C /tmp/base             # the scanner before (copy this script into it if BASE lacks it)
    python /tmp/base/benchmarks/scan_findings_compare.py --sources /tmp/sources --out /tmp/before.jsonl
    python benchmarks/scan_findings_compare.py --sources /tmp/sources --check /tmp/before.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # findings_dump.py, beside this script
FIXTURES = "fixtures/scan"
TIMING = ("seconds",)  # facts that measure the run, not what it found


def scans(sources: Path, torch: bool, baseline: str) -> Iterator[Tuple[str, List[str]]]:
    """(a unique name, the scan's arguments after `scan -f json`) of every scan named in the docstring."""
    root = sources / FIXTURES
    yield FIXTURES, [FIXTURES]
    for path in sorted(root.iterdir()):
        if path.is_dir():
            yield f"{FIXTURES}/{path.name}/", [f"{FIXTURES}/{path.name}"]
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(sources).as_posix()
        yield relative, [relative]
    for folder in ("fixtures", "benchmarks/scan_corpus", "dflash_doctor", "tests"):
        for jobs in ("1", "2"):
            yield f"{folder} -j {jobs}", [folder, "-j", jobs]
    yield f"{FIXTURES} --select DFD2", [FIXTURES, "--select", "DFD2"]
    yield f"{FIXTURES} --ignore DFD201,DFD302", [FIXTURES, "--ignore", "DFD201,DFD302"]
    yield f"{FIXTURES} --no-config", [FIXTURES, "--no-config"]
    yield f"{FIXTURES} --baseline (of {FIXTURES}/drafter)", [FIXTURES, "--baseline", baseline]
    if torch:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            raise SystemExit("--torch: torch is not installed")
        yield "torch", [os.path.dirname(spec.origin)]


def python(sources: Path, args: List[str]) -> "subprocess.CompletedProcess[str]":
    """This checkout's package, run in `sources`: -P keeps the scanned copy's own dflash_doctor/ (the current folder)
    off the path, PYTHONPATH puts this checkout's before the installed one."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-P", *args], cwd=sources, env=env, capture_output=True, text=True,
                          timeout=900)


def check_scanner(sources: Path) -> None:
    where = python(sources, ["-c", "import dflash_doctor; print(dflash_doctor.__file__)"]).stdout.strip()
    if not where.startswith(str(REPO) + os.sep):
        raise SystemExit(f"the scanner would be {where!r}, not this checkout's ({REPO})")


def run(sources: Path, args: List[str]) -> Tuple[int, str, str]:
    done = python(sources, ["-m", "dflash_doctor", "scan", "-f", "json", *args])
    return done.returncode, done.stdout, done.stderr


def canonical(sources: Path, name: str, args: List[str]) -> str:
    code, stdout, stderr = run(sources, args)
    try:
        report = json.loads(stdout)
    except ValueError:
        report = {"unparsed stdout": stdout}
    for key in TIMING:
        report.get("facts", {}).pop(key, None)
    # keys in the report's own order: a change of that order is a change of the output
    line = json.dumps({"name": name, "exit": code, "report": report, "stderr": stderr}, ensure_ascii=True)
    return line.replace(json.dumps(str(sources))[1:-1], "<sources>")


def dump(sources: Path, torch: bool) -> Iterator[str]:
    check_scanner(sources)
    with tempfile.TemporaryDirectory() as folder:
        baseline = os.path.join(folder, "baseline.json")
        # the baseline is the drafter package's own report: its findings are matched, the others are new
        _, stdout, _ = run(sources, [f"{FIXTURES}/drafter"])
        Path(baseline).write_text(stdout, encoding="utf-8")
        for name, args in scans(sources, torch, baseline):
            # the temporary file's name is in facts.baseline.file: a fixed stand-in keeps two dumps comparable
            yield canonical(sources, name, args).replace(baseline, "<baseline>")


def main() -> int:
    from findings_dump import write_or_check

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the dump here")
    group.add_argument("--check", type=Path, help="compare with a dump written earlier")
    parser.add_argument("--torch", action="store_true", help="also scan the installed torch's sources")
    parser.add_argument("--sources", type=Path, default=REPO,
                        help="a copy of the repository to scan (default: this checkout)")
    args = parser.parse_args()
    return write_or_check(list(dump(args.sources.resolve(), args.torch)), args.out, args.check, "scans")


if __name__ == "__main__":
    raise SystemExit(main())
