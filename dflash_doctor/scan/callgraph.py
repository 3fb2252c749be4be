"""One file's share of the project call graph, built on demand: a function's calls are collected the first
time a search reaches it, so a file costs one parse plus the functions a thread (or torch.compile) can run.

The whole-file walk only visits candidate lines (spawn sites, compile sites, rule calls); see analysis.py.
"""
from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.resolve import (
    ClassRef,
    CompiledRef,
    ExtRef,
    FuncRef,
    InstanceRef,
    LocalClass,
    ParamRef,
    Ref,
    Target,
)
from dflash_doctor.scan.scopes import FUNCTION_NODES, SCOPE_NODES, Binding, FunctionNode, Scope, walk
from dflash_doctor.scan.summary import ClassInfo, FuncInfo, PassedOn, Spawn, TraceSite

THREAD_CLASS = "threading.Thread"
# Ahead-of-time entry points that compile their first argument as torch.compile does (DFD202 coverage).
AOT_COMPILE_FUNCTIONS = frozenset({
    "torch._dynamo.aot_compile.aot_compile_fullgraph", "torch._dynamo.aot_compile.aot_compile_module",
    "torch._export.aot_compile", "torch._inductor.aot_compile",
})
COMPILE_WORDS = ("compile", "aot_compile", "aot_compile_fullgraph", "aot_compile_module")
_LOCALS = "<locals>"
# `model.forward(x)` on a compiled module runs the compiled forward as surely as `model(x)`
_CALLING_METHODS = frozenset({"forward", "__call__"})


