"""A canonical dump of what `logs` finds on every log this repository holds, to compare before and after a change
that must not change a finding (a refactoring of the scanner).

    python benchmarks/logs_findings_compare.py --out /tmp/before.jsonl      # on the commit before
    python benchmarks/logs_findings_compare.py --check /tmp/before.jsonl    # after: exit 1 and the first difference

The logs: every file in fixtures/logs/, every DFD5xx rule's bad and good example, and every string literal holding a
newline in tests/logs/ and tests/status/ (the tests' stand-ins, read with `ast`, never imported). Each is scanned
twice through the scanner's public entry (logs.source.scan_stream): alone (small enough to be parsed in full) and
between progress lines that make it a large block (the prefilter and the sampled path). One JSON line per scan:
findings in the order produced, problems and facts, keys sorted, so equal behaviour gives equal bytes. The held-out
real logs (benchmarks/logs_heldout) are not part of it: they are not stored in the repository.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import sys
from pathlib import Path
from typing import Iterator, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # findings_dump.py, beside this script
sys.path.insert(0, str(REPO))

from dflash_doctor.logs.options import LogOptions  # noqa: E402
from dflash_doctor.logs.source import scan_stream  # noqa: E402
from dflash_doctor.rules.logs import LOG_RULES  # noqa: E402

STAND_IN_FOLDERS = ("tests/logs", "tests/status")
# More than the scanner's dense limit (64 KiB) on each side, so the stand-in lies inside a sampled block.
PADDING = "".join(f"[drafter-{i % 4}] step={i // 4} loss=2.10 7.0 Ktok/s\n" for i in range(4_000))


def logs() -> Iterator[Tuple[str, bytes]]:
    """(a unique name, the log) of every log named in the module's docstring."""
    seen: Set[str] = set()
    for name, data in _logs():
        unique = name if name not in seen else f"{name}#{sum(1 for n in seen if n.startswith(name))}"
        seen.add(unique)
        yield unique, data


def _logs() -> Iterator[Tuple[str, bytes]]:
    for path in sorted((REPO / "fixtures" / "logs").iterdir()):
        if path.is_file() and path.suffix == ".log":
            yield f"fixtures/logs/{path.name}", path.read_bytes()
    for code, entry in LOG_RULES.items():
        yield f"{code}.bad", entry.rule.bad.encode()
        yield f"{code}.good", entry.rule.good.encode()
    for folder in STAND_IN_FOLDERS:
        for path in sorted((REPO / folder).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
                    yield f"{folder}/{path.name}:{node.lineno}:{node.col_offset}", node.value.encode("utf-8",
                                                                                                      "replace")


def scan(data: bytes, name: str) -> str:
    report = scan_stream(io.BytesIO(data), name, LogOptions())
    doc = {"name": name, "findings": [f.to_dict() for f in report.findings],
           "problems": [p.to_dict() for p in report.problems], "facts": report.facts}
    return json.dumps(doc, sort_keys=True, default=repr, ensure_ascii=True)


def dump() -> Iterator[str]:
    padding = PADDING.encode()
    for name, data in logs():
        yield scan(data, name)
        yield scan(padding + data + (b"" if data.endswith(b"\n") else b"\n") + padding, name + " (padded)")


def main() -> int:
    from findings_dump import write_or_check

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the dump here")
    group.add_argument("--check", type=Path, help="compare with a dump written earlier")
    args = parser.parse_args()
    return write_or_check(list(dump()), args.out, args.check, "logs")


if __name__ == "__main__":
    raise SystemExit(main())
