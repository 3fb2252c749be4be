"""The typed model of `repro` facts (`facts` in the JSON envelope, `repro --matrix` included): what run_facts.py and
classify.py's phase_facts fill and render/repro_view.py, findings.py, next_steps.py and the Chrome trace read.
TypedDicts, so the facts stay plain dicts and the JSON is unchanged; tests/test_facts_shapes.py holds the JSON keys
to these models.

The words (an outcome, a failure kind, a stress) are typed `str`: some are the str enums of outcomes.py and
hazards.py, some their values (phase_facts writes a phase record's words as values), and either compares equal to
the member and is the same word in the JSON. (Keys that are sometimes absent live in a `total=False` class, the keys always there
in its base: typing.NotRequired is Python 3.11+, and the tool runs on 3.9.)
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict, Union


# -- what a phase child recorded ------------------------------------------------------------------------------
class FrameFacts(TypedDict):
    """One Python frame (runtime/stacks.py Frame.to_dict)."""

    file: str
    line: int
    function: str
    source: str  # the line being executed, stripped
    # [line, context expression] of each `with` block around the line, outermost first: a block whose header is
    # the line itself is the one the thread is entering (waiting for its lock, say).
    enclosing_with: List[List[Union[int, str]]]
    waits_for: Optional[List[str]]  # [identity, expression] of the lock it is blocked acquiring (lock_sites.py)
    holds: List[List[str]]  # [identity, expression] of each lock it holds


class StackFacts(TypedDict):
    """One thread's stack at a hang (runtime/stacks.py ThreadStack.to_dict), outermost frame first."""

    name: str
    ident: int
    frames: List[FrameFacts]
    locks_read: bool  # whether waits_for / holds were read by object (else from the source, globals only)


class EventFacts(TypedDict):
    """One flight-recorder event (runtime/recorder.py Event.to_dict): what the timeline and the trace draw."""

    t: float  # seconds since the child's recorder started
    thread: str
    tid: int
    kind: str  # fx-trace | compile | recompile | step | exception | stuck-flag | hang | note
    phase: str  # Chrome-trace style: B begin, E end, I instant
    detail: Dict[str, Any]


class BlameFacts(TypedDict):
    """Who held the FX flag when a thread raised the FX-tracing error (runtime/recorder.py Blame.to_dict)."""

    victim: str
    # The threads inside a trace (comma-joined), the trace that left the flag stuck, or the victim itself (its own
    # nested trace); None: the recorder found no one.
    holder: Optional[str]
    at_s: float
    kind: str  # BlameKind: fx-flag-leak | stuck-flag | nested-trace | unknown
    error: str
    # Where the (first) holder was at the raise, read from the victim's thread; empty but for a leak.
    holder_stack: List[FrameFacts]
    trace_start: List[FrameFacts]  # the holder's stack when its trace began (runtime/recorder.py Blame)
    victim_stack: List[FrameFacts]  # the victim's stack at the raise


class HangFacts(TypedDict):
    """Why a phase hung, read from its threads' stacks (runtime/deadlock.py HangDiagnosis.to_dict)."""

    kind: str  # FailureKind: deadlock, or other-error where the stacks show no lock cycle
    cycle: str  # compile-lock-autograd | lock-cycle | lock-wait | no-cycle
    chain: List[str]  # the cycle in plain words, one step each
    threads: List[str]
    stalled_s: float
    hint: str
    locks: List[str]  # identities of the cycle's lock objects (runtime/lock_sites.py)


class _ThreadFactsAlways(TypedDict):
    name: str
    outcome: str  # ThreadOutcome: ok | error | hung
    error: Optional[str]
    steps: int


class ThreadFacts(_ThreadFactsAlways, total=False):
    """One worker thread of a phase (phase_facts keeps these keys of the child's record)."""

    # Read inside the worker, where the switch lives (it is thread-local). Absent where the child died before its
    # workers ran and the parent made the record up from how it ended (runner.read_phase_result).
    autograd_multithreading: bool
    # Every switch the applied mitigations declare (mitigations.Switch), as the worker read it: compile settings
    # are per thread from torch 2.12, so this shows whether a set-up reached the worker.
    switches: Dict[str, str]
    # Backward graphs compiled lazily in this thread at a backward call (0 with non-lazy backward in effect; on a
    # GPU the autograd device thread compiles them, so a worker reads 0 there either way).
    lazy_backward_compiles: int


class ShimStatusFacts(TypedDict):
    """What the threadlocal-flag shim did in the child (runtime/fx_flag.py ShimStatus.to_dict)."""

    state: str  # installed | native | unknown-layout
    detail: str
    patched: List[str]  # "module.predicate" names now reading the thread-local depth
    stale_wrappers: int  # compile wrappers made before the shim: they still read the global flag


class SelfCheckFacts(TypedDict):
    """A mitigation's own check, run in the child right after it was installed."""

    ok: bool
    detail: str


