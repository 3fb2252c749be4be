"""`scan_paths` and `scan_source`: discovery, prefilter, per-file analysis (in-process or on a process pool),
then the cross-file DFD201 pass over the call graph."""
from __future__ import annotations

import gc
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding, Problem, Report, Severity
from dflash_doctor.rules.registry import Rule
from dflash_doctor.rules.scan import (
    FLEX_ATTENTION_UNCOMPILED, FX_TRACE_IN_THREAD, HF_GRADIENT_CHECKPOINTING_IMPLICIT, SCAN_RULES, UNUSED_NOQA,
    thread_hazards,
)
from dflash_doctor.scan import baseline as baseline_file
from dflash_doctor.scan import config as config_file
from dflash_doctor.scan.facts import ScanFacts
from dflash_doctor.scan.analysis import FileResult, analyse_tree, builds_graph
from dflash_doctor.scan.config import ScanConfig
from dflash_doctor.scan.context import noqa_directives
from dflash_doctor.scan.discovery import Discovery, discover
from dflash_doctor.scan.fixes import AROUND_TRACE, PER_THREAD, SETTING_FIXES, AppliedFix, collect
from dflash_doctor.scan.graph import Linker
from dflash_doctor.scan.module_index import ModuleIndex
from dflash_doctor.scan.project_modules import ProjectModules
from dflash_doctor.scan.hf_releases import VersionSource, installed_transformers
from dflash_doctor.scan import programs as program_files
from dflash_doctor.scan.programs import Imports, Programs, Reach, describe, program_verdicts
from dflash_doctor.scan.resolve import FuncRef
from dflash_doctor.scan.source_file import MAX_SOURCE_BYTES, decode, parse_bytes, parse_text, read_bytes, triggered
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.in_thread import IN_THREAD_CHECKS
from dflash_doctor.scan.thread_reach import ThreadReach
from dflash_doctor.scan.workers import fork_usable, two_passes

# Below this many files a process pool costs more than it saves, and a one-file scan must start instantly.
PARALLEL_MIN_FILES = 96
_CHUNKS_PER_JOB = 1  # one chunk per worker: each chunk links its own spawns, and more chunks re-parse the same
# modules for call chains (torch: 112 parses of 78 modules at 4 chunks per worker, 86 at 1)
_DFD_NOQA = re.compile(rb"(?i)noqa[^\n]*dfd")  # a noqa comment naming one of ours (no copy of the file made)
MAX_LISTED_SKIPS = 200  # facts list at most this many skipped folders (the total is always given)
# What a forked worker keeps to the end: it ends with os._exit, so freeing the call graphs it built (every tree
# and scope of its files and of those loaded for call chains) would be work for nothing; on torch's sources it
# was a twentieth of a worker's time. Filled only in the forked workers (the parent and pool workers free theirs).
_KEPT_UNTIL_EXIT: List[object] = []


def scan_rules() -> List[Rule]:
    """The scan rules as declared (rules/scan.py) alone: other domains' tables are not needed to scan."""
    return [SCAN_RULES[code].rule for code in sorted(SCAN_RULES)]


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

    # Given but naming nothing (`--select ",,,"`, `select = []`) is a mistake, never "run zero rules".
    for option, spec in (("--select", select), ("--ignore", ignore)):
        if spec is not None and not expand(spec):
            shown = spec if isinstance(spec, str) else ",".join(spec)
            raise UsageError(f"{option} {shown!r} names no rule; scan rules are {', '.join(codes)}")
    enabled = expand(select) if select is not None else set(codes)
    if ignore is not None:
        enabled -= expand(ignore)
    return frozenset(enabled)


class Work(NamedTuple):
    """A file to analyse: its package, and the rules its bytes triggered when a first pass has read them already
    (None: decided when it is read here)."""
    path: str
    package: Optional[str]
    active: Optional[FrozenSet[str]] = None


