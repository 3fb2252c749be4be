"""The typed model of `scan` facts (`facts` in the JSON envelope): what scan/engine.py's `_facts` fills and
commands/scan.py and `check` read. TypedDicts, so the facts stay a plain dict and the JSON is unchanged;
tests/test_facts_shapes.py holds the JSON keys to this model."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict


class SkippedFolderFacts(TypedDict):
    path: str
    reason: str


class EntryPointFacts(TypedDict):
    path: str
    how: str


class _ScanFactsBase(TypedDict):
    paths: List[str]
    files: int
    parsed: int
    skipped_by_prefilter: int
    loaded_for_call_chains: int
    loaded_for_flex_coverage: int
    jobs: int
    skipped_folders: List[SkippedFolderFacts]  # the first ones (MAX_LISTED_SKIPS)
    skipped_folders_total: int
    config: Optional[str]  # the config file read, if any
    rules: List[str]
    ignored_by_per_file_ignores: int
    baseline: Optional[Dict[str, Any]]  # --baseline: what it suppressed and what it no longer matched
    mitigations_applied: List[Dict[str, Any]]  # scan/applied.py AppliedFix.to_dict()
    followed_imports: List[str]
    project_root: Optional[str]
    entry_points: Optional[List[EntryPointFacts]]  # None: no program analysis ran
    transformers: Optional[str]
    rule_counts: Dict[str, int]
    seconds: float


class ScanFacts(_ScanFactsBase, total=False):
    statistics: Dict[str, int]  # --statistics: the codes that were reported, with their counts
