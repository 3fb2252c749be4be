"""Which of the registry's mitigations the scanned program applies (for DFD201), found by resolved names.

The markers are the registry's `source_markers` (dflash_doctor/mitigations.py): calls and decorators that resolve
to `dflash_doctor.runtime.<marker>` (under any alias), plus torch's own switch for non-lazy backward
(`torch._functorch.config.force_non_lazy_backward_lowering = True`, setattr or config.patch). A project-local
function that merely shares a marker's name (an LR `warmup()`) resolves elsewhere and does not count.
"""
from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from dflash_doctor.compile_settings import SETTINGS
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import REGISTRY, Mitigation
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD, SCAN_RULES, TORCH_SWITCHES
from dflash_doctor.scan.applied import AROUND_TRACE, PER_THREAD, AppliedFix  # noqa: F401 - engine.py reads them here
from dflash_doctor.scan.context import Located
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.scopes import SCOPE_NODES, Scope

RUNTIME_PACKAGE = "dflash_doctor"
FUNCTORCH_CONFIG = "torch._functorch.config"
# marker -> mitigation name, from the registry
MARKERS: Dict[str, str] = {marker: m.name for m in REGISTRY for marker in m.source_markers}
# A marker that is a torch config key rather than a runtime function: applied by setting it to True. Such a
# setting reaches only the thread that assigns it from torch 2.12 on (compile_settings.py), so it counts per thread.
CONFIG_MARKERS = frozenset(marker for marker in MARKERS if any(s.key == marker for s in SETTINGS))
# The fixes a torch compile setting applies (the engine records what each thread runs when one is there).
SETTING_FIXES = frozenset(MARKERS[marker] for marker in CONFIG_MARKERS)
# What DFD201 needs stopped before a compiled call in a thread is safe.
DFD201_HAZARDS: FrozenSet[Hazard] = SCAN_RULES[COMPILED_CALL_IN_THREAD.code].hazards


class FixCollector(FileCheck):
    """The mitigations a file applies, into `ctx.fixes` (the engine judges DFD201 under all of them)."""

    def __init__(self, ctx, graph) -> None:
        super().__init__(ctx, graph)
        self._columns: Dict[int, int] = {}  # index in ctx.fixes -> the column of the node that applied it

    def _runtime_marker(self, expr: ast.AST, scope: Scope, line: int) -> Optional[str]:
        final = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
        if final is None:
            return None
        dotted = self.ctx.resolver.dotted(expr, scope, line) or ""
        name = dotted.rsplit(".", 1)[-1]
        if name in MARKERS and name not in CONFIG_MARKERS and dotted.startswith(RUNTIME_PACKAGE + "."):
            return name
        return None

    def _add(self, marker: str, node: Located, scope: Optional[Scope] = None) -> None:
        if marker in CONFIG_MARKERS and (self.ctx.table.package or "").startswith(RUNTIME_PACKAGE + "."):
            return  # the tool's runtime setting the switch on behalf of its API: the API's calls are the fix
        enclosing = _function_of(scope)
        self._columns[len(self.ctx.fixes)] = node.col_offset  # finish() matches `with` items by position
        self.ctx.fixes.append(AppliedFix(MARKERS[marker], self.ctx.path, node.lineno, marker, enclosing,
                                         setting=marker in CONFIG_MARKERS))

    def _torch_switch(self, node: ast.Call, scope: Scope) -> Optional[str]:
        """`torch.autograd.set_multithreading_enabled(False)` (any alias, `mode=False`): a torch function of a
        registry marker's name called with the one literal that applies the fix."""
        func = node.func
        final = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if final not in TORCH_SWITCHES or final not in MARKERS:
            return None
        dotted = self.ctx.resolver.dotted(func, scope, node.lineno) or ""
        if not dotted.startswith("torch.") or dotted.rsplit(".", 1)[-1] != final:
            return None
        value = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"), None)
        wanted = TORCH_SWITCHES[final]
        if isinstance(value, ast.Constant) and type(value.value) is type(wanted) and value.value == wanted:
            return final
        return None

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        marker = self._runtime_marker(node.func, scope, node.lineno) or self._torch_switch(node, scope)
        if marker is not None:
            self._add(marker, node, scope)
            return
        resolver = self.ctx.resolver
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) == 3:
            key = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            if key in CONFIG_MARKERS and _true(node.args[2]) \
                    and resolver.dotted(node.args[0], scope, node.lineno) == FUNCTORCH_CONFIG:
                self._add(key, node, scope)
        elif isinstance(func, ast.Attribute) and func.attr == "patch" \
                and resolver.dotted(func.value, scope, node.lineno) == FUNCTORCH_CONFIG:
            for keyword in node.keywords:
                if keyword.arg in CONFIG_MARKERS and _true(keyword.value):
                    self._add(keyword.arg, node, scope)

    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        value = node.value
        if not self.ctx.on_candidate_line(node) or value is None:
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in CONFIG_MARKERS and _true(value) \
                    and self.ctx.resolver.dotted(target.value, scope, node.lineno) == FUNCTORCH_CONFIG:
                self._add(target.attr, node, scope)

    def finish(self) -> None:
        """A runtime marker entered with `with` is the per-thread form of its fix (the entering thread only)."""
        runtime = [i for i, fix in enumerate(self.ctx.fixes) if not fix.setting and fix.path == self.ctx.path]
        if not runtime:
            return
        entered = {(item.context_expr.lineno, item.context_expr.col_offset) for node in ast.walk(self.ctx.table.tree)
                   if isinstance(node, (ast.With, ast.AsyncWith)) for item in node.items
                   if isinstance(item.context_expr, ast.Call)}
        for index in runtime:
            fix = self.ctx.fixes[index]
            if (fix.line, self._columns.get(index, -1)) in entered:
                self.ctx.fixes[index] = dataclasses.replace(fix, entered=True)

    def visit_scope(self, node: ast.AST, outer: Scope) -> None:
        """`@runtime.global_lock` on a step function applies the lock as surely as calling it."""
        for decorator in getattr(node, "decorator_list", ()):
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            marker = self._runtime_marker(target, outer, decorator.lineno)
            if marker is not None:
                # a decorated function applies the fix wherever it runs: it counts as inside that function
                self._add(marker, decorator, self.ctx.table.scope_for(node, outer)
                          if isinstance(node, SCOPE_NODES) else outer)