def analyse_file(path: str, package: Optional[str], enabled: FrozenSet[str],
                 max_bytes: int = MAX_SOURCE_BYTES, transformers_version: Optional[str] = None,
                 active: Optional[FrozenSet[str]] = None) -> Tuple[FileResult, Optional[ModuleGraph]]:
    """Read one file and, when its bytes can trigger an enabled rule (`active`, when already known), parse and
    analyse it. Never raises."""
    data = read_bytes(path)
    if isinstance(data, Problem):
        return FileResult(path, problems=[data]), None
    if active is None:
        active = triggered(data, enabled)
    if not active:
        return _untriggered(path, data), None
    parsed = parse_bytes(data, path, max_bytes)
    if isinstance(parsed, Problem):
        return FileResult(path, problems=[parsed]), None
    try:
        return analyse_tree(path, parsed.text, parsed.tree, active, package,
                            transformers_version=transformers_version)
    except (RecursionError, MemoryError):
        return FileResult(path, problems=[
            Problem(path, "too deeply nested to analyse", "simplify the nesting or exclude the file"),
        ]), None


def _untriggered(path: str, data: bytes) -> FileResult:
    """A file no rule can fire on: every `# noqa: DFDxxx` in it suppresses nothing. Only codes written in capitals
    (as every linter prints them) are looked for here, and the four spellings of noqa only then: C-speed."""
    # rfind, and a tab looked for alone (memchr), cost a fifth of `b"DFD" in data` and `b"\n\t" in data`: these two
    # searches run on every file of a scan that no rule triggers on
    noqa = data.rfind(b"DFD") != -1 and (
        b"noqa" in data or b"NOQA" in data or b"NoQA" in data or b"Noqa" in data)
    text = decode(data) if noqa and _DFD_NOQA.search(data) else None
    result = FileResult(path, noqa=noqa_directives(text) if text else [])
    if b"\t" in data and b"\n\t" in data and b"\n " in data and len(data) <= MAX_SOURCE_BYTES:
        # Tabs and spaces both start lines: a TabError is possible, and a file that does not compile must not
        # pass for clean. Rare in modern code, so parsing these few costs nothing measurable.
        parsed = parse_bytes(data, path)
        if isinstance(parsed, Problem):
            result.problems.append(parsed)
    return result


def _analyse_chunk(items: Sequence[Work], enabled: FrozenSet[str], max_bytes: int,
                   index: ModuleIndex, transformers_version: Optional[str] = None, keep: Optional[List[object]] = None
                   ) -> Tuple[List[FileResult], List[str]]:
    """Analyse some files and follow their threads' call chains (loading other files on demand, here, so the
    ASTs need not cross processes). Returns the results and the files loaded only for call chains; with `keep`,
    the call graphs built go there instead of being freed (a process about to end)."""
    # ASTs are large and acyclic: with the cyclic collector on, it re-scans the live trees every few thousand
    # allocations, which more than doubled parse time on torch's sources. The only cycles made here (scopes
    # and their bindings) are broken by ScopeTable.release, so reference counting frees each file's tree.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        results: Dict[str, FileResult] = {}
        graphs: Dict[str, ModuleGraph] = {}
        for path, package, active in items:
            results[path], graph = analyse_file(path, package, enabled, max_bytes, transformers_version, active)
            if graph is not None:
                graphs[path] = graph
        spawning = [g for g in graphs.values() if g.spawns]
        loaded: List[str] = []
        if spawning:
            problems: List[Problem] = []
            modules = ProjectModules(
                dict(graphs), index,
                load=lambda path: _load_graph(path, index.package(path), problems, max_bytes),
            )
            linker = Linker(modules)
            for graph in spawning:
                result = results[graph.path]
                result.findings.extend(link_spawns(graph, linker, result.noqa_used, result.thread_reach))
            loaded = list(modules.loaded)
            if problems:
                results[spawning[0].path].problems.extend(problems)
        built = modules.summaries if spawning else graphs
        if keep is not None:
            keep.append(built)
        else:
            for graph in built.values():
                graph.ctx.table.release()
        return list(results.values()), loaded
    finally:
        if was_enabled:
            gc.enable()


def _chunks(items: List[Work], count: int) -> List[List[Work]]:
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


class Waiting(NamedTuple):
    """A file the first pass kept for the second: what the second pass needs, and its size (for the plan)."""
    work: Work
    size: int


