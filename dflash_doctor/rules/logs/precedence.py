"""Which log rule takes a text that several rules match: one declared order, resolved here and nowhere else.

The scanner tries the rules in this order wherever more than one could claim a text (dflash_doctor/logs/):
- a line: the first rule with one of its trigger words in the line whose pattern matches takes it (its `on_match` or
  `on_line` hook, its finding, the death for a fatal rule); the rules after it never see that line;
- an exception's 'Type: message' in a traceback (and a launcher summary's): the first fatal rule whose pattern
  matches names the death.
So a narrower reading is placed before a broader one that would also match its words: the tool's own report before
the rules it quotes, a DataParallel replica before the error inside it, the watchdog's abort before the inner cause
its line names, any named cause before DFD513, which reads every 'SomeError: ...' line as a process's death.

Each place says why it is there and may give `contested` lines: lines that its rule and a rule placed after it both
match. tests/logs/test_precedence.py reads this tuple: every contested line (these, and every line of the rules' own
examples that two rules match) must go to the rule placed first, and the same lines go to another rule when the
order is reversed, so the order here is what decides. Rules without a pattern (DFD503, DFD507, DFD508) are reported
by the scanner itself; their place only orders LOG_RULES (and so DEATH_CODES and the trigger words).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Sequence, Tuple

from dflash_doctor.rules.logs.model import LogRule


@dataclass(frozen=True)
class Place:
    """One rule's place: its code, why it comes where it does, lines it takes from a rule placed after it."""

    code: str
    why: str
    contested: Tuple[str, ...] = ()


PRECEDENCE: Tuple[Place, ...] = (
    Place("DFD522", "a line of dflash-doctor's own report quotes the words of the rules it explains (a DFD906 line "
          "holds the thread's NameError): read as the report, before any of them",
          contested=("dflash-doctor: DFD906 run-thread-died: loader died at 3.2 s (pid 4242): NameError: module is "
                     "not installed as a submodule",)),
    Place("DFD519", "a DataParallel replica's failure holds the error inside the replica (an OOM, Dynamo's error) in "
          "its message: the replica is where to look",
          contested=("torch.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 1.",)),
    Place("DFD509", "torch.jit.trace over compiled code starts like the FX-tracing race (DFD501) and is "
          "deterministic: the narrower kind first"),
    Place("DFD501", "the FX-tracing race's RuntimeError: a named cause, before the generic exception line (DFD513)"),
    Place("DFD518", "the FX patcher race's NameError or CURRENT_PATCHER assertion: a named cause, before DFD513"),
    Place("DFD510", "Triton's OutOfResources, re-raised by inductor as 'OutOfMemoryError: out of resource': before "
          "CUDA OOM (DFD502) and the generic exception line",
          contested=("OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_0",)),
    Place("DFD512", "the NCCL watchdog's termination line names its inner cause (a collective timeout, an illegal "
          "memory access, a NCCL error) and the C++ what() the signal rule reads: before DFD504, DFD502, DFD511, "
          "DFD516 and DFD514",
          contested=("  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated with exception: "
                     "CUDA error: an illegal memory access was encountered",)),
    Place("DFD502", "CUDA out of memory, also in NCCL's own warning and in a C++ exception's what(): before the NCCL "
          "error (DFD516) and the uncaught C++ exception (DFD514)",
          contested=("node1:3018451:3018451 [0] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'",
                     "  what():  CUDA runtime error: out of memory /srv/engine/allocator.h:233")),
    Place("DFD511", "a kernel fault: before the uncaught C++ exception that carries it (DFD514) and DFD513",
          contested=("  what():  CUDA error: an illegal memory access was encountered",)),
    Place("DFD517", "a device-side assert: a named cause, before DFD513"),
    Place("DFD504", "a collective timeout raised in Python by older releases: a named cause, before DFD513",
          contested=("RuntimeError: [Rank 1] Caught collective operation timeout: WorkNCCL(SeqNum=1, "
                     "OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800031 milliseconds before timing out.",)),
    Place("DFD516", "a NCCL error raised in Python: a named cause, before DFD513",
          contested=("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                     "NCCLUtils.hpp:275, unhandled cuda error",)),
    Place("DFD506", "the recompile limit (FailOnRecompileLimitHit ends the run): before the events below"),
    Place("DFD521", "a recompile limit set by the script: an event, remembered for the hits after it"),
    Place("DFD520", "Dynamo's recompile log of threads racing a first call: an event"),
    Place("DFD505", "flex_attention's dense-path warning: an event"),
    Place("DFD514", "a signal death, printed by a launcher or the shell, sometimes inside an exception's message (the "
          "DataLoader's 'is killed by signal'): before the generic exception line",
          contested=("RuntimeError: DataLoader worker (pid 8812) is killed by signal: Bus error.",)),
    Place("DFD515", "a stack dump's header: its own lines, claimed by no rule above"),
    Place("DFD508", "a thread's death no rule above explains (no pattern: the scanner reports it)"),
    Place("DFD513", "every 'SomeError: ...' line and a launcher's exit code: the broadest reading of a death, so "
          "last of the rules with a pattern"),
    Place("DFD503", "a throughput drop (no pattern: read from the progress lines)"),
    Place("DFD507", "a stalled thread (no pattern: read from the progress lines)"),
)


def resolve(declared: Mapping[str, LogRule], order: Sequence[Place] = PRECEDENCE) -> Dict[str, LogRule]:
    """The declared rules in `order`, PRECEDENCE unless another is asked for (tests/logs/test_precedence.py reverses
    it); every declared rule has exactly one place, every place a rule."""
    codes = [place.code for place in order]
    repeated = sorted({code for code in codes if codes.count(code) > 1})
    unplaced = sorted(set(declared) - set(codes))
    unknown = sorted(set(codes) - set(declared))
    wrong = [f"{what} {found}" for what, found in (("placed twice", repeated), ("declared without a place", unplaced),
                                                      ("placed but not declared", unknown)) if found]
    if wrong:
        raise ValueError(f"log rule precedence: {'; '.join(wrong)} (dflash_doctor/rules/logs/precedence.py)")
    return {code: declared[code] for code in codes}
