"""DFD301: switching off the nested-FX-trace error (assignment, setattr, or config.patch)."""
from __future__ import annotations

import ast
from typing import Iterable, Optional, Tuple, Union

from dflash_doctor.rules.scan import NESTED_FX_TRACE_SILENCED
from dflash_doctor.scan.context import Located
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import describe
from dflash_doctor.scan.scopes import Scope

DYNAMO_CONFIG = "torch._dynamo.config"
# key -> the value that silences the guard (docs/races.md, "The guard": both must stay at their defaults for it to raise)
SILENCING = {"error_on_nested_fx_trace": False, "force_compile_during_fx_trace": True}


def _silences(key: Optional[str], value: ast.Constant) -> bool:
    if key not in SILENCING:
        return False
    if not isinstance(value.value, (bool, int)) and value.value is not None:
        return False
    return bool(value.value) == SILENCING[key]


class DynamoConfigRule(FileCheck):
    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        if value is None:
            return
        for target in targets:
            if not isinstance(target, ast.Attribute) or target.attr not in SILENCING:
                continue
            if self.ctx.resolver.dotted(target.value, scope, node.lineno) == DYNAMO_CONFIG:
                self._check(node, target.attr, value, describe(target))

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        resolver = self.ctx.resolver
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) == 3:
            if resolver.table.lookup("setattr", scope, node.lineno) is None \
                    and resolver.dotted(node.args[0], scope, node.lineno) == DYNAMO_CONFIG:
                name = node.args[1]
                key = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
                self._check(node, key, node.args[2], "setattr(...)")
            return
        if not (isinstance(func, ast.Attribute) and func.attr == "patch"):
            return
        if resolver.dotted(func.value, scope, node.lineno) != DYNAMO_CONFIG:
            return
        for key, value in self._patched(node):
            self._check(node, key, value, f"{describe(func)}(...)")

    @staticmethod
    def _patched(node: ast.Call) -> Iterable[Tuple[Optional[str], ast.AST]]:
        """config.patch(key=value), config.patch("key", value) and config.patch({"key": value})."""
        for keyword in node.keywords:
            if keyword.arg is not None:
                yield keyword.arg, keyword.value
        if len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value, node.args[1]
        elif node.args and isinstance(node.args[0], ast.Dict):
            for key, value in zip(node.args[0].keys, node.args[0].values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield key.value, value

    def _check(self, node: Located, key: Optional[str], value: ast.AST, spelled: str) -> None:
        if not isinstance(value, ast.Constant) or not _silences(key, value):
            return
        setting = f"{DYNAMO_CONFIG}.{key} = {value.value!r}"
        via = "" if spelled == f"{DYNAMO_CONFIG}.{key}" else f" (via {spelled})"
        self.ctx.report(
            NESTED_FX_TRACE_SILENCED, node,
            f"{setting}{via} hides the FX-tracing race: a thread that hits it silently runs uncompiled code "
            "instead of raising",
            {"key": key, "value": value.value, "spelled": spelled},
        )
