"""Dynamo's recompiles and what runs uncompiled: the recompile limit (DFD506), a limit set in one thread and hit
lower in another (DFD521), threads racing a compiled function's first calls (DFD520), flex_attention's dense path
(DFD505)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.logs.model import (
    UNNAMED,
    HeldLine,
    HeldRecompile,
    RuleLine,
    RuleLookup,
    RuleScanner,
    declare,
)
from dflash_doctor.rules.logs.shared import fix_step, scan_for_uncompiled
from dflash_doctor.rules.registry import Rule


# Releases before FailOnRecompileLimitHit raised torch._dynamo.exc.CacheLimitExceeded where the limit could not
# fall back to eager (fullgraph=True): either one reaching a traceback ended the run.
_RECOMPILE_FATAL = re.compile(r"(?:FailOnRecompileLimitHit|\bCacheLimitExceeded|Unsupported: Dynamo recompile limit "
                              r"exceeded)(?::\s*(?P<why>.*))?")


def _recompile_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    limit = re.search(r"hit (?:config\.(?P<limit>(?:accumulated_)?(?:recompile_limit|cache_size_limit))|"
                      r"recompilation cache limit) \((?P<value>\d+)\)", text)
    fatal = _RECOMPILE_FATAL.search(text)
    return {"limit": (limit.group("limit") or "cache_size_limit") if limit else None,
            "limit_value": int(limit.group("value")) if limit else None,
            "fatal": fatal is not None,
            "why": (fatal.group("why") or "").strip() if fatal else None}


def _recompile_message(details: Dict[str, Any]) -> str:
    limit = f"config.{details['limit']} ({details['limit_value']})" if details.get("limit") else "its recompile limit"
    where = f" for {details['function']}" if details.get("function") else ""
    if details.get("fatal"):
        why = details.get("why") or "fail_on_recompile_limit_hit or fullgraph=True"
        return (f"Dynamo hit {limit}{where} and stopped the run: {why} (with fullgraph=True the limit is an "
                "error, not an eager fallback)")
    default = (" (the default: on torch 2.12+ a limit raised in the main thread does not reach threads started later)"
               if details.get("limit") and LIMIT_DEFAULTS.get(details["limit"]) == details.get("limit_value") else "")
    return f"Dynamo hit {limit}{where}{default}: later calls run it uncompiled (eagerly)"


def _recompile_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    """The limit warning names its function on a line that follows: held until then (fatal: FailOnRecompileLimitHit
    is reported at once). A limit hit below what the log set earlier is also DFD521's."""
    _limit_not_reached(scanner, line, details)
    if details.get("fatal"):
        return line.worker
    scanner.memory.held_recompile = HeldRecompile(line.worker, line.lineno, details=details)
    return None


def _recompile_severity(details: Dict[str, Any], lookup: RuleLookup) -> Optional[Severity]:
    return Severity.ERROR if details.get("fatal") else None


LOG_RECOMPILE_LIMIT = declare(Rule(
    code="DFD506",
    name="log-recompile-limit",
    severity=Severity.WARNING,
    summary="Dynamo hit its recompile limit: the function runs uncompiled, or the run stops if fullgraph=True",
    rationale=(
        "After config.recompile_limit (cache_size_limit before torch 2.6) recompilations of one code object, "
        "Dynamo stops compiling it and runs it eagerly: for flex_attention that is the dense path. With "
        "fullgraph=True (or config.fail_on_recompile_limit_hit) the same limit raises FailOnRecompileLimitHit "
        "(CacheLimitExceeded in older releases) "
        "instead and the worker dies: then the finding is an error. Shapes that change every step (dynamic block "
        "masks, ragged batches) are the usual cause."
    ),
    fix="Mark the varying dimension dynamic, pad to a few bucket sizes, or raise the limit knowingly.",
    example_format="log",
    bad=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo hit "
        "config.recompile_limit (8)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    function: 'attend' "
        "(/workspace/dflash_model.py:211)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    last reason: 0/7: "
        "tensor 'q' size mismatch at index 2. expected 4096, actual 4160\n"
    ),
    good=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo recompiling 'attend'\n"
    ),
), triggers=("dynamo hit", "FailOnRecompileLimitHit", "CacheLimitExceeded", "recompile limit exceeded"), fatal=True,
    pattern=re.compile(r"(?:torch\._dynamo|torchdynamo) hit (?:config\.)?(?:accumulated_)?(?:recompile_limit"
                       r"|cache_size_limit|recompilation cache limit) \(\d+\)|FailOnRecompileLimitHit"
                       r"|\bCacheLimitExceeded\b|Unsupported: Dynamo recompile limit exceeded"),
    details=_recompile_details, describe=_recompile_message, on_line=_recompile_line,
    severity_of=_recompile_severity, next_steps=scan_for_uncompiled("DFD506"))


