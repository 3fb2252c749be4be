"""DFD522: a log that holds dflash-doctor's own findings (a saved `run` or `attach` output), read back as such.

First of all the log rules (precedence.py): a line of the tool's own report quotes other rules' words (a DFD905 line
holds the NameError it explains)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.logs.model import RuleLookup, declare
from dflash_doctor.rules.registry import Rule


# `dflash-doctor run`'s lines, live ('dflash-doctor: DFD903 live-lock-deadlock: pid 4242: ...') and in its report
# ('train.py:21:1: DFD903 live-lock-deadlock pid 4242: ...', or without a location): render/text.py's format.
_DOCTOR_LINE = re.compile(r"^(?:dflash-doctor: |(?P<path>\S.*?):(?P<line>\d+):\d+: )?(?P<code>DFD\d{3}) "
                          r"(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)+):? (?P<message>.+)$")
_DOCTOR_PID = re.compile(r"\bpid (?P<pid>\d+)")
_DOCTOR_THREADS = re.compile(r"^(?:(?:rank \d+ \()?pid \d+\)?: threads (?P<threads>[\w.-]+(?:, [\w.-]+)*)"
                             r"|(?P<thread>[\w.-]+) \((?:rank \d+ \()?pid \d+)")


def _doctor_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    message = match.group("message")
    pid = _DOCTOR_PID.search(message)
    named = _DOCTOR_THREADS.search(message)
    threads = (named.group("threads").split(", ") if named and named.group("threads")
               else [named.group("thread")] if named else [])
    return {"reported_code": match.group("code"), "reported_name": match.group("name"),
            "reported_message": message[:400], "pid": int(pid.group("pid")) if pid else None,
            "threads": threads, "path": match.group("path"),
            "reported_line": int(match.group("line")) if match.group("line") else None}


def _doctor_severity(details: Dict[str, Any], lookup: RuleLookup) -> Optional[Severity]:
    reported = lookup(details["reported_code"])
    return reported.severity if reported is not None else None


def _doctor_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    codes = sorted({str(f.evidence.get("reported_code")) for f in found})
    return [f"dflash-doctor explain {code}: what the run found and its fix" for code in codes] + [
        "the run's JSON report (`run -f json -o run.json`) keeps the stacks and the chain; rerun the same command "
        "under `dflash-doctor run --fix ...` to prove a fix"]


LOG_DOCTOR_FINDING = declare(Rule(
    code="DFD522",
    name="log-doctor-finding",
    severity=Severity.ERROR,
    summary="the log holds dflash-doctor's own finding (a saved `run` or `attach` output): read back as such",
    rationale=(
        "`dflash-doctor run` writes its findings to stderr as it finds them ('dflash-doctor: DFD903 "
        "live-lock-deadlock: pid 4242: threads loader, trainer wait on each other's locks') and again in its "
        "report ('train.py:21:1: DFD903 live-lock-deadlock pid 4242: ...'). A saved stderr handed to `logs` is the "
        "best evidence a log can hold: the run watched the threads. Each finding is reported once, with the "
        "run's code, its severity and the threads it names; its words are not read again by the log rules (a "
        "DFD905 line quotes the NameError it explains)."
    ),
    fix="Read the run's finding: `dflash-doctor explain CODE` for its rationale and fix.",
    example_format="log",
    bad=(
        "dflash-doctor: DFD903 live-lock-deadlock: pid 4242: threads loader, trainer wait on each other's locks. "
        "Next: Take the locks in one global order.\n"
        "run python pipeline.py  fixes: none; cache: as-is\n"
        "pipeline.py:21:1: DFD903 live-lock-deadlock pid 4242: threads loader, trainer wait on each other's locks. "
        "Next: Take the locks in one global order.\n"
        "run: 1 error (exit 137)\n"
    ),
    good=(
        "run python pipeline.py  fixes: none; cache: as-is\n"
        "run: no findings (exit 0)\n"
    ),
    # (trigger words with a byte the prefilter already anchors: the names of DFD901-DFD905 hold 'live-' or 'run-fx-',
    # a DFD906 line quotes the thread's 'SomeError:')
), triggers=("live-", "run-fx-", "Error:"), pattern=_DOCTOR_LINE, details=_doctor_details,
    describe=lambda d: f"dflash-doctor's {d['reported_code']} {d['reported_name']}: {d['reported_message']}",
    finding_key=lambda worker, d: (d["reported_code"], d["pid"], tuple(d["threads"])),
    severity_of=_doctor_severity, explains_cut_traceback=False, next_steps=_doctor_steps,
    worker_of=lambda d: d["threads"][0] if d["threads"] else None)
