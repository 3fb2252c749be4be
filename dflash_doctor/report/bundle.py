"""Gather the sections of a shareable bug report: environment, guards verdict, scan summary, GPU snapshot and
the last repro result. Every source is an injected callable with a real default; a source that fails becomes a
Problem in the bundle (the report is still written, saying what is missing and why).
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from dflash_doctor import __version__
from dflash_doctor.errors import DoctorError, UsageError
from dflash_doctor.findings import Problem, Report, Severity
from dflash_doctor.report.environment import collect_environment
from dflash_doctor.report.last_repro import RefusedRepro, UnreadableRepro, last_repro_path, load_repro, made_when

MAX_SCAN_FINDINGS = 25  # the summary lists this many; the counts cover all of them


@dataclass
class Bundle:
    created: str
    tool_version: str
    environment: dict
    made: dict  # where, when and by which command the parts run now (guards, scan, gpus) were made
    guards: Optional[dict] = None
    scan: Optional[dict] = None
    gpus: Optional[dict] = None
    repro: Optional[dict] = None
    problems: List[Problem] = field(default_factory=list)


@dataclass(frozen=True)
class BundleSources:
    """Where each section comes from. None for guards/scan/gpus means: use the real one."""

    guards: Optional[Callable[[], Report]] = None
    scan: Optional[Callable[[], Report]] = None
    gpus: Optional[Callable[[], dict]] = None
    env: Optional[Mapping[str, str]] = None
    argv: Optional[Sequence[str]] = None  # the command line that made the report; default sys.argv
    version_of: Optional[Callable[[str], str]] = None
    now: Callable[[], _dt.datetime] = lambda: _dt.datetime.now(_dt.timezone.utc)
    host: Callable[[], str] = socket.gethostname
    cwd: Callable[[], str] = os.getcwd


def _real_guards(probes: bool, timeout: float) -> Callable[[], Report]:
    def guards() -> Report:
        from dflash_doctor.guards import run_guards

        return run_guards(probes=probes, timeout=timeout)

    return guards


def _real_scan(paths: Sequence[str]) -> Callable[[], Report]:
    def scan() -> Report:
        from dflash_doctor.scan import scan_paths

        return scan_paths(list(paths))

    return scan


def _real_gpus() -> dict:
    from dflash_doctor.report.gpu_snapshot import gpu_snapshot

    return gpu_snapshot()


def verdict_of(report: Report) -> str:
    """One word for a part: the worst finding's severity decides; problems alone mean it could not be checked."""
    if report.facts.get("verdict"):
        return str(report.facts["verdict"])
    worst = max((f.severity.rank for f in report.findings), default=0)
    if worst >= Severity.ERROR.rank:
        return "unsafe"
    if worst >= Severity.WARNING.rank:
        return "at risk"
    if report.problems:
        return "could not check"
    return "ok"


def _report_section(report: Report, limit: Optional[int] = None) -> dict:
    findings = report.sorted_findings()
    return {
        "verdict": verdict_of(report),
        "counts": dict(sorted(Counter(f.code for f in findings).items())),
        "total": len(findings),
        "findings": [f.to_dict() for f in (findings if limit is None else findings[:limit])],
        "problems": [p.to_dict() for p in report.problems],
        "facts": report.facts,
    }


def _collect(name: str, source: Callable[[], object], problems: List[Problem]):
    try:
        return source()
    except UsageError:
        raise
    except DoctorError as exc:
        problems.append(Problem(name, str(exc), ""))
        return None
    except Exception as exc:  # noqa: BLE001 - a bug report is most needed when something is broken: keep going
        problems.append(Problem(name, f"{exc.__class__.__name__}: {exc}", "rerun that command alone with --debug"))
        return None


def build_bundle(
    paths: Sequence[str] = (".",),
    *,
    probes: bool = True,
    timeout: float = 120.0,
    repro_json: Optional[Path] = None,
    sources: BundleSources = BundleSources(),
) -> Bundle:
    problems: List[Problem] = []
    now = sources.now()
    environment = collect_environment(sources.env, sources.version_of, sources.argv)
    bundle = Bundle(
        created=now.replace(microsecond=0).isoformat(),
        tool_version=__version__,
        environment=environment,
        made={"command": environment["command"], "host": sources.host(), "cwd": sources.cwd(),
              "at": now.replace(microsecond=0).isoformat()},
        problems=problems,
    )
    guards = _collect("guards", sources.guards or _real_guards(probes, timeout), problems)
    if guards is not None:
        bundle.guards = _report_section(guards)
    scan = _collect("scan", sources.scan or _real_scan(paths), problems)
    if scan is not None:
        bundle.scan = _report_section(scan, MAX_SCAN_FINDINGS)
        bundle.scan["paths"] = list(paths)
    bundle.gpus = _collect("gpus", sources.gpus or _real_gpus, problems)
    bundle.repro = _repro_section(repro_json, sources.env, problems, now)
    return bundle


def _repro_section(repro_json: Optional[Path], env, problems: List[Problem],
                   now: _dt.datetime) -> Dict[str, object]:
    path = Path(repro_json) if repro_json is not None else last_repro_path(env)
    try:
        document = load_repro(path)
    except UnreadableRepro as exc:
        if repro_json is not None and isinstance(exc, RefusedRepro):
            raise UsageError(f"--repro-json {exc}") from exc
        problems.append(Problem("repro", str(exc), "run `dflash-doctor repro` again to refresh it"))
        return {"source": str(path), "result": None}
    if document is None:
        if repro_json is not None:
            raise UsageError(f"--repro-json {repro_json}: no such file")
        return {"source": str(path), "result": None}
    when = made_when(document)
    if when is None:  # a result from some run nobody can name is worse than none: it is left out
        problems.append(Problem("repro", f"{path} does not say where, when or by which command it was made (an "
                                "older dflash-doctor wrote it), so it is not included",
                                "run `dflash-doctor repro` again, or pass its --format json output with --repro-json"))
        return {"source": str(path), "result": None, "undated": True}
    return {"source": str(path), "result": document, "made": document["facts"]["made"],
            "age_s": round((now - when).total_seconds())}
