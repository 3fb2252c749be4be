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
from typing import Any, Dict, List, Optional, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding

KEY = "fingerprint"


def _line_texts(path: str) -> List[str]:
    from dflash_doctor.scan.source_file import decode, read_bytes

    data = read_bytes(path)
    text = decode(data) if isinstance(data, bytes) else None
    return text.splitlines() if text is not None else []


def _prefix(code: str, path: str, normalised: str) -> Any:  # a hashlib digest object
    """The hash of everything a fingerprint covers but the rank: a long line is hashed once, not once per finding
    on it (a one-line file of 240,000 calls made that quadratic)."""
    import hashlib  # here: only a scan with findings needs it, and a one-file scan's start-up is a target

    relative = os.path.relpath(os.path.abspath(path)).replace(os.sep, "/")
    # surrogateescape: a file name that is not UTF-8 (bytes from the file system) still hashes
    return hashlib.sha256(f"{code}|{relative}|{normalised}|".encode("utf-8", "surrogateescape"))


def fingerprint(code: str, path: str, line_text: str, rank: int) -> str:
    digest = _prefix(code, path, " ".join(line_text.split()))
    digest.update(str(rank).encode())
    return digest.hexdigest()[:24]


def add_fingerprints(findings: List[Finding]) -> List[Finding]:
    """Each finding with `evidence.fingerprint` set (files are re-read once each, only those with findings; each
    offending line is normalised and hashed once, however many findings it holds)."""
    lines: Dict[str, List[str]] = {}
    prefixes: Dict[Tuple[str, str, int], Any] = {}
    ranks: Counter = Counter()
    stamped = []
    for finding in sorted(findings, key=Finding.sort_key):
        if finding.path is None or finding.line is None:
            stamped.append(finding)
            continue
        if finding.path not in lines:
            lines[finding.path] = _line_texts(finding.path)
        place = (finding.code, finding.path, finding.line)
        if place not in prefixes:
            texts = lines[finding.path]
            text = texts[finding.line - 1] if 0 < finding.line <= len(texts) else ""
            prefixes[place] = _prefix(finding.code, finding.path, " ".join(text.split()))
        digest = prefixes[place].copy()
        # identical lines of a file share a prefix digest; the rank tells them apart
        key = (finding.code, finding.path, digest.digest())
        digest.update(str(ranks[key]).encode())
        ranks[key] += 1
        stamped.append(dataclasses.replace(finding, evidence={**finding.evidence, KEY: digest.hexdigest()[:24]}))
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
