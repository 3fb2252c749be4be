"""Read, from a torch's own source, whether torch.fx's tracing patches reach every thread: the FX patcher race.

In `fx/_symbolic_trace.py` (AST only, nothing imported):

1. `Tracer.trace` calls `<patcher>.patch_method(torch.nn.Module, "__call__" | "__getattr__", ...)`: the tracer
   replaces the methods on the class, which every thread's modules use (`_PatchedFnSetAttr.patch` is a
   `setattr` on the class in every release read);
2. where the active patcher lives: the module variable `CURRENT_PATCHER`, written under `global` by
   `_new_patcher` (a module global: traces in two threads restore each other's; 2.5 and later), an attribute of a
   `threading.local()` (per thread), or nowhere (2.4: `with _Patcher() as patcher` inside the trace);
3. the `raise NameError("module is not installed as a submodule")` another thread's eager module call ends in.

The hazard is present where the class is patched and the patcher is not per thread, absent where the patcher is
per thread, unknown otherwise. docs/guards-releases.md shows what each release decides.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from dflash_doctor.guards.pyindex import FUNCTION_DEFS, Index, Module, dotted, own_nodes

SYMBOLIC_TRACE = "fx/_symbolic_trace.py"
PATCHER_NAME = "CURRENT_PATCHER"
PATCHED_METHODS = ("__call__", "__getattr__")
NAME_ERROR_TEXT = "module is not installed as a submodule"
MODULE_GLOBAL, THREAD_LOCAL = "module-global", "thread-local"


@dataclass(frozen=True)
class PatchSite:
    file: str
    line: int
    what: str  # `torch.nn.Module.__call__`, `CURRENT_PATCHER`, `NameError`

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "what": self.what}


@dataclass(frozen=True)
class FxPatches:
    """What `Tracer.trace` patches and where its patcher lives; None where the source did not say."""

    class_patches: Tuple[PatchSite, ...] = ()  # the patch_method calls on torch.nn.Module in Tracer.trace
    patcher: Optional[PatchSite] = None  # CURRENT_PATCHER's definition (or the thread-local holding it)
    patcher_storage: Optional[str] = None  # module-global | thread-local
    patcher_writer: Optional[PatchSite] = None  # the function setting it (`_new_patcher`)
    name_errors: Tuple[PatchSite, ...] = ()  # where another thread's module call raises
    notes: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def patches_classes(self) -> Optional[bool]:
        return True if self.class_patches else None

    @property
    def isolated(self) -> Optional[bool]:
        """The release keeps the patches to the tracing thread (its patcher is per thread)."""
        if self.patcher_storage == THREAD_LOCAL:
            return True
        if self.class_patches:  # on the class, with a global patcher or one local to the trace (2.4)
            return False
        return None

    def to_dict(self) -> dict:
        return {"isolated": self.isolated, "patches_classes": self.patches_classes,
                "patcher_storage": self.patcher_storage,
                "class_patches": [s.to_dict() for s in self.class_patches],
                "patcher": self.patcher.to_dict() if self.patcher else None,
                "patcher_writer": self.patcher_writer.to_dict() if self.patcher_writer else None,
                "name_errors": [s.to_dict() for s in self.name_errors], "notes": list(self.notes)}


def read_fx_patches(index: Index) -> FxPatches:
    module = index.module(SYMBOLIC_TRACE)
    display = index.tree.display_path(SYMBOLIC_TRACE)
    if module is None:
        return FxPatches(notes=(f"no readable {display}: the FX patcher was not read",))
    notes: List[str] = []
    class_patches = _class_patches(module, display)
    if class_patches:
        notes.append(f"Tracer.trace replaces torch.nn.Module.{' and '.join(s.what for s in class_patches)} on the "
                     f"class, for every thread ({display}:{class_patches[0].line})")
    else:
        notes.append(f"no patch_method(torch.nn.Module, ...) call in Tracer.trace ({display})")
    patcher, storage, writer = _patcher(index, module, display)
    if patcher is None:
        notes.append(f"no {PATCHER_NAME} and no thread-local patcher in {display}: each trace's patcher is its "
                     "own, its patches still on the class")
    else:
        notes.append(f"the active patcher {patcher.what} ({display}:{patcher.line}) is {storage}"
                     + (f", set by {writer.what} (line {writer.line})" if writer else ""))
    errors = tuple(sorted((PatchSite(display, node.lineno, "NameError") for node in ast.walk(module.tree)
                           if isinstance(node, ast.Raise) and _raises_name_error(node)), key=lambda s: s.line))
    return FxPatches(class_patches, patcher, storage, writer, errors, tuple(notes))


def _class_patches(module: Module, display: str) -> Tuple[PatchSite, ...]:
    tracer = module.classes.get("Tracer")
    trace = next((node for node in (tracer.body if tracer else []) if isinstance(node, FUNCTION_DEFS)
                  and node.name == "trace"), None)
    if trace is None:
        return ()
    found = []
    for node in ast.walk(trace):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "patch_method" and len(node.args) >= 2):
            continue
        owner, method = dotted(node.args[0]), node.args[1]
        if owner and owner.endswith("nn.Module") and isinstance(method, ast.Constant) \
                and method.value in PATCHED_METHODS:
            found.append(PatchSite(display, method.lineno, str(method.value)))
    return tuple(sorted(found, key=lambda s: s.line))


def _patcher(index: Index, module: Module, display: str
             ) -> Tuple[Optional[PatchSite], Optional[str], Optional[PatchSite]]:
    """CURRENT_PATCHER as a module global written under `global`, or a thread-local written by _new_patcher."""
    stmt = module.variables.get(PATCHER_NAME)
    if stmt is not None and index.variable_kind(module, PATCHER_NAME) == MODULE_GLOBAL:
        writer = _global_writer(module, display)
        return PatchSite(display, stmt.lineno, PATCHER_NAME), MODULE_GLOBAL, writer
    new_patcher = module.functions.get("_new_patcher")
    if new_patcher is None:
        return None, None, None
    for node in own_nodes(new_patcher):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                owner = target.value if isinstance(target, ast.Attribute) else None
                name = owner.id if isinstance(owner, ast.Name) else None
                if name in module.variables and index.variable_kind(module, name) == THREAD_LOCAL:
                    variable = module.variables[name]
                    assert isinstance(target, ast.Attribute)
                    return (PatchSite(display, variable.lineno, f"{name}.{target.attr}"), THREAD_LOCAL,
                            PatchSite(display, node.lineno, "_new_patcher"))
    return None, None, None


def _global_writer(module: Module, display: str) -> Optional[PatchSite]:
    for func in ast.walk(module.tree):
        if not isinstance(func, FUNCTION_DEFS):
            continue
        nodes = list(own_nodes(func))
        if not any(isinstance(n, ast.Global) and PATCHER_NAME in n.names for n in nodes):
            continue
        for node in nodes:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PATCHER_NAME
                                                    for t in node.targets):
                return PatchSite(display, node.lineno, module.qualified_def_name(func))
    return None


def _raises_name_error(node: ast.Raise) -> bool:
    exc = node.exc
    return (isinstance(exc, ast.Call) and dotted(exc.func) == "NameError" and bool(exc.args)
            and isinstance(exc.args[0], ast.Constant) and exc.args[0].value == NAME_ERROR_TEXT)
