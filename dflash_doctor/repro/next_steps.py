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


# The hazard each reproduced race is (other-error is none: the step failed for a reason of its own).
_HAZARD_OF_KIND = {FailureKind.FX_FLAG_LEAK: Hazard.FX_FLAG_LEAK, FailureKind.STUCK_FLAG: Hazard.STUCK_FLAG,
                   FailureKind.DEADLOCK: Hazard.DEADLOCK, FailureKind.PATCHER_RACE: Hazard.PATCHER_RACE}


def reproduced_hazards(facts: ReproFacts) -> Tuple[Hazard, ...]:
    """Every hazard any trial of this run reproduced: the headline's kind, each race the baseline showed, and
    each kind in a tally (a mitigation row that broke shows the step has that race too)."""
    kinds = [facts["kind"]] + [entry["kind"] for entry in facts.get("baseline_reproduced") or []]
    tallies = [facts.get("levels") or {}, facts.get("baseline_levels") or {}] + [
        row.get("stresses") or {} for row in facts.get("matrix") or []]
    kinds += [kind for tally in tallies for level in tally.values() for kind in level.get("kinds") or {}]
    hazards = {_HAZARD_OF_KIND[FailureKind(kind)] for kind in kinds if kind in _HAZARD_OF_KIND}
    return tuple(h for h in Hazard if h in hazards)


def conditional_hazards(facts: ReproFacts) -> Tuple[Hazard, ...]:
    """The conditional hazards this run showed the trainer can meet: a foreign trace was part of it (the
    foreign-trace stress, or the patcher race reproduced in any row), so the advice must stop the patcher race
    too."""
    tallies = [facts.get("levels") or {}, facts.get("baseline_levels") or {}] + [
        row.get("stresses") or {} for row in facts.get("matrix") or []]
    foreign = facts["mode"] == Stress.FOREIGN_TRACE.value or Hazard.PATCHER_RACE in reproduced_hazards(facts) or any(
        _ran(tally.get(Stress.FOREIGN_TRACE.value)) for tally in tallies)
    return (Hazard.PATCHER_RACE,) if foreign else ()


def _ran(level: Optional[LevelFacts]) -> bool:
    return level is not None and level["ran"] > 0


def needed_hazards(facts: ReproFacts) -> frozenset:
    """What the advice must stop: every severe hazard this release has, each conditional one the run showed, and
    every hazard a trial reproduced (a fix that leaves one of those open is no answer to this run)."""
    release = release_from_facts(facts)
    return release.hazards(including=conditional_hazards(facts)) | frozenset(reproduced_hazards(facts))


def best_fix(facts: ReproFacts) -> Optional[registry.Recommendation]:
    return registry.covering(needed_hazards(facts), release_from_facts(facts))


def fix_line(facts: ReproFacts, also: Tuple[Hazard, ...] = ()) -> Optional[str]:
    """The best complete fix covering every hazard this run reproduced and this release has (and `also`), then
    the alternatives that cover them all too."""
    release = release_from_facts(facts)
    needed = needed_hazards(facts) | frozenset(also)
    best = registry.covering(needed, release)
    if best is None:
        return None
    shown = needed & frozenset(reproduced_hazards(facts))
    others = [r for r in registry.recommend(needed, release) if r.complete and shown <= r.covers
              and r.mitigations != best.mitigations]
    line = f"fix: {best.label} ({'; '.join(best.api)})"
    if shown:
        line += f", which stops every race reproduced here ({', '.join(h.value for h in Hazard if h in shown)})"
    if others:
        line += f"; alternatives: {', '.join(r.label for r in others)}"
    return line + ". `--matrix` puts each through the stress ladder on this install"


