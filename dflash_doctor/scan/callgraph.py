"""Collects one file's share of the call graph (functions, classes, module names, compile sites) for DFD201/202."""
from __future__ import annotations

import ast
from typing import Optional

from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.resolve import CompiledRef, ExtRef, FuncRef, InstanceRef, LocalClass
from dflash_doctor.scan.scopes import FUNCTION_NODES, Scope
from dflash_doctor.scan.summary import ClassInfo, FuncInfo, ModuleSummary

THREAD_CLASS = "threading.Thread"


class CallGraphCollector:
    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.summary = ModuleSummary(ctx.path)

    def visit_scope(self, node: ast.AST, outer: Scope) -> None:
        if not isinstance(node, FUNCTION_NODES):
            return
        scope = self.ctx.table.scope_of[node]
        compiled = any(
            self.ctx.resolver.is_compile(d, outer, node.lineno)
            or self.ctx.resolver.is_compile_call(d, outer, node.lineno)
            for d in getattr(node, "decorator_list", ())
        )
        # Two defs of one name (if/else variants) share one entry: either may be the one that runs.
        info = self.summary.functions.setdefault(scope.qualname, FuncInfo(scope.qualname, node.lineno))
        info.compiled = info.compiled or compiled
        if compiled:
            self.summary.compile_roots.append(FuncRef(self.ctx.path, scope.qualname))

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        resolver = self.ctx.resolver
        line = node.lineno
        if resolver.is_compile_call(node, scope, line) and node.args:
            root = resolver.callee(node.args[0], scope, line)
            if root is not None:
                self.summary.compile_roots.append(root)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "compile" and not node.args:
            cls = resolver.instance_class(node.func.value, scope, line)
            if cls is not None:
                self.summary.compile_roots.append(InstanceRef(cls))
        if scope.kind not in ("function", "lambda"):
            return
        refs = self.summary.functions[scope.qualname].refs
        callee = resolver.callee(node.func, scope, line)
        if callee is not None and callee not in refs:
            refs.append(callee)
        # Functions handed to another call (callbacks, checkpoint(fn, ...), executor.submit(fn)) are run by it.
        for argument in list(node.args) + [k.value for k in node.keywords]:
            if isinstance(argument, ast.Starred):
                argument = argument.value
            if isinstance(argument, (ast.Name, ast.Attribute, ast.Lambda, ast.Call)):
                ref = resolver.callee(argument, scope, line)
                if ref is not None and not isinstance(ref, ExtRef) and ref not in refs:
                    refs.append(ref)

    def finish(self) -> ModuleSummary:
        table = self.ctx.table
        resolver = self.ctx.resolver
        path = self.ctx.path
        for scope in table.scope_of.values():
            if scope.kind != "class":
                continue
            node = scope.node
            bases = []
            thread_base = False
            for base in node.bases:
                if resolver.dotted(base, scope.parent, node.lineno) == THREAD_CLASS:
                    thread_base = True
                    continue
                ref = resolver.class_ref(base, scope.parent, node.lineno)
                if ref is not None:
                    bases.append(ref)
            info = ClassInfo(scope.qualname, node.lineno, tuple(bases), thread_base)
            for name, bindings in scope.bindings.items():
                if bindings[-1].kind == "def":
                    info.methods[name] = table.scope_of[bindings[-1].node].qualname
            for attr, bindings in scope.attributes.items():
                refs = []
                for binding in bindings:
                    ref = self._attribute_ref(binding, f"{scope.qualname}.{attr}")
                    if ref is not None and ref not in refs:
                        refs.append(ref)
                if refs:
                    info.attributes[attr] = tuple(refs)
            self.summary.classes[scope.qualname] = info
        for name, bindings in table.module.bindings.items():
            refs = []
            for binding in bindings:
                if binding.kind == "class":
                    ref = LocalClass(path, table.scope_of[binding.node].qualname)
                else:
                    ref = resolver.binding_callee(binding, name)
                if ref is not None and ref not in refs:
                    refs.append(ref)
            if refs:
                self.summary.names[name] = tuple(refs)
        return self.summary

    def _attribute_ref(self, binding, name: str) -> Optional[object]:
        if binding.kind == "compiled":
            return CompiledRef(name, self.ctx.path, binding.line)
        if binding.kind == "assign":
            return self.ctx.resolver.value_callee(binding.node, binding.scope, binding.line, name)
        return None