# -- events: no death by themselves ------------------------------------------------------------------------------

# The defaults of the limits (torch/_dynamo/config.py, read in 2.6.0 to 2.14.1): a hit at the default in a worker,
# after the script raised it, is the per-thread settings of torch 2.12+ (dflash_doctor/compile_settings.py).
LIMIT_DEFAULTS = {"recompile_limit": 8, "cache_size_limit": 8, "accumulated_recompile_limit": 256,
                  "accumulated_cache_size_limit": 256}
_LIMIT_SET = re.compile(r"\b(?P<key>(?:accumulated_)?(?:recompile_limit|cache_size_limit))\b['\"]?\s*(?:=|:| to)\s*"
                        r"(?P<value>\d+)")


def _unnamed_is_unknown(worker: str) -> str:
    return "unknown thread" if worker == UNNAMED else worker


def _limit_set_line(scanner: RuleScanner, line: RuleLine) -> None:
    """'torch._dynamo.config.recompile_limit = 64' printed or echoed by the script: remembered for the hits after."""
    scanner.memory.limit_set = HeldLine(line.worker, line.lineno, line.body,
                                        {"key": line.match.group("key"), "value": int(line.match.group("value"))})


def _limit_not_reached(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> None:
    limit_set = scanner.memory.limit_set
    hit, key = details.get("limit_value"), details.get("limit")
    if limit_set is None or hit is None or key is None or limit_set.details["key"] != key \
            or hit >= limit_set.details["value"]:
        return
    value = limit_set.details["value"]
    worker = _unnamed_is_unknown(line.worker)
    scanner.report(LOG_SETTING_NOT_IN_WORKER, (key,),
                   f"{worker}: Dynamo hit config.{key} at {hit} although line {limit_set.lineno} set it to {value}: "
                   "from torch 2.12 compile settings are per thread, so a limit set in one thread (the main one) "
                   "does not reach the threads started later", line.lineno,
                   {"thread": worker, "key": key, "hit": hit, "set_to": value, "set_line": limit_set.lineno,
                    "default": LIMIT_DEFAULTS.get(key) == hit})


LOG_SETTING_NOT_IN_WORKER = declare(Rule(
    code="DFD521",
    name="log-setting-not-in-worker",
    severity=Severity.WARNING,
    summary="a recompile limit raised in one thread was hit at a lower value (the default) in another: compile "
            "settings are per thread from torch 2.12",
    rationale=(
        "From torch 2.12 a value assigned to torch._dynamo.config (and the inductor and functorch configs) lives "
        "in a ContextVar: a thread started later begins with the defaults (docs/races.md, 'What logs reads from "
        "threads'; dflash_doctor/compile_settings.py). A script that raises recompile_limit in its main "
        "thread and then compiles in worker threads sees 'torch._dynamo hit config.recompile_limit (8)' from the "
        "workers: the limit it set never reached them. On 2.11 and earlier the same assignment reached every "
        "thread. Read when the log shows both the setting and a lower hit; a hit at the default alone is DFD506, "
        "whose message says so."
    ),
    fix="Set the limit in each thread that compiles (at the top of the thread's target), or start the threads in a "
        "copy of the setter's context (contextvars.copy_context().run); on 2.11 and earlier a main-thread setting "
        "reaches every thread.",
    example_format="log",
    bad=(
        "set torch._dynamo.config.recompile_limit = 64\n"
        "W1206 08:07:02.533000 17168 torch/_dynamo/convert_frame.py:1994] [0/8] torch._dynamo hit "
        "config.recompile_limit (8)\n"
        "W1206 08:07:02.533000 17168 torch/_dynamo/convert_frame.py:1994] [0/8]    function: 'step' "
        "(/srv/serve.py:8)\n"
    ),
    good=(
        "set torch._dynamo.config.recompile_limit = 64\n"
        "[worker-3] step=40 loss=1.92\n"
    ),
), triggers=("dynamo", "cache_size_limit"), pattern=_LIMIT_SET, on_match=_limit_set_line)

# Dynamo's recompile log when a frame's guards failed at the call but passed when it looked for the reason
# (torch/_dynamo/guards.py: 'Unexpected recompilation: runtime guards failed even though they passed during
# recompilation-reason analysis'): another thread changed what the guards read between the two checks.
_RACED = re.compile(r"Unexpected recompilation: runtime guards failed even though they passed")


def _raced_line(scanner: RuleScanner, line: RuleLine) -> None:
    worker = _unnamed_is_unknown(line.worker)
    scanner.report(LOG_THREADS_RACED_FIRST_CALL, (),
                   f"{worker}: Dynamo recompiled a frame whose guards failed at the call and passed on a second look "
                   "('runtime guards failed even though they passed'): threads were making the first calls of one "
                   "compiled function at once, and each call recompiled it (the recompile limit follows)",
                   line.lineno, {"thread": worker})


def _raced_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    return ["call the compiled function once per input shape in one thread before starting the workers (a warm-up), "
            "or hold a lock around each thread's first call",
            "dflash-doctor run -- <your command>: which threads compiled, and when",
            fix_step(LOG_THREADS_RACED_FIRST_CALL)]


LOG_THREADS_RACED_FIRST_CALL = declare(Rule(
    code="DFD520",
    name="log-threads-raced-first-call",
    severity=Severity.WARNING,
    summary="threads made the first calls of one compiled function at once: Dynamo recompiled it again and again",
    rationale=(
        "Dynamo checks a frame's guards, compiles on a miss, and explains the recompile by checking the guards "
        "again. 'Unexpected recompilation: runtime guards failed even though they passed during "
        "recompilation-reason analysis' means the two checks disagreed: another thread changed the state the "
        "guards read in between. Run on a CPU with torch 2.13 (benchmarks/logs_heldback/programs/"
        "first_call_storm.py: 16 threads calling one compiled function for the first time), every recompile after "
        "the first said so and the recompile limit was hit within a second, after which the function runs "
        "uncompiled; a public report shows the same with 32 threads ('Worker errors observed: 8/32 threads "
        "failed'). A single thread does not print it."
    ),
    fix="Warm the compiled function up in one thread (one call per shape) before the workers start, or serialise "
        "each thread's first call with a lock.",
    example_format="log",
    bad=(
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles] Recompiling function step "
        "in /srv/serve.py:8\n"
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles]     triggered by the "
        "following guard failure(s):\n"
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles]     - 0/1: Unexpected "
        "recompilation: runtime guards failed even though they passed during recompilation-reason analysis.\n"
    ),
    good=(
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/1] [__recompiles]     - 0/0: tensor 'x' size "
        "mismatch at index 0. expected 4, actual 5\n"
    ),
), triggers=("Unexpected recompilation",), pattern=_RACED, on_match=_raced_line, next_steps=_raced_steps)


