"""CI pre-flight: the static scan, the installed torch's guards and (optionally) a quick forced repro, merged
into one Report whose facts keep each part's own facts under its name.

Each part is a callable returning a Report, injected so tests can pass small fakes; the defaults import the
real domain packages lazily. A part whose dependency is missing (no torch for the guards) becomes a Problem and
the other parts still run: a CI job without torch still gets its scan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from dflash_doctor.errors import MissingDependency
from dflash_doctor.findings import Finding, Problem, Report, Severity, stopped_facts
from dflash_doctor.progress import Reporter, shifted, silent
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD

if TYPE_CHECKING:
    from dflash_doctor.check.facts import CheckFacts, CheckPartsFacts, PartName

Part = Callable[[], Report]

PART_ORDER: Tuple[PartName, ...] = ("scan", "guards", "repro")
# Environment parts: what they find breaks threaded compiled code, and only that.
ENVIRONMENT_PARTS: Tuple[PartName, ...] = ("guards", "repro")
# Scan codes that show the scanned code calls compiled code from threads: the pattern the environment breaks.
THREADED_COMPILE_CODES = frozenset({COMPILED_CALL_IN_THREAD.code})
DOWNGRADED = (
    "downgraded to info by check: no scanned code calls compiled code from a thread without a mitigation that "
    "holds (DFD201 above info), so this torch behaviour cannot break it; pass --assume-threads if threads start "
    "outside the scanned paths"
)
INSTALL_HINT = {
    "guards": "install torch in this environment to check its guards; the scan ran without it",
    "repro": "install torch in this environment to run the repro; the other parts ran without it",
}


@dataclass(frozen=True)
class CheckPlan:
    """What one `check` run does; the CLI builds it from its options."""

    paths: Sequence[str] = (".",)
    exclude: Sequence[str] = ()
    probes: bool = True
    repro: bool = False
    timeout: float = 120.0  # seconds, for each live part (guards probes, each repro phase)
    assume_threads: bool = False  # keep environment findings at their severity even without DFD201


def default_parts(plan: CheckPlan, progress: Reporter = silent,
                  elapsed: Callable[[], float] = lambda: 0.0) -> Dict[PartName, Part]:
    """The real parts, each importing its domain only when it runs; the live ones tell `progress` how they go,
    on the check's clock (`elapsed`)."""

    def scan() -> Report:
        from dflash_doctor.scan import scan_paths
        from dflash_doctor.scan.config import resolve

        # The project's [tool.dflash-doctor] settings apply to check's scan as they do to `scan`.
        return scan_paths(list(plan.paths), exclude=tuple(plan.exclude), config=resolve(list(plan.paths)))

    def guards() -> Report:
        from dflash_doctor.guards import run_guards

        return run_guards(probes=plan.probes, timeout=plan.timeout, progress=shifted(progress, elapsed()))

    def repro() -> Report:
        from dflash_doctor.check.quick_repro import quick_forced_repro

        return quick_forced_repro(timeout=plan.timeout, progress=shifted(progress, elapsed()))

    parts: Dict[PartName, Part] = {"scan": scan, "guards": guards}
    if plan.repro:
        parts["repro"] = repro
    return parts


def _run_part(name: str, part: Part, clock: Callable[[], float]) -> tuple:
    started = clock()
    try:
        report = part()
    except MissingDependency as exc:
        report = Report(name, problems=[Problem(name, str(exc), INSTALL_HINT.get(name, ""))])
        return report, False, clock() - started
    except ImportError as exc:
        if (exc.name or "").startswith("dflash_doctor"):
            raise  # our own package is broken: an internal error, not a missing dependency
        # A dependency imported without require(): same treatment, named after the module that is missing.
        missing = exc.name or str(exc)
        reason = f"needs {missing}, which is not importable here ({exc.__class__.__name__}: {exc})"
        report = Report(name, problems=[Problem(name, reason, INSTALL_HINT.get(name, ""))])
        return report, False, clock() - started
    return report, True, clock() - started


def _downgraded(finding: Finding) -> Finding:
    return replace(
        finding, severity=Severity.INFO,
        evidence={**finding.evidence, "check": DOWNGRADED, "severity_from_rule": finding.severity.value},
    )


def run_check(
    plan: CheckPlan = CheckPlan(),
    *,
    parts: Optional[Dict[PartName, Part]] = None,
    clock: Callable[[], float] = time.perf_counter,
    progress: Reporter = silent,
) -> Report[CheckFacts]:
    """Run every part in order and merge them into one Report (command "check").

    facts (CheckFacts, check/facts.py): the parts that ran, each one's wall seconds, and each one's own facts
    under its name. A part's own exit-code contract (repro's) does not leak: the merged exit code follows
    findings and problems only.
    UsageError (a path that does not exist) propagates, as in `scan`.

    The environment parts find torch behaviour that breaks compiled code called from several threads. When the
    scan ran and found no such call (no DFD201), their findings are kept but downgraded to info, so a project
    that never calls compiled code from threads passes on a torch whose guard is not thread-safe;
    `plan.assume_threads` keeps them at their rule's severity. facts["environment_findings"] says which applied.
    """
    began = clock()
    parts = default_parts(plan, progress, lambda: clock() - began) if parts is None else parts
    ran: List[str] = []
    seconds: Dict[str, float] = {}
    kept: CheckPartsFacts = {}
    stopped: Optional[Tuple[str, str]] = None  # (the signal, what did not finish)
    by_part: Dict[PartName, Report] = {}
    order = sorted(parts, key=lambda n: PART_ORDER.index(n) if n in PART_ORDER else len(PART_ORDER))
    for index, name in enumerate(order):
        try:
            report, finished, wall = _run_part(name, parts[name], clock)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the parts that finished are the report
            from dflash_doctor.errors import stop_signal

            stopped = (stop_signal(exc), f"part {', '.join(order[index:])} did not finish")
            kept["partial"] = stopped_facts(*stopped)
            break
        by_part[name] = report
        seconds[name] = round(wall, 3)
        if finished:
            ran.append(name)
            kept[name] = report.facts

    # A DFD201 at info is mitigated: the scanned program applies fixes that cover every hazard (scan/fixes.py).
    threaded = "scan" not in ran or plan.assume_threads or any(
        f.code in THREADED_COMPILE_CODES and f.severity is not Severity.INFO for f in by_part["scan"].findings)
    # Built once every part is done, in the order the JSON has always had: the parts' own facts (and `partial`)
    # before the verdict on the environment findings, which needs the scan's.
    facts: CheckFacts = {"parts": ran, "seconds": seconds, **kept,
                         "environment_findings": "as reported" if threaded else "downgraded to info (no DFD201)"}
    merged: Report[CheckFacts] = Report("check", facts=facts)
    if stopped is not None:
        merged.mark_stopped(*stopped)  # its problem and exit code (it sets the same `partial` again, in place)
    for name, report in by_part.items():
        if name in ENVIRONMENT_PARTS and not threaded:
            report = Report(name, findings=[_downgraded(f) for f in report.findings], problems=report.problems)
        merged.extend(report)
    return merged
