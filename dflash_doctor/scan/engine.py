"""`scan_paths` and `scan_source`: discovery, prefilter, per-file analysis (in-process or on a process pool),
then the cross-file DFD201 pass over the call graph."""
from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding, Problem, Report
from dflash_doctor.rules.registry import Rule
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD
from dflash_doctor.scan.analysis import FileResult, analyse_tree
from dflash_doctor.scan.context import suppressed
from dflash_doctor.scan.discovery import discover
from dflash_doctor.scan.graph import Linker, ModuleIndex
from dflash_doctor.scan.resolve import FuncRef
from dflash_doctor.scan.source import MAX_SOURCE_BYTES, RULE_TRIGGERS, parse_bytes, parse_text, read_bytes
from dflash_doctor.scan.summary import ModuleSummary

# Below this many files a process pool costs more than it saves, and a one-file scan must start instantly.
PARALLEL_MIN_FILES = 96
_CHUNKS_PER_JOB = 4


def scan_rules() -> List[Rule]:
    """The scan rule table (rules/scan.py) alone: other domains' tables are not needed to scan."""
    from dflash_doctor.rules import scan as table

    return sorted((r for r in vars(table).values() if isinstance(r, Rule)), key=lambda r: r.code)


def scan_codes() -> List[str]:
    return [rule.code for rule in scan_rules()]


def select_codes(select: Union[str, Sequence[str], None] = None,
                 ignore: Union[str, Sequence[str], None] = None) -> FrozenSet[str]:
    """Enabled scan codes: `select`/`ignore` take codes, code prefixes (DFD1, DFD10) or rule names."""
    codes = scan_codes()
    names = {rule.name: rule.code for rule in scan_rules()}

    def expand(spec) -> set:
        items = spec.split(",") if isinstance(spec, str) else [i for s in spec for i in s.split(",")]
        chosen = set()
        for item in (i.strip() for i in items):
            if not item:
                continue
            matched = {names[item.lower()]} if item.lower() in names else {
                c for c in codes if c.startswith(item.upper())
            }
            if not matched:
                raise UsageError(f"unknown scan rule {item!r}; scan rules are {', '.join(codes)}")
            chosen |= matched
        return chosen

    enabled = expand(select) if select else set(codes)
    if ignore:
        enabled -= expand(ignore)
    return frozenset(enabled)


def _trigger_words(enabled: FrozenSet[str]) -> Tuple[bytes, ...]:
    return tuple(sorted({w for code in enabled for w in RULE_TRIGGERS.get(code, ())}))


def analyse_file(path: str, package: Optional[str], enabled: FrozenSet[str], words: Tuple[bytes, ...],
                 max_bytes: int = MAX_SOURCE_BYTES) -> FileResult:
    """Read one file and, when its bytes contain a trigger word, parse and analyse it. Never raises."""
    data = read_bytes(path)
    if isinstance(data, Problem):
        return FileResult(path, problems=[data])
    if not any(word in data for word in words):
        return FileResult(path)
    parsed = parse_bytes(data, path, max_bytes)
    if isinstance(parsed, Problem):
        return FileResult(path, problems=[parsed])
    try:
        return analyse_tree(path, parsed.text, parsed.tree, enabled, package)
    except (RecursionError, MemoryError):
        return FileResult(path, problems=[
            Problem(path, "too deeply nested to analyse", "simplify the nesting or exclude the file"),
        ])


def _analyse_chunk(items: List[Tuple[str, Optional[str]]], enabled: FrozenSet[str], max_bytes: int
                   ) -> List[FileResult]:
    words = _trigger_words(enabled)
    return [analyse_file(path, package, enabled, words, max_bytes) for path, package in items]


def _chunks(items: List[Tuple[str, Optional[str]]], count: int) -> List[List[Tuple[str, Optional[str]]]]:
    # Round-robin over the sorted list spreads each folder's big files over all workers.
    return [chunk for chunk in (items[i::count] for i in range(count)) if chunk]


def _pool_context():
    import multiprocessing
    import threading

    # fork starts workers in milliseconds; it is only safe while this process has a single thread.
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _analyse_all(items, enabled, workers: int, max_bytes: int) -> List[FileResult]:
    if workers <= 1:
        return _analyse_chunk(items, enabled, max_bytes)
    chunks = _chunks(items, workers * _CHUNKS_PER_JOB)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
        parts = pool.map(_analyse_chunk, chunks, [enabled] * len(chunks), [max_bytes] * len(chunks))
        return [result for part in parts for result in part]


def _describe(ref: FuncRef, linker: Linker) -> str:
    return f"{ref.qualname} ({ref.path}:{linker.function_line(ref)})"