def _function_of(scope: Optional[Scope]) -> str:
    """The qualname of the function `scope` is (or is in); "" at module or class level."""
    while scope is not None and scope.kind not in ("function", "lambda"):
        scope = scope.parent
    return scope.qualname if scope is not None else ""


def _true(value: ast.AST) -> bool:
    return isinstance(value, ast.Constant) and value.value is True


@dataclass(frozen=True)
class Verdict:
    """What the applied fixes mean for DFD201."""

    applied: Tuple[str, ...]  # registry names, registry order
    mitigated: bool
    note: str  # appended to each DFD201 message ("" when nothing is applied)


def judge(fixes: Sequence[AppliedFix], needed: FrozenSet[Hazard] = DFD201_HAZARDS) -> Verdict:
    """Mitigated when the applied fixes cover every `needed` hazard (a program's: DFD201's, plus the patcher race
    where a thread traces with FX) and none is one the registry calls no fix."""
    first: Dict[str, AppliedFix] = {}
    for fix in sorted(fixes, key=lambda f: (f.path, f.line)):
        first.setdefault(fix.mitigation, fix)
    entries: List[Mitigation] = [m for m in REGISTRY if m.name in first]
    if not entries:
        return Verdict((), False, "")
    names = tuple(m.name for m in entries)
    where = ", ".join(f"{m.name} ({first[m.name].path}:{first[m.name].line})" for m in entries)
    covered = frozenset(h for m in entries for h in m.covers)
    gaps = [h for h in Hazard if h in needed - covered]
    not_fixes = [m for m in entries if not m.recommended]
    if not gaps and not not_fixes:
        return Verdict(names, True, f"mitigated by {where}")
    left: List[str] = []
    if gaps:
        left.append("leaves open: " + ", ".join(h.label for h in gaps))
    for m in not_fixes:
        left.append(f"{m.name} is not a fix ({m.summary})")
    caveats = [_caveat(m, names) for m in entries]
    said = "; ".join(c for c in caveats if c)
    return Verdict(names, False, f"applies {where}, not enough: " + "; ".join(left) + (f" ({said})" if said else ""))


def _caveat(entry: Mitigation, applied: Tuple[str, ...]) -> str:
    """What the registry says an applied fix leaves open: its pairing when the partner is missing, else its
    first caveat."""
    if entry.pair_with and entry.pair_with not in applied:
        return entry.pairing_caveat()
    return entry.caveats[0] if entry.caveats else ""


def collect(results: Iterable[Iterable[AppliedFix]]) -> List[AppliedFix]:
    return sorted({fix for fixes in results for fix in fixes}, key=lambda f: (f.path, f.line, f.mitigation))
