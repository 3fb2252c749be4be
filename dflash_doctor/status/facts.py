"""The typed model of `status` facts (`facts` in the JSON envelope): what join.py fills from the logs and gpus
facts and render/status_view.py reads. TypedDicts, so the facts stay plain dicts and the JSON is unchanged;
tests/test_facts_shapes.py holds the JSON keys to these models."""
from __future__ import annotations

from typing import Dict, List, Optional, TypedDict

from dflash_doctor.logs.facts import RootCauseFacts


class CauseFacts(TypedDict):
    """What killed a dead worker: the part of its logs death (logs/facts.py DeathFacts) the view shows."""

    code: str
    exception: Optional[str]
    message: str
    line: int
    signal: Optional[str]
    root_cause: bool


class WorkerFacts(TypedDict):
    """One worker of the log, the GPU it ran on (None: not known) and that GPU's reading."""

    thread: str
    state: str  # dead | stalled | progressing | unknown
    gpu: Optional[int]
    role: Optional[str]
    cause: Optional[CauseFacts]  # set when the state is dead
    last_step: Optional[int]
    last_tok_s: Optional[float]
    gpu_utilization: Optional[float]
    gpu_memory_used_mib: Optional[float]
    gpu_findings: List[str]  # the gpus rules that fired on its GPU


class GpuStatusFacts(TypedDict):
    """One GPU of the snapshot and the worker mapped to it (None: none)."""

    gpu: int
    role: Optional[str]
    thread: Optional[str]
    utilization: Optional[float]
    memory_used_mib: Optional[float]
    findings: List[str]


class StatusFacts(TypedDict):
    log: str
    gpu_source: str
    roles: Dict[str, List[int]]
    thread_map: Dict[str, int]
    workers: List[WorkerFacts]
    root_cause: Optional[RootCauseFacts]
    gpus: List[GpuStatusFacts]
    unexplained_idle_gpus: List[int]
    next_steps: List[str]
