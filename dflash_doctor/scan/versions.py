"""Branches no supported torch takes: code under a torch-version test that needs a release older than the first
one with torch.compile (2.0; docs/races.md), such as the `else` of `if is_torch_version(">=", "1.11.0"):`.

Libraries keep such branches for old installs (`checkpoint(...)` without use_reentrant where the keyword did not
exist yet). The races need torch.compile, so a finding there can never happen, and its fix cannot apply: the
scan reports it as info with that reason, and a value bound there is not one of the values a name can have.

Only tests spelled with a version literal are judged: a comparison of something named after torch's version
(`torch.__version__`, `version.parse(torch.__version__)`, `TORCH_VERSION`, `digit_version(torch.__version__)`)
with a version string or tuple, a `*torch*version*(op, "1.11")` helper, a `is_torch_greater_or_equal("1.11")`
style helper, a `_TORCH_GREATER_EQUAL_1_11` flag, and `not` of any of those.
"""
from __future__ import annotations

import ast
import operator
import re
from typing import Callable, Dict, Iterator, List, Optional, Tuple

FIRST_COMPILE_RELEASE = (2, 0, 0)  # torch.compile appeared in torch 2.0
_VERSION = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_OPS: Dict[type, str] = {ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Lt: "<", ast.Eq: "==", ast.NotEq: "!="}
_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "==": "==", "!=": "!="}
_NEGATED = {">=": "<", ">": "<=", "<=": ">", "<": ">=", "==": "!=", "!=": "=="}
_COMPARE: Dict[str, Callable[[tuple, tuple], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq, "!=": operator.ne}
# helper names -> the comparison they make (`is_torch_greater_or_equal("2.1")` is torch >= 2.1)
_HELPER_OPS = (("greater_or_equal", ">="), ("greater_equal", ">="), ("at_least", ">="), ("_ge", ">="),
               ("greater_than", ">"), ("_gt", ">"), ("less_or_equal", "<="), ("_le", "<="), ("less_than", "<"),
               ("_lt", "<"), ("older_than", "<"), ("newer_than", ">"))
_FLAG = re.compile(r"torch\w*?(greater_equal|greater_or_equal|ge|at_least|less_than|lt)_?(\d+)_(\d+)(?:_(\d+))?",
                   re.IGNORECASE)
Condition = Tuple[str, Tuple[int, int, int]]  # "torch OP version"


def _version(node: ast.AST) -> Optional[Tuple[int, int, int]]:
    """A version literal: "1.11.0", (1, 11), or one of them wrapped in a parse call (version.parse("1.11"))."""
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        match = _VERSION.match(node.value)
        if match:
            major, minor, micro = (int(part or 0) for part in match.groups())
            return major, minor, micro
    if isinstance(node, ast.Tuple) and node.elts:
        parts = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
        if len(parts) == len(node.elts):
            padded = parts + [0, 0]
            return (padded[0], padded[1], padded[2])
    return None


def _names_torch_version(node: ast.AST) -> bool:
    text = ast.unparse(node).lower() if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else ""
    return "torch" in text and "version" in text and len(text) < 120


def condition(test: ast.AST) -> Optional[Condition]:
    """What `test` says about the torch release ("torch >= 1.11.0"), or None when it is not a version test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = condition(test.operand)
        return (_NEGATED[inner[0]], inner[1]) if inner else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
        op: str = _OPS[type(test.ops[0])]
        left, right = test.left, test.comparators[0]
        if _names_torch_version(left) and (version := _version(right)) is not None:
            return op, version
        if _names_torch_version(right) and (version := _version(left)) is not None:
            return _FLIPPED[op], version
        return None
    if isinstance(test, ast.Call):
        func = test.func
        name = (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")).lower()
        if "torch" not in name:
            return None
        args = test.args
        if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value in _COMPARE and "version" in name:
            version = _version(args[1])
            return (str(args[0].value), version) if version else None
        if len(args) == 1:
            version = _version(args[0])
            helper = next((op for word, op in _HELPER_OPS if word in name), None)
            return (helper, version) if helper and version else None
        return None
    if isinstance(test, (ast.Name, ast.Attribute)):
        match = _FLAG.search(test.attr if isinstance(test, ast.Attribute) else test.id)
        if match:
            word = match.group(1).lower()
            major, minor, micro = (int(part or 0) for part in match.groups()[1:])
            return ("<" if word in ("less_than", "lt") else ">="), (major, minor, micro)
    return None


def _never(cond: Condition) -> bool:
    """No supported release (>= FIRST_COMPILE_RELEASE) satisfies `cond`: with releases unbounded above, only
    comparisons that cap the release below the first compile release can fail for all of them."""
    op, version = cond
    first = FIRST_COMPILE_RELEASE
    if op in ("<", "<="):
        return not _COMPARE[op](first, version)
    if op == "==":
        return version < first
    return False


def _always(cond: Condition) -> bool:
    return _never((_NEGATED[cond[0]], cond[1]))


def _described(cond: Condition) -> str:
    op, version = cond
    return f"torch {op} {'.'.join(str(part) for part in version)}"


def _statements(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        for name in ("body", "orelse", "finalbody"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(reversed([c for c in children if isinstance(c, ast.stmt)]))
        for handler in getattr(node, "handlers", ()):
            stack.extend(reversed(handler.body))
        for case in getattr(node, "cases", ()):
            stack.extend(reversed(case.body))


def supported_branches(node: ast.IfExp) -> List[ast.expr]:
    """The branches of `a if <torch-version test> else b` that a torch with torch.compile can take."""
    cond = condition(node.test)
    if cond is not None and _always(cond):
        return [node.body]
    if cond is not None and _never(cond):
        return [node.orelse]
    return [node.body, node.orelse]


def old_torch_branches(tree: ast.Module) -> List[Tuple[int, int, str]]:
    """(first line, last line, why) of every branch that only a torch older than the first compile release
    takes."""
    found = []
    for node in _statements(tree.body):
        if not isinstance(node, ast.If):
            continue
        cond = condition(node.test)
        if cond is None:
            continue
        if _never(cond) and node.body:
            found.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno,
                          f"under `if {ast.unparse(node.test)}`, which needs {_described(cond)}"))
        if _always(cond) and node.orelse:
            found.append((node.orelse[0].lineno, node.orelse[-1].end_lineno or node.orelse[-1].lineno,
                          f"in the else of `if {ast.unparse(node.test)}`, which needs "
                          f"{_described((_NEGATED[cond[0]], cond[1]))}"))
    return found