def _prefilter_chunk(items: List[Work], enabled: FrozenSet[str]) -> "FirstPass":
    """A pool's first pass: the files no enabled rule can fire on are done here (analyse_file's answer for them:
    a bare path where that answer is empty, so thousands of them cross the pipe cheaply); the others come back
    with the rules they triggered (not searched for again) and their size, for the second pass."""
    done: List[Union[str, FileResult]] = []
    waiting: List[Waiting] = []
    for path, package, _ in items:
        data = read_bytes(path)
        if isinstance(data, Problem):
            done.append(FileResult(path, problems=[data]))
            continue
        active = triggered(data, enabled)
        if active:
            waiting.append(Waiting(Work(path, package, active), len(data)))
        else:
            result = _untriggered(path, data)
            done.append(result if result.noqa or result.problems else path)
    return done, waiting


def balanced(sized: Sequence[Waiting], count: int) -> List[List[Work]]:
    """The files to parse split into `count` groups of about equal bytes (largest first, each to the lightest
    group; a group may stay empty): parsing dominates, and a handful of large modules decide when the last worker
    ends."""
    groups: List[List[Work]] = [[] for _ in range(count)]
    loads = [0] * count
    for work, size in sorted(sized, key=lambda item: (-item.size, item.work.path)):
        lightest = loads.index(min(loads))
        groups[lightest].append(work)
        loads[lightest] += size
    return groups


FirstPass = Tuple[List[Union[str, FileResult]], List[Waiting]]
SecondPass = Tuple[List[FileResult], List[str]]


@dataclass
class _Plan:
    """The second pass: each worker's files, the files any worker may take, and the order of their results."""
    groups: List[List[Work]]  # files whose call graphs are built and linked where their group is analysed
    shared: List[Work]  # files analysed alike wherever they go, largest first
    order: List[str]  # every path of the second pass, in the order of the byte-balanced groups


def _plan(firsts: List[FirstPass], count: int) -> _Plan:
    """The files the first pass kept, in byte-balanced groups. Files whose rules build a call graph stay in their
    group: which graphs share a worker decides which files that worker parses again for call chains (and the
    report counts those). The others are judged the same wherever they go, and are left to whichever worker is free
    first: the call-chain walks that follow a group's spawns cost what no byte count foresees (on torch one worker
    ended 0.1 s after the other)."""
    waiting = [item for _, kept in firsts for item in kept]
    sizes = {item.work.path: item.size for item in waiting}
    groups = balanced(waiting, count)
    graphs = [[work for work in group if work.active is not None and builds_graph(work.active)] for group in groups]
    shared = [work for group in groups for work in group if work.active is None or not builds_graph(work.active)]
    shared.sort(key=lambda work: (-sizes[work.path], work.path))
    return _Plan(graphs, shared, [work.path for group in groups for work in group])


def _merge(firsts: List[FirstPass], seconds: List[SecondPass], order: Sequence[str]) -> SecondPass:
    """Both passes' results (a bare path from the first: a file with nothing to say), the second's in `order`, and
    the files loaded for call chains."""
    done = [FileResult(item) if isinstance(item, str) else item for finished, _ in firsts for item in finished]
    by_path = {result.path: result for results, _ in seconds for result in results}
    return done + [by_path[path] for path in order], [path for _, loaded in seconds for path in loaded]


