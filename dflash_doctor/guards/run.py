"""`run_guards`: the whole `guards` check as one Report (facts, DFD6xx findings, problems). Never prints."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Mapping, Optional, Sequence, Set, Tuple

from dflash_doctor.errors import UsageError, require_torch
from dflash_doctor.findings import Problem, Report
from dflash_doctor.guards.facts import GuardsFacts
from dflash_doctor.guards.host_document import HostSeconds, ProbeResult
from dflash_doctor.guards.ranking import hazard_fixes, rank_fixes, upgrade
from dflash_doctor.guards.hazard_findings import layout_findings, state_findings
from dflash_doctor.guards.layout import Layout, read_layout
from dflash_doctor.guards.probes import PROBE_NAMES
from dflash_doctor.outcomes import ProbeOutcome
from dflash_doctor.progress import EventKind, ProgressEvent, Reporter, silent
from dflash_doctor.guards.releases import corroborate, later_rows
from dflash_doctor.guards.runner import ProbeRun, Runner, run_child, run_probes
from dflash_doctor.guards.torch_sources import installed_torch_root, is_accelerator_build
from dflash_doctor.guards.state import (
    CONFIG_DEFAULTS, LiveState, cache_facts, distribution_version, fx_flag_spec, inductor_cache_dir, live_state,
    read_env, read_versions, torch_build, triton_cache_dir,
)
from dflash_doctor.guards.verdict import (
    ABSENT, UNKNOWN, HazardVerdict, advised_hazards, advised_present, decide_hazards, evidence_of_row, headline,
    release_of, verdict_reasons,
)

PURPOSE = "dflash-doctor guards"
TREE_ONLY = "not read: --torch-root describes the source tree only"


def run_guards(
    probes: bool = True,
    timeout: float = 30.0,
    *,
    torch_root: Optional[Path] = None,
    runner: Runner = run_child,
    environ: Optional[Mapping[str, str]] = None,
    modules: Optional[Mapping[str, object]] = None,
    version_of: Callable[[str], Optional[str]] = distribution_version,
    fork: Optional[bool] = None,
    clock: Callable[[], float] = time.monotonic,
    progress: Reporter = silent,
) -> Report[GuardsFacts]:
    """Read the guard layout, the state and (unless `probes=False`) run the live probes; see the module docs.

    `torch_root` analyses another torch source tree (an unpacked wheel) statically: probes, live state, this
    host's caches and environment describe something else, so they are neither read nor reported. `modules` is
    where an already imported torch is looked for (sys.modules): when the caller has Dynamo loaded, the live
    state is the caller's own. `progress` hears the probes start and end (a Reporter, dflash_doctor/progress.py).
    """
    began = clock()
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    root = _torch_root(torch_root)
    report: Report[GuardsFacts] = Report("guards")
    tree_only = torch_root is not None
    host = {} if tree_only else _host_facts(environ)  # before the probes, whose compiles may create the caches
    probe_details = {name: ProbeResult(ProbeOutcome.SKIPPED, detail=_skip_reason(probes, torch_root))
                     for name in PROBE_NAMES}
    run: Optional[ProbeRun] = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="guards-source") as pool:
        # The source is read while the probe hosts import torch: only their first read of the FX flag, after
        # that import, needs its name from it, so the read is off the path to the answer.
        source = pool.submit(_read_source, root, progress, clock, began)
        if not tree_only and probes:
            if fork is None and is_accelerator_build(root):
                # Measured on the H200 (torch 2.11+cu130): a fresh compile in a process forked after `import
                # torch` hangs there, so on CUDA/ROCm builds each probe gets an interpreter of its own.
                fork = False
            told = _ProbeProgress(progress, lambda: clock() - began, PROBE_NAMES)
            told.begin()
            run = run_probes(PROBE_NAMES, timeout, runner=runner, fork=fork, on_progress=told.heard,
                             fx_flag_from=lambda: fx_flag_spec(source.result()[0]))
            told.end(run.results)
            probe_details.update(run.results)
        layout, layout_seconds = source.result()

    live, state_source = _live(layout, modules, tree_only, probes, run)
    config = dict(live.config)

    outcomes: Dict[str, Optional[str]] = {name: result.outcome for name, result in probe_details.items()}
    verdicts = decide_hazards(layout, outcomes, live.fx_flag_now)
    verdict, worst = headline(verdicts)
    release = release_of(layout)
    needed = advised_hazards(verdicts)
    upgrade_advice = upgrade(needed, later_rows(layout.torch_version),
                             lambda row: advised_present(evidence_of_row(row)))
    if tree_only:
        versions = {"torch": layout.torch_version, **torch_build(layout.cuda, layout.hip)}
    else:
        versions = read_versions(layout.torch_version, layout.cuda, layout.hip, version_of)
        versions["gpu_count"] = live.gpu_count
    report.facts = {
        "torch_version": versions["torch"],
        "fx_flag_storage": layout.fx_flag_storage,
        "guard": _guard_facts(layout),
        "masked_during_compile": layout.masked_during_compile,
        "config": config,
        "fx_flag_now": live.fx_flag_now,
        "probes": outcomes,
        "compile_cache": host.get("compile_cache"),
        "verdict": verdict,
        "verdict_reasons": verdict_reasons(verdicts),
        "worst_hazard": worst.value if worst else None,
        "hazards": {v.hazard.value: {**v.to_dict(), **hazard_fixes(v.hazard, release, v.state != ABSENT)}
                    for v in verdicts},
        "release": {"version": release.version, "fx_flag_thread_local": release.fx_flag_thread_local,
                    "non_lazy_backward_available": release.non_lazy_backward_available,
                    "backward_compile_takes_compile_lock": release.backward_compile_takes_compile_lock,
                    "fx_patches_isolated": release.fx_patches_isolated,
                    "compile_settings_per_thread": release.compile_settings_per_thread},
        "fixes": rank_fixes(needed, release, live.fx_flag_now, config, CONFIG_DEFAULTS, upgrade_advice),
        "versions": versions,
        "fx_flag": _flag_facts(layout.fx_flag),
        "compiling_flag": _compiling_facts(layout),
        "backward_compile": layout.backward.to_dict(),
        "fx_patches": layout.fx_patches.to_dict(),
        "compile_settings": layout.compile_settings.to_dict(),
        "corroboration": corroborate(layout),
        "probe_details": {name: result.to_facts() for name, result in probe_details.items()},
        "state_source": state_source,
        "env": host.get("env"),
        "triton_cache": host.get("triton_cache"),
        "torch_root": str(root),
        "layout_notes": list(layout.notes),
        "seconds": {"layout": round(layout_seconds, 3), **_host_seconds(run.seconds if run else None),
                    "total": round(clock() - began, 3)},
    }
    report.findings += layout_findings(layout) + state_findings(report.facts)
    report.problems += _problems(verdicts, probe_details)
    return report


def _read_source(root: Path, progress: Reporter, clock: Callable[[], float], began: float) -> Tuple[Layout, float]:
    """The guard layout and the seconds from guards' start to it read."""
    progress(ProgressEvent(EventKind.STARTED, "source", f"reading the guard, the FX flag and the backward compile "
                           f"in {root}", round(clock() - began, 3)))
    layout = read_layout(root)
    layout_seconds = clock() - began
    progress(ProgressEvent(EventKind.FINISHED, "source", "read", round(layout_seconds, 3)))
    return layout, layout_seconds


