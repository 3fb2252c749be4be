"""Analyse one parsed file: walk its AST once (iteratively: deep files must not overflow the stack) and let
each rule look at the calls and assignments it cares about."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import FrozenSet, List, Optional

from dflash_doctor.findings import Finding, Problem
from dflash_doctor.scan.callgraph import CallGraphCollector
from dflash_doctor.scan.checkpointing import CheckpointRule
from dflash_doctor.scan.context import FileContext
from dflash_doctor.scan.dynamo_config import DynamoConfigRule
from dflash_doctor.scan.flex import FlexAttentionRule
from dflash_doctor.scan.summary import ModuleSummary
from dflash_doctor.scan.threads import SpawnCollector


@dataclass
class FileResult:
    path: str
    findings: List[Finding] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    summary: Optional[ModuleSummary] = None
    parsed: bool = False


def _walk(ctx: FileContext):
    """(node, scope) pairs in source order; decorators, defaults and bases belong to the enclosing scope."""
    table = ctx.table
    stack = [(child, table.module) for child in reversed(table.module.node.body)]
    while stack:
        node, scope = stack.pop()
        yield node, scope
        inner = table.scope_of.get(node)
        if inner is None:
            stack.extend((child, scope) for child in reversed(list(ast.iter_child_nodes(node))))
            continue
        if isinstance(node, ast.Lambda):
            outer = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            body = [node.body]
        elif isinstance(node, ast.ClassDef):
            outer = node.decorator_list + node.bases + [k.value for k in node.keywords]
            body = node.body
        else:
            outer = node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            body = node.body
        stack.extend((child, inner) for child in reversed(body))
        stack.extend((child, scope) for child in reversed(outer))


def analyse_tree(
    path: str, text: str, tree: ast.Module, enabled: FrozenSet[str], package: Optional[str] = None,
) -> FileResult:
    ctx = FileContext(path, text, tree, enabled, package)
    graph = CallGraphCollector(ctx)
    spawns = SpawnCollector(ctx, graph.summary)
    checkpoints = CheckpointRule(ctx)
    config = DynamoConfigRule(ctx)
    flex = FlexAttentionRule(ctx)
    for node, scope in _walk(ctx):
        if isinstance(node, ast.Call):
            checkpoints.visit_call(node, scope)
            config.visit_call(node, scope)
            flex.visit_call(node, scope)
            graph.visit_call(node, scope)
            spawns.visit_call(node, scope)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            config.visit_assign(node, scope)
        if node in ctx.table.scope_of:
            graph.visit_scope(node, scope)
    checkpoints.finish()
    summary = graph.finish()
    spawns.finish()
    flex.finish(summary)
    return FileResult(path, ctx.findings, [], summary, parsed=True)
