"""DFD202: flex_attention called where no torch.compile in the same file covers the call."""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dflash_doctor.rules.scan import FLEX_ATTENTION_UNCOMPILED
from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.graph import Linker
from dflash_doctor.scan.resolve import FuncRef, describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.callgraph import ModuleGraph

FLEX_ATTENTION = "torch.nn.attention.flex_attention.flex_attention"


class FlexAttentionRule:
    """Compiled coverage is decided per file: functions decorated with or passed to torch.compile (and modules
    compiled with torch.compile(Module(...)) / model.compile()), plus everything they call in this file."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self._calls: List[Tuple[ast.Call, Optional[str]]] = []

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if self.ctx.on_candidate_line(node) and self.ctx.resolver.dotted(node.func, scope, node.lineno) == FLEX_ATTENTION:
            enclosing = scope.qualname if scope.kind in ("function", "lambda") else None
            self._calls.append((node, enclosing))

    def finish(self, graph: ModuleGraph) -> None:
        if not self._calls:
            return
        covered = Linker({graph.path: graph}).reachable(graph.compile_roots)
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
