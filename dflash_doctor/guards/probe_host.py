"""The probe child: `python -m dflash_doctor.guards.probe_host --timeout S [--fx-flag SPEC] PROBE...`.

It imports torch and Dynamo once, reads the fresh interpreter's state, compiles one trivial function
(`backend="eager"`), then runs each probe in a forked process of its own (`--isolation fork`, Linux) or, with
`--isolation none`, in itself (the caller then starts one host per probe). It writes one HostDocument
(host_document.py, the codec guards reads it with) on the last line of stdout and leaves with os._exit: the probes
may leave threads and a corrupted Dynamo behind, and a normal interpreter shutdown would only spend time tearing
them down.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from functools import partial
from typing import Callable, Dict, Mapping, Optional

from dflash_doctor.guards.host_document import HostDocument, HostSeconds, ProbeResult, encode
from dflash_doctor.guards.isolation import run_forked
from dflash_doctor.guards.probes import BY_NAME, PROBE_NAMES
from dflash_doctor.guards.runner import PROGRESS_MARK
from dflash_doctor.guards.state import LiveState, gpu_count, read_config, read_fx_flag
from dflash_doctor.outcomes import ProbeOutcome

# Time kept back from the deadline for reporting, so the caller gets results rather than having to kill us.
_REPORT_MARGIN_S = 0.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_doctor.guards.probe_host")
    parser.add_argument("--timeout", type=float, required=True)
    flag = parser.add_mutually_exclusive_group()
    flag.add_argument("--fx-flag", default=None, help="NAME or NAME.ATTR in torch.fx._symbolic_trace")
    # guards reads the torch source for the flag's name while this host imports torch: the name comes after.
    flag.add_argument("--fx-flag-stdin", action="store_true",
                      help="read --fx-flag's value (empty: none) as one line on stdin, once torch is imported")
    parser.add_argument("--isolation", choices=("fork", "none"), default="fork")
    # No `choices=` here: with nargs="*" argparse (before 3.12) rejects an empty list against them.
    parser.add_argument("probes", nargs="*", help=f"any of {', '.join(PROBE_NAMES)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.probes if name not in PROBE_NAMES]
    if unknown:
        parser.error(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBE_NAMES)}")
    began = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Failed to initialize NumPy": not ours to report
        import torch
        import torch._dynamo  # noqa: F401 - loaded here once, so every probe process inherits it

    if args.fx_flag_stdin:
        args.fx_flag = _flag_from_stdin()
    # Read before any probe runs: with --isolation none the probes run here and may leave the flag stuck.
    config, fx_flag_now = read_config(torch), read_fx_flag(torch, args.fx_flag)
    imported = time.monotonic() - began
    _tell("imported")
    results: Mapping[str, ProbeResult] = {}
    if args.probes:
        compiled = torch.compile(lambda x: x + 1, backend="eager")
        compiled(torch.ones(2))
        remaining = args.timeout - (time.monotonic() - began) - _REPORT_MARGIN_S
        if remaining <= 0:
            results = {name: ProbeResult.failed(
                f"no time left for the probe after importing torch and compiling ({args.timeout:.1f} s)")
                for name in args.probes}
        else:
            read_flag = partial(read_fx_flag, torch, args.fx_flag)
            tasks = {name: partial(BY_NAME[name].run, torch, compiled, remaining, read_flag) for name in args.probes}
            if args.isolation == "fork":
                results = run_forked(tasks, remaining, on_done=lambda name, outcome: _tell("probe", name, outcome))
            else:
                results = _in_process(tasks)
    # The GPU count after the forks: the driver is never touched before fork().
    state = LiveState(config, fx_flag_now, gpu_count(torch))
    document = HostDocument(state, results, HostSeconds(round(imported, 3), round(time.monotonic() - began, 3)))
    sys.stdout.write("\n" + encode(document) + "\n")
    sys.stdout.flush()
    os._exit(0)


def _tell(*words: str) -> None:
    """One progress line on stderr for the caller (guards/runner.py reads them as they come)."""
    sys.stderr.write(" ".join((PROGRESS_MARK, *words)) + "\n")
    sys.stderr.flush()


def _flag_from_stdin() -> Optional[str]:
    line = sys.stdin.readline()
    if not line.endswith("\n"):  # the caller closed stdin without the line: it is giving up (its source read failed)
        sys.stderr.write("probe host: stdin closed before the FX flag's name came\n")
        sys.stderr.flush()
        os._exit(2)
    return line.strip() or None


def _in_process(tasks: Mapping[str, Callable[[], ProbeResult]]) -> Dict[str, ProbeResult]:
    results = {}
    for name, task in tasks.items():
        began = time.monotonic()
        try:
            result = task()
        except Exception as exc:  # noqa: BLE001 - a failing probe is a result
            result = ProbeResult(ProbeOutcome.ERROR, error=f"{exc.__class__.__name__}: {exc}")
        results[name] = dataclasses.replace(result, seconds=round(time.monotonic() - began, 3))
        _tell("probe", name, result.outcome.value)
    return results


if __name__ == "__main__":
    main()
