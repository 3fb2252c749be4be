"""Run a DFD5xx rule example (a log excerpt) through the scanner, as `explain` shows it and the tests run it."""
from __future__ import annotations

import io

from dflash_doctor.findings import Report
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_stream


def run_example(text: str) -> Report:
    return scan_stream(io.BytesIO(text.encode()), "<example>", LogOptions())