class PatchIsolationFacts(TypedDict):
    """What isolate-fx-patches did in the child (runtime/fx_patches.py PatchIsolation.to_dict)."""

    state: str  # installed | native | unknown-layout
    detail: str
    replaced: List[str]


class TracingThreadFacts(TypedDict):
    """The foreign-trace stress's looping symbolic_trace thread: it stands for the user's profiler, so how it
    ended is part of the result (its error can be the patcher race's only trace)."""

    name: str
    outcome: str  # ThreadOutcome
    error: Optional[str]
    traces: int  # traces it finished


class ProcessFacts(TypedDict):
    """One worker process of a `processes` trial: the trace draws each process's events on its own."""

    threads: List[str]
    events: List[EventFacts]


# -- a phase --------------------------------------------------------------------------------------------------
class PhaseExtras(TypedDict, total=False):
    """The keys a phase has only where its child filled them (an empty or null value is left out). phase_facts
    copies exactly these, in this order."""

    run_s: float  # the workers' own time, from their start to the last one's end
    setup_s: float  # building the steps (and any warm-up) before the workers start
    warmup_s: List[float]  # per step, where a mitigation warms up before the threads start
    hang: HangFacts
    stacks: List[StackFacts]  # every thread at the hang, so a cycle the classifier did not name can still be read
    disturbance: str  # what the stress did beside the workers, in words
    crash: str  # the child died without a result: how it ended
    log_tail: str  # ... and the end of its log
    shim: ShimStatusFacts
    shim_check: SelfCheckFacts
    fx_patches: PatchIsolationFacts
    fx_patches_check: SelfCheckFacts
    tracing_thread: TracingThreadFacts


class _PhaseFactsAlways(TypedDict):
    outcome: str  # ThreadOutcome of the whole phase: ok | error | hung
    seconds: float
    threads: List[ThreadFacts]
    steps_per_s: Optional[float]  # None: no step ended, or the child kept no run time
    events: List[EventFacts]


class PhaseFacts(_PhaseFactsAlways, PhaseExtras, total=False):
    """The single-thread control or the reported multi-thread trial (classify.py phase_facts)."""

    processes: List[ProcessFacts]  # a `processes` trial: one child per worker, merged into this one phase


# -- the ladder's tallies and trials --------------------------------------------------------------------------
class _LevelFactsAlways(TypedDict):
    ran: int  # trials that gave a verdict (one killed while still making progress gave none)
    reproduced: int
    kinds: Dict[str, int]  # failure kind -> how many of the trials reproduced it


class LevelFacts(_LevelFactsAlways, total=False):
    """One stress of a row (ladder.py Row.tally)."""

    skipped: str  # why this machine cannot show anything under the stress; nothing ran
    stopped_early: int  # planned trials the row did not wait for once its verdict was decided (stopped or unstarted)


class _TrialFactsAlways(TypedDict):
    stress: str
    trial: int  # 1-based within its stress
    outcome: str  # ThreadOutcome of the trial's phase
    kind: Optional[str]  # the race it reproduced; None when every thread finished (or no verdict)
    seconds: float


class TrialFacts(_TrialFactsAlways, total=False):
    """One trial of the headline row that ended, in stress order. Keys a trial has only in some runs go here."""


class _MatrixRowFactsAlways(TypedDict):
    mitigation: str  # the row's label: none, or names joined by commas
    verdict: str  # reproduced | not-reproduced
    kind: Optional[str]  # the first reproduction's kind
    stresses: Dict[str, LevelFacts]  # stress -> its tally
    steps_per_s: Optional[float]  # of the row's first clean trial: what the fix costs
    seconds: float  # the row's longest trial
    cpu_s: float  # the CPU its trials that ended used (facts.cpu adds up every row's, the control's too)
    outcome: str  # fails | holds | inconclusive; the baseline row (none) repeats its verdict
    reason: str


class MatrixRowFacts(_MatrixRowFactsAlways, total=False):
    """One row of `repro --matrix`, in the registry's order."""

    covers: List[str]  # the hazards the fix claims (a mitigation row only)
    caveats: List[str]  # ... and what it leaves open
    finished: bool  # in a run a signal stopped: did every trial of the row end


# -- the run --------------------------------------------------------------------------------------------------
class CapabilitiesFacts(TypedDict):
    """What this machine and this torch can show, decided before any trial ran (capabilities.py)."""

    skipped: Dict[str, str]  # stress -> why it cannot show anything here
    cannot_show: List[str]  # the notes printed before the first trial
    fx_flag_storage: Optional[str]  # module-global | thread-local; None: the installed source was not read
    masked_during_compile: Optional[bool]
    torch_version: Optional[str]  # as read from the installed source


class ShimFacts(ShimStatusFacts):
    """The reported trial's threadlocal-flag shim, with its self-check."""

    self_check: Optional[SelfCheckFacts]


