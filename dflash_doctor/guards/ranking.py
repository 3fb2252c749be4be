"""The fixes `guards` ranks for a release: the mitigation registry's (dflash_doctor.mitigations, ranked by its
`recommend`), the advice that is not a mitigation (restart a stuck process, restore Dynamo's config defaults:
`mitigations.RESTART` and `RESTORE_CONFIG`, declared there so the DFD6xx rule table reads its fix texts from the
core), and upgrading torch (what that removes and adds, read from the release table for the target release).

Plain data and functions of it (no torch).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from dflash_doctor.hazards import Hazard, Release
from dflash_doctor.mitigations import REGISTRY, RESTART, RESTORE_CONFIG, FixKind, Recommendation, recommend


# The upgrade goal: the first release whose FX-tracing flag is thread-local (the upstream fix of the leak).
UPGRADE_GOAL = "a thread-local FX-tracing flag"


def hazard_fixes(hazard: Hazard, release: Release, present: bool = True) -> dict:
    """The registry's fixes for one hazard on one release: those that apply, and why the others do not (none for
    a hazard the release does not have)."""
    usable: List[str] = []
    unavailable: Dict[str, str] = {}
    if not present:
        return {"fixes": usable, "unavailable": unavailable}
    for m in REGISTRY:
        if m.recommended and hazard in m.covers:
            why = m.unavailable(release)
            if why is None:
                usable.append(m.name)
            else:
                unavailable[m.name] = why
    return {"fixes": usable, "unavailable": unavailable}


def _mitigation_entry(rec: Recommendation) -> dict:
    entries = [m for m in REGISTRY if m.name in rec.mitigations]
    return {"kind": FixKind.MITIGATION, "fix": "; ".join(f"{m.name}: {m.summary}" for m in entries), **rec.to_dict()}


def upgrade(hazards: frozenset, later: Sequence, hazards_of: Callable[..., frozenset]) -> Optional[dict]:
    """Upgrade advice from a release showing `hazards`, true for the release it starts from.

    `later` are the release table's rows after `version`, `hazards_of(row)` the hazards a row's source shows.
    The target is the first of them with a thread-local FX flag; nothing is offered when the flag is already
    thread-local here or no later release has it. What the upgrade removes, adds (with the first release that
    added it) and keeps are all read from the rows, so from 2.4 or 2.5 it says that the deadlock comes with it.
    """
    target = next((row for row in later if row.fx_flag_storage == "thread-local"), None)
    if target is None or not hazards & {Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG}:
        return None
    after = hazards_of(target)
    removes, keeps = hazards - after, hazards & after
    since = {h: next(row.release for row in later if h in hazards_of(row)) for h in after - hazards}
    adds = sorted(since, key=lambda h: [row.release for row in later].index(since[h]))
    text = f"Upgrade to torch {target.read_from} or later ({UPGRADE_GOAL}): it removes {_titles(removes)}"
    if adds:
        text += ", but adds " + " and ".join(f"the {h.label} (present from torch {since[h]})" for h in adds)
    if keeps:
        text += f"; it does not remove {_titles(keeps)}"
    cost = "a torch upgrade and re-validation (wheels matching your CUDA/ROCm and triton)"
    then = recommend(after, release_from_row(target))
    if then:
        cost += f"; on {target.read_from} the fixes rank: " + ", ".join(
            r.label + ("" if r.complete else f" (leaves {_titles(r.gaps)})") for r in then)
    return {"kind": FixKind.UPGRADE, "fix": text + ".", "cost": cost, "to": target.read_from,
            "removes": _values(removes), "adds": {h.value: since[h] for h in adds}, "keeps": _values(keeps),
            "then": [r.label for r in then]}


def release_from_row(row) -> Release:
    return Release(version=row.read_from, fx_flag_thread_local=row.fx_flag_storage == "thread-local",
                   non_lazy_backward_available=row.non_lazy_backward_available,
                   backward_compile_takes_compile_lock=row.backward_compile_takes_compile_lock,
                   fx_patches_isolated=row.fx_patches_isolated)


def rank_fixes(needed: frozenset, release: Release, fx_flag_now: Optional[bool], config: Mapping[str, object],
               defaults: Mapping[str, object], upgrade_advice: Optional[dict]) -> List[dict]:
    """Restart and restore-config first (they come before any fix), then the registry's complete fixes, an upgrade
    that adds no hazard, the incomplete fixes, and last an upgrade that trades hazards."""
    fixes: List[dict] = []
    if fx_flag_now:
        fixes.append(RESTART.to_dict())
    if any(config.get(name) is not None and config.get(name) != default for name, default in defaults.items()):
        fixes.append(RESTORE_CONFIG.to_dict())
    recommendations = recommend(needed, release)
    fixes += [_mitigation_entry(r) for r in recommendations if r.complete]
    trades = bool(upgrade_advice and upgrade_advice["adds"])
    if upgrade_advice and not trades:
        fixes.append(upgrade_advice)
    fixes += [_mitigation_entry(r) for r in recommendations if not r.complete]
    if upgrade_advice and trades:
        fixes.append(upgrade_advice)
    return [dict(rank=rank, **fix) for rank, fix in enumerate(fixes, start=1)]


def _ordered(hazards: Iterable[Hazard]) -> List[Hazard]:
    return [h for h in Hazard if h in set(hazards)]


def _titles(hazards: Iterable[Hazard]) -> str:
    return " and ".join(f"the {h.label}" for h in _ordered(hazards)) or "nothing"


def _values(hazards: Iterable[Hazard]) -> List[str]:
    return [h.value for h in _ordered(hazards)]


__all__ = ["hazard_fixes", "rank_fixes", "release_from_row", "upgrade"]
