"""The typed model of `run` and `attach` facts (`facts` in the JSON envelope): what supervisor.py and attach.py
fill and render/live_view.py reads. TypedDicts, so the facts stay plain dicts and the JSON is unchanged;
tests/test_facts_shapes.py holds the JSON keys to these models."""
from __future__ import annotations

from typing import List, Optional, TypedDict


class RunProcessFacts(TypedDict):
    """One Python process of a trial, as its agent's record says."""

    pid: int
    rank: Optional[int]
    argv: List[str]
    torch: Optional[str]  # the torch version it imported; None: it never imported torch
    ended: Optional[str]  # exit | os._exit | None (killed, or still running when the trial ended)
    events: int
    fx_errors: int
    hang: Optional[str]  # the cycle its watchdog named
    hang_latency_s: Optional[float]


class CrashFacts(TypedDict):
    """A process of the command whose interpreter crashed: faulthandler's trace, every thread's stack."""

    pid: int
    trace: str


class TrialFacts(TypedDict):
    trial: int
    exit_code: int
    seconds: float
    findings: int
    killed_on_hang: bool
    signals_forwarded: List[str]
    session: Optional[str]  # the session folder, when it was kept
    ended: List[str]  # "pid (name)" of each process the command left running, which run ended
    crashes: List[CrashFacts]
    processes: List[RunProcessFacts]


class RateFacts(TypedDict):
    trials: int
    with_findings: int
    exit_nonzero: int


class ProofTrialFacts(TypedDict):
    trial: int
    exit_code: int
    seconds: float
    findings: int
    shown: List[str]  # the hazards its findings show (proof.OTHER for none of them)


class ProofArmFacts(TypedDict):
    """One arm of `run --fix`'s proof: the trials without the fix (baseline) or with it."""

    trials: int
    with_findings: int
    exit_nonzero: int
    per_trial: List[ProofTrialFacts]


class ProofHazardFacts(TypedDict):
    hazard: str  # a Hazard value, or "other"
    baseline: int  # baseline trials that showed it
    baseline_trials: int
    fix: int  # fix trials that showed it
    fix_trials: int
    verdict: str  # holds | fails | inconclusive
    reason: str
    next: List[str]  # for an inconclusive verdict: more trials, the amplifiers not used


class ProofAmplifierFacts(TypedDict):
    name: str  # vocabularies.Amplifier
    what: str  # as applied, to reproduce the result by hand


class ProofFacts(TypedDict):
    """`run --fix` against a baseline in the same invocation (supervise/proof.py)."""

    fixes: List[str]
    order: str  # how the arms' trials were interleaved
    amplifiers: List[ProofAmplifierFacts]
    cache: str  # cold | as-is
    baseline: ProofArmFacts
    fix: ProofArmFacts
    hazards: List[ProofHazardFacts]
    verdict: str  # fails if any hazard fails; holds if every hazard holds; else inconclusive
    injected: bool  # a foreign trace of the tool's own ran beside the threads: a race shown is one IF a thread traces
    advice: List[str]  # the fix covering every hazard either arm reproduced


class _RunFactsAlways(TypedDict):
    command: List[str]
    fixes: List[str]
    cache: str  # cold | as-is
    on_hang: str
    hang_after_s: float
    trials: List[TrialFacts]  # with --fix and its baseline: the fix arm's (the baseline's are in proof)
    rate: RateFacts
    amplifiers: List[str]  # --amplify: vocabularies.Amplifier values applied in every process
    proof: Optional[ProofFacts]  # --fix with its baseline (the default); None: no --fix, or --no-baseline
    advice: List[str]  # the fix covering every race the trials showed (proof.run_advice); with a proof, its advice


class RunFacts(_RunFactsAlways):
    """`run`'s facts (supervisor.report_for; proof.add_proof fills `proof`)."""


class AttachProcessFacts(TypedDict):
    pid: int
    command: Optional[str]
    rank: Optional[int]
    gpus: Optional[List[int]]
    threads: List[str]
    still: List[str]  # threads whose stacks did not move over the samples
    cycle: Optional[str]  # the lock cycle the last sample showed, if any
    cycle_threads_still: bool  # ... and its threads had not moved since it formed: the finding's condition
    chain: List[str]
    samples: int


class AttachFacts(TypedDict):
    pid: int
    subprocesses: bool
    samples: int
    interval_s: float
    seconds: float
    processes: List[AttachProcessFacts]
    gpus: str  # read | unavailable: why
    python_children: List[int]  # Python processes below pid not read (without --subprocesses): the hint
