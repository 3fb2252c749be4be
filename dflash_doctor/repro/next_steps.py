"""What to do after a repro: pure data from the facts, shown by the text view and kept in the JSON.

The fixes and their caveats come from the mitigation registry (dflash_doctor/mitigations.py), the same source
`guards`, `explain` and the README use, so the four cannot disagree. A "not reproduced" is the answer users
misread most: the race is timing-dependent, so the lines say what this run could and could not show.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.hazards import Hazard, Release, Stress
from dflash_doctor.outcomes import FailureKind
from dflash_doctor.repro.facts import LevelFacts, MatrixRowFacts, ReproFacts


def release_from_facts(facts: ReproFacts) -> Release:
    storage = facts["capabilities"]["fx_flag_storage"]
    return Release(version=facts["torch_version"],
                   fx_flag_thread_local=None if storage is None else storage == "thread-local")


def conditional_hazards(facts: ReproFacts) -> Tuple[Hazard, ...]:
    """The conditional hazards this run showed the trainer can meet: a foreign trace was part of it (the
    foreign-trace stress, or the patcher race reproduced), so the advice must stop the patcher race too."""
    foreign = facts["mode"] == Stress.FOREIGN_TRACE.value or facts["kind"] == FailureKind.PATCHER_RACE or any(
        _ran(row["stresses"].get(Stress.FOREIGN_TRACE.value)) for row in facts.get("matrix") or [])
    return (Hazard.PATCHER_RACE,) if foreign else ()


def _ran(level: Optional[LevelFacts]) -> bool:
    return level is not None and level["ran"] > 0


def fix_line(facts: ReproFacts) -> Optional[str]:
    """The best complete fix for every hazard this release has, then the alternatives."""
    release = release_from_facts(facts)
    ranked = [r for r in registry.recommend(release.hazards(including=conditional_hazards(facts)), release)
              if r.complete]
    if not ranked:
        return None
    best, others = ranked[0], ranked[1:]
    line = f"fix: {best.label} ({'; '.join(best.api)})"
    if others:
        line += f"; alternatives: {', '.join(r.label for r in others)}"
    return line + ". `--matrix` puts each through the stress ladder on this install"


def _counts(tally: Dict[str, LevelFacts]) -> str:
    return ", ".join(f"{stress} {entry['reproduced']}/{entry['ran']}" for stress, entry in tally.items()
                     if not entry.get("skipped") and entry["ran"])


def next_steps(facts: ReproFacts) -> List[str]:
    """One line each: what the verdict means here and what to run or change next."""
    matrix = facts.get("matrix")
    if matrix:
        return _matrix_steps(matrix)
    mitigation = facts["mitigation"]
    steps: List[str] = []
    if mitigation != registry.NONE:
        outcome, reason = facts.get("outcome"), facts.get("outcome_reason", "")
        caveats = registry.caveats_for(registry.parse(mitigation))
        if outcome == "fails":
            steps.append(f"--mitigation {mitigation} fails: {reason}")
            steps.extend(f"it leaves open: {c}" for c in caveats)
        elif outcome == "holds":
            steps.append(f"--mitigation {mitigation} holds: {reason}")
            steps.extend(f"caveat: {c}" for c in caveats)
        else:
            steps.append(f"--mitigation {mitigation} is inconclusive: {reason}")
        line = fix_line(facts) if outcome != "holds" else None
        return steps + ([line] if line else [])
    if facts["verdict"] == "reproduced":
        line = fix_line(facts)
        return [line] if line else ["none known: the step fails for another reason; read the thread errors above"]
    steps.append("not reproduced at any stress that ran (" + (_counts(facts.get("levels") or {}) or "none ran")
                 + "): the race needs a compile to overlap another thread's work, so this is not proof of safety")
    if facts["shapes"] == "same" and facts["backward"]:
        steps.append("`--shapes per-thread` gives every thread its own compile, each a new race window")
    if not facts["backward"]:
        steps.append("on a GPU the backward compiles lazily and the deadlock can form: `--device cuda`")
    steps.append("`dflash-doctor guards` reads this torch's guard and probes it directly")
    return steps


def _matrix_steps(rows: Sequence[MatrixRowFacts]) -> List[str]:
    steps = []
    for word in ("holds", "fails", "inconclusive"):
        named = [row for row in rows if row["outcome"] == word]
        if named:
            steps.append(f"{word}: " + "; ".join(f"{row['mitigation']} ({row['reason']})" for row in named))
    holding = [row["mitigation"] for row in rows if row["outcome"] == "holds"]
    if holding:
        steps.append(f"apply in your trainer: {', '.join(holding)} (each is a call in dflash_doctor.runtime; "
                     "README: 'Fix it in your own trainer')")
    return steps
