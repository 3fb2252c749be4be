"""What to run next after a repro: pure data from the facts, shown by the text view and kept in the JSON.

A "not reproduced" is the answer users misread most: the race is timing-dependent, and on the CPU half of it
(the lazy-backward deadlock) cannot form at all. So the advice says what this run could and could not show.
"""
from __future__ import annotations

from typing import List

# The mitigations that held on the H200 (docs/gpu-results.md) for each failure kind, cheapest first.
FIXES = {
    "fx-flag-leak": "threadlocal-flag (with non-lazy-backward on a GPU), warmup, global-lock",
    "stuck-flag": "threadlocal-flag, or processes (a stuck flag breaks every later compiled call in the process)",
    "deadlock": "threadlocal-flag,non-lazy-backward, warmup or global-lock",
    "other-error": "none known: the step fails for another reason; read the thread errors above",
}


def next_steps(facts: dict) -> List[str]:
    """One line each: what the verdict means here and the command to run next."""
    steps: List[str] = []
    on_cpu = str(facts.get("device", "")).startswith("cpu")
    mitigation = facts.get("mitigation") or "none"
    if facts.get("matrix"):
        held = [row["mitigation"] for row in facts["matrix"]
                if row.get("verdict") == "not-reproduced" and row.get("mitigation") != "none"]
        if held:
            steps.append(f"held on this install: {', '.join(held)}; each is a function in dflash_doctor.runtime "
                         "(README: 'Fix it in your own trainer')")
        return steps
    if facts.get("verdict") == "reproduced":
        kind = facts.get("kind") or "other-error"
        if mitigation == "none":
            steps.append(f"fixes that held for {kind} on the H200: {FIXES.get(kind, FIXES['other-error'])}; "
                         "`--matrix` measures them all on this install")
        else:
            steps.append(f"--mitigation {mitigation} did not hold here; `--matrix` shows which does")
        return steps
    if mitigation != "none":
        steps.append(f"--mitigation {mitigation} held in this run; raise --trials for a rate, not one sample")
        return steps
    if not facts.get("backward"):
        steps.append("forward only (flex_attention has no CPU backward), so the compile-lock / autograd deadlock "
                     "cannot form here" if on_cpu else
                     "forward only (--no-backward): the compile-lock / autograd deadlock cannot form")
    if facts.get("mode") == "natural":
        steps.append("not reproduced is not safe: the race needs a compile to overlap another thread's call. "
                     "`--mode forced` tests this torch's guard deterministically; `dflash-doctor guards` reads it")
        if on_cpu:
            steps.append("on a GPU: `--device cuda --shapes per-thread` (the seeds' shape: the H200 deadlocked)")
    return steps