def _analyse_all(items, enabled, workers: int, max_bytes: int, index: ModuleIndex,
                 transformers_version: Optional[str] = None) -> Tuple[List[FileResult], List[str]]:
    if workers <= 1:
        return _analyse_chunk(items, enabled, max_bytes, index, transformers_version)
    # Two passes: the byte prefilter over an even share of the files each, then the files it kept, balanced by
    # size (parsed where they are analysed, so no tree crosses processes). One pass over round-robin shares left
    # one worker with most of the large modules (torch: 0.72 s against 0.89 s).
    chunks = _chunks(items, workers * _CHUNKS_PER_JOB)
    if fork_usable():
        plans: List[_Plan] = []

        def plan(firsts: List[FirstPass]) -> Tuple[List[List[Work]], List[Work]]:
            plans.append(_plan(firsts, len(chunks)))
            return plans[0].groups, plans[0].shared

        firsts, answers = two_passes(
            chunks, first=lambda chunk: _prefilter_chunk(chunk, enabled), plan=plan,
            second=lambda group: _analyse_chunk(group, enabled, max_bytes, index, transformers_version,
                                                keep=_KEPT_UNTIL_EXIT),
            after=lambda work: analyse_file(work.path, work.package, enabled, max_bytes, transformers_version,
                                            work.active)[0])
        seconds = [(results + [result for _, result in taken], loaded) for (results, loaded), taken in answers]
        return _merge(firsts, seconds, plans[0].order)
    from concurrent.futures import ProcessPoolExecutor  # only large scans pay for importing multiprocessing

    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
        firsts = list(pool.map(_prefilter_chunk, chunks, [enabled] * len(chunks)))
        planned = _plan(firsts, len(chunks))
        # no queue between pool workers: the shared files are dealt out in turn
        groups = [group + planned.shared[i::len(chunks)] for i, group in enumerate(planned.groups)]
        seconds = list(pool.map(_analyse_chunk, groups,
                                *zip(*[(enabled, max_bytes, index, transformers_version)] * len(groups))))
    return _merge(firsts, seconds, planned.order)


def link_spawns(graph: ModuleGraph, linker: Linker, used_noqa: Optional[set] = None,
                reach: Optional[Dict[Tuple[int, int], Reach]] = None) -> List[Finding]:
    """The in-thread rules' findings for one file (scan/in_thread/: DFD201, DFD203, ...): each spawn site judged by
    every enabled check that judges its kind of threads, then what each check finds around the file's spawns.
    Spawn lines whose finding a `# noqa` suppressed are added to `used_noqa`; `reach` gets, per finding's (line,
    column), every function its thread runs (a per-thread fix counts only there)."""
    findings: List[Finding] = []
    enabled = graph.ctx.enabled
    checks = [(code, IN_THREAD_CHECKS[code]) for code in sorted(IN_THREAD_CHECKS) if code in enabled]
    judged = thread_hazards()
    threads: List[ThreadReach] = []
    for spawn in graph.spawns:
        if spawn.thread_class is not None and not linker.modules.is_thread_class(spawn.thread_class):
            continue
        thread = ThreadReach(graph, spawn, linker)
        threads.append(thread)
        for code, check in checks:
            if spawn.source not in check.sources:
                continue
            for finding in check.check(thread):
                if check.suppressed_at(spawn.line, spawn.noqa, used_noqa):
                    continue
                findings.append(finding)
                if reach is not None and code in judged and (PER_THREAD or AROUND_TRACE or SETTING_FIXES) \
                        and (spawn.line, spawn.column) not in reach:
                    reach[(spawn.line, spawn.column)] = thread.functions()
    for code, check in checks:
        around = check.after_spawns(graph, threads, used_noqa)
        findings.extend(around)
        if reach is not None and code in judged:
            for finding in around:
                functions = check.reach_of(graph, finding)
                if functions is not None:
                    reach[(finding.line or 0, finding.column or 0)] = functions
    return findings


def apply_fixes(findings: List[Finding], fixes: Sequence[AppliedFix],
               reach: Optional[Dict[Tuple[str, int, int], Reach]] = None,
               programs: Optional[Programs] = None) -> List[Finding]:
    """The thread rules' findings (DFD201, DFD203) under the mitigations their program applies: info with
    "mitigated by ..." when those cover every hazard of the program, otherwise the same severity saying what the
    fixes leave open or why a fix elsewhere does not count. Without `programs`, the findings' source is one
    program (scan_source)."""
    codes = thread_hazards()
    threads = [f for f in findings if f.code in codes and f.path is not None]
    thread_ids = {id(f) for f in threads}
    if not fixes or not threads:
        return findings
    located = [(os.path.abspath(f.path or ""), codes[f.code]) for f in threads]

    def hazards_of(closure: Optional[FrozenSet[str]]) -> FrozenSet:
        return frozenset(h for where, hazards in located if closure is None or where in closure for h in hazards)

    changed = []
    for finding in findings:
        if id(finding) not in thread_ids:
            changed.append(finding)
            continue
        key = (finding.path or "", finding.line or 0, finding.column or 0)
        verdicts = program_verdicts(finding.path or "", hazards_of, fixes, (reach or {}).get(key), programs,
                                    traces=finding.code == FX_TRACE_IN_THREAD.code)
        note, mitigated = describe(verdicts, named=programs is not None)
        if not note:
            changed.append(finding)
            continue
        applied = sorted({fix for v in verdicts for fix in v.fixes}, key=lambda f: (f.path, f.line))
        changed.append(SCAN_RULES[finding.code].rule.finding(
            f"{finding.message}; {note}", path=finding.path, line=finding.line, column=finding.column,
            evidence={**finding.evidence, "mitigations": {
                "applied": [f.to_dict() for f in applied], "mitigated": mitigated,
                "programs": [v.to_dict() for v in verdicts]}},
            severity=Severity.INFO if mitigated else finding.severity,  # a backend's warning stays one
        ))
    return changed