def _live(layout: Layout, modules: Mapping[str, object], tree_only: bool, probes: bool,
          run: Optional[ProbeRun]) -> Tuple[LiveState, str]:
    """The live state the verdict reads and where it came from: the caller's own Dynamo when it has one loaded,
    else the probe host's fresh interpreter."""
    if tree_only:
        return LiveState.unread(), TREE_ONLY
    if "torch._dynamo" in modules:
        return live_state(modules["torch"], fx_flag_spec(layout)), "this process"
    if not probes:
        return LiveState.unread(), "not read: --no-probes starts no interpreter to read it from"
    if run is None or run.state is None:
        return LiveState.unread(), "not read: the probe host reported nothing (see problems)"
    return run.state, "a fresh interpreter (the probe host)"


class _ProbeProgress:
    """Turns the probe hosts' progress lines into events: the probes as a whole, then each probe, i of k."""

    WHOLE = "probes"
    IMPORT = "importing torch in the probe host"

    def __init__(self, progress: Reporter, elapsed: Callable[[], float], names: Sequence[str]) -> None:
        self.progress, self.elapsed, self.names = progress, elapsed, list(names)
        self.started: Dict[str, str] = {}  # probe name -> its key
        self.finished: Dict[str, str] = {}  # probe name -> outcome
        self.imported: Set[str] = set()
        self._lock = threading.Lock()  # the hosts' stderr is read on threads of their own

    def _tell(self, kind: EventKind, key: str, text: str, step: Optional[int] = None) -> None:
        self.progress(ProgressEvent(kind, key, text, round(self.elapsed(), 3), step, len(self.names) or None))

    def begin(self) -> None:
        self._tell(EventKind.STARTED, self.WHOLE, f"{len(self.names)} live probes, each in its own child process")
        self._tell(EventKind.STARTED, self.IMPORT, self.IMPORT)

    def _start(self, name: str) -> None:
        if name not in self.started:
            step = self.names.index(name) + 1
            self.started[name] = key = f"probe {step}/{len(self.names)} {name}"
            self._tell(EventKind.STARTED, key, key, step)

    def heard(self, words: Sequence[str]) -> None:
        with self._lock:
            if list(words[:1]) == ["imported"]:
                if self.IMPORT not in self.imported:
                    self.imported.add(self.IMPORT)
                    self._tell(EventKind.FINISHED, self.IMPORT, "done")
                for name in self.names:  # the probes run side by side once torch is imported
                    self._start(name)
            elif len(words) == 3 and words[0] == "probe" and words[1] in self.names:
                self._finish(words[1], words[2])

    def _finish(self, name: str, outcome: str) -> None:
        if name in self.finished:
            return
        self._start(name)
        self.finished[name] = outcome
        self._tell(EventKind.FINISHED, self.started[name], outcome, self.names.index(name) + 1)

    def end(self, results: Mapping[str, ProbeResult]) -> None:
        with self._lock:
            if self.IMPORT not in self.imported:
                self._tell(EventKind.FINISHED, self.IMPORT, "no word from the probe host")
            for name in self.names:  # what no progress line announced (a stand-in runner, a killed host)
                result = results.get(name)
                self._finish(name, (result.outcome if result else ProbeOutcome.ERROR).value)
            counts: Dict[str, int] = {}
            for outcome in self.finished.values():
                counts[outcome] = counts.get(outcome, 0) + 1
            self._tell(EventKind.FINISHED, self.WHOLE, f"{len(self.finished)} of {len(self.names)} ran: "
                       + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))


