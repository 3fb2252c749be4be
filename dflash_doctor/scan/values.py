"""What an expression may evaluate to, on each of its paths, as far as one file shows: a small value resolver any
check can use (DFD1xx judge `use_reentrant` and `gradient_checkpointing` with it).

A path is a node (a literal, a call, a dict...) or None where the file cannot tell (a caller's argument, a value
read at run time). Followed, each to every value it is bound to in its scope (flow-insensitive, like the rest of
scan): a name or `self.attr` to its assignments; a parameter to its default (unless the function rebinds it), beside None for what a caller may pass;
an attribute of an instance of a class this file defines (built here, or a parameter annotated with the class) to
the class's field default (`x: bool = True`, `x: bool = field(default=True)`, `default_factory=...`), and the
same field of a method's own `self`; `d["key"]` to the key's value in the dict literal `d` is bound to; `getattr(o,
"name"[, default])` to `o.name` (and its default); an if-expression to the branches a supported torch takes.
"""
from __future__ import annotations

import ast
from typing import Callable, List, Optional

from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.resolve import LocalClass
from dflash_doctor.scan.scopes import Binding, Scope
from dflash_doctor.scan.versions import supported_branches

MAX_DEPTH = 6  # names bound to names bound to names...
Paths = List[Optional[ast.AST]]
# A check's own addition to a binding's value (checkpointing.py: a dict's later `d["k"] = v` assignments); returns
# the paths to use instead, or None to keep the resolver's.
Augment = Callable[[Binding, str, Optional[ast.AST]], Optional[Paths]]
DATACLASS_FIELD = frozenset({"field", "dataclasses.field", "attr.ib", "attrs.field", "pydantic.Field"})


