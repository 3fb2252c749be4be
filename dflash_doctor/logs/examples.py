"""Run a DFD5xx rule example (a log excerpt) through the scanner, as `explain` shows it and the tests run it."""
from __future__ import annotations

import io
from typing import List

from dflash_doctor.findings import Finding, Report
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_stream


def run_example(text: str) -> Report:
    return scan_stream(io.BytesIO(text.encode()), "<example>", LogOptions())


def example_findings(text: str) -> List[Finding]:
    """A log rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    return run_example(text).findings
