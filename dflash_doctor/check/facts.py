"""The typed model of `check` facts (`facts` in the JSON envelope): what check/__init__.py's `run_check` fills and
render/check_view.py reads. Each part that ran keeps its own command's facts under its name, typed by that
command's model (scan/facts.py, guards/facts.py, repro/facts.py). TypedDicts, so the facts stay a plain dict and the JSON is
unchanged; tests/test_facts_shapes.py holds the JSON keys to this model."""
from __future__ import annotations

from typing import Dict, List, Literal, TypedDict

from dflash_doctor.findings import PartialFacts
from dflash_doctor.guards.facts import GuardsFacts
from dflash_doctor.repro.facts import ReproFacts
from dflash_doctor.scan.facts import ScanFacts

# The parts check knows, each a key of CheckFacts: a name spelled as a literal is one mypy checks there.
PartName = Literal["scan", "guards", "repro"]


class CheckPartsFacts(TypedDict, total=False):
    """The keys a run has only sometimes: the facts of each part that ran (a part whose dependency is missing,
    or that a signal cut short, has none), and `partial` when a signal stopped the check."""

    scan: ScanFacts
    guards: GuardsFacts
    repro: ReproFacts
    partial: PartialFacts


class _CheckFactsAlways(TypedDict):
    parts: List[str]  # the parts that ran, in order
    seconds: Dict[str, float]  # part -> wall seconds, for every part started (ran or not)
    # "as reported", or "downgraded to info (no DFD201)": guards and repro findings are info when the scan
    # found no compiled code called from a thread (and no --assume-threads).
    environment_findings: str


class CheckFacts(_CheckFactsAlways, CheckPartsFacts, total=False):
    """Required keys live in a base class: typing.Required is Python 3.11+, and the tool runs on 3.9."""
