"""The JSON envelope shared by every command."""
from __future__ import annotations

import json

from dflash_doctor import TOOL_NAME, __version__
from dflash_doctor.findings import Report


def envelope(report: Report, exit_code: int) -> dict:
    return {
        "tool": TOOL_NAME,
        "version": __version__,
        "command": report.command,
        "findings": [f.to_dict() for f in report.sorted_findings()],
        "problems": [p.to_dict() for p in report.problems],
        "facts": report.facts,
        "exit_code": exit_code,
    }


def render_json(report: Report, exit_code: int) -> str:
    return json.dumps(envelope(report, exit_code), indent=2, sort_keys=False, default=str)
