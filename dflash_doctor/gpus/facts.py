"""The typed model of `gpus` facts (`facts` in the JSON envelope): what analyze.py and sources.py fill and
render/gpus_view.py and status/join.py read. TypedDicts, so the facts stay plain dicts and the JSON is unchanged;
tests/test_facts_shapes.py holds the JSON keys to these models."""
from __future__ import annotations

from typing import Dict, List, Optional, TypedDict


class ProcessFacts(TypedDict):
    """One process holding memory on a GPU (gpus/readings.py GpuProcess)."""

    pid: int
    used_mib: Optional[float]
    name: Optional[str]
    threads: Optional[int]
    state: str  # running | sleeping | zombie | gone | unknown


class ReadingFacts(TypedDict):
    """One GPU's averaged reading (GpuReading.to_dict)."""

    index: int
    name: Optional[str]
    utilization: Optional[float]  # percent, one decimal
    memory_used_mib: Optional[float]
    memory_total_mib: Optional[float]
    samples: int
    lost: bool
    processes: List[ProcessFacts]


class GpuFacts(ReadingFacts):
    """A reading with its role (None: the GPU is in no --roles role) and the capacity it was judged against."""

    role: Optional[str]


class ThresholdFacts(TypedDict):
    idle_util: float
    min_held_mib: float
    imbalance_gap: float
    imbalance_ratio: float
    near_capacity: float
    busy_util: float


class _GpusFactsAlways(TypedDict):
    source: str  # "csv" | "nvml"
    gpus: List[GpuFacts]


class GpusFacts(_GpusFactsAlways, total=False):
    """`source` and `gpus` are always there (a snapshot that could not be read has no GPUs); the analysis keys
    come with any snapshot; `columns`/`header`/`rows` with a CSV, `samples` with NVML; `next_steps` once read.
    (Required keys live in a base class: typing.Required is Python 3.11+, and the tool runs on 3.9.)"""

    path: Optional[str]
    roles: Dict[str, List[int]]
    role_busy_level: Dict[str, float]
    thresholds: ThresholdFacts
    skipped_checks: List[str]
    columns: List[str]
    header: bool
    rows: int
    samples: int
    next_steps: List[str]