def injected_steps(facts: ReproFacts) -> List[str]:
    """A --step/--model replay that failed only under a trace of the tool's own: what that shows and what not."""
    injected = [entry for entry in facts.get("baseline_reproduced") or [] if entry["injected"]]
    how = ", ".join(f"{entry['kind']} under {entry['stress']}" for entry in injected) or str(facts["kind"])
    own = _counts({stress: entry for stress, entry in (facts.get("levels") or {}).items()
                   if stress in (Stress.NATURAL.value, Stress.AMPLIFIED.value)})
    steps = [f"the step's own threads did not race ({own or 'natural and amplified did not run'}); it failed only "
             f"when the tool traced with torch.fx beside it ({how}): the step fails IF a thread of your trainer "
             "traces with FX (symbolic_trace, a profiler, an FX pass) while it runs"]
    # A thread that traces with FX is the patcher race's condition too: the fix for "if one does" must stop it.
    line = fix_line(facts, also=(Hazard.PATCHER_RACE,))
    if line:
        steps.append(f"if one does, {line}")
    steps.append("if none does, nothing here needs a fix; `dflash-doctor scan` finds threads that trace with FX, "
                 "and `dflash-doctor run -- python train.py` watches the real run")
    return steps


def _counts(tally: Dict[str, LevelFacts]) -> str:
    return ", ".join(f"{stress} {entry['reproduced']}/{entry['ran']}" for stress, entry in tally.items()
                     if not entry.get("skipped") and entry["ran"])


def next_steps(facts: ReproFacts) -> List[str]:
    """One line each: what the verdict means here and what to run or change next."""
    matrix = facts.get("matrix")
    if matrix:
        return _matrix_steps(matrix, facts)
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
        open_races = [h for h in reproduced_hazards(facts) if h not in registry.covers(registry.parse(mitigation))]
        if open_races:
            steps.append(f"--mitigation {mitigation} does not stop {', '.join(h.value for h in open_races)}, "
                         "which this run reproduced")
        line = fix_line(facts) if outcome != "holds" or open_races else None
        return steps + ([line] if line else [])
    if facts["verdict"] == "reproduced-if-traced":
        return injected_steps(facts)
    if facts["verdict"] == "reproduced":
        line = fix_line(facts)
        return [line] if line else ["none known: the step fails for another reason; read the thread errors above"]
    steps.append("not reproduced at any stress that ran (" + (_counts(facts.get("levels") or {}) or "none ran")
                 + "): the race needs a compile to overlap another thread's work, so this is not proof of safety")
    if facts["shapes"] == "same" and facts["backward"]:
        steps.append("`--shapes per-thread` gives every thread its own compile, each a new race window")
    user_code = not facts["model"].startswith("reference")
    if facts["device"] == "cpu" and user_code:  # the step's own backward, if it has one, ran on its thread
        steps.append("on a GPU each device's autograd thread runs the backward and the deadlock can form: "
                     "`--device cuda`")
    elif not facts["backward"]:
        steps.append("on a GPU the backward compiles lazily and the deadlock can form: `--device cuda`")
    steps.append("`dflash-doctor guards` reads this torch's guard and probes it directly")
    return steps


def _matrix_steps(rows: Sequence[MatrixRowFacts], facts: ReproFacts) -> List[str]:
    steps = []
    for word in ("holds", "fails", "inconclusive"):
        named = [row for row in rows if row["outcome"] == word]
        if named:
            steps.append(f"{word}: " + "; ".join(f"{row['mitigation']} ({row['reason']})" for row in named))
    shown = frozenset(reproduced_hazards(facts))
    needed = needed_hazards(facts)
    # Only a holding row that stops every race reproduced here answers this run; one that holds under its own
    # ladder but leaves a reproduced race open is no fix for this step.
    holding = [row["mitigation"] for row in rows if row["outcome"] == "holds"
               and shown <= registry.covers(registry.parse(row["mitigation"]))]
    if shown:
        steps.append(f"reproduced here: {', '.join(h.value for h in Hazard if h in shown)}")
    if holding:
        steps.append(f"apply in your trainer: {', '.join(holding)} (each is a call in dflash_doctor.runtime; "
                     "README: 'Fix it in your own trainer')")
    else:
        best = registry.covering(needed, release_from_facts(facts))
        if best is not None and shown:
            steps.append(f"no row that held stops all of them; the combination that covers them: {best.label} "
                         f"(`--mitigation {best.label}` proves it)")
    return steps
