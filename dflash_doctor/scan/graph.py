"""The project-wide call graph: module names to files, references to functions, and the search from a thread's
entry point to a torch.compile'd callable (DFD201) or from compiled roots to what they run (DFD202).
"""
from __future__ import annotations

import ast
import os
import re
from collections import deque
from typing import Callable, Deque, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple, TypeVar, Union

from dflash_doctor.scan.resolve import (
    COMPILE_FUNCTIONS,
    CompiledRef,
    ExtRef,
    FuncRef,
    InstanceRef,
    LocalClass,
    MethodRef,
    ClassRef,
    ParamRef,
    Ref,
    Target,
)
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.scopes import STAR_EXPORTS, Scope
from dflash_doctor.scan.summary import ClassInfo, FuncInfo

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
_MAX_HOPS = 6  # re-exports, base classes, attribute aliases followed while resolving one reference


def package_of(path: str, is_package_dir: Optional[Callable[[str], bool]] = None) -> Tuple[Optional[str], str]:
    """(package, module) dotted names of a file from the `__init__.py` files above it; (None, stem) for scripts."""
    is_package_dir = is_package_dir or (lambda d: os.path.isfile(os.path.join(d, "__init__.py")))
    folder, filename = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(filename)[0]
    parts: List[str] = []
    while folder and is_package_dir(folder):
        folder, name = os.path.split(folder)
        parts.insert(0, name)
        if not name:
            break
    package = ".".join(parts) or None
    if stem == "__init__":
        return package, package or stem
    return package, f"{package}.{stem}" if package else stem


