"""A canonical dump of what `scan` reports on the code this repository holds, to compare before and after a change
that must not change a finding (a refactoring of scan/engine.py or scan/graph.py, say).

    python benchmarks/scan_findings_compare.py --out /tmp/before.jsonl      # on the commit before
    python benchmarks/scan_findings_compare.py --check /tmp/before.jsonl    # after: exit 1 and the first difference
    ... [--torch]   # also the installed torch's own sources (cross-file call chains at scale; slower)

Every scan is the CLI itself (`python -m dflash_doctor scan -f json ...`, this checkout's package first on the
path), run from the repository root: fixtures/scan as a folder, each of its subfolders, each of its .py files
named alone (a named file is a program: its imports are followed, a syntax error is a problem), fixtures/,
benchmarks/scan_corpus, dflash_doctor/ and tests/ (in-process and on a process pool: `-j 1` and `-j 2`), and a few
option variants (--select, --ignore, --baseline). One JSON line per scan: the report with the run's timing
(facts.seconds) removed, its exit code and stderr, keys sorted, so equal behaviour gives equal bytes.
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
FIXTURES = "fixtures/scan"
TIMING = ("seconds",)  # facts that measure the run, not what it found


def scans(torch: bool, baseline: str) -> Iterator[Tuple[str, List[str]]]:
    """(a unique name, the scan's arguments after `scan -f json`) of every scan named in the docstring."""
    root = REPO / FIXTURES
    yield FIXTURES, [FIXTURES]
    for path in sorted(root.iterdir()):
        if path.is_dir():
            yield f"{FIXTURES}/{path.name}/", [f"{FIXTURES}/{path.name}"]
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
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


def run(args: List[str]) -> Tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "dflash_doctor", "scan", "-f", "json", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout, done.stderr


def canonical(name: str, args: List[str]) -> str:
    code, stdout, stderr = run(args)
    try:
        report = json.loads(stdout)
    except ValueError:
        report = {"unparsed stdout": stdout}
    for key in TIMING:
        report.get("facts", {}).pop(key, None)
    return json.dumps({"name": name, "exit": code, "report": report, "stderr": stderr}, sort_keys=True,
                      ensure_ascii=True)


def dump(torch: bool) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        baseline = os.path.join(folder, "baseline.json")
        # the baseline is the drafter package's own report: its findings are matched, the others are new
        _, stdout, _ = run([f"{FIXTURES}/drafter"])
        Path(baseline).write_text(stdout, encoding="utf-8")
        for name, args in scans(torch, baseline):
            # the temporary file's name is in facts.baseline.file: a fixed stand-in keeps two dumps comparable
            yield canonical(name, args).replace(baseline, "<baseline>")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the dump here")
    group.add_argument("--check", type=Path, help="compare with a dump written earlier")
    parser.add_argument("--torch", action="store_true", help="also scan the installed torch's sources")
    args = parser.parse_args()
    lines = list(dump(args.torch))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="ascii")
        sys.stderr.write(f"{len(lines)} scans written to {args.out}\n")
        return 0
    # Compared by name: files added since the dump (new fixtures) have nothing to be compared with.
    before = {json.loads(line)["name"]: line for line in args.check.read_text(encoding="ascii").splitlines()}
    now = {json.loads(line)["name"]: line for line in lines}
    missing = sorted(set(before) - set(now))
    if missing:
        sys.stderr.write(f"{len(missing)} scans of the dump are gone, the first: {missing[0]}\n")
        return 1
    for name, old in before.items():
        if now[name] != old:
            sys.stderr.write(f"{name} differs:\n- {old[:2000]}\n+ {now[name][:2000]}\n")
            return 1
    sys.stderr.write(f"{len(before)} scans identical; {len(now) - len(before)} new scans not in the dump\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
