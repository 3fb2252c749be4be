"""What calling a reference runs, across the project's files, and the searches over that: from a thread's entry
point to a torch.compile'd callable (DFD201) or to a call a rule names (DFD203), from compiled roots to everything they
run (DFD202, per-thread fixes). The files themselves, names imported across them and classes are
project_modules.py's.
"""
from __future__ import annotations

import ast
from collections import deque
from typing import Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple, TypeVar, Union

from dflash_doctor.scan.project_modules import MAX_HOPS, ProjectModules
from dflash_doctor.scan.resolve import (
    CompiledRef,
    ExtRef,
    FuncRef,
    InstanceRef,
    LocalClass,
    MethodRef,
    ParamRef,
    Ref,
    Target,
)

MAX_CHAIN_DEPTH = 8  # calls between a thread's target and the compiled callable
# What runs an FX trace, and so installs torch.fx's process-wide patcher (docs/races.md, "The FX patcher race"):
# symbolic_trace and make_fx (its PythonKeyTracer is a Tracer), and `trace` of any Tracer or subclass of one.
FX_TRACE_FUNCTIONS = frozenset({
    "torch.fx.symbolic_trace", "torch.fx._symbolic_trace.symbolic_trace",
    "torch.fx.experimental.proxy_tensor.make_fx",
})
FX_TRACER_CLASSES = frozenset({
    "torch.fx.Tracer", "torch.fx._symbolic_trace.Tracer", "torch.fx.experimental.proxy_tensor.PythonKeyTracer",
})


def _argument(call: ast.Call, param: ParamRef) -> Optional[ast.expr]:
    """The expression `call` passes for the parameter: by keyword, else by position when no `*args` comes before
    it (after one, positions are unknown)."""
    argument = next((k.value for k in call.keywords if k.arg == param.name), None)
    if argument is None and 0 <= param.position < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args[: param.position + 1]):
        argument = call.args[param.position]
    return argument


Hit = TypeVar("Hit")  # what a breadth-first search looks for (a trace's name, a compiled callable)
# What one reference gives a search: what it was looking for (the search ends there), else the functions to go on to
Probed = Tuple[Optional[Hit], List[FuncRef]]
Step = Union[FuncRef, CompiledRef]  # a function the search goes on from, or the compiled callable it reached


