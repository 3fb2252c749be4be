"""Whole repro facts for the tests that hand facts to a reader (the views, next_steps) without running a repro:
the readers take dflash_doctor.repro.facts.ReproFacts, keys and all, so an example has every key a real report
has (tests/test_facts_shapes.py holds these to the model too)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


def capabilities(storage: Optional[str] = "module-global", **keys: Any) -> Dict[str, Any]:
    return {"skipped": {}, "cannot_show": [], "fx_flag_storage": storage, "masked_during_compile": None,
            "torch_version": None, **keys}


def thread(name: str, outcome: str = "ok", error: Optional[str] = None, steps: int = 1) -> Dict[str, Any]:
    return {"name": name, "outcome": outcome, "error": error, "steps": steps}


def phase(outcome: str, threads: List[Dict[str, Any]], seconds: float = 1.0, **keys: Any) -> Dict[str, Any]:
    return {"outcome": outcome, "seconds": seconds, "threads": threads, "steps_per_s": None, "events": [], **keys}


def repro_facts(**keys: Any) -> Dict[str, Any]:
    """A finished default run's facts on a CPU (no reproduction, nothing ran), with `keys` in their place."""
    facts: Dict[str, Any] = {
        "torch_version": "2.13.0+cpu", "device": "cpu", "threads": 3, "mode": "auto", "mitigation": "none",
        "cache": "cold", "shared_cache": [], "shared_cache_fixes": [], "backward": False, "checkpoint": "none", "shapes": "same", "steps": 3,
        "jobs": 1,
        "model": "reference drafter (replay)", "capabilities": capabilities(), "amplify_ms": 2.0,
        "single_thread": None, "verdict": "not-reproduced", "kind": None, "level": None, "levels": {}, "blame": [],
        "multi_thread": None, "hang": None, "trials": [], "reproduction_rate": None, "time_to_verdict_s": 0.0,
        "wall_s": 0.0, "next_steps": []}
    facts.update(keys)
    return facts
