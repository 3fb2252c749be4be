"""The scanner's options, their defaults and their checks: one place for `logs`, `status` and the examples."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from dflash_doctor.errors import UsageError

THREAD_PATTERN_HELP = ("Regex whose group 'thread' (or group 1) names a line's thread; default: thread=NAME, "
                       "[rankN], or a NAME-N token like drafter-0.")


@dataclass(frozen=True)
class LogOptions:
    thread_pattern: Optional[str] = None  # regex; group 'thread' or group 1 names the thread
    baseline_window: int = 10
    sustain: int = 5
    drop: float = 0.3
    stall_steps: int = 20
    max_findings_per_code: int = 200
    tokens_per_it: Optional[float] = None  # turns it/s into tok/s when the batch is known


DEFAULTS = LogOptions()


def compile_thread_pattern(pattern: Optional[str]) -> "re.Pattern[str]":
    if pattern is not None and not pattern.strip():
        raise UsageError("--thread-pattern is empty: give a regex with a group naming the thread, or leave the "
                         "option out for the default")
    try:
        from dflash_doctor.logs.patterns import DEFAULT_THREAD_PATTERN

        compiled = re.compile(pattern or DEFAULT_THREAD_PATTERN)
    except re.error as exc:
        raise UsageError(f"--thread-pattern {pattern!r}: {exc}") from exc
    if compiled.groups < 1:
        raise UsageError(f"--thread-pattern {pattern!r}: needs a group naming the thread, e.g. \\[(\\w+-\\d+)\\]")
    return compiled


def make_options(thread_pattern: Optional[str] = None, baseline_window: int = DEFAULTS.baseline_window,
                 sustain: int = DEFAULTS.sustain, drop: float = DEFAULTS.drop,
                 stall_steps: int = DEFAULTS.stall_steps, tokens_per_it: Optional[float] = None) -> LogOptions:
    """Checked options (a bad regex or value is a UsageError before any reading)."""
    compile_thread_pattern(thread_pattern)
    if not 0 < drop < 1:
        raise UsageError("--drop must be a fraction in (0, 1), e.g. 0.3 for 30 % below the baseline")
    if baseline_window < 2 or sustain < 1 or stall_steps < 1:
        raise UsageError("--baseline-window must be >= 2, --sustain and --stall-steps >= 1")
    if tokens_per_it is not None and not tokens_per_it > 0:
        raise UsageError("--tokens-per-it must be > 0")
    return LogOptions(thread_pattern=thread_pattern, baseline_window=baseline_window, sustain=sustain, drop=drop,
                      stall_steps=stall_steps, tokens_per_it=tokens_per_it)