class ModuleIndex:
    """Dotted module names of the scanned files, plus script-style imports of sibling files, plus (with `root`)
    the project's other files: a module a scanned file imports is looked up on disk under the folders Python
    would search for it (the importer's own top folder, the project root, its `src/`), never outside the root and
    never into an installed-package store below it (site-packages, a virtual environment)."""

    def __init__(self, paths: Iterable[str], root: Optional[str] = None):
        self.by_name: Dict[str, str] = {}
        self.by_abspath: Dict[str, str] = {}
        self.by_folder: Dict[str, List[str]] = {}  # absolute folder -> the scanned files in it
        self.root = os.path.abspath(root) if root else None
        self._package_dirs: Dict[str, bool] = {}
        self._on_disk: Dict[Tuple[str, str], Optional[str]] = {}
        self._inside_folders: Dict[str, bool] = {}
        self.packages: Dict[str, Optional[str]] = {}
        for path in paths:
            package, module = package_of(path, self._is_package_dir)
            self.packages[path] = package
            self.by_name.setdefault(module, path)
            absolute = os.path.abspath(path)
            self.by_abspath[absolute] = path
            self.by_folder.setdefault(os.path.dirname(absolute), []).append(path)

    def _is_package_dir(self, folder: str) -> bool:
        if folder not in self._package_dirs:
            self._package_dirs[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return self._package_dirs[folder]

    def package(self, path: str) -> Optional[str]:
        """The package of a scanned file, or of a project file found on disk."""
        if path not in self.packages:
            self.packages[path] = package_of(path, self._is_package_dir)[0]
        return self.packages[path]

    def find(self, dotted: str, importer: str) -> Optional[str]:
        if dotted in self.by_name:
            return self.by_name[dotted]
        base = os.path.join(os.path.dirname(os.path.abspath(importer)), *dotted.split("."))
        found = self.by_abspath.get(base + ".py") or self.by_abspath.get(os.path.join(base, "__init__.py"))
        if found is None and self.root is not None:
            found = self.find_on_disk(dotted, importer)
        return found

    def search_folders(self, importer: str) -> List[str]:
        """Where Python would look for an absolute import made by `importer`: the folder above its top package
        (the script's own folder for a script), the project root and `src/` under it."""
        folder = os.path.dirname(os.path.abspath(importer))
        package = self.package(importer)
        for _ in (package or "").split(".") if package else ():
            folder = os.path.dirname(folder)
        folders = [folder]
        if self.root is not None:
            folders += [self.root, os.path.join(self.root, "src")]
        return list(dict.fromkeys(folders))

    def find_on_disk(self, dotted: str, importer: str) -> Optional[str]:
        """The project file `dotted` names for `importer` (a module or a package's __init__.py), or None."""
        key = (dotted, os.path.dirname(os.path.abspath(importer)))
        if key not in self._on_disk:
            self._on_disk[key] = next((path for folder in self.search_folders(importer)
                                       if (path := self._module_file(folder, dotted)) is not None), None)
        return self._on_disk[key]

    def exists_on_disk(self, dotted: str, importer: str) -> bool:
        """Whether `dotted` is something in the project at all: a source, a package folder (namespace packages
        too), an extension module or a stub (those exist but hold nothing to follow)."""
        for folder in self.search_folders(importer):
            base = os.path.join(folder, *dotted.split("."))
            if not self.inside(base):
                continue
            if os.path.isdir(base) or os.path.isfile(base + ".py") or os.path.isfile(base + ".pyi"):
                return True
            parent, stem = os.path.split(base)
            try:
                if any(name.startswith(stem + ".") and name.endswith((".so", ".pyd"))
                       for name in os.listdir(parent or ".")):
                    return True
            except OSError:
                continue
        return False

    def inside(self, path: str) -> bool:
        """Below the project root, and not inside an installed-package store or environment on the way (decided
        once per folder: every lookup of a big tree's imports asks again)."""
        if self.root is None:
            return False
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in self._inside_folders:
            self._inside_folders[folder] = self._folder_inside(folder)
        return self._inside_folders[folder]

    def _folder_inside(self, folder: str) -> bool:
        assert self.root is not None
        try:
            relative = os.path.relpath(folder, self.root)
        except ValueError:  # another Windows drive
            return False
        if relative == os.curdir:
            return True
        if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
            return False
        from dflash_doctor.scan.discovery import skip_reason

        parent, name = os.path.split(folder)
        return self.inside(folder) and not skip_reason(parent, name) if parent != folder else False

    def _module_file(self, folder: str, dotted: str) -> Optional[str]:
        base = os.path.join(folder, *dotted.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if self.inside(candidate) and os.path.isfile(candidate):
                absolute = os.path.abspath(candidate)
                return self.by_abspath.get(absolute) or _spelled(absolute)
        return None


def _spelled(absolute: str) -> str:
    """A followed file as findings name it: relative to the working folder when below it, as scanned paths
    usually are."""
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith(os.pardir) else relative


_STAR_NAMES = frozenset(name for names in STAR_EXPORTS.values() for name in names)


def _mentions(path: str, name: str) -> bool:
    from dflash_doctor.scan.source_file import read_bytes

    data = read_bytes(path)
    return isinstance(data, bytes) and name.encode() in data


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
Construction = Tuple[ModuleGraph, ast.Call, Scope]  # a `Class(...)` call, with its file and scope


class Linker:
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

    # -- files and names ------------------------------------------------------------------------------------

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
        return loaded

    def resolve_ext(self, ref: ExtRef, hops: int = 0) -> List[Target]:
        """What a dotted name imported from project code refers to, following re-exports."""
        if self.index is None or hops > _MAX_HOPS:
            return []
        parts = ref.dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            path = self.index.find(".".join(parts[:cut]), ref.path)
            if path is None:
                continue
            rest = parts[cut:]
            if path not in self.summaries and not self._may_bind(path, rest):
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
        if found is None or hops > _MAX_HOPS:
            return False
        info = found[1]
        return info.thread_base or any(self.is_thread_class(base, hops + 1) for base in info.bases)

    def function_info(self, ref: FuncRef) -> Optional[FuncInfo]:
        summary = self.summary(ref.path)
        return summary.function(ref.qualname) if summary else None

    def function_line(self, ref: FuncRef) -> int:
        info = self.function_info(ref)
        return info.line if info else 0

    # -- references -----------------------------------------------------------------------------------------

    def expand(self, ref: Target, through_compiled: bool = False, hops: int = 0) -> List[Step]:
        """The functions (and compiled callables) that calling `ref` runs: one kind of reference per helper below,
        each following what the reference stands for one hop further (`hops` bounds the whole walk)."""
        if hops > _MAX_HOPS:
            return []
        if isinstance(ref, CompiledRef):
            return [ref]
        if isinstance(ref, FuncRef):
            return self._expand_function(ref, through_compiled)
        if isinstance(ref, ExtRef):
            return self._expand_each(self.resolve_ext(ref), through_compiled, hops + 1)
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
        function = self.function_info(ref)
        if function is None:
            return []
        if (function.compiled or self._compiled_by_import(function)) and not through_compiled:
            return [CompiledRef(ref.qualname, ref.path, function.line)]
        return [ref]

    def _expand_instance(self, ref: InstanceRef, through_compiled: bool, hops: int) -> List[Step]:
        """Calling an instance runs its class's `__call__` when it (or a base) defines one, else nn.Module's
        `forward`."""
        found = self.class_info(ref.cls)
        if found is None:
            return []
        attr = "__call__" if self._has_method(found[0], "__call__") else "forward"
        return self.expand(MethodRef(found[0], attr), through_compiled, hops + 1)

    def _expand_parameter(self, ref: ParamRef, through_compiled: bool, hops: int) -> List[Step]:
        """A constructor parameter (`self.fn = fn`) runs whatever the project passes for it where it builds the
        class."""
        steps: List[Step] = []
        for graph, call, scope in self.constructions(ref.cls):
            argument = _argument(call, ref)
            passed = graph.ctx.resolver.callee(argument, scope, call.lineno) if argument is not None else None
            if passed is not None:
                steps.extend(self.expand(passed, through_compiled, hops + 1))
        return steps

    def _expand_method(self, ref: MethodRef, through_compiled: bool, hops: int) -> List[Step]:
        """`cls.attr`: an attribute the class assigns (`self.step = torch.compile(...)`) wins over a method of that
        name, as at run time on the instance; otherwise the method, else the bases' (in order)."""
        found = self.class_info(ref.cls)
        if found is None:
            return []
        cls, info = found
        if ref.attr in info.attributes:
            return self._expand_each(info.attributes[ref.attr], through_compiled, hops + 1)
        if ref.attr in info.methods:
            return self._expand_defined_method(FuncRef(cls.path, info.methods[ref.attr]), through_compiled, hops)
        return self._expand_each([MethodRef(base, ref.attr) for base in info.bases], through_compiled, hops + 1)

    def _expand_defined_method(self, method: FuncRef, through_compiled: bool, hops: int) -> List[Step]:
        function = self.function_info(method)
        if function is not None and function.is_property:
            # `self.model(x)` with `model` a property: the call runs what the property returns (a compiled
            # module built on first access, say), after the property itself
            steps: List[Step] = [method] if not function.compiled else []
            return steps + self._expand_each(function.returns, through_compiled, hops + 1)
        return self.expand(method, through_compiled, hops + 1)

    def _may_bind(self, path: str, rest: List[str]) -> bool:
        """Whether a module not parsed yet can resolve `rest` (the names after the module's own) for the linker:
        one name must be bound there by a def, class, assignment or import (a star import binds names for the
        linker only from the modules scopes.STAR_EXPORTS knows); `Name.attr` needs Name to be a class there or
        imported there (only classes' attributes are followed); longer tails resolve to nothing. Exact for what
        the linker can resolve, and it kept torch/__init__.py from being parsed for every `torch.zeros(...)`."""
        if len(rest) > 2:
            return False
        from dflash_doctor.scan.source_file import read_bytes

        data = read_bytes(path)
        if not isinstance(data, bytes):
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

    def _compiled_by_import(self, info: FuncInfo) -> bool:
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
                        or _mentions(path, "compile")
                return self._compiles[path]
        return False

    def constructions(self, cls: LocalClass) -> List[Construction]:
        """Where the project builds `cls`: its own file, the files beside it that name it, and files already
        parsed. (A search of every file for every class made one scan of torch's sources 3 s slower.)"""
        if cls in self._constructions:
            return self._constructions[cls]
        name = cls.qualname.rsplit(".", 1)[-1]
        folder = os.path.dirname(os.path.abspath(cls.path))
        neighbours = self.index.by_folder.get(folder, []) if self.index else []
        paths = [cls.path] + [p for p in self.summaries if p != cls.path] + [
            path for path in neighbours if path not in self.summaries and _mentions(path, name)]
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

    def _has_method(self, cls: ClassRef, name: str, hops: int = 0) -> bool:
        found = self.class_info(cls)
        if found is None or hops > _MAX_HOPS:
            return False
        info = found[1]
        return name in info.methods or any(self._has_method(b, name, hops + 1) for b in info.bases)

    def derives_from(self, cls: ClassRef, dotted: FrozenSet[str], hops: int = 0) -> bool:
        """Whether `cls` is, or has among its bases (followed across files), one of the classes `dotted`."""
        if isinstance(cls, ExtRef) and cls.dotted in dotted:
            return True
        found = self.class_info(cls)
        if found is None or hops > _MAX_HOPS:
            return False
        return any(self.derives_from(base, dotted, hops + 1) for base in found[1].bases)

    def fx_trace(self, ref: Ref) -> Optional[str]:
        """The FX trace calling `ref` runs (its name), or None."""
        if isinstance(ref, ExtRef) and ref.dotted in FX_TRACE_FUNCTIONS:
            return ref.dotted
        if isinstance(ref, MethodRef) and ref.attr == "trace" and self.derives_from(ref.cls, FX_TRACER_CLASSES):
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
            info = self.function_info(node)
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
                info = self.function_info(node)
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
