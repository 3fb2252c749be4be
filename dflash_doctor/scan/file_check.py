"""`FileCheck`, the base of every scan check: what analysis.py calls while it walks one file.

Apart from context.py because a check is handed the file's call graph (callgraph.py), which itself reads the
file's context: here, both are below the checks and neither imports the other's importer.
"""
from __future__ import annotations

import ast
from typing import ClassVar, Optional, Union

from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.scopes import Scope


class FileCheck:
    """One check's look at one file; rules/scan.py names, for each scan rule, the checks that report it.

    analysis.py walks the file once and calls the visit_ methods a subclass defines, and only those (a check
    without visit_dict costs nothing per dict), on every node the walk enters (those spanning a candidate line),
    then `finish`. What a check finds goes to the context (findings, noqa use, applied fixes) or to the call graph
    (spawn sites). A check with `needs_graph` is given the file's call graph, which also collects the file's
    torch.compile sites when `needs_compile_sites`; any other check is given None."""

    needs_graph: ClassVar[bool] = False
    needs_compile_sites: ClassVar[bool] = False

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        self.ctx = ctx

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        """A call."""

    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        """An assignment (plain or annotated)."""

    def visit_dict(self, node: ast.Dict, scope: Scope) -> None:
        """A dict display."""

    def visit_scope(self, node: ast.AST, outer: Scope) -> None:
        """A function, lambda or class; `outer` is the scope it is defined in."""

    def finish(self) -> None:
        """After the walk: what can only be judged on the whole file."""
