"""Analyse one parsed file: walk its AST once (iteratively: deep files must not overflow the stack) and let
each enabled rule's checks look at the calls, assignments, dicts and scopes they care about.

Which checks run, on which lines, and whether the file's call graph is built all come from the rules' declarations
(rules/scan.py, `SCAN_RULES`); nothing here names a rule."""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple, Type

from dflash_doctor.findings import Finding, Problem
from dflash_doctor.rules.scan import SCAN_RULES
from dflash_doctor.scan.applied import AppliedFix
from dflash_doctor.scan.callgraph import COMPILE_WORDS, ModuleGraph
from dflash_doctor.scan.checkpointing import CheckpointRule
from dflash_doctor.scan.context import MAX_FINDINGS_PER_FILE, FileContext, NoqaDirective, noqa_directives
from dflash_doctor.scan.dynamo_config import DynamoConfigRule
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.fixes import FixCollector
from dflash_doctor.scan.flex import FlexAttentionRule
from dflash_doctor.scan.library_switches import LibrarySwitchRule
from dflash_doctor.scan.scopes import SCOPE_NODES, Scope, walk
from dflash_doctor.scan.in_thread import COLLECTORS
from dflash_doctor.scan.threads import SpawnCollector, TraceCollector
from dflash_doctor.scan.trainer_compile import TrainerCompileRule


@dataclass
class FileResult:
    path: str
    findings: List[Finding] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    parsed: bool = False
    fixes: List[AppliedFix] = field(default_factory=list)  # mitigations this file applies (for DFD201)
    noqa: List[NoqaDirective] = field(default_factory=list)  # its `# noqa: DFDxxx` comments
    noqa_used: Set[Tuple[int, str]] = field(default_factory=set)  # (line, code) they suppressed
    # per thread finding's (line, column): the functions its thread runs, as (absolute path, qualname)
    thread_reach: Dict[Tuple[int, int], FrozenSet[Tuple[str, str]]] = field(default_factory=dict)


# Every check, imported: a rule's declaration names its checks as "module.Class" (the rule table cannot import them,
# they import it), and each name is looked up here. A new check class is one entry; the collectors of the in-thread
# checks (scan/in_thread/) come with their package.
CHECK_CLASSES: Dict[str, Type[FileCheck]] = {
    f"{check.__module__.rpartition('.')[2]}.{check.__name__}": check
    for check in (CheckpointRule, DynamoConfigRule, FixCollector, FlexAttentionRule, SpawnCollector, TraceCollector,
                  TrainerCompileRule, LibrarySwitchRule) + COLLECTORS
}


def _check_class(name: str) -> Type[FileCheck]:
    """A check named in a rule's declaration ("module.Class" under dflash_doctor.scan)."""
    found = CHECK_CLASSES.get(name)
    if found is None:
        raise TypeError(f"{name} is not a FileCheck in scan/analysis.py CHECK_CLASSES")
    return found


# code -> the classes of the checks that report it, once
CHECKS: Dict[str, Tuple[Type[FileCheck], ...]] = {
    code: tuple(_check_class(name) for name in entry.checks) for code, entry in SCAN_RULES.items()}


@dataclass(frozen=True)
class _Plan:
    """What analysing a file for a set of enabled rules takes, derived once per set."""
    checks: Tuple[Type[FileCheck], ...]  # each once, in code order
    words: FrozenSet[str]  # whose lines are candidates
    graph: bool  # some check needs the call graph
    compile_sites: bool  # some check needs the file's compile sites


@functools.lru_cache(maxsize=None)
def _plan(enabled: FrozenSet[str]) -> _Plan:
    codes = sorted(enabled)
    checks = tuple(dict.fromkeys(check for code in codes for check in CHECKS[code]))
    return _Plan(checks, frozenset(word for code in codes for word in SCAN_RULES[code].words),
                 any(check.needs_graph for check in checks), any(check.needs_compile_sites for check in checks))


def builds_graph(enabled: FrozenSet[str]) -> bool:
    """Whether analysing a file for `enabled` builds its call graph (which the engine then links across files)."""
    plan = _plan(enabled)
    return plan.graph or plan.compile_sites


