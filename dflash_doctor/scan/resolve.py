"""What an expression names: a dotted import path (`torch.utils.checkpoint.checkpoint`), or, for the call
graph, a reference to a function, method, compiled callable or instance that the linker can follow across files.
"""
from __future__ import annotations

import ast
from typing import FrozenSet, NamedTuple, Optional, Union

from dflash_doctor.scan.scopes import Binding, Scope, ScopeTable

COMPILE_FUNCTIONS = frozenset({"torch.compile"})
PARTIAL_FUNCTIONS = frozenset({"functools.partial"})
_MAX_ALIAS_DEPTH = 8
_MAX_ELEMENTS = 16  # elements of a container tried before giving up


class FuncRef(NamedTuple):
    path: str
    qualname: str


class CompiledRef(NamedTuple):
    name: str
    path: str
    line: int


class LocalClass(NamedTuple):
    path: str
    qualname: str


class ExtRef(NamedTuple):
    """A dotted name imported into `path`; the linker decides whether it is project code."""

    dotted: str
    path: str


ClassRef = Union[LocalClass, ExtRef]


class MethodRef(NamedTuple):
    cls: ClassRef
    attr: str


class InstanceRef(NamedTuple):
    """Calling an instance runs its `__call__` (an nn.Module's `forward`)."""

    cls: ClassRef


class ParamRef(NamedTuple):
    """A method's parameter (`self.fn = fn` in `__init__`): what the class's construction sites pass for it."""

    cls: LocalClass
    method: str  # the method's name ("__init__")
    name: str
    position: int  # among the explicit arguments (self excluded); -1 keyword-only


Ref = Union[FuncRef, CompiledRef, MethodRef, InstanceRef, ExtRef, ParamRef]
Target = Union[Ref, LocalClass]  # what a module-level name can stand for: something callable, or a class