def link_spawns(summaries: Iterable[ModuleSummary], linker: Linker) -> List[Finding]:
    """DFD201: every spawn site whose target reaches a compiled callable, with the call chain as evidence."""
    findings = []
    for summary in summaries:
        for spawn in summary.spawns:
            if suppressed(COMPILED_CALL_IN_THREAD.code, spawn.noqa):
                continue
            if spawn.thread_class is not None and not linker.is_thread_class(spawn.thread_class):
                continue
            hit = linker.find_compiled(spawn.refs)
            if hit is None:
                continue
            chain, compiled = hit
            where = f"{compiled.path}:{compiled.line}"
            findings.append(COMPILED_CALL_IN_THREAD.finding(
                f"{spawn.kind} runs {spawn.target}, which calls torch.compile'd {compiled.name} (compiled at "
                f"{where}) from a worker thread",
                path=summary.path, line=spawn.line, column=spawn.column,
                evidence={
                    "spawn": spawn.kind,
                    "target": spawn.target,
                    "chain": [_describe(ref, linker) for ref in chain] + [f"{compiled.name} ({where})"],
                    "compiled": {"name": compiled.name, "path": compiled.path, "line": compiled.line},
                },
            ))
    return findings


def _load_summary(path: str, package: Optional[str], problems: List[Problem], max_bytes: int
                  ) -> Optional[ModuleSummary]:
    """Parse a file the prefilter skipped because a thread's call chain leads into it."""
    data = read_bytes(path)
    parsed = data if isinstance(data, Problem) else parse_bytes(data, path, max_bytes)
    if isinstance(parsed, Problem):
        problems.append(Problem(parsed.subject, parsed.reason, "calls from threads into this file were not followed"))
        return None
    try:
        return analyse_tree(path, parsed.text, parsed.tree, frozenset(), package).summary
    except (RecursionError, MemoryError):
        return None


def scan_paths(
    paths: Iterable[str],
    exclude: Sequence[str] = (),
    jobs: Optional[int] = None,
    select: Union[str, Sequence[str], None] = None,
    ignore: Union[str, Sequence[str], None] = None,
    *,
    max_bytes: int = MAX_SOURCE_BYTES,
    parallel_min_files: int = PARALLEL_MIN_FILES,
    clock: Callable[[], float] = time.perf_counter,
) -> Report:
    """Scan files and folders for the DFD1xx-3xx hazards. Never imports or runs the scanned code."""
    started = clock()
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise UsageError("scan needs at least one PATH")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    enabled = select_codes(select, ignore)
    files = discover(paths, exclude)
    index = ModuleIndex(files)
    jobs = jobs or default_jobs()
    workers = jobs if len(files) >= parallel_min_files else 1
    results = _analyse_all([(p, index.packages[p]) for p in files], enabled, workers, max_bytes)

    report = Report("scan")
    summaries: Dict[str, ModuleSummary] = {}
    for result in results:
        report.findings.extend(result.findings)
        report.problems.extend(result.problems)
        if result.summary is not None:
            summaries[result.path] = result.summary
    loaded = 0
    if COMPILED_CALL_IN_THREAD.code in enabled and any(s.spawns for s in summaries.values()):
        spawning = [s for s in summaries.values() if s.spawns]
        linker = Linker(
            summaries, index,
            load=lambda path: _load_summary(path, index.packages.get(path), report.problems, max_bytes),
        )
        report.findings.extend(link_spawns(spawning, linker))
        loaded = len(linker.loaded)
    parsed = sum(1 for r in results if r.parsed)
    report.facts = {
        "paths": paths,
        "files": len(files),
        "parsed": parsed,
        "skipped_by_prefilter": sum(1 for r in results if not r.parsed and not r.problems),
        "loaded_for_call_chains": loaded,
        "jobs": workers,
        "rules": sorted(enabled),
        "rule_counts": {code: sum(1 for f in report.findings if f.code == code) for code in sorted(enabled)},
        "seconds": round(clock() - started, 3),
    }
    return report


def scan_source(source: str, path: str = "<string>") -> List[Finding]:
    """Every scan finding in one piece of source (all rules, DFD201 within this source only), sorted.

    Raises ValueError when the source cannot be parsed (scan_paths reports that as a problem instead).
    """
    parsed = parse_text(source, path)
    if isinstance(parsed, Problem):
        raise ValueError(f"{path}: {parsed.reason}")
    enabled = frozenset(scan_codes())
    result = analyse_tree(path, parsed.text, parsed.tree, enabled)
    findings = list(result.findings)
    findings.extend(link_spawns([result.summary], Linker({path: result.summary})))
    return sorted(findings, key=Finding.sort_key)