Visit = Callable[[Any, Scope], None]  # each check takes its own kind of node


def _hooks(checks: Sequence[FileCheck], method: str) -> List[Visit]:
    """The checks' `method`s, leaving out those that kept FileCheck's (empty) one."""
    base = getattr(FileCheck, method)
    return [getattr(check, method) for check in checks if getattr(type(check), method) is not base]


_ALIAS = re.compile(r"\bas\s+(\w+)")
_LEFT = re.compile(r"^[\w\s,.\[\]*]+$")  # assignment targets; no "(" so `f(x=1)` keywords are not taken
_NOT_ALIASES = frozenset({"self", "cls"})


# What an alias's right-hand side looks like: a plain (dotted) name, a partial of something, an instance of a
# thread pool or thread (whose methods start threads), or a choice between two names. `y = checkpoint(f, x)` binds a result, not an alias: taking
# such names made the candidate search grow with every call of a big file.
_ALIAS_VALUE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\s*(?:#.*)?$|(?:functools\s*\.\s*)?partial\s*\("
                          r"|[\w.]*(?:ThreadPoolExecutor|ThreadPool|Pool|Thread|Timer)\s*\("
                          # `enable = getattr(model, "gradient_checkpointing_enable")`: a method fetched by name
                          r"|getattr\s*\("
                          # `attend = flex_attention if use_flex else sdpa`: an alias on one of its paths
                          r"|[A-Za-z_][\w.]*\s+if\s+[^=]+?\s+else\s+[A-Za-z_][\w.]*\s*(?:#.*)?$)")


def _assigned_names(line: str) -> List[str]:
    """Names on the left of a plain `=` (`a, self.b = ...`, `c: T = ...`) whose value may be an alias; [] for
    other lines."""
    position = line.find("=")
    while position > 0 and (line[position - 1] in "=!<>+-*/%&|^@:" or line[position + 1: position + 2] == "="):
        position = line.find("=", position + 2)
    if position <= 0 or not _ALIAS_VALUE.match(line[position + 1:]):
        return []
    left = line[:position].split(":", 1)[0]
    if not _LEFT.match(left):
        return []
    return re.findall(r"[A-Za-z_]\w*", left)


# Up to this many names are searched with one regex alternation; more (a generated file binding thousands of
# names on candidate lines) switch to a word index of the file, so the search stays linear in its size.
_MAX_ALTERNATION = 32
_WORD = re.compile(r"[A-Za-z_]\w*")
_FIXED_POINT_ROUNDS = 4


def line_starts(text: str) -> List[int]:
    """Offsets where each line begins (what bisect maps offsets to 1-based line numbers with)."""
    starts = [0]
    position = text.find("\n")
    while position != -1:
        starts.append(position + 1)
        position = text.find("\n", position + 1)
    return starts