class Resolver:
    def __init__(self, table: ScopeTable, path: str, compile_names: FrozenSet[str] = frozenset({"compile"})):
        self.table = table
        self.path = path
        # Only these final names can resolve to torch.compile (a cheap test before any lookup).
        self.compile_names = compile_names

    # -- dotted names -------------------------------------------------------------------------------------

    def dotted(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> Optional[str]:
        """`tuc.checkpoint` -> `torch.utils.checkpoint.checkpoint` when `tuc` is that import; else None."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        if isinstance(expr, ast.Name):
            binding = self.table.lookup(expr.id, scope, line)
            return self._binding_dotted(binding, depth)
        if isinstance(expr, ast.Attribute):
            owner = self.table.self_class(expr.value, scope, line)
            if owner is not None:
                bindings = self.table.attributes(owner).get(expr.attr)
                return self._binding_dotted(bindings[-1], depth) if bindings else None
            base = self.dotted(expr.value, scope, line, depth + 1)
            return f"{base}.{expr.attr}" if base else None
        return None

    def _binding_dotted(self, binding: Optional[Binding], depth: int) -> Optional[str]:
        if binding is None:
            return None
        if binding.kind == "import":
            return binding.target
        if binding.kind == "assign" and isinstance(binding.node, (ast.Name, ast.Attribute)):
            return self.dotted(binding.node, binding.scope, binding.line, depth + 1)
        return None

    def is_compile(self, expr: ast.AST, scope: Scope, line: int) -> bool:
        final = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
        return final in self.compile_names and self.dotted(expr, scope, line) in COMPILE_FUNCTIONS

    def is_compile_call(self, expr: ast.AST, scope: Scope, line: int) -> bool:
        return isinstance(expr, ast.Call) and self.is_compile(expr.func, scope, line)

    def is_partial_call(self, expr: ast.AST, scope: Scope, line: int) -> bool:
        return (
            isinstance(expr, ast.Call) and bool(expr.args)
            and self.dotted(expr.func, scope, line) in PARTIAL_FUNCTIONS
        )

    def name_binding(self, name: ast.Name, scope: Scope, line: int) -> Optional[Binding]:
        """The binding `name` reads at `line`. A name read on the right of its own assignment reads the binding
        before it (`net = nn.DataParallel(net)`: the argument is the compiled `net` of the line above)."""
        binding = self.table.lookup(name.id, scope, line)
        if binding is None or binding.kind != "assign" or binding.line != line or not _encloses(binding.node, name):
            return binding
        earlier = self.table.lookup(name.id, scope, line - 1)
        return None if earlier is binding else earlier

    def value_binding(self, expr: ast.AST, scope: Scope, line: int) -> Optional[Binding]:
        """The binding a Name or `self.attr` refers to (last assignment for attributes)."""
        if isinstance(expr, ast.Name):
            return self.name_binding(expr, scope, line)
        if isinstance(expr, ast.Attribute):
            owner = self.table.self_class(expr.value, scope, line)
            if owner is not None and self.table.attributes(owner).get(expr.attr):
                return self.table.attributes(owner)[expr.attr][-1]
        return None

    # -- call-graph references ----------------------------------------------------------------------------

    def callee(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> Optional[Ref]:
        """What calling `expr` runs, as far as this file can tell."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        if isinstance(expr, ast.Name):
            return self.binding_callee(self.name_binding(expr, scope, line), expr.id, depth)
        if isinstance(expr, ast.Attribute):
            owner = self.table.self_class(expr.value, scope, line)
            if owner is not None:
                return MethodRef(LocalClass(self.path, owner.qualname), expr.attr)
            dotted = self.dotted(expr, scope, line)
            if dotted:
                return ExtRef(dotted, self.path)
            receiver = self.instance_class(expr.value, scope, line, depth + 1)
            return MethodRef(receiver, expr.attr) if receiver is not None else None
        if isinstance(expr, ast.Lambda):
            return FuncRef(self.path, self.table.scope_for(expr, scope).qualname)
        if isinstance(expr, ast.Subscript):  # fns["step"], self.layers[i]
            return self.element_callee(expr.value, scope, line, depth + 1, key=expr.slice)
        if isinstance(expr, ast.Call):
            if self.is_compile_call(expr, scope, line):
                return CompiledRef(describe(expr), self.path, expr.lineno)
            if self.is_partial_call(expr, scope, line):
                return self.callee(expr.args[0], scope, line, depth + 1)
            cls = self.class_ref(expr.func, scope, line, depth + 1)
            return InstanceRef(cls) if cls is not None else None
        return None

    def binding_callee(self, binding: Optional[Binding], name: str, depth: int = 0) -> Optional[Ref]:
        if binding is None:
            return None
        if binding.kind == "def":
            return FuncRef(self.path, self.table.opened_by(binding).qualname)
        if binding.kind == "class":
            return MethodRef(LocalClass(self.path, self.table.opened_by(binding).qualname), "__init__")
        if binding.kind == "import":
            return ExtRef(binding.target, self.path)
        if binding.kind == "compiled":
            return CompiledRef(name, self.path, binding.line)
        if binding.kind == "assign":
            return self.value_callee(binding.node, binding.scope, binding.line, name, depth + 1)
        if binding.kind == "iter":
            return self.element_callee(binding.node, binding.scope, binding.line, depth + 1)
        return None

    def element_callee(self, container: Optional[ast.AST], scope: Scope, line: int, depth: int = 0,
                       key: Optional[ast.AST] = None) -> Optional[Ref]:
        """What calling an element of `container` runs: a list/tuple/set/dict display, a comprehension, or a
        constructor given one (nn.ModuleList([...]), nn.Sequential(*[...])), directly or through a name or
        `self.attr`. A constant key picks its element; otherwise the first element that resolves stands in."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        if isinstance(container, (ast.Name, ast.Attribute)):
            binding = self.value_binding(container, scope, line)
            if binding is None or binding.kind != "assign":
                return None
            return self.element_callee(binding.node, binding.scope, binding.line, depth + 1, key)
        if isinstance(container, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            # the table has no scopes for comprehensions: their element is resolved in the enclosing scope
            return self.callee(container.elt, scope, line, depth + 1)
        if isinstance(container, ast.Dict):
            pairs = list(zip(container.keys, container.values))
            if isinstance(key, ast.Constant):
                pairs = [p for p in pairs if isinstance(p[0], ast.Constant) and p[0].value == key.value] or pairs
            elements = [value for _, value in pairs]
        elif isinstance(container, (ast.List, ast.Tuple, ast.Set)):
            elements = [e.value if isinstance(e, ast.Starred) else e for e in container.elts]
            if isinstance(key, ast.Constant) and isinstance(key.value, int) and -len(elements) <= key.value < len(
                    elements):
                elements = [elements[key.value]]
        elif isinstance(container, ast.Call) and container.args:
            first = container.args[0]
            return self.element_callee(first.value if isinstance(first, ast.Starred) else first, scope, line,
                                       depth + 1, key)
        else:
            return None
        for element in elements[:_MAX_ELEMENTS]:
            ref = self.callee(element, scope, line, depth + 1)
            if ref is not None:
                return ref
        return None

    def value_callee(self, value: Optional[ast.AST], scope: Scope, line: int, name: str,
                     depth: int = 0) -> Optional[Ref]:
        """What calling a name bound to `value` runs."""
        if isinstance(value, ast.Call):
            if self.is_compile_call(value, scope, line):
                return CompiledRef(name, self.path, line)
            if self.is_partial_call(value, scope, line):
                return self.callee(value.args[0], scope, line, depth + 1)
            cls = self.class_ref(value.func, scope, line, depth + 1)
            return InstanceRef(cls) if cls is not None else None
        if isinstance(value, (ast.Name, ast.Attribute, ast.Lambda)):
            return self.callee(value, scope, line, depth + 1)
        return None

    def class_ref(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> Optional[ClassRef]:
        """The class `expr` names (for `x = Expr(...)`); imported names are left to the linker."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        if isinstance(expr, ast.Name):
            binding = self.table.lookup(expr.id, scope, line)
            if binding is None:
                return None
            if binding.kind == "class":
                return LocalClass(self.path, self.table.opened_by(binding).qualname)
            if binding.kind == "import":
                return ExtRef(binding.target, self.path)
            if binding.kind == "assign" and isinstance(binding.node, (ast.Name, ast.Attribute)):
                return self.class_ref(binding.node, binding.scope, binding.line, depth + 1)
            return None
        if isinstance(expr, ast.Attribute):
            dotted = self.dotted(expr, scope, line)
            return ExtRef(dotted, self.path) if dotted else None
        return None

    def instance_class(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> Optional[ClassRef]:
        """The class of the instance `expr` evaluates to, when it was built by a visible `Class(...)` call."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        owner = self.table.self_class(expr, scope, line)
        if owner is not None:
            return LocalClass(self.path, owner.qualname)
        if isinstance(expr, ast.Call):  # `Tracer().trace(m)`: a method of an instance built on the spot
            if self.is_compile_call(expr, scope, line):
                return None
            return self.class_ref(expr.func, scope, line, depth + 1)
        binding = self.value_binding(expr, scope, line)
        if binding is not None and binding.kind == "assign" and isinstance(binding.node, ast.Call):
            if self.is_compile_call(binding.node, binding.scope, binding.line):
                return None
            return self.class_ref(binding.node.func, binding.scope, binding.line, depth + 1)
        return None


def describe(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):  # pragma: no cover - absurdly deep expressions
        return "<expression>"
    return text if len(text) <= 80 else text[:77] + "..."


def _encloses(outer: Optional[ast.AST], inner: ast.AST) -> bool:
    """Whether `inner` lies inside `outer`'s source span (positions, not identity: the AST is not re-walked)."""
    if outer is None or not hasattr(outer, "end_lineno") or not hasattr(inner, "end_lineno"):
        return False
    start = (outer.lineno, outer.col_offset)  # type: ignore[attr-defined]
    end = (outer.end_lineno, outer.end_col_offset)  # type: ignore[attr-defined]
    return start <= (inner.lineno, inner.col_offset) and (inner.end_lineno, inner.end_col_offset) <= end  # type: ignore[attr-defined]
