"""Fingerprints that survive line moves, and `--baseline FILE`: findings already known do not fail the run.

A fingerprint hashes the rule code, the file (relative to the working folder, posix) and the offending line's text
with its whitespace collapsed, plus the finding's rank among identical lines of that file, so moving code up or
down, or re-indenting it, keeps it; editing the offending line makes it new. Any earlier `scan --format json`
output is a baseline: its findings carry `evidence.fingerprint`.
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Dict, List, Optional, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding

KEY = "fingerprint"


def _line_texts(path: str) -> List[str]:
    from dflash_doctor.scan.source import decode, read_bytes

    data = read_bytes(path)
    text = decode(data) if isinstance(data, bytes) else None
    return text.splitlines() if text is not None else []


def fingerprint(code: str, path: str, line_text: str, rank: int) -> str:
    relative = os.path.relpath(os.path.abspath(path)).replace(os.sep, "/")
    normalised = " ".join(line_text.split())
    # surrogateescape: a file name that is not UTF-8 (bytes from the file system) still hashes
    key = f"{code}|{relative}|{normalised}|{rank}".encode("utf-8", "surrogateescape")
    import hashlib  # here: only a scan with findings needs it, and a one-file scan's start-up is a target

    return hashlib.sha256(key).hexdigest()[:24]


def add_fingerprints(findings: List[Finding]) -> List[Finding]:
    """Each finding with `evidence.fingerprint` set (files are re-read once each, only those with findings)."""
    lines: Dict[str, List[str]] = {}
    ranks: Counter = Counter()
    stamped = []
    for finding in sorted(findings, key=Finding.sort_key):
        if finding.path is None or finding.line is None:
            stamped.append(finding)
            continue
        if finding.path not in lines:
            lines[finding.path] = _line_texts(finding.path)
        texts = lines[finding.path]
        text = texts[finding.line - 1] if 0 < finding.line <= len(texts) else ""
        key = (finding.code, finding.path, " ".join(text.split()))
        stamp = fingerprint(finding.code, finding.path, text, ranks[key])
        ranks[key] += 1
        stamped.append(dataclasses.replace(finding, evidence={**finding.evidence, KEY: stamp}))
    return stamped


def load(path: str) -> Counter:
    """Fingerprints (with multiplicity) from a baseline file: a `scan --format json` (or `check`) document."""
    from dflash_doctor.inputs import BASELINE, load_json

    document = load_json(path, BASELINE, "--baseline")  # bounded, regular files only, one line if it is not JSON
    findings = document.get("findings") if isinstance(document, dict) else None
    if not isinstance(findings, list):
        raise UsageError(f"--baseline {path}: not a dflash-doctor JSON report (no findings list); write one with "
                         "`dflash-doctor scan PATH --format json --output FILE`")
    prints: Counter = Counter()
    for item in findings:
        evidence = item.get("evidence") if isinstance(item, dict) else None
        value = evidence.get(KEY) if isinstance(evidence, dict) else None
        if isinstance(value, str):
            prints[value] += 1
    return prints


def apply(findings: List[Finding], baseline: Optional[Counter]) -> Tuple[List[Finding], int]:
    """The findings not in `baseline`, and how many were matched (each baseline entry matches once)."""
    if baseline is None:
        return findings, 0
    remaining = Counter(baseline)
    kept = []
    matched = 0
    for finding in findings:
        value = finding.evidence.get(KEY)
        if value is not None and remaining[value] > 0:
            remaining[value] -= 1
            matched += 1
        else:
            kept.append(finding)
    return kept, matched