def _word_lines(text: str, word: str) -> Dict[int, Tuple[int, int]]:
    """Lines where `word` occurs as a whole word, with each line's (start, end) offsets. str.find and str.count
    run in C; after a hit the search jumps to the next line, so a word repeated on one line costs one step, and no
    table of line starts is built (a regex alternation, then that table, were the costliest parts of a scan)."""
    found: Dict[int, Tuple[int, int]] = {}
    size = len(word)
    line, counted = 1, 0  # line number at offset `counted`
    position = text.find(word)
    while position != -1:
        end = position + size
        if (position == 0 or not _is_word_char(text[position - 1])) and (
                end == len(text) or not _is_word_char(text[end])):
            line += text.count("\n", counted, position)
            begin = text.rfind("\n", 0, position) + 1
            stop = text.find("\n", position)
            stop = len(text) if stop == -1 else stop + 1
            found[line] = (begin, stop)
            counted = position
            position = stop
        else:
            position = end
        position = text.find(word, position)
    return found


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def candidate_lines(text: str, words: Iterable[str]) -> Tuple[List[int], FrozenSet[str]]:
    """Sorted numbers of the lines that mention `words` or a name bound on such a line (`as ckpt`,
    `ckpt = partial(checkpoint, ...)`), followed to a fixed point, and those names: a rule's call can only
    start on such a line.

    Each round searches only the names the previous round found, and each line is read once, so the cost is
    linear in the size of the file whatever the number of names."""
    names = set(words)
    if not names:
        return [], frozenset()
    spans: Dict[int, Tuple[int, int]] = {}  # line -> (start, end) offsets of every candidate line
    word_lines: Optional[dict] = None
    new = set(names)
    for _ in range(_FIXED_POINT_ROUNDS):
        if not new:
            break
        if word_lines is None and len(new) <= _MAX_ALTERNATION:
            lines: Dict[int, Tuple[int, int]] = {}
            for word in new:
                lines.update(_word_lines(text, word))
        else:
            if word_lines is None:
                starts = line_starts(text)
                word_lines = {}
                line, next_start = 1, starts[1] if len(starts) > 1 else len(text) + 1
                for match in _WORD.finditer(text):
                    while match.start() >= next_start:
                        line += 1
                        next_start = starts[line] if line < len(starts) else len(text) + 1
                    word_lines.setdefault(match.group(), {})[line] = (
                        starts[line - 1], starts[line] if line < len(starts) else len(text))
            lines = {}
            for name in new:
                lines.update(word_lines.get(name, {}))
        fresh = {number: span for number, span in lines.items() if number not in spans}
        spans.update(fresh)
        found = set()
        for begin, stop in fresh.values():
            line_text = text[begin:stop]
            if " as " in line_text:
                found.update(_ALIAS.findall(line_text))
            if "=" in line_text:
                found.update(_assigned_names(line_text))
        new = found - names - _NOT_ALIASES
        names |= new
    return sorted(spans), frozenset(names)


def analyse_tree(
    path: str, text: str, tree: ast.Module, enabled: FrozenSet[str], package: Optional[str] = None,
    graph: bool = False, transformers_version: Optional[str] = None, roots: bool = False,
) -> Tuple[FileResult, Optional[ModuleGraph]]:
    """Findings of the `enabled` rules in one parsed file, and its call graph when an enabled rule's check needs
    it or `graph` asks for it (a file a thread's call chain leads into). `roots` collects the file's compile sites
    without judging anything (another file's flex_attention may be compiled here)."""
    plan = _plan(enabled)
    roots = roots or plan.compile_sites
    graph = graph or roots or plan.graph
    compile_lines, compile_names = candidate_lines(text, COMPILE_WORDS) if graph else ([], frozenset())
    lines, _ = candidate_lines(text, plan.words)
    if roots:
        lines = sorted(set(lines) | set(compile_lines))
    ctx = FileContext(path, text, tree, enabled, package, lines, compile_names, transformers_version)
    module_graph = ModuleGraph(ctx) if graph else None
    checks = [check(ctx, module_graph) for check in plan.checks]
    on_call, on_assign, on_dict, on_scope = (_hooks(checks, method) for method in (
        "visit_call", "visit_assign", "visit_dict", "visit_scope"))
    if module_graph is not None and roots:
        on_call.append(module_graph.visit_call)
        on_scope.append(module_graph.visit_scope)
    for node, scope in walk(ctx.table, lines):
        if isinstance(node, ast.Call):
            for visit in on_call:
                visit(node, scope)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for visit in on_assign:
                visit(node, scope)
        elif isinstance(node, ast.Dict):
            for visit in on_dict:
                visit(node, scope)
        elif isinstance(node, SCOPE_NODES):
            for visit in on_scope:
                visit(node, scope)
    for check in checks:
        check.finish()
    if module_graph is None:
        ctx.table.release()
    problems = [Problem(path, f"{ctx.unlisted:,} more findings not listed: a file lists at most "
                        f"{MAX_FINDINGS_PER_FILE:,}", "generated code? exclude it with --exclude")] if ctx.unlisted else []
    result = FileResult(path, ctx.findings, problems, parsed=True, fixes=ctx.fixes, noqa=noqa_directives(text),
                        noqa_used=ctx.used_noqa)
    return result, module_graph
