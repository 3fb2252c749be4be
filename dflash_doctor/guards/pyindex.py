"""A small name-resolving index over a few torch modules, enough to follow a guard to the state it reads.

It resolves what a name or attribute chain refers to (`is_fx_symbolic_tracing` bound in an enclosing function
to `torch.fx._symbolic_trace.is_fx_symbolic_tracing`, `from . import config`, re-exports through a package's
`__init__`), and classifies module-level variables as plain globals or thread-local objects. It never imports
anything: every answer comes from `ast` over the files a SourceTree returns.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from dflash_doctor.guards.torch_sources import SourceTree

# Calls whose result is per-thread state. A contextvars.ContextVar is per thread too (each thread starts in its
# own context), so for the question "can another thread see this flag" it counts as thread-local.
THREAD_LOCAL_FACTORIES = {"threading.local": "threading.local", "_thread._local": "threading.local",
                          "contextvars.ContextVar": "contextvars.ContextVar"}
_MAX_HOPS = 5
FUNCTION_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]
Variable = Union[ast.Assign, ast.AnnAssign]  # a module variable's (first) assignment
Definition = Union[FunctionNode, ast.ClassDef, Variable]


@dataclass
class Module:
    relpath: str
    name: str
    tree: ast.Module
    lines: List[str]
    parents: Dict[ast.AST, ast.AST]
    imports: Dict[str, str] = field(default_factory=dict)
    variables: Dict[str, Variable] = field(default_factory=dict)
    functions: Dict[str, FunctionNode] = field(default_factory=dict)
    classes: Dict[str, ast.ClassDef] = field(default_factory=dict)

    @property
    def package(self) -> str:
        return self.name if self.relpath.endswith("__init__.py") else self.name.rpartition(".")[0]

    def enclosing_functions(self, node: ast.AST) -> List[FunctionNode]:
        """Function definitions around `node`, innermost first."""
        chain: List[FunctionNode] = []
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, FUNCTION_DEFS):
                chain.append(current)
            current = self.parents.get(current)
        return chain

    def qualified_def_name(self, func: Union[FunctionNode, ast.ClassDef]) -> str:
        """`Tracer.trace`, `_compile.compile_inner`: the chain of classes and functions around a definition."""
        names = [func.name]
        current = self.parents.get(func)
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(current.name)
            current = self.parents.get(current)
        return ".".join(reversed(names))

    def source_lines(self, first: int, last: int) -> List[Tuple[int, str]]:
        last = min(last, len(self.lines))
        return [(number, self.lines[number - 1]) for number in range(max(1, first), last + 1)]


def own_nodes(func: FunctionNode) -> Iterator[ast.AST]:
    """Every node of a function's body, without descending into nested functions, lambdas or classes."""
    stack: List[ast.AST] = list(reversed(func.body))
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)


