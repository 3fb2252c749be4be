"""DFD303: a compile setting (dflash_doctor/compile_settings.py) assigned in one thread and relied on in threads
started later. From torch 2.12 an assignment lives in the assigning thread's context (a ContextVar), so the workers
read the default: the setting reaches a thread only when the thread's own code assigns it, when the program calls
the tool's runtime API for it (a registry fix that switches that setting: its set-up reaches threads started later),
or when the thread enters that API's per-thread form (the same fix's marker entered with `with`)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Set, Tuple, Union

from dflash_doctor.compile_settings import PER_THREAD_SINCE, SETTINGS, CompileSetting, SettingRole
from dflash_doctor.findings import Finding
from dflash_doctor.rules.scan import COMPILE_SETTING_NOT_IN_THREADS
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.fixes import CONFIG_MARKERS, MARKERS, SETTING_FIXES
from dflash_doctor.scan.resolve import describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.thread_reach import REPLICA_THREADS, WORKER_THREADS, InThreadCheck, ThreadReach, in_thread

RUNTIME = "dflash_doctor.runtime"
_BY_KEY = {setting.key: [s for s in SETTINGS if s.key == setting.key] for setting in SETTINGS}
# The values a user relies on for a switch (a True non-lazy switch, the value that silences the FX error); a
# recompile limit is relied on whatever its value.
_RELIED_ON = {"force_non_lazy_backward_lowering": True, "error_on_nested_fx_trace": False,
              "force_compile_during_fx_trace": True}
_SINCE = ".".join(str(part) for part in PER_THREAD_SINCE)
_CONSEQUENCE = {
    SettingRole.DEADLOCK_FIX: "their backward still compiles lazily, on the autograd thread (the deadlock stays)",
    SettingRole.SILENCES_FX_ERROR: "the FX-tracing error still raises there",
    SettingRole.RECOMPILE_LIMIT: "they stop recompiling at the default limit and run the frame uncompiled",
}


@dataclass(frozen=True)
class SettingSite:
    line: int
    column: int
    scope: str  # the function that assigns it ("" at module level)
    setting: CompileSetting
    value: str
    noqa: Optional[frozenset]


@dataclass(frozen=True)
class RuntimeUse:
    """A call of `dflash_doctor.runtime.<name>` in the function `scope`; `entered`: as a `with` item (the
    per-thread form, for the entering thread only)."""

    scope: str
    name: str
    entered: bool


def carriers(setting: CompileSetting) -> frozenset:
    """The runtime functions that carry `setting` into threads: the markers of the registry fixes that switch it
    (a fix whose torch-side marker is that setting's key), not the key itself."""
    fixes = {MARKERS[key] for key in CONFIG_MARKERS if key == setting.key}
    return frozenset(marker for marker, fix in MARKERS.items()
                     if fix in fixes and fix in SETTING_FIXES and marker not in CONFIG_MARKERS)


def _function_of(scope: Optional[Scope]) -> str:
    while scope is not None and scope.kind not in ("function", "lambda"):
        scope = scope.parent
    return scope.qualname if scope is not None else ""


class SettingCollector(FileCheck):
    """Assignments (`config.key = v`, `setattr(config, "key", v)`) of the declared compile settings, and the
    runtime's per-thread form entered as a context manager."""

    needs_graph = True  # what it finds is kept on the file's graph for the check

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        assert graph is not None, "needs_graph: analysis.py builds it"
        self.graph = graph
        self._runtime_calls: List[Tuple[ast.Call, str, str]] = []  # (call, enclosing function, name)

    def _keep(self, item: object) -> None:
        self.graph.collected.setdefault(SettingCollector, []).append(item)

    def _site(self, node: Union[ast.stmt, ast.expr], module: Optional[str], key: Optional[str], value: ast.AST,
              scope: Scope) -> None:
        for setting in _BY_KEY.get(key or "", ()):
            if module != setting.module:
                continue
            wanted = _RELIED_ON.get(setting.key)
            if wanted is not None and not (isinstance(value, ast.Constant) and value.value == wanted):
                continue
            self._keep(SettingSite(node.lineno, node.col_offset + 1, _function_of(scope), setting,
                                   describe(value), self.ctx.noqa(node.lineno)))

    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node) or node.value is None:
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in _BY_KEY:
                module = self.ctx.resolver.dotted(target.value, scope, node.lineno)
                self._site(node, module, target.attr, node.value, scope)

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        resolver = self.ctx.resolver
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) == 3 \
                and resolver.table.lookup("setattr", scope, node.lineno) is None:
            key = node.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                self._site(node, resolver.dotted(node.args[0], scope, node.lineno), key.value, node.args[2], scope)
            return
        dotted = resolver.dotted(func, scope, node.lineno) or ""
        if dotted.startswith(RUNTIME + "."):
            self._runtime_calls.append((node, _function_of(scope), dotted.rsplit(".", 1)[-1]))

    def finish(self) -> None:
        if not self._runtime_calls:
            return
        entered = {id(item.context_expr) for node in ast.walk(self.ctx.table.tree)
                   if isinstance(node, (ast.With, ast.AsyncWith)) for item in node.items}
        for call, scope, name in self._runtime_calls:
            self._keep(RuntimeUse(scope, name, id(call) in entered))