def getattr_attribute(node: ast.AST) -> Optional[ast.Attribute]:
    """`getattr(obj, "name")` (with or without a default) as the attribute `obj.name`, positioned like the call."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) in (2, 3) and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and node.args[1].value.isidentifier()):
        return ast.copy_location(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()), node)
    return None


def _falsy(node: Optional[ast.AST]) -> bool:
    """A literal Python treats as false (`None`, `False`, `0`, `""`, `{}`, `[]`)."""
    if isinstance(node, ast.Constant):
        return not node.value
    return isinstance(node, (ast.Dict, ast.List, ast.Tuple)) and not (
        node.keys if isinstance(node, ast.Dict) else node.elts)


def parameter_default(binding: Binding, name: str) -> Optional[ast.expr]:
    """The default of parameter `name` of the function `binding` belongs to (None when it has none)."""
    function = binding.scope.node
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return None
    args = function.args
    positional = args.posonlyargs + args.args
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        if arg.arg == name:
            return default
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name:
            return kw_default
    return None


def parameter_annotation(binding: Binding, name: str) -> Optional[ast.expr]:
    function = binding.scope.node
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = function.args
    return next((a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg == name), None)


class Values:
    """The paths of expressions in one file (`ctx`); `augment` lets a check add what it saw of a binding."""

    def __init__(self, ctx: FileContext, augment: Optional[Augment] = None) -> None:
        self.ctx = ctx
        self.augment = augment

    def field_default(self, value: Optional[ast.AST], scope: Scope, line: int) -> Optional[ast.AST]:
        """`field(default=X)` -> X, `field(default_factory=lambda: X)` -> X, `default_factory=dict` -> {}; any
        other value is itself."""
        if not isinstance(value, ast.Call) or self.ctx.resolver.dotted(value.func, scope, line) not in DATACLASS_FIELD \
                and not (isinstance(value.func, ast.Name) and value.func.id == "field"):
            return value
        for keyword in value.keywords:
            if keyword.arg == "default":
                return keyword.value
            if keyword.arg == "default_factory":
                factory = keyword.value
                if isinstance(factory, ast.Lambda):
                    return factory.body
                if isinstance(factory, ast.Name) and factory.id == "dict":
                    return ast.Dict(keys=[], values=[])
                return None
        return value.args[0] if value.args else None

    def class_fields(self, cls: Scope, name: str, depth: int = 0) -> List[Binding]:
        """Class-level bindings of `name` in `cls` or, when it has none, in the first local base class that has."""
        table = self.ctx.table
        found = [b for b in table.bindings(cls).get(name, ()) if b.kind == "assign"]
        if found or depth > MAX_DEPTH or not isinstance(cls.node, ast.ClassDef) or cls.parent is None:
            return found
        for base in cls.node.bases:
            ref = self.ctx.resolver.class_ref(base, cls.parent, cls.node.lineno)
            parent = table.by_qualname.get(ref.qualname) if isinstance(ref, LocalClass) else None
            if parent is not None and parent.kind == "class":
                found = self.class_fields(parent, name, depth + 1)
                if found:
                    return found
        return found

    def instance_scope(self, receiver: ast.AST, scope: Scope, line: int) -> Optional[Scope]:
        """The class scope of a local class whose instance `receiver` is: built here by `Class(...)`, a method's
        self, or a parameter annotated with the class."""
        resolver, table = self.ctx.resolver, self.ctx.table
        cls = resolver.instance_class(receiver, scope, line)
        if cls is None and isinstance(receiver, ast.Name):
            binding = table.lookup(receiver.id, scope, line)
            annotation = parameter_annotation(binding, receiver.id) if binding and binding.kind == "param" else None
            if annotation is not None and binding is not None and binding.scope.parent is not None:
                cls = resolver.class_ref(annotation, binding.scope.parent, line)
        found = table.by_qualname.get(cls.qualname) if isinstance(cls, LocalClass) else None
        return found if found is not None and found.kind == "class" else None

    def paths(self, node: Optional[ast.AST], scope: Scope, line: int, depth: int = 0) -> Paths:
        if node is None or depth > MAX_DEPTH:
            return [None]
        if isinstance(node, ast.IfExp):
            # `{...} if is_torch_version(">=", "1.11") else {}`: only the branches a supported torch takes
            return [p for branch in supported_branches(node) for p in self.paths(branch, scope, line, depth + 1)]
        attribute = getattr_attribute(node)
        if attribute is not None:
            fallback = node.args[2:] if isinstance(node, ast.Call) else []
            return self.paths(attribute, scope, line, depth + 1) + [
                p for value in fallback for p in self.paths(value, scope, line, depth + 1)]
        if isinstance(node, ast.Subscript):
            return self._subscript(node, scope, line, depth)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            # `gc_kwargs or {"use_reentrant": True}`: a value of an operand, skipping those known to be falsy
            out: Paths = []
            for operand in node.values:
                out.extend(p for p in self.paths(operand, scope, line, depth + 1) if not _falsy(p))
            return out or [None]
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return [node]
        binding = self.ctx.resolver.value_binding(node, scope, line)
        if binding is None:
            if isinstance(node, ast.Attribute):
                return self._field(node, scope, line, depth)
            return [None]
        paths: Paths = []
        siblings = self._bindings_like(node, binding)
        # a value bound where only a torch without torch.compile goes (`else: ckpt_kwargs = {}` under a version
        # test) is not a value the name has on any supported release
        supported = [b for b in siblings if self.ctx.old_torch_only(b.line) is None]
        name = node.id if isinstance(node, ast.Name) else ""
        for sibling in supported or siblings:
            paths.extend(self._binding_paths(sibling, name, depth))
        return paths or [None]

    def _binding_paths(self, binding: Binding, name: str, depth: int) -> Paths:
        if binding.kind == "param":
            added = self.augment(binding, name, None) if self.augment else None
            if added is not None:
                return added
            default = parameter_default(binding, name) if name else None
            rebound = any(b.kind != "param" for b in self.ctx.table.bindings(binding.scope).get(name, ()))
            if default is None or rebound:
                # `if use_reentrant is None: use_reentrant = GLOBAL`: a default the function may replace before
                # use is not a value the name is known to have
                return [None]
            # the default on one path, and whatever a caller passes (not seen here) on the other
            return self.paths(default, binding.scope.enclosing, binding.line, depth + 1) + [None]
        if binding.kind != "assign":
            return [None]
        value = self.field_default(binding.node, binding.scope, binding.line) \
            if binding.scope.kind == "class" else binding.node
        out: Paths = []
        for path in self.paths(value, binding.scope, binding.line, depth + 1):
            added = self.augment(binding, name, path) if self.augment else None
            out.extend(added if added is not None else [path])
        return out

    def _field(self, node: ast.Attribute, scope: Scope, line: int, depth: int) -> Paths:
        cls = self.instance_scope(node.value, scope, line)
        if cls is None:
            return [node]
        fields = self.class_fields(cls, node.attr)
        if not fields:
            return [node]
        built = self._construction(node.value, scope, line)
        if built is not None:
            given = next((k.value for k in built.keywords if k.arg == node.attr), None)
            if given is not None:  # `Config(gradient_checkpointing=False)`: the constructor's value, not the default
                return self.paths(given, scope, line, depth + 1)
        defaults = [p for b in fields for p in self._binding_paths(b, node.attr, depth + 1)]
        if built is None or built.args or any(k.arg is None for k in built.keywords):
            # a parameter annotated with the class, `self`, or positional/**mapping arguments: another value may
            # have been given where it was built
            defaults.append(None)
        return defaults

    def _construction(self, receiver: ast.AST, scope: Scope, line: int) -> Optional[ast.Call]:
        """The `Class(...)` call a name was bound to, when it was."""
        if isinstance(receiver, ast.Call):
            return receiver
        binding = self.ctx.resolver.value_binding(receiver, scope, line) if isinstance(receiver, ast.Name) else None
        if binding is not None and binding.kind == "assign" and isinstance(binding.node, ast.Call):
            return binding.node
        return None

    def _subscript(self, node: ast.Subscript, scope: Scope, line: int, depth: int) -> Paths:
        key = node.slice
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            return [None]
        out: Paths = []
        for container in self.paths(node.value, scope, line, depth + 1):
            if not isinstance(container, ast.Dict):
                out.append(None)
                continue
            values = [v for k, v in zip(container.keys, container.values)
                      if isinstance(k, ast.Constant) and k.value == key.value]
            out.extend(p for v in values[-1:] for p in self.paths(v, scope, line, depth + 1))
            if not values:
                out.append(None)
        return out or [None]

    def _bindings_like(self, node: ast.AST, binding: Binding) -> List[Binding]:
        """Every binding of the name (in its scope) or `self.attr` (in its class) that `binding` is one of."""
        table = self.ctx.table
        if isinstance(node, ast.Name):
            return table.bindings(binding.scope).get(node.id, [binding])
        method = table.method_of(binding.scope)
        if method is None or method.owner is None or not isinstance(node, ast.Attribute):
            return [binding]
        return table.attributes(method.owner).get(node.attr, [binding])
