"""A small symbol table over one module: which scope binds which name, at which line, to what.

Flow-insensitive on purpose (like pyflakes): inside a function a name is local wherever it is bound; at module
level, a use sees the last binding above it, and code inside functions sees the module's final binding. That is
enough to tell `torch.utils.checkpoint.checkpoint` imported under any alias from a local `def checkpoint`.
"""
from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
DEFINITION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # the statements among SCOPE_NODES
FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda]
ScopeNode = Union[FunctionNode, ast.ClassDef]

# What `from M import *` binds, for the few modules the rules care about.
STAR_EXPORTS = {
    "torch.utils.checkpoint": ("checkpoint", "checkpoint_sequential"),
    "torch.nn.attention.flex_attention": ("flex_attention",),
    "threading": ("Thread", "Timer"),
    "concurrent.futures": ("ThreadPoolExecutor",),
    "functools": ("partial",),
    "torch": ("compile",),
}


@dataclass(eq=False)
class Binding:
    kind: str  # import | assign | with | def | class | param | compiled | local | iter
    line: int
    scope: "Scope"
    target: str = ""  # the dotted name an import binds
    node: Optional[ast.AST] = None  # assigned value, with-item expression, or the def/class/lambda node


@dataclass(eq=False)
class Scope:
    kind: str  # module | function | lambda | class
    node: Union[ast.Module, ScopeNode]
    parent: Optional["Scope"]
    qualname: str  # "" for the module; Python-style otherwise (Outer.method, f.<locals>.g)
    bindings: Dict[str, List[Binding]] = field(default_factory=dict)
    # per name, the lines of its bindings (sorted, like the lists above once collected): lookups bisect them
    binding_lines: Dict[str, List[int]] = field(default_factory=dict)
    global_names: Set[str] = field(default_factory=set)
    self_name: Optional[str] = None  # a method's first parameter
    owner: Optional["Scope"] = None  # a method's class scope
    # class scopes only: `self.<attr> = value` anywhere in the class's methods
    attributes: Dict[str, List[Binding]] = field(default_factory=dict)

    @property
    def enclosing(self) -> "Scope":
        """The scope a def, class or lambda is defined in."""
        if self.parent is None:
            raise ValueError("the module scope has no enclosing scope")
        return self.parent

    @property
    def module(self) -> "Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)

    def child_qualname(self, name: str) -> str:
        if self.kind == "module":
            return name
        if self.kind == "class":
            return f"{self.qualname}.{name}"
        return f"{self.qualname}.<locals>.{name}"


def _spans(node: ast.AST, lines: List[int]) -> bool:
    start = getattr(node, "lineno", None)
    if start is None:
        return True
    index = bisect.bisect_left(lines, start)
    return index < len(lines) and lines[index] <= (getattr(node, "end_lineno", None) or start)