def _collected(graph: ModuleGraph) -> Iterator[object]:
    return iter(graph.collected.get(SettingCollector, ()))


@in_thread
class CompileSettingNotInThreads(InThreadCheck):
    rule = COMPILE_SETTING_NOT_IN_THREADS
    sources = WORKER_THREADS | REPLICA_THREADS
    collectors = (SettingCollector,)

    def after_spawns(self, graph: ModuleGraph, threads: Sequence[ThreadReach], used_noqa: Optional[Set]
                     ) -> List[Finding]:
        sites = [item for item in _collected(graph) if isinstance(item, SettingSite)]
        if not sites:
            return []
        uses = [item for item in _collected(graph) if isinstance(item, RuntimeUse)]
        findings = []
        for site in sites:
            if any(thread.runs(graph.path, site.scope) for thread in threads):
                continue  # assigned by a thread for itself
            api = carriers(site.setting)
            if any(use.name in api and not use.entered for use in uses):
                continue  # the tool's set-up carries it into every thread started later
            forms = [use.scope for use in uses if use.name in api and use.entered]
            missed = [thread for thread in threads if thread.compiled() is not None
                      and not any(thread.runs(graph.path, scope) for scope in forms)]
            if not missed or self.suppressed_at(site.line, site.noqa, used_noqa):
                continue
            findings.append(self._finding(graph, site, missed))
        return findings

    def _finding(self, graph: ModuleGraph, site: SettingSite, missed: Sequence[ThreadReach]) -> Finding:
        first = missed[0]
        hit = first.compiled()
        assert hit is not None
        where = f"in {site.scope}" if site.scope else "at module level"
        others = f" (and {len(missed) - 1} more)" if len(missed) > 1 else ""
        return self.rule.finding(
            f"{site.setting.dotted} = {site.value}, set {where}, does not reach the threads started at line "
            f"{first.spawn.line}{others} ({first.spawn.kind} runs {first.spawn.target}, which calls torch.compile'd "
            f"{hit.compiled.name}): from torch {_SINCE} compile settings are per thread (a ContextVar), so those "
            f"threads read the default and {_CONSEQUENCE[site.setting.role]}; it is relied on for "
            f"{site.setting.relied_on_as}",
            path=graph.path, line=site.line, column=site.column,
            evidence={"setting": site.setting.dotted, "value": site.value, "set_in": site.scope,
                      "threads": [{"line": t.spawn.line, "spawn": t.spawn.kind, "target": t.spawn.target}
                                  for t in missed],
                      "per_thread_since": _SINCE})
