"""Where threads start (DFD201's spawn sites): Thread/Timer targets, thread-pool submissions, Thread subclasses."""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import LocalClass, MethodRef, describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.summary import Passed, Spawn, SpawnSource, TraceSite

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
# constructor -> positional indexes of its `args` and `kwargs` (Thread(group, target, name, args, kwargs),
# Timer(interval, function, args, kwargs))
THREAD_ARGUMENTS = {"threading.Thread": (3, 4), "threading.Timer": (2, 3)}
# nn.DataParallel and its functional form: the module whose forward each replica thread runs is the first argument
DATA_PARALLEL = frozenset({
    "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel",
})
PARALLEL_APPLY = frozenset({"torch.nn.parallel.parallel_apply", "torch.nn.parallel.parallel_apply.parallel_apply"})
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
        # DataParallel calls that a torch.compile wraps (the whole wrapper compiled: its replicas run inside one
        # compiled frame, which ran where the replicated compiled module failed), by node id; decided in finish()
        self._replicas: List[Tuple[ast.Call, Spawn]] = []
        self._compiled_wrappers: set = set()

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
                self._add(constructor.split(".")[-1], node, target, scope, SpawnSource.THREAD,
                          self._thread_arguments(node, constructor))
            return
        if constructor in DATA_PARALLEL or constructor in PARALLEL_APPLY:
            self._replicated(node, scope, constructor)
            return
        if resolver.is_compile_call(node, scope, line) and node.args:
            self._wrapped(node.args[0], scope, line)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "compile" and not node.args:
            self._wrapped(node.func.value, scope, line)
        if isinstance(node.func, ast.Attribute) and node.args:
            pool = self._pool(node.func.value, scope, line)
            if pool is not None and node.func.attr in THREAD_POOLS[pool]:
                method = node.func.attr
                self._add(f"{pool.split('.')[-1]}.{method}", node, node.args[0], scope, SpawnSource.POOL,
                          self._pool_arguments(node, method, scope))

    # -- what is handed to the target -------------------------------------------------------------------------

    def _passed(self, expressions: List[Tuple[int, Optional[str], ast.AST]], scope: Scope, line: int,
                element: bool = False) -> Tuple[Passed, ...]:
        """The arguments whose value this file can resolve to something callable (`element`: the argument is an
        iterable whose elements are handed over one by one, as by map)."""
        resolver = self.ctx.resolver
        found = []
        for position, keyword, expression in expressions:
            ref = resolver.element_callee(expression, scope, line) if element else resolver.callee(
                expression, scope, line)
            if ref is not None:
                spelled = describe(expression)
                found.append(Passed(position, keyword, ref, f"an element of {spelled}" if element else spelled))
        return tuple(found)

    def _thread_arguments(self, node: ast.Call, constructor: str) -> List[Tuple[int, Optional[str], ast.AST]]:
        """Thread(..., args=(...), kwargs={...}) (or Timer's): the literal displays only."""
        args_at, kwargs_at = THREAD_ARGUMENTS[constructor]
        args = next((k.value for k in node.keywords if k.arg == "args"), None)
        if args is None and len(node.args) > args_at:
            args = node.args[args_at]
        kwargs = next((k.value for k in node.keywords if k.arg == "kwargs"), None)
        if kwargs is None and len(node.args) > kwargs_at:
            kwargs = node.args[kwargs_at]
        return _positional(args) + _keywords(kwargs)

    def _pool_arguments(self, node: ast.Call, method: str, scope: Scope) -> Tuple[Passed, ...]:
        """submit(fn, *args, **kwargs); map(fn, iterable) hands each element as the first argument;
        apply/apply_async(fn, args, kwds)."""
        line = node.lineno
        if method == "submit":
            extra = [(i, None, a) for i, a in enumerate(node.args[1:]) if not isinstance(a, ast.Starred)]
            return self._passed(extra + [(-1, k.arg, k.value) for k in node.keywords if k.arg], scope, line)
        if method in ("map", "imap", "imap_unordered", "map_async") and len(node.args) > 1:
            return self._passed([(0, None, node.args[1])], scope, line, element=True)
        if method in ("apply", "apply_async"):
            args = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "args"),
                                                                 None)
            kwds = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "kwds"),
                                                                None)
            return self._passed(_positional(args) + _keywords(kwds), scope, line)
        return ()

    # -- DataParallel ---------------------------------------------------------------------------------------

    def _replicated(self, node: ast.Call, scope: Scope, constructor: str) -> None:
        module = next((k.value for k in node.keywords if k.arg in ("module", "modules")), None)
        if module is None and node.args:
            module = node.args[0]
        if module is None:
            return
        resolver = self.ctx.resolver
        if constructor in PARALLEL_APPLY:
            ref = resolver.element_callee(module, scope, node.lineno)
            kind, source = "parallel_apply", SpawnSource.PARALLEL_APPLY
        else:
            ref = resolver.callee(module, scope, node.lineno)
            kind, source = constructor.rsplit(".", 1)[-1], SpawnSource.DATA_PARALLEL
        if ref is None:
            return
        spawn = Spawn(kind, node.lineno, node.col_offset + 1, describe(module), (ref,), self.ctx.noqa(node.lineno),
                      scope=_function_of(scope), source=source)
        self._replicas.append((node, spawn))

    def _wrapped(self, wrapped: ast.AST, scope: Scope, line: int) -> None:
        """`torch.compile(nn.DataParallel(m))`, or a name bound to a DataParallel and compiled later."""
        if isinstance(wrapped, ast.Call):
            self._compiled_wrappers.add(id(wrapped))
            return
        binding = self.ctx.resolver.value_binding(wrapped, scope, line)
        if binding is None:
            return
        for sibling in self.ctx.table.bindings(binding.scope).get(getattr(wrapped, "id", ""), ()):
            # only what the name held when the compile read it (`net = torch.compile(net)` then
            # `net = nn.DataParallel(net)`: the DataParallel comes after and replicates the compiled module)
            if sibling.kind == "assign" and isinstance(sibling.node, ast.Call) and sibling.line <= binding.line:
                self._compiled_wrappers.add(id(sibling.node))

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

    def _add(self, kind: str, node: ast.Call, target: ast.AST, scope: Scope, source: SpawnSource,
             arguments) -> None:
        resolver = self.ctx.resolver
        ref = resolver.callee(target, scope, node.lineno)
        if ref is None:
            return
        passed = arguments if isinstance(arguments, tuple) else self._passed(arguments, scope, node.lineno)
        partial = self._partial(target, scope, node.lineno)
        if partial is not None:
            # partial(fn, a, k=b) as the target: its arguments come first, the thread's are shifted after them
            bound, count = partial
            passed = bound + tuple(Passed(p.position + count if p.position >= 0 else -1, p.keyword, p.ref, p.spelled)
                                   for p in passed)
        self.graph.spawns.append(Spawn(
            kind, node.lineno, node.col_offset + 1, describe(target), (ref,), self.ctx.noqa(node.lineno),
            scope=_function_of(scope), source=source, arguments=passed,
        ))

    def _partial(self, target: ast.AST, scope: Scope, line: int) -> Optional[Tuple[Tuple[Passed, ...], int]]:
        """The arguments a `functools.partial(fn, ...)` target binds (written in place or bound to a name), and
        how many positions they take."""
        resolver = self.ctx.resolver
        call: Optional[ast.AST] = target
        if isinstance(target, ast.Name):
            binding = resolver.value_binding(target, scope, line)
            call = binding.node if binding is not None and binding.kind == "assign" else None
            scope, line = (binding.scope, binding.line) if binding is not None else (scope, line)
        if not isinstance(call, ast.Call) or not resolver.is_partial_call(call, scope, line):
            return None
        bound = [(i, None, a) for i, a in enumerate(call.args[1:]) if not isinstance(a, ast.Starred)]
        return self._passed(bound + [(-1, k.arg, k.value) for k in call.keywords if k.arg], scope, line), len(
            call.args) - 1

    def finish(self) -> None:
        """The DataParallel calls no torch.compile wraps; then a class with a `run` method whose bases may lead to
        threading.Thread: the linker confirms the base.

        Only classes the candidate walk entered exist here; a Thread subclass's `class` line names Thread."""
        self.graph.spawns.extend(spawn for node, spawn in self._replicas if id(node) not in self._compiled_wrappers)
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
                source=SpawnSource.THREAD_SUBCLASS,
            ))


def _positional(args: Optional[ast.AST]) -> List[Tuple[int, Optional[str], ast.AST]]:
    """The elements of an `args=(...)` display, by position, up to the first starred one."""
    if not isinstance(args, (ast.Tuple, ast.List)):
        return []
    found: List[Tuple[int, Optional[str], ast.AST]] = []
    for position, element in enumerate(args.elts):
        if isinstance(element, ast.Starred):
            break
        found.append((position, None, element))
    return found


def _keywords(kwargs: Optional[ast.AST]) -> List[Tuple[int, Optional[str], ast.AST]]:
    """The entries of a `kwargs={...}` display or `dict(k=v)` with constant keys."""
    if isinstance(kwargs, ast.Dict):
        return [(-1, key.value, value) for key, value in zip(kwargs.keys, kwargs.values)
                if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    if isinstance(kwargs, ast.Call) and isinstance(kwargs.func, ast.Name) and kwargs.func.id == "dict":
        return [(-1, k.arg, k.value) for k in kwargs.keywords if k.arg]
    return []
