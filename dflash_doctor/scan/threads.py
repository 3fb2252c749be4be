"""Where threads start (DFD201's spawn sites): Thread/Timer targets, thread-pool submissions, Thread subclasses."""
from __future__ import annotations

import ast
from typing import Optional

from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import LocalClass, MethodRef, describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.summary import Spawn, TraceSite

FX_TRACE_WORDS = ("symbolic_trace", "make_fx", "trace")  # the final names a trace call can have


def _function_of(scope: Scope) -> str:
    """The qualname of the function `scope` is in ("" at module or class level)."""
    current: Optional[Scope] = scope
    while current is not None and current.kind not in ("function", "lambda"):
        current = current.parent
    return current.qualname if current is not None else ""


class TraceCollector(FileCheck):
    """Calls that may run an FX trace (DFD203 judges them with the linker, which can follow a Tracer subclass's
    bases into other files): those in code that also starts threads are traced while the workers run."""

    needs_graph = True

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        assert graph is not None, "needs_graph: analysis.py builds it"
        self.graph = graph

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        func = node.func
        final = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if final not in FX_TRACE_WORDS or not self.ctx.on_candidate_line(node):
            return
        ref = self.ctx.resolver.callee(func, scope, node.lineno)
        if ref is not None:
            self.graph.traces.append(TraceSite(node.lineno, node.col_offset + 1, _function_of(scope), ref,
                                               describe(func), self.ctx.noqa(node.lineno)))

# constructor -> (keyword naming the callable, its positional index)
THREAD_CONSTRUCTORS = {
    "threading.Thread": ("target", 1),
    "threading.Timer": ("function", 1),
}
_EXECUTOR_METHODS = frozenset({"submit", "map"})
_POOL_METHODS = frozenset({
    "apply", "apply_async", "map", "map_async", "imap", "imap_unordered", "starmap", "starmap_async",
})
THREAD_POOLS = {
    "concurrent.futures.ThreadPoolExecutor": _EXECUTOR_METHODS,
    "concurrent.futures.thread.ThreadPoolExecutor": _EXECUTOR_METHODS,
    "multiprocessing.pool.ThreadPool": _POOL_METHODS,
    "multiprocessing.dummy.Pool": _POOL_METHODS,
}


class SpawnCollector(FileCheck):
    needs_graph = True  # the spawn sites go to it, for the cross-file linker

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        assert graph is not None, "needs_graph: analysis.py builds it"
        self.graph = graph

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        resolver = self.ctx.resolver
        line = node.lineno
        constructor = resolver.dotted(node.func, scope, line)
        if constructor in THREAD_CONSTRUCTORS:
            keyword, index = THREAD_CONSTRUCTORS[constructor]
            target = next((k.value for k in node.keywords if k.arg == keyword), None)
            if target is None and len(node.args) > index:
                target = node.args[index]
            if target is not None:
                self._add(constructor.split(".")[-1], node, target, scope)
            return
        if isinstance(node.func, ast.Attribute) and node.args:
            pool = self._pool(node.func.value, scope, line)
            if pool is not None and node.func.attr in THREAD_POOLS[pool]:
                self._add(f"{pool.split('.')[-1]}.{node.func.attr}", node, node.args[0], scope)

    def _pool(self, receiver: ast.AST, scope: Scope, line: int) -> Optional[str]:
        resolver = self.ctx.resolver
        if isinstance(receiver, ast.Call):
            constructor = resolver.dotted(receiver.func, scope, line)
            return constructor if constructor in THREAD_POOLS else None
        binding = resolver.value_binding(receiver, scope, line)
        if binding is not None and binding.kind in ("assign", "with") and isinstance(binding.node, ast.Call):
            constructor = resolver.dotted(binding.node.func, binding.scope, binding.line)
            return constructor if constructor in THREAD_POOLS else None
        return None

    def _add(self, kind: str, node: ast.Call, target: ast.AST, scope: Scope) -> None:
        ref = self.ctx.resolver.callee(target, scope, node.lineno)
        if ref is None:
            return
        self.graph.spawns.append(Spawn(
            kind, node.lineno, node.col_offset + 1, describe(target), (ref,), self.ctx.noqa(node.lineno),
            scope=_function_of(scope),
        ))

    def finish(self) -> None:
        """A class with a `run` method whose bases may lead to threading.Thread: the linker confirms the base.

        Only classes the candidate walk entered exist here; a Thread subclass's `class` line names Thread."""
        table = self.ctx.table
        for scope, class_node in [(s, s.node) for s in table.scope_of.values() if isinstance(s.node, ast.ClassDef)]:
            run = [b.node for b in table.bindings(scope).get("run", ()) if b.kind == "def"]
            node = run[-1] if run else None
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not class_node.bases:
                continue
            cls = LocalClass(self.ctx.path, scope.qualname)
            self.graph.spawns.append(Spawn(
                "Thread subclass", node.lineno, node.col_offset + 1, f"{scope.qualname}.run",
                (MethodRef(cls, "run"),), self.ctx.noqa(node.lineno), thread_class=cls,
            ))