def unused_noqa(result: FileResult, enabled: FrozenSet[str]) -> List[Finding]:
    """DFD302: codes named in `# noqa:` comments that suppressed no finding of a rule that ran."""
    if UNUSED_NOQA.code not in enabled:
        return []
    findings = []
    for line, column, codes in result.noqa:
        for code in sorted(codes & enabled - {UNUSED_NOQA.code}):
            if (line, code) not in result.noqa_used:
                findings.append(UNUSED_NOQA.finding(
                    f"`# noqa: {code}` suppresses nothing: no {code} finding on this line",
                    path=result.path, line=line, column=column, evidence={"code": code}))
    return findings


def _load_graph(path: str, package: Optional[str], problems: List[Problem], max_bytes: int, roots: bool = False,
                ) -> Optional[ModuleGraph]:
    """Parse a file the prefilter skipped because a thread's call chain leads into it (or, with `roots`, because
    it may compile another file's flex_attention)."""
    data = read_bytes(path)
    parsed = data if isinstance(data, Problem) else parse_bytes(data, path, max_bytes)
    if isinstance(parsed, Problem):
        problems.append(Problem(parsed.subject, parsed.reason, "calls from threads into this file were not followed"))
        return None
    return analyse_tree(path, parsed.text, parsed.tree, frozenset(), package, graph=True, roots=roots)[1]


def _flex_enclosing(finding: Finding) -> Optional[FuncRef]:
    """The function a DFD202 finding is in, as the linker names it (None at module level)."""
    enclosing = finding.evidence.get("enclosing")
    if finding.code != FLEX_ATTENTION_UNCOMPILED.code or not enclosing or finding.path is None:
        return None
    return FuncRef(finding.path, enclosing)


def compiled_elsewhere(findings: List[Finding], files: Sequence[str], index: ModuleIndex, max_bytes: int
                       ) -> Tuple[List[Finding], List[str]]:
    """DFD202 decided project-wide: drop the findings whose function another scanned module compiles (a layer
    that a benchmark script wraps in torch.compile(Layer(...)), a model compiled by the trainer). Only files that
    mention `compile` and a pending function's name are parsed for their compile sites, and only when some
    DFD202 is pending. Returns the findings kept and the files parsed for this."""
    pending = [(finding, ref) for finding in findings if (ref := _flex_enclosing(finding)) is not None]
    if not pending:
        return findings, []
    anchors = {ref.qualname.split(".")[0].encode() for _, ref in pending}
    anchors |= {os.fsencode(os.path.splitext(os.path.basename(ref.path))[0]) for _, ref in pending}
    problems: List[Problem] = []
    modules = ProjectModules({}, index, load=lambda p: _load_graph(p, index.package(p), problems, max_bytes,
                                                                    roots=True))
    roots = []
    for path in files:
        data = read_bytes(path)
        if isinstance(data, Problem) or b"compile" not in data or not any(a in data for a in anchors):
            continue
        graph = modules.summary(path)
        if graph is not None:
            roots.extend(graph.compile_roots)
    covered = Linker(modules).reachable(roots) if roots else set()
    dropped = [finding for finding, ref in pending if ref in covered]
    kept = [f for f in findings if f not in dropped]
    for graph in modules.summaries.values():
        graph.ctx.table.release()
    return kept, list(modules.loaded)


