"""The write-or-compare step the findings comparisons share (logs_findings_compare.py, scan_findings_compare.py):
one JSON line per named run; `--out` writes them, `--check` compares with lines written earlier, by name, so runs
added since the dump (new fixtures) have nothing to be compared with and are only counted."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional


def write_or_check(lines: List[str], out: Optional[Path], check: Optional[Path], what: str) -> int:
    if out is not None:
        out.write_text("\n".join(lines) + "\n", encoding="ascii")
        sys.stderr.write(f"{len(lines)} {what} written to {out}\n")
        return 0
    assert check is not None
    before = {json.loads(line)["name"]: line for line in check.read_text(encoding="ascii").splitlines()}
    now = {json.loads(line)["name"]: line for line in lines}
    missing = sorted(set(before) - set(now))
    if missing:
        sys.stderr.write(f"{len(missing)} {what} of the dump are gone, the first: {missing[0]}\n")
        return 1
    for name, old in before.items():
        if now[name] != old:
            sys.stderr.write(f"{name} differs:\n- {old[:2000]}\n+ {now[name][:2000]}\n")
            return 1
    sys.stderr.write(f"{len(before)} {what} identical; {len(now) - len(before)} new {what} not in the dump\n")
    return 0
