"""The project's modules as the linker reads them: each file's summary (a ModuleGraph), parsed on first need; what
a dotted name imported from project code refers to, following re-exports; and classes across files (their info,
bases and methods, and where the project builds them).

Loading a file is the costly step of following a thread's call chain, so every question here first asks the file's
bytes whether parsing it can answer anything (`_may_bind`, `_may_compile`, `constructions`).
"""
from __future__ import annotations

import ast
import os
import re
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.module_index import ModuleIndex
from dflash_doctor.scan.resolve import COMPILE_FUNCTIONS, ClassRef, ExtRef, FuncRef, LocalClass, MethodRef, Target
from dflash_doctor.scan.scopes import STAR_EXPORTS, Scope
from dflash_doctor.scan.summary import ClassInfo, FuncInfo

MAX_HOPS = 6  # re-exports, base classes, attribute aliases followed while resolving one reference
_STAR_NAMES = frozenset(name for names in STAR_EXPORTS.values() for name in names)
Construction = Tuple[ModuleGraph, ast.Call, Scope]  # a `Class(...)` call, with its file and scope


class ProjectModules:
    """Summaries by path (those given, then those `load` parses on demand, listed in `loaded`), looked up by dotted
    name through `index`."""

    def __init__(
        self,
        summaries: Dict[str, ModuleGraph],
        index: Optional[ModuleIndex] = None,
        load: Optional[Callable[[str], Optional[ModuleGraph]]] = None,
    ):
        self.summaries = summaries  # path -> ModuleGraph
        self.index = index
        self.load = load
        self.loaded: List[str] = []
        self._missing: Set[str] = set()
        self._constructions: Dict[LocalClass, List[Construction]] = {}
        self._compiles: Dict[str, bool] = {}  # path -> whether its bytes mention "compile"
        # the bytes of files not parsed yet, read once for the questions below (None: unreadable)
        self._bytes: Dict[str, Optional[bytes]] = {}
        self._binds: Dict[Tuple[str, Tuple[str, ...]], bool] = {}  # _may_bind's answers (a regex over the file)

    # -- files and names ------------------------------------------------------------------------------------

    def _data(self, path: str) -> Optional[bytes]:
        if path not in self._bytes:
            from dflash_doctor.scan.source_file import read_bytes

            data = read_bytes(path)
            self._bytes[path] = data if isinstance(data, bytes) else None
        return self._bytes[path]

    def _mentions(self, path: str, name: str) -> bool:
        data = self._data(path)
        return data is not None and name.encode() in data

    def summary(self, path: str) -> Optional[ModuleGraph]:
        if path in self.summaries:
            return self.summaries[path]
        if self.load is None or path in self._missing:
            return None
        loaded = self.load(path)
        if loaded is None:
            self._missing.add(path)
            return None
        self.summaries[path] = loaded
        self.loaded.append(path)
        self._bytes.pop(path, None)  # its text is in the summary now
        return loaded

    def resolve_ext(self, ref: ExtRef, hops: int = 0) -> List[Target]:
        """What a dotted name imported from project code refers to, following re-exports."""
        if self.index is None or hops > MAX_HOPS:
            return []
        parts = ref.dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            path = self.index.find(".".join(parts[:cut]), ref.path)
            if path is None:
                continue
            rest = parts[cut:]
            if path not in self.summaries and not self._may_bind(path, tuple(rest)):
                return []  # its bytes cannot bind what is asked: not worth parsing (exact, see _may_bind)
            summary = self.summary(path)
            if summary is None:
                return []
            found: List[Target] = []
            for item in summary.name(rest[0]):
                if isinstance(item, ExtRef) and item.dotted in COMPILE_FUNCTIONS:
                    found.append(item)  # a name bound to torch.compile itself (`jit_fuser = torch.compile`)
                elif isinstance(item, ExtRef):
                    found.extend(self.resolve_ext(item, hops + 1))
                else:
                    found.append(item)
            if len(rest) == 1:
                return found
            if len(rest) == 2:
                return [MethodRef(c, rest[1]) for c in found if isinstance(c, LocalClass)]
            return []
        return []

    def _may_bind(self, path: str, rest: Tuple[str, ...]) -> bool:
        """Whether a module not parsed yet can resolve `rest` (the names after the module's own) for the linker:
        one name must be bound there by a def, class, assignment or import (a star import binds names for the
        linker only from the modules scopes.STAR_EXPORTS knows); `Name.attr` needs Name to be a class there or
        imported there (only classes' attributes are followed); longer tails resolve to nothing. Exact for what
        the linker can resolve, and it kept torch/__init__.py from being parsed for every `torch.zeros(...)`."""
        if len(rest) > 2:
            return False
        if (path, rest) not in self._binds:
            self._binds[(path, rest)] = self._bytes_may_bind(path, rest)
        return self._binds[(path, rest)]

    def _bytes_may_bind(self, path: str, rest: Tuple[str, ...]) -> bool:
        data = self._data(path)
        if data is None:
            return True  # let the load report the problem
        name = re.escape(rest[0].encode())
        if len(rest) == 2:
            pattern = rb"class\s+" + name + rb"\b|import[^\n]*\b" + name + rb"\b|import\s*\([^)]*\b" + name + rb"\b"
        else:
            pattern = (rb"(?:def|class)\s+" + name + rb"\b|\b" + name + rb"\s*(?::[^=\n]*)?=(?!=)|import[^\n]*\b" + name
                       + rb"\b|import\s*\([^)]*\b" + name + rb"\b|\b" + name + rb"\s*,[^\n=]*=(?!=)|,\s*" + name
                       + rb"\b[^\n=]*=(?!=)")
        if re.search(pattern, data):
            return True
        return rest[0] in _STAR_NAMES and b"import *" in data

    def function_info(self, ref: FuncRef) -> Optional[FuncInfo]:
        summary = self.summary(ref.path)
        return summary.function(ref.qualname) if summary else None

    def function_line(self, ref: FuncRef) -> int:
        info = self.function_info(ref)
        return info.line if info else 0

    def compiled_by_import(self, info: FuncInfo) -> bool:
        """An imported decorator bound to torch.compile in its module (only modules whose bytes mention
        `compile` are parsed for this: `@torch.no_grad()` must not load torch's own __init__)."""
        return any(isinstance(item, ExtRef) and item.dotted in COMPILE_FUNCTIONS
                   for decorator in info.decorators if self._may_compile(decorator)
                   for item in self.resolve_ext(decorator))

    def _may_compile(self, ref: ExtRef) -> bool:
        if self.index is None:
            return False
        parts = ref.dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            path = self.index.find(".".join(parts[:cut]), ref.path)
            if path is not None:
                if path not in self._compiles:
                    self._compiles[path] = path in self.summaries and "compile" in self.summaries[path].ctx.text \
                        or self._mentions(path, "compile")
                return self._compiles[path]
        return False

    # -- classes --------------------------------------------------------------------------------------------

    def class_info(self, ref: Target, hops: int = 0) -> Optional[Tuple[LocalClass, ClassInfo]]:
        if isinstance(ref, ExtRef):
            for item in self.resolve_ext(ref, hops + 1):
                if isinstance(item, LocalClass):
                    return self.class_info(item, hops + 1)
            return None
        if isinstance(ref, LocalClass):
            summary = self.summary(ref.path)
            info = summary.class_info(ref.qualname) if summary else None
            return (ref, info) if info else None
        return None

    def is_thread_class(self, ref: ClassRef, hops: int = 0) -> bool:
        found = self.class_info(ref)
        if found is None or hops > MAX_HOPS:
            return False
        info = found[1]
        return info.thread_base or any(self.is_thread_class(base, hops + 1) for base in info.bases)

    def has_method(self, cls: ClassRef, name: str, hops: int = 0) -> bool:
        found = self.class_info(cls)
        if found is None or hops > MAX_HOPS:
            return False
        info = found[1]
        return name in info.methods or any(self.has_method(b, name, hops + 1) for b in info.bases)

    def derives_from(self, cls: ClassRef, dotted: FrozenSet[str], hops: int = 0) -> bool:
        """Whether `cls` is, or has among its bases (followed across files), one of the classes `dotted`."""
        if isinstance(cls, ExtRef) and cls.dotted in dotted:
            return True
        found = self.class_info(cls)
        if found is None or hops > MAX_HOPS:
            return False
        return any(self.derives_from(base, dotted, hops + 1) for base in found[1].bases)

    def constructions(self, cls: LocalClass) -> List[Construction]:
        """Where the project builds `cls`: its own file, the files beside it that name it, and files already
        parsed. (A search of every file for every class made one scan of torch's sources 3 s slower.)"""
        if cls in self._constructions:
            return self._constructions[cls]
        name = cls.qualname.rsplit(".", 1)[-1]
        folder = os.path.dirname(os.path.abspath(cls.path))
        neighbours = self.index.by_folder.get(folder, []) if self.index else []
        paths = [cls.path] + [p for p in self.summaries if p != cls.path] + [
            path for path in neighbours if path not in self.summaries and self._mentions(path, name)]
        found: List[Construction] = []
        for path in dict.fromkeys(paths):
            graph = self.summary(path)
            if graph is None:
                continue
            for call, scope in graph.calls_named(name):
                ref = graph.ctx.resolver.class_ref(call.func, scope, call.lineno)
                resolved = self.class_info(ref) if ref is not None else None
                if resolved is not None and resolved[0] == cls:
                    found.append((graph, call, scope))
        self._constructions[cls] = found
        return found