def _stored(statement: ast.AST) -> List[ast.expr]:
    """The assignment targets of one statement (what it stores, whatever the value)."""
    if isinstance(statement, ast.Assign):
        return list(statement.targets)
    if isinstance(statement, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        return [statement.target]
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return [item.optional_vars for item in statement.items if item.optional_vars is not None]
    return []


def _names(target: ast.AST) -> List[ast.Name]:
    """The plain names a target stores into (`a, (b, *c) = ...`); attributes and subscripts bind no name."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names(element)]
    return []


def lambda_name(node: ast.Lambda) -> str:
    return f"<lambda:{node.lineno}:{node.col_offset + 1}>"


def resolve_relative(level: int, module: Optional[str], package: Optional[str]) -> Optional[str]:
    if not level:
        return module
    if not package:
        return None
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None


class ScopeTable:
    """The scopes of one module, created as the walk reaches them; each scope's bindings are collected the first
    time something is looked up in it, so a file where only a few calls matter costs only a few scopes. Nothing
    here recurses over the AST (deep files must not overflow the stack)."""

    def __init__(self, tree: ast.Module, package: Optional[str] = None, global_lines: Sequence[int] = (),
                 walrus_lines: Optional[Sequence[int]] = None):
        self.package = package
        self.tree = tree
        # Lines that may hold `:=` (None: any line): only statements spanning one are searched for walrus targets.
        self.walrus_lines = None if walrus_lines is None else sorted(walrus_lines)
        # Lines holding a `global` statement: the functions around them rebind module names (collected before the
        # module's names are first looked up).
        self._global_lines = sorted(global_lines)
        self.module = Scope("module", tree, None, "")
        self.scope_of: Dict[ast.AST, Scope] = {tree: self.module}
        self.by_qualname: Dict[str, Scope] = {}
        self._collected: Set[Scope] = set()
        self._attributes_collected: Set[Scope] = set()

    def release(self) -> None:
        """Break the scope <-> binding cycles so the AST is freed at once, without the cyclic collector."""
        for scope in self.scope_of.values():
            scope.bindings.clear()
            scope.attributes.clear()
        self.scope_of.clear()
        self.by_qualname.clear()

    # -- building -------------------------------------------------------------------------------------------

    def scope_for(self, node: ScopeNode, parent: Scope) -> Scope:
        """The scope a def, class or lambda opens (created on first use; `parent` is where it is defined)."""
        scope = self.scope_of.get(node)
        if scope is not None:
            return scope
        if isinstance(node, ast.ClassDef):
            scope = Scope("class", node, parent, parent.child_qualname(node.name))
        elif isinstance(node, ast.Lambda):
            scope = Scope("lambda", node, parent, parent.child_qualname(lambda_name(node)))
        else:
            scope = Scope("function", node, parent, parent.child_qualname(node.name))
            positional = node.args.posonlyargs + node.args.args
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
            if parent.kind == "class" and positional and not static:
                scope.self_name = positional[0].arg
                scope.owner = parent
        if not isinstance(node, ast.ClassDef):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None:
                    scope.bind(arg.arg, Binding("param", node.lineno, scope))
        self.scope_of[node] = scope
        self.by_qualname.setdefault(scope.qualname, scope)
        return scope

    def opened_by(self, binding: Binding) -> Scope:
        """The scope a "def" or "class" binding's statement opens."""
        node = binding.node
        if not isinstance(node, SCOPE_NODES):
            raise TypeError(f"a {binding.kind!r} binding opens no scope")
        return self.scope_for(node, binding.scope)

    def bindings(self, scope: Scope) -> Dict[str, List[Binding]]:
        if scope not in self._collected:
            self._collected.add(scope)
            self._collect(scope)
            for bindings in scope.bindings.values():
                bindings.sort(key=lambda b: b.line)  # stable: same-line bindings keep their order
        return scope.bindings

    def attributes(self, cls: Scope) -> Dict[str, List[Binding]]:
        """`self.<attr> = ...` bindings from every method of `cls`."""
        if cls not in self._attributes_collected:
            self._attributes_collected.add(cls)
            for binding in [b for bs in self.bindings(cls).values() for b in bs if b.kind == "def"]:
                self.bindings(self.opened_by(binding))
        return cls.attributes

    def _collect(self, scope: Scope) -> None:
        """Bind what one scope's statements bind. Only statements are visited (bodies of if/for/while/try/with,
        never expressions): expressions bind nothing but walrus targets, looked for only in files that contain
        `:=`. Walking every expression node made binding collection the largest cost of a scan."""
        node = scope.node
        if isinstance(node, ast.Lambda):
            self._collect_walrus(scope, [node.body])
            return
        handled: Set[ast.Name] = set()
        statements: List[ast.stmt] = list(node.body)
        stack = list(reversed(statements))
        while stack:
            statement = stack.pop()
            if isinstance(statement, DEFINITION_NODES):
                self.scope_for(statement, scope)
                kind = "class" if isinstance(statement, ast.ClassDef) else "def"
                scope.bind(statement.name, Binding(kind, statement.lineno, scope, node=statement))
                continue
            self._bind_statement(scope, statement, handled)
            for target in _stored(statement):
                for name in _names(target):
                    if name not in handled:
                        scope.bind(name.id, Binding("local", name.lineno, scope))
            children: List[ast.stmt] = []
            for field_name in ("body", "orelse", "finalbody"):
                value = getattr(statement, field_name, None)
                if isinstance(value, list):
                    children.extend(value)
            for handler in getattr(statement, "handlers", ()) or ():
                if handler.name:
                    scope.bind(handler.name, Binding("local", handler.lineno, scope))
                children.extend(handler.body)
            for case in getattr(statement, "cases", ()) or ():
                children.extend(case.body)
            statements.extend(children)
            stack.extend(reversed(children))
        self._collect_walrus(scope, statements)

    def _collect_walrus(self, scope: Scope, roots: Sequence[ast.AST]) -> None:
        """`(name := value)` inside expressions of this scope (not of nested functions or lambdas), searched only
        in the statements that span a line holding `:=`."""
        lines = self.walrus_lines
        if lines is not None:
            if not lines:
                return
            roots = [r for r in roots if _spans(r, lines)]
        stack = list(roots)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                scope.bind(node.target.id, Binding("assign", node.lineno, scope, node=node.value))
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, (ast.stmt, ast.Lambda, ast.excepthandler)):
                    stack.append(child)

    def _bind_statement(self, scope: Scope, node: ast.AST, handled: Set[ast.Name]) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    scope.bind(alias.asname, Binding("import", node.lineno, scope, target=alias.name))
                else:
                    first = alias.name.split(".")[0]
                    scope.bind(first, Binding("import", node.lineno, scope, target=first))
        elif isinstance(node, ast.ImportFrom):
            module = resolve_relative(node.level, node.module, self.package)
            for alias in node.names:
                if alias.name == "*":
                    for name in STAR_EXPORTS.get(module or "", ()):
                        scope.bind(name, Binding("import", node.lineno, scope, target=f"{module}.{name}"))
                    continue
                bound = alias.asname or alias.name
                if module is None:
                    scope.bind(bound, Binding("local", node.lineno, scope))
                else:
                    scope.bind(bound, Binding("import", node.lineno, scope, target=f"{module}.{alias.name}"))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(scope, target, node.value, node.lineno, handled)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._bind_target(scope, node.target, node.value, node.lineno, handled)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if isinstance(item.optional_vars, ast.Name):
                    handled.add(item.optional_vars)
                    scope.bind(item.optional_vars.id, Binding("with", node.lineno, scope, node=item.context_expr))
                else:
                    self._bind_self_attribute(scope, item.optional_vars, item.context_expr, node.lineno, "with")
        elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name):
            # `for layer in self.layers:` binds an element of the container (resolve.element_callee follows it)
            handled.add(node.target)
            scope.bind(node.target.id, Binding("iter", node.lineno, scope, node=node.iter))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            if isinstance(node, ast.Global):
                scope.global_names.update(node.names)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            # `model.compile()` (nn.Module.compile) compiles in place; re.compile() always has a pattern argument.
            call = node.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "compile" and not call.args:
                receiver = call.func.value
                if isinstance(receiver, ast.Name):
                    scope.bind(receiver.id, Binding("compiled", node.lineno, scope, node=receiver))
                else:
                    self._bind_self_attribute(scope, receiver, receiver, node.lineno, "compiled")

    def _bind_target(self, scope: Scope, target: ast.AST, value: ast.AST, line: int, handled: Set[ast.Name]) -> None:
        if isinstance(target, ast.Name):
            handled.add(target)
            scope.bind(target.id, Binding("assign", line, scope, node=value))
            if target.id in scope.global_names and scope.parent is not None:
                # `global jit_fuser; jit_fuser = torch.compile`: the module's name now has this value too
                scope.module.bind(target.id, Binding("assign", line, scope, node=value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for sub_target, sub_value in zip(target.elts, value.elts):
                    self._bind_target(scope, sub_target, sub_value, line, handled)
        else:
            self._bind_self_attribute(scope, target, value, line, "assign")

    def _bind_self_attribute(self, scope: Scope, target: Optional[ast.AST], value: ast.AST, line: int,
                             kind: str) -> None:
        """`self.<attr> = value` in a method (or a closure inside one) binds an attribute of the method's class;
        any other target binds nothing here."""
        method = self.method_of(scope)
        if (
            isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and method is not None and method.owner is not None and target.value.id == method.self_name
        ):
            method.owner.attributes.setdefault(target.attr, []).append(Binding(kind, line, scope, node=value))

    # -- lookups --------------------------------------------------------------------------------------------

    @staticmethod
    def method_of(scope: Optional[Scope]) -> Optional[Scope]:
        """The method whose `self` is visible from `scope` (a method, or a closure inside one)."""
        while scope is not None and scope.kind in ("function", "lambda"):
            if scope.owner is not None:
                return scope
            scope = scope.parent
        return None

    def _collect_global_rebindings(self) -> None:
        """Collect every function that holds a `global` statement, visiting only the subtrees around those lines."""
        lines, self._global_lines = self._global_lines, []
        stack: List[Tuple[ast.AST, Scope]] = [(child, self.module) for child in self.tree.body]
        while stack:
            node, parent = stack.pop()
            start, end = getattr(node, "lineno", 0), getattr(node, "end_lineno", 0) or 0
            index = bisect.bisect_left(lines, start)
            if index >= len(lines) or lines[index] > end:
                continue
            if isinstance(node, SCOPE_NODES):
                inner = self.scope_for(node, parent)
                if not isinstance(node, ast.ClassDef):
                    self.bindings(inner)
                body = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
                stack.extend((child, inner) for child in body)
            else:
                stack.extend((child, parent) for child in ast.iter_child_nodes(node))

    def lookup(self, name: str, scope: Scope, line: int) -> Optional[Binding]:
        if self._global_lines:
            self._collect_global_rebindings()
        current: Optional[Scope] = scope
        nested = False
        while current is not None:
            if current.kind == "class" and nested:
                current = current.parent
                continue
            bindings = self.bindings(current).get(name)
            if name in current.global_names and current.parent is not None:
                current, nested = current.module, True
                continue
            if bindings:
                if current.kind == "module" and nested:
                    return bindings[-1]
                lines = current.binding_lines.get(name)
                if lines is None or len(lines) != len(bindings):
                    bindings.sort(key=lambda b: b.line)  # a `global` rebinding may have been added out of order
                    lines = current.binding_lines[name] = [b.line for b in bindings]
                above = bisect.bisect_right(lines, line)
                if above:
                    return bindings[above - 1]
                return bindings[-1] if current.kind in ("function", "lambda") else None
            if current.kind != "class":
                nested = True
            current = current.parent
        return None

    def self_class(self, node: ast.AST, scope: Scope, line: int) -> Optional[Scope]:
        """The class scope when `node` is a method's `self` (or `cls`)."""
        if not isinstance(node, ast.Name):
            return None
        method = self.method_of(scope)
        if method is None or method.self_name != node.id:
            return None
        binding = self.lookup(node.id, scope, line)
        if binding is None or binding.kind != "param":
            return None
        owner_scope = binding.scope
        if owner_scope.owner is not None and owner_scope.self_name == node.id:
            return owner_scope.owner
        return None


def walk(table: ScopeTable, lines: Optional[List[int]] = None) -> Iterator[Tuple[ast.AST, Scope]]:
    """(node, scope) pairs in source order; decorators, defaults and bases belong to the enclosing scope.

    With `lines`, only subtrees whose line span holds one of those lines are entered."""
    def wanted(node: ast.AST) -> bool:
        start = getattr(node, "lineno", None)
        if lines is None or start is None:
            return True
        decorators = getattr(node, "decorator_list", None)
        if decorators:  # a def's lineno is its `def` line; decorators sit above it
            start = min(start, decorators[0].lineno)
        index = bisect.bisect_left(lines, start)
        return index < len(lines) and lines[index] <= (getattr(node, "end_lineno", None) or start)

    stack: List[Tuple[ast.AST, Scope]] = [(child, table.module) for child in reversed(table.tree.body) if wanted(child)]
    while stack:
        node, scope = stack.pop()
        yield node, scope
        if not isinstance(node, SCOPE_NODES):
            stack.extend((child, scope) for child in reversed(list(ast.iter_child_nodes(node))) if wanted(child))
            continue
        inner = table.scope_for(node, scope)
        outer: List[ast.expr]
        body: Sequence[ast.AST]
        if isinstance(node, ast.Lambda):
            outer = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            body = [node.body]
        elif isinstance(node, ast.ClassDef):
            outer = node.decorator_list + node.bases + [k.value for k in node.keywords]
            body = node.body
        else:
            outer = node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            body = node.body
        stack.extend((child, inner) for child in reversed(body) if wanted(child))
        stack.extend((child, scope) for child in reversed(outer) if wanted(child))
