"""Programs: which entry point a thread belongs to, what that program imports, and so which fixes count for it.

A fix is part of the process that runs it: `runtime.install_threadlocal_fx_flag()` in one trainer does nothing for
another trainer in the same tree. A program is an entry point and the project files it imports (transitively).
Entry points are, in this order of authority: `entry-points` in `[tool.dflash-doctor]` (then only those), else the
files named on the command line, the console scripts of `[project.scripts]` whose module is scanned, `__main__.py`
files and files with an `if __name__ == "__main__":` guard. A thread whose file no entry point imports belongs to the programs of the files
that import it (the topmost ones), or, imported by nothing, to its own file.

Imports are read from the AST (never executed) and followed only inside the project root; an import that names a
project module which is not there, or a relative import that leads nowhere, is a Problem: what it would have
brought into the program was not judged.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Problem
from dflash_doctor.scan.module_index import ModuleIndex
from dflash_doctor.scan.scopes import resolve_relative
from dflash_doctor.scan.source_file import MAX_SOURCE_BYTES, parse_bytes, read_bytes

from dflash_doctor.scan.fixes import AppliedFix, Verdict, judge

if TYPE_CHECKING:
    from dflash_doctor.hazards import Hazard

# What marks a project's top folder (the nearest one above the scanned paths); without one, their common folder.
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# Files one import closure may hold: a closure that would be larger (a program importing all of a huge tree)
# stops there, and the scan says so.
MAX_PROGRAM_FILES = 3000
_MAIN_GUARD = re.compile(rb"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")
_STATEMENT_LISTS = ("body", "orelse", "handlers", "finalbody", "cases")


def project_root(paths: Sequence[str], config_path: Optional[str] = None) -> str:
    """The folder imports are followed within: the configuration's folder, else the nearest folder above the
    scanned paths that holds a project marker, else their common folder."""
    if config_path:
        return os.path.dirname(os.path.abspath(config_path))
    absolute = [os.path.abspath(p) for p in paths] or [os.getcwd()]
    try:
        common = os.path.commonpath(absolute)
    except ValueError:  # different Windows drives
        common = absolute[0]
    if not os.path.isdir(common):
        common = os.path.dirname(common)
    folder = common
    while True:
        if any(os.path.exists(os.path.join(folder, marker)) for marker in PROJECT_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return common
        folder = parent


@dataclass(frozen=True)
class EntryPoint:
    path: str
    how: str  # why it is one, in words ("__main__ guard", "console script train", ...)


def _statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement, nested ones too (imports inside functions and `if` blocks count), no expressions."""
    stack: List[ast.stmt] = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        yield node
        for name in _STATEMENT_LISTS:
            children = getattr(node, name, None)
            if isinstance(children, list):
                for child in reversed(children):
                    if isinstance(child, ast.stmt):
                        stack.append(child)
                    elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        stack.extend(reversed(child.body))


