"""The words a child process, the facts JSON and the findings share for how a replay ended and why.

Each is a str enum: a member equals its word, serialises as it (json.dumps), and prints as it, so the wire format
is the plain strings it always was.
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