class ModuleGraph:
    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.path = ctx.path
        self.spawns: List[Spawn] = []
        self.traces: List[TraceSite] = []  # possible FX traces outside any thread (DFD203, main-thread case)
        self.compile_roots: List[Ref] = []  # what torch.compile(...) / @torch.compile / .compile() covers
        # what an in-thread check's collectors (scan/thread_reach.py) kept for it, by collector class: read back
        # only by the check module that defines the collector
        self.collected: Dict[type, List[object]] = {}
        self._functions: Dict[str, Optional[FuncInfo]] = {}
        self._classes: Dict[str, Optional[ClassInfo]] = {}
        self._names: Dict[str, Tuple[Target, ...]] = {}
        self._calls_named: Dict[str, List[Tuple[ast.Call, Scope]]] = {}

    # -- compile sites, seen by the candidate-line walk ---------------------------------------------------

    def visit_scope(self, node: ast.AST, outer: Scope) -> None:
        if isinstance(node, FUNCTION_NODES) and self._decorated_compiled(node, outer):
            self.compile_roots.append(FuncRef(self.path, self.ctx.table.scope_for(node, outer).qualname))

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        resolver = self.ctx.resolver
        line = node.lineno
        if node.args and (resolver.is_compile_call(node, scope, line) or self._aot_compile(node, scope, line)):
            root = resolver.callee(node.args[0], scope, line)
            if root is not None:
                self.compile_roots.append(root)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "compile" and not node.args:
            cls = resolver.instance_class(node.func.value, scope, line)
            if cls is not None:
                self.compile_roots.append(InstanceRef(cls))

    def _aot_compile(self, node: ast.Call, scope: Scope, line: int) -> bool:
        final = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        return final.startswith("aot_compile") and self.ctx.resolver.dotted(node.func, scope, line) in \
            AOT_COMPILE_FUNCTIONS

    def _imported_decorators(self, node: FunctionNode, outer: Scope) -> Tuple[ExtRef, ...]:
        """`@jit_fuser` imported from another module, which may rebind it to torch.compile (Megatron-style)."""
        found: List[ExtRef] = []
        for decorator in getattr(node, "decorator_list", ()):
            ref = self.ctx.resolver.callee(decorator, outer, node.lineno) if isinstance(
                decorator, (ast.Name, ast.Attribute)) else None
            if isinstance(ref, ExtRef):
                found.append(ref)
        return tuple(found)

    def _decorated_compiled(self, node: FunctionNode, outer: Scope) -> bool:
        resolver = self.ctx.resolver
        return any(
            resolver.is_compile(d, outer, node.lineno) or resolver.is_compile_call(d, outer, node.lineno)
            for d in getattr(node, "decorator_list", ())
        )

    # -- lookups by qualified name --------------------------------------------------------------------------

    def _scope_named(self, qualname: str) -> Optional[Scope]:
        """The scope of `Class.method` / `f.<locals>.g` / a lambda, created on the way if need be."""
        table = self.ctx.table
        if qualname in table.by_qualname:
            return table.by_qualname[qualname]
        scope = table.module
        for part in qualname.split("."):
            if part == _LOCALS:
                continue
            bindings = [b for b in table.bindings(scope).get(part, ()) if b.kind in ("def", "class")]
            if not bindings:
                return None
            scope = table.opened_by(bindings[-1])
        return scope if scope.qualname == qualname else None

    def function(self, qualname: str) -> Optional[FuncInfo]:
        if qualname not in self._functions:
            scope = self._scope_named(qualname)
            self._functions[qualname] = (
                self._function_info(scope, scope.node)
                if scope is not None and isinstance(scope.node, FUNCTION_NODES) else None
            )
        return self._functions[qualname]

    def class_info(self, qualname: str) -> Optional[ClassInfo]:
        if qualname not in self._classes:
            scope = self._scope_named(qualname)
            self._classes[qualname] = (
                self._class_info(scope, scope.node) if scope is not None and isinstance(scope.node, ast.ClassDef)
                else None
            )
        return self._classes[qualname]

    def name(self, name: str) -> Tuple[Target, ...]:
        """What a module-level name refers to (every binding: a conditional `step = torch.compile(step)` counts)."""
        if name not in self._names:
            table = self.ctx.table
            refs: List[Target] = []
            for binding in table.bindings(table.module).get(name, ()):
                ref: Optional[Target]
                if binding.kind == "class":
                    ref = LocalClass(self.path, table.opened_by(binding).qualname)
                else:
                    ref = self.ctx.resolver.binding_callee(binding, name)
                if ref is not None and ref not in refs:
                    refs.append(ref)
            self._names[name] = tuple(refs)
        return self._names[name]

    # -- building -------------------------------------------------------------------------------------------

    def _function_info(self, scope: Scope, node: FunctionNode) -> FuncInfo:
        info = FuncInfo(scope.qualname, node.lineno, compiled=self._decorated_compiled(node, scope.enclosing),
                        decorators=self._imported_decorators(node, scope.enclosing),
                        is_property=self._is_property(node, scope.enclosing))
        positional = [a.arg for a in node.args.posonlyargs + node.args.args]
        info.params = tuple(positional[1:] if scope.self_name else positional)
        info.keyword_only = frozenset(a.arg for a in node.args.kwonlyargs)
        names = info.param_names
        body: List[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
        stack = list(reversed(body))
        seen: Set[Ref] = set()
        while stack:
            current = stack.pop()
            if isinstance(current, SCOPE_NODES):
                # A nested def/lambda is a function of its own; its decorators and defaults run here.
                if not isinstance(current, ast.Lambda):
                    stack.extend(reversed(current.decorator_list))
                continue
            if isinstance(current, ast.Call):
                self._add_refs(info.refs, seen, current, scope)
                if names:
                    self._parameter_uses(info, current, scope, names)
            elif isinstance(current, ast.Return) and current.value is not None and info.is_property:
                returned = self.ctx.resolver.value_callee(current.value, scope, current.lineno, scope.qualname)
                if returned is not None and returned not in info.returns:
                    info.returns.append(returned)
            stack.extend(reversed(list(ast.iter_child_nodes(current))))
        return info

    def _is_property(self, node: FunctionNode, outer: Scope) -> bool:
        """`@property` / `@functools.cached_property` (a lazily built, often lazily compiled, attribute)."""
        for decorator in getattr(node, "decorator_list", ()):
            if isinstance(decorator, ast.Name) and decorator.id in ("property", "cached_property"):
                return True
            if self.ctx.resolver.dotted(decorator, outer, node.lineno) == "functools.cached_property":
                return True
        return False

    def _add_refs(self, refs: List[Ref], seen: Set[Ref], node: ast.Call, scope: Scope) -> None:
        resolver = self.ctx.resolver
        line = node.lineno
        callee = resolver.callee(node.func, scope, line)
        if callee is not None and callee not in seen:
            seen.add(callee)
            refs.append(callee)
        # Functions handed to another call (callbacks, checkpoint(fn, ...), executor.submit(fn)) are run by it.
        for argument in list(node.args) + [k.value for k in node.keywords]:
            if isinstance(argument, ast.Starred):
                argument = argument.value
            if isinstance(argument, (ast.Name, ast.Attribute, ast.Lambda, ast.Call)):
                ref = resolver.callee(argument, scope, line)
                if ref is not None and not isinstance(ref, ExtRef) and ref not in seen:
                    seen.add(ref)
                    refs.append(ref)

    def _own_param(self, expr: ast.AST, scope: Scope, line: int, names: FrozenSet[str]) -> Optional[str]:
        """The name of a parameter of the function `scope` (among `names`) that `expr` is (not self, not a
        closure's: a name looked up only when it is one of the parameters' names)."""
        if not isinstance(expr, ast.Name) or expr.id not in names:
            return None
        binding = self.ctx.table.lookup(expr.id, scope, line)
        return expr.id if binding is not None and binding.kind == "param" and binding.scope is scope else None

    def _parameter_uses(self, info: FuncInfo, node: ast.Call, scope: Scope, names: FrozenSet[str]) -> None:
        """Where the function calls one of its parameters (`model(x)`, `model.forward(x)`) or hands it on to
        another call, for the search that follows a thread's arguments."""
        line = node.lineno
        func = node.func
        called = self._own_param(func.value if isinstance(func, ast.Attribute) and func.attr in _CALLING_METHODS
                                 else func, scope, line, names)
        if called is not None:
            info.called_params.setdefault(called, line)
        elif isinstance(func, ast.Attribute):
            owner = self._own_param(func.value, scope, line, names)
            if owner is not None and (owner, func.attr) not in info.called_attributes:
                info.called_attributes.append((owner, func.attr))
        callee: Optional[Ref] = None
        for position, argument in enumerate(node.args):
            if isinstance(argument, ast.Starred):
                break  # positions after *args are unknown
            name = self._own_param(argument, scope, line, names)
            if name is not None:
                callee = callee or self.ctx.resolver.callee(func, scope, line)
                if callee is not None:
                    info.passed_params.append(PassedOn(name, callee, position, None))
        for keyword in node.keywords:
            name = self._own_param(keyword.value, scope, line, names) if keyword.arg else None
            if name is not None:
                callee = callee or self.ctx.resolver.callee(func, scope, line)
                if callee is not None:
                    info.passed_params.append(PassedOn(name, callee, -1, keyword.arg))

    def _class_info(self, scope: Scope, node: ast.ClassDef) -> ClassInfo:
        table = self.ctx.table
        resolver = self.ctx.resolver
        bases: List[ClassRef] = []
        thread_base = False
        for base in node.bases:
            if resolver.dotted(base, scope.enclosing, node.lineno) == THREAD_CLASS:
                thread_base = True
                continue
            cls = resolver.class_ref(base, scope.enclosing, node.lineno)
            if cls is not None:
                bases.append(cls)
        info = ClassInfo(scope.qualname, node.lineno, tuple(bases), thread_base)
        for name, bindings in table.bindings(scope).items():
            if bindings[-1].kind == "def":
                info.methods[name] = table.opened_by(bindings[-1]).qualname
        for attr, bindings in table.attributes(scope).items():
            refs: List[Ref] = []
            for binding in bindings:
                ref = self._attribute_ref(binding, f"{scope.qualname}.{attr}")
                if ref is not None and ref not in refs:
                    refs.append(ref)
            if refs:
                info.attributes[attr] = tuple(refs)
        return info

    def _attribute_ref(self, binding: Binding, name: str) -> Optional[Ref]:
        if binding.kind == "compiled":
            return CompiledRef(name, self.path, binding.line)
        if binding.kind == "assign":
            param = self._param_ref(binding)
            if param is not None:
                return param
            return self.ctx.resolver.value_callee(binding.node, binding.scope, binding.line, name)
        return None

    def _param_ref(self, binding: Binding) -> Optional[ParamRef]:
        """`self.step = step` where `step` is a parameter of the method: the value comes from the callers."""
        value, method = binding.node, binding.scope
        if (not isinstance(value, ast.Name) or not isinstance(method.node, (ast.FunctionDef, ast.AsyncFunctionDef))
                or method.owner is None):
            return None
        found = self.ctx.table.lookup(value.id, method, binding.line)
        if found is None or found.kind != "param" or found.scope is not method:
            return None
        args = method.node.args
        positional = [a.arg for a in args.posonlyargs + args.args][1:]  # without self
        index = positional.index(value.id) if value.id in positional else -1
        return ParamRef(LocalClass(self.path, method.owner.qualname), method.node.name, value.id, index)

    def joins_between(self, qualname: str, first: int, last: int) -> bool:
        """Whether the function `qualname` ("" the module) calls some `.join()` on a line in (first, last): the
        threads it started may be waited for before a later line runs."""
        scope = self._scope_named(qualname) if qualname else self.ctx.table.module
        if scope is None:
            return False
        for node in ast.walk(scope.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
                    and first < node.lineno < last:
                return True
        return False

    def calls_named(self, name: str) -> List[Tuple[ast.Call, Scope]]:
        """Calls whose callee's last name is `name` (a class's construction sites), with their scopes; only the
        subtrees around lines that mention the name are walked. Kept per name: the linker asks every file it has
        parsed for each class whose constructor parameters a thread's call chain follows."""
        if name not in self._calls_named:
            self._calls_named[name] = self._find_calls_named(name)
        return self._calls_named[name]

    def _find_calls_named(self, name: str) -> List[Tuple[ast.Call, Scope]]:
        text = self.ctx.text
        lines: List[int] = []
        line, counted = 1, 0  # the line number at offset `counted` (lines as ast numbers them: "\n" ends one)
        position = text.find(name)
        while position != -1:
            line += text.count("\n", counted, position)
            lines.append(line)
            counted = text.find("\n", position)
            if counted == -1:
                break
            line += 1
            counted += 1
            position = text.find(name, counted)
        found: List[Tuple[ast.Call, Scope]] = []
        for node, scope in walk(self.ctx.table, lines) if lines else ():
            if isinstance(node, ast.Call):
                func = node.func
                final = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if final == name:
                    found.append((node, scope))
        return found
