"""The typed model of `repro --mode dataparallel` facts: what repro/dataparallel.py fills and
render/dataparallel_view.py reads. TypedDicts, so the facts stay plain dicts and the JSON is as written; the words
(an outcome, a failure kind) are typed `str`, as in repro/facts.py."""
from __future__ import annotations

from typing import List, Optional, TypedDict


class _FormFactsAlways(TypedDict):
    form: str  # DataParallelForm
    code: str  # the form as a trainer writes it
    outcome: str  # ThreadOutcome of the form's steps: ok | error | hung
    kind: Optional[str]  # FailureKind it ended in; None when every step ran and the model stayed whole
    steps: int
    seconds: float
    step_s: List[float]  # seconds since the child started, at the end of each step
    graphs: int  # graphs Dynamo compiled in the child (0: everything ran uncompiled)
    model_intact: Optional[bool]  # the user's model kept its own submodules
    model_tree_after: List[str]  # its module names after the steps (the first 12)
    error: Optional[str]
    traceback: Optional[str]
    torch_version: Optional[str]
    fix: Optional[str]  # the DataParallel fix this form is (dflash_doctor/dataparallel.py), if any


class FormFacts(_FormFactsAlways, total=False):
    fix_outcome: str  # for a fix's form: holds | ran-uncompiled | fails


class MeasuredFacts(TypedDict):
    torch: str
    machine: str
    showed: str


class FixFacts(TypedDict):
    name: str
    form: str
    api: str
    caveat: str
    registry_entry: Optional[str]
    measured: List[MeasuredFacts]


class _DataParallelFactsAlways(TypedDict):
    mode: str  # "dataparallel"
    device: str
    threads: int  # the replica count, under the name every repro document uses
    replicas: int
    torch_version: Optional[str]
    mitigation: str  # the fixes asked for, comma-joined, or "none"
    steps: int
    verdict: Optional[str]  # reproduced | not-reproduced | None (the baseline form gave no answer)
    kind: Optional[str]
    forms: List[FormFacts]
    wall_s: float
    fixes: List[FixFacts]


class DataParallelFacts(_DataParallelFactsAlways, total=False):
    cpu_note: str  # what a CPU can and cannot replay (only on a CPU)
    expect: str  # --expect, when given
