"""The typed model of `guards` facts (`facts` in the JSON envelope): what guards/run.py fills and
render/guards_view.py, the state findings and `check` read. A TypedDict, so the facts stay a plain dict and the
JSON is unchanged; the nested parts each read source question keeps its own dict (their `to_dict()`s), typed
here as mappings; tests/test_facts_shapes.py holds the JSON keys to this model."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, TypedDict


class ReleaseFacts(TypedDict):
    version: Optional[str]
    fx_flag_thread_local: Optional[bool]
    non_lazy_backward_available: Optional[bool]
    backward_compile_takes_compile_lock: Optional[bool]
    fx_patches_isolated: Optional[bool]
    compile_settings_per_thread: Optional[bool]


class GuardsFacts(TypedDict):
    torch_version: Optional[str]
    fx_flag_storage: str
    guard: Dict[str, Any]
    masked_during_compile: Any
    config: Dict[str, Any]  # the live torch config flags the verdict reads (None each when not read)
    fx_flag_now: Optional[bool]
    probes: Dict[str, Optional[str]]  # probe name -> outcome
    compile_cache: Optional[Dict[str, Any]]
    verdict: str
    verdict_reasons: List[str]
    worst_hazard: Optional[str]
    hazards: Dict[str, Dict[str, Any]]  # hazard -> its verdict and the fixes ranked for it
    release: ReleaseFacts
    fixes: List[Dict[str, Any]]
    versions: Dict[str, Any]
    fx_flag: Optional[Dict[str, Any]]  # None: this release keeps no FX flag the reader knows
    compiling_flag: Dict[str, Any]
    backward_compile: Dict[str, Any]
    fx_patches: Dict[str, Any]
    compile_settings: Dict[str, Any]  # where an assigned compile setting lives, and what that means for the fixes
    corroboration: Any
    probe_details: Dict[str, Dict[str, Any]]
    state_source: str
    env: Optional[Mapping[str, Any]]
    triton_cache: Optional[Dict[str, Any]]
    torch_root: str
    layout_notes: List[str]
    seconds: Dict[str, float]
