"""The words a child process, the facts JSON and the findings share for how a replay ended and why, what shape a
hang's stacks took, and what the flight recorder saw on the way.

Each is a str enum: a member equals its word, serialises as it (json.dumps), and prints as it, so the wire format
is the plain strings it always was. Each vocabulary is declared here once, below every module that writes or reads
it (the recorder and watchdog in runtime/, run and attach in supervise/, repro, the pipeline, logs, the rule
examples); code compares against the members, never against the words (tests/test_vocabularies.py holds it so).
"""
from __future__ import annotations

import enum


class WireEnum(str, enum.Enum):
    """A str enum that prints as its value (f-strings included), as the JSON shows it."""

    def __str__(self) -> str:
        return str(self.value)


class FailureKind(WireEnum):
    """The failure a multi-thread repro phase ended in (the facts' `kind`)."""

    FX_FLAG_LEAK = "fx-flag-leak"  # a thread raised the FX-tracing error while another held the flag
    STUCK_FLAG = "stuck-flag"  # the FX flag stayed set after every trace ended
    DEADLOCK = "deadlock"  # a hang whose stacks show a lock cycle
    # a thread's eager module call met another thread's torch.fx patches (NameError), or two traces' patchers
    # crossed (the CURRENT_PATCHER AssertionError)
    PATCHER_RACE = "fx-patcher-race"
    OTHER_ERROR = "other-error"  # anything else: an unrelated error, or a hang without a cycle
    # nn.DataParallel replicated a torch.compile'd module: the wrapper forwarded the replica's `_parameters` and
    # `_modules` to the user's model, which lost its submodules (repro/dataparallel.py); the replica thread raised
    DATAPARALLEL_COMPILED_MODULE = "dataparallel-compiled-module"


class BlameKind(WireEnum):
    """Why the flight recorder says a thread hit the FX-tracing error."""

    FX_FLAG_LEAK = "fx-flag-leak"  # another thread was inside a trace
    STUCK_FLAG = "stuck-flag"  # a trace's exit left the global flag set
    NESTED_TRACE = "nested-trace"  # the thread itself was inside a trace
    UNKNOWN = "unknown"


class ThreadOutcome(WireEnum):
    """How a repro worker thread, or a whole phase, ended."""

    RUNNING = "running"  # not ended yet: only while the phase runs
    OK = "ok"
    ERROR = "error"
    HUNG = "hung"


class ProbeOutcome(WireEnum):
    """What one live `guards` probe showed."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not-reproduced"
    SKIPPED = "skipped"
    ERROR = "error"  # it could not run to an answer: it raised, crashed or timed out


class HangCycle(WireEnum):
    """What the stacks of a hang show (runtime/deadlock.py classify_hang names it; the facts' `cycle`).

    Declared most specific first: where the ranks of one pipeline hang show different ones, the first is reported
    (reference/workers_processes.py).
    """

    # Dynamo's compile_lock held while waiting for the autograd device thread, which waits for compile_lock in the
    # lazy backward compile (docs/races.md, "The hazards")
    COMPILE_LOCK_AUTOGRAD = "compile-lock-autograd"
    LOCK_CYCLE = "lock-cycle"  # a wait-for graph that closes by lock identity (runtime/lock_sites.py)
    LOCK_WAIT = "lock-wait"  # threads queued behind a holder that waits for none of their locks: no cycle
    NO_CYCLE = "no-cycle"  # no progress, and no lock wait in the stacks at all

    @property
    def is_wait_for_cycle(self) -> bool:
        """A true wait-for cycle: it never resolves by itself, so the same one in two samples settles a deadlock
        (the watchdog's fast rule, attach's confirmation); a lock wait or no cycle may still move on."""
        return self in (HangCycle.COMPILE_LOCK_AUTOGRAD, HangCycle.LOCK_CYCLE)


class RecorderEventKind(WireEnum):
    """What one flight-recorder event records (runtime/recorder.py Event.kind; the events of run's records and of
    repro's phase results). Written by the recorder's hooks and by the agents that share its log."""

    FX_TRACE = "fx-trace"  # a torch.fx Tracer.trace, begin and end
    COMPILE = "compile"  # a Dynamo compile, begin and end (lazy backward compiles included)
    RECOMPILE = "recompile"  # Dynamo's reason for recompiling a frame
    RECOMPILE_LIMIT = "recompile-limit"  # Dynamo gave up recompiling a frame: it runs uncompiled from then on
    STEP = "step"  # a training step wrapped in recorder.step(), begin and end
    EXCEPTION = "exception"  # an exception the recorder was told of (a step's, an uncaught thread's)
    STUCK_FLAG = "stuck-flag"  # a trace exit restored a stale True: the global FX flag is stuck
    REPLICA_ERROR = "replica-error"  # nn.DataParallel caught a replica thread's error to re-raise it elsewhere
    THREAD_DIED = "thread-died"  # a thread of run's command ended by an exception (supervise/agent.py)
    HANG = "hang"  # the watchdog classified a hang (its cycle in the detail)
    NOTE = "note"  # a line for the reader of the events (repro's child: the workers are starting)
    # a worker thread read a compile setting other than its starter's (runtime/thread_config.py, DFD910)
    COMPILE_SETTING = "compile-setting"
