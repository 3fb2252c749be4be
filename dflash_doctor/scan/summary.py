"""The call graph's records: a function's callees, a class's bases/methods/attributes, a thread's spawn site."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

from dflash_doctor.scan.resolve import ClassRef, ExtRef, LocalClass, Ref


@dataclass
class FuncInfo:
    qualname: str
    line: int
    refs: List[Ref] = field(default_factory=list)  # callees and callbacks, in source order
    compiled: bool = False  # decorated with @torch.compile / @torch.compile(...)
    decorators: Tuple[ExtRef, ...] = ()  # imported decorators: the linker checks whether one is torch.compile
    # a @property (or cached_property): reading it runs the function, so calling it calls what it returns
    is_property: bool = False
    returns: List[Ref] = field(default_factory=list)  # what its return statements hand back, when callable
    # its parameters (a method's without self), and how the body uses them: a thread's argument is followed into
    # the target only where the target calls that parameter or passes it on to a call
    params: Tuple[str, ...] = ()
    keyword_only: FrozenSet[str] = frozenset()
    called_params: Dict[str, int] = field(default_factory=dict)  # name -> first line that calls it
    called_attributes: List[Tuple[str, str]] = field(default_factory=list)  # (param, attr): `job.model(x)`
    passed_params: List["PassedOn"] = field(default_factory=list)

    @property
    def param_names(self) -> FrozenSet[str]:
        return frozenset(self.params) | self.keyword_only


@dataclass(frozen=True)
class PassedOn:
    """A parameter handed on to another call: `step(model, batch)` inside `worker(model)`."""

    param: str
    callee: Ref
    position: int  # -1 when passed by keyword
    keyword: Optional[str]


@dataclass
class ClassInfo:
    qualname: str
    line: int
    bases: Tuple[ClassRef, ...] = ()
    thread_base: bool = False  # a direct threading.Thread base
    methods: Dict[str, str] = field(default_factory=dict)  # name -> function qualname
    attributes: Dict[str, Tuple[Ref, ...]] = field(default_factory=dict)  # self.<attr> = ... (all assignments)


class SpawnSource(str, enum.Enum):
    """What starts the threads: in-thread checks choose the sources they judge (DFD201 leaves DataParallel's
    replica threads to DFD204, whose measured outcomes differ)."""

    THREAD = "thread"  # threading.Thread / Timer
    POOL = "thread pool"  # ThreadPoolExecutor, multiprocessing's ThreadPool
    THREAD_SUBCLASS = "Thread subclass"
    DATA_PARALLEL = "DataParallel"  # nn.DataParallel / data_parallel: one thread per replica (parallel_apply)
    PARALLEL_APPLY = "parallel_apply"  # torch.nn.parallel.parallel_apply over modules, one thread each


@dataclass(frozen=True)
class Passed:
    """An argument handed to a thread's target (`args=`, `kwargs=`, submit's extra arguments, a partial's), as
    the spawning file resolves it."""

    position: int  # among the target's explicit parameters; -1 when passed by keyword
    keyword: Optional[str]
    ref: Ref
    spelled: str


@dataclass
class Spawn:
    """Where a thread starts: Thread(target=...), Timer, executor submit/map, a Thread subclass's run(), or the
    replica threads of nn.DataParallel and parallel_apply."""

    kind: str
    line: int
    column: int
    target: str  # as spelled in the source
    refs: Tuple[Ref, ...]
    noqa: Optional[FrozenSet[str]] = None
    thread_class: Optional[LocalClass] = None  # for Thread subclasses: confirmed by the linker (bases may be imported)
    scope: str = ""  # qualname of the function (or "" the module) whose code starts the thread
    source: SpawnSource = SpawnSource.THREAD
    arguments: Tuple[Passed, ...] = ()


@dataclass(frozen=True)
class TraceSite:
    """A call that may run an FX trace (symbolic_trace, Tracer().trace, make_fx), judged by the linker."""

    line: int
    column: int
    scope: str  # qualname of the function it is in ("" at module level)
    callee: Ref
    spelled: str
    noqa: Optional[FrozenSet[str]] = None