class Linker:
    """Follows references through `modules`, loading the files a search enters."""

    def __init__(self, modules: ProjectModules):
        self.modules = modules

    # -- references -----------------------------------------------------------------------------------------

    def expand(self, ref: Target, through_compiled: bool = False, hops: int = 0) -> List[Step]:
        """The functions (and compiled callables) that calling `ref` runs: one kind of reference per helper below,
        each following what the reference stands for one hop further (`hops` bounds the whole walk)."""
        if hops > MAX_HOPS:
            return []
        if isinstance(ref, CompiledRef):
            return [ref]
        if isinstance(ref, FuncRef):
            return self._expand_function(ref, through_compiled)
        if isinstance(ref, ExtRef):
            return self._expand_each(self.modules.resolve_ext(ref), through_compiled, hops + 1)
        if isinstance(ref, LocalClass):
            return self.expand(MethodRef(ref, "__init__"), through_compiled, hops + 1)
        if isinstance(ref, InstanceRef):
            return self._expand_instance(ref, through_compiled, hops)
        if isinstance(ref, ParamRef):
            return self._expand_parameter(ref, through_compiled, hops)
        if isinstance(ref, MethodRef):
            return self._expand_method(ref, through_compiled, hops)
        return []

    def _expand_each(self, refs: Iterable[Target], through_compiled: bool, hops: int) -> List[Step]:
        """What calling each of `refs` runs, in their order (`hops` already counts the hop that found them)."""
        steps: List[Step] = []
        for item in refs:
            steps.extend(self.expand(item, through_compiled, hops))
        return steps

    def _expand_function(self, ref: FuncRef, through_compiled: bool) -> List[Step]:
        """A function found in a summary; a torch.compile'd one is where the search stops, unless it goes through
        compiled wrappers (`reachable`). An unknown function yields nothing: the searches only enter what exists."""
        function = self.modules.function_info(ref)
        if function is None:
            return []
        if (function.compiled or self.modules.compiled_by_import(function)) and not through_compiled:
            return [CompiledRef(ref.qualname, ref.path, function.line)]
        return [ref]

    def _expand_instance(self, ref: InstanceRef, through_compiled: bool, hops: int) -> List[Step]:
        """Calling an instance runs its class's `__call__` when it (or a base) defines one, else nn.Module's
        `forward`."""
        found = self.modules.class_info(ref.cls)
        if found is None:
            return []
        attr = "__call__" if self.modules.has_method(found[0], "__call__") else "forward"
        return self.expand(MethodRef(found[0], attr), through_compiled, hops + 1)

    def _expand_parameter(self, ref: ParamRef, through_compiled: bool, hops: int) -> List[Step]:
        """A constructor parameter (`self.fn = fn`) runs whatever the project passes for it where it builds the
        class."""
        steps: List[Step] = []
        for graph, call, scope in self.modules.constructions(ref.cls):
            argument = _argument(call, ref)
            passed = graph.ctx.resolver.callee(argument, scope, call.lineno) if argument is not None else None
            if passed is not None:
                steps.extend(self.expand(passed, through_compiled, hops + 1))
        return steps

    def _expand_method(self, ref: MethodRef, through_compiled: bool, hops: int) -> List[Step]:
        """`cls.attr`: an attribute the class assigns (`self.step = torch.compile(...)`) wins over a method of that
        name, as at run time on the instance; otherwise the method, else the bases' (in order)."""
        found = self.modules.class_info(ref.cls)
        if found is None:
            return []
        cls, info = found
        if ref.attr in info.attributes:
            return self._expand_each(info.attributes[ref.attr], through_compiled, hops + 1)
        if ref.attr in info.methods:
            return self._expand_defined_method(FuncRef(cls.path, info.methods[ref.attr]), through_compiled, hops)
        return self._expand_each([MethodRef(base, ref.attr) for base in info.bases], through_compiled, hops + 1)

    def _expand_defined_method(self, method: FuncRef, through_compiled: bool, hops: int) -> List[Step]:
        function = self.modules.function_info(method)
        if function is not None and function.is_property:
            # `self.model(x)` with `model` a property: the call runs what the property returns (a compiled
            # module built on first access, say), after the property itself
            steps: List[Step] = [method] if not function.compiled else []
            return steps + self._expand_each(function.returns, through_compiled, hops + 1)
        return self.expand(method, through_compiled, hops + 1)

    def fx_trace(self, ref: Ref) -> Optional[str]:
        """The FX trace calling `ref` runs (its name), or None."""
        if isinstance(ref, ExtRef) and ref.dotted in FX_TRACE_FUNCTIONS:
            return ref.dotted
        if isinstance(ref, MethodRef) and ref.attr == "trace" and self.modules.derives_from(ref.cls,
                                                                                           FX_TRACER_CLASSES):
            owner = ref.cls.dotted if isinstance(ref.cls, ExtRef) else ref.cls.qualname
            return f"{owner}.trace"
        return None

    # -- searches -------------------------------------------------------------------------------------------

    def find_call(self, starts: Iterable[Target], is_target: Callable[[Ref], Optional[str]],
                  max_depth: int = MAX_CHAIN_DEPTH) -> Optional[Tuple[List[FuncRef], str]]:
        """The shortest call chain from `starts` to a call that `is_target` names (breadth first, bounded), with
        that name; None when there is none. It does not enter torch.compile'd functions (Dynamo traces those; the
        compiled-call search stops there too, so both searches load the same files)."""
        def at_start(start: Target) -> Probed[str]:
            return None, self._eager_functions(start)  # the thread's target itself is not a call it makes

        def at_call(ref: Ref, deeper: bool) -> Probed[str]:
            hit = is_target(ref)
            if hit is not None:
                return hit, []
            # the last level's callees are not expanded: that would load their files for nothing
            return None, self._eager_functions(ref) if deeper else []

        return self._breadth_first(starts, at_start, at_call, max_depth)

    def find_compiled(self, starts: Iterable[Target], max_depth: int = MAX_CHAIN_DEPTH
                      ) -> Optional[Tuple[List[FuncRef], CompiledRef]]:
        """The shortest call chain from `starts` to a compiled callable (breadth first, bounded), or None."""
        def at_call(ref: Target, deeper: bool) -> Probed[CompiledRef]:
            # a call is expanded even on the last level: what it runs may be the compiled callable itself
            steps = self.expand(ref)
            compiled = next((item for item in steps if isinstance(item, CompiledRef)), None)
            if compiled is not None or not deeper:
                return compiled, []
            return None, [item for item in steps if isinstance(item, FuncRef)]

        return self._breadth_first(starts, lambda start: at_call(start, True), at_call, max_depth)

    def _breadth_first(self, starts: Iterable[Target], at_start: Callable[[Target], Probed[Hit]],
                       at_call: Callable[[Ref, bool], Probed[Hit]], max_depth: int
                       ) -> Optional[Tuple[List[FuncRef], Hit]]:
        """The search both `find_` methods run: from the functions `at_start` gives for `starts`, through every
        call (`at_call(ref, deeper)`: what it found, else the functions to go on to, `deeper` false on the last
        level) of each function, nearest first. Returns the chain of functions to the first find, and the find."""
        parent: Dict[FuncRef, Optional[FuncRef]] = {}  # how the search reached each function (None: a start)
        queue: Deque[Tuple[FuncRef, int]] = deque()
        for start in starts:
            hit, functions = at_start(start)
            if hit is not None:
                return [], hit
            self._enqueue(functions, None, 0, parent, queue)
        while queue:
            node, depth = queue.popleft()
            info = self.modules.function_info(node)
            if info is None:  # expand() yields only functions it found
                continue
            for ref in info.refs:
                hit, functions = at_call(ref, depth + 1 < max_depth)
                if hit is not None:
                    return self._chain(parent, node), hit
                self._enqueue(functions, node, depth + 1, parent, queue)
        return None

    @staticmethod
    def _enqueue(functions: List[FuncRef], caller: Optional[FuncRef], depth: int,
                 parent: Dict[FuncRef, Optional[FuncRef]], queue: Deque[Tuple[FuncRef, int]]) -> None:
        """Queue the functions not reached before: the first way found to each is the shortest."""
        for item in functions:
            if item not in parent:
                parent[item] = caller
                queue.append((item, depth))

    def reachable(self, starts: Iterable[Target], max_depth: int = MAX_CHAIN_DEPTH) -> Set[FuncRef]:
        """Every function run by `starts`, compiled ones included (for "is this call inside compiled code")."""
        seen: Set[FuncRef] = set()
        frontier: List[FuncRef] = []
        for start in starts:
            frontier.extend(self._functions_run(start))
        for _ in range(max_depth + 1):
            next_frontier: List[FuncRef] = []
            for node in frontier:
                if node in seen:
                    continue
                seen.add(node)
                info = self.modules.function_info(node)
                if info is None:  # expand() yields only functions it found
                    continue
                for ref in info.refs:
                    next_frontier.extend(self._functions_run(ref))
            frontier = next_frontier
        return seen

    def _eager_functions(self, ref: Target) -> List[FuncRef]:
        """The functions calling `ref` runs, stopping at torch.compile'd ones."""
        return [item for item in self.expand(ref) if isinstance(item, FuncRef)]

    def _functions_run(self, ref: Target) -> List[FuncRef]:
        """The functions calling `ref` runs, through torch.compile'd wrappers too."""
        return [item for item in self.expand(ref, through_compiled=True) if isinstance(item, FuncRef)]

    @staticmethod
    def _chain(parent: Dict[FuncRef, Optional[FuncRef]], node: FuncRef) -> List[FuncRef]:
        chain = []
        current: Optional[FuncRef] = node
        while current is not None:
            chain.append(current)
            current = parent[current]
        return list(reversed(chain))