def _host_facts(environ: Mapping[str, str]) -> dict:
    """This machine's compile caches and environment: facts about the installed torch's host, not about a tree."""
    return {"env": read_env(environ), "compile_cache": cache_facts(inductor_cache_dir(environ)).to_dict(),
            "triton_cache": cache_facts(triton_cache_dir(environ)).to_dict()}


def _torch_root(torch_root: Optional[Path]) -> Path:
    if torch_root is None:
        root = installed_torch_root()
        if root is None:
            require_torch(PURPOSE)  # raises MissingDependency: one line naming the install command
            raise AssertionError("unreachable: torch imported although its spec was not found")
        return root
    root = Path(torch_root)
    # Accept the folder an unpacked wheel gives (holding torch/) as well as the package folder itself.
    if (root / "torch" / "_dynamo").is_dir():
        root = root / "torch"
    if not (root / "_dynamo").is_dir():
        raise UsageError(f"--torch-root {torch_root}: no _dynamo/ folder there; pass the torch package folder")
    return root


def _skip_reason(probes: bool, torch_root: Optional[Path]) -> str:
    if torch_root is not None:
        return "--torch-root reads sources only; probes would test the importable torch instead"
    return "--no-probes" if not probes else "not run"


def _lines(source) -> list:
    return [[number, text] for number, text in source]


def _guard_facts(layout: Layout) -> dict:
    guard = layout.guard
    if guard is None:
        return {"file": None, "line": None, "predicate": None}
    return {"file": guard.file, "line": guard.line, "predicate": guard.predicate, "function": guard.function,
            "if_line": guard.if_line, "predicate_qualname": guard.predicate_qualname,
            "bound_at_wrap": guard.bound_at_wrap, "source": _lines(guard.source)}


def _flag_facts(flag) -> Optional[dict]:
    if flag is None:
        return None
    return {"name": flag.name, "storage": flag.storage, "attribute": flag.attribute, "file": flag.file,
            "line": flag.line, "reader": flag.reader, "writer": flag.writer, "writer_line": flag.writer_line,
            "restores_saved_value": flag.restores_saved_value, "source": _lines(flag.source)}


def _compiling_facts(layout: Layout) -> dict:
    masking = layout.masking
    return {
        "consulted_by_predicate": layout.consults_is_compiling,
        "flag": _flag_facts(layout.compiling_flag),
        "set_by_compile": layout.compile_sets_compiling_flag,
        "masking": None if masking is None else {"file": masking.file, "line": masking.line,
                                                 "function": masking.function, "context": masking.context},
    }


def _host_seconds(seconds: Optional[HostSeconds]) -> Dict[str, float]:
    """The probe host's own clock, beside guards' (`probe_import`, `probe_total`); none when no host reported."""
    return {} if seconds is None else {"probe_import": seconds.imported, "probe_total": seconds.total}


def _problems(verdicts: Sequence[HazardVerdict], probe_details: Mapping[str, ProbeResult]) -> list:
    problems = []
    for verdict in verdicts:
        if verdict.state == UNKNOWN:
            problems.append(Problem(
                f"hazard {verdict.hazard.value}",
                f"could not tell whether the {verdict.hazard.label} is possible here: {verdict.reason}",
                "facts.layout_notes and facts.backward_compile.notes say what was found; the probes, where they "
                "run, test the FX-flag hazards live",
            ))
    for name, result in probe_details.items():
        if result.outcome == ProbeOutcome.ERROR:
            problems.append(Problem(
                f"probe {name}", result.error or result.detail or "failed",
                f"run it alone for details: python -m dflash_doctor.guards.probe_host --timeout 60 {name}",
            ))
    return problems