def _dense_warning_line(scanner: RuleScanner, line: RuleLine) -> None:
    scanner.report(LOG_DENSE_ATTENTION_FALLBACK, (), f"{line.worker}: flex_attention ran without torch.compile (dense "
                   "path that materialises the full scores matrix)", line.lineno, dict(thread=line.worker,
                                                                                         via="warning"))


LOG_DENSE_ATTENTION_FALLBACK = declare(Rule(
    code="DFD505",
    name="log-dense-attention-fallback",
    severity=Severity.WARNING,
    summary="flex_attention ran its uncompiled dense path",
    rationale=(
        "torch warns 'flex_attention called without torch.compile() - this will use an unfused implementation "
        "that materializes the full scores matrix' when flex_attention runs eagerly, and a traceback through "
        "sdpa_dense or math_attention shows the same path. With error_on_nested_fx_trace=False the FX race also "
        "lands here silently. The dense path is slow and, at training lengths, runs out of memory."
    ),
    fix="Call flex_attention through torch.compile, and do not silence error_on_nested_fx_trace (DFD301).",
    example_format="log",
    bad=(
        "/usr/lib/python3.12/site-packages/torch/nn/attention/flex_attention.py:1601: UserWarning: flex_attention "
        "called without torch.compile() - this will use an unfused implementation that materializes the full "
        "scores matrix instead of generating a fused kernel.\n"
    ),
    good=(
        "[drafter-1] compiled flex_attention for seq_len=4096\n"
    ),
), triggers=("flex_attention called without",),
    pattern=re.compile(r"flex_attention called without torch\.compile\(\)"), on_match=_dense_warning_line,
    next_steps=scan_for_uncompiled("DFD505"))