class Imports:
    """The project files each file imports, read once per file."""

    def __init__(self, index: ModuleIndex, max_bytes: int = MAX_SOURCE_BYTES):
        self.index = index
        self.max_bytes = max_bytes
        self._imports: Dict[str, Tuple[str, ...]] = {}
        self.problems: List[Problem] = []

    def _unfollowed(self, path: str, line: int, name: str, why: str) -> None:
        self.problems.append(Problem(
            path, f"line {line}: project import {name} not followed: {why}",
            "threads, compiled calls and fixes behind it were not judged; scan the folder that holds it, or "
            "declare the program in [tool.dflash-doctor] entry-points"))

    def of(self, path: str) -> Tuple[str, ...]:
        """The project files `path` imports (modules, their packages' __init__.py, `from pkg import module`)."""
        if path in self._imports:
            return self._imports[path]
        self._imports[path] = ()
        data = read_bytes(path)
        parsed = data if isinstance(data, Problem) else parse_bytes(data, path, self.max_bytes)
        if isinstance(parsed, Problem):
            return ()  # the scan reports it where the file itself is scanned
        found: List[str] = []
        package = self.index.package(path)
        for node in _statements(parsed.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.extend(self._absolute(alias.name, path, node.lineno, ()))
            elif isinstance(node, ast.ImportFrom):
                names = tuple(alias.name for alias in node.names if alias.name != "*")
                if node.level:
                    base = resolve_relative(node.level, node.module, package)
                    shown = "." * node.level + (node.module or "")
                    if base is None:
                        self._unfollowed(path, node.lineno, shown, "it leads above the top package")
                        continue
                    files = self._module(base, path, names)
                    if not files:
                        self._unfollowed(path, node.lineno, shown, f"no module {base} in the project")
                    found.extend(files)
                elif node.module:
                    found.extend(self._absolute(node.module, path, node.lineno, names))
        result = tuple(dict.fromkeys(f for f in found if os.path.abspath(f) != os.path.abspath(path)))
        self._imports[path] = result
        return result

    def _module(self, dotted: str, importer: str, names: Tuple[str, ...]) -> List[str]:
        """The files importing `dotted` (and `from dotted import names`) runs: its packages' __init__.py, the
        module, and any of `names` that is a submodule."""
        parts = dotted.split(".")
        files = [f for cut in range(1, len(parts) + 1) if (f := self.index.find(".".join(parts[:cut]), importer))]
        if not files or self.index.find(dotted, importer) is None:
            return []
        for name in names:
            sub = self.index.find(f"{dotted}.{name}", importer)
            if sub is not None:
                files.append(sub)
        return files

    def _absolute(self, dotted: str, importer: str, line: int, names: Tuple[str, ...]) -> List[str]:
        files = self._module(dotted, importer, names)
        if files:
            return files
        top = dotted.split(".")[0]
        # Only a module whose top package is part of the project can be missing from it: `import torch` from a
        # trainer is somebody else's code, found or not (installed packages are never followed, nor a problem).
        if self._project_package(top, importer) and not self.index.exists_on_disk(dotted, importer):
            self._unfollowed(importer, line, dotted, f"{top} is part of the project, {dotted} is not there")
        return []

    def _project_package(self, top: str, importer: str) -> bool:
        """A module or package of the project: a `top.py`, a `top/__init__.py`, or a folder of sources (a
        namespace package); a folder of data that shares an installed package's name is not one."""
        if self.index.find(top, importer) is not None:
            return True
        for folder in self.index.search_folders(importer):
            candidate = os.path.join(folder, top)
            try:
                if self.index.inside(candidate) and os.path.isdir(candidate) and any(
                        name.endswith(".py") for name in os.listdir(candidate)):
                    return True
            except OSError:
                continue
        return False

    def closure(self, start: str, limit: int = MAX_PROGRAM_FILES) -> Dict[str, str]:
        """`start` and every project file it imports, transitively: absolute path -> the path as spelled, at
        most `limit` files."""
        seen: Dict[str, str] = {os.path.abspath(start): start}
        queue = [start]
        while queue:
            current = queue.pop()
            for imported in self.of(current):
                key = os.path.abspath(imported)
                if key in seen:
                    continue
                if len(seen) >= limit:
                    self.problems.append(Problem(
                        start, f"import closure stopped at {limit:,} files",
                        "declare the program's entry points in [tool.dflash-doctor] entry-points"))
                    return seen
                seen[key] = imported
                queue.append(imported)
        return seen


def main_guarded(data: bytes) -> bool:
    return b"__main__" in data and _MAIN_GUARD.search(data) is not None


def console_scripts(root: str, index: ModuleIndex) -> List[EntryPoint]:
    """`[project.scripts]` of the root's pyproject.toml, each resolved to the file of its module, when that file
    is scanned."""
    pyproject = os.path.join(root, "pyproject.toml")
    if not os.path.isfile(pyproject):
        return []
    from dflash_doctor.scan.config import _load_toml

    try:
        document = _load_toml(pyproject)
    except UsageError:
        return []  # the configuration lookup reports a broken pyproject.toml; scripts are a bonus
    project = document.get("project")
    scripts = project.get("scripts") if isinstance(project, dict) else None
    found = []
    for name, spec in (scripts.items() if isinstance(scripts, dict) else ()):
        module = str(spec).split(":", 1)[0].strip()
        path = index.find(module, pyproject) if module else None
        # only a script among the scanned files: one outside them would add its whole package to every closure
        if path is not None and os.path.abspath(path) in index.by_abspath:
            found.append(EntryPoint(path, f"console script {name}"))
    return found


def declared(specs: Sequence[str], root: str, index: ModuleIndex, config_path: str) -> List[EntryPoint]:
    """`entry-points` of [tool.dflash-doctor]: files relative to the configuration's folder, or modules
    (`pkg.cli` or `pkg.cli:main`). One that names nothing is a usage error."""
    found = []
    for spec in specs:
        path = os.path.join(root, spec)
        if os.path.isfile(path):
            found.append(EntryPoint(index.by_abspath.get(os.path.abspath(path), path), "declared in entry-points"))
            continue
        module = spec.split(":", 1)[0].strip()
        resolved = index.find(module, os.path.join(root, "pyproject.toml")) if module else None
        if resolved is None:
            raise UsageError(f"{config_path}: [tool.dflash-doctor] entry-points: {spec!r} is neither a file "
                             f"nor a module under {root}")
        found.append(EntryPoint(resolved, "declared in entry-points"))
    return found


class Programs:
    """The entry points of a scan and the programs (closures) that hold a given file."""

    def __init__(self, imports: Imports, entries: Sequence[EntryPoint], candidates: Iterable[str]):
        self.imports = imports
        self.entries = list({os.path.abspath(e.path): e for e in entries}.values())
        self._candidates = list(candidates)  # files that may import a thread's file (the scanned ones)
        self._closures: Dict[str, FrozenSet[str]] = {}
        self._tops: Dict[str, List[str]] = {}

    def closure(self, path: str) -> FrozenSet[str]:
        """Absolute paths of `path` and the project files it imports."""
        key = os.path.abspath(path)
        if key not in self._closures:
            self._closures[key] = frozenset(self.imports.closure(path))
        return self._closures[key]

    def of(self, path: str) -> List[EntryPoint]:
        """The programs `path` is part of: the entry points whose closure holds it; else the topmost files that
        import it; else the file itself."""
        key = os.path.abspath(path)
        holding = [e for e in self.entries if key in self.closure(e.path)]
        if holding:
            return holding
        importers = self._importers(path)
        if importers:
            return [EntryPoint(p, f"imports {path}") for p in importers]
        return [EntryPoint(path, "its own file (nothing scanned imports it)")]

    def _importers(self, path: str) -> List[str]:
        """Scanned files whose closure holds `path` and that no other such file imports (the tops); once per
        file, however many threads it starts."""
        key = os.path.abspath(path)
        if key not in self._tops:
            self._tops[key] = self._find_importers(path)
        return self._tops[key]

    def _find_importers(self, path: str) -> List[str]:
        key = os.path.abspath(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem == "__init__":
            stem = os.path.basename(os.path.dirname(os.path.abspath(path)))
        word = stem.encode()
        holders = []
        for candidate in self._candidates:
            if os.path.abspath(candidate) == key:
                continue
            data = read_bytes(candidate)
            if not isinstance(data, bytes) or word not in data:
                continue
            if key in self.closure(candidate):
                holders.append(candidate)
        return [h for h in holders
                if not any(os.path.abspath(h) in self.closure(o) for o in holders if o != h)]


# -- judging thread findings per program ------------------------------------------------------------------------

Reach = FrozenSet[Tuple[str, str]]  # (absolute path, qualname) of every function a thread's target runs
HazardsOf = Callable[[Optional[FrozenSet[str]]], FrozenSet["Hazard"]]  # a program's files -> what its threads risk


@dataclass(frozen=True)
class ProgramVerdict:
    entry: EntryPoint
    fixes: Tuple[AppliedFix, ...]  # the fixes that count for it
    left_out: Tuple[Tuple[AppliedFix, str], ...]  # the others, with why
    verdict: Verdict

    def to_dict(self) -> dict:
        return {"entry": self.entry.path, "how": self.entry.how, "mitigated": self.verdict.mitigated,
                "applied": [f.to_dict() for f in self.fixes]}


def left_out(fix: AppliedFix, closure: Optional[FrozenSet[str]], reach: Optional[Reach], traces: bool = False) -> str:
    """Why an applied fix does not count for a thread ("" when it does): it is in a file outside the thread's
    program, it is a per-thread switch that the thread never enters (a call in the main thread; torch's own
    compile settings are per thread from 2.12), or, for a
    finding about an FX trace (`traces`), a lock the tracing code must hold around its trace and does not."""
    where = os.path.abspath(fix.path)
    if closure is not None and where not in closure:
        return "not part of this program"
    inside = reach is not None and (where, fix.enclosing) in reach
    if fix.setting and not inside:
        return ("a torch compile setting assigned outside this thread: from torch 2.12 each thread keeps its own "
                "(a ContextVar), so this thread reads the default")
    if fix.per_thread and not inside:
        return "a per-thread switch this thread does not enter"
    if traces and fix.around_trace and not inside:
        return "not held around this FX trace"
    return ""


def program_verdicts(path: str, hazards_of: HazardsOf, fixes: Sequence[AppliedFix], reach: Optional[Reach],
                     programs: Optional[Programs], traces: bool = False) -> List[ProgramVerdict]:
    """The verdict in each program that holds the thread found in `path` (one pseudo-program, the scanned
    source, without `programs`)."""
    entries = programs.of(path) if programs is not None else [EntryPoint(path, "the scanned source")]
    verdicts = []
    for entry in entries:
        closure = programs.closure(entry.path) if programs is not None else None
        reasons = [(fix, left_out(fix, closure, reach, traces)) for fix in fixes]
        if traces:
            # a lock held around the trace stops the race only if the workers' steps take it too: the same fix
            # applied, with another of its markers, elsewhere in the program
            in_program = [f for f in fixes if left_out(f, closure, None) in ("", "not held around this FX trace")]
            reasons = [(fix, why or ("" if not fix.around_trace or any(
                other.mitigation == fix.mitigation and other.spelled != fix.spelled for other in in_program)
                else f"held around this FX trace, but nothing else in the program takes it ({fix.mitigation})"))
                if not why else (fix, why) for fix, why in reasons]
        applied = tuple(fix for fix, why in reasons if not why)
        verdicts.append(ProgramVerdict(entry, applied, tuple((f, why) for f, why in reasons if why),
                                       judge(applied, hazards_of(closure))))
    return verdicts


def describe(verdicts: Sequence[ProgramVerdict], named: bool) -> Tuple[str, bool]:
    """The note a thread finding gets ("" when no fix is applied anywhere), and whether it is mitigated: in
    every program that holds it. `named`: say which program (a scan of files; not a single source)."""
    failing = next((v for v in verdicts if not v.verdict.mitigated), None)
    if failing is None:
        notes = [v.verdict.note + (f" in the program of {v.entry.path} ({v.entry.how})" if named else "")
                 for v in verdicts]
        return "; ".join(notes), True
    program = f"the program of {failing.entry.path} ({failing.entry.how})"
    by_reason: Dict[str, List[str]] = {}
    for fix, why in failing.left_out:
        by_reason.setdefault(why, []).append(f"{fix.mitigation} ({fix.path}:{fix.line})")
    ignored = "; ".join(f"{', '.join(fixes)}: {why}" for why, fixes in by_reason.items())
    if failing.verdict.note:
        return failing.verdict.note + (f", in {program}" if named else "") + (
            f" ({ignored})" if ignored else ""), False
    if not ignored:
        return "", False
    return f"not mitigated{' in ' + program if named else ''}: {ignored}", False
