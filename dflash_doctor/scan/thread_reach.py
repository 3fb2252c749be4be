""""Reached from a thread's target", as a service any check can ask, and the registry of the checks that ask.

`ThreadReach` answers, for one place where threads start (a `Spawn`), what those threads run: the compiled callable
their target reaches (through the call chain, or through an argument handed to the target), the first call that a
predicate names, every function they run, whether a given function is among them. Answers are computed on first
question and kept, so several rules judging one spawn search once.

An in-thread rule is an `InThreadCheck` subclass in a module of `scan/in_thread/` (found by that package, no list
to edit) plus its declaration and examples in rules/scan.py: `check` judges one spawn (findings at the spawn site;
the engine applies their noqa), `after_spawns` judges what the file does around all of its spawns (findings
anywhere, suppressed through `suppressed_at`). A check may also declare `FileCheck`s that collect what it needs
while the file is walked (`collectors`): analysis.py runs those like any other check.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Callable, ClassVar, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Type

from dflash_doctor.findings import Finding
from dflash_doctor.rules.registry import Rule
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.context import suppressed
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.graph import MAX_CHAIN_DEPTH, Linker
from dflash_doctor.scan.programs import Reach
from dflash_doctor.scan.resolve import CompiledRef, FuncRef, InstanceRef, MethodRef, Ref, Target
from dflash_doctor.scan.summary import Passed, Spawn, SpawnSource

# The sources that start threads of the user's own making; DataParallel's replica threads are judged apart.
WORKER_THREADS: FrozenSet[SpawnSource] = frozenset(
    {SpawnSource.THREAD, SpawnSource.POOL, SpawnSource.THREAD_SUBCLASS})
REPLICA_THREADS: FrozenSet[SpawnSource] = frozenset({SpawnSource.DATA_PARALLEL, SpawnSource.PARALLEL_APPLY})


@dataclass(frozen=True)
class CompiledHit:
    """A compiled callable a thread runs: the functions from the target to the call, and, when it came in as an
    argument of the target, that argument."""

    chain: Tuple[FuncRef, ...]
    compiled: CompiledRef
    through: Optional[Passed] = None  # the argument that carried it, when it was handed to the target
    inside: Tuple[FuncRef, ...] = ()  # for an argument: the functions from it to the compiled call
    attribute: Optional[str] = None  # for an argument: the attribute of it that the target calls

    @property
    def called(self) -> str:
        """How the target calls what it was handed ("" when the compiled callable was not handed over)."""
        if self.through is None:
            return ""
        return f"{self.through.spelled}.{self.attribute}" if self.attribute else self.through.spelled


class ThreadReach:
    """What the threads started at one spawn site run (answers cached)."""

    def __init__(self, graph: ModuleGraph, spawn: Spawn, linker: Linker):
        self.graph = graph
        self.spawn = spawn
        self.linker = linker
        self._compiled: Optional[Tuple[Optional[CompiledHit]]] = None
        self._functions: Optional[Reach] = None

    @property
    def path(self) -> str:
        return self.graph.path

    def describe(self, ref: FuncRef) -> str:
        return f"{ref.qualname} ({ref.path}:{self.linker.modules.function_line(ref)})"

    def compiled(self) -> Optional[CompiledHit]:
        """The nearest compiled callable the thread calls: through its target's call chain, else through an
        argument handed to the target that the target calls (or passes on to a function that calls it)."""
        if self._compiled is None:
            self._compiled = (self._find_compiled(),)
        return self._compiled[0]

    def _find_compiled(self) -> Optional[CompiledHit]:
        hit = self.linker.find_compiled(self.spawn.refs)
        if hit is not None:
            return CompiledHit(tuple(hit[0]), hit[1])
        for argument in self.spawn.arguments:
            for target in self.spawn.refs:
                for chain, attribute in argument_uses(self.linker, target, argument.position, argument.keyword):
                    called: Optional[Ref] = argument.ref
                    if attribute is not None:
                        called = MethodRef(argument.ref.cls, attribute) if isinstance(
                            argument.ref, InstanceRef) else None
                    carried = self.linker.find_compiled([called]) if called is not None else None
                    if carried is not None:
                        return CompiledHit(tuple(chain), carried[1], argument, tuple(carried[0]), attribute)
        return None

    def backend(self, compiled: CompiledRef) -> Optional[str]:
        """The backend of the torch.compile that made `compiled` (compile_backend)."""
        return compile_backend(self.linker, compiled)

    def first_call(self, is_target: Callable[[Ref], Optional[str]]) -> Optional[Tuple[List[FuncRef], str]]:
        """The shortest chain from the target to a call `is_target` names, with that name."""
        return self.linker.find_call(self.spawn.refs, is_target)

    def functions(self) -> Reach:
        """Every function the thread runs (compiled ones included), as (absolute path, qualname)."""
        if self._functions is None:
            starts = list(self.spawn.refs) + [a.ref for a in self.spawn.arguments]
            self._functions = frozenset(
                (os.path.abspath(ref.path), ref.qualname) for ref in self.linker.reachable(starts))
        return self._functions

    def runs(self, path: str, qualname: str) -> bool:
        """Whether the thread runs the function `qualname` of `path` ("" never: module level is not a thread's)."""
        return bool(qualname) and (os.path.abspath(path), qualname) in self.functions()


# How a target uses an argument: the chain of functions to the use, and the attribute called on it (None: the
# argument itself is called)
ArgumentUse = Tuple[List[FuncRef], Optional[str]]


def argument_uses(linker: Linker, target: Target, position: int, keyword: Optional[str], depth: int = 0
                  ) -> Iterator[ArgumentUse]:
    """Where `target` calls the argument passed to it at `position` (or by `keyword`): directly (`model(x)`,
    `model.forward(x)`), through an attribute (`job.model(x)`, `job.step()`), or after handing it on to project
    functions that do; nothing for an argument only saved, counted or handed to code outside the project."""
    if depth > MAX_CHAIN_DEPTH:
        return
    for function in [step for step in linker.expand(target) if isinstance(step, FuncRef)]:
        info = linker.modules.function_info(function)
        if info is None:
            continue
        if keyword is not None and (keyword in info.params or keyword in info.keyword_only):
            name: Optional[str] = keyword
        else:
            name = info.params[position] if 0 <= position < len(info.params) else None
        if name is None:
            continue
        if name in info.called_params:
            yield [function], None
        for param, attribute in info.called_attributes:
            if param == name:
                yield [function], attribute
        for passed in info.passed_params:
            if passed.param == name:
                for chain, deeper in argument_uses(linker, passed.callee, passed.position, passed.keyword,
                                                   depth + 1):
                    yield [function] + chain, deeper


def compile_backend(linker: Linker, compiled: CompiledRef) -> Optional[str]:
    """The `backend=` of the torch.compile that made `compiled` ("inductor" when none is given), or None when
    it is not a constant or the compile site is not found."""
    summary = linker.modules.summary(compiled.path)
    if summary is None:
        return None
    for node in ast.walk(summary.ctx.table.tree):
        calls: List[ast.expr] = []
        if isinstance(node, ast.Call) and node.lineno == compiled.line:
            calls = [node]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == compiled.line:
            calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
            if not calls and node.decorator_list:
                return "inductor"  # a bare @torch.compile
        for call in calls:
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            final = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if final != "compile":
                continue
            backend = next((k.value for k in call.keywords if k.arg == "backend"), None)
            if backend is None:
                return "inductor"
            return backend.value if isinstance(backend, ast.Constant) and isinstance(backend.value, str) \
                else None
    return None


class InThreadCheck:
    """One rule's judgement of what threads run. Subclasses set `rule` (and `sources`, the spawns they judge)."""

    rule: ClassVar[Rule]
    sources: ClassVar[FrozenSet[SpawnSource]] = WORKER_THREADS
    collectors: ClassVar[Tuple[Type[FileCheck], ...]] = ()  # what it needs collected while the file is walked

    def check(self, thread: ThreadReach) -> List[Finding]:
        """Findings at the spawn site of `thread`."""
        return []

    def after_spawns(self, graph: ModuleGraph, threads: Sequence[ThreadReach], used_noqa: Optional[Set]
                     ) -> List[Finding]:
        """Findings about the file's code around all of its spawns (each suppressed through `suppressed_at`)."""
        return []

    def reach_of(self, graph: ModuleGraph, finding: Finding) -> Optional[Reach]:
        """For a finding of `after_spawns` judged under per-thread fixes: the code it is about."""
        return None

    def suppressed_at(self, line: int, noqa: Optional[FrozenSet[str]], used_noqa: Optional[Set]) -> bool:
        if suppressed(self.rule.code, noqa):
            if used_noqa is not None:
                used_noqa.add((line, self.rule.code))
            return True
        return False


IN_THREAD_CHECKS: Dict[str, InThreadCheck] = {}  # by rule code


def in_thread(check: Type[InThreadCheck]) -> Type[InThreadCheck]:
    """Register an in-thread check for its rule (a class decorator)."""
    code = check.rule.code
    if code in IN_THREAD_CHECKS:
        raise ValueError(f"{code} already has an in-thread check: {type(IN_THREAD_CHECKS[code]).__name__}")
    IN_THREAD_CHECKS[code] = check()
    return check
