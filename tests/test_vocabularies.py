"""The hang cycles, the flight recorder's event kinds and the rule codes are each declared once (outcomes.py
HangCycle and RecorderEventKind, the rule tables in rules/), and code compares against those declarations, never
against the words: an AST scan of the package fails on a second cycle vocabulary, a literal cycle word, an event
kind written or compared as a literal, or a rule code spelt out outside the rule tables.

Each scan is also run on a small stand-in module carrying the pattern it forbids, so none can pass for want of
finding anything."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

import pytest

from dflash_doctor.outcomes import HangCycle, RecorderEventKind

PACKAGE = Path(__file__).resolve().parent.parent / "dflash_doctor"
HOME = PACKAGE / "outcomes.py"  # where both vocabularies are declared
RULE_TABLES = PACKAGE / "rules"
CYCLE_WORDS = frozenset(member.value for member in HangCycle)
EVENT_WORDS = frozenset(member.value for member in RecorderEventKind)
RULE_CODE = re.compile(r"DFD\d{3}")


@functools.lru_cache(maxsize=1)
def _modules() -> Tuple[Tuple[Path, ast.Module], ...]:
    return tuple((path, ast.parse(path.read_text("utf-8"))) for path in sorted(PACKAGE.rglob("*.py")))


def _words(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants `node` is, or holds as a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _words(element)


def _reads_kind(node: ast.AST) -> bool:
    """`x.kind`, `x["kind"]` or `x.get("kind")`: a record's kind field, whatever the record."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return False


def cycle_words(tree: ast.AST) -> List[str]:
    """Every string constant that is a cycle word: a comparison with one, or a second vocabulary holding it."""
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in CYCLE_WORDS]


def _cycle_member(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "HangCycle"


def _collection(node: Optional[ast.AST]) -> List[ast.AST]:
    """The elements of a tuple, list or set literal, or of one handed to frozenset(), set() or tuple()."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        if node.func.id in ("frozenset", "set", "tuple"):
            node = node.args[0]
    return list(node.elts) if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []


def cycle_sets(tree: ast.Module) -> List[str]:
    """A module- or class-level name bound to a collection of cycles: a second say in what the cycles mean (the two
    `CYCLES` tuples this replaced disagreed); such a property belongs on HangCycle."""
    found = []
    bodies = [tree.body] + [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for statement in body:
            value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
            if any(_cycle_member(element) for element in _collection(value)):
                found.append(f"line {statement.lineno}: {ast.unparse(statement)[:80]}")
    return found


def event_kind_literals(tree: ast.Module) -> List[str]:
    """An event kind compared, recorded or named as a literal word instead of a RecorderEventKind member."""
    found = []
    module_level = {id(statement) for statement in tree.body}
    for node in ast.walk(tree):
        words: List[ast.Constant] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_reads_kind(side) for side in sides):
                words = [word for side in sides for word in _words(side)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record":
            words = [word for word in _words(node.args[0])] if node.args else []
        elif isinstance(node, ast.Dict):  # an event written by hand: {"kind": ..., "phase": ...}
            keys = {key.value: value for key, value in zip(node.keys, node.values) if isinstance(key, ast.Constant)}
            if "phase" in keys and "kind" in keys:
                words = list(_words(keys["kind"]))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            # EVENT_KIND = "compile-setting", RECOMPILE_LIMIT = "recompile-limit": a vocabulary of one
            named_kind = any(isinstance(t, ast.Name) and "KIND" in t.id.upper() for t in node.targets)
            if id(node) in module_level or named_kind:
                words = list(_words(node.value))
        found += [f"line {word.lineno}: {word.value!r}" for word in words if word.value in EVENT_WORDS]
    return found


def rule_code_literals(tree: ast.AST) -> List[str]:
    """A rule code spelt out: compare or look up the rule's `.code` (rules.X.code) instead."""
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RULE_CODE.fullmatch(node.value)]


def _offences(scan, skip: Set[Path]) -> List[str]:
    found = []
    for path, tree in _modules():
        if path in skip or any(parent in skip for parent in path.parents):
            continue
        found += [f"{path.relative_to(PACKAGE.parent)} {hit}" for hit in scan(tree)]
    return found


def test_the_cycle_words_are_written_only_where_hang_cycle_declares_them():
    assert _offences(cycle_words, {HOME}) == [], "compare with outcomes.HangCycle members, not with the words"


def test_no_module_keeps_its_own_set_of_cycles():
    assert _offences(cycle_sets, {HOME}) == [], "say what a set of cycles means as a property of HangCycle"


def test_event_kinds_are_written_and_compared_as_recorder_event_kinds():
    assert _offences(event_kind_literals, {HOME}) == [], "use outcomes.RecorderEventKind members"


def test_rule_codes_are_spelt_out_only_in_the_rule_tables():
    assert _offences(rule_code_literals, {RULE_TABLES}) == [], "compare with the rule's .code (rules.X.code)"


_FORBIDDEN = '''
from dflash_doctor.outcomes import HangCycle

CYCLES = (HangCycle.COMPILE_LOCK_AUTOGRAD, HangCycle.LOCK_CYCLE)
STALLED_KIND = "step"
LIMIT_HIT = "recompile-limit"


def stuck(diagnosis, events, findings, recorder):
    recorder.record("hang", "I")
    events.append({"t": 0.0, "kind": "note", "phase": "I"})
    return (diagnosis.cycle == "lock-cycle"
            or any(e.get("kind") in ("fx-trace", "compile") for e in events)
            or any(e["kind"] != "stuck-flag" for e in events)
            or any(f.code == "DFD501" for f in findings))
'''


@pytest.mark.parametrize("scan, expected", [
    (cycle_words, ["line 12: 'lock-cycle'"]),
    (cycle_sets, ["line 4: CYCLES = (HangCycle.COMPILE_LOCK_AUTOGRAD, HangCycle.LOCK_CYCLE)"]),
    (event_kind_literals, ["line 5: 'step'", "line 6: 'recompile-limit'", "line 10: 'hang'", "line 11: 'note'",
                           "line 13: 'fx-trace'", "line 13: 'compile'", "line 14: 'stuck-flag'"]),
    (rule_code_literals, ["line 15: 'DFD501'"]),
])
def test_each_scan_finds_the_pattern_it_forbids(scan, expected):
    assert sorted(scan(ast.parse(_FORBIDDEN))) == sorted(expected)


def test_the_enums_keep_the_words_on_the_wire():
    assert {member.value for member in HangCycle} == {"compile-lock-autograd", "lock-cycle", "lock-wait", "no-cycle"}
    assert [c for c in HangCycle if c.is_wait_for_cycle] == [HangCycle.COMPILE_LOCK_AUTOGRAD, HangCycle.LOCK_CYCLE]
    assert len(EVENT_WORDS) == len(RecorderEventKind) and "compile-setting" in EVENT_WORDS
