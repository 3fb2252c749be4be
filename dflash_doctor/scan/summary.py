"""The call graph's records: a function's callees, a class's bases/methods/attributes, a thread's spawn site."""
from __future__ import annotations

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


@dataclass
class ClassInfo:
    qualname: str
    line: int
    bases: Tuple[ClassRef, ...] = ()
    thread_base: bool = False  # a direct threading.Thread base
    methods: Dict[str, str] = field(default_factory=dict)  # name -> function qualname
    attributes: Dict[str, Tuple[Ref, ...]] = field(default_factory=dict)  # self.<attr> = ... (all assignments)


@dataclass
class Spawn:
    """Where a thread starts: Thread(target=...), Timer, executor submit/map, or a Thread subclass's run()."""

    kind: str
    line: int
    column: int
    target: str  # as spelled in the source
    refs: Tuple[Ref, ...]
    noqa: Optional[FrozenSet[str]] = None
    thread_class: Optional[LocalClass] = None  # for Thread subclasses: confirmed by the linker (bases may be imported)
    scope: str = ""  # qualname of the function (or "" the module) whose code starts the thread


@dataclass(frozen=True)
class TraceSite:
    """A call that may run an FX trace (symbolic_trace, Tracer().trace, make_fx), judged by the linker."""

    line: int
    column: int
    scope: str  # qualname of the function it is in ("" at module level)
    callee: Ref
    spelled: str
    noqa: Optional[FrozenSet[str]] = None
