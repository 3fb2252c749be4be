"""Deaths no more specific rule explains: a thread that died with an exception (DFD508) and a process (its main
thread, or one rank) that ended with one, or whose launcher reported its exit code (DFD513). Last of the rules that
name a death (precedence.py): any exception line is DFD513's when nothing narrower claims it."""
from __future__ import annotations

import re
from typing import Any, Dict, Optional

from dflash_doctor.findings import Severity
from dflash_doctor.rules.logs.model import HeldLine, RuleLine, RuleScanner, declare
from dflash_doctor.rules.logs.shared import DS_LOCAL_RANK
from dflash_doctor.rules.registry import Rule


LOG_THREAD_DIED = declare(Rule(
    code="DFD508",
    name="log-thread-died",
    severity=Severity.ERROR,
    summary="a thread died with an exception",
    rationale=(
        "'Exception in thread NAME:' is Python's threading.excepthook reporting a thread whose target raised: "
        "the thread is gone and whatever it fed (a GPU, a queue) is starved. Reported when no more specific rule "
        "(DFD501, DFD502, DFD504, DFD509-DFD512, DFD516) explains the exception."
    ),
    fix="Read the exception; `dflash-doctor status` joins it with the GPU the thread left idle.",
    example_format="log",
    bad=(
        "Exception in thread target-3:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 512, in run\n'
        "    batch = queue.get(timeout=600)\n"
        "_queue.Empty\n"
    ),
    good=(
        "[target-3] step=80 5.0 Ktok/s\n"
    ),
), triggers=("Exception in thread",))


def _exit_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    """torchrun's agent ('failed (exitcode: 1) local_rank: 3'), DeepSpeed's launcher ('... '--local_rank=3' ...]
    exits with return code = 1'), or an exception's last line with no traceback above it."""
    if match.group("exception") is not None:
        return {"exception": match.group("exception"), "said": (match.group("said") or "").strip()[:200]}
    if match.group("exitcode") is not None:
        return {"exitcode": int(match.group("exitcode")), "local_rank": int(match.group("local_rank"))}
    if match.group("old_exitcode") is not None:
        return {"exitcode": int(match.group("old_exitcode")), "local_rank": int(match.group("old_local_rank"))}
    if match.group("comp_exitcode") is not None:
        return {"exitcode": int(match.group("comp_exitcode")), "rank": int(match.group("comp_rank"))}
    rank = DS_LOCAL_RANK.search(text)
    exitcode = int(match.group("ds_exitcode")) if match.group("ds_exitcode") else None
    details: Dict[str, Any] = {"exitcode": exitcode, "local_rank": int(rank.group(1)) if rank else None}
    if match.group("ds_cut"):
        details["cut"] = True
    return details


def _exit_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    if (details.get("exception") or "").endswith("ChildFailedError"):
        return None  # torchrun's own exception: its summary, parsed from here on, names the rank that failed
    if details.get("cut"):
        # DeepSpeed's launcher line without its return code: a terminal may have wrapped the rest onto the next
        # line; reported at the end unless that line comes
        scanner.memory.launcher_cut = HeldLine(line.worker, line.lineno, details=details)
        return None
    return line.worker


LOG_PROCESS_DIED = declare(Rule(
    code="DFD513",
    name="log-process-died",
    severity=Severity.ERROR,
    summary="a process (its main thread, or one rank) ended with an uncaught exception",
    rationale=(
        "A traceback outside any 'Exception in thread' block is the main thread's: the process ends with it. "
        "Under torchrun (torch >= 2.2) every line a rank prints carries a '[rankN]:' prefix, so tracebacks of "
        "several ranks can interleave and are still told apart; torchrun's ChildFailedError summary names the "
        "rank that failed first ('Root Cause (first observed failure)'). An exception's last line with no traceback "
        "above it ('RuntimeError: ...' at the start of a line) and a traceback cut before its exception count too: "
        "the process ended with them even though the log lost part of the text; so do frames pasted without their "
        "'Traceback' line (read in logs small enough to parse in full, as pasted excerpts are), and torchrun's own "
        "traceback when nothing else in the log names the worker that failed. Reported when no more specific "
        "rule explains the exception. A worker that keeps logging progress after its traceback only logged a "
        "handled error and is not counted as dead."
    ),
    fix="Read the exception of the root-cause rank first: the other ranks usually died because it did.",
    example_format="log",
    bad=(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/workspace/train.py", line 77, in <module>\n'
        "[rank1]:     batch = next(loader)\n"
        "[rank1]: KeyError: 'input_ids'\n"
        "E1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 1 (pid: 4243) of binary: /usr/bin/python3\n"
    ),
    good=(
        "[rank1]: step=10 loss=2.9 6.2 Ktok/s\n"
    ),
), triggers=("Traceback (most", "ChildFailedError", "Root Cause (first observed failure)",
             "exitcode", "Process ", "exits with return code", "launch.py:", "Error:", "Exception:",
             "crashed with exit code"),
    pattern=re.compile(r"failed \(exitcode: (?P<exitcode>\d+)\) local_rank: (?P<local_rank>\d+)"
                       r"|Child process \d+ \(local_rank (?P<old_local_rank>\d+)\) FAILED \(exitcode (?P<old_exitcode>\d+)\)"
                       r"|\] exits with return code = (?P<ds_exitcode>[1-9]\d*)"
                       # MosaicML composer's launcher: 'ERROR:composer.cli.launcher:Rank 2 crashed with exit code 1.'
                       r"|Rank (?P<comp_rank>\d+) crashed with exit code (?P<comp_exitcode>[1-9]\d*)"
                       # the same DeepSpeed line cut before its return code: a subprocess ended, how is lost
                       r"|(?P<ds_cut>\[launch\.py:\d+:sigkill_handler\] \[)(?![^\n]*\] exits with return code)"
                       # 'RuntimeError: ...' starting a line outside any traceback: the traceback was not pasted
                       # (or not printed), the exception still ended the process; quoting and markdown stripped
                       r"|^(?:\[\d+\] )?[\s>*`\x22\x27]*(?P<exception>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"
                       r"(?:\*\*)?:"  # (a log viewer's '[13] ' line number before it)
                       r"(?P<said>.*)"),
    details=_exit_details, on_line=_exit_line, line_is_death=True,
    describe=lambda d: (f"died: {d['exception']}: {d['said']} (its traceback is not in the log)" if d.get("exception")
                        else f"exited with code {d.get('exitcode')} (the reason is in its own output, before this)"
                        if d.get("exitcode") is not None
                        else "exited; the launcher's line was cut before its return code"))