def scan_paths(
    paths: Iterable[str],
    exclude: Sequence[str] = (),
    jobs: Optional[int] = None,
    select: Union[str, Sequence[str], None] = None,
    ignore: Union[str, Sequence[str], None] = None,
    *,
    config: ScanConfig = ScanConfig(),
    baseline: Optional[str] = None,
    max_bytes: int = MAX_SOURCE_BYTES,
    parallel_min_files: int = PARALLEL_MIN_FILES,
    clock: Callable[[], float] = time.perf_counter,
    transformers: VersionSource = installed_transformers,
) -> Report[ScanFacts]:
    """Scan files and folders for the DFD1xx-3xx hazards. Never imports or runs the scanned code.

    `select`/`ignore` replace the configuration's lists when given; `exclude` adds to its excludes. `baseline`
    is an earlier JSON report: findings whose fingerprint it holds are left out (facts["baseline"] counts them).
    """
    started = clock()
    paths = _checked_paths(paths, jobs)
    enabled = select_codes(select if select is not None else config.select,
                           ignore if ignore is not None else config.ignore)
    known = baseline_file.load(baseline) if baseline is not None else None
    scanned = _scanned_files(paths, exclude, config, max_bytes)
    analysed = _analyse_scanned(scanned, enabled, jobs, parallel_min_files, max_bytes, transformers)
    _add_syntax_problems(analysed.results, paths, max_bytes)
    problems = _Problems(scanned.discovery.problems)
    findings = _file_findings(analysed.results, enabled, problems)
    fixes = collect(r.fixes for r in analysed.results)
    findings, programs = _mitigated(findings, analysed.results, fixes, scanned, paths, config)
    # after the mitigations: judging them follows the programs' imports, and an import not followed is a problem
    problems.add(scanned.imports.problems)
    findings, loaded_for_flex = compiled_elsewhere(findings, scanned.files, scanned.index, max_bytes)
    per_file = [f for f in findings if f.path is None or f.code not in _per_file_ignored(config, f.path)]
    report: Report[ScanFacts] = Report("scan", problems=problems.items)
    report.findings, matched = baseline_file.apply(baseline_file.add_fingerprints(per_file), known)
    report.facts = _facts(paths, scanned, analysed, config, enabled, report.findings, _Outcome(
        ignored=len(findings) - len(per_file),
        baseline=None if known is None else _baseline_facts(baseline, known, matched, len(report.findings)),
        fixes=fixes, programs=programs, loaded_for_flex=loaded_for_flex, seconds=round(clock() - started, 3)))
    return report


def _checked_paths(paths: Iterable[str], jobs: Optional[int]) -> List[str]:
    """The paths as strings; a usage error for none at all or a --jobs below one (before any work is done)."""
    checked = [os.fspath(p) for p in paths]
    if not checked:
        raise UsageError("scan needs at least one PATH")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    return checked


@dataclass
class _Scanned:
    """The files one scan reads, and how their modules are found (one index over all of them)."""
    discovery: Discovery  # what walking the paths found (and skipped, and could not list)
    root: str  # the project root: imports are followed below it only
    index: ModuleIndex
    imports: Imports
    followed: List[str]  # files outside `paths` that the named files import
    files: List[str]  # the discovered files, then the followed ones


def _scanned_files(paths: Sequence[str], exclude: Sequence[str], config: ScanConfig, max_bytes: int) -> _Scanned:
    found = discover(paths, exclude, anchored=(config.root, config.exclude))
    root = program_files.project_root(paths, config.path)
    index = ModuleIndex(found.files, root)
    imports = Imports(index, max_bytes)
    # A file named on the command line is a program: the project files it imports are part of what is scanned
    # (`scan train.py` reads the src/model.py it imports). Folders are scanned as they are; their threads' call
    # chains still follow imports into the rest of the project.
    followed = _followed_imports([p for p in paths if not os.path.isdir(p)], found.files, imports)
    files = found.files + followed
    if followed:
        index = ModuleIndex(files, root)
        imports.index = index
    return _Scanned(found, root, index, imports, followed, files)


@dataclass
class _Analysed:
    """Every scanned file's analysis, and how it was run."""
    results: List[FileResult]
    loaded: List[str]  # files parsed only to follow call chains (a file once per worker that loaded it)
    workers: int
    transformers_version: Optional[str]


