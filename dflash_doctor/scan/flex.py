"""DFD202: flex_attention called where no torch.compile in the same file covers the call."""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dflash_doctor.rules.scan import FLEX_ATTENTION_UNCOMPILED
from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.graph import Linker
from dflash_doctor.scan.project_modules import ProjectModules
from dflash_doctor.scan.resolve import FuncRef, describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.callgraph import ModuleGraph

FLEX_ATTENTION = "torch.nn.attention.flex_attention.flex_attention"


class FlexAttentionRule(FileCheck):
    """Compiled coverage is decided per file: functions decorated with or passed to torch.compile (and modules
    compiled with torch.compile(Module(...)) / model.compile()), plus everything they call in this file."""

    needs_graph = needs_compile_sites = True  # coverage is followed from the file's compile sites

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        assert graph is not None, "needs_graph: analysis.py builds it"
        self.graph = graph
        self._calls: List[Tuple[ast.Call, Optional[str]]] = []

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        if self.ctx.resolver.dotted(node.func, scope, node.lineno) == FLEX_ATTENTION \
                or self._flex_on_a_path(node.func, scope, node.lineno):
            if self._compiled_on_another_path(node.func, scope, node.lineno):
                return
            enclosing = scope.qualname if scope.kind in ("function", "lambda") else None
            self._calls.append((node, enclosing))

    def _flex_on_a_path(self, func: ast.AST, scope: Scope, line: int) -> bool:
        """`attend = flex_attention if use_flex else sdpa` (or `self.attend = ...`): a local alias that is the
        uncompiled flex_attention on one of its paths."""
        resolver = self.ctx.resolver
        binding = resolver.value_binding(func, scope, line)
        if binding is None or binding.kind != "assign" or not isinstance(binding.node, ast.IfExp):
            return False
        return any(resolver.dotted(branch, binding.scope, binding.line) == FLEX_ATTENTION
                   for branch in (binding.node.body, binding.node.orelse))

    def _compiled_on_another_path(self, func: ast.AST, scope: Scope, line: int) -> bool:
        """`flex = torch.compile(flex_attention) if compile else flex_attention`-style names: the caller chose."""
        if not isinstance(func, ast.Name):
            return False
        resolver = self.ctx.resolver
        binding = resolver.table.lookup(func.id, scope, line)
        if binding is None:
            return False
        for sibling in resolver.table.bindings(binding.scope).get(func.id, ()):
            value = sibling.node if sibling.kind == "assign" else None
            branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            if any(resolver.is_compile_call(b, sibling.scope, sibling.line) for b in branches if b is not None):
                return True
        return False

    def finish(self) -> None:
        if not self._calls:
            return
        graph = self.graph
        covered = Linker(ProjectModules({graph.path: graph})).reachable(graph.compile_roots)
        for node, enclosing in self._calls:
            if enclosing is not None and FuncRef(self.ctx.path, enclosing) in covered:
                continue
            where = f"in {enclosing}" if enclosing else "at module level"
            self.ctx.report(
                FLEX_ATTENTION_UNCOMPILED, node,
                f"{describe(node.func)}(...) {where} runs uncompiled: the dense fallback materialises QK^T; call a "
                "torch.compile'd flex_attention instead",
                {"call": describe(node.func), "enclosing": enclosing},
            )