class CpuFacts(TypedDict):
    """What the run's phase children cost in CPU (run_facts.RunFacts.cpu). `bound_s`, their CPU over the cores, is the
    wall time that CPU takes with every core busy throughout: a run near it was bound by its compiles, not by
    waiting. It is not a floor for any schedule: CPU time itself grows when trials share cores (two logical cores
    of one physical one, caches), and a run with fewer trials side by side uses less of it."""

    children_s: float  # CPU seconds of the control and every trial that ended, compile workers included
    children: int  # how many children's counts were read
    cores: int
    bound_s: float  # children_s / cores: the run's CPU with every core busy


class WarmStartFacts(TypedDict):
    """How the phase children started (repro/warm_start.py): forked from the server that imported torch once, or
    fresh, and why the server could not be had, if it could not."""

    forked: int
    fresh: int
    unavailable: Optional[str]


class PartialFacts(TypedDict):
    """A signal ended the run early (findings.Report.mark_stopped writes it)."""

    stopped_by: str  # SIGINT | SIGTERM | max-time (repro --max-time)
    unfinished: str


class _SettingsFactsAlways(TypedDict):
    torch_version: Optional[str]  # the control's, else the installed source's; None: neither said
    device: str  # the devices, comma-joined
    threads: int
    mode: str  # auto, or the one stress asked for
    mitigation: str  # label: none, or names joined by commas
    cache: str  # cold | warm
    shared_cache: List[str]  # the stresses whose trials shared one compile cache (ReproSpec.shared_cache_stresses)
    shared_cache_fixes: List[str]  # the rows every trial of which shared it (ReproSpec.shares_cache: processes)
    backward: bool  # as run (off on a CPU unless asked for)
    checkpoint: str  # none | reentrant | non-reentrant
    shapes: str  # same | per-thread
    steps: int
    jobs: int  # trials side by side, as run
    model: str  # what the workers stepped: --model, --step or the reference drafter and its preset
    capabilities: CapabilitiesFacts


class _SettingsExtras(TypedDict, total=False):
    amplify_ms: float  # only where the amplified stress can run (--mode auto or amplified)


class SettingsFacts(_SettingsFactsAlways, _SettingsExtras):
    """The run's settings: the first keys of every repro report (run_facts.RunFacts.settings)."""


class _VerdictFacts(TypedDict):
    verdict: Optional[str]  # reproduced | reproduced-if-traced (--step/--model) | not-reproduced; None: none
    kind: Optional[str]  # FailureKind of the first reproduction
    level: Optional[str]  # the first stress that reproduced
    blame: List[BlameFacts]  # of the reported trial
    multi_thread: Optional[PhaseFacts]  # the reported trial: the first reproduction, else the last trial
    time_to_verdict_s: float  # the run's clock at the first reproduction (else at the end): the progress lines'


class _HeadlineExtras(TypedDict, total=False):
    # Always there from the ladder's verdict (run_facts.RunFacts.headline); absent where the control failed.
    levels: Dict[str, LevelFacts]  # stress -> tally of the headline row
    hang: Optional[HangFacts]  # the reported trial's
    trials: List[TrialFacts]
    reproduction_rate: Optional[float]  # reproduced / ran at the verdict's stress; None: nothing ran there
    wall_s: float
    cpu: CpuFacts
    warm_start: WarmStartFacts  # absent where the harness was handed a runner of its own (tests)
    # Only where the reported trial ran the threadlocal-flag shim.
    shim: ShimFacts
    # Only for --mitigation: the row's judgement against the baseline that qualified it.
    outcome: str  # fails | holds | inconclusive
    outcome_reason: str
    baseline_levels: Dict[str, LevelFacts]
    baseline_reproduced: List["ReproducedFacts"]  # every race the baseline showed (the advice covers each)


class ReproducedFacts(TypedDict):
    """One race the baseline reproduced (run_facts.RunFacts.headline): every one, not only the headline's first."""

    kind: str  # FailureKind
    stress: str  # the first stress it showed under
    injected: bool  # that stress injects the tool's own FX trace (ladder.INJECTED): shown only IF a thread traces


class HeadlineFacts(_VerdictFacts, _HeadlineExtras):
    """The ladder's verdict (run_facts.RunFacts.headline); its `levels` to `wall_s` are always there."""


class _ReproFactsAlways(_SettingsFactsAlways, _VerdictFacts):
    single_thread: Optional[PhaseFacts]  # None: no stress that ran needed the control (forced, stuck, ...)


class ReproFacts(_ReproFactsAlways, _SettingsExtras, _HeadlineExtras, total=False):
    """A whole repro report's facts. Every report has the settings, the control and a verdict; one whose control
    failed has nothing of the ladder."""

    matrix: List[MatrixRowFacts]  # --matrix; in a stopped run only the rows with a trial that ended
    next_steps: List[str]  # absent where the control failed or a signal stopped the run: no advice from those
    partial: PartialFacts
    # The CLI's, not the harness's (so `check`'s quick repro has neither):
    made: Dict[str, str]  # where, when and by which command (report/last_repro.py made_here)
    expect: str  # --expect: the verdict the exit code was held to