def _analyse_scanned(scanned: _Scanned, enabled: FrozenSet[str], jobs: Optional[int], parallel_min_files: int,
                     max_bytes: int, transformers: VersionSource) -> _Analysed:
    jobs = jobs or default_jobs()
    workers = jobs if len(scanned.files) >= parallel_min_files else 1
    items = [Work(p, scanned.index.packages[p]) for p in scanned.files]
    # the installed transformers' version decides DFD104 only: not looked up when that rule is off
    transformers_version = transformers() if HF_GRADIENT_CHECKPOINTING_IMPLICIT.code in enabled else None
    results, loaded = _analyse_all(items, enabled, workers, max_bytes, scanned.index, transformers_version)
    return _Analysed(results, loaded, workers, transformers_version)


def _add_syntax_problems(results: Sequence[FileResult], paths: Sequence[str], max_bytes: int) -> None:
    """A file named on the command line that the prefilter skipped is parsed after all (_syntax_problems says
    why)."""
    named = {os.path.abspath(p) for p in paths if not os.path.isdir(p)}
    for result in results:
        if not result.parsed and not result.problems and os.path.abspath(result.path) in named:
            result.problems.extend(_syntax_problems(result.path, max_bytes))


class _Problems:
    """The report's problems in the order met, each (subject, reason) once after the discovery's own: two workers
    may load one file for call chains, and both report it when it does not parse."""

    def __init__(self, first: Sequence[Problem]):
        self.items = list(first)
        self._seen = {(p.subject, p.reason) for p in first}

    def add(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            if (problem.subject, problem.reason) not in self._seen:
                self._seen.add((problem.subject, problem.reason))
                self.items.append(problem)


def _file_findings(results: Sequence[FileResult], enabled: FrozenSet[str], problems: _Problems) -> List[Finding]:
    """Every file's findings, then its unused noqa codes, file by file; its problems go to `problems`."""
    findings: List[Finding] = []
    for result in results:
        findings.extend(result.findings)
        findings.extend(unused_noqa(result, enabled))
        problems.add(result.problems)
    return findings


def _mitigated(findings: List[Finding], results: Sequence[FileResult], fixes: Sequence[AppliedFix],
               scanned: _Scanned, paths: Sequence[str], config: ScanConfig
               ) -> Tuple[List[Finding], Optional[Programs]]:
    """The findings under the fixes the scanned code applies (apply_fixes), and the programs that judged them.
    The programs (entry points, their import closures) are worked out only when a fix and a thread hazard are
    both there: that reads every scanned file for a __main__ guard."""
    reach = {(r.path, line, column): functions for r in results for (line, column), functions in r.thread_reach.items()}
    codes = thread_hazards()
    programs = None
    if fixes and any(f.code in codes for f in findings):
        entries = _entry_points(paths, scanned.files, config, scanned.root, scanned.index)
        programs = Programs(scanned.imports, entries, scanned.files)
    return apply_fixes(findings, fixes, reach, programs), programs


def _baseline_facts(baseline: Optional[str], known: Counter, matched: int, new: int) -> dict:
    return {"file": baseline, "matched": matched, "new": new, "fixed": sum(known.values()) - matched}


@dataclass
class _Outcome:
    """What the scan's later steps decided, for its facts."""
    ignored: int  # findings left out by per-file-ignores
    baseline: Optional[dict]  # _baseline_facts, when a baseline was given
    fixes: List[AppliedFix]
    programs: Optional[Programs]
    loaded_for_flex: List[str]  # files parsed to see whether another module compiles a flex_attention
    seconds: float


def _facts(paths: List[str], scanned: _Scanned, analysed: _Analysed, config: ScanConfig, enabled: FrozenSet[str],
           reported: Sequence[Finding], outcome: _Outcome) -> ScanFacts:
    """The report's facts, keys in the order the JSON report has always listed them."""
    results = analysed.results
    found = scanned.discovery
    programs = outcome.programs
    return {
        "paths": paths,
        "files": len(scanned.files),
        "parsed": sum(1 for r in results if r.parsed),
        "skipped_by_prefilter": sum(1 for r in results if not r.parsed and not r.problems),
        "loaded_for_call_chains": len(set(analysed.loaded)),
        "loaded_for_flex_coverage": len(outcome.loaded_for_flex),
        "jobs": analysed.workers,
        "skipped_folders": [s.to_dict() for s in found.skipped[:MAX_LISTED_SKIPS]],
        "skipped_folders_total": len(found.skipped),
        "config": config.path,
        "rules": sorted(enabled),
        "ignored_by_per_file_ignores": outcome.ignored,
        "baseline": outcome.baseline,
        "mitigations_applied": [f.to_dict() for f in outcome.fixes],
        "followed_imports": scanned.followed,
        "project_root": scanned.root,
        "entry_points": None if programs is None else [{"path": e.path, "how": e.how} for e in programs.entries],
        "transformers": analysed.transformers_version,
        "rule_counts": {code: sum(1 for f in reported if f.code == code) for code in sorted(enabled)},
        "seconds": outcome.seconds,
    }


def _followed_imports(named: Sequence[str], files: Sequence[str], imports: Imports) -> List[str]:
    """The project files the named files import, transitively, that the scan does not already read."""
    scanned = {os.path.abspath(p) for p in files}
    followed: Dict[str, str] = {}
    for path in named:
        for absolute, spelled in imports.closure(path).items():
            if absolute not in scanned and absolute not in followed:
                followed[absolute] = spelled
    return sorted(followed.values())


def _entry_points(paths: Sequence[str], files: Sequence[str], config: ScanConfig, root: str,
                  index: ModuleIndex) -> List[program_files.EntryPoint]:
    """The programs' entry points (scan/programs.py says in which order they are believed)."""
    if config.entry_points:
        return program_files.declared(config.entry_points, root, index, config.path or "pyproject.toml")
    named = [program_files.EntryPoint(p, "named on the command line") for p in paths if not os.path.isdir(p)]
    scripts = program_files.console_scripts(root, index)
    guarded = []
    for path in files:
        data = read_bytes(path)
        if os.path.basename(path) == "__main__.py":
            guarded.append(program_files.EntryPoint(path, "a package's __main__.py"))
        elif isinstance(data, bytes) and program_files.main_guarded(data):
            guarded.append(program_files.EntryPoint(path, "__main__ guard"))
    return named + scripts + guarded


def _syntax_problems(path: str, max_bytes: int) -> List[Problem]:
    """A file named on the command line is parsed even when no rule can fire on its bytes: one that does not
    parse (a SyntaxError, a TabError) was not checked, and saying "no findings" about it would be a false
    all-clear. Files found by walking a folder are left to the byte prefilter (parsing them all would cost the
    speed the prefilter buys)."""
    data = read_bytes(path)
    parsed = data if isinstance(data, Problem) else parse_bytes(data, path, max_bytes)
    return [parsed] if isinstance(parsed, Problem) else []


def _per_file_ignored(config: ScanConfig, path: str) -> FrozenSet[str]:
    if not config.per_file_ignores:
        return frozenset()
    return frozenset(config_file.ignored_codes(config, path, lambda spec: select_codes(spec)))


def scan_source(source: str, path: str = "<string>") -> List[Finding]:
    """Every scan finding in one piece of source (all rules, DFD201 within this source only), sorted.

    Raises ValueError when the source cannot be parsed (scan_paths reports that as a problem instead).
    """
    parsed = parse_text(source, path)
    if isinstance(parsed, Problem):
        raise ValueError(f"{path}: {parsed.reason}")
    enabled = frozenset(scan_codes())
    result, graph = analyse_tree(path, parsed.text, parsed.tree, enabled)
    # every rule is enabled, so the graph is always built
    spawned = link_spawns(graph, Linker(ProjectModules({path: graph})), result.noqa_used, result.thread_reach) \
        if graph is not None else []
    reach = {(path, line, column): functions for (line, column), functions in result.thread_reach.items()}
    findings = apply_fixes(list(result.findings) + spawned + unused_noqa(result, enabled), result.fixes, reach)
    return sorted(findings, key=Finding.sort_key)


def example_findings(text: str) -> List[Finding]:
    """A python rule example's findings (rules/registry.py EXAMPLE_RUNNERS)."""
    return scan_source(text, "<example>")
