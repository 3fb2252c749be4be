"""Read, from a torch's own source, the two halves of the compile-lock / autograd-device-thread deadlock.

The cycle (docs/guards-releases.md, "The deadlock"): thread B holds `torch._dynamo.convert_frame.compile_lock`
inside a Dynamo compile while AOTAutograd's joint trace waits for the autograd engine's device thread; that device
thread runs thread A's first backward, which compiles the backward lazily and waits for the same lock. So the
hazard exists where all three hold, each read from the AST (nothing is imported):

1. a Dynamo compile holds `compile_lock` (`_dynamo/convert_frame.py`: a `with` taking the lock);
2. the backward compiler inductor hands AOTAutograd (`bw_compiler=...` in `_inductor/compile_fx.py`) takes
   `compile_lock`, itself or through functions of the same module (`compile_fx_backward` from torch 2.9);
3. AOTAutograd compiles the backward at the first backward call (`_functorch/_aot_autograd/runtime_wrappers.py`:
   `compiled_bw = ...bw_compiler(...)`), i.e. on the thread that runs the backward.

It also reads whether `torch._functorch.config.force_non_lazy_backward_lowering` exists (the switch that compiles
the backward with the forward). Only calls inside compile_fx.py are followed: a lock taken deeper, in another
module, is not seen (torch 2.15 takes it in `_inductor/codegen/common.py` for out-of-tree PrivateUse1 backends
only). What cannot be told stays None and says why in `notes`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from dflash_doctor.guards.pyindex import FUNCTION_DEFS, FunctionNode, Index, Module, dotted, own_nodes

COMPILE_FX = "_inductor/compile_fx.py"
RUNTIME_WRAPPERS = "_functorch/_aot_autograd/runtime_wrappers.py"
FUNCTORCH_CONFIG = "_functorch/config.py"
CONVERT_FRAME = "_dynamo/convert_frame.py"
COMPILE_LOCK = "torch._dynamo.convert_frame.compile_lock"
NON_LAZY_OPTION = "force_non_lazy_backward_lowering"
_MAX_DEPTH = 4



@dataclass(frozen=True)
class Site:
    file: str
    line: int
    function: str  # the qualified definition around the line (`compile_fx.bw_compiler`), or <module>

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function}


@dataclass(frozen=True)
class BackwardCompile:
    compiler: Optional[Site] = None  # the backward compiler inductor hands AOTAutograd
    lock: Optional[Site] = None  # the `with compile_lock` that compiler reaches
    path: Tuple[str, ...] = ()  # the functions from the compiler to the lock
    holder: Optional[Site] = None  # a Dynamo compile holding the same lock
    lazy: Optional[Site] = None  # where AOTAutograd compiles the backward at the first backward call
    non_lazy_option: Optional[Site] = None  # torch._functorch.config.force_non_lazy_backward_lowering
    takes_lock: Optional[bool] = None
    lazy_backward: Optional[bool] = None
    non_lazy_available: Optional[bool] = None
    notes: Tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        def site(value: Optional[Site]) -> Optional[dict]:
            return None if value is None else value.to_dict()

        return {"takes_compile_lock": self.takes_lock, "lazy_backward": self.lazy_backward,
                "non_lazy_backward_available": self.non_lazy_available, "compiler": site(self.compiler),
                "lock": site(self.lock), "path": list(self.path), "holder": site(self.holder),
                "lazy": site(self.lazy), "non_lazy_option": site(self.non_lazy_option), "notes": list(self.notes)}


def read_backward(index: Index) -> BackwardCompile:
    return _Reader(index).run()


class _Reader:
    def __init__(self, index: Index):
        self.index = index
        self.notes: List[str] = []

    def _display(self, relpath: str) -> str:
        return self.index.tree.display_path(relpath)

    def run(self) -> BackwardCompile:
        compiler, lock, path, takes_lock = self._backward_compiler()
        holder = self._holder()
        lazy, lazy_backward = self._lazy_site()
        option, available = self._non_lazy_option()
        return BackwardCompile(compiler=compiler, lock=lock, path=path, holder=holder, lazy=lazy,
                               non_lazy_option=option, takes_lock=takes_lock, lazy_backward=lazy_backward,
                               non_lazy_available=available, notes=tuple(self.notes))

    # -- 2. the backward compiler and the lock it takes ------------------------------------------------------
    def _backward_compiler(self) -> Tuple[Optional[Site], Optional[Site], Tuple[str, ...], Optional[bool]]:
        module = self.index.module(COMPILE_FX)
        if module is None:
            self.notes.append(f"no readable {self._display(COMPILE_FX)}: the backward compiler was not read")
            return None, None, (), None
        compilers = _handed_backward_compilers(module)
        if not compilers:
            self.notes.append(f"no `bw_compiler=` handed to AOTAutograd in {self._display(COMPILE_FX)}")
            return None, None, (), None
        for func in compilers:
            found = self._lock_within(module, func)
            if found is not None:
                lock_func, lock_expr, path = found
                compiler = self._site(module, func)
                lock = Site(self._display(COMPILE_FX), lock_expr.lineno, module.qualified_def_name(lock_func))
                self.notes.append(f"the backward compiler {compiler.function} ({compiler.file}:{compiler.line}) "
                                  f"takes compile_lock at line {lock.line}"
                                  + (f" through {' -> '.join(path[1:])}" if len(path) > 1 else ""))
                return compiler, lock, path, True
        compiler = self._site(module, compilers[0])
        self.notes.append(f"the backward compiler {compiler.function} ({compiler.file}:{compiler.line}) takes no "
                          f"compile_lock (calls followed inside {self._display(COMPILE_FX)} only)")
        return compiler, None, (compiler.function,), False

    def _lock_within(self, module: Module, start: FunctionNode
                     ) -> Optional[Tuple[FunctionNode, ast.expr, Tuple[str, ...]]]:
        """(function, the lock expression in its `with`, path of function names) for the first compile_lock reached
        from `start`."""
        queue: List[Tuple[FunctionNode, Tuple[str, ...]]] = [(start, (module.qualified_def_name(start),))]
        seen: Set[int] = set()
        while queue:
            func, path = queue.pop(0)
            if id(func) in seen:
                continue
            seen.add(id(func))
            scopes = [func] + module.enclosing_functions(func)
            for node in own_nodes(func):
                if isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if self._resolve(item.context_expr, module, scopes) == COMPILE_LOCK:
                            return func, item.context_expr, path
                elif isinstance(node, ast.Call) and len(path) < _MAX_DEPTH and isinstance(node.func, ast.Name):
                    callee = _local_def(module, scopes, node.func.id)
                    if callee is not None:
                        queue.append((callee, path + (module.qualified_def_name(callee),)))
        return None

    def _resolve(self, expr: ast.AST, module: Module, scopes: Sequence[FunctionNode]) -> Optional[str]:
        """The qualified name `expr` refers to, imports inside the enclosing functions included."""
        chain = dotted(expr)
        if chain is None:
            return None
        head, _, rest = chain.partition(".")
        for scope in scopes:
            imported = _function_imports(scope).get(head)
            if imported is not None:
                return f"{imported}.{rest}" if rest else imported
        qualname, _ = self.index.qualname(expr, module, list(scopes))
        return qualname

    # -- 1. the Dynamo compile holding the lock ---------------------------------------------------------------
    def _holder(self) -> Optional[Site]:
        module = self.index.module(CONVERT_FRAME)
        if module is None:
            self.notes.append(f"no readable {self._display(CONVERT_FRAME)}: the compile holding compile_lock "
                              "was not read")
            return None
        holders = [item.context_expr for node in ast.walk(module.tree) if isinstance(node, (ast.With, ast.AsyncWith))
                   for item in node.items
                   if self._resolve(item.context_expr, module, module.enclosing_functions(node)) == COMPILE_LOCK]
        if not holders:
            self.notes.append(f"nothing in {self._display(CONVERT_FRAME)} takes compile_lock")
            return None
        # The last one is the general path (earlier ones serve DDP's optimizer).
        node = max(holders, key=lambda n: n.lineno)
        scopes = module.enclosing_functions(node)
        site = Site(self._display(CONVERT_FRAME), node.lineno,
                    module.qualified_def_name(scopes[0]) if scopes else "<module>")
        self.notes.append(f"Dynamo's {site.function} ({site.file}:{site.line}) compiles holding compile_lock")
        return site

    # -- 3. the lazy compile, and the switch that makes it eager ---------------------------------------------
    def _lazy_site(self) -> Tuple[Optional[Site], Optional[bool]]:
        module = self.index.module(RUNTIME_WRAPPERS)
        if module is None:
            self.notes.append(f"no readable {self._display(RUNTIME_WRAPPERS)}: the lazy backward was not read")
            return None, None
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and (dotted(node.value.func) or "").rsplit(".", 1)[-1] == "bw_compiler" \
                    and any(_last_name(target) == "compiled_bw" for target in node.targets):
                scopes = module.enclosing_functions(node)
                site = Site(self._display(RUNTIME_WRAPPERS), node.lineno,
                            module.qualified_def_name(scopes[0]) if scopes else "<module>")
                self.notes.append(f"AOTAutograd's {site.function} ({site.file}:{site.line}) compiles the backward "
                                  "when the first backward runs")
                return site, True
        # Not recognised is not "absent": a refactored runtime may still compile lazily.
        self.notes.append(f"no `compiled_bw = ...bw_compiler(...)` in {self._display(RUNTIME_WRAPPERS)}: "
                          "whether the backward compiles lazily is unknown")
        return None, None

    def _non_lazy_option(self) -> Tuple[Optional[Site], Optional[bool]]:
        module = self.index.module(FUNCTORCH_CONFIG)
        if module is None:
            self.notes.append(f"no readable {self._display(FUNCTORCH_CONFIG)}: the non-lazy backward switch was "
                              "not read")
            return None, None
        stmt = module.variables.get(NON_LAZY_OPTION)
        if stmt is None:
            self.notes.append(f"{self._display(FUNCTORCH_CONFIG)} has no {NON_LAZY_OPTION}")
            return None, False
        return Site(self._display(FUNCTORCH_CONFIG), stmt.lineno, "<module>"), True

    def _site(self, module: Module, func: FunctionNode) -> Site:
        return Site(self._display(module.relpath), func.lineno, module.qualified_def_name(func))


def _handed_backward_compilers(module: Module) -> List[FunctionNode]:
    """The definitions named by `bw_compiler=NAME` keyword arguments, resolved in the call's scopes."""
    found: List[FunctionNode] = []
    for call in ast.walk(module.tree):
        if not isinstance(call, ast.Call):
            continue
        for keyword in call.keywords:
            if keyword.arg == "bw_compiler" and isinstance(keyword.value, ast.Name):
                definition = _local_def(module, module.enclosing_functions(call), keyword.value.id)
                if definition is not None and definition not in found:
                    found.append(definition)
    return found


def _local_def(module: Module, scopes: Sequence[FunctionNode], name: str) -> Optional[FunctionNode]:
    """The function `name` refers to from inside `scopes` (innermost first): a nested def, else a module one."""
    for scope in scopes:
        for node in _defined_in(scope):
            if node.name == name:
                return node
    return module.functions.get(name)


def _defined_in(func: ast.AST) -> Iterator[FunctionNode]:
    """Functions defined directly in `func`'s body (inside its if/with/try blocks too, not in nested defs)."""
    stack: List[ast.AST] = list(getattr(func, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, FUNCTION_DEFS):
            yield node
        elif not isinstance(node, (ast.Lambda, ast.ClassDef)):
            stack.extend(child for child in ast.iter_child_nodes(node)
                         if isinstance(child, (ast.stmt, ast.excepthandler)))


def _function_imports(func: FunctionNode) -> Dict[str, str]:
    """Names bound by `import`/`from ... import` statements inside a function (absolute imports only)."""
    names: Dict[str, str] = {}
    for node in own_nodes(func):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
    return names


def _last_name(target: ast.AST) -> Optional[str]:
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    return None