def dotted(expr: ast.AST) -> Optional[str]:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: List[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _module_level_statements(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    # Module state is also defined under `if TYPE_CHECKING:` / `try: ... except ImportError:` at top level.
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _module_level_statements(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _module_level_statements(stmt.body + stmt.orelse + stmt.finalbody)
            for handler in stmt.handlers:
                yield from _module_level_statements(handler.body)
        else:
            yield stmt


def module_name(relpath: str) -> str:
    parts = relpath[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["torch", *parts])


class Index:
    """Parses torch modules from a SourceTree on demand and answers "what does this name refer to"."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self._modules: Dict[str, Optional[Module]] = {}
        self._texts: Dict[str, Optional[str]] = {}
        self.unreadable: List[str] = []

    # -- modules -------------------------------------------------------------------------------------------
    def module(self, relpath: str) -> Optional[Module]:
        if relpath not in self._modules:
            self._modules[relpath] = self._parse(relpath)
        return self._modules[relpath]

    def _parse(self, relpath: str) -> Optional[Module]:
        text = self.text(relpath)
        if text is None:
            return None
        try:
            tree = ast.parse(text, filename=relpath)
        except (SyntaxError, ValueError):
            self.unreadable.append(relpath)
            return None
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        module = Module(relpath, module_name(relpath), tree, text.splitlines(), parents)
        for stmt in _module_level_statements(tree.body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._record_import(module, stmt)
            elif isinstance(stmt, FUNCTION_DEFS):
                module.functions[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                module.classes[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        module.variables.setdefault(target.id, stmt)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                module.variables.setdefault(stmt.target.id, stmt)
        return module

    @staticmethod
    def _record_import(module: Module, stmt: Union[ast.Import, ast.ImportFrom]) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    module.imports[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    module.imports[top] = top
            return
        base = stmt.module or ""
        if stmt.level:
            package = module.package.split(".")
            anchor = package[: len(package) - (stmt.level - 1)] if stmt.level > 1 else package
            base = ".".join(anchor + ([base] if base else []))
        for alias in stmt.names:
            if alias.name != "*":
                module.imports[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name

    def module_of_qualname(self, qualname: str, mentions: Optional[str] = None) -> Tuple[Optional[Module], List[str]]:
        """The longest module prefix of `qualname` that exists here, and the rest of the name.

        With `mentions`, a module whose text lacks that word is not parsed (None): resolving every context
        manager in convert_frame.py would otherwise parse dozens of large modules.
        """
        parts = qualname.split(".")
        if parts[0] != "torch":
            return None, parts
        # torch/__init__.py is never needed to reach a guard and is the largest file: leave it out.
        for cut in range(len(parts), 1, -1):
            rel = "/".join(parts[1:cut])
            for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
                text = self.text(candidate)
                if text is None:
                    continue
                if mentions is not None and mentions not in text:
                    return None, parts
                return self.module(candidate), parts[cut:]
        return None, parts

    def text(self, relpath: str) -> Optional[str]:
        if relpath not in self._texts:
            self._texts[relpath] = self.tree.read(relpath)
        return self._texts[relpath]

    # -- names ---------------------------------------------------------------------------------------------
    def local_binding(self, name: str, func: FunctionNode) -> Optional[ast.AST]:
        """The expression a function body assigns to `name` (`is_fx = torch.fx._symbolic_trace.is_fx...`)."""
        for node in own_nodes(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id == name:
                    return node.value
        return None

    def qualname(self, expr: ast.AST, module: Module,
                 scopes: Sequence[FunctionNode] = ()) -> Tuple[Optional[str], Optional[FunctionNode]]:
        """The qualified name `expr` refers to, and the function among `scopes` (innermost first) whose local
        binding it came through, if any."""
        chain = dotted(expr)
        if chain is None:
            return None, None
        head, _, rest = chain.partition(".")
        for scope in scopes:
            bound = self.local_binding(head, scope)
            if bound is not None:
                base, _ = self.qualname(bound, module, ())
                if base is None:
                    return None, scope
                return (f"{base}.{rest}" if rest else base), scope
        if head in module.imports:
            base = module.imports[head]
        elif head in module.functions or head in module.classes or head in module.variables:
            base = f"{module.name}.{head}"
        else:
            return None, None
        return (f"{base}.{rest}" if rest else base), None

    def function_definition(self, qualname: str, mentions: Optional[str] = None
                            ) -> Optional[Tuple[Module, FunctionNode]]:
        """(module, def node) when `qualname` names a function or method."""
        found = self.definition(qualname, mentions=mentions)
        if found is None:
            return None
        module, node = found
        return (module, node) if isinstance(node, FUNCTION_DEFS) else None

    def definition(self, qualname: str, hops: int = 0, mentions: Optional[str] = None
                   ) -> Optional[Tuple[Module, Definition]]:
        """(module, def node) for a function, method or module variable's qualified name, following re-exports."""
        if hops > _MAX_HOPS:
            return None
        module, rest = self.module_of_qualname(qualname, mentions)
        if module is None or not rest:
            return None
        head = rest[0]
        if len(rest) == 1:
            if head in module.functions:
                return module, module.functions[head]
            if head in module.variables:
                # `_is_fx_tracing = torch.fx._symbolic_trace.is_fx_tracing` at module level: an alias, follow it.
                value = module.variables[head].value
                alias = self.qualname(value, module)[0] if value is not None and dotted(value) else None
                if alias is not None and alias != qualname:
                    return self.definition(alias, hops + 1, mentions)
                return module, module.variables[head]
            if head in module.classes:
                return module, module.classes[head]
        elif len(rest) == 2 and head in module.classes:
            for stmt in module.classes[head].body:
                if isinstance(stmt, FUNCTION_DEFS) and stmt.name == rest[1]:
                    return module, stmt
            return None
        if head in module.imports:
            target = module.imports[head]
            return self.definition(".".join([target, *rest[1:]]), hops + 1, mentions)
        return None

    # -- state ---------------------------------------------------------------------------------------------
    def variable_kind(self, module: Module, name: str) -> str:
        """'thread-local' when a module variable holds per-thread state, else 'module-global'."""
        stmt = module.variables[name]
        value = stmt.value
        if isinstance(value, ast.Call):
            callee, _ = self.qualname(value.func, module)
            if callee in THREAD_LOCAL_FACTORIES:
                return "thread-local"
            # `class _State(threading.local): ...` then `_state = _State()`
            if callee and callee.startswith(module.name + "."):
                cls = module.classes.get(callee[len(module.name) + 1:])
                if cls is not None and any(self.qualname(b, module)[0] in THREAD_LOCAL_FACTORIES for b in cls.bases):
                    return "thread-local"
        return "module-global"
