"""The texts torch, Python's threading and NCCL actually print, as regexes. One place to update per release.

Sources: torch/_dynamo/eval_frame.py (the FX guard), torch/nn/attention/flex_attention.py (_warn_once
'flex_attention_performance'), torch/_dynamo/convert_frame.py ('torch._dynamo hit config.%s (%s)'),
c10/cuda/CUDACachingAllocator.cpp (OOM text, old and new forms), ProcessGroupNCCL.cpp (watchdog),
Lib/threading.py (excepthook: 'Exception in thread NAME:').
"""
from __future__ import annotations

import re

# A cheap bytes pre-filter: a line outside a traceback block is decoded and examined only if this matches.
TRIGGER = re.compile(
    rb"tok(?:ens)?/s|step|Step|STEP|Exception|Error|Traceback|Watchdog|watchdog|NCCL|"
    rb"flex_attention called|hit config\.|out of memory|function: "
)

THREAD_EXCEPTION = re.compile(r"^Exception in thread (?P<thread>.+?):\s*$")
TRACEBACK_START = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
CHAIN = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>\S+)')
# The last line of a traceback: a (possibly module-qualified) exception type, optionally ': message'.
# Classes defined in functions print as module.func.<locals>.Name.
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:(?:[A-Za-z_]\w*|<locals>)\.)+[A-Za-z_]\w*|[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Iteration|Warning|"
    r"Failure|Failed|Timeout))(?::\s?(?P<message>.*))?$"
)

FX_TRACE_RACE = re.compile(r"using FX to symbolically trace a dynamo-optimized function")
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
OOM_GPU = re.compile(r"GPU (?P<gpu>\d+) has a total capacity|\(GPU (?P<old>\d+);")
OOM_TRIED = re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)")
NCCL_TIMEOUT = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.*?)\) "
    r"ran for (?P<ran>\d+) milliseconds"
)
NCCL_STUCK = re.compile(r"watchdog got stuck for (?P<secs>\d+) seconds")
NCCL_RANK = re.compile(r"\[(?:PG [^\]]*? )?Rank (?P<rank>\d+)\]")  # searched on its own: no leading .* (quadratic)
NCCL_EXCEPTION = re.compile(r"DistBackendError|NCCL (?:error|timeout)|ProcessGroupNCCL.*[Tt]imeout")
DENSE_FALLBACK_WARNING = re.compile(r"flex_attention called without torch\.compile\(\)")
DENSE_FALLBACK_FRAMES = ("sdpa_dense", "math_attention", "sdpa_dense_backward")
RECOMPILE_LIMIT = re.compile(
    r"torch\._dynamo hit config\.(?P<limit>(?:accumulated_)?(?:recompile_limit|cache_size_limit)) \((?P<value>\d+)\)"
)
RECOMPILE_FUNCTION = re.compile(r"function: '(?P<function>[^']+)' \((?P<where>[^)]*)\)")

# Progress is on nearly every line of a training log, so it is found with str.find and parsed with regexes
# anchored at the hit: a plain re.search for digits-before-'tok/s' backtracks at every digit of the timestamp.
THROUGHPUT_BEFORE = re.compile(r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kKmM]?)\s*$")
STEP_AT = re.compile(r"[Ss](?:tep|TEP)\s*[=:]?\s*(?P<step>\d+)")
GPU_MENTION = re.compile(r"cuda:(?P<gpu>\d+)")

# Which thread a line belongs to: thread=NAME / worker=NAME, [NAME-N], NAME-N, [rankN]. Leftmost match wins.
DEFAULT_THREAD_PATTERN = (
    r"\b(?:thread|worker)[=:]\s*(?P<thread>[\w.-]+)"
    r"|\[(?P<rank>rank\d+)\]"
    r"|\b(?P<named>[A-Za-z][A-Za-z_]*-\d+)\b"
)
# The same default, fast path: the common '[drafter-0]' / '[rank3]' prefix, tried at each '['.
BRACKET_THREAD_AT = re.compile(r"\[(?:(?P<rank>rank\d+)|(?P<named>[A-Za-z][A-Za-z_]*-\d+))\]")

UNIT = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6}
UNIT_BYTES = {unit.encode(): scale for unit, scale in UNIT.items()}
# The usual progress line in one match on the raw bytes, tried at its first '[': '[drafter-0] ... step=12 ...
# 7.1 Ktok/s'. Anything it does not match goes the general way (throughput(), step(), the thread pattern).
PROGRESS_LINE = re.compile(
    rb"\[(?P<thread>[A-Za-z][A-Za-z_]*-\d+|rank\d+)\][^\[]*?\bstep[=: ](?P<step>\d+)\b.*? "
    rb"(?P<value>\d+(?:\.\d+)?) ?(?P<unit>[kKmM]?)tok/s"
)
# The same test over a whole block of lines in one findall: one (line, thread, step, value, unit) row per line,
# the last four empty unless the line is such a progress line whose first '[' is the thread's and has no 'step'
# before it (what LogScanner.feed checks before PROGRESS_LINE).
PROGRESS_ROWS = re.compile(
    rb"((?:[^\[\ns]*(?:s(?!tep)[^\[\ns]*)*"
    rb"\[([A-Za-z][A-Za-z_]*-\d+|rank\d+)\][^\[\n]*?\bstep[=: ](\d+)\b[^\n]*? "
    rb"(\d+(?:\.\d+)?) ?([kKmM]?)tok/s)?[^\n]*)\n"
)


def throughput(text: str):
    """tok/s on the line ('7.1 Ktok/s', '21500 tokens/s'), or None."""
    end = text.find("tok/s")
    if end < 0:
        end = text.find("tokens/s")
        if end < 0:
            return None
    head = text[max(0, end - 32):end].rstrip()
    scale = 1.0
    if head and head[-1] in UNIT:
        scale, head = UNIT[head[-1]], head[:-1].rstrip()
    word = head.rsplit(None, 1)[-1] if head else ""
    if word.replace(".", "", 1).isdigit():  # the usual '7.1 Ktok/s': no regex needed
        return float(word) * scale
    match = THROUGHPUT_BEFORE.search(text, max(0, end - 32), end)
    return None if match is None else float(match.group("value")) * UNIT[match.group("unit")]


def step(text: str):
    """The step number after 'step=' / 'step ' / 'Step:' (not 'global_step', not 'steps'), or None."""
    for word in ("step", "Step", "STEP"):
        start = text.find(word)
        while start >= 0:
            if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                match = STEP_AT.match(text, start)
                if match:
                    return int(match.group("step"))
            start = text.find(word, start + 4)
    return None
